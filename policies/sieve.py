"""SIEVE: a FIFO whose hand spares the leaves used since it last passed them.

Nodes join the queue in insertion order and never move on a hit; a hit only
sets a *visited* bit. The hand sweeps from the oldest node towards the
newest: a visited node has its bit cleared and is passed over, an unvisited
one is evicted. Source: Zhang et al., "SIEVE is simpler than LRU" (NSDI'24).

One heap holds it exactly: a node's rank is ``(lap, seq)``, ``seq`` its
insertion order and ``lap`` the sweep of the hand that will examine it. New
nodes join the hand's current lap (the hand reaches them before wrapping);
a spared node moves to the next lap at its old ``seq``, i.e. the hand passes
it and sees it again one sweep later. In a tree only leaves are examined; an
inner node keeps its rank until it becomes a leaf.
"""

from __future__ import annotations

from radixkv.tree import Node

from .base import EvictionPolicy, pack


class SIEVE(EvictionPolicy):
    """SIEVE via the engine's ``on_victim`` hook. ``policy_state`` is ``(lap, seq, visited)``."""

    name = "sieve"

    def __init__(self) -> None:
        self._seq = 0
        self._lap = 0  # the hand's current sweep

    def on_insert(self, node: Node, now: int) -> None:
        self._seq += 1
        node.policy_state = (self._lap, self._seq, False)

    def on_access(self, node: Node, now: int) -> None:
        lap, seq, visited = node.policy_state
        if not visited:
            node.policy_state = (lap, seq, True)

    def on_victim(self, node: Node) -> int:
        lap, seq, visited = node.policy_state
        if lap > self._lap:
            self._lap = lap
        if visited:
            node.policy_state = (self._lap + 1, seq, False)
            return 0
        return node.num_pages

    def priority(self, node: Node) -> int:
        state = node.policy_state
        return pack(state[0], state[1])  # fewer than 2**40 inserts

"""S3-FIFO: a small probationary FIFO, a main FIFO with reinsertion, and a ghost history.

New pages enter the small queue S unless the ghost G remembers them (then
they go straight to the main queue M). When a leaf of S comes up for
eviction it moves to M if it was used while in S, else it is evicted and
remembered in G. When a leaf of M comes up, a use since it was (re)queued
buys it another round (its counter, capped at 3, goes down by one), else it
is evicted. Source: Yang et al., "FIFO queues are all you need for cache
eviction" (SOSP'23).

Adapted to one victim heap over a tree. S3-FIFO picks S or M by S's size
(10% of the cache); the lazy heap cannot re-rank a whole queue when that
choice flips, so the two queues become two residency budgets on one
timeline ``V`` (pages inserted so far): a node queued in S is due at
``V + small`` pages, one (re)queued in M at ``V + main`` pages
(``small = 10%`` of capacity, ``main`` the rest). The heap pops the earliest
due leaf, so new pages still face a short probation and reused ones a long
stay, and S's share of the cache floats with the promotion rate instead of
being held at 10%. Promotions and reinsertions are second chances through
the engine's ``on_victim`` hook. The ghost holds (namespace, depth, page)
keys of the first page of each run evicted from S, at most ``main`` of them:
a namespace's pages enter M only on its own evictions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixkv.errors import ArgumentValueError
from radixkv.tree import Node, namespace_of

from .base import EvictionPolicy, history_key
from .ghost import RunHistory

if TYPE_CHECKING:  # pragma: no cover
    from radixkv.cache import PrefixCache

_SMALL, _MAIN = 0, 1


class S3FIFO(EvictionPolicy):
    """S3-FIFO on the tree. ``policy_state`` is ``(due, queue, uses)``.

    Args:
        small_fraction: S's budget as a share of the cache (default 0.1, as in the paper).
        move_threshold: uses while in S needed to move to M (default 1).
    """

    name = "s3fifo"

    def __init__(self, small_fraction: float = 0.1, move_threshold: int = 1) -> None:
        if not 0.0 < small_fraction < 1.0:
            raise ArgumentValueError(f"small_fraction must be in (0, 1), got {small_fraction!r}")
        if move_threshold.__class__ is not int or move_threshold < 1:
            raise ArgumentValueError(f"move_threshold must be an int >= 1, got {move_threshold!r}")
        self.small_fraction = small_fraction
        self.move_threshold = move_threshold
        self._small = self._main = 1
        self._time = 0  # V: pages inserted so far
        self._ghost = RunHistory(None, max_runs=self._main)  # first pages of runs evicted from S

    def attach(self, cache: "PrefixCache") -> None:
        self._small = max(1, int(cache.num_blocks * self.small_fraction))
        self._main = max(1, cache.num_blocks - self._small)
        self._ghost = RunHistory(None, max_runs=self._main)

    def on_insert(self, node: Node, now: int) -> None:
        if self._ghost.pop(history_key(namespace_of(node), node.start, node.first)) is not None:
            node.policy_state = (self._time + self._main, _MAIN, 0)
        else:
            node.policy_state = (self._time + self._small, _SMALL, 0)
        self._time += node.num_pages

    def on_access(self, node: Node, now: int) -> None:
        due, queue, uses = node.policy_state
        if uses < 3:
            node.policy_state = (due, queue, uses + 1)

    def on_victim(self, node: Node) -> int:
        due, queue, uses = node.policy_state
        if queue == _SMALL:
            if uses >= self.move_threshold:
                node.policy_state = (self._time + self._main, _MAIN, 0)
                return 0
        elif uses:
            node.policy_state = (self._time + self._main, _MAIN, uses - 1)
            return 0
        return node.num_pages

    def on_evict(self, node: Node, pages: int, rank: Any) -> None:
        if node.policy_state[1] == _SMALL:
            self._ghost.remember(node, node.end - pages, node.end, None)

    def priority(self, node: Node) -> int:
        return node.policy_state[0]

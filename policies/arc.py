"""ARC: a recency list and a frequency list whose split adapts to ghost hits.

**Rule.** Pages used once since they were cached are in ``T1``, pages used
again in ``T2``; each list is LRU. The target ``p`` for ``T1``'s pages
moves with the ghosts of what each list evicted (``B1``, ``B2``): a request
that brings back a ``B1`` run of ``k`` pages raises ``p`` by ``k *
max(1, |B2| / |B1|)`` (recency was short of room), a ``B2`` run lowers it by
``k * max(1, |B1| / |B2|)``. The victim comes from ``T1`` while ``|T1| > p``,
else from ``T2``. A request that brings back a remembered run caches it in
``T2`` (the pages past it, fresh, in ``T1``), and ``on_victim`` lets a
leaf's fresh tail go at its own rank.

**One queue.** The engine has one victim queue; the two LRU lists become
two offsets on the clock: a page of list ``s`` ranks at ``last use +
offset[s]``. When the surfaced leaf belongs to the list that should not
give a victim now, ``on_victim`` raises that list's offset (by a step that
doubles while the same list keeps surfacing, halves back after a victim)
and re-queues the leaf; the other list's LRU page then comes first. Once
the leaf ranks above every page the other list can have (``now +
offset[other]``) and still surfaces, it is evicted: the other list has no
evictable leaf (its pages are inner nodes or in use). So a victim costs
O(log clock) re-queues at most. The
offsets only grow, so a queued rank is a lower bound of the current one:
a leaf surfacing with a stale rank is re-queued at its current one. So
within each list the order is exactly LRU, and between the lists it
follows ``p`` up to one step; each re-queue is one heap push.

**Ghost.** :class:`~.ghost.RunHistory` of evicted runs (first page's
namespace, depth, tokens), at most ``history_size`` pages (default: the
capacity, ARC's ``|B1| + |B2| <= c``); ``|B1|``, ``|B2|`` are counted in
pages.

Cost: O(1) per hook plus the ghost (O(1) per evicted run, a walk to the root
for the namespace). Memory: a 6-tuple per node, nothing per page; the ghost
holds at most one run per cached page's worth of capacity (~200 bytes per
run), so at most ~200 bytes per cached page, far less when runs are long.

Source: Megiddo & Modha, "ARC: a self-tuning, low overhead replacement
cache" (FAST'03).
"""

from __future__ import annotations

from typing import Any, List, Tuple

from radixkv.tree import Node

from .base import tail_past
from .ghost import GhostPolicy

T1, T2 = 0, 1


class ARC(GhostPolicy):
    """ARC over the tree. ``policy_state`` is ``(head key, tail key, boundary, last use, head list, tail list)``.

    Attributes:
        target: ``p``, the pages ``T1`` should hold.
        sizes: pages of the cache in ``T1`` and ``T2``.
        ghost_sizes: pages remembered in ``B1`` and ``B2``.

    Args:
        history_size: pages of evicted runs remembered; default the cache's capacity.
    """

    name = "arc"
    history_factor = 1

    def __init__(self, history_size: Any = None) -> None:
        self.target = 0.0
        self.sizes = [0, 0]
        self.ghost_sizes = [0, 0]
        self._offset = [0, 0]
        self._step = [1, 1]
        super().__init__(history_size)

    def forget_run(self, record: Any, pages: int) -> None:
        self.ghost_sizes[record[0]] -= pages

    def recalled(self, runs: List[Tuple[Any, int, int]], now: int) -> None:
        b = self.ghost_sizes
        for (lst, _), pages, remembered in runs:
            b[lst] -= remembered
            if lst == T1:
                self.target = min(float(self._capacity), self.target + pages * max(1.0, b[T2] / max(1, b[T1])))
            else:
                self.target = max(0.0, self.target - pages * max(1.0, b[T1] / max(1, b[T2])))
        # entries dropped in recall are not forgotten: their pages are back in the cache

    def _key(self, last: int, lst: int) -> int:
        return last + self._offset[lst]

    def on_insert(self, node: Node, now: int) -> None:
        self._now = now
        boundary, _ = self.take_pending(node, now) or (node.start, None)
        head = min(max(boundary, node.start), node.end) - node.start
        self.sizes[T2] += head
        self.sizes[T1] += node.num_pages - head
        node.policy_state = (self._key(now, T2), self._key(now, T1), boundary, now, T2, T1)

    def on_access(self, node: Node, now: int) -> None:
        self._now = now
        _, _, boundary, _, head_list, tail_list = node.policy_state
        split = min(max(boundary, node.start), node.end)
        moved = (split - node.start if head_list == T1 else 0) + (node.end - split if tail_list == T1 else 0)
        self.sizes[T1] -= moved
        self.sizes[T2] += moved
        key = self._key(now, T2)
        node.policy_state = (key, key, node.start, now, T2, T2)

    def priority(self, node: Node) -> int:
        state = node.policy_state
        return state[1] if node.end > state[2] else state[0]

    def _wanted(self) -> int:
        t1, t2 = self.sizes
        return T1 if (t1 > self.target or t2 <= 0) and t1 > 0 else T2

    def on_victim(self, node: Node) -> int:
        head, tail, boundary, last, head_list, tail_list = node.policy_state
        in_tail = node.end > boundary
        lst = tail_list if in_tail else head_list
        if lst != self._wanted() and self._key(last, lst) <= self.now() + self._offset[1 - lst]:
            self._offset[lst] += self._step[lst]  # not yet above every page of the other list
            self._step[lst] *= 2
        else:
            self._step[lst] = max(1, self._step[lst] // 2)
        key = self._key(last, lst)
        if key > (tail if in_tail else head):
            node.policy_state = ((head, key) if in_tail else (key, tail)) + (boundary, last, head_list, tail_list)
            return 0
        return tail_past(node, boundary)

    def on_evict(self, node: Node, pages: int, rank: Any) -> None:
        _, _, boundary, last, head_list, tail_list = node.policy_state
        end = node.end
        depth = end - pages
        split = min(max(boundary, depth), end)
        self.sizes[head_list] -= split - depth
        self.sizes[tail_list] -= end - split
        lst = tail_list if depth >= boundary else head_list
        self.ghost_sizes[lst] += max(1, pages)
        self.history.remember(node, depth, end, (lst, last))

"""LIRS-like: evict the page whose larger of (last reuse interval, age) is largest.

**Rule.** A page's *reuse interval* ``r`` is the time between its last two
uses (LIRS's inter-reference recency), its *age* the time since its last
use. Among evictable leaves the engine evicts the tail page with the
largest ``max(r, now - last)``; a page with no known reuse (first use, and
not remembered by the ghost) has ``r`` infinite, so such pages go first,
least recently used first (LIRS's resident HIR pages). A page used twice in
quick succession is kept until its age exceeds that interval, or until the
pages with longer intervals are gone.

**One queue.** ``max(r, now - last)`` largest first is ``min(now - r,
last)`` smallest first, which grows with ``now`` (by at most ``last``). The
queue holds the key as of the last look (at a use it is ``last - r``, the
time of the use before: LRU-2), a lower bound of the current one; when a
leaf surfaces, ``on_victim`` recomputes it and, if it grew, re-queues the
leaf and looks again. The popped key is then the current minimum, so the
order is exact. Each look is one heap push; a leaf is looked at again only
after the clock moved.

**Ghost.** Reuse mostly comes after the page was evicted, so the evicted
runs are remembered (:class:`~.ghost.RunHistory`: at most
``history_size`` pages, by default 4x the capacity, keyed by namespace, depth and tokens of each run's
first page) with their last use; pages a new request brings back get ``r =
now - last use`` (the pages past the recognized runs stay cold, and
``on_victim`` lets that cold tail go at its own rank).

Cost: O(1) per hook plus the ghost (O(1) per evicted run, a walk to the root
for the namespace). Memory: a 6-tuple per node, nothing per page; the ghost
at most 4 runs per page of capacity (~200 bytes per run): at most ~800 bytes
per cached page, far less when runs are long (a 16-token page
holds 2 MB of KV for llama-3-8b).

Source: Jiang & Zhang, "LIRS: an efficient low inter-reference recency set
replacement policy" (SIGMETRICS'02). LIRS keeps the low-IRR set by a stack
and a size split; here the rule "evict the largest max(IRR, recency)" that
the split approximates is applied directly, as in the block-level study of
the Mooncake traces this package's policy table reproduces.
"""

from __future__ import annotations

from typing import Any, Optional

from radixkv.tree import Node

from .base import tail_past
from .ghost import GhostPolicy

_COLD = 1 << 62  # a page with no known reuse interval ranks this far below every other


def lirs_key(last: int, interval: Optional[int], now: int) -> int:
    """Rank (lowest evicted first) of a page last used at ``last`` with reuse interval ``interval`` at ``now``."""
    return last - _COLD if interval is None else min(now - interval, last)


class LIRS(GhostPolicy):
    """Largest ``max(reuse interval, age)`` first.

    ``policy_state`` is ``(head key, tail key, boundary, last use, head
    interval, tail interval)``: pages above depth ``boundary`` are the head
    (remembered by the ghost), the rest the tail; an interval is ``None``
    while unknown.

    Args:
        history_size: pages of evicted runs the ghost remembers; default 4x the cache's capacity.
    """

    name = "lirs"

    def on_insert(self, node: Node, now: int) -> None:
        self._now = now
        boundary, runs = self.take_pending(node, now) or (node.start, [])
        interval = now - runs[0][0] if runs else None
        node.policy_state = (lirs_key(now, interval, now), lirs_key(now, None, now), boundary, now, interval, None)

    def on_access(self, node: Node, now: int) -> None:
        self._now = now
        interval = now - node.policy_state[3]
        key = now - interval
        node.policy_state = (key, key, node.start, now, interval, interval)

    def priority(self, node: Node) -> int:
        state = node.policy_state
        return state[1] if node.end > state[2] else state[0]

    def on_victim(self, node: Node) -> int:
        head, tail, boundary, last, head_interval, tail_interval = node.policy_state
        if node.end > boundary:
            key = lirs_key(last, tail_interval, self.now())
            if key > tail:
                node.policy_state = (head, key, boundary, last, head_interval, tail_interval)
                return 0
        else:
            key = lirs_key(last, head_interval, self.now())
            if key > head:
                node.policy_state = (key, tail, boundary, last, head_interval, tail_interval)
                return 0
        return tail_past(node, boundary)

    def on_evict(self, node: Node, pages: int, rank: Any) -> None:
        self.history.remember(node, node.end - pages, node.end, node.policy_state[3])

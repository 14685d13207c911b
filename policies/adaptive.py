"""Adaptive retention windows: keep each class of pages as long as its observed reuse pays for the space.

**Rule.** A page's class is (uses so far: 1, 2, 3+) x (size of the request
that cached it: under 1K, 4K, 16K tokens, or more). Each class ``c`` has a
retention window ``T_c``; a leaf is ranked by the deadline ``last use +
T_c`` of its tail page, earliest evicted first (ties: deepest page). With
all windows equal this is LRU, which is where it starts.

**Learning the windows.** The policy counts, per class and weighted by
pages, how many uses happen (``N_c``) and after what gap each page is used
again (a histogram ``H_c`` in half-power-of-two bins of clock ticks), both
decayed with a half-life. Reuses of cached pages are seen on access; reuses
of pages no longer cached through a bounded history of evicted runs, keyed
by the namespace, depth and bytes of a run's first page (an approximate
page identity, never shared between namespaces). Every ``solve_every``
ticks it picks the windows that maximize expected hits within the cache's
capacity: keeping a class-``c`` use for ``T`` costs ``min(gap, T)``
page-ticks, the capacity is ``num_blocks`` pages over the same decayed
span, and one Lagrange multiplier, found by bisection, equalizes hits per
page-tick across classes. Cost: O(1) per hook (plus a walk to the root at
admission and eviction, for the namespace), O(classes x bins x 50) numpy
work per solve.

**Why.** On prefix-cache traces most new pages are never used again and
reuse gaps are long and broad, so LRU keeps every page for the same, too
short a time. The learned windows give first uses a short probation (as
2Q and S3-FIFO do) and pages that proved reusable, or that come from the
request sizes that get reused, a long stay; where classes look alike the
windows come out alike and the policy stays close to LRU.

**Per page.** A run cached after a history hit holds reused pages (those
the evicted run covered) and fresh ones (beyond it); they carry different
classes, the leaf is ranked by its tail's, and ``on_victim`` lets only the
fresh tail run go at that rank.

Sources: per-class TTL caching (Fofack et al., "Analysis of TTL-based cache
networks", 2012; Basu et al., "Adaptive TTL-based caching for content
delivery", 2017); hit density (Beckmann et al., "LHD: Improving cache hit
rate by maximizing hit density", NSDI'18); probation of first uses (2Q,
Johnson & Shasha 1994; S3-FIFO, SOSP'23).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence, Tuple

import numpy as np

from radixkv.errors import ArgumentValueError
from radixkv.tree import Node, namespace_of

from .base import gap_bin, history_key, tail_past
from .ghost import GhostPolicy, RunHistory

if TYPE_CHECKING:  # pragma: no cover
    from radixkv.cache import PrefixCache

_BINS = 34  # bin 0: gap 0; bin j >= 1: gaps in [2^((j-1)/2), 2^(j/2)) ticks
_WINDOWS = np.array([0.0] + [2.0 ** (j / 2) for j in range(1, _BINS)])  # window j catches bins <= j
_MEAN_GAP = np.array([0.0] + [2.0 ** ((j - 0.5) / 2) for j in range(1, _BINS)])
_USE_LEVELS = 3  # uses: 1, 2, 3+


def solve_windows(uses: np.ndarray, gaps: np.ndarray, budget: float) -> np.ndarray:
    """Per-class windows maximizing expected hits with total cost <= ``budget`` page-ticks.

    ``uses[c]`` page-uses of class ``c``; ``gaps[c, j]`` of them were used
    again after a gap in bin ``j``. Picks one candidate window per class for
    a common price per page-tick, bisected so the cost just fits. O(classes
    x bins x 50).
    """
    hits = np.cumsum(gaps, axis=1)
    cost = np.cumsum(gaps * _MEAN_GAP, axis=1) + np.clip(uses[:, None] - hits, 0, None) * _WINDOWS
    rows = np.arange(len(uses))
    lo, hi = 1e-12, 1e6

    def pick(price: float) -> Tuple[np.ndarray, float]:
        j = np.argmax(hits - price * cost, axis=1)
        return j, float(cost[rows, j].sum())

    for _ in range(50):
        mid = math.sqrt(lo * hi)
        if pick(mid)[1] > budget:
            lo = mid
        else:
            hi = mid
    return _WINDOWS[pick(hi)[0]]


class AdaptiveRetention(GhostPolicy):
    """Deadline ranking with per-class windows learned online.

    ``policy_state`` is ``(last_use, head_class, fresh_class, boundary,
    run_end, head_deadline, fresh_deadline)``: pages below depth ``boundary``
    are in ``head_class``, the rest in ``fresh_class``.

    Args:
        size_edges: request-size class boundaries, in tokens.
        half_life: ticks after which an observation counts half.
        solve_every: ticks between two window solves.
        history_size: evicted runs remembered for reuse detection.
    """

    name = "adaptive"

    def __init__(self, size_edges: Sequence[int] = (1024, 4096, 16384), half_life: int = 2000,
                 solve_every: int = 64, history_size: int = 1 << 16) -> None:
        for arg, value in (("half_life", half_life), ("solve_every", solve_every),
                           ("history_size", history_size)):
            if value.__class__ is not int or value < 1:
                raise ArgumentValueError(f"{arg} must be an int >= 1, got {value!r}")
        self.size_edges = tuple(size_edges)
        if list(self.size_edges) != sorted(set(self.size_edges)):
            raise ArgumentValueError(f"size_edges must be increasing, got {size_edges!r}")
        self.half_life = half_life
        self.solve_every = solve_every
        classes = _USE_LEVELS * (len(self.size_edges) + 1)
        self.windows = np.zeros(classes)
        """Current retention window per class, in clock ticks (all 0 = LRU until the first solve)."""
        self._uses = np.zeros(classes)
        self._gaps = np.zeros((classes, _BINS))
        self._new_uses = [0.0] * classes
        self._new_gaps = [[0.0] * _BINS for _ in range(classes)]
        self._span = 0.0  # decayed ticks observed
        self._solved_at = 0
        self._page_size = 1
        super().__init__(history_size)

    def new_history(self, capacity: int) -> RunHistory:
        """The ghost: the last ``history_size`` evicted runs, each ``(class, last use, run end)``."""
        return RunHistory(None, max_runs=self.history_size)

    def attach(self, cache: "PrefixCache") -> None:
        super().attach(cache)
        self._page_size = cache.page_size

    # ------------------------------------------------------------ classes and learning
    def _size_class(self, num_pages: int) -> int:
        tokens = num_pages * self._page_size
        size = 0
        for edge in self.size_edges:
            size += tokens >= edge
        return size

    def _used_again(self, cls: int) -> int:
        """The class a page of ``cls`` moves to on its next use."""
        level, size = divmod(cls, len(self.size_edges) + 1)
        return min(level + 1, _USE_LEVELS - 1) * (len(self.size_edges) + 1) + size

    def _observe(self, cls: int, gap: int, pages: int) -> None:
        self._new_gaps[cls][gap_bin(gap, _BINS)] += pages
        self._new_uses[self._used_again(cls)] += pages

    def _tick(self, now: int) -> None:
        if now - self._solved_at < self.solve_every:
            return
        decay = 0.5 ** ((now - self._solved_at) / self.half_life)
        self._uses = self._uses * decay + np.array(self._new_uses)
        self._gaps = self._gaps * decay + np.array(self._new_gaps)
        self._span = self._span * decay + (now - self._solved_at)
        self._new_uses = [0.0] * len(self._new_uses)
        self._new_gaps = [[0.0] * _BINS for _ in self._new_uses]
        self._solved_at = now
        self.windows = solve_windows(self._uses, self._gaps, self._capacity * self._span)

    # ------------------------------------------------------------ hooks
    def admit(self, node_parent: Node, num_pages: int, now: int, pages: memoryview) -> int:
        self._tick(now)
        start = node_parent.end
        end = start + num_pages
        fresh = self._size_class(end)  # level 0: first use
        key = history_key(namespace_of(node_parent), start, bytes(pages[: self._page_bytes]))
        seen = self.history.pop(key)
        if seen is None:
            self.hold(node_parent, now, (fresh, fresh, start))
            self._new_uses[fresh] += num_pages
        else:
            (cls, last, run_end), run_pages = seen
            boundary = min(max(run_end, start + run_pages), end)
            self._observe(cls, now - last, boundary - start)
            self.hold(node_parent, now, (self._used_again(cls), fresh, boundary))
            self._new_uses[fresh] += end - boundary
        return num_pages

    def on_insert(self, node: Node, now: int) -> None:
        note = self.take_pending(node, now)
        if note is None:  # not admitted (a tier's load-back): fresh pages of a request this deep
            fresh = self._size_class(node.end)
            note = (fresh, fresh, node.start)
        head, fresh, boundary = note
        w = self.windows
        node.policy_state = (now, head, fresh, boundary, node.end, now + w[head], now + w[fresh])

    def on_access(self, node: Node, now: int) -> None:
        self._tick(now)
        last, head, fresh, boundary, run_end, _, _ = node.policy_state
        gap = now - last
        split = min(max(boundary, node.start), node.end)
        if split > node.start:
            self._observe(head, gap, split - node.start)
        if node.end > split:
            self._observe(fresh, gap, node.end - split)
        head, fresh = self._used_again(head), self._used_again(fresh)
        w = self.windows
        node.policy_state = (now, head, fresh, boundary, run_end, now + w[head], now + w[fresh])

    def on_split(self, upper: Node, lower: Node) -> None:
        last, head, fresh, boundary, run_end, dh, df = lower.policy_state
        if boundary <= lower.start:  # the fresh part starts in the upper node
            lower.policy_state = (last, fresh, fresh, lower.start, run_end, df, df)
        else:
            upper.policy_state = (last, head, head, upper.end, run_end, dh, dh)

    def on_victim(self, node: Node) -> int:
        return tail_past(node, node.policy_state[3])  # the fresh tail goes at its own rank

    def on_evict(self, node: Node, pages: int, rank: Any) -> None:
        last, head, fresh, boundary, run_end, _, _ = node.policy_state
        depth = node.end - pages
        cls, extent = (fresh, run_end) if depth >= boundary else (head, boundary)
        self.history.remember(node, depth, node.end, (cls, last, extent))

    def priority(self, node: Node) -> float:
        state = node.policy_state
        return state[6] if node.end > state[3] else state[5]

"""Predicted hit density: first uses ranked by expected hits per page-tick, pages used again kept ahead of them.

**Rule.** Each page has a class at every use (uses so far, capped at 4 x
quarter of its request x request-length bucket x output-length bucket;
:mod:`.reuse`). Every ``refit_every`` ticks the policy fits, per class, the
survival ``S`` of the time between successive uses of a page (Kaplan-Meier
over half-power-of-two bins of clock ticks; a page the ghost forgot, or not
used again yet, counts as censored at its age) and scores a page of class
``c`` and age ``a`` by its hit density over the horizon ``H`` (the cache's
eviction age)::

    (S(a) - S(a + H)) / integral of S over [a, a + H]

the expected hits per page-tick it will occupy. A page used once is kept
for its class's window: until the age at which the best density its class
can still reach falls below the margin of the room first uses hold now;
pages used twice or more (in the cache or remembered by the ghost) share
one window, the 99th percentile of their observed reuse gaps and at least
any first use's, so they are LRU among themselves and outrank first uses.
The victim is the page whose deadline (last use + window) is earliest under
the windows of the latest fit. LRU until enough history exists
(``min_pages`` observed pages).

**Class lanes** (``class_lanes``, on by default). Pages of one class share
a window, so within a class the deadline order is the last-use order: the
policy queues each leaf in its tail page's class lane (one lane per
first-use class, one for the pages used again; the engine's lane seam,
:class:`~radixkv.victims.LaneQueue`), each lane in last-use order, and at
eviction compares the lanes' heads by their deadlines under the current
windows (:meth:`HitDensity.choose`). A refit that shortens or lengthens a
class's window reorders its pages at once. Without lanes, a deadline is
computed at the page's last use and may only rise (a surfacing victim is
re-ranked when a refit lengthened its window, ``rerank``, :mod:`.reuse`);
a shortened one waits for its old rank. Cost: O(busy lanes) per victim
(at most ``4 x categories + 1``), on top of the queue's O(log n).

**Why.** On prefix-cache traces reuse depends most on whether a page was
used before (remembered past eviction by the ghost: on the Mooncake
conversation trace a page seen once is reused 26% of the time, twice 42%),
then on where it sits in its request, on the request's length and, on
synthetic-like traffic, on its output length (short answers mark multi-turn
and document-QA requests); reuse gaps are broad and multi-modal, so a
survival curve per class ranks first uses better than one window for all.
Ranking the pages used again by their classes' densities too lost 4 points
of hit rate on the Mooncake synthetic trace at 3M tokens (their densities
fall fast once the typical gap passed, but a page that proved reusable
keeps coming back), and keeping them ahead of first uses without a window
lost 3.5 points on the conversation trace at 9M tokens (dead sessions fill a
large cache): hence one window, 2Q's rule. Output buckets without lanes fell
3.95 points below LRU on the conversation trace at 9M tokens, page 16
(second half), likely because a deadline computed under an earlier, longer
window of the extra classes kept its rank; with lanes (the current windows)
that cell is 0.30 points below LRU.

**Defaults** (``length_edges`` 2K/8K/32K tokens, ``output_edges`` 32/128
tokens, ``refit_every`` 200, ``min_pages`` 200, a ghost of 4x the capacity,
class lanes on) were chosen on the first half of each Mooncake trace at 3M
tokens, block level (page 512, 5,859 blocks), by the share of that half's
LRU-Belady gap: 18.7% (conversation) and 15.4% (synthetic), against 18.2%
and 13.0% for the earlier defaults (no lanes, no output buckets, length
edges 4K/16K/64K, re-ranking). With lanes: no output buckets 17.3% / 11.8%
with the chosen edges (18.3% / 12.8% with 4K/16K/64K), so the first halves
alone choose the buckets (the second half of the conversation trace at 9M
tokens, above, was only checked);
output buckets with length edges 4K/16K/64K 17.9% / 15.0%, 1K/4K/16K
16.4% / 15.1%, 2K/8K 16.7% / 14.0%, 2K/16K 16.2% / 15.1%, 2K/4K/8K/32K
16.9% / 15.4%, 8K/32K 17.0% / 15.4%. Compared there (with output buckets
and the 4K/16K/64K edges unless said) and not taken: lanes
ranked by the density now (16.7% / 12.0% without output buckets, 16.4% /
20.2% with) or by the best density still reachable (18.2% / 12.5%; 16.7% /
14.0%) instead of deadlines; pages used again in per-class lanes ranked by
density (9.0-13.4% / 3.2-7.8%); first-use windows x0.5, x2, x4 and the
reused window at the 80th or 90th percentile (conversation 14.1-17.5%);
refits every 100 (16.7% / 19.6%), a ghost of 2x or 8x (14.2%, 17.5%
conversation), horizons x0.5 and x2, halves or eighths instead of quarters,
exponential forgetting of the statistics (x0.99 per refit), windows
interpolated inside their bin, a category for new pages that extend a cached
chain, ``min_pages`` 100 (conversation 16.8-18.2%, synthetic 12.9-16.1%:
none raised both halves); with the chosen edges, a ghost of 3x, 5x or 6x
(conversation 16.7-18.5%) and the last page of a request as a fifth
position class (18.9% / 10.6%). Output edges were compared before without lanes
(24/128, 32/96, 32/256, 48/160, 64, 16/64/256: 32/128 best on the
synthetic first half). The one-point rule against LRU (1M / 3M / 9M tokens,
page 16 and 512, whole trace and second half, both traces) was checked on
the whole traces after the choice, not used to choose: worst -0.31 points
(conversation, 9M tokens, block level, second half). On the generated
``mix`` workload (:mod:`radixkv.workload.generators`, seeds 1 and 7, 3,000
requests, 4,000 pages of 16 tokens), which nothing was chosen on: 62.6% and
61.8% token hit rate against LRU's 56.6% and 55.8%.

What limits it on the conversation trace (3M tokens, block level, whole
trace): with every first-use window set to 0 (first uses in LRU order, only
the pages used again kept for their window) it still closes 19.9% of the
gap, against 20.9%: the classes' survival fits are worth about one point of
the gap there, the rest is the split between first uses and pages used
again (:mod:`.ghost`). The features above do not tell a first turn that
will continue from one that will not.

**Ranking by density now** (``rank="density"``, not the default). Every
class has its own lane, the pages used again included, each lane in
last-use order, and the victim is the lane head of lowest density
``table[class, age bin now]`` (ties: the older use, then the lower class);
the horizon is the whole fitted range (``horizon_factor=None``) or a multiple
of the eviction age. This is issue 15's rule, save that the exact rule
takes the argmin over every evictable page: within a lane the densities are
piecewise constant in age, so only where a class's density rises with age
can a younger page of the lane rank below its head, and the block-level
study ``bench/studies/density_exact.py`` (``bench/results/density_exact.md``)
finds the lane heads within 0.2 points of the gap of the exact argmin on
both Mooncake traces. It also finds the horizon decisive: with ``H`` the
eviction age the exact rule closes 15.6% of the conversation trace's gap,
with the whole fitted range 22.9%. Cost O(classes) per victim (192 lanes
with the default edges): a replay of the conversation trace at 3M tokens,
block level, takes 14 s against the default's 6 s.
Measured here at 3M tokens, block level, whole trace / second half:
conversation 19.38% / 21.06% (23.2% / 28.7% of the gap, against 20.9% /
23.3% for the default), synthetic 32.75% / 43.96% (2.7% of the gap, and 2.1
points *below* LRU on the second half; at 1M tokens 2.3 points below);
at 1M and 9M tokens the conversation trace stays above LRU (10.41% / 11.83%,
29.24% / 30.42%);
``horizon_factor`` 2 and 3: conversation 19.41% and 19.35% (23.3%, 23.1%),
synthetic 34.14% and 34.20% (8.6%, 8.8%). It fails the synthetic trace, as
ranking the pages used again by their classes' densities did with deadlines
(above), so it is not the default.

Sources: Beckmann, Chen & Cidon, "LHD: Improving cache hit rate by
maximizing hit density" (NSDI'18): hit density and per-class age
distributions; Kaplan & Meier (1958) for the censored survival fit; 2Q
(Johnson & Shasha, VLDB'94) for the one window of reused pages.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from radixkv.errors import ArgumentValueError

from .base import RequestHints, gap_bin
from .reuse import BINS, EDGES, QUARTERS, ClassDeadline, bucket


RANKS = ("density", "deadline")
"""``rank``: the lowest hit density now among the class lanes' heads, or the earliest deadline."""


def hit_density(survival: np.ndarray, horizon: float) -> np.ndarray:
    """``(S(a) - S(a+H)) / integral_a^{a+H} S`` at each bin's lower edge ``a``, per row of ``survival`` (at EDGES)."""
    widths = np.diff(EDGES)
    area = np.concatenate([np.zeros((len(survival), 1)),
                           np.cumsum((survival[:, 1:] + survival[:, :-1]) / 2 * widths, axis=1)], axis=1)
    ages = EDGES[:BINS]
    out = np.empty((len(survival), BINS))
    for c in range(len(survival)):
        s, cum = survival[c], area[c]
        hits = s[:BINS] - np.interp(ages + horizon, EDGES, s)
        cost = np.interp(ages + horizon, EDGES, cum) - cum[:BINS]
        out[c] = np.divide(hits, cost, out=np.zeros(BINS), where=cost > 0)
    return out


def _edges(arg: str, value: Sequence[int], empty: bool) -> Tuple[int, ...]:
    edges = tuple(value)
    if (not edges and not empty) or any(e.__class__ is not int or e < 1 for e in edges) or list(edges) != sorted(set(edges)):
        raise ArgumentValueError(f"{arg} must be increasing ints >= 1, got {value!r}")
    return edges


class HitDensity(ClassDeadline):
    """Lowest predicted hit density first (see the module docstring).

    Args:
        length_edges: request-length class boundaries, in tokens (increasing).
        output_edges: output-length class boundaries, in tokens (increasing; ``()``: no output classes).
            A request without an output length falls in the first bucket.
        refit_every, min_pages, history_size: as :class:`~.reuse.ClassDeadline`.
        class_lanes: queue each leaf in its tail class's lane and evict by the deadlines of the
            current windows (see the module docstring); ``False``: one static queue, deadlines
            computed at the last use and re-ranked upward only. The pages used again share one
            lane in last-use order, since every fit gives their classes one window (so class lanes
            need ``protect_reused``); windows *set* to differ between those classes order them
            only against first uses: use ``False`` for that.
        rank: ``"deadline"`` (the default: the rule above) or ``"density"`` (not the default: every
            class in its own lane, the pages used again too, and the victim the lane head of lowest
            hit density at its age now; see *Ranking by density now* in the module docstring).
        horizon_factor: with ``rank="density"``, the horizon ``H`` as a multiple of the eviction
            age; ``None``: the whole fitted range (the last age bin's edge).
    """

    name = "density"
    protect_reused = True
    rerank = True

    def __init__(self, length_edges: Sequence[int] = (2048, 8192, 32768), output_edges: Sequence[int] = (32, 128),
                 refit_every: int = 200, min_pages: int = 200, history_size: Optional[int] = None,
                 class_lanes: bool = True, rank: str = "deadline", horizon_factor: Optional[float] = None) -> None:
        if rank not in RANKS:
            raise ArgumentValueError(f"rank must be one of {RANKS}, got {rank!r}")
        if horizon_factor is not None:
            if isinstance(horizon_factor, (bool, np.bool_)) or not isinstance(horizon_factor, (int, float, np.integer, np.floating)) \
                    or not 0 < horizon_factor < math.inf:
                raise ArgumentValueError(f"horizon_factor must be a number > 0 or None, got {horizon_factor!r}")
            if rank != "density":
                raise ArgumentValueError(f"horizon_factor applies to rank 'density' only, got rank {rank!r}")
            horizon_factor = float(horizon_factor)
        if rank == "density":
            if class_lanes is not True:
                raise ArgumentValueError(f"rank 'density' compares the class lanes' heads: class_lanes must be True, "
                                         f"got {class_lanes!r}")
            self.protect_reused = False  # every class by its density, the pages used again too
            self.rerank = False
        self.rank = rank
        self.horizon_factor = horizon_factor
        self._table: Optional[np.ndarray] = None
        self._rows: Optional[list] = None
        self.length_edges = _edges("length_edges", length_edges, empty=False)
        self.output_edges = _edges("output_edges", output_edges, empty=True)
        if class_lanes.__class__ is not bool:
            raise ArgumentValueError(f"class_lanes must be a bool, got {class_lanes!r}")
        self._page_size = 1
        super().__init__(refit_every, min_pages, history_size)
        self.class_lanes = class_lanes
        self._first = QUARTERS * self.categories  # classes 0 .. _first - 1 are first uses
        if rank == "density":
            self.lanes = self.num_classes  # a lane per class, each in last-use order
        elif class_lanes:
            if not self.protect_reused:
                raise ArgumentValueError("class_lanes needs protect_reused: the pages used again share one "
                                         "lane, so their classes must share one window")
            self.lanes = self._first + 1  # a lane per first-use class, one for the pages used again
            self.rerank = False  # each lane is in last-use order and compared under the current windows

    def num_categories(self) -> int:
        return (len(self.length_edges) + 1) * (len(self.output_edges) + 1)

    def attach(self, cache) -> None:
        super().attach(cache)
        self._page_size = getattr(cache, "page_size", 1)

    def category(self, num_pages: int, hints: Optional[RequestHints]) -> int:
        length = bucket(num_pages * self._page_size, self.length_edges)
        if not self.output_edges:
            return length
        output = 0 if hints is None or hints.output_length is None else bucket(hints.output_length, self.output_edges)
        return length * (len(self.output_edges) + 1) + output

    def score(self, survival: np.ndarray, events: np.ndarray, horizon: float) -> np.ndarray:
        if self.rank == "density":
            h = float(EDGES[-1]) if self.horizon_factor is None else self.horizon_factor * horizon
            self._set_table(hit_density(survival, h))
            return self._table
        return hit_density(survival, horizon)

    @property
    def densities(self) -> Optional[np.ndarray]:
        """With ``rank="density"``: hit density per (class, age bin) of the latest fit (``None`` until
        the first fit: LRU); settable (a copy is kept). O(classes x bins)."""
        return None if self._table is None else self._table.copy()

    @densities.setter
    def densities(self, value: Any) -> None:
        try:
            table = np.array(value, dtype=float)
        except (TypeError, ValueError):
            table = np.zeros(0)
        if table.shape != (self.num_classes, BINS) or not np.isfinite(table).all():
            raise ArgumentValueError(f"densities must be finite, shape ({self.num_classes}, {BINS}), got {value!r}")
        self._set_table(table)

    def _set_table(self, table: np.ndarray) -> None:
        self._table = table
        self._rows = table.tolist()  # read per victim: lists index faster than numpy scalars

    # ------------------------------------------------------------ class lanes
    def priority(self, node):
        if self.class_lanes:
            return node.policy_state[0]  # last use: a lane holds one window, so this is its deadline order
        return super().priority(node)

    def lane(self, node) -> int:
        cls = self._tail_class(node)
        return cls if cls < self._first or self.rank == "density" else self._first

    def choose(self, heads) -> int:
        if self.rank == "density":
            return self._lowest_density(heads)
        return self._earliest_deadline(heads)

    def _lowest_density(self, heads) -> int:
        """The head of lowest hit density at its age now (ties: the older use, then the lower class);
        LRU before the first fit. O(len(heads))."""
        rows, now = self._rows, self.now()
        best_i, best = 0, None
        for i, node in enumerate(heads):
            last = node.policy_state[0]
            cls = self._tail_class(node)
            key = (0.0 if rows is None else rows[cls][gap_bin(now - last, BINS)], last, cls)
            if best is None or key < best:
                best_i, best = i, key
        return best_i

    def _earliest_deadline(self, heads) -> int:
        """The head with the earliest deadline under the current windows (last use + its class's
        window; ties: the older use, then the lower class). O(len(heads))."""
        windows = self._window_list
        best_i, best = 0, None
        for i, node in enumerate(heads):
            last = node.policy_state[0]
            cls = self._tail_class(node)
            key = (last + windows[cls], last, cls)
            if best is None or key < best:
                best_i, best = i, key
        return best_i

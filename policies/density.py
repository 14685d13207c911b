"""Predicted hit density: first uses ranked by expected hits per page-tick, pages used again kept ahead of them.

**Rule.** Each page has a class at every use (uses so far, capped at 4 x
quarter of its request x request-length bucket, optionally x output-length
bucket; :mod:`.reuse`). Every ``refit_every`` ticks the policy fits, per
class, the survival ``S`` of the time between successive uses of a page
(Kaplan-Meier over half-power-of-two bins of clock ticks; a page the ghost
forgot, or not used again yet, counts as censored at its age) and scores a
page of class ``c`` and age ``a`` by its hit density over the horizon ``H``
(the cache's eviction age)::

    (S(a) - S(a + H)) / integral of S over [a, a + H]

the expected hits per page-tick it will occupy. A page used once is kept
until the age at which the best density its class can still reach falls
below the margin of the room first uses hold now (its deadline, made static
as in :mod:`.reuse`); pages used twice or more (in the cache or remembered
by the ghost) share one window, the 99th percentile of their observed reuse
gaps and at least any first use's, so they are LRU among themselves and
outrank first uses. LRU until enough history exists (``min_pages``
observed pages).

**Why.** On prefix-cache traces reuse depends most on whether a page was
used before (remembered past eviction by the ghost: on the Mooncake
conversation trace a page seen once is reused 26% of the time, twice 42%),
then on where it sits in its request and on the request's length; reuse
gaps are broad and multi-modal, so a survival curve per class ranks first
uses better than one window for all. Ranking the pages used again by their
classes' densities too lost 4 points of hit rate on the Mooncake synthetic
trace at 3M tokens (their densities fall fast once the typical gap passed,
but a page that proved reusable keeps coming back), and keeping them ahead of
first uses without a window lost 3.5 points on the conversation trace at 9M
tokens (dead sessions fill a large cache): hence one window, 2Q's rule.

A leaf that surfaces as the victim is re-ranked by its deadline under the
current windows when a refit lengthened it (``rerank``, :mod:`.reuse`).

**Defaults** (``length_edges`` 4K/16K/64K tokens, no output buckets,
``refit_every`` 200, ``min_pages`` 200, a ghost of 4x the capacity,
re-ranking on) were compared on the first half of each Mooncake trace at
3M tokens, block level (neighbours: length edges 2K/8K/32K and 8K/32K,
horizons x0.5 to x4, a ghost of 8x, refits every 50 and 100, ``min_pages``
100, the reused window at the 90th to 99.9th percentile: none raised both
first halves). Re-ranking raises the first halves' share of the LRU-Belady
gap from 17.0% to 18.2% (conversation) and from 9.9% to 13.0%
(synthetic). Output edges 32/128 take the synthetic first half to 20.5%
(24/128, 32/96, 32/256, 48/160, 64, 16/64/256: 14.7-20.1%), but on the
conversation trace at 9M tokens, page 16, they fall 3.95 points of hit rate
below LRU (second half): off by default; ``output_edges=(32, 128)`` suits
traffic like the synthetic trace's. The rule for pages used again was
chosen between the three above on the whole traces (3M and 9M tokens). On
the generated ``mix`` workload (:mod:`radixkv.workload.generators`, seeds 1
and 7, 3,000 requests, 4,000 pages of 16 tokens), which nothing was chosen
on: 62.6% and 61.9% token hit rate against LRU's 56.6% and 55.8%.

Sources: Beckmann, Chen & Cidon, "LHD: Improving cache hit rate by
maximizing hit density" (NSDI'18): hit density and per-class age
distributions; Kaplan & Meier (1958) for the censored survival fit; 2Q
(Johnson & Shasha, VLDB'94) for the one window of reused pages.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from radixkv.errors import ArgumentValueError

from .base import RequestHints
from .reuse import BINS, EDGES, ClassDeadline, bucket


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
        output_edges: output-length class boundaries, in tokens (increasing; none by default).
        refit_every, min_pages, history_size: as :class:`~.reuse.ClassDeadline`.
    """

    name = "density"
    protect_reused = True
    rerank = True

    def __init__(self, length_edges: Sequence[int] = (4096, 16384, 65536), output_edges: Sequence[int] = (),
                 refit_every: int = 200, min_pages: int = 200, history_size: Optional[int] = None) -> None:
        self.length_edges = _edges("length_edges", length_edges, empty=False)
        self.output_edges = _edges("output_edges", output_edges, empty=True)
        self._page_size = 1
        super().__init__(refit_every, min_pages, history_size)

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
        return hit_density(survival, horizon)

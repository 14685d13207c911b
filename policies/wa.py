"""Workload-aware eviction (ATC'25): per-class exponential reuse-time fit, evict the least likely reuse first.

**Rule.** A page's class is its workload category, its uses so far (1..4,
the ghost remembering uses past eviction) and the quarter of its request it
sits in (:mod:`.reuse`). The category is the paper's where the trace has
them, the request's ``type`` and whether it is a session's first turn
(:class:`~.base.RequestHints`: Bailian ``type`` and ``turn``); where it
does not, a learned class: the request-length bucket. Per class the policy
fits the reuse time as an exponential with a never-reused share: ``p`` =
the share of uses followed by another (Kaplan-Meier, censored at the ghost's
horizon), ``lambda`` = 1 / the mean gap of those that were. A page of age
``a`` is reused within the horizon ``H`` with probability::

    P(a) = p e^(-lambda a) (1 - e^(-lambda H)) / (1 - p + p e^(-lambda a))

and the page with the lowest ``P`` goes first; among equal ``P`` the larger
offset in the request (the paper's ``(P(reuse), -offset)``): the engine's tie
order is deepest page first, and the quarter is part of the class. ``P`` is
made static as in :mod:`.reuse` (a deadline: the age at which ``P`` falls
below the marginal ``P`` of the cache's capacity), and compared under the
latest fit: each class of first uses queues in its own lane (pages used
again, which share one window, in one more), last use first, and the
victim is the lane head with the earliest deadline under the current
windows (``class_lanes``, as :class:`~.density.HitDensity`'s). LRU until
enough history.

**Why.** Reuse in prefix caches differs most between workloads (API calls,
chat sessions, multimodal) and an exponential per workload fits its reuse
times well enough to rank them (the paper's finding on Bailian traces).

**Defaults** (``length_edges`` 4K/16K/64K tokens, ``refit_every`` 200,
``min_pages`` 200) set a priori, not tuned on the scored traces; class lanes
on, as in ``density`` (without them, a deadline computed under an earlier fit
kept its rank: on the Mooncake traces at 3M tokens, block level, whole
trace, ``wa`` closed 12.5% of the LRU-Belady gap on the conversation trace
and fell 4.35 points below LRU on the synthetic one; with them 20.6% and
+10.7%, and no cell of the policy table more than a point below LRU).

Source: Wang et al., "KVCache Cache in the Wild: Characterizing and
Optimizing KVCache Cache at a Large Cloud Provider" (USENIX ATC'25).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from radixkv.errors import ArgumentValueError

from .base import RequestHints
from .density import HitDensity
from .reuse import BINS, EDGES

_MIDS = np.sqrt(np.maximum(EDGES[:-1], 0.5) * EDGES[1:])  # a bin's geometric middle


def exponential_reuse(survival: np.ndarray, events: np.ndarray, horizon: float) -> np.ndarray:
    """``P(a)`` of the module docstring at each bin's lower edge, per class (rows). O(classes x bins)."""
    p = np.clip(1.0 - survival[:, -1], 0.0, 1.0)[:, None]
    total = events.sum(axis=1)
    mean = np.divide((events * _MIDS).sum(axis=1), total, out=np.ones(len(total)), where=total > 0)
    rate = (1.0 / np.maximum(mean, 1e-9))[:, None]
    decay = np.exp(-rate * EDGES[:BINS][None, :])
    live = p * decay
    return np.divide(live * (1.0 - np.exp(-rate * horizon)), 1.0 - p + live,
                     out=np.zeros_like(live), where=(1.0 - p + live) > 0)


class WorkloadAware(HitDensity):
    """Lowest probability of reuse within the horizon first (see the module docstring).

    Args:
        length_edges: request-length class boundaries (tokens) when a request has no ``type``/``turn``.
        max_types: request types given a category of their own; later ones share one.
        refit_every, min_pages, history_size: as :class:`~.reuse.ClassDeadline`.
        class_lanes: as :class:`~.density.HitDensity`.
    """

    name = "wa"
    rerank = False  # without lanes, re-ranked victims cost wa 1.6 / 0.4 points on the Mooncake traces (see .reuse)

    def __init__(self, length_edges: Sequence[int] = (4096, 16384, 65536), max_types: int = 4,
                 refit_every: int = 200, min_pages: int = 200, history_size: Optional[int] = None,
                 class_lanes: bool = True) -> None:
        if max_types.__class__ is not int or max_types < 1:
            raise ArgumentValueError(f"max_types must be an int >= 1, got {max_types!r}")
        self.max_types = max_types
        self._types: Dict[str, int] = {}
        super().__init__(length_edges, (), refit_every, min_pages, history_size, class_lanes)

    def num_categories(self) -> int:
        """Length buckets, or (type, first turn or not) pairs: whichever is more."""
        return max(super().num_categories(), 2 * (self.max_types + 1))

    def category(self, num_pages: int, hints: Optional[RequestHints]) -> int:
        if hints is None or (hints.type is None and hints.turn is None):
            return super().category(num_pages, hints)
        kind = 0 if hints.type is None else self._types.setdefault(hints.type, min(len(self._types), self.max_types - 1) + 1)
        return 2 * kind + (hints.turn is not None and hints.turn > 1)

    def score(self, survival: np.ndarray, events: np.ndarray, horizon: float) -> np.ndarray:
        return exponential_reuse(survival, events, horizon)

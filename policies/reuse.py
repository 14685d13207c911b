"""Per-class reuse statistics and the class-window deadline ranking that ``density`` and ``wa`` share.

**Classes.** Every page gets a class at each use: its uses so far (1..4,
counting uses the ghost remembers), the quarter of the request it sits in
(page depth x 4 // request pages), and a *category* of the request that the
subclass chooses (a request-length bucket, a workload type, ...). The request
is the one :meth:`~.base.EvictionPolicy.on_request` announced at the same
clock; a node cached otherwise (a tier's load-back) counts as a request that
ends at the node.

**Statistics.** A use of a class-``c`` page opens an observation; the page's
next use closes it (an *event*: the gap falls in a half-power-of-two bin of
clock ticks), and the ghost forgetting the page closes it *censored* (at the
age it was forgotten at). Observations still open are counted by the refit
period they opened in, so their ages are known to a period. Every
``refit_every`` ticks the subclass turns the counts into a score per class
and age bin (:meth:`ClassDeadline.score`), highest worth keeping; a class
with fewer than ``min_pages`` observed pages borrows its use level's pooled
counts (and that, the global pool); until the global pool has them the
policy is LRU.

**Ranking.** A page of class ``c`` is worth keeping while its score is at
least the threshold ``theta``; with ``best[c, a]`` the best score at age ``a``
or later, the window ``W_c`` is the first age where ``best`` falls below
``theta``, and a leaf ranks by the deadline ``last use + W_c`` of its tail
page (earliest evicted first). That is "evict the lowest score" made static:
a page's deadline is the time its score drops below the cache's marginal
score, so deadlines come in score order whenever ``theta`` is that margin.
``theta`` is solved for at each refit so that the windows just fill the
room: a class-``c`` use holds its page for the integral of ``S_c`` up to
``W_c`` ticks on average, at the class's observed uses per tick (bisection,
as :func:`~.adaptive.solve_windows` does for its windows); the room is the
capacity, or with ``protect_reused`` (``density``) the room first uses hold
now (their rates times the integral of ``S`` up to the eviction age), and
the pages used again share one window (:data:`PROTECT_QUANTILE` of their
reuse gaps, at least any first use's). The horizon ``H`` of the scores
follows the age of the victims (a moving average, step ``0.02`` per victim
run: the cache's eviction age). Deadlines are computed at a page's hooks
with the tables of that moment (a refit re-ranks nothing, as in ``2q`` and
``adaptive``).

**Re-ranking** (``rerank``, on in ``density``). A deadline computed at the
last use goes stale when a refit changes the windows. When a leaf surfaces
as the victim, :meth:`ClassDeadline.on_victim` recomputes its deadlines
from its last use with the current windows; if its tail's is later, the
leaf is spared at that later rank (one heap push) instead of evicted. Only
raising is possible (the victim queue invalidates lazily), so a deadline a
refit shortened waits for its old rank. Cost: at most one spare per deadline
slot (8 per leaf) per refit, since a spared leaf's deadlines are those of
the current windows; O(log n) amortized over the evictions. Measured on the
Mooncake traces at 3M tokens, block level, whole trace: +0.11 points
(conversation) and +0.30 (synthetic) of hit rate for ``density``; ``wa``
lost 1.6 and 0.4 points with it, so it stays off there.

**Per page.** A leaf's pages differ in segment (the head the ghost
recognized, the fresh tail) and quarter; ``policy_state`` keeps one
deadline per (segment, quarter), the leaf ranks by its tail page's and
``on_victim`` lets only the tail pages of that same class go at that rank,
so each evicted run is of one class (the ghost remembers it with it).

Cost: O(1) per hook (a tuple of 8 deadlines), a walk to the root at
admission and eviction (the ghost's namespace), O(classes x bins) numpy work
per refit. Memory: a 7-tuple per node; the ghost (a
:class:`~.ghost.RunHistory`) at most ``history_factor`` (4) runs per page of
capacity, ~200 bytes a run; the statistics O(classes x (bins + periods)).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from radixkv.errors import ArgumentValueError
from radixkv.tree import Node

from .base import RequestHints, gap_bin
from .ghost import GhostPolicy

BINS = 40
"""Age bins: bin 0 holds gap 0, bin ``j >= 1`` gaps in ``[2^((j-1)/2), 2^(j/2))`` ticks (:func:`~.base.gap_bin`)."""
EDGES = np.array([0.0] + [2.0 ** (j / 2) for j in range(BINS)])
"""``EDGES[j]``: the lower edge of bin ``j`` (``EDGES[BINS]``: past the last)."""
USES = 4
QUARTERS = 4
MAX_PERIODS = 64
"""Periods of open counts kept (:meth:`ReuseStats.prune`): the statistics stay O(classes x (bins + 64))."""
PROTECT_QUANTILE = 0.99
"""With ``protect_reused``: the share of the reuse gaps of pages used twice or more that their window covers."""
_STEP = 0.02  # moving-average step of the horizon, per victim run


def quarter(depth: int, request_pages: int) -> int:
    """Quarter (0..3) of page ``depth`` in a request of ``request_pages`` pages (past its end: 3). O(1)."""
    return min(QUARTERS - 1, QUARTERS * depth // request_pages)


def quarter_start(q: int, request_pages: int) -> int:
    """First depth in quarter ``q`` of a request of ``request_pages`` pages. O(1)."""
    return -(-q * request_pages // QUARTERS)


def bucket(value: int, edges: Tuple[int, ...]) -> int:
    """Index of the first edge above ``value`` (``len(edges)`` when none). O(edges)."""
    for i, edge in enumerate(edges):
        if value < edge:
            return i
    return len(edges)


def kaplan_meier(events: np.ndarray, at_risk: np.ndarray) -> np.ndarray:
    """Survival at :data:`EDGES` (shape ``(classes, BINS + 1)``) from events and at-risk counts per bin. O(size)."""
    hazard = np.divide(events, at_risk, out=np.zeros_like(events), where=at_risk > 0)
    survival = np.cumprod(1.0 - np.clip(hazard, 0.0, 1.0), axis=1)
    return np.concatenate([np.ones((len(events), 1)), survival], axis=1)


class ReuseStats:
    """Page-weighted reuse observations per class: events and censorings per age bin, open ones per period.

    Args:
        classes: number of classes.
        period: ticks per period of the open counts (the policy's refit interval).
    """

    def __init__(self, classes: int, period: int) -> None:
        self.classes = classes
        self.period = period
        self.events = np.zeros((classes, BINS))
        self.censored = np.zeros((classes, BINS))
        self._opened: Dict[int, np.ndarray] = {}
        self._closed: Dict[int, np.ndarray] = {}

    def open(self, cls: int, pages: int, now: int) -> None:
        """``pages`` pages of class ``cls`` were used at ``now``. O(1)."""
        k = now // self.period
        row = self._opened.get(k)
        if row is None:
            row = self._opened[k] = np.zeros(self.classes)
            self._closed[k] = np.zeros(self.classes)
        row[cls] += pages

    def close(self, cls: int, pages: int, last: int, now: int, reused: bool) -> None:
        """The observation opened at ``last`` ends at ``now``: reused, or censored (forgotten). O(1)."""
        closed = self._closed.get(last // self.period)
        if closed is not None:
            closed[cls] += pages
        (self.events if reused else self.censored)[cls, gap_bin(now - last, BINS)] += pages

    def prune(self, now: int) -> None:
        """Keep at most :data:`MAX_PERIODS` periods of open counts: the oldest one's open observations
        are counted censored at their age. O(classes) per period dropped."""
        while len(self._opened) > MAX_PERIODS:
            k = min(self._opened)
            still = np.maximum(self._opened.pop(k) - self._closed.pop(k), 0.0)
            self.censored[:, gap_bin(now - k * self.period, BINS)] += still

    def rates(self, now: int) -> np.ndarray:
        """Uses per tick of each class, over the periods still counted. O(classes x periods)."""
        if not self._opened:
            return np.zeros(self.classes)
        first = min(self._opened) * self.period
        return sum(self._opened.values()) / max(1, now - first)

    def at_risk(self, now: int) -> np.ndarray:
        """Observations per class that lasted into each bin (closed ones by their bin, open ones by their age). O(classes x (bins + periods))."""
        ended = self.events + self.censored
        risk = np.cumsum(ended[:, ::-1], axis=1)[:, ::-1].copy()
        for k, opened in self._opened.items():
            still = opened - self._closed[k]
            age = max(0, now - (k * self.period + self.period // 2))
            risk[:, : gap_bin(age, BINS) + 1] += np.maximum(still, 0.0)[:, None]
        return risk


class ClassDeadline(GhostPolicy):
    """Deadline ranking by per-class windows from a score table (see the module docstring).

    Subclasses implement :meth:`num_categories`, :meth:`category` and :meth:`score`.
    ``policy_state`` is ``(last use, boundary, head uses, tail uses,
    request pages, category, deadlines)``, ``deadlines[segment * 4 + quarter]``.

    Args:
        refit_every: ticks between two refits of the score tables (``>= 1``).
        min_pages: observed pages a class needs before its own counts are used (``>= 1``).
        history_size: pages of evicted runs the ghost remembers; default 4x the capacity.
    """

    #: Pages used twice or more share one window (:data:`PROTECT_QUANTILE` of their reuse gaps, at
    #: least any first use's: LRU among them); only first uses are ranked by their scores.
    #: ``False``: every class by its score.
    protect_reused = False

    #: When a leaf surfaces as the victim, re-rank it by its deadline under the current windows if that
    #: is later (see *Re-ranking* in the module docstring). ``False``: deadlines stay as computed at the
    #: page's last hook.
    rerank = False

    def __init__(self, refit_every: int = 200, min_pages: int = 200, history_size: Optional[int] = None) -> None:
        for arg, value in (("refit_every", refit_every), ("min_pages", min_pages)):
            if value.__class__ is not int or value < 1:
                raise ArgumentValueError(f"{arg} must be an int >= 1, got {value!r}")
        self.refit_every = refit_every
        self.min_pages = min_pages
        self.categories = self.num_categories()
        self.num_classes = USES * QUARTERS * self.categories
        self.stats = ReuseStats(self.num_classes, refit_every)
        self._window_list: List[float] = [0.0] * self.num_classes
        self.theta: Optional[float] = None
        """The score below which a page is not worth keeping (``None`` until the first fit)."""
        self.horizon = float(refit_every)
        """``H``: the horizon of the scores, in ticks (follows the victims' age)."""
        self._best: Optional[np.ndarray] = None  # (classes, BINS): best score at each age or later
        self._fitted_at = 0
        self._request: Tuple[int, int, int] = (-1, 1, 0)  # (clock, pages, category) of the last request
        super().__init__(history_size)

    @property
    def windows(self) -> np.ndarray:
        """Current window per class, in ticks (all 0, LRU, until enough history); settable (a copy is kept)."""
        return np.array(self._window_list)

    @windows.setter
    def windows(self, value: Any) -> None:
        values = [float(v) for v in np.asarray(value, dtype=float).ravel()]
        if len(values) != self.num_classes or not all(v >= 0 for v in values):
            raise ArgumentValueError(f"windows must be {self.num_classes} values >= 0, got {value!r}")
        self._window_list = values

    # ------------------------------------------------------------ subclass points
    def num_categories(self) -> int:
        """How many request categories :meth:`category` returns (called once, at construction)."""
        return 1

    def category(self, num_pages: int, hints: Optional[RequestHints]) -> int:
        """The request's category, ``0 <= c < categories``."""
        return 0

    def score(self, survival: np.ndarray, events: np.ndarray, horizon: float) -> np.ndarray:
        """Scores ``(classes, BINS)`` at each bin's lower edge, higher worth keeping, from the
        Kaplan-Meier ``survival`` at :data:`EDGES` and the ``events`` per bin."""
        raise NotImplementedError

    # ------------------------------------------------------------ classes
    def class_of(self, uses: int, q: int, cat: int) -> int:
        """Class id of a page with ``uses`` uses (1..), in quarter ``q``, of category ``cat``. O(1)."""
        return ((min(uses, USES) - 1) * QUARTERS + q) * self.categories + cat

    def _deadlines(self, now: int, head_uses: int, tail_uses: int, cat: int) -> tuple:
        w = self._window_list
        return tuple(now + w[self.class_of(u, q, cat)] for u in (head_uses, tail_uses) for q in range(QUARTERS))

    def _portions(self, node: Node, state: tuple) -> List[Tuple[int, int]]:
        """``(class, pages)`` of ``node``'s pages under ``state``, one per (segment, quarter) present."""
        _, boundary, head_uses, tail_uses, pages, cat, _ = state
        out = []
        lo = node.start
        while lo < node.end:
            seg_end = boundary if lo < boundary else node.end
            q = quarter(lo, pages)
            hi = min(seg_end, node.end, quarter_start(q + 1, pages) if q < QUARTERS - 1 else node.end)
            out.append((self.class_of(head_uses if lo < boundary else tail_uses, q, cat), hi - lo))
            lo = hi
        return out

    # ------------------------------------------------------------ fitting
    def _fit(self, now: int) -> None:
        stats = self.stats
        stats.prune(now)
        risk = stats.at_risk(now)
        events = stats.events
        per_level = QUARTERS * self.categories
        level_risk = risk.reshape(USES, per_level, BINS).sum(axis=1)
        level_events = events.reshape(USES, per_level, BINS).sum(axis=1)
        if risk[:, 0].sum() < self.min_pages or events.sum() <= 0:
            return  # LRU until there is history
        levels = np.repeat(np.arange(USES), per_level)
        own = risk[:, 0] >= self.min_pages
        pooled = level_risk[levels, 0] >= self.min_pages
        use_risk = np.where(own[:, None], risk, np.where(pooled[:, None], level_risk[levels], risk.sum(0)))
        use_events = np.where(own[:, None], events, np.where(pooled[:, None], level_events[levels], events.sum(0)))
        survival = kaplan_meier(use_events, use_risk)
        table = self.score(survival, use_events, max(1.0, self.horizon))
        self._best = np.maximum.accumulate(table[:, ::-1], axis=1)[:, ::-1]
        area = np.concatenate([np.zeros((len(survival), 1)),
                               np.cumsum((survival[:, 1:] + survival[:, :-1]) / 2 * np.diff(EDGES), axis=1)], axis=1)
        rates = stats.rates(now)
        if not self.protect_reused:
            self.theta = self._solve(area, rates, float(self._capacity))
            return
        # first uses share the room they hold now (their rate times the integral of S up to the
        # eviction age H) by their scores
        first = per_level  # classes from here on have two uses or more
        room = float((rates[:first] * area[:first, gap_bin(int(self.horizon), BINS)]).sum())
        self.theta = self._solve(area[:first], rates[:first], room, self._best[:first])
        # pages used again: one window, PROTECT_QUANTILE of their observed reuse gaps and at least
        # the longest first use's, so they are LRU among themselves and outrank first uses
        gaps = events[first:].sum(axis=0)
        j = int(np.searchsorted(np.cumsum(gaps), PROTECT_QUANTILE * gaps.sum()))
        protect = max(float(EDGES[min(j + 1, BINS)]), max(self._window_list[:first]))
        self._window_list[first:] = [protect] * (self.num_classes - first)

    @staticmethod
    def _first_below(best: np.ndarray, theta: float) -> np.ndarray:
        below = best < theta
        return np.where(below.any(axis=1), below.argmax(axis=1), BINS)

    def _solve(self, area: np.ndarray, rates: np.ndarray, capacity: float, best: Optional[np.ndarray] = None) -> float:
        """The threshold whose windows just fill ``capacity`` pages: a class-``c`` use holds its page
        ``area[c, W_c]`` ticks on average (the integral of ``S`` up to the window), at ``rates[c]``
        uses per tick. Bisection in log space over the scores; sets :attr:`windows`. O(classes x bins x 60)."""
        best = self._best if best is None else best
        rows = np.arange(len(rates))
        positive = best[best > 0]
        lo, hi = (float(positive.min()) / 2, float(positive.max()) * 2) if len(positive) else (1.0, 2.0)
        for _ in range(60):  # lo: windows too long for the capacity; hi: they fit
            mid = math.sqrt(lo * hi)
            if float((rates * area[rows, self._first_below(best, mid)]).sum()) > capacity:
                lo = mid
            else:
                hi = mid
        self._window_list = EDGES[self._first_below(best, hi)].tolist()
        return hi

    def _tick(self, now: int) -> None:
        if now - self._fitted_at >= self.refit_every:
            self._fitted_at = now
            self._fit(now)

    # ------------------------------------------------------------ hooks
    def on_request(self, num_pages: int, hints: Optional[RequestHints], now: int) -> None:
        self._tick(now)
        self._request = (now, max(1, num_pages), self.category(num_pages, hints))

    def _request_at(self, node: Node, now: int) -> Tuple[int, int]:
        when, pages, cat = self._request
        return (pages, cat) if when == now and pages >= node.end else (node.end, 0)

    def recalled(self, runs: List[Tuple[Any, int, int]], now: int) -> None:
        for (last, _, cls), covered, remembered in runs:
            self.stats.close(cls, covered, last, now, True)
            if remembered > covered:
                self.stats.close(cls, remembered - covered, last, now, False)

    def forget_run(self, record: Any, pages: int) -> None:
        last, _, cls = record
        self.stats.close(cls, pages, last, self.now(), False)

    def _enter(self, node: Node, now: int, boundary: int, head_uses: int, tail_uses: int) -> None:
        pages, cat = self._request_at(node, now)
        state = (now, boundary, head_uses, tail_uses, pages, cat, self._deadlines(now, head_uses, tail_uses, cat))
        node.policy_state = state
        for cls, n in self._portions(node, state):
            self.stats.open(cls, n, now)

    def on_insert(self, node: Node, now: int) -> None:
        self._now = now
        self._tick(now)  # (after admit's on_request at the same tick: a no-op; match/insert and tiers have none)
        boundary, runs = self.take_pending(node, now) or (node.start, [])
        head_uses = runs[0][0][1] + 1 if runs else 1
        self._enter(node, now, boundary, head_uses, 1)

    def on_access(self, node: Node, now: int) -> None:
        self._now = now
        self._tick(now)
        state = node.policy_state
        last = state[0]
        for cls, n in self._portions(node, state):
            self.stats.close(cls, n, last, now, True)
        _, boundary, head_uses, tail_uses, _, _, _ = state
        self._enter(node, now, boundary, head_uses + 1, tail_uses + 1)

    def _tail(self, node: Node) -> Tuple[int, int]:
        """(segment, quarter) of ``node``'s tail page."""
        state = node.policy_state
        return (0 if node.end <= state[1] else 1), quarter(node.end - 1, state[4])

    def _tail_class(self, node: Node) -> int:
        """Class of ``node``'s tail page (the pages :meth:`on_victim` lets go first). O(1)."""
        seg, q = self._tail(node)
        state = node.policy_state
        return self.class_of(state[3] if seg else state[2], q, state[5])

    def priority(self, node: Node) -> float:
        seg, q = self._tail(node)
        return node.policy_state[6][seg * QUARTERS + q]

    def on_victim(self, node: Node) -> int:
        seg, q = self._tail(node)
        state = node.policy_state
        if self.rerank:
            # the deadline under the current windows, if a refit lengthened it since the last use:
            # spare the leaf at that later rank (ranks may only rise; at most one spare per
            # deadline and refit, since the next surfacing finds the deadline current)
            i = seg * QUARTERS + q
            fresh = self._deadlines(state[0], state[2], state[3], state[5])
            if fresh[i] > state[6][i]:
                node.policy_state = state[:6] + (tuple(max(a, b) for a, b in zip(state[6], fresh)),)
                return 0
        lo = max(node.start, quarter_start(q, state[4]), state[1] if seg else node.start)
        return node.end - lo

    def on_evict(self, node: Node, pages: int, rank: Any) -> None:
        last, boundary, head_uses, tail_uses, request_pages, cat, _ = node.policy_state
        depth = node.end - pages
        seg, _ = self._tail(node)
        cls = self._tail_class(node)
        self.history.remember(node, depth, node.end, (last, tail_uses if seg else head_uses, cls))
        if rank is not None and self._best is not None:
            now = self.now()
            age = now - last
            self.horizon += _STEP * (max(1, age) - self.horizon)

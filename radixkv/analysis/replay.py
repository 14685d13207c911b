"""Trace replay: run requests through a :class:`PrefixCache` and count what it saved.

Each request is admitted (match, protect, allocate, insert) and released at
once, with the engine's logical clock ticking once per request. The exact
rule set is in the README ("Replay semantics"). The counters, the miss
reasons and the per-request records are those of :mod:`radixkv.analysis.stats`.
"""

from __future__ import annotations

import math
import time
from itertools import repeat
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from ..cache import PrefixCache
from ..costs import DEFAULT_HARDWARE, DEFAULT_MODEL, HardwareSpec, ModelSpec
from ..errors import ArgumentValueError
from ..keys import check_int
from .stats import ReplayStats, RequestRecord
from ..workload.traces import Request


READ_AHEAD = 256
"""Requests replay reads ahead with miss reasons on, to key their pages in one batch
(:meth:`radixkv.analysis.stats.ReplayStats.prepare`)."""

READ_AHEAD_TOKENS = 1 << 18
"""...and at most this many prompt tokens (a batch ends with the request that reaches it): long
prompts are keyed in smaller batches, so reading ahead holds a few MB, not hundreds of prompts."""


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Totals of one replay.

    Attributes:
        policy: eviction policy name.
        page_size: tokens per page.
        num_blocks: cache capacity in blocks.
        requests: requests replayed.
        prompt_tokens: all prompt tokens, partial last pages included.
        hit_tokens: prompt tokens served from the cache.
        token_hit_rate: ``hit_tokens / prompt_tokens``.
        request_hit_rate: share of requests with at least one page hit.
        evicted_blocks: blocks evicted during the replay.
        declined_blocks: new pages the policy declined to cache.
        wall_seconds: replay time, trace reading included.
        admitted_blocks: new pages cached by the requests.
        miss_tokens_by_reason: missed prompt tokens per reason of
            :data:`radixkv.analysis.stats.MISS_REASONS`; with the hits they add up to
            ``prompt_tokens``. Empty when replayed with ``miss_reasons=False``.
        model, hardware: names of the specs behind the two estimates below.
        prefill_flops_saved: sum over requests of ``prefill_flops(model, 0, hit_tokens)``.
        ttft_saving_seconds: prefill seconds those hits saved, summed over requests: the hit
            prefix's recompute time less the load time of the pages a tiered cache loaded from
            its lower tiers (no overlap of load and compute assumed), at least 0 per request
            (:meth:`radixkv.costs.CostModel.ttft_saving_seconds`).
        first_timestamp, last_timestamp: arrival times of the first and last
            requests with one (``None`` when the trace has none).
        warmup_requests: requests replayed before counting began (``replay(warmup=...)``);
            none of the figures above include them.
        intervals: the hit rate over time (``replay(interval=...)``): one :class:`Windows`
            entry per window of counted requests, in order; empty without an interval.
    """

    policy: str
    page_size: int
    num_blocks: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    token_hit_rate: float
    request_hit_rate: float
    evicted_blocks: int
    declined_blocks: int
    wall_seconds: float
    admitted_blocks: int = 0
    miss_tokens_by_reason: Dict[str, int] = field(default_factory=dict)
    model: str = DEFAULT_MODEL
    hardware: str = DEFAULT_HARDWARE
    prefill_flops_saved: int = 0
    ttft_saving_seconds: float = 0.0
    first_timestamp: Optional[float] = None
    last_timestamp: Optional[float] = None
    warmup_requests: int = 0
    intervals: List[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def replay(
    requests: Iterable[Request],
    cache: PrefixCache,
    *,
    on_request: Optional[Callable[[Request, int], None]] = None,
    on_record: Optional[Callable[[RequestRecord], None]] = None,
    miss_reasons: bool = True,
    model: Union[str, ModelSpec] = DEFAULT_MODEL,
    hardware: Union[str, HardwareSpec] = DEFAULT_HARDWARE,
    warmup: int = 0,
    interval: int = 0,
) -> ReplayResult:
    """Replay ``requests`` in order through ``cache``; return the totals.

    ``on_request(request, hit_tokens)`` is called after each request (progress
    bars, invariant checks in tests); ``on_record(record)`` gets each
    request's :class:`~radixkv.analysis.stats.RequestRecord` (``radixkv replay
    --records``). ``miss_reasons`` classifies every missed token (see
    :mod:`radixkv.analysis.stats`; memory grows with the distinct pages ever cached).
    ``model`` / ``hardware`` (specs or preset names of :mod:`radixkv.costs`)
    price the hits in prefill FLOPs and seconds; a tiered cache's hits loaded
    from a lower tier are priced with the transfer time over that tier's path
    in its ``cost_model`` (for ``model`` on ``hardware``).

    ``warmup``: the first ``warmup`` requests fill the cache (and the miss-reason
    history) but are not counted: no total, record or timestamp includes them, so the
    result describes a warm cache (``ReplayResult.warmup_requests`` says how many).
    ``on_request`` is still called for them. ``interval``: the hit rate over time, one
    :class:`Windows` entry per ``interval`` counted requests (``ReplayResult.intervals``).

    Requests must come in arrival order: a timestamp before the previous one
    raises ValueError naming the request, before that request is admitted, and
    so does a NaN or infinite one (requests without a timestamp are not checked).

    Cost: the cache's ``admit`` per request, plus for the miss reasons a small
    constant and O(pages) per request: the pages are keyed in batches of
    :data:`READ_AHEAD` requests (read that far ahead; an error from reading
    ``requests`` still surfaces after the requests before it are replayed).

    An offline policy (``cache.policy.offline``, e.g. Belady) first gets the
    whole sequence through ``policy.prepare(requests, page_size, first_clock)``;
    a one-shot iterator is materialized for it, a re-iterable (a list, a
    :class:`~radixkv.workload.traces.TraceReader`) is read twice.
    """
    start = time.perf_counter()
    if cache.policy.offline:
        if iter(requests) is requests:
            requests = list(requests)
        cache.policy.prepare(requests, cache.page_size, cache.clock + 1)
    # A tiered cache's cost model: its lower-tier hits cost a load.
    tier_costs = getattr(cache, "cost_model", None) if hasattr(cache, "hit_tokens_by_tier") else None
    stats = ReplayStats(cache.page_size, model=model, hardware=hardware, miss_reasons=miss_reasons,
                        tier_costs=tier_costs, by_tenant=cache.sharing.name != "shared")
    try:
        return _replay(requests, cache, stats, on_request, on_record, miss_reasons, start, tier_costs,
                       check_int(warmup, "warmup", minimum=0), check_int(interval, "interval", minimum=0))
    finally:
        stats.detach(cache)


def _replay(requests, cache: PrefixCache, stats: ReplayStats, on_request, on_record, miss_reasons: bool,
            start: float, tier_costs, warmup: int, interval: int) -> ReplayResult:
    lower_tiers = tuple(tier_costs.tier_paths) if tier_costs is not None else ()
    admit, add, want_record = cache.admit, stats.add, on_record is not None
    want_hints = cache.policy.on_request is not None  # building them costs an object per request
    other_pages = stats.other_pages
    loaded = None
    first_ts = last_ts = None
    keyed = _prepared(requests, stats) if miss_reasons else zip(requests, repeat(None))
    windows = Windows(interval) if interval else None
    index = -1
    for index, (request, keys) in enumerate(keyed):
        if index == warmup and warmup:  # the cache is warm: count from here
            stats.reset_counts()
            first_ts = None
        if request.timestamp is not None:
            first_ts, last_ts = arrival(request.timestamp, index, first_ts, last_ts)
        other = other_pages(cache, request, keys) if miss_reasons else 0
        evicted0, declined0 = cache.evicted_blocks, cache.declined_blocks
        before = cache.hit_tokens_by_tier if lower_tiers else None
        admission = admit(request.tokens, namespace=request.namespace, tenant=request.tenant,
                          hints=request.hints() if want_hints else None)
        admission.release()
        hit = admission.hit_tokens
        if before is not None:
            loaded = pages_loaded(before, cache.hit_tokens_by_tier, lower_tiers, cache.page_size)
        admitted = admission.num_new_pages
        record = add(request, hit, admitted, cache.declined_blocks - declined0,
                     cache.evicted_blocks - evicted0, other, loaded_pages=loaded, want_record=want_record, keys=keys)
        if on_request is not None:
            on_request(request, hit)
        if record is not None and index >= warmup:
            on_record(record)
        if windows is not None and index >= warmup:
            windows.add(hit, len(request.tokens), request.timestamp)
    if index < warmup:  # the trace ended within the warm-up: nothing is counted
        stats.reset_counts()
        first_ts = None
    return ReplayResult(
        policy=cache.policy.name,
        page_size=cache.page_size,
        num_blocks=cache.num_blocks,
        requests=stats.requests,
        prompt_tokens=stats.prompt_tokens,
        hit_tokens=stats.hit_tokens,
        token_hit_rate=stats.hit_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0,
        request_hit_rate=stats.hit_requests / stats.requests if stats.requests else 0.0,
        evicted_blocks=stats.evicted_blocks,
        declined_blocks=stats.declined_blocks,
        wall_seconds=time.perf_counter() - start,
        admitted_blocks=stats.admitted_blocks,
        miss_tokens_by_reason=dict(stats.miss_tokens_by_reason),
        model=stats.model.name,
        hardware=stats.hardware.name,
        prefill_flops_saved=stats.prefill_flops_saved,
        ttft_saving_seconds=stats.ttft_saving_seconds,
        first_timestamp=first_ts,
        last_timestamp=last_ts if first_ts is not None else None,
        warmup_requests=min(warmup, index + 1),
        intervals=windows.close() if windows is not None else [],
    )


class Windows:
    """Hit rate over time: the counted requests cut into windows of ``interval``, each a dict
    ``{"end_request", "requests", "prompt_tokens", "hit_tokens", "token_hit_rate", "last_timestamp"}``
    (``end_request``: counted requests up to the window's end; the last window may be short).
    O(1) a request, one small dict a window."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.rows: List[dict] = []
        self._requests = self._prompt = self._hits = self._end = 0
        self._ts: Optional[float] = None

    def add(self, hit_tokens: int, prompt_tokens: int, timestamp: Optional[float]) -> None:
        """Count one request; close the window at ``interval`` requests."""
        self._requests += 1
        self._end += 1
        self._prompt += prompt_tokens
        self._hits += hit_tokens
        if timestamp is not None:
            self._ts = timestamp
        if self._requests == self.interval:
            self.close()

    def close(self) -> List[dict]:
        """Close the open window if it holds a request; return every window. O(1)."""
        if self._requests:
            self.rows.append({"end_request": self._end, "requests": self._requests, "prompt_tokens": self._prompt,
                              "hit_tokens": self._hits, "token_hit_rate": self._hits / self._prompt if self._prompt
                              else 0.0, "last_timestamp": self._ts})
            self._requests = self._prompt = self._hits = 0
        return self.rows


def arrival(ts: float, index: int, first: Optional[float], last: Optional[float]) -> Tuple[float, float]:
    """``(first, last)`` timestamps once request ``index`` arrived at ``ts``; an ArgumentValueError
    naming it when ``ts`` is NaN or infinite, or before ``last`` (replay needs arrival order). O(1)."""
    if not math.isfinite(ts):  # NaN compares false both ways: it would switch the order check off
        raise ArgumentValueError(f"requests[{index}].timestamp must be finite, got {ts!r}")
    if last is not None and ts < last:
        raise ArgumentValueError(f"requests[{index}].timestamp {ts!r} is before the previous {last!r}: replay "
                                 "needs requests in arrival order")
    return (ts if first is None else first), ts


def _prepared(requests: Iterable, stats: ReplayStats) -> Iterator[Tuple[Request, Optional[List[int]]]]:
    """``requests`` in order, each with its page keys: a batch of :data:`READ_AHEAD` keyed at a time
    by ``stats.prepare``."""
    for batch in _batches(requests, READ_AHEAD, READ_AHEAD_TOKENS):
        yield from zip(batch, stats.prepare(batch))


def _batches(requests: Iterable, size: int, max_tokens: int) -> Iterator[List]:
    """Lists of up to ``size`` consecutive items of ``requests``, ending early at the item that
    brings its prompt tokens to ``max_tokens``. An exception from reading (a bad trace line) is
    raised after the items read before it are yielded, where reading one at a time would raise it."""
    it = iter(requests)
    while True:
        batch: List = []
        tokens = 0
        try:
            while len(batch) < size and tokens < max_tokens:
                request = next(it)
                batch.append(request)
                tokens += len(request.tokens)
        except StopIteration:
            if batch:
                yield batch
            return
        except Exception:
            if batch:
                yield batch
            raise
        yield batch


def pages_loaded(before: Dict[str, int], after: Dict[str, int], tiers: tuple, page_size: int) -> Dict[str, int]:
    """Pages each of ``tiers`` served between two readings of a tiered cache's ``hit_tokens_by_tier``."""
    deltas = {t: after.get(t, 0) - before.get(t, 0) for t in tiers}
    return {t: d // page_size for t, d in deltas.items() if d}

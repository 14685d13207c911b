"""Capacity planning: replay a trace at many (policy, capacity) pairs, or get LRU's whole curve in one pass.

:func:`run_sweep` replays one trace once per :class:`SweepJob`, in parallel
processes when asked; each job streams the trace itself, so memory per
process is one cache plus one request. :func:`trace_curve` gives LRU's hit
tokens at every capacity from a single pass (:mod:`radixkv.analysis.curve`), equal to
per-capacity LRU replays.
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .. import policies
from ..cache import PrefixCache
from ..capacity import parse_capacities, parse_capacity  # noqa: F401  (re-exported: sweep's capacities)
from ..costs import DEFAULT_HARDWARE, DEFAULT_MODEL, CostModel, get_hardware, get_model, prefill_flops
from .curve import CurveResult, LruStackDistances, PageInterner, log_grid, mooncake_page_ids
from ..errors import ArgumentValueError, RadixKVError
from .replay import ReplayResult, Windows, arrival, replay
from ..workload.sources import open_trace
from ..workload.traces import MOONCAKE_BLOCK_TOKENS, MooncakeBlocks, Request


def parse_policies(text: str) -> List[str]:
    """Comma-separated policy names, each checked against the registry (ValueError listing them), or a
    user's class as ``module:Class`` (imported to check it, :func:`radixkv.policies.load`)."""
    names = [item.strip() for item in str(text).split(",") if item.strip()]
    known = policies.available(include_aliases=True)
    if not names:
        raise ArgumentValueError(f"policies must list at least one policy, got {text!r}")
    for name in names:
        if ":" in name:
            policies.load(name)
        elif name not in known:
            raise ArgumentValueError(f"unknown policy {name!r}; available: {', '.join(known)}")
    return names


@dataclass(frozen=True)
class SweepJob:
    """One replay of a sweep: ``trace`` through a ``policy`` cache of ``num_blocks`` blocks."""

    trace: str
    policy: str
    num_blocks: int
    page_size: int = 16
    format: Optional[str] = None
    limit: Optional[int] = None
    skip_bad: bool = False
    model: str = DEFAULT_MODEL
    hardware: str = DEFAULT_HARDWARE
    miss_reasons: bool = True
    tokenizer: Optional[str] = None
    """Path of a ``tokenizer.json`` for a ShareGPT trace (default: the built-in tokenizer)."""
    warmup: int = 0
    """Requests replayed before counting begins (:func:`radixkv.analysis.replay.replay`)."""
    policy_params: Tuple[Tuple[str, object], ...] = ()
    """Constructor arguments of the policy (:class:`radixkv.policies.PolicySpec`)."""
    num_sessions: int = 16
    request_rate: float = 1.0
    """How a ShareGPT trace's conversations interleave (:func:`radixkv.workload.sharegpt.load_sharegpt`)."""
    interval: int = 0
    """Requests per window of the hit rate over time (:class:`radixkv.analysis.replay.Windows`); 0: none."""


def job_trace(job: SweepJob):
    """The trace a job reads, opened as the command opened it. O(1) until iterated."""
    return open_trace(job.trace, job.format, limit=job.limit, skip_bad=job.skip_bad, tokenizer=job.tokenizer,
                      num_sessions=job.num_sessions, request_rate=job.request_rate)


def run_job(job: SweepJob) -> dict:
    """Replay one job; the :class:`~radixkv.analysis.replay.ReplayResult` as a dict plus ``trace`` and ``skipped_lines``."""
    trace = job_trace(job)
    policy = policies.PolicySpec(job.policy, job.policy_params) if job.policy_params else job.policy
    cache = PrefixCache(num_blocks=job.num_blocks, page_size=job.page_size, policy=policy)
    result = replay(trace, cache, miss_reasons=job.miss_reasons, model=job.model, hardware=job.hardware,
                    warmup=job.warmup, interval=job.interval)
    params = {"policy_params": dict(job.policy_params)} if job.policy_params else {}
    return {"trace": job.trace, **result.as_dict(), "skipped_lines": trace.skipped, **params}


AUTO_CAPACITIES = "1%,2%,5%,10%,25%,50%,100%"
"""``sweep --capacities auto``: shares of the trace's distinct pages (its working set, the capacity at
which nothing is evicted, where ``curve``'s automatic grid ends), log-spaced like that grid but few,
since each costs a replay per policy."""

RELATIVE_COST = {"belady": 4.5, "arc": 2.0}
"""Expected replay time of a policy relative to an LRU replay (others: 1), measured on the first 2,000
conversation requests at page 16 (Belady 2.3-3.4 s against LRU's 0.3-0.5 s; ARC grows with capacity):
the sweep's progress bar and its scheduling (longest first) weigh runs by it."""

CURVE_COST = 2.2
"""The one-pass LRU curve's time relative to one LRU replay (1.07 s against 0.50 s, best of 3, same
trace): LRU rows come from the curve when a sweep has more LRU capacities than this."""


class NamespacedTraceError(ArgumentValueError):
    """A trace with namespaces where the one-pass curve (which has none) was asked for."""


def lru_from_curve(jobs: Sequence[SweepJob]) -> bool:
    """Whether the LRU jobs of a sweep (one trace's) are cheaper as one curve pass than as replays:
    more of them than :data:`CURVE_COST`. O(1)."""
    return len(jobs) > CURVE_COST


def expected_cost(job: SweepJob) -> float:
    """A job's expected replay time in LRU replays (:data:`RELATIVE_COST`). O(1)."""
    return RELATIVE_COST.get(job.policy, 1.0)


def lru_rows(jobs: Sequence[SweepJob]) -> List[dict]:
    """The rows :func:`run_job` gives for LRU ``jobs`` of one trace (equal but for ``wall_seconds``,
    the one pass's), from one pass over it (:class:`~radixkv.analysis.curve.LruStackDistances`).

    Each request's hits at capacity ``C`` are its leading pages of stack rank below ``C``; it caches
    ``min(pages, C)`` of its pages (a request longer than the cache keeps its first ``C``), so a page
    was ever cached at ``C`` when it was referenced before at a depth below ``C``, which gives the
    miss reasons; the evictions are the pages admitted less those cached at the end. A row says
    ``"source": "curve"``. Cost: the curve's pass plus O(log pages) numpy and one
    ``prefill_flops`` per request and capacity.

    Raises:
        NamespacedTraceError: a request has a namespace (the curve has none; :func:`run_sweep`
            replays such a trace instead).
        ArgumentValueError: the jobs differ in anything but ``num_blocks``; a timestamp out of order.
    """
    job = jobs[0]
    if any(replace(j, num_blocks=job.num_blocks) != job or j.policy != "lru" for j in jobs):
        raise ArgumentValueError("lru_rows takes LRU jobs of one trace that differ only in num_blocks")
    start = time.perf_counter()
    ps = job.page_size
    caps = np.array([j.num_blocks for j in jobs], dtype=np.int64)
    k = len(caps)
    costs = CostModel(get_model(job.model), get_hardware(job.hardware), ps)
    model = costs.model
    trace = job_trace(job)
    stack = LruStackDistances(ps)
    hit_pages, hit_requests, admitted, first_sight, evicted_miss = (np.zeros(k, dtype=np.int64) for _ in range(5))
    flops, ttft = [0] * k, [0.0] * k
    partial = 0
    first_ts = last_ts = None
    live_at_warmup = 0
    windows = [Windows(job.interval) for _ in range(k)] if job.interval else None
    i = -1
    for i, (request, ids) in enumerate(_page_ids(trace, ps, trace.format == "mooncake")):
        if i == job.warmup and i:  # count from here; the stack keeps what the warm-up cached
            stack.reset_counts()
            first_ts, live_at_warmup = None, stack.num_live
        if request.namespace is not None:
            raise NamespacedTraceError(f"requests[{i}] has namespace {request.namespace!r}; the one-pass curve "
                                       "does not model namespaces")
        if request.timestamp is not None:
            first_ts, last_ts = arrival(request.timestamp, i, first_ts, last_ts)
        num_tokens, n = len(request.tokens), len(ids)
        ranks = stack.add(ids, num_tokens)
        if i < job.warmup:
            continue
        hits = np.searchsorted(ranks, caps)
        cached = np.minimum(n, caps)
        covered = np.minimum(len(ranks), caps)  # leading pages ever cached: referenced before, shallower than C
        hit_pages += hits
        hit_requests += hits > 0
        admitted += cached - hits
        first_sight += n - covered
        evicted_miss += covered - hits
        partial += num_tokens - n * ps
        saved: dict = {}
        if windows is not None:
            for window, h in zip(windows, hits.tolist()):
                window.add(h * ps, num_tokens, request.timestamp)
        for j, h in enumerate(hits.tolist()):
            if h:
                if h not in saved:
                    saved[h] = (prefill_flops(model, 0, h * ps), costs.ttft_saving_seconds(h * ps, num_tokens))
                flops[j] += saved[h][0]
                ttft[j] += saved[h][1]
    if i < job.warmup:  # the trace ended within the warm-up
        stack.reset_counts()
        first_ts = None
        live_at_warmup = stack.num_live
    live = stack.num_live
    warm = min(job.warmup, i + 1) if job.warmup else 0
    rows = []
    for j, cap in enumerate(caps.tolist()):
        hit = int(hit_pages[j]) * ps
        prompt = stack.prompt_tokens
        misses = {"first_sight": int(first_sight[j]) * ps, "evicted": int(evicted_miss[j]) * ps,
                  "partial_page": partial, "declined": 0, "other_namespace": 0} if job.miss_reasons else {}
        result = ReplayResult(
            policy="lru", page_size=ps, num_blocks=cap, requests=stack.requests, prompt_tokens=prompt,
            hit_tokens=hit, token_hit_rate=hit / prompt if prompt else 0.0,
            request_hit_rate=int(hit_requests[j]) / stack.requests if stack.requests else 0.0,
            evicted_blocks=int(admitted[j]) - (min(cap, live) - min(cap, live_at_warmup)), declined_blocks=0,
            wall_seconds=time.perf_counter() - start, admitted_blocks=int(admitted[j]),
            miss_tokens_by_reason=misses, model=model.name, hardware=costs.hardware.name,
            prefill_flops_saved=flops[j], ttft_saving_seconds=ttft[j], first_timestamp=first_ts,
            last_timestamp=last_ts if first_ts is not None else None, warmup_requests=warm,
            intervals=windows[j].close() if windows is not None else [])
        rows.append({"trace": job.trace, **result.as_dict(), "skipped_lines": trace.skipped, "source": "curve"})
    return rows


def _run_task_safely(task: Tuple[SweepJob, ...]) -> Tuple[Optional[List[dict]], Optional[str]]:
    """A task in a worker: one replay, or the LRU jobs of one trace from its curve (several jobs); user
    errors come back as text (radixkv's errors do not all pickle)."""
    try:
        if len(task) == 1:
            return [run_job(task[0])], None
        try:
            return lru_rows(task), None
        except NamespacedTraceError:  # the curve has no namespaces: replay each capacity
            return [run_job(job) for job in task], None
    except (RadixKVError, ValueError, TypeError, OSError) as exc:
        return None, str(exc)


def plan_tasks(jobs: Sequence[SweepJob], curve: bool = True) -> List[Tuple[int, ...]]:
    """Indexes of ``jobs`` grouped into tasks, most expensive first (so the last to start are the
    short ones): with ``curve``, the LRU jobs of each trace that :func:`lru_from_curve` makes cheaper
    as a pass become one task, every other job a task of its own. O(jobs)."""
    groups: dict = {}
    for i, job in enumerate(jobs):
        if curve and job.policy == "lru" and not job.policy_params:
            groups.setdefault(replace(job, num_blocks=0), []).append(i)
    tasks: List[Tuple[int, ...]] = []
    in_curve = set()
    for members in groups.values():
        if lru_from_curve([jobs[i] for i in members]):
            tasks.append(tuple(members))
            in_curve.update(members)
    tasks += [(i,) for i in range(len(jobs)) if i not in in_curve]
    return sorted(tasks, key=lambda t: -(CURVE_COST if len(t) > 1 else expected_cost(jobs[t[0]])))


def run_sweep(jobs: Sequence[SweepJob], processes: int = 1,
              on_done: Optional[Callable[[dict, float], None]] = None, curve: bool = True) -> List[dict]:
    """Run every job, in ``processes`` worker processes when > 1; rows in the order of ``jobs``.

    The numbers do not depend on ``processes``: each job is a whole replay of
    its own, and with ``curve`` the LRU jobs of a trace with more capacities than
    :data:`CURVE_COST` come from one pass of the LRU curve instead (:func:`lru_rows`:
    the same numbers, ``"source": "curve"``). Tasks start most expensive first.
    ``on_done(row, cost)`` is called as each row is ready, ``cost`` its share of the
    expected time (:func:`expected_cost`; the rows of a curve share :data:`CURVE_COST`),
    which add up to :func:`sweep_cost` (a progress bar's total).

    Raises:
        ArgumentValueError: ``processes`` is not an int >= 1, or a job failed (its message).
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ArgumentValueError(f"processes must be an int >= 1, got {processes!r}")
    rows: List[Optional[dict]] = [None] * len(jobs)
    tasks = plan_tasks(jobs, curve)
    work = [tuple(jobs[i] for i in task) for task in tasks]
    pool = None
    if processes == 1 or len(tasks) <= 1:
        outcomes: Iterable = zip(tasks, map(_run_task_safely, work))
    else:
        pool = ProcessPoolExecutor(max_workers=min(processes, len(tasks)))
        futures = {pool.submit(_run_task_safely, w): task for task, w in zip(tasks, work)}
        outcomes = ((futures[f], f.result()) for f in as_completed(futures))
    try:
        for task, (out, error) in outcomes:
            if error is not None:
                raise ArgumentValueError(error)
            cost = CURVE_COST / len(task) if len(task) > 1 else expected_cost(jobs[task[0]])
            for i, row in zip(task, out):
                rows[i] = row
                if on_done is not None:
                    on_done(row, cost)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return rows  # type: ignore[return-value]


def sweep_cost(jobs: Sequence[SweepJob], curve: bool = True) -> float:
    """The expected time of :func:`run_sweep` on ``jobs`` in LRU replays (one process). O(jobs)."""
    return sum(CURVE_COST if len(t) > 1 else expected_cost(jobs[t[0]]) for t in plan_tasks(jobs, curve))


def trace_curve(requests: Iterable[Request], page_size: int, capacities: Optional[Sequence[int]], *,
                mooncake: bool = False, on_request: Optional[Callable[[Request], None]] = None,
                warmup: int = 0) -> CurveResult:
    """LRU hit tokens at every capacity from one pass over ``requests`` (:mod:`radixkv.analysis.curve`).

    Equal, capacity by capacity, to ``replay`` through ``PrefixCache(c, page_size, "lru")``.
    ``capacities=None`` picks the dense automatic grid :func:`~radixkv.analysis.curve.log_grid`
    from 1 block to the trace's distinct pages (known only after the pass; free then).
    Pages are identified as :func:`_page_ids` says (``mooncake=True``: by Mooncake block
    ids, one dict lookup per 512 tokens). The curve does not model namespaces: a
    request with one raises ValueError. ``warmup``: the first ``warmup`` requests fill the cache but
    count no hit or prompt token (as ``replay(warmup=...)``).
    """
    stack = LruStackDistances(page_size)
    i = -1
    for i, (request, ids) in enumerate(_page_ids(requests, page_size, mooncake)):
        if i == warmup and i:
            stack.reset_counts()
        if request.namespace is not None:
            raise ArgumentValueError(f"requests[{i}] has namespace {request.namespace!r}; the one-pass curve "
                                     "does not model namespaces (use radixkv sweep)")
        stack.add(ids, len(request.tokens))
        if on_request is not None:
            on_request(request)
    if i < warmup:  # the trace ended within the warm-up
        stack.reset_counts()
    return stack.result(log_grid(stack.num_live) if capacities is None else capacities)


def distinct_pages(requests: Iterable[Request], page_size: int, *, mooncake: bool = False) -> int:
    """Distinct full pages of ``requests`` (per namespace): the capacity at which nothing is ever
    evicted, the 100% of ``--capacities 25%``. One pass, the page ids of :func:`trace_curve`."""
    seen: set = set()
    for request, ids in _page_ids(requests, page_size, mooncake):
        seen.update(zip([request.namespace] * len(ids), ids.tolist()))
    return len(seen)


def _page_ids(requests: Iterable[Request], page_size: int, mooncake: bool) -> Iterator[Tuple[Request, np.ndarray]]:
    """Each request with its full pages' ids (equal ids: equal prefixes within a namespace).

    With ``mooncake=True`` (tokens expanded from Mooncake hash ids, as
    :class:`~radixkv.workload.traces.TraceReader` does) and ``page_size`` dividing 512,
    pages are identified from the block ids (one dict lookup per 512 tokens);
    otherwise by interning every page's token prefix (one dict lookup and
    ``page_size * 4`` bytes per page).
    """
    by_blocks = mooncake and MOONCAKE_BLOCK_TOKENS % page_size == 0
    interners: dict = {}
    blocks = MooncakeBlocks()
    for request in requests:
        tokens = request.tokens
        if by_blocks:
            hash_ids = (np.asarray(tokens[::MOONCAKE_BLOCK_TOKENS]) // MOONCAKE_BLOCK_TOKENS).tolist()
            yield request, mooncake_page_ids(blocks.ids(hash_ids, request.namespace), len(tokens), page_size)
        else:
            interner = interners.get(request.namespace)
            if interner is None:
                interner = interners[request.namespace] = PageInterner(page_size)
            yield request, interner.ids(tokens)

"""Capacity planning: replay a trace at many (policy, capacity) pairs, or get LRU's whole curve in one pass.

:func:`run_sweep` replays one trace once per :class:`SweepJob`, in parallel
processes when asked; each job streams the trace itself, so memory per
process is one cache plus one request. :func:`trace_curve` gives LRU's hit
tokens at every capacity from a single pass (:mod:`radixkv.analysis.curve`), equal to
per-capacity LRU replays.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .. import policies
from ..cache import PrefixCache
from ..capacity import parse_capacities, parse_capacity  # noqa: F401  (re-exported: sweep's capacities)
from ..costs import DEFAULT_HARDWARE, DEFAULT_MODEL
from .curve import CurveResult, LruStackDistances, PageInterner, log_grid, mooncake_page_ids
from ..errors import ArgumentValueError, RadixKVError
from .replay import replay
from ..workload.sources import open_trace
from ..workload.traces import MOONCAKE_BLOCK_TOKENS, MooncakeBlocks, Request


def parse_policies(text: str) -> List[str]:
    """Comma-separated policy names, each checked against the registry (ValueError listing them)."""
    names = [item.strip() for item in str(text).split(",") if item.strip()]
    known = policies.available(include_aliases=True)
    if not names:
        raise ArgumentValueError(f"policies must list at least one policy, got {text!r}")
    for name in names:
        if name not in known:
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


def run_job(job: SweepJob) -> dict:
    """Replay one job; the :class:`~radixkv.analysis.replay.ReplayResult` as a dict plus ``trace`` and ``skipped_lines``."""
    trace = open_trace(job.trace, job.format, limit=job.limit, skip_bad=job.skip_bad, tokenizer=job.tokenizer)
    cache = PrefixCache(num_blocks=job.num_blocks, page_size=job.page_size, policy=job.policy)
    result = replay(trace, cache, miss_reasons=job.miss_reasons, model=job.model, hardware=job.hardware)
    return {"trace": job.trace, **result.as_dict(), "skipped_lines": trace.skipped}


def _run_job_safely(job: SweepJob) -> Tuple[Optional[dict], Optional[str]]:
    """:func:`run_job` in a worker: user errors come back as text (radixkv's errors do not all pickle)."""
    try:
        return run_job(job), None
    except (RadixKVError, ValueError, TypeError, OSError) as exc:
        return None, str(exc)


def run_sweep(jobs: Sequence[SweepJob], processes: int = 1,
              on_done: Optional[Callable[[dict], None]] = None) -> List[dict]:
    """Run every job, in ``processes`` worker processes when > 1; rows in the order of ``jobs``.

    The numbers do not depend on ``processes``: each job is a whole replay of
    its own. ``on_done(row)`` is called as each job finishes (progress).
    Raises ValueError with the first failing job's message.
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ArgumentValueError(f"processes must be an int >= 1, got {processes!r}")
    rows: List[Optional[dict]] = [None] * len(jobs)
    if processes == 1 or len(jobs) <= 1:
        outcomes: Iterable = map(_run_job_safely, jobs)
        pool = None
    else:
        pool = ProcessPoolExecutor(max_workers=min(processes, len(jobs)))
        outcomes = pool.map(_run_job_safely, jobs)
    try:
        for i, (row, error) in enumerate(outcomes):
            if error is not None:
                raise ArgumentValueError(error)
            rows[i] = row
            if on_done is not None:
                on_done(row)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return rows  # type: ignore[return-value]


def trace_curve(requests: Iterable[Request], page_size: int, capacities: Optional[Sequence[int]], *,
                mooncake: bool = False, on_request: Optional[Callable[[Request], None]] = None) -> CurveResult:
    """LRU hit tokens at every capacity from one pass over ``requests`` (:mod:`radixkv.analysis.curve`).

    Equal, capacity by capacity, to ``replay`` through ``PrefixCache(c, page_size, "lru")``.
    ``capacities=None`` picks the dense automatic grid :func:`~radixkv.analysis.curve.log_grid`
    from 1 block to the trace's distinct pages (known only after the pass; free then).
    Pages are identified as :func:`_page_ids` says (``mooncake=True``: by Mooncake block
    ids, one dict lookup per 512 tokens). The curve does not model namespaces: a
    request with one raises ValueError.
    """
    stack = LruStackDistances(page_size)
    for i, (request, ids) in enumerate(_page_ids(requests, page_size, mooncake)):
        if request.namespace is not None:
            raise ArgumentValueError(f"requests[{i}] has namespace {request.namespace!r}; the one-pass curve "
                                     "does not model namespaces (use radixkv sweep)")
        stack.add(ids, len(request.tokens))
        if on_request is not None:
            on_request(request)
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

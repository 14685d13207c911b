"""Capacity planning: replay a trace at many (policy, capacity) pairs, or get LRU's whole curve in one pass.

:func:`run_sweep` replays one trace once per :class:`SweepJob`, in parallel
processes when asked; each job streams the trace itself, so memory per
process is one cache plus one request. :func:`trace_curve` gives LRU's hit
tokens at every capacity from a single pass (:mod:`radixkv.curve`), equal to
per-capacity LRU replays.
"""

from __future__ import annotations

import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from . import policies
from .cache import PrefixCache
from .curve import CurveResult, LruStackDistances, PageInterner, mooncake_page_ids
from .errors import ArgumentValueError, RadixKVError
from .replay import replay
from .sources import open_trace
from .stats import DEFAULT_HARDWARE, DEFAULT_MODEL
from .traces import MOONCAKE_BLOCK_TOKENS, Request

_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
_CAPACITY = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKmMgG]?)\s*")


def parse_capacity(text: str) -> int:
    """A capacity in blocks from ``"1000"``, ``"10k"``, ``"1.5M"`` or ``"2G"`` (decimal: k = 1000).

    Raises ValueError naming the text unless it is a whole number of blocks > 0.
    """
    match = _CAPACITY.fullmatch(str(text))
    if match is None:
        raise ArgumentValueError(f"capacity must be a number of blocks like 1000, 10k or 1.5M, got {text!r}")
    value = float(match.group(1)) * _SUFFIXES[match.group(2).lower()]
    if value != int(value):
        raise ArgumentValueError(f"capacity must be a whole number of blocks, got {text!r} = {value:g}")
    if value <= 0:
        raise ArgumentValueError(f"capacity must be > 0 blocks, got {text!r}")
    return int(value)


def parse_capacities(text: str) -> List[int]:
    """Comma-separated capacities (see :func:`parse_capacity`), in the order given."""
    items = [item for item in str(text).split(",") if item.strip()]
    if not items:
        raise ArgumentValueError(f"capacities must list at least one capacity, got {text!r}")
    return [parse_capacity(item) for item in items]


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


def run_job(job: SweepJob) -> dict:
    """Replay one job; the :class:`~radixkv.replay.ReplayResult` as a dict plus ``trace`` and ``skipped_lines``."""
    trace = open_trace(job.trace, job.format, limit=job.limit, skip_bad=job.skip_bad)
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


def trace_curve(requests: Iterable[Request], page_size: int, capacities: Sequence[int], *,
                mooncake: bool = False, on_request: Optional[Callable[[Request], None]] = None) -> CurveResult:
    """LRU hit tokens at every capacity from one pass over ``requests`` (:mod:`radixkv.curve`).

    Equal, capacity by capacity, to ``replay`` through ``PrefixCache(c, page_size, "lru")``.
    With ``mooncake=True`` (tokens expanded from Mooncake hash ids, as
    :class:`~radixkv.traces.TraceReader` does) and ``page_size`` dividing 512,
    pages are identified from the block ids (one dict lookup per 512 tokens);
    otherwise by interning every page's token prefix (one dict lookup and
    ``page_size * 4`` bytes per page). The curve does not model namespaces: a
    request with one raises ValueError.
    """
    stack = LruStackDistances(page_size)
    by_blocks = mooncake and MOONCAKE_BLOCK_TOKENS % page_size == 0
    interner = None if by_blocks else PageInterner(page_size)
    blocks: dict = {}
    for i, request in enumerate(requests):
        if request.namespace is not None:
            raise ArgumentValueError(f"requests[{i}] has namespace {request.namespace!r}; the one-pass curve "
                                     "does not model namespaces (use radixkv sweep)")
        tokens = request.tokens
        if by_blocks:
            parent, block_ids = -1, []
            for h in (np.asarray(tokens[::MOONCAKE_BLOCK_TOKENS]) // MOONCAKE_BLOCK_TOKENS).tolist():
                parent = blocks.setdefault((parent, h), len(blocks))
                block_ids.append(parent)
            stack.add(mooncake_page_ids(block_ids, len(tokens), page_size), len(tokens))
        else:
            stack.add(interner.ids(tokens), len(tokens))
        if on_request is not None:
            on_request(request)
    return stack.result(capacities)

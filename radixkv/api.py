"""radixkv for scripts: replay, sweep and curve a trace in a few calls, results as typed records.

The commands ``radixkv replay / sweep / curve`` are thin layers over these
functions, and every one takes the same capacity units (:mod:`radixkv.capacity`):

>>> from radixkv.api import replay, sweep, curve                     # doctest: +SKIP
>>> r = replay("trace.jsonl", max_total_tokens=3_000_000)            # doctest: +SKIP
>>> rows = sweep("trace.jsonl", ["lru", "s3fifo"], ["1%", "25%", "100%"]).to_records()  # doctest: +SKIP

A trace is a path (plain, ``.gz``, ``.zst`` or ``"-"`` for standard input; token
JSONL, Mooncake JSONL or ShareGPT, detected) or any iterable of
:class:`~radixkv.workload.traces.Request`. Results are frozen dataclasses; a
:class:`Records` list of them turns into plain dicts with ``to_records()`` and
into a pandas DataFrame with ``to_dataframe()`` (pandas is never required
otherwise). This module also re-exports the cost model and the trace readers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, List, Optional, Sequence, Union

from .cache import PrefixCache
from .capacity import ModelLike, describe, parse_bytes, parse_capacities, parse_capacity, resolve_blocks
from .costs import (DEFAULT_HARDWARE, DEFAULT_MODEL, HARDWARE, MODELS, CostModel, HardwareSpec, ModelSpec,
                    get_hardware, get_model, kv_bytes_per_page, kv_bytes_per_token, prefill_flops)
from .errors import ArgumentValueError, MissingExtraError
from .analysis.replay import ReplayResult
from .analysis.replay import replay as replay_requests
from .workload.sharegpt import load_sharegpt
from .workload.hf_tokenizer import load_tokenizer
from .workload.sources import TRACE_FORMATS, TokenizerLike, Trace, detect_format, open_trace
from .analysis.stats import RequestRecord
from .workload.traces import Request, TraceReader

Hardware = HardwareSpec
"""The accelerator spec (:class:`radixkv.costs.HardwareSpec`)."""

TraceLike = Union[str, Iterable[Request]]

__all__ = [
    "replay", "sweep", "curve", "distinct_pages", "Records", "CurvePoint", "ReplayResult", "RequestRecord",
    "resolve_blocks", "parse_capacity", "parse_capacities", "parse_bytes", "describe",
    "ModelSpec", "HardwareSpec", "Hardware", "CostModel", "MODELS", "HARDWARE", "get_model", "get_hardware",
    "kv_bytes_per_token", "kv_bytes_per_page", "prefill_flops",
    "open_trace", "detect_format", "Trace", "TraceReader", "load_sharegpt", "load_tokenizer", "Request",
    "TRACE_FORMATS",
]


class Records(list):
    """A list of result records (dataclasses) with conversions to rows."""

    def to_records(self) -> List[dict]:
        """Each record as a plain dict (JSON-ready), in order."""
        return [asdict(r) if hasattr(r, "__dataclass_fields__") else dict(r) for r in self]

    def to_dataframe(self):
        """The records as a ``pandas.DataFrame`` (needs pandas; nothing else in radixkv does).

        Raises:
            MissingExtraError: pandas is not installed (an ``ImportError`` that says what to install).
        """
        try:
            import pandas
        except ImportError:
            raise MissingExtraError("Records.to_dataframe() needs pandas: pip install pandas "
                                    "(to_records() gives the same rows as plain dicts)") from None

        return pandas.DataFrame(self.to_records())


@dataclass(frozen=True)
class CurvePoint:
    """LRU's hits at one capacity of a one-pass curve (:func:`curve`)."""

    num_blocks: int
    capacity_tokens: int
    page_size: int
    hit_tokens: int
    prompt_tokens: int
    token_hit_rate: float


def _trace(trace: TraceLike, format: Optional[str], limit: Optional[int], tokenizer: TokenizerLike = None):
    """A re-iterable trace: ``open_trace`` for a path, a list for other iterables."""
    if isinstance(trace, str) or hasattr(trace, "__fspath__"):
        return open_trace(trace, format, limit=limit, tokenizer=tokenizer)  # type: ignore[arg-type]
    if format is not None:
        raise ArgumentValueError("format applies to a trace path, not to a sequence of requests")
    if tokenizer is not None:
        raise ArgumentValueError("tokenizer applies to a text (ShareGPT) trace path, not to a sequence of requests")
    requests = list(trace)
    return requests if limit is None else requests[:limit]


def _is_mooncake(trace) -> bool:
    return getattr(trace, "format", None) == "mooncake"


def distinct_pages(trace: TraceLike, page_size: int = 16, *, format: Optional[str] = None,
                   limit: Optional[int] = None) -> int:
    """Distinct full pages of ``trace`` per namespace: the capacity at which nothing is ever evicted
    (the 100% of a ``"25%"`` capacity). One pass over the trace."""
    return _distinct(_trace(trace, format, limit), page_size)


def _distinct(requests, page_size: int) -> int:
    from .analysis.sweep import distinct_pages as count

    return count(requests, page_size, mooncake=_is_mooncake(requests))


def replay(trace: TraceLike, *, policy: str = "lru", num_blocks: object = None, max_total_tokens: object = None,
           kv_cache_memory: object = None, page_size: int = 16, model: ModelLike = DEFAULT_MODEL,
           hardware: Union[str, HardwareSpec] = DEFAULT_HARDWARE, format: Optional[str] = None,
           limit: Optional[int] = None, miss_reasons: bool = True, tokenizer: TokenizerLike = None) -> ReplayResult:
    """Replay ``trace`` through one :class:`~radixkv.PrefixCache` and return its totals.

    Capacity: exactly one of ``num_blocks``, ``max_total_tokens`` (SGLang's pool size) or
    ``kv_cache_memory`` (bytes or ``"40GiB"``, through ``model``'s KV bytes per page); see
    :func:`radixkv.capacity.resolve_blocks`. Cost: one pass over the trace (two for Belady).
    ``tokenizer``: for a ShareGPT trace, a local ``tokenizer.json`` path (the ``radixkv[tokenizers]``
    extra) or a ``text -> ids`` callable instead of the built-in tokenizer.
    For tiers, records or events, build the cache yourself and call
    :func:`radixkv.analysis.replay.replay` (``replay_requests`` here).

    Raises:
        ArgumentValueError: a capacity that is not exactly one of the three, not positive, or
            unparsable; an unknown ``format``, ``model`` or ``hardware``; a bad ``limit``.
        UnknownPolicyError: a policy name not registered (a ``KeyError``; the message lists them).
        TraceFormatError: a malformed trace line (``file:line: field ...``), a timestamp going back.
        OSError: the trace file cannot be read.
        MissingExtraError: a compression or tokenizer that needs an extra not installed.
    """
    blocks = resolve_blocks(num_blocks=num_blocks, max_total_tokens=max_total_tokens,
                            kv_cache_memory=kv_cache_memory, page_size=page_size, model=model)
    requests = _trace(trace, format, limit, tokenizer)
    cache = PrefixCache(num_blocks=blocks, page_size=page_size, policy=policy)
    return replay_requests(requests, cache, miss_reasons=miss_reasons, model=model, hardware=hardware)


def sweep(trace: TraceLike, policies: Sequence[str], capacities: Union[str, Sequence[object]], *,
          page_size: int = 16, model: ModelLike = DEFAULT_MODEL, hardware: Union[str, HardwareSpec] = DEFAULT_HARDWARE,
          format: Optional[str] = None, limit: Optional[int] = None, miss_reasons: bool = True,
          processes: int = 1, tokenizer: TokenizerLike = None) -> "Records":
    """One replay per (policy, capacity), policies outermost; a :class:`Records` of
    :class:`~radixkv.analysis.replay.ReplayResult`.

    ``capacities`` items are blocks (``1000``, ``"10k"``), tokens (``"3Mtok"``), bytes
    (``"40GiB"``) or shares of the trace's distinct pages (``"25%"``), as a list or a
    comma-separated string. ``processes > 1`` replays a trace *path* in worker processes
    (the numbers do not depend on it). ``tokenizer`` as :func:`replay`.

    Raises:
        ArgumentValueError, UnknownPolicyError, TraceFormatError, OSError, MissingExtraError: as
        :func:`replay`, for any of ``policies`` and ``capacities`` (checked before the first run).
    """
    from .analysis.sweep import SweepJob, parse_policies, run_sweep

    names = parse_policies(",".join(policies) if not isinstance(policies, str) else policies)
    requests = _trace(trace, format, limit, tokenizer)
    caps = parse_capacities(capacities, page_size=page_size, model=model,
                            distinct_pages=lambda: _distinct(requests, page_size))
    if (processes > 1 and isinstance(requests, Trace) and isinstance(model, str) and isinstance(hardware, str)
            and not callable(tokenizer)):
        path = None if tokenizer is None else str(tokenizer)
        jobs = [SweepJob(requests.path, p, c, page_size=page_size, format=requests.format, limit=limit,
                         model=model, hardware=hardware, miss_reasons=miss_reasons, tokenizer=path)
                for p in names for c in caps]
        fields = ReplayResult.__dataclass_fields__
        return Records(ReplayResult(**{k: v for k, v in row.items() if k in fields})
                       for row in run_sweep(jobs, processes))
    return Records(replay_requests(requests, PrefixCache(num_blocks=c, page_size=page_size, policy=p),
                                   miss_reasons=miss_reasons, model=model, hardware=hardware)
                   for p in names for c in caps)


def curve(trace: TraceLike, capacities: Union[str, Sequence[object], None] = "auto", *, page_size: int = 16,
          model: ModelLike = DEFAULT_MODEL, format: Optional[str] = None, limit: Optional[int] = None,
          tokenizer: TokenizerLike = None) -> "Records":
    """LRU's hit tokens at every capacity from one pass (:func:`radixkv.analysis.sweep.trace_curve`), equal to
    an LRU :func:`replay` at each; a :class:`Records` of :class:`CurvePoint`. Capacities as :func:`sweep`,
    or ``"auto"`` / ``None`` (the default): about 50 log-spaced capacities from 1 block to the trace's
    distinct pages (:func:`radixkv.analysis.curve.log_grid`), free from the same pass. ``tokenizer`` as
    :func:`replay`.

    Raises:
        ArgumentValueError, TraceFormatError, OSError, MissingExtraError: as :func:`replay` (no policy
        is involved).
    """
    from .analysis.sweep import trace_curve

    requests = _trace(trace, format, limit, tokenizer)
    caps = None if capacities is None or (isinstance(capacities, str) and capacities.strip() == "auto") else \
        parse_capacities(capacities, page_size=page_size, model=model,
                         distinct_pages=lambda: _distinct(requests, page_size))
    result = trace_curve(requests, page_size, caps, mooncake=_is_mooncake(requests))
    return Records(CurvePoint(c, c * page_size, page_size, h, result.prompt_tokens, r)
                   for c, h, r in zip(result.capacities, result.hit_tokens, result.token_hit_rates))

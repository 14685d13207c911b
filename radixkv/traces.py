"""Request traces: the :class:`Request` record and streaming loaders.

Two on-disk formats are read line by line, so a trace larger than memory
replays without being loaded whole:

* **token JSONL**: ``{"tokens": [...], "timestamp": 12.5, "namespace": "t1"}``
  one request a line; only ``tokens`` is required.
* **Mooncake JSONL**: ``{"timestamp": ms, "input_length": n, "hash_ids": [...]}``;
  block ``h`` stands for the 512 token ids ``h*512 .. h*512+511`` and the
  prompt is cut to ``input_length`` tokens (the format of the Mooncake FAST'25
  release).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np

from .errors import ArgumentValueError, TraceFormatError

MOONCAKE_BLOCK_TOKENS = 512
TOKEN_DTYPE = np.uint32


@dataclass(frozen=True, slots=True)
class Request:
    """One prompt of a trace.

    Attributes:
        tokens: prompt token ids, a 1-D ``uint32`` array.
        timestamp: arrival time in seconds, or ``None`` when the trace has none.
        output_length: tokens the request generated (0 when unknown).
        namespace: cache partition (tenant, LoRA adapter); ``None`` is the shared one.
    """

    tokens: np.ndarray
    timestamp: Optional[float] = None
    output_length: int = 0
    namespace: Optional[str] = field(default=None)


def expand_mooncake(hash_ids: list, input_length: int) -> np.ndarray:
    """Token ids of a Mooncake prompt: block ``h`` -> ``h*512 .. h*512+511``, cut to ``input_length``."""
    base = np.asarray(hash_ids, dtype=np.int64) * MOONCAKE_BLOCK_TOKENS
    tokens = (base[:, None] + np.arange(MOONCAKE_BLOCK_TOKENS, dtype=np.int64)).ravel()
    return tokens[:input_length].astype(TOKEN_DTYPE)


FORMATS = ("tokens", "mooncake")


class TraceReader:
    """Streams the requests of a JSONL trace file, one line at a time.

    The format (``"tokens"`` or ``"mooncake"``) is taken from the first
    non-blank line unless given. A malformed line raises
    :class:`~radixkv.errors.TraceFormatError` naming the file, line and field;
    with ``skip_bad=True`` it is skipped and counted in :attr:`skipped`
    instead. Timestamps must not decrease (requests replay in arrival order).

    >>> reader = TraceReader("trace.jsonl", limit=100)   # doctest: +SKIP
    >>> for request in reader: ...                        # doctest: +SKIP
    """

    def __init__(self, path: str, format: Optional[str] = None, *, limit: Optional[int] = None,
                 skip_bad: bool = False) -> None:
        if format is not None and format not in FORMATS:
            raise ArgumentValueError(f"format must be one of {FORMATS}, got {format!r}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ArgumentValueError(f"limit must be a non-negative int, got {limit!r}")
        self.path = str(path)
        self.format = format
        self.limit = limit
        self.skip_bad = skip_bad
        self.skipped = 0
        with open(self.path, "rb"):  # fail now, not at first iteration, if unreadable
            pass

    def __iter__(self) -> Iterator[Request]:
        self.skipped = 0
        count = 0
        last_ts = None
        with open(self.path, "r", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if self.limit is not None and count >= self.limit:
                    return
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    if not isinstance(record, dict):
                        raise TraceFormatError(self.path, lineno, f"expected a JSON object, got {type(record).__name__}")
                    if self.format is None:
                        self.format = "mooncake" if "hash_ids" in record else "tokens"
                    request = _PARSERS[self.format](record, self.path, lineno)
                    if request.timestamp is not None:
                        if last_ts is not None and request.timestamp < last_ts:
                            raise TraceFormatError(
                                self.path, lineno,
                                f"field 'timestamp' goes backwards ({request.timestamp!r} < {last_ts!r})")
                        last_ts = request.timestamp
                except json.JSONDecodeError as exc:
                    if not self.skip_bad:
                        raise TraceFormatError(self.path, lineno, f"invalid JSON: {exc.msg}") from None
                    self.skipped += 1
                    continue
                except TraceFormatError:
                    if not self.skip_bad:
                        raise
                    self.skipped += 1
                    continue
                count += 1
                yield request
        if count == 0 and self.skipped == 0:
            raise TraceFormatError(self.path, 0, "trace is empty")


def _field(record: dict, name: str, kind: type, path: str, lineno: int, required: bool = True):
    if name not in record:
        if required:
            raise TraceFormatError(path, lineno, f"missing field {name!r}")
        return None
    value = record[name]
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        raise TraceFormatError(path, lineno, f"field {name!r} must be {kind.__name__}, got {value!r:.60}")
    return value


def _int_list(record: dict, name: str, path: str, lineno: int, limit: int) -> np.ndarray:
    values = _field(record, name, list, path, lineno)
    if not all(type(v) is int for v in values):
        bad = next(v for v in values if type(v) is not int)
        raise TraceFormatError(path, lineno, f"field {name!r} must hold ints, got {bad!r:.60}")
    arr = np.asarray(values, dtype=np.int64) if values else np.empty(0, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() > limit):
        bad = int(arr.min()) if arr.min() < 0 else int(arr.max())
        raise TraceFormatError(path, lineno, f"field {name!r} value {bad} outside [0, {limit}]")
    return arr


def _parse_tokens(record: dict, path: str, lineno: int) -> Request:
    tokens = _int_list(record, "tokens", path, lineno, int(np.iinfo(TOKEN_DTYPE).max)).astype(TOKEN_DTYPE)
    ts = _field(record, "timestamp", float, path, lineno, required=False)
    out = _field(record, "output_length", int, path, lineno, required=False) or 0
    ns = _field(record, "namespace", str, path, lineno, required=False)
    return Request(tokens, None if ts is None else float(ts), out, ns)


def _parse_mooncake(record: dict, path: str, lineno: int) -> Request:
    max_hash = (int(np.iinfo(TOKEN_DTYPE).max) + 1) // MOONCAKE_BLOCK_TOKENS - 1
    hash_ids = _int_list(record, "hash_ids", path, lineno, max_hash)
    length = _field(record, "input_length", int, path, lineno)
    if length < 0 or length > len(hash_ids) * MOONCAKE_BLOCK_TOKENS:
        raise TraceFormatError(
            path, lineno,
            f"field 'input_length' {length} does not fit {len(hash_ids)} blocks of {MOONCAKE_BLOCK_TOKENS}")
    ts = _field(record, "timestamp", float, path, lineno, required=False)
    out = _field(record, "output_length", int, path, lineno, required=False) or 0
    return Request(expand_mooncake(hash_ids, length), None if ts is None else ts / 1000.0, out, None)


_PARSERS = {"tokens": _parse_tokens, "mooncake": _parse_mooncake}

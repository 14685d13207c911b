"""Request traces: the :class:`Request` record and streaming loaders.

Two on-disk formats are read line by line, so a trace larger than memory
replays without being loaded whole:

* **token JSONL**: ``{"tokens": [...], "timestamp": 12.5, "namespace": "t1"}``
  one request a line; only ``tokens`` is required.
* **Mooncake JSONL**: ``{"timestamp": ms, "input_length": n, "hash_ids": [...]}``
  (optionally the Bailian session fields ``chat_id``, ``parent_chat_id``,
  ``turn``, ``type``, in either format);
  block ``h`` stands for the 512 token ids ``h*512 .. h*512+511`` and the
  prompt is cut to ``input_length`` tokens (the format of the Mooncake FAST'25
  release).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, List, Optional

import numpy as np

from ..errors import ArgumentValueError, TraceFormatError
from ..keys import MAX_TOKEN, TOKEN_DTYPE
from ..policies.base import RequestHints
from .tracefiles import compression, read_lines, resolve

MOONCAKE_BLOCK_TOKENS = 512
INT64_MAX = int(np.iinfo(np.int64).max)


@dataclass(frozen=True, slots=True)
class Request:
    """One prompt of a trace.

    Attributes:
        tokens: prompt token ids, a 1-D ``uint32`` array.
        timestamp: arrival time in seconds, or ``None`` when the trace has none.
        output_length: tokens the request generated (0 when unknown).
        namespace: cache partition (LoRA adapter, model variant); ``None`` is the shared one.
        tenant: who sent it (see :mod:`radixkv.tenancy`); ``None`` when the trace does not say.
        chat_id, parent_chat_id, turn, type: the session fields of the Alibaba Bailian
            trace format (``None`` when the trace has none): the turn's id, the id of the
            turn it continues (``-1``: none), its number in the session, its category.
    """

    tokens: np.ndarray
    timestamp: Optional[float] = None
    output_length: int = 0
    namespace: Optional[str] = field(default=None)
    tenant: Optional[str] = field(default=None)
    chat_id: Optional[int] = None
    parent_chat_id: Optional[int] = None
    turn: Optional[int] = None
    type: Optional[str] = None

    def hints(self) -> RequestHints:
        """What a policy may know of this request besides its tokens (``PrefixCache.admit(..., hints=)``).

        An output length of 0 counts as unknown. O(1).
        """
        return RequestHints(self.output_length or None, self.timestamp, self.chat_id, self.parent_chat_id,
                            self.turn, self.type)


def expand_mooncake(hash_ids: list, input_length: int) -> np.ndarray:
    """Token ids of a Mooncake prompt: block ``h`` -> ``h*512 .. h*512+511``, cut to ``input_length``."""
    base = np.asarray(hash_ids, dtype=np.int64) * MOONCAKE_BLOCK_TOKENS
    tokens = (base[:, None] + np.arange(MOONCAKE_BLOCK_TOKENS, dtype=np.int64)).ravel()
    return tokens[:input_length].astype(TOKEN_DTYPE)


class MooncakeBlocks:
    """Dense ids for Mooncake hash-id prefixes: ``ids(hash_ids)[k]`` names ``hash_ids[:k+1]``.

    Prefixes are interned chained, ``(namespace, parent id, hash id) -> id``, so
    equal ids mean equal prefixes within a namespace without relying on the
    trace's ids being chained hashes. This is what lets the LRU curve key a
    page as (block id, offset in the block) instead of expanding 512 tokens a
    block. Cost: one dict lookup per block; memory O(distinct prefixes).
    """

    def __init__(self) -> None:
        self._table: dict = {}

    def ids(self, hash_ids: Iterable[int], namespace: Optional[str] = None) -> List[int]:
        """The id of each prefix ``hash_ids[:k+1]`` in ``namespace``, interning new ones."""
        table, out, parent = self._table, [], -1
        for h in hash_ids:
            parent = table.setdefault((namespace, parent, h), len(table))
            out.append(parent)
        return out


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
        self.path = resolve(str(path))
        self.format = format
        self.limit = limit
        self.skip_bad = skip_bad
        self.skipped = 0
        compression(self.path)  # fail now, not at first iteration, if unreadable

    def __iter__(self) -> Iterator[Request]:
        self.skipped = 0
        count = 0
        last_ts = None
        if self.limit == 0:
            return
        for lineno, record in json_lines(self.path, skip_bad=self.skip_bad, on_skip=self._skip):
            try:
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
            except TraceFormatError:
                if not self.skip_bad:
                    raise
                self.skipped += 1
                continue
            count += 1
            yield request
            if count == self.limit:  # before reading a line past the limit
                return
        if count == 0 and self.skipped == 0:
            raise TraceFormatError(self.path, 0, "trace is empty")

    def _skip(self, error: TraceFormatError) -> None:
        self.skipped += 1


def json_lines(path: str, *, skip_bad: bool = False,
               on_skip: Optional[Callable[[TraceFormatError], None]] = None) -> Iterator[tuple[int, object]]:
    """``(line number, decoded value)`` for each non-blank line of a JSONL file, streaming.

    A line that is not UTF-8 or not JSON (including numbers past Python's
    4300-digit limit and nesting too deep to decode) raises
    :class:`~radixkv.errors.TraceFormatError` naming the file and line; with
    ``skip_bad`` it is passed to ``on_skip`` instead and left out. A UTF-8 byte
    order mark before the first line is ignored. ``NaN`` and ``Infinity``
    decode as floats: the field checks refuse them where a number must be
    finite. ``path`` may be gzip- or zstd-compressed (:mod:`radixkv.workload.tracefiles`). Cost: O(bytes).
    """
    for lineno, raw in enumerate(read_lines(path), 1):
        try:
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise TraceFormatError(path, lineno, f"invalid UTF-8 at byte {exc.start} of the line") from None
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, lineno, f"invalid JSON: {exc.msg}") from None
            except (ValueError, RecursionError) as exc:  # a 5000-digit number, 100000 nested lists
                reason = str(exc)[:80] or type(exc).__name__
                raise TraceFormatError(path, lineno, f"invalid JSON: {reason}") from None
        except TraceFormatError as exc:
            if not skip_bad:
                raise
            if on_skip is not None:
                on_skip(exc)
            continue
        yield lineno, value


def brief(value: object) -> str:
    """``repr(value)`` cut to 60 characters, for an error message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
        raise TraceFormatError(path, lineno, f"field {name!r} must be {kind.__name__}, got {brief(value)}")
    return value


def _count_field(record: dict, name: str, path: str, lineno: int, required: bool = True) -> Optional[int]:
    """An int field in ``[0, INT64_MAX]`` (a count of tokens), or ``None`` when optional and absent."""
    value = _field(record, name, int, path, lineno, required)
    if value is not None and not 0 <= value <= INT64_MAX:
        raise TraceFormatError(path, lineno, f"field {name!r} must be in [0, {INT64_MAX}], got {brief(value)}")
    return value


def _time_field(record: dict, path: str, lineno: int, per_second: float) -> Optional[float]:
    """Field ``timestamp`` in seconds (its unit is ``1 / per_second`` s) as a finite float: NaN, inf and
    ints past a double are refused."""
    value = _field(record, "timestamp", float, path, lineno, required=False)
    if value is None:
        return None
    try:
        seconds = float(value) / per_second
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise TraceFormatError(path, lineno, f"field 'timestamp' must be a finite number, got {brief(value)}")
    return seconds


def _namespace_field(record: dict, path: str, lineno: int, name: str = "namespace") -> Optional[str]:
    """Field ``namespace`` (or ``tenant``): a str that is valid Unicode (JSON can spell a lone surrogate,
    ``"\\ud800"``)."""
    value = _field(record, name, str, path, lineno, required=False)
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TraceFormatError(path, lineno, f"field {name!r} holds a lone surrogate at character "
                                   f"{exc.start}, got {brief(value)}") from None
    return value


def _int_list(record: dict, name: str, path: str, lineno: int, limit: int) -> np.ndarray:
    values = _field(record, name, list, path, lineno)
    if not all(type(v) is int for v in values):
        bad = next(v for v in values if type(v) is not int)
        raise TraceFormatError(path, lineno, f"field {name!r} must hold ints, got {brief(bad)}")
    if not values:
        return np.empty(0, dtype=np.int64)
    lo, hi = min(values), max(values)  # Python ints: checked before numpy, which overflows past int64
    if lo < 0 or hi > limit:
        bad = lo if lo < 0 else hi
        raise TraceFormatError(path, lineno, f"field {name!r} value {brief(bad)} outside [0, {limit}]")
    return np.asarray(values, dtype=np.int64)


def _session_fields(record: dict, path: str, lineno: int) -> tuple:
    """The optional Bailian fields ``chat_id``, ``parent_chat_id``, ``turn`` (ints; a turn >= 1) and ``type`` (a str)."""
    chat = _field(record, "chat_id", int, path, lineno, required=False)
    parent = _field(record, "parent_chat_id", int, path, lineno, required=False)
    turn = _field(record, "turn", int, path, lineno, required=False)
    if turn is not None and turn < 1:
        raise TraceFormatError(path, lineno, f"field 'turn' must be >= 1, got {brief(turn)}")
    kind = _field(record, "type", str, path, lineno, required=False)
    return chat, parent, turn, kind


def _parse_tokens(record: dict, path: str, lineno: int) -> Request:
    tokens = _int_list(record, "tokens", path, lineno, MAX_TOKEN).astype(TOKEN_DTYPE)
    ts = _time_field(record, path, lineno, 1.0)
    out = _count_field(record, "output_length", path, lineno, required=False) or 0
    return Request(tokens, ts, out, _namespace_field(record, path, lineno),
                   _namespace_field(record, path, lineno, "tenant"), *_session_fields(record, path, lineno))


MAX_MOONCAKE_HASH_ID = (MAX_TOKEN + 1) // MOONCAKE_BLOCK_TOKENS - 1
"""Largest hash id whose 512 token ids fit :data:`TOKEN_DTYPE`."""


def _parse_mooncake(record: dict, path: str, lineno: int) -> Request:
    hash_ids = _int_list(record, "hash_ids", path, lineno, MAX_MOONCAKE_HASH_ID)
    length = _count_field(record, "input_length", path, lineno)
    if length > len(hash_ids) * MOONCAKE_BLOCK_TOKENS:
        raise TraceFormatError(
            path, lineno,
            f"field 'input_length' {length} does not fit {len(hash_ids)} blocks of {MOONCAKE_BLOCK_TOKENS}")
    ts = _time_field(record, path, lineno, 1000.0)  # milliseconds
    out = _count_field(record, "output_length", path, lineno, required=False) or 0
    return Request(expand_mooncake(hash_ids, length), ts, out, None,
                   _namespace_field(record, path, lineno, "tenant"), *_session_fields(record, path, lineno))


_PARSERS = {"tokens": _parse_tokens, "mooncake": _parse_mooncake}

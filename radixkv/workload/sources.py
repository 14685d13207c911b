"""Open a trace file of any supported format as a re-iterable stream of requests.

=========  =====================================================================
format     file
=========  =====================================================================
tokens     token JSONL, ``{"tokens": [...], "timestamp": s}`` a line (:mod:`radixkv.workload.traces`)
mooncake   Mooncake JSONL, ``{"timestamp": ms, "input_length": n, "hash_ids": [...]}``
sharegpt   ShareGPT conversations, JSON list or JSONL (:mod:`radixkv.workload.sharegpt`): each
           user turn is one request whose prompt is the conversation so far
=========  =====================================================================

Every format streams: a trace larger than memory replays one request at a
time (a ShareGPT JSON *list* is the exception: its text is read whole).
Requests come in file order and timestamps must not decrease; the token and
Mooncake readers stop at the first line that goes backwards, naming it.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Callable, Iterable, Iterator, Optional, Union

from ..errors import ArgumentValueError, TraceFormatError
from .tracefiles import compression, open_binary, read_lines, resolve
from .traces import FORMATS, Request, TraceReader

TRACE_FORMATS = FORMATS + ("sharegpt",)
"""Formats :func:`open_trace` reads."""

_COUNT_LINES_MAX_BYTES = 1 << 30  # beyond this, a progress bar goes without a total


class Trace:
    """A trace file opened by :func:`open_trace`: iterate it (again and again) for its requests.

    Attributes:
        path: the file.
        format: one of :data:`TRACE_FORMATS` (detected when not given).
        skipped: malformed lines skipped by the last iteration (``skip_bad``).
    """

    def __init__(self, path: str, format: str, limit: Optional[int], skip_bad: bool, sharegpt_options: dict) -> None:
        self.path = path
        self.format = format
        self.limit = limit
        self._options = sharegpt_options
        self._skip_bad = skip_bad
        self._skipped = 0
        self._reader = TraceReader(path, format, limit=limit, skip_bad=skip_bad) if format in FORMATS else None

    @property
    def skipped(self) -> int:
        return self._reader.skipped if self._reader is not None else self._skipped

    def _skip(self, error: TraceFormatError) -> None:
        self._skipped += 1

    def __iter__(self) -> Iterator[Request]:
        if self._reader is not None:
            return iter(self._reader)
        return self._sharegpt()

    def _sharegpt(self) -> Iterator[Request]:
        from .sharegpt import load_sharegpt

        self._skipped = 0
        requests = load_sharegpt(self.path, **self._options, on_skip=self._skip if self._skip_bad else None)
        count = 0
        for request in itertools.islice(requests, self.limit) if self.limit is not None else requests:
            count += 1
            yield request
        if count == 0 and self.limit != 0 and self._skipped == 0:
            raise TraceFormatError(self.path, 0, "trace is empty (no user turns)")

    def size_hint(self) -> Optional[int]:
        """Requests to expect, for a progress bar: the line count of a JSONL file below 1 GiB
        (capped at ``limit``), else ``limit`` or ``None``. Cost: one fast read of the file."""
        if self.format == "sharegpt" or os.path.getsize(self.path) > _COUNT_LINES_MAX_BYTES:
            return self.limit
        lines = 0
        with open_binary(self.path) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                lines += chunk.count(b"\n")
        return lines if self.limit is None else min(lines, self.limit)


def detect_format(path: str) -> str:
    """``"sharegpt"``, ``"mooncake"`` or ``"tokens"`` from the first non-blank line of ``path``.

    A first object (or first element of a JSON list, or a JSON list spread over
    lines) with ``conversations`` / ``messages`` is ShareGPT; ``hash_ids`` means
    Mooncake; anything else is read as token JSONL (whose reader then names
    what is wrong).
    """
    for raw in read_lines(path):
        # Undecodable bytes only need to be told apart here; the reader names their line.
        text = raw.decode("utf-8-sig", errors="replace").strip()
        if not text:
            continue
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):  # a JSON list spread over lines is ShareGPT's release layout
            return "sharegpt" if text.startswith("[") else "tokens"
        if isinstance(record, list) and record:
            record = record[0]
        if isinstance(record, dict) and ("conversations" in record or "messages" in record):
            return "sharegpt"
        return "mooncake" if isinstance(record, dict) and "hash_ids" in record else "tokens"
    return "tokens"


TokenizerLike = Union[str, os.PathLike, Callable[[str], Iterable[int]], None]


def open_trace(path: str, format: Optional[str] = None, *, limit: Optional[int] = None, skip_bad: bool = False,
               num_sessions: int = 16, request_rate: float = 1.0, tokenizer: TokenizerLike = None) -> Trace:
    """Open ``path`` for replay; nothing is read beyond the first line until iterated.

    Args:
        format: one of :data:`TRACE_FORMATS`, or ``None`` to detect (:func:`detect_format`).
        limit: stop after this many requests.
        skip_bad: count and skip malformed lines (ShareGPT: malformed conversations; a JSON
            list with broken syntax still raises).
        num_sessions, request_rate: ShareGPT interleaving and synthetic arrival rate
            (see :func:`radixkv.workload.sharegpt.load_sharegpt`).
        tokenizer: for ShareGPT text, the path of a local ``tokenizer.json`` (read with the
            ``tokenizers`` library, :func:`radixkv.workload.hf_tokenizer.load_tokenizer`) or any
            ``text -> ids`` callable; default the built-in :mod:`radixkv.workload.tokenizer`.

    Raises:
        ValueError: an unknown format, a bad ``limit``, a tokenizer file that cannot be read, or
            a tokenizer for a trace that holds token ids (not text).
        MissingExtraError: a tokenizer path without the ``tokenizers`` library.
        OSError: the file cannot be read.

    ``path`` may be gzip- or zstd-compressed, or ``"-"`` for standard input (:mod:`radixkv.workload.tracefiles`).
    """
    path = resolve(os.fspath(path))  # "-": standard input, copied once
    if format is not None and format not in TRACE_FORMATS:
        raise ArgumentValueError(f"format must be one of {TRACE_FORMATS}, got {format!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ArgumentValueError(f"limit must be a non-negative int, got {limit!r}")
    compression(path)  # unreadable, or misnamed compression: fail before anything else
    fmt = format or detect_format(path)
    if tokenizer is not None and fmt != "sharegpt":
        raise ArgumentValueError(f"a tokenizer applies to text (ShareGPT) traces; {path} is a {fmt} trace of "
                                 "token ids")
    if isinstance(tokenizer, (str, os.PathLike)):
        from .hf_tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    return Trace(path, fmt, limit, skip_bad,
                 {"num_sessions": num_sessions, "request_rate": request_rate, "tokenizer": tokenizer})

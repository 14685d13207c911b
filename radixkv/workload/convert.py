"""Write any trace radixkv reads as Mooncake JSONL or token JSONL (``radixkv convert``).

Mooncake's format names each 512-token block of a prompt by a hash id, chained so
that equal ids at a position mean equal prefixes; a real engine's benchmark
(Mooncake's own, vLLM's ``benchmark_serving`` with its Mooncake loader) replays it.
:func:`mooncake_records` gives each distinct (prefix, block) a dense id, so the
converted trace has the original's prefix structure block for block: replayed
at page size 512 (or any multiple) it hits exactly where the original does. At
a page size below 512 a difference is possible only inside a prompt's partial
last block, whose tokens the format cannot carry (an id stands for a whole
block): it expands to other token ids than the original's.
"""

from __future__ import annotations

import hashlib
import os
from typing import IO, Dict, Iterable, Iterator, Tuple, Union

import numpy as np

from ..errors import ArgumentValueError
from ..keys import TOKEN_DTYPE
from .traces import MAX_MOONCAKE_HASH_ID, MOONCAKE_BLOCK_TOKENS, Request
from .tracefiles import replacing

CONVERT_FORMATS = ("mooncake", "tokens")
"""What ``radixkv convert --to`` writes."""


def mooncake_records(requests: Iterable[Request]) -> Iterator[dict]:
    """One Mooncake record a request: ``{"timestamp" (ms, when known), "input_length",
    "output_length", "hash_ids"}``, block ids dense from 0 in order of first sight.

    A block is keyed by its parent's id and a 128-bit BLAKE2b digest of its tokens (a partial
    last block by its own tokens), so memory is O(distinct blocks). Cost: one digest per 512
    tokens.

    Raises:
        ArgumentValueError: a request has a namespace (the format has none), or the trace has
            more distinct blocks than a Mooncake id can name (:data:`MAX_MOONCAKE_HASH_ID`).
    """
    table: Dict[Tuple[int, bytes], int] = {}
    for i, request in enumerate(requests):
        if request.namespace is not None:
            raise ArgumentValueError(f"requests[{i}] has namespace {request.namespace!r}; Mooncake traces have none")
        tokens = np.ascontiguousarray(request.tokens, dtype=TOKEN_DTYPE)
        ids, parent = [], -1
        for start in range(0, len(tokens), MOONCAKE_BLOCK_TOKENS):
            digest = hashlib.blake2b(tokens[start:start + MOONCAKE_BLOCK_TOKENS].tobytes(), digest_size=16).digest()
            parent = table.setdefault((parent, digest), len(table))
            if parent > MAX_MOONCAKE_HASH_ID:
                raise ArgumentValueError(f"requests[{i}]: more than {MAX_MOONCAKE_HASH_ID + 1:,} distinct blocks, "
                                         "more than Mooncake hash ids can name")
            ids.append(parent)
        record: dict = {}
        if request.timestamp is not None:
            ms = round(request.timestamp * 1000, 6)
            record["timestamp"] = int(ms) if ms == int(ms) else ms
        record.update(input_length=len(tokens), output_length=request.output_length, hash_ids=ids)
        yield record


def convert(requests: Iterable[Request], to: str, out: Union[str, os.PathLike, IO[str]]) -> int:
    """Write ``requests`` to ``out`` (a path, replaced only once all is written, or an open text file)
    as ``to`` (:data:`CONVERT_FORMATS`); return the requests written. Streams: O(one request)
    memory beside the block table.

    Raises:
        ArgumentValueError: an unknown ``to``, or as :func:`mooncake_records`.
    """
    import json

    from .generators import write_token_jsonl

    if to not in CONVERT_FORMATS:
        raise ArgumentValueError(f"to must be one of {', '.join(CONVERT_FORMATS)}, got {to!r}")
    if to == "tokens":
        return write_token_jsonl(requests, out)

    def write(f: IO[str]) -> int:
        count = 0
        for record in mooncake_records(requests):
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
            count += 1
        return count

    if isinstance(out, (str, os.PathLike)):
        with replacing(out) as f:
            return write(f)
    return write(out)

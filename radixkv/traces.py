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

from .errors import TraceFormatError

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

"""radixkv: a radix-tree prefix cache for LLM KV blocks.

Serving engines embed :class:`PrefixCache` to reuse the KV of shared prompt
prefixes across requests: a radix tree over page-aligned token prefixes, a
paged block pool, pluggable eviction (:mod:`radixkv.policies`), and trace
replay (:mod:`radixkv.analysis.replay`, the ``radixkv`` command). Scripts replay,
sweep and curve traces through :mod:`radixkv.api`.
"""

from .cache import Admission, CacheStats, MatchResult, NodeHandle, PrefixCache
from .errors import (
    ArgumentTypeError,
    ArgumentValueError,
    InvalidBlocksError,
    InvalidTokensError,
    LockError,
    RadixKVError,
    StaleHandleError,
    TraceFormatError,
    UnknownPolicyError,
)
from .token_buffer import TokenBuffer

__version__ = "0.1.0"

__all__ = [
    "Admission", "CacheStats", "MatchResult", "NodeHandle", "PrefixCache", "TokenBuffer",
    "RadixKVError", "ArgumentTypeError", "ArgumentValueError", "InvalidBlocksError",
    "InvalidTokensError", "LockError", "StaleHandleError", "TraceFormatError", "UnknownPolicyError",
]

"""radixkv's mirrors of the types SGLang 0.5.23's ``BasePrefixCache`` uses, or SGLang's own.

When ``sglang`` is importable, every name here (``MatchPrefixParams``,
``InsertParams``, ``MatchResult``, ``RadixKey``, ...) **is** SGLang's class and
:data:`SGLANG_BASE` is its ``BasePrefixCache``; otherwise they are the mirrors
below (same field names and order) and :class:`StandaloneBase` stands in for
the base class. Layer: adapter types; imports nothing of radixkv but its errors.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

from ...errors import ArgumentTypeError

SGLANG_TARGET_VERSION = "0.5.23"
"""The SGLang release whose ``BasePrefixCache`` this adapter follows."""


# ---------------------------------------------------------------- radixkv's mirrors of SGLang's types
# Field names and order follow SGLang 0.5.23 so code written against SGLang reads
# them unchanged. Results are mutable dataclasses, as SGLang's are: its
# scheduler accumulates into an EvictResult in place.
class _RadixKey:
    """SGLang's radix key: token ids plus the namespace (``extra_key``, ``cache_salt``).

    ``limit`` caps the tokens used (``token_ids[:limit]`` without copying).
    ``extra_key`` (LoRA adapter) and ``cache_salt`` (tenant) isolate caches:
    keys that differ in either never share a page.
    """

    __slots__ = ("token_ids", "extra_key", "cache_salt", "is_bigram", "limit")

    def __init__(self, token_ids: Sequence[int], extra_key: Optional[str] = None,
                 is_bigram: bool = False, limit: Optional[int] = None,
                 cache_salt: Optional[str] = None) -> None:
        self.token_ids = token_ids
        self.extra_key = extra_key
        self.cache_salt = cache_salt or None
        self.is_bigram = is_bigram
        self.limit = limit

    def raw_token_ids(self) -> Sequence[int]:
        """``token_ids`` honouring ``limit``."""
        if self.limit is not None and self.limit < len(self.token_ids):
            return self.token_ids[: self.limit]
        return self.token_ids

    def __len__(self) -> int:
        return len(self.raw_token_ids())

    def __getitem__(self, index: slice) -> "_RadixKey":
        if not isinstance(index, slice):
            raise ArgumentTypeError(f"RadixKey supports slicing only, got {index!r}")
        return _RadixKey(self.raw_token_ids()[index], self.extra_key, cache_salt=self.cache_salt)

    def __repr__(self) -> str:
        return f"RadixKey(len={len(self)}, extra_key={self.extra_key!r}, cache_salt={self.cache_salt!r})"


@dataclasses.dataclass
class _MatchPrefixParams:
    key: Any
    cow_mamba: bool = False
    req: Any = None


@dataclasses.dataclass
class _InsertParams:
    key: Any = None
    value: Any = None
    priority: int = 0
    inserted_len: int = 0


@dataclasses.dataclass
class _InsertResult:
    prefix_len: int
    total_len: int = 0
    last_device_node: Any = None


@dataclasses.dataclass
class _EvictParams:
    num_tokens: int = 0
    swa_num_tokens: int = 0
    mamba_num: int = 0


@dataclasses.dataclass
class _EvictResult:
    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0


@dataclasses.dataclass
class _DecLockRefParams:
    node_id: Optional[int] = None
    skipped_lock_components: tuple = ()
    component_lock_uuids: dict = dataclasses.field(default_factory=dict)
    component_host_lock_uuids: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _IncLockRefResult:
    delta: Optional[int] = None
    node_id: Optional[int] = None
    skipped_lock_components: tuple = ()
    component_lock_uuids: dict = dataclasses.field(default_factory=dict)
    component_host_lock_uuids: dict = dataclasses.field(default_factory=dict)

    def to_dec_params(self) -> _DecLockRefParams:
        """The receipt ``dec_lock_ref`` takes back."""
        return _DecLockRefParams(self.node_id, tuple(self.skipped_lock_components),
                                 dict(self.component_lock_uuids), dict(self.component_host_lock_uuids))


@dataclasses.dataclass
class _DecLockRefResult:
    delta: Optional[int] = None


@dataclasses.dataclass
class _TreeLock:
    node: Any
    receipt: Any
    swa_released: bool = False


class _MatchResult(NamedTuple):
    device_prefix_len: int
    last_device_node: Any
    last_host_node: Any
    best_match_node: Any
    host_hit_length: int = 0
    swa_host_hit_length: int = 0
    swa_branching_seqlen: Optional[int] = None
    mamba_host_hit_length: int = 0
    mamba_branching_seqlen: Optional[int] = None
    cache_protected_len: Optional[int] = None
    full_kv_hit_length: int = 0
    cache_actions: Sequence[Any] = ()
    last_visited_node_id: Optional[int] = None
    full_device_match_len: Optional[int] = None



class StandaloneBase:
    """The ``BasePrefixCache`` methods SGLang's scheduler calls on a plain cache, for use without SGLang.

    Only the base class of :class:`RadixKVCache` when ``sglang`` is not
    importable; with SGLang, its own ``BasePrefixCache`` takes this place.
    Subclasses provide ``req_to_token_pool``, ``token_to_kv_pool_allocator``,
    ``inc_lock_ref``, ``dec_lock_ref``, ``evict``, ``path_device_indices`` and
    ``root_node``.
    """

    def lock(self, node: Any) -> Any:
        """Take one tree lock on ``node``; :meth:`unlock` gives it back."""
        return TreeLock(node, self.inc_lock_ref(node).to_dec_params())

    def unlock(self, lock: Any) -> None:
        """Release a lock from :meth:`lock` (``None`` is a no-op)."""
        if lock is not None:
            self.dec_lock_ref(lock.node, lock.receipt)

    def prefix_device_indices(self, req: Any) -> Any:
        """Slot indices of ``req``'s matched prefix (``req.prefix_len`` tokens on the path to ``req.last_node``)."""
        return self.path_device_indices(req.last_node)[: req.prefix_len]

    def evict_for_alloc(self, params: Any, *, allocation_reclaim_satisfied: Any = None) -> Any:
        """Evict to make room for an allocation: a plain :meth:`evict` here."""
        if allocation_reclaim_satisfied is not None:
            raise NotImplementedError("joint reclaim is not supported by this cache")
        return self.evict(params)

    def free_kv_row(self, kv: Any, ranges: List[Tuple[int, int]]) -> None:
        """Free the half-open row positions ``ranges`` of ``kv``'s row, each page once.

        Ranges are ascending and disjoint; touching ones are merged first so a
        page straddling their seam is freed once.
        """
        merged: List[List[int]] = []
        for start, end in ranges:
            if start >= end:
                continue
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
        for start, end in merged:
            self.token_to_kv_pool_allocator.free(row[start:end])

    def root_node_handle(self, extra_key: Optional[str] = None) -> Any:
        return self.root_node

    def resolve_node_handle(self, node_handle: Any) -> Any:
        return node_handle

    def claim_kv_row(self, req: Any) -> bool:
        """No streaming sessions: the request's row is always released by the caller."""
        return False

    def maybe_hand_to_session(self, req: Any) -> None:
        pass

    def on_release(self, req: Any, *, checkpointed: bool) -> None:
        pass

    def release_aborted_request(self, handle: Any) -> None:
        """Nothing to drop: this cache keeps no per-attempt (prefetch) state."""

    def finish(self, handle: Any, outcome: Any) -> None:
        """End of a request attempt (SGLang's ``CacheRequestOutcome`` ``SUCCESS`` or ``ABORT``).

        An aborted request's row is then released without a checkpoint
        (``release_kv_cache(req, tree, checkpoint=False)``): :meth:`free_kv_row`
        frees its own pages and :meth:`unlock` its matched prefix; nothing of it
        is cached.
        """
        if getattr(outcome, "name", outcome) != "SUCCESS":
            self.release_aborted_request(handle)

    def supports_mamba(self) -> bool:
        return False

    def supports_swa(self) -> bool:
        return False

    def supports_fast_match_prefix(self) -> bool:
        return False

    def swa_reprefill_tail_tokens(self, req: Any = None) -> int:
        return 0

    def full_evictable_size(self) -> int:
        return self.evictable_size()

    def full_protected_size(self) -> int:
        return self.protected_size()


try:  # SGLang's own types when it is installed; the mirrors above otherwise
    from sglang.srt.mem_cache.base_prefix_cache import (  # type: ignore
        BasePrefixCache as _SGLangBase,
        DecLockRefParams,
        DecLockRefResult,
        EvictParams,
        EvictResult,
        IncLockRefResult,
        InsertParams,
        InsertResult,
        MatchPrefixParams,
        MatchResult,
        TreeLock,
    )
    from sglang.srt.mem_cache.radix_cache import RadixKey  # type: ignore
    from sglang.srt.disaggregation import kv_events as _sgl_events  # type: ignore
except ImportError:
    _SGLangBase = None
    _sgl_events = None
    DecLockRefParams, DecLockRefResult = _DecLockRefParams, _DecLockRefResult
    EvictParams, EvictResult = _EvictParams, _EvictResult
    IncLockRefResult, InsertParams, InsertResult = _IncLockRefResult, _InsertParams, _InsertResult
    MatchPrefixParams, MatchResult, TreeLock = _MatchPrefixParams, _MatchResult, _TreeLock
    RadixKey = _RadixKey

SGLANG_BASE = _SGLangBase
"""SGLang's ``BasePrefixCache`` when ``sglang`` is importable (the adapter subclasses it), else ``None``."""


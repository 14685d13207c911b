"""A drop-in for SGLang's ``RadixCache``, backed by :class:`~radixkv.PrefixCache`.

Target: **SGLang 0.5.23** (``python/sglang/srt/mem_cache/base_prefix_cache.py``,
``radix_cache.py``, and the scheduler's calls in ``mem_cache/common.py``,
``mem_cache/allocation.py`` and ``managers/schedule_policy.py``).
:class:`RadixKVCache` implements every abstract method of that release's
``BasePrefixCache`` with the same parameter names, kinds and defaults, plus the
methods ``RadixCache`` overrides:

* ``match_prefix(params: MatchPrefixParams) -> MatchResult(device_prefix_len,
  last_device_node, last_host_node, best_match_node, ...)``
* ``checkpoint(req, *, up_to)``: insert the request's KV up to row position
  ``up_to``, repoint its row at the tree's copies, move ``req.lock`` /
  ``req.last_node``, advance ``req.kv.cache_protected_len``. Frees only
  duplicates; SGLang's ``release_kv_cache`` frees the rest.
* ``evict(params: EvictParams) -> EvictResult``
* ``inc_lock_ref(node) -> IncLockRefResult``, ``dec_lock_ref(node, params=None)
  -> DecLockRefResult`` (``delta`` = change in evictable tokens)
* ``insert(params: InsertParams) -> InsertResult``, ``path_device_indices(node)``,
  ``touch_prefix(key)``, ``evictable_size()``, ``protected_size()``,
  ``total_size()``, ``reset()``, ``take_events()``, ``supports_prefix_sharing()``

When ``sglang`` is importable, :class:`RadixKVCache` *subclasses* SGLang's
``BasePrefixCache`` and every type here (``MatchResult``, ``EvictResult``,
``IncLockRefResult``, ``MatchPrefixParams``, ``RadixKey``, ...) **is** SGLang's
own, so the scheduler's other calls (``lock``/``unlock``, ``free_kv_row``,
``prefix_device_indices``, ``evict_for_alloc``, the SWA/mamba/storage hooks)
run SGLang's base implementations, and ``take_events()`` returns SGLang's
``kv_events`` structs (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``;
hashes as int64, ``cache_salt`` filled in), which its scheduler wraps in a
``KVEventBatch`` and publishes. Without SGLang, the types are radixkv's
mirrors (same field names and order; events from :mod:`radixkv.events`) and
:class:`StandaloneBase` provides the subset of those base methods a plain
(non-SWA, non-mamba, no host tier) cache needs. :data:`SGLANG_BASE` says which
one is in use.

What differs from SGLang 0.5.5, which earlier versions of this adapter
followed: ``cache_finished_req`` / ``cache_unfinished_req`` are gone (SGLang
calls ``checkpoint`` and then frees the row itself); ``match_prefix``,
``insert`` and ``evict`` take parameter objects; ``MatchResult`` carries
``device_prefix_len`` (the indices are read with ``path_device_indices``) and
``best_match_node``; lock calls and ``evict`` return result objects, not ints;
requests keep their row state in ``req.kv`` (``req_pool_idx``,
``cache_protected_len``) and their lock in ``req.lock``. For existing callers,
``match_prefix(RadixKey)`` and ``insert(RadixKey, value)`` (the 0.5.5 calling
convention) still work and return :class:`LegacyMatchResult` / ``int``.

Not supported: EAGLE bigram keys (``RadixKey.is_bigram``), SWA and mamba
components, HiCache host tiers, the ``dfs-weight`` schedule policy's
``dfs_weight_order`` (it walks SGLang tree nodes; radixkv hands out handles),
and the eviction policies ``mru``, ``filo``, ``priority`` and ``tlru`` (refused
with an error; :data:`SGLANG_EVICTION_POLICIES` maps the others).

Mapping. SGLang addresses KV by token slot; its paged allocator hands out
page-aligned runs, slot ``= page * page_size + offset``. radixkv's block id is
SGLang's page index (the slot itself when ``page_size == 1``), and a
:class:`~radixkv.cache.NodeHandle` is SGLang's "node". Every block radixkv
does not cache is *held* by SGLang (its allocator or a request): the adapter
takes the whole pool at start, hands evicted and duplicate blocks straight
back to SGLang's allocator, and so never owns a free block between calls.
``RadixKey.extra_key`` (LoRA id) and ``cache_salt`` (tenant) together name
radixkv's ``namespace``: ``json.dumps([extra_key, cache_salt])``, or the
default namespace when both are unset, so distinct pairs never share a page,
as in SGLang. Aborted requests (SGLang's ``release_kv_cache`` without a
checkpoint) cache nothing: their own pages go back to the allocator, and no
checkpoint caches a position past the request's committed KV. Index tensors
may be torch tensors (results come back as int64 tensors on the pool's
device) or numpy arrays.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from ...cache import NodeHandle, PrefixCache
from ...errors import ArgumentTypeError, ArgumentValueError, InvalidBlocksError, RadixKVError
from ... import events as _rk
from ... import policies as _policies
from ...keys import check_positive_int

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


class LegacyMatchResult(NamedTuple):
    """What ``match_prefix(RadixKey)`` returns: SGLang 0.5.5's ``MatchResult`` (same fields).

    Attributes:
        device_indices: token-slot indices of the matched prefix (int64).
        last_device_node: handle of the deepest matched node.
        last_host_node: same as ``last_device_node`` (no host tier behind this adapter).
        host_hit_length: always 0.
    """

    device_indices: Any
    last_device_node: Any
    last_host_node: Any
    host_hit_length: int = 0


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


def _to_numpy(indices: Any) -> np.ndarray:
    """Token-slot indices (torch tensor, numpy array or list) as a 1-D int64 numpy array."""
    if hasattr(indices, "detach"):  # torch.Tensor, without importing torch
        indices = indices.detach().cpu().numpy()
    arr = np.asarray(indices)
    if arr.ndim != 1:
        raise InvalidBlocksError(f"kv indices must be 1-D, got shape {arr.shape}")
    if arr.size and (arr.dtype.kind not in "iu" or arr.dtype == np.bool_):
        raise ArgumentTypeError(f"kv indices must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def namespace_of(extra_key: Optional[str], cache_salt: Optional[str]) -> Optional[str]:
    """radixkv namespace of SGLang's (``extra_key``, ``cache_salt``) pair. O(len of both).

    What a router hashes as vLLM's ``cache_salt`` (``VLLMBlockView.block_hashes``)
    to find the pages this adapter cached for the pair.

    ``None`` (the default namespace) for ``(None, None)``; every other pair is
    ``json.dumps([extra_key, cache_salt])``, salted or not. One encoding for
    every pair makes the map injective by construction (``json.loads`` inverts
    it), so no ``extra_key`` text can spell another pair's namespace, as SGLang
    keeps them apart too; ``json.dumps`` escapes non-ASCII, so the namespace is
    always encodable. An empty ``cache_salt`` is no salt (SGLang's ``RadixKey``
    does the same); an empty ``extra_key`` is a key of its own, as in SGLang.
    Raises :class:`ArgumentTypeError` unless both are ``str`` or ``None``.
    """
    for name, value in (("extra_key", extra_key), ("cache_salt", cache_salt)):
        if value is not None and type(value) is not str:
            raise ArgumentTypeError(f"{name} must be a str or None, got {value!r}")
    if not cache_salt:
        if extra_key is None:
            return None
        cache_salt = None
    return json.dumps([extra_key, cache_salt])


def _cache_salt(namespace: Optional[str]) -> Optional[str]:
    """The ``cache_salt`` of a namespace made by :func:`namespace_of` (``None`` when unsalted or foreign)."""
    if namespace is None:
        return None
    try:
        pair = json.loads(namespace)
    except (TypeError, ValueError):  # a namespace given to the cache underneath directly
        return None
    if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], str):
        return pair[1]
    return None


SGLANG_EVICTION_POLICIES: Dict[str, Optional[Tuple[str, Dict[str, Any]]]] = {
    "lru": ("lru", {}),
    "lfu": ("lfu", {"aging": False}),
    "fifo": ("fifo", {}),
    "slru": ("slru", {}),
    "mru": None,
    "filo": None,
    "priority": None,
    "tlru": None,
}
"""SGLang 0.5.23's ``--radix-eviction-policy`` names -> (radixkv policy, its options), ``None`` where
radixkv has no counterpart.

Each mapped policy ranks as SGLang's ``evict_policy.py`` strategy does:
``lru`` by last use; ``lfu`` by (uses, last use) with no aging (radixkv's own
``lfu`` is LFU-DA, reachable here as ``lfu-da``); ``fifo`` by the time the
pages were cached (a split keeps it, where SGLang's split gives the shared
upper part a new creation time); ``slru`` by (used at least
``protected_threshold`` times, last use). Uses are counted in more places
than SGLang's hits: SGLang counts one per request that inserts through a page;
radixkv counts every match and insert (a reusing request adds two, each
checkpoint of a chunked prefill one more, ``touch_prefix`` one). The adapter's
lookup after its own insert is not a use, so a page one request cached has
one use in both, and ``slru``'s default threshold 2 protects it at its first
reuse in both.
``mru``/``filo`` (newest first), ``priority`` (per-request priority) and
``tlru`` (a per-conversation token budget) have no radixkv policy and are
refused rather than replaced.
"""


def _eviction_policy(policy: Union[str, "_policies.EvictionPolicy"],
                     config: Optional[Dict[str, Any]]) -> "_policies.EvictionPolicy":
    """The radixkv policy for SGLang's ``eviction_policy`` name (or a radixkv name) and options.

    SGLang's names take precedence (:data:`SGLANG_EVICTION_POLICIES`, any
    case, as SGLang lowercases them); other names are radixkv policies.
    ``config`` (SGLang's ``eviction_policy_config``) goes to the policy's
    constructor as keyword arguments. Raises :class:`ArgumentValueError`
    naming the policy and the supported ones, or the option that does not fit.
    """
    if isinstance(policy, _policies.EvictionPolicy):
        if config:
            raise ArgumentValueError(f"eviction_policy_config applies to a policy name, not to {policy!r}")
        return policy
    if not isinstance(policy, str):
        raise ArgumentTypeError(f"eviction_policy must be a policy name or an EvictionPolicy, got {policy!r}")
    if config is not None and not isinstance(config, dict):
        raise ArgumentTypeError(f"eviction_policy_config must be a dict or None, got {config!r}")
    name = policy.lower()
    options: Dict[str, Any] = {}
    target = SGLANG_EVICTION_POLICIES.get(name)
    sglangs = name in SGLANG_EVICTION_POLICIES
    if target is None and (sglangs or name not in _policies.available(include_aliases=True)):
        why = "has no radixkv counterpart" if sglangs else "is unknown"
        raise ArgumentValueError(
            f"eviction policy {policy!r} {why}; supported SGLang policies: "
            f"{', '.join(sorted(n for n, t in SGLANG_EVICTION_POLICIES.items() if t))}; "
            f"radixkv policies: {', '.join(_policies.available(include_aliases=True))}")
    if target is not None:
        name, options = target
    try:
        return _policies.create(name, **{**options, **(config or {})})
    except TypeError as exc:
        if isinstance(exc, RadixKVError):
            raise
        raise ArgumentValueError(f"eviction_policy_config {config!r} does not fit policy {policy!r}: {exc}") from None


def _int64(block_hash: int) -> int:
    """radixkv's unsigned 64-bit event hash as the signed int64 SGLang's events carry (same 64 bits)."""
    return block_hash - (1 << 64) if block_hash >= 1 << 63 else block_hash


class _SGLangEvents:
    """Turns radixkv's events into SGLang 0.5.23's ``kv_events`` structs, one for one.

    ``BlockStored`` keeps radixkv's hashes (as int64), parent hash, tokens (all
    pages of the event, concatenated) and ``block_size``; ``lora_id``,
    ``session_id`` and ``lora_name`` are ``None`` (radixkv keys adapters by
    namespace and has no LoRA name table); ``cache_salt`` is the salt of the
    page's namespace. radixkv names the namespace only on a sequence's first
    page (``extra_keys``), so this remembers the namespace of every salted
    cached page, by hash, until its ``BlockRemoved``: one dict entry per cached
    page of a salted namespace. Tier moves become their plain store/remove
    events. Cost: O(pages) per event.
    """

    __slots__ = ("_salt_of",)

    _MEDIUM = {_rk.MEDIUM_GPU: "GPU", _rk.MEDIUM_CPU: "CPU", _rk.MEDIUM_DISK: "DISK", _rk.MEDIUM_REMOTE: "EXTERNAL"}

    def __init__(self) -> None:
        self._salt_of: dict = {}  # radixkv hash of a cached page in a salted namespace -> its cache_salt

    def _medium(self, medium: Optional[str]) -> Any:
        name = self._MEDIUM.get(medium) if medium is not None else None
        return medium if name is None else _sgl_events.StorageMedium[name]

    def convert(self, events: List[_rk.KVCacheEvent]) -> list:
        out: list = []
        for event in events:
            if isinstance(event, (_rk.BlockDemoted, _rk.BlockPromoted)):
                out.extend(self._one(e) for e in event.as_store_remove())
            else:
                out.append(self._one(event))
        return out

    def _one(self, event: _rk.KVCacheEvent) -> Any:
        if isinstance(event, _rk.BlockStored):
            if event.extra_keys and event.extra_keys[0]:
                salt = _cache_salt(event.extra_keys[0][0])
            else:
                salt = self._salt_of.get(event.parent_block_hash)
            if salt is not None:
                self._salt_of.update(dict.fromkeys(event.block_hashes, salt))
            parent = event.parent_block_hash
            return _sgl_events.BlockStored(
                block_hashes=[_int64(h) for h in event.block_hashes],
                parent_block_hash=None if parent is None else _int64(parent),
                token_ids=list(event.token_ids), block_size=event.block_size, lora_id=event.lora_id,
                medium=self._medium(event.medium), cache_salt=salt, session_id=None, lora_name=event.lora_name)
        if isinstance(event, _rk.BlockRemoved):
            if self._salt_of:
                for h in event.block_hashes:
                    self._salt_of.pop(h, None)
            return _sgl_events.BlockRemoved(block_hashes=[_int64(h) for h in event.block_hashes],
                                            medium=self._medium(event.medium))
        if isinstance(event, _rk.AllBlocksCleared):
            self._salt_of.clear()
            return _sgl_events.AllBlocksCleared()
        raise ArgumentTypeError(f"no SGLang counterpart for radixkv event {event!r}")


class RadixKVCache(_SGLangBase or StandaloneBase):  # type: ignore[misc]
    """SGLang 0.5.23's ``RadixCache`` interface over a radixkv :class:`~radixkv.PrefixCache`.

    Args:
        req_to_token_pool: SGLang's ``ReqToTokenPool`` (``req_to_token`` 2-D
            indices, ``write((row, slice), values)``).
        token_to_kv_pool_allocator: SGLang's allocator (``free(indices)``;
            ``size`` in tokens when ``num_pages`` is not given).
        page_size: tokens per page (SGLang's ``--page-size``).
        num_pages: pages in SGLang's KV pool including the reserved page 0;
            default ``allocator.size // page_size + 1``.
        eviction_policy: SGLang's ``--radix-eviction-policy`` name (see
            :data:`SGLANG_EVICTION_POLICIES`; names radixkv cannot honour raise
            :class:`~radixkv.errors.ArgumentValueError`), another radixkv policy
            name (:func:`radixkv.policies.available`), or a policy instance.
        eviction_policy_config: SGLang's ``--radix-eviction-policy-config``:
            keyword arguments of the policy (e.g. ``{"protected_threshold": 3}``
            for ``slru``).
        enable_kv_cache_events: record KV events for :meth:`take_events`.
        disable: behave like SGLang with ``--disable-radix-cache`` (nothing is cached).
    """

    def __init__(
        self,
        req_to_token_pool: Any,
        token_to_kv_pool_allocator: Any,
        page_size: int = 1,
        *,
        num_pages: Optional[int] = None,
        eviction_policy: Union[str, "_policies.EvictionPolicy"] = "lru",
        eviction_policy_config: Optional[Dict[str, Any]] = None,
        enable_kv_cache_events: bool = False,
        disable: bool = False,
    ) -> None:
        page_size = check_positive_int(page_size, "page_size")
        if num_pages is None:
            size = getattr(token_to_kv_pool_allocator, "size", None)
            if size is None:
                raise ArgumentValueError("num_pages is required when token_to_kv_pool_allocator has no .size")
            num_pages = int(size) // page_size + 1
        num_pages = check_positive_int(num_pages, "num_pages")
        # As SGLang: a disabled cache never evicts, so its policy is not built or checked.
        policy = _eviction_policy("lru" if disable else eviction_policy, None if disable else eviction_policy_config)
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.disable = bool(disable)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.cache = PrefixCache(num_pages, page_size, policy=policy,
                                 enable_events=self.enable_kv_cache_events)
        """The radixkv cache underneath (its block ids are SGLang page indices)."""
        self.cache.allocate(num_pages)  # every block starts out held by SGLang
        self._offsets = np.arange(page_size, dtype=np.int64)
        self._device = None
        table = getattr(req_to_token_pool, "req_to_token", None)
        if table is not None and type(table).__module__.startswith("torch"):
            self._device = table.device
        self._roots: dict = {}
        self._events = _SGLangEvents() if _sgl_events is not None else None

    @classmethod
    def from_params(cls, params: Any, **kwargs: Any) -> "RadixKVCache":
        """Build from SGLang's ``CacheInitParams`` (what its cache factories receive).

        Reads ``req_to_token_pool``, ``token_to_kv_pool_allocator``,
        ``page_size``, ``disable``, ``enable_kv_cache_events``,
        ``eviction_policy`` and ``eviction_policy_config``; ``kwargs`` go to
        the constructor and take precedence (``eviction_policy``, ``num_pages``).
        """
        if getattr(params, "is_eagle", False):
            raise ArgumentValueError("RadixKVCache does not support EAGLE bigram keys (params.is_eagle=True)")
        kwargs.setdefault("eviction_policy", getattr(params, "eviction_policy", "lru"))
        kwargs.setdefault("eviction_policy_config", getattr(params, "eviction_policy_config", None))
        return cls(params.req_to_token_pool, params.token_to_kv_pool_allocator, params.page_size,
                   enable_kv_cache_events=bool(getattr(params, "enable_kv_cache_events", False)),
                   disable=bool(params.disable), **kwargs)

    # ------------------------------------------------------------ conversions
    def _out(self, indices: np.ndarray) -> Any:
        """int64 indices in the engine's type: a torch tensor on the pool's device, else numpy."""
        if self._device is None:
            return indices.astype(np.int64, copy=True)
        import torch  # only when SGLang hands us torch tensors

        return torch.as_tensor(indices, dtype=torch.int64, device=self._device)

    def _slots(self, blocks: np.ndarray) -> np.ndarray:
        if self.page_size == 1:
            return blocks.astype(np.int64)
        return (blocks.astype(np.int64)[:, None] * self.page_size + self._offsets).ravel()

    def _blocks(self, slots: np.ndarray) -> np.ndarray:
        """Page ids of page-aligned token ``slots`` (a whole number of pages)."""
        p = self.page_size
        if p == 1:
            return slots
        blocks = slots[::p] // p
        if not np.array_equal(slots.reshape(-1, p), blocks[:, None] * p + self._offsets):
            raise InvalidBlocksError(
                f"kv indices are not whole pages of page_size {p} (slot = page * {p} + offset)")
        return blocks

    @staticmethod
    def _key(key: Any) -> Tuple[Any, Optional[str]]:
        """(tokens, namespace) of a ``RadixKey``."""
        if getattr(key, "is_bigram", False):
            raise ArgumentValueError(f"bigram (EAGLE) keys are not supported, got {key!r}")
        raw = getattr(key, "raw_token_ids", None)
        tokens = raw() if raw is not None else key.token_ids
        return tokens, namespace_of(getattr(key, "extra_key", None), getattr(key, "cache_salt", None))

    def _free(self, slots: np.ndarray) -> None:
        if len(slots):
            self.token_to_kv_pool_allocator.free(self._out(slots))

    def _insert(self, tokens: Any, blocks: np.ndarray, namespace: Optional[str],
                free_declined: bool) -> int:
        """radixkv insert; returns pages already cached. Declined pages are freed if ``free_declined``."""
        cache = self.cache
        declined = cache.declined_blocks
        present = cache.insert(tokens, blocks, namespace=namespace)
        # Duplicates and declined pages went back to radixkv's pool: SGLang holds them again.
        cache.allocate(cache.num_free_blocks)
        declined = cache.declined_blocks - declined
        if declined and free_declined:
            self._free(self._slots(blocks[len(blocks) - declined :]))
        return present

    def _insert_slots(self, key: Any, value: Any) -> Tuple[int, Any, Optional[str], int]:
        """Insert ``key``'s full pages held in slots ``value``: (tokens present, tokens, namespace, full tokens)."""
        tokens, namespace = self._key(key)
        if value is None:
            raise ArgumentValueError("insert needs value (the kv slot indices of key's tokens), got None")
        slots = _to_numpy(value)
        if len(slots) < len(tokens):
            raise ArgumentValueError(f"value must hold one slot per token ({len(tokens)}), got {len(slots)}")
        n = len(tokens) // self.page_size * self.page_size
        if self.disable:
            return 0, tokens, namespace, n
        present = self._insert(tokens[:n], self._blocks(slots[:n]), namespace, free_declined=True)
        return present * self.page_size, tokens, namespace, n

    def _cached_path(self, tokens: Any, namespace: Optional[str]) -> Tuple[NodeHandle, np.ndarray]:
        """Handle and blocks of the cached page prefix of ``tokens``, without marking a use.

        The adapter looks up what it has just inserted. Counting that lookup
        as a use would give every new page a second use at once: ``slru``
        would protect it, ``lfu`` count it twice, ``sieve`` mark it visited.
        Cost: one read-only walk (a match, which splits, only if the walk
        ends inside a node, which an insert of ``tokens`` just ruled out).
        """
        cache = self.cache
        m = cache.peek_match(tokens, namespace=namespace)
        if m.num_tokens < cache.cached_pages(tokens, namespace=namespace) * self.page_size:
            m = cache.match(tokens, namespace=namespace)
        return m.node, m.blocks

    # ------------------------------------------------------------ BasePrefixCache (SGLang 0.5.23)
    @property
    def root_node(self) -> NodeHandle:
        """Handle of the default namespace's root (what an empty match returns)."""
        return self.root_node_handle()

    def root_node_handle(self, extra_key: Optional[str] = None) -> NodeHandle:
        """Handle of the root of unsalted ``extra_key``'s namespace (SGLang passes no salt here)."""
        namespace = namespace_of(extra_key, None)
        root = self._roots.get(namespace)
        if root is None or root._node.gen < 0:
            root = self._roots[namespace] = self.cache.match([], namespace=namespace).node
        return root

    def reset(self):
        """Drop every cached page. Like SGLang, the allocator is reset by the caller, not here."""
        self.cache.reset()
        self.cache.allocate(self.cache.num_free_blocks)
        self._roots.clear()

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """Longest cached page-aligned prefix of ``params.key`` (SGLang's ``MatchPrefixParams``).

        Marks the matched pages used; does not lock them (``lock`` /
        ``inc_lock_ref`` does). The slots are ``path_device_indices(result.last_device_node)``.
        Given a bare ``RadixKey`` (SGLang 0.5.5's convention), returns a
        :class:`LegacyMatchResult` with the slots. Cost: one radixkv match.
        """
        legacy = not hasattr(params, "key")
        tokens, namespace = self._key(params if legacy else params.key)
        if self.disable:
            tokens = []
        m = self.cache.match(tokens, namespace=namespace)
        if legacy:
            return LegacyMatchResult(self._out(self._slots(m.blocks)), m.node, m.node, 0)
        return MatchResult(device_prefix_len=m.num_tokens, last_device_node=m.node,
                           last_host_node=m.node, best_match_node=m.node)

    def touch_prefix(self, key: Any) -> None:
        """Mark the cached prefix of ``key`` used (a match without a result)."""
        if not self.disable:
            tokens, namespace = self._key(key)
            self.cache.match(tokens, namespace=namespace)

    def path_device_indices(self, node: NodeHandle) -> Any:
        """Slot indices of every page from the root through ``node``. O(depth + pages)."""
        return self._out(self._slots(self.cache.path_blocks(node)))

    def insert(self, params: InsertParams, value: Any = None) -> InsertResult:
        """Cache ``params.key``'s full pages held in the slots ``params.value``.

        Returns ``InsertResult(prefix_len=tokens already cached,
        last_device_node=handle of the key's deepest cached page)``. The tree
        takes ownership of the new pages; the caller frees its own copies of
        the already-cached ones (``value[protected:prefix_len]``), as with
        SGLang. New pages the eviction policy declines are freed here.
        ``insert(RadixKey, value)`` (SGLang 0.5.5's convention) returns the int.
        """
        if not hasattr(params, "key"):  # bare RadixKey
            return self._insert_slots(params, value)[0]
        present, tokens, namespace, n = self._insert_slots(params.key, params.value)
        return InsertResult(prefix_len=present, last_device_node=self._cached_path(tokens[:n], namespace)[0])

    def checkpoint(self, req, *, up_to: int, **kwargs):
        """Cache ``req``'s KV for row positions ``[0, up_to)`` and re-anchor the request on it.

        Reads ``req.full_untruncated_fill_ids``, ``req.kv.req_pool_idx``,
        ``req.kv.cache_protected_len``, ``req.extra_key``, ``req.cache_salt``;
        frees the request's duplicate copies of pages the tree already held,
        rewrites its row to the tree's copies, sets
        ``req.kv.cache_protected_len`` to the cached length, and moves
        ``req.lock`` / ``req.last_node`` to the new end. Partial pages and pages
        the policy declines stay the request's (SGLang's ``release_kv_cache``
        frees them). Positions past ``req.kv.kv_committed_len`` are never
        cached, whatever ``up_to`` says: their KV has not been computed, and a
        cached page must hold its prefix's KV. Cost: one radixkv insert and
        one read-only walk.
        """
        if self.disable:
            return
        kv = req.kv
        p = self.page_size
        committed = getattr(kv, "kv_committed_len", None)
        if committed is not None and committed < up_to:
            up_to = committed
        token_ids = req.full_untruncated_fill_ids[:up_to]
        aligned = len(token_ids) // p * p
        namespace = namespace_of(getattr(req, "extra_key", None), getattr(req, "cache_salt", None))
        pool = self.req_to_token_pool
        slots = _to_numpy(pool.req_to_token[kv.req_pool_idx, :aligned])
        protected = kv.cache_protected_len
        present = self._insert(token_ids[:aligned], self._blocks(slots), namespace, free_declined=False)
        self._free(slots[protected : present * p])
        if hasattr(kv, "cache_inserted_len"):
            kv.cache_inserted_len = max(kv.cache_inserted_len, aligned)
        node, blocks = self._cached_path(token_ids[:aligned], namespace)
        new_indices = self._slots(blocks)
        if len(new_indices) > protected:
            pool.write((kv.req_pool_idx, slice(protected, len(new_indices))),
                       self._out(new_indices[protected:]))
        kv.cache_protected_len = len(new_indices)
        self.unlock(req.lock)
        req.lock = self.lock(node)
        req.last_node = node

    def evict(self, params: EvictParams) -> EvictResult:
        """Evict at least ``params.num_tokens`` tokens (whole pages) if unprotected ones exist.

        Frees their slots to SGLang's allocator. Returns
        ``EvictResult(num_tokens_evicted)``. Cost: radixkv's eviction plus one
        allocator free.
        """
        if not hasattr(params, "num_tokens"):
            raise ArgumentTypeError(f"params must be an EvictParams (with num_tokens), got {params!r}")
        num_tokens = check_positive_int(params.num_tokens, "params.num_tokens", allow_zero=True)
        if self.disable or num_tokens == 0:
            return EvictResult()
        freed = self.cache.evict(-(-num_tokens // self.page_size))
        if freed:
            self._free(self._slots(self.cache.allocate(freed)))
        return EvictResult(num_tokens_evicted=freed * self.page_size)

    def inc_lock_ref(self, node: Any) -> IncLockRefResult:
        """Protect root..``node``; ``delta`` is the change in evictable tokens (<= 0)."""
        if self.disable:
            return IncLockRefResult(delta=0)
        before = self.cache.protected_blocks
        self.cache.lock(node)
        return IncLockRefResult(delta=(before - self.cache.protected_blocks) * self.page_size)

    def dec_lock_ref(self, node: Any, params: Optional[DecLockRefParams] = None) -> DecLockRefResult:
        """Undo one :meth:`inc_lock_ref` (``params``, its receipt, is not needed); ``delta`` >= 0."""
        if self.disable:
            return DecLockRefResult(delta=0)
        before = self.cache.protected_blocks
        self.cache.unlock(node)
        return DecLockRefResult(delta=(before - self.cache.protected_blocks) * self.page_size)

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def evictable_size(self) -> int:
        """Cached tokens that eviction may free now. O(1)."""
        return self.cache.evictable_blocks * self.page_size

    def protected_size(self) -> int:
        """Cached tokens locked by running requests. O(1)."""
        return self.cache.protected_blocks * self.page_size

    def total_size(self) -> int:
        """Cached tokens. O(1)."""
        return self.cache.num_cached_blocks * self.page_size

    def take_events(self) -> list:
        """KV events since the last call, oldest first (empty unless ``enable_kv_cache_events``).

        With SGLang installed, SGLang's own ``kv_events`` structs (``BlockStored``,
        ``BlockRemoved``, ``AllBlocksCleared``), which its scheduler wraps in a
        ``KVEventBatch`` and publishes; otherwise radixkv's mirrors
        (:mod:`radixkv.events`). Take them here, not from ``self.cache``: the
        SGLang form's ``cache_salt`` follows the events in order.
        Cost: O(pages in the events).
        """
        events = self.cache.take_events()
        return events if self._events is None else self._events.convert(events)

    def pretty_print(self) -> None:
        print(f"#tokens: {self.total_size()} (evictable {self.evictable_size()}, protected {self.protected_size()})")

    def check(self) -> None:
        """radixkv's full invariant check plus the adapter's: radixkv owns no free block."""
        self.cache.check()
        assert self.cache.num_free_blocks == 0, (
            f"radixkv holds {self.cache.num_free_blocks} free blocks; all must be SGLang's")

    def __repr__(self) -> str:
        return (f"RadixKVCache(page_size={self.page_size}, total={self.total_size()}, "
                f"evictable={self.evictable_size()}, protected={self.protected_size()})")


def register_with_sglang(name: str = "radixkv") -> bool:
    """Make ``--radix-cache-backend <name>`` build a :class:`RadixKVCache` in SGLang.

    Registers a factory with SGLang's radix-cache backend registry (once; a
    second call is a no-op). Returns ``False`` (and does nothing) when SGLang is
    not importable.
    """
    if SGLANG_BASE is None:
        return False
    from sglang.srt.mem_cache import registry  # type: ignore

    if registry.get_radix_cache_factory(name) is None:
        registry.register_radix_cache_backend(name, lambda ctx: RadixKVCache.from_params(ctx.params))
    return True


__all__ = [
    "DecLockRefParams", "DecLockRefResult", "EvictParams", "EvictResult", "IncLockRefResult",
    "InsertParams", "InsertResult", "LegacyMatchResult", "MatchPrefixParams", "MatchResult", "namespace_of",
    "RadixKVCache", "RadixKey", "SGLANG_BASE", "SGLANG_EVICTION_POLICIES", "SGLANG_TARGET_VERSION",
    "StandaloneBase", "TreeLock",
    "register_with_sglang",
]

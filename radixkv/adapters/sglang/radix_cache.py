"""The cache face: :class:`RadixKVCache`, SGLang 0.5.23's ``RadixCache`` over a radixkv :class:`~radixkv.PrefixCache`.

Layer: adapter face; uses :mod:`.mirrors` (types, base class),
:mod:`.compat` (0.5.5 calls), :mod:`.namespaces`, :mod:`.eviction` and
:mod:`.kv_events`; underneath, only :class:`~radixkv.PrefixCache`'s public API.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ...cache import NodeHandle, PrefixCache
from ...errors import ArgumentTypeError, ArgumentValueError, InvalidBlocksError
from ... import policies as _policies
from ...keys import check_positive_int
from ...tenancy import Sharing
from .compat import Calls055
from .eviction import _eviction_policy
from .kv_events import _SGLangEvents
from .mirrors import (
    SGLANG_BASE, DecLockRefParams, DecLockRefResult, EvictParams, EvictResult, IncLockRefResult,
    InsertParams, InsertResult, MatchPrefixParams, MatchResult, StandaloneBase, _sgl_events)
from .namespaces import namespace_of


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



class RadixKVCache(SGLANG_BASE or StandaloneBase, Calls055):  # type: ignore[misc]
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
        sharing: radixkv's sharing rule between tenants (:mod:`radixkv.tenancy`). A request's
            ``cache_salt`` partitions, as in SGLang, whatever the rule: each salt's pages are its
            own and KV events hash them with the salt. The copies ``"k-anonymous"`` and
            ``"adaptive"`` add between tenants need blocks radixkv takes itself, and here
            SGLang's allocator owns every free block, so this face makes none yet: under them a
            salted request is served the pages it cached itself, as under ``"isolated"``.
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
        sharing: Union[str, Sharing, None] = None,
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
        self._returned: Optional[List[np.ndarray]] = None  # collects an insert's freed blocks, else None
        self.cache = PrefixCache(num_pages, page_size, policy=policy,
                                 enable_events=self.enable_kv_cache_events, on_free=self._freed, sharing=sharing)
        """The radixkv cache underneath (its block ids are SGLang page indices)."""
        # Every block starts out SGLang's (held): its allocator, not radixkv, hands out slots, and
        # radixkv's insert takes only blocks its caller holds. Blocks radixkv lets go of come back
        # to SGLang through _freed, so radixkv never owns a free block.
        self.cache.allocate(num_pages)
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

    def _key(self, key: Any) -> Tuple[Any, Tuple[Optional[str], Optional[str]]]:
        """(tokens, (namespace, tenant)) of a ``RadixKey``."""
        if getattr(key, "is_bigram", False):
            raise ArgumentValueError(f"bigram (EAGLE) keys are not supported, got {key!r}")
        raw = getattr(key, "raw_token_ids", None)
        tokens = raw() if raw is not None else key.token_ids
        return tokens, self._where(key)

    def _where(self, holder: Any) -> Tuple[Optional[str], Optional[str]]:
        """(namespace, tenant) of the ``extra_key`` and ``cache_salt`` of ``holder`` (a key or a
        request): the salt partitions, whatever the sharing rule (see ``sharing``)."""
        extra_key, salt = getattr(holder, "extra_key", None), getattr(holder, "cache_salt", None)
        return namespace_of(extra_key, salt), None  # checks both

    def _free(self, slots: np.ndarray) -> None:
        if len(slots):
            self.token_to_kv_pool_allocator.free(self._out(slots))

    def _freed(self, blocks: np.ndarray) -> None:
        """radixkv's free-block sink: pages it lets go of are SGLang's again.

        Evicted pages go straight to SGLang's allocator. An insert's (its
        duplicates, then its declined pages) are collected for :meth:`_insert`,
        which frees only those SGLang's caller does not free itself; a reset's
        are collected and dropped (SGLang's caller resets its allocator).
        """
        if self._returned is not None:
            self._returned.append(blocks)
        else:
            self._free(self._slots(blocks))

    def _insert(self, tokens: Any, blocks: np.ndarray, where: Tuple[Optional[str], Optional[str]],
                free_duplicates: bool) -> int:
        """radixkv insert; returns pages already cached.

        Frees the new pages the policy declined (``insert``: its caller frees
        the duplicates), or with ``free_duplicates`` the request's duplicate
        copies of pages already cached and no other page (``checkpoint``:
        declined pages stay the request's, which SGLang frees on release).
        """
        cache = self.cache
        declined = cache.declined_blocks
        self._returned = []
        try:
            present = cache.insert(tokens, blocks, namespace=where[0], tenant=where[1])
        finally:
            returned, self._returned = self._returned, None
        if returned:
            returned = np.concatenate(returned)
            split = len(returned) - (cache.declined_blocks - declined)
            self._free(self._slots(returned[:split] if free_duplicates else returned[split:]))
        return present

    def _insert_slots(self, key: Any, value: Any) -> Tuple[int, Any, Tuple[Optional[str], Optional[str]], int]:
        """Insert ``key``'s full pages held in slots ``value``: (tokens present, tokens, (namespace,
        tenant), full tokens)."""
        tokens, where = self._key(key)
        if value is None:
            raise ArgumentValueError("insert needs value (the kv slot indices of key's tokens), got None")
        slots = _to_numpy(value)
        if len(slots) < len(tokens):
            raise ArgumentValueError(f"value must hold one slot per token ({len(tokens)}), got {len(slots)}")
        n = len(tokens) // self.page_size * self.page_size
        if self.disable:
            return 0, tokens, where, n
        present = self._insert(tokens[:n], self._blocks(slots[:n]), where, free_duplicates=False)
        return present * self.page_size, tokens, where, n

    def _match(self, key: Any):
        """radixkv's match of ``key``'s cached prefix (empty when the cache is disabled); marks it used."""
        tokens, (namespace, tenant) = self._key(key)
        return self.cache.match([] if self.disable else tokens, namespace=namespace, tenant=tenant)

    def _cached_path(self, tokens: Any, where: Tuple[Optional[str], Optional[str]]) -> Tuple[NodeHandle, np.ndarray]:
        """Handle and blocks of the cached page prefix of ``tokens``, without marking a use.

        The adapter looks up what it has just inserted. Counting that lookup
        as a use would give every new page a second use at once: ``slru``
        would protect it, ``lfu`` count it twice, ``sieve`` mark it visited.
        Cost: one read-only walk when every page is cached (what an insert of
        ``tokens`` leaves, unless the policy declined some); else a second
        walk, and a match (which splits) only if the cached prefix ends inside
        a node. The tenant has just inserted every page: the sharing rule serves it them all.
        """
        cache = self.cache
        namespace, tenant = where
        m = cache.peek_match(tokens, namespace=namespace)
        if (m.num_tokens < len(tokens) // self.page_size * self.page_size
                and m.num_tokens < cache.cached_pages(tokens, namespace=namespace) * self.page_size):
            m = cache.match(tokens, namespace=namespace, tenant=tenant)
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
        if root is None:  # one handle per namespace: a root handle means its empty prefix, never stale
            root = self._roots[namespace] = self.cache.match([], namespace=namespace).node
        return root

    def reset(self):
        """Drop every cached page. Like SGLang, the allocator is reset by the caller, not here."""
        self._returned = []  # the cached pages stay SGLang's, for its allocator's reset
        try:
            self.cache.reset()
        finally:
            self._returned = None
        self._roots.clear()

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """Longest cached page-aligned prefix of ``params.key`` (SGLang's ``MatchPrefixParams``).

        Marks the matched pages used; does not lock them (``lock`` /
        ``inc_lock_ref`` does). The slots are ``path_device_indices(result.last_device_node)``.
        Given a bare ``RadixKey`` (SGLang 0.5.5's convention), returns a
        :class:`~radixkv.adapters.sglang.compat.LegacyMatchResult` with the slots. Cost: one radixkv match.
        """
        if not hasattr(params, "key"):  # bare RadixKey
            return self._match_0_5_5(params)
        m = self._match(params.key)
        return MatchResult(device_prefix_len=m.num_tokens, last_device_node=m.node,
                           last_host_node=m.node, best_match_node=m.node)

    def touch_prefix(self, key: Any) -> None:
        """Mark the cached prefix of ``key`` used (a match without a result)."""
        if not self.disable:
            tokens, (namespace, tenant) = self._key(key)
            self.cache.match(tokens, namespace=namespace, tenant=tenant)

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
            return self._insert_0_5_5(params, value)
        present, tokens, where, n = self._insert_slots(params.key, params.value)
        return InsertResult(prefix_len=present, last_device_node=self._cached_path(tokens[:n], where)[0])

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
        where = self._where(req)
        pool = self.req_to_token_pool
        slots = _to_numpy(pool.req_to_token[kv.req_pool_idx, :aligned])
        protected = kv.cache_protected_len
        self._insert(token_ids[:aligned], self._blocks(slots), where, free_duplicates=True)
        if hasattr(kv, "cache_inserted_len"):
            kv.cache_inserted_len = max(kv.cache_inserted_len, aligned)
        node, blocks = self._cached_path(token_ids[:aligned], where)
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
        freed = self.cache.evict(-(-num_tokens // self.page_size))  # _freed hands them to the allocator
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


"""A drop-in for SGLang's ``RadixCache``, backed by :class:`~radixkv.PrefixCache`.

:class:`RadixKVCache` has the method set of SGLang's ``BasePrefixCache`` as of
**SGLang v0.5.5** (``python/sglang/srt/mem_cache/base_prefix_cache.py`` and
``radix_cache.py``):

* ``match_prefix(key: RadixKey, **kwargs) -> MatchResult(device_indices,
  last_device_node, last_host_node, host_hit_length)``
* ``insert(key: RadixKey, value=None, chunked=False) -> int`` (tokens already cached)
* ``cache_finished_req(req, is_insert=True, **kwargs)``,
  ``cache_unfinished_req(req, chunked=False, **kwargs)``
* ``evict(num_tokens)``, ``inc_lock_ref(node) -> int``,
  ``dec_lock_ref(node, swa_uuid_for_lock=None) -> int`` (change in evictable tokens)
* ``evictable_size()``, ``protected_size()``, ``total_size()`` (tokens),
  ``reset()``, ``take_events()``

and the attributes of SGLang's ``PrefixCacheTrait`` (``req_to_token_pool``,
``token_to_kv_pool_allocator``, ``page_size``, ``disable``). Later SGLang
releases pass ``MatchPrefixParams``/``EvictParams`` objects; those are
accepted too (their ``key``/``num_tokens`` is read).

Mapping. SGLang addresses KV by token slot; its paged allocator hands out
page-aligned runs, slot ``= page * page_size + offset``. radixkv's block id is
SGLang's page index (the slot itself when ``page_size == 1``), and a node
handle is SGLang's "node". Every block radixkv does not cache is *held* by
SGLang (its allocator or a request): the adapter takes the whole pool at
start, hands evicted and duplicate blocks straight back to SGLang's
allocator, and so never owns a free block between calls. ``extra_key``
(SGLang's LoRA id / ``cache_salt`` namespace) is radixkv's ``namespace``.

Requests are duck-typed: ``origin_input_ids``, ``output_ids``, ``fill_ids``,
``req_pool_idx``, ``prefix_indices``, ``last_node``, ``extra_key`` and
(optional, v0.5.5) ``cache_protected_len``. Index tensors may be torch tensors
(results come back as int64 tensors on the pool's device) or numpy arrays.
"""

from __future__ import annotations

from typing import Any, Hashable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..cache import NodeHandle, PrefixCache
from ..errors import InvalidBlocksError
from ..events import KVCacheEvent
from ..keys import check_positive_int


class RadixKey:
    """SGLang's radix key: token ids plus an optional ``extra_key`` namespace.

    ``extra_key`` isolates caches: LoRA adapter id, tenant ``cache_salt``, ...
    Requests with different ``extra_key`` never share a page.
    """

    __slots__ = ("token_ids", "extra_key")

    def __init__(self, token_ids: Sequence[int], extra_key: Optional[str] = None) -> None:
        self.token_ids = token_ids
        self.extra_key = extra_key

    def __len__(self) -> int:
        return len(self.token_ids)

    def __getitem__(self, index: slice) -> "RadixKey":
        if not isinstance(index, slice):
            raise TypeError(f"RadixKey supports slicing only, got {index!r}")
        return RadixKey(self.token_ids[index], self.extra_key)

    def __repr__(self) -> str:
        return f"RadixKey(len={len(self.token_ids)}, extra_key={self.extra_key!r})"


class MatchResult(NamedTuple):
    """SGLang's ``MatchResult`` (same fields, same order).

    Attributes:
        device_indices: token-slot indices of the matched prefix (int64).
        last_device_node: handle of the deepest matched node; lock it with ``inc_lock_ref``.
        last_host_node: same as ``last_device_node`` (no host tier behind this adapter).
        host_hit_length: always 0.
    """

    device_indices: Any
    last_device_node: Any
    last_host_node: Any
    host_hit_length: int = 0


def _to_numpy(indices: Any) -> np.ndarray:
    """Token-slot indices (torch tensor, numpy array or list) as a 1-D int64 numpy array."""
    if hasattr(indices, "detach"):  # torch.Tensor, without importing torch
        indices = indices.detach().cpu().numpy()
    arr = np.asarray(indices)
    if arr.ndim != 1:
        raise InvalidBlocksError(f"kv indices must be 1-D, got shape {arr.shape}")
    if arr.size and (arr.dtype.kind not in "iu" or arr.dtype == np.bool_):
        raise TypeError(f"kv indices must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


class RadixKVCache:
    """SGLang's ``RadixCache`` interface over a radixkv :class:`~radixkv.PrefixCache`.

    Args:
        req_to_token_pool: SGLang's ``ReqToTokenPool`` (``req_to_token`` 2-D
            indices, ``write((row, slice), values)``, ``free(row)``).
        token_to_kv_pool_allocator: SGLang's allocator (``free(indices)``;
            ``size`` in tokens when ``num_pages`` is not given).
        page_size: tokens per page (SGLang's ``--page-size``).
        num_pages: pages in SGLang's KV pool including the reserved page 0;
            default ``allocator.size // page_size + 1``.
        eviction_policy: a radixkv policy name (:func:`radixkv.policies.available`).
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
        eviction_policy: str = "lru",
        enable_kv_cache_events: bool = False,
        disable: bool = False,
    ) -> None:
        page_size = check_positive_int(page_size, "page_size")
        if num_pages is None:
            size = getattr(token_to_kv_pool_allocator, "size", None)
            if size is None:
                raise ValueError("num_pages is required when token_to_kv_pool_allocator has no .size")
            num_pages = int(size) // page_size + 1
        num_pages = check_positive_int(num_pages, "num_pages")
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.disable = bool(disable)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.cache = PrefixCache(num_pages, page_size, policy=eviction_policy,
                                 enable_events=self.enable_kv_cache_events)
        """The radixkv cache underneath (its block ids are SGLang page indices)."""
        self.cache.allocate(num_pages)  # every block starts out held by SGLang
        self._offsets = np.arange(page_size, dtype=np.int64)
        self._device = None
        table = getattr(req_to_token_pool, "req_to_token", None)
        if table is not None and type(table).__module__.startswith("torch"):
            self._device = table.device
        self._root: Optional[NodeHandle] = None

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
    def _key(key: Any, extra_key: Optional[Hashable] = None) -> Tuple[Any, Optional[Hashable]]:
        if hasattr(key, "key") and not hasattr(key, "token_ids"):  # MatchPrefixParams / InsertParams
            key = key.key
        if hasattr(key, "token_ids"):
            return key.token_ids, getattr(key, "extra_key", None)
        return key, extra_key

    def _free(self, slots: np.ndarray) -> None:
        if len(slots):
            self.token_to_kv_pool_allocator.free(self._out(slots))

    def _insert(self, tokens: Any, blocks: np.ndarray, namespace: Optional[Hashable],
                free_declined: bool) -> Tuple[int, int]:
        """radixkv insert; returns (pages already cached, pages now cached from this call)."""
        cache = self.cache
        declined = cache.declined_blocks
        present = cache.insert(tokens, blocks, namespace=namespace)
        # Duplicates and declined pages went back to radixkv's pool: SGLang holds them again.
        cache.allocate(cache.num_free_blocks)
        declined = cache.declined_blocks - declined
        if declined and free_declined:
            self._free(self._slots(blocks[len(blocks) - declined :]))
        return present, len(blocks) - declined

    @staticmethod
    def _protected_len(req: Any) -> int:
        protected = getattr(req, "cache_protected_len", None)
        if protected is None:  # SGLang before cache_protected_len
            prefix = getattr(req, "prefix_indices", None)
            protected = len(prefix) if prefix is not None else 0
        return int(protected)

    # ------------------------------------------------------------ BasePrefixCache
    @property
    def root_node(self) -> NodeHandle:
        """Handle of the default namespace's root (what an empty match returns)."""
        if self._root is None or self._root._node.gen < 0:
            self._root = self.cache.match([]).node
        return self._root

    def reset(self) -> None:
        """Drop every cached page. Like SGLang, the allocator is reset by the caller, not here."""
        self.cache.reset()
        self.cache.allocate(self.cache.num_free_blocks)
        self._root = None

    def match_prefix(self, key: Any, **kwargs: Any) -> MatchResult:
        """Longest cached page-aligned prefix of ``key`` (a :class:`RadixKey` or token list).

        Marks the matched pages used; does not lock them (``inc_lock_ref`` does).
        Cost: one radixkv match.
        """
        tokens, namespace = self._key(key, kwargs.get("extra_key"))
        if self.disable:
            tokens = []
        m = self.cache.match(tokens, namespace=namespace)
        indices = self._out(self._slots(m.blocks))
        return MatchResult(indices, m.node, m.node, 0)

    def insert(self, key: Any, value: Any = None, chunked: bool = False, **kwargs: Any) -> int:
        """Cache ``key``'s full pages in the slots ``value``; return the tokens already cached.

        The tree takes ownership of the new pages; the caller frees its own
        copies of the already-cached ones (``value[protected:returned]``), as
        with SGLang. New pages the eviction policy declines are freed here.
        """
        if hasattr(key, "value") and value is None and not hasattr(key, "token_ids"):
            value = key.value  # InsertParams
        tokens, namespace = self._key(key, kwargs.get("extra_key"))
        if value is None:
            raise ValueError("insert needs value (the kv slot indices of key's tokens), got None")
        slots = _to_numpy(value)
        if len(slots) != len(tokens):
            raise ValueError(f"value must hold one slot per token ({len(tokens)}), got {len(slots)}")
        if self.disable:
            return 0
        n = len(slots) // self.page_size * self.page_size
        present, _ = self._insert(tokens[:n], self._blocks(slots[:n]), namespace, free_declined=True)
        return present * self.page_size

    def cache_finished_req(self, req: Any, is_insert: bool = True, **kwargs: Any) -> None:
        """Cache a finished request's KV, free what the tree does not keep, release its lock."""
        pool = self.req_to_token_pool
        all_len = len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)
        slots = _to_numpy(pool.req_to_token[req.req_pool_idx, :all_len])
        if self.disable:
            self._free(slots)
            pool.free(req.req_pool_idx)
            return
        p = self.page_size
        aligned = all_len // p * p
        protected = self._protected_len(req)
        self._free(slots[aligned:])
        if is_insert:
            token_ids = (list(req.origin_input_ids) + list(req.output_ids))[:aligned]
            present, _ = self._insert(token_ids, self._blocks(slots[:aligned]),
                                      getattr(req, "extra_key", None), free_declined=True)
            self._free(slots[protected : present * p])
        else:
            self._free(slots[protected:aligned])
        pool.free(req.req_pool_idx)
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(self, req: Any, chunked: bool = False, **kwargs: Any) -> None:
        """Cache a running request's KV so far (chunked prefill) and move its lock to the new end.

        The request's slot row is rewritten to point at the cached copies;
        ``req.prefix_indices``, ``req.last_node`` and ``req.cache_protected_len``
        are updated as SGLang's ``RadixCache`` does. Pages the policy declines
        stay the request's own.
        """
        if self.disable:
            return
        pool = self.req_to_token_pool
        token_ids = list(req.fill_ids)
        slots = _to_numpy(pool.req_to_token[req.req_pool_idx, : len(token_ids)])
        p = self.page_size
        aligned = len(token_ids) // p * p
        namespace = getattr(req, "extra_key", None)
        protected = self._protected_len(req)
        present, _ = self._insert(token_ids[:aligned], self._blocks(slots[:aligned]), namespace,
                                  free_declined=False)
        self._free(slots[protected : present * p])
        m = self.cache.match(token_ids[:aligned], namespace=namespace)
        new_indices = self._slots(m.blocks)
        if len(new_indices) > protected:
            pool.write((req.req_pool_idx, slice(protected, len(new_indices))),
                       self._out(new_indices[protected:]))
        req.cache_protected_len = len(new_indices)
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(m.node)
        req.prefix_indices = self._out(np.concatenate([new_indices, slots[len(new_indices):]]))
        req.last_node = m.node

    def evict(self, num_tokens: Any) -> int:
        """Evict at least ``num_tokens`` tokens (whole pages) if unprotected ones exist; free their slots.

        Returns the tokens evicted. Cost: radixkv's eviction plus one allocator free.
        """
        if hasattr(num_tokens, "num_tokens"):  # EvictParams
            num_tokens = num_tokens.num_tokens
        num_tokens = check_positive_int(num_tokens, "num_tokens", allow_zero=True)
        if self.disable:
            return 0
        pages = -(-num_tokens // self.page_size)
        freed = self.cache.evict(pages)
        if freed:
            self._free(self._slots(self.cache.allocate(freed)))
        return freed * self.page_size

    def inc_lock_ref(self, node: NodeHandle) -> int:
        """Protect root..``node``; returns the change in evictable tokens (<= 0)."""
        if self.disable:
            return 0
        before = self.cache.protected_blocks
        self.cache.lock(node)
        return (before - self.cache.protected_blocks) * self.page_size

    def dec_lock_ref(self, node: NodeHandle, swa_uuid_for_lock: Optional[str] = None) -> int:
        """Undo one :meth:`inc_lock_ref`; returns the change in evictable tokens (>= 0)."""
        if self.disable:
            return 0
        before = self.cache.protected_blocks
        self.cache.unlock(node)
        return (before - self.cache.protected_blocks) * self.page_size

    def evictable_size(self) -> int:
        """Cached tokens that eviction may free now. O(1)."""
        return self.cache.evictable_blocks * self.page_size

    def protected_size(self) -> int:
        """Cached tokens locked by running requests. O(1)."""
        return self.cache.protected_blocks * self.page_size

    def total_size(self) -> int:
        """Cached tokens. O(1)."""
        return self.cache.num_cached_blocks * self.page_size

    def take_events(self) -> List[KVCacheEvent]:
        """KV events since the last call (empty unless ``enable_kv_cache_events``)."""
        return self.cache.take_events()

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


def register_with_sglang() -> bool:
    """Register :class:`RadixKVCache` as a virtual subclass of SGLang's ``BasePrefixCache``.

    Returns ``False`` (and does nothing) when SGLang is not importable.
    """
    try:
        from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache  # type: ignore
    except ImportError:
        return False
    BasePrefixCache.register(RadixKVCache)
    return True


__all__ = ["MatchResult", "RadixKVCache", "RadixKey", "register_with_sglang"]

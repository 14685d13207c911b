"""Conformance targets for real engines' prefix caches: SGLang's ``RadixCache`` and ``UnifiedRadixCache``, vLLM's ``BlockPool``.

Each function returns a :class:`~radixkv.testing.Target`: a factory for an
adapter that drives the engine's cache the way its scheduler does, plus the
machine options the engine's semantics need::

    from radixkv.testing import run_conformance
    from radixkv.testing.targets import sglang_radix_cache
    run_conformance(sglang_radix_cache(page_size=2, num_blocks=6), max_examples=300)

The engines are imported when a factory first runs, so this module imports
anywhere; calling a factory needs the engine installed (SGLang 0.5.23 or vLLM
0.33.0 with a CPU torch, as ``bench/peers`` pins them; SGLang's import also
needs ``torchvision`` or a stand-in for it). Pools run on ``device="cpu"``
with no KV tensors: the caches only move slot and block ids.

Where each engine differs from radixkv's contract, and the option that says so:

* both engines recompute the last prompt token, so a hit is at most
  ``len(tokens) - 1`` tokens (``max_hit``), and never hand out block 0
  (``reserved_blocks``); neither checks that an unlock had a lock
  (``unlock_raises=False``; the Rust core's adapter raises, see below);
* SGLang evicts whole leaf nodes until at least ``n`` tokens are free
  (``over_eviction``), and one root node serves every namespace (``shared_root``);
* vLLM has no "evict now": cached blocks wait in the free queue until
  ``get_new_blocks`` reuses them (``lazy_eviction``), in free-queue order, which
  may take a page before its successors (``prefix_closed=False``).

A namespace is SGLang's ``RadixKey.cache_salt`` (it separates the tree and the
KV events' hashes) and vLLM's ``cache_salt``. ``contents()`` walks the tree of
``RadixCache``; the Rust core and vLLM's one-way block hashes cannot be walked
back to tokens, so their adapters rebuild it from the caches' own KV events
(:class:`~radixkv.testing.EventContents`).
"""

from __future__ import annotations

from array import array
from collections import Counter
from types import SimpleNamespace
from typing import Any, Dict, Hashable, List, Optional, Sequence

from .machine import Target
from .protocol import EventContents, Match, PageKey

_ENGINE_CAP = {"max_hit": lambda n: n - 1, "reserved_blocks": (0,)}
_SGLANG = dict(_ENGINE_CAP, over_eviction=True, shared_root=True, unlock_raises=False)


def sglang_radix_cache(page_size: int, num_blocks: int) -> Target:
    """SGLang's ``RadixCache`` (the Python tree) over a ``PagedTokenToKVPoolAllocator`` of ``num_blocks`` pages."""
    return Target(lambda: SGLangRadixCache(page_size, num_blocks),
                  f"sglang.RadixCache(page_size={page_size}, num_blocks={num_blocks})", dict(_SGLANG))


def sglang_unified_radix_cache(page_size: int, num_blocks: int) -> Target:
    """SGLang's default ``UnifiedRadixCache`` (full-attention component, Rust tree core), same allocator."""
    return Target(lambda: SGLangUnifiedRadixCache(page_size, num_blocks),
                  f"sglang.UnifiedRadixCache(page_size={page_size}, num_blocks={num_blocks})",
                  dict(_SGLANG, unlock_raises=True))


def vllm_block_pool(page_size: int, num_blocks: int) -> Target:
    """vLLM v1's ``BlockPool`` with prefix caching, looked up as ``FullAttentionManager`` does."""
    return Target(lambda: VLLMBlockPool(page_size, num_blocks),
                  f"vllm.BlockPool(page_size={page_size}, num_blocks={num_blocks})",
                  dict(_ENGINE_CAP, lazy_eviction=True, unlock_raises=False, prefix_closed=False))


# ------------------------------------------------------------------ SGLang

def _sglang() -> SimpleNamespace:
    """SGLang's cache modules (imported on first use: pulls in torch and SGLang's config stack)."""
    import torch
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    return SimpleNamespace(torch=torch, Allocator=PagedTokenToKVPoolAllocator, EvictParams=EvictParams,
                           InsertParams=InsertParams, MatchPrefixParams=MatchPrefixParams,
                           CacheInitParams=CacheInitParams, RadixCache=RadixCache, RadixKey=RadixKey)


def free_duplicates(allocator: Any, passed: Sequence[int], cached: Sequence[int], page_size: int) -> List[int]:
    """Free the passed pages an insert found already cached under other slots, as SGLang's ``_insert_cache`` does.

    Returns the pages freed. A page passed that is the cached one (a locked hit) stays.
    """
    dup = [int(b) for b, c in zip(passed, cached) if int(b) != int(c)]
    if dup:
        allocator.free(_slots(allocator, dup, page_size))
    return dup


def _slots(allocator: Any, pages: Sequence[int], page_size: int):
    """The slot indices of whole pages, as SGLang's paged allocator numbers them (page * page_size + offset)."""
    import torch

    base = torch.tensor(list(pages), dtype=torch.int64).repeat_interleave(page_size) * page_size
    return base + torch.arange(page_size, dtype=torch.int64).repeat(len(pages))


class _SGLangCache:
    """What both SGLang trees share: the paged allocator, the scheduler's allocate-with-eviction, insert, free."""

    insert_frees_duplicates = False  # the tree's insert gives back passed slots it found cached (else the caller does)

    def __init__(self, page_size: int, num_blocks: int) -> None:
        s = self.sgl = _sglang()
        self.page_size = page_size
        self.num_blocks = num_blocks
        self.allocator = s.Allocator(size=num_blocks * page_size, page_size=page_size, dtype=s.torch.float16,
                                     device="cpu", kvcache=None, need_sort=False)
        self.held: set = set()
        self.locks: Counter = Counter()  # handle -> locks the caller holds on it
        self.tree = self._build(s.CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=self.allocator,
            page_size=page_size, eviction_policy="lru", **self._params()))

    def _params(self) -> Dict[str, Any]:
        return {}

    def _key(self, tokens: Sequence[int], namespace: Optional[Hashable], limit: Optional[int] = None):
        return self.sgl.RadixKey(array("q", [int(t) for t in tokens]), cache_salt=namespace, limit=limit)

    def _pages(self, slots) -> List[int]:
        return [int(s) // self.page_size for s in slots[:: self.page_size].tolist()]

    def match(self, tokens, *, namespace=None):
        key = self._key(tokens, namespace, limit=max(0, len(tokens) - 1))  # the engine's hit cap
        m = self.tree.match_prefix(self.sgl.MatchPrefixParams(key=key))
        node = m.last_device_node
        blocks = self._pages(self.tree.path_device_indices(node))
        assert len(blocks) * self.page_size == m.device_prefix_len
        return Match(m.device_prefix_len, blocks, node)

    def allocate(self, n):
        """The scheduler's ``alloc_for_extend``: evict the shortfall if the free pages do not cover ``n``."""
        p = self.page_size
        free = self.allocator.available_size() // p
        if n > free + self.tree.evictable_size() // p:
            return None
        if n > free:
            self.tree.evict(self.sgl.EvictParams(num_tokens=(n - free) * p))
        pages = self._pages(self.allocator.alloc(n * p)) if n else []
        self.held.update(pages)
        return pages

    def insert(self, tokens, blocks, *, namespace=None):
        p = self.page_size
        n = len(tokens) // p
        if len(blocks) != n:
            raise ValueError(f"{len(blocks)} blocks for {n} pages")
        value = _slots(self.allocator, blocks, p)
        extra = {}
        if self.insert_frees_duplicates:  # tell the tree how many leading slots are already its own
            pages = self.contents()
            own = 0
            while own < n and pages.get((namespace, tuple(tokens[: (own + 1) * p]))) == int(blocks[own]):
                own += 1
            extra["prev_prefix_len"] = own * p
        res = self.tree.insert(self.sgl.InsertParams(key=self._key(tokens[: n * p], namespace), value=value, **extra))
        present = res.prefix_len // p
        if not self.insert_frees_duplicates:
            cached = self._pages(self.tree.path_device_indices(res.last_device_node))
            free_duplicates(self.allocator, blocks[:present], cached[:present], p)
        self.held.difference_update(int(b) for b in blocks)
        self._inserted(tokens[: n * p], namespace, blocks, present)
        return present

    def _inserted(self, tokens, namespace, blocks, present) -> None:
        pass

    def free(self, blocks):
        if any(int(b) not in self.held for b in blocks):
            raise ValueError(f"blocks {list(blocks)} are not all held")
        if len(blocks):
            self.allocator.free(_slots(self.allocator, blocks, self.page_size))
        self.held.difference_update(int(b) for b in blocks)

    def evict(self, n):
        return self.tree.evict(self.sgl.EvictParams(num_tokens=n * self.page_size)).num_tokens_evicted // self.page_size

    def check(self):
        p = self.page_size
        pages = self.contents()
        cached = set(pages.values())
        assert not cached & self.held, f"held pages are cached: {sorted(cached & self.held)}"
        assert self.allocator.available_size() // p + len(cached) + len(self.held) == self.num_blocks, (
            f"{self.allocator.available_size() // p} free + {len(cached)} cached + {len(self.held)} held pages "
            f"!= {self.num_blocks}: a page leaked or was freed twice")
        sizes = self.tree.evictable_size() + self.tree.protected_size()
        assert sizes == len(pages) * p, f"evictable + protected = {sizes} tokens, the tree holds {len(pages) * p}"

    def contents(self) -> Dict[PageKey, int]:
        raise NotImplementedError


class SGLangRadixCache(_SGLangCache):
    """SGLang's ``RadixCache`` as a :class:`~radixkv.testing.PrefixCacheUnderTest`; handles are tree nodes."""

    def _build(self, params):
        return self.sgl.RadixCache(params)

    def lock(self, handle):
        self.tree.inc_lock_ref(handle)
        self.locks[handle] += 1

    def unlock(self, handle):
        self.tree.dec_lock_ref(handle)
        self.locks[handle] -= 1

    def _walk(self):
        """(node, namespace, prefix tokens through it) for every node below the root."""
        stack = [(self.tree.root_node, ())]
        while stack:
            node, prefix = stack.pop()
            for child in node.children.values():
                path = prefix + tuple(int(t) for t in child.key)
                yield child, child.key.cache_salt, path
                stack.append((child, path))

    def contents(self):
        p = self.page_size
        out = {}
        for node, namespace, path in self._walk():
            start = len(path) - len(node.key)
            for i, page in enumerate(self._pages(node.value)):
                out[(namespace, path[: start + (i + 1) * p])] = page
        return out

    def check(self):
        super().check()
        # A node's lock_ref counts the locks taken on it or below it; the sizes split by it.
        below: Counter = Counter()
        evictable = protected = 0
        nodes = list(self._walk())
        for node, _, _ in reversed(nodes):  # children before parents
            want = self.locks[node] + below[id(node)]
            assert node.lock_ref == want, f"node {list(node.key)} has lock_ref {node.lock_ref}, {want} locks cover it"
            below[id(node.parent)] += want
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        assert (self.tree.evictable_size(), self.tree.protected_size()) == (evictable, protected), (
            f"evictable/protected sizes {self.tree.evictable_size()}/{self.tree.protected_size()}, "
            f"the tree's lock_refs say {evictable}/{protected}")


class SGLangUnifiedRadixCache(_SGLangCache):
    """SGLang's ``UnifiedRadixCache`` (Rust tree core) as a :class:`~radixkv.testing.PrefixCacheUnderTest`.

    Handles are node ids; locks are the cache's ``TreeLock`` receipts, kept
    per handle, so an unlock with none held raises ``ValueError``. ``contents()``
    comes from the cache's KV events. Its ``insert`` frees the duplicate
    slots it finds itself (a cache action the tree core emits), past
    ``prev_prefix_len``: the leading slots the caller got from the tree.
    """

    insert_frees_duplicates = True

    def __init__(self, page_size: int, num_blocks: int) -> None:
        self.receipts: Dict[Any, List[Any]] = {}
        self.events = EventContents(page_size)
        super().__init__(page_size, num_blocks)
        self._drain(None)

    def _params(self):
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        return dict(tree_components=(ComponentType.FULL,), enable_kv_cache_events=True)

    def _build(self, params):
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        return UnifiedRadixCache(params)

    def _drain(self, stored) -> None:
        """Apply the cache's pending KV events; ``stored`` maps a stored run's start page to its namespace and blocks."""
        for ev in self.tree.take_events():
            kind = type(ev).__name__
            if kind == "BlockStored":
                assert stored is not None, f"pages stored outside an insert: {ev}"
                namespace, blocks, start_of = stored
                start = start_of(ev)
                self.events.stored(ev.block_hashes, ev.parent_block_hash, ev.token_ids, namespace,
                                   blocks[start : start + len(ev.block_hashes)])
            elif kind == "BlockRemoved":
                self.events.removed(ev.block_hashes)
            elif kind == "AllBlocksCleared":
                self.events.cleared()

    def _inserted(self, tokens, namespace, blocks, present) -> None:
        def start_of(ev):
            parent = ev.parent_block_hash
            return 0 if parent is None else len(self.events.tokens_of(parent)) // self.page_size
        self._drain((namespace, [int(b) for b in blocks], start_of))

    def allocate(self, n):
        out = super().allocate(n)
        self._drain(None)
        return out

    def evict(self, n):
        out = super().evict(n)
        self._drain(None)
        return out

    def match(self, tokens, *, namespace=None):
        out = super().match(tokens, namespace=namespace)
        self._drain(None)
        return out

    def lock(self, handle):
        self.receipts.setdefault(handle, []).append(self.tree.lock(handle))

    def unlock(self, handle):
        held = self.receipts.get(handle)
        if not held:
            raise ValueError(f"node {handle} holds no lock")
        self.tree.unlock(held.pop())

    def contents(self):
        return self.events.contents()

    def check(self):
        super().check()
        if not any(self.receipts.values()):
            self.tree.sanity_check()  # the core's own walk; it requires every node unlocked


# ------------------------------------------------------------------ vLLM

def _vllm() -> SimpleNamespace:
    """vLLM's block pool, hasher and request modules (imported on first use: ~10 s)."""
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.request import Request

    return SimpleNamespace(torch=torch, SamplingParams=SamplingParams, get_hash_fn_by_name=get_hash_fn_by_name,
                           kcu=kv_cache_utils, BlockPool=BlockPool, FullAttentionManager=FullAttentionManager,
                           FullAttentionSpec=FullAttentionSpec, Request=Request)


class VLLMBlockPool:
    """vLLM v1's ``BlockPool`` as a :class:`~radixkv.testing.PrefixCacheUnderTest`, driven as ``KVCacheManager`` drives it.

    Built with ``num_blocks + 1`` blocks (block 0 is vLLM's null block).
    ``match`` hashes the prompt (sha256, chained from ``NONE_HASH``; the
    namespace is the request's ``cache_salt``) and runs
    ``FullAttentionManager.find_longest_cache_hit``; a handle is the hit's
    blocks, ``lock`` is ``touch``, ``unlock`` is ``free_blocks`` in reverse.
    ``allocate`` is ``get_new_blocks`` (evicting cached blocks at the free
    queue's head); ``insert`` is ``cache_full_blocks`` and then the request's
    ``free_blocks``. ``contents()`` comes from the pool's KV events.
    """

    def __init__(self, page_size: int, num_blocks: int) -> None:
        v = self.v = _vllm()
        self.page_size = page_size
        self.num_blocks = num_blocks
        hash_fn = v.get_hash_fn_by_name("sha256")
        v.kcu.init_none_hash(hash_fn)
        self.hasher = v.kcu.get_request_block_hasher(page_size, hash_fn)
        self.pool = v.BlockPool(num_gpu_blocks=num_blocks + 1, enable_caching=True, hash_block_size=page_size,
                                enable_kv_cache_events=True)
        self.spec = v.FullAttentionSpec(block_size=page_size, num_kv_heads=1, head_size=1, dtype=v.torch.float16)
        self.sampling = v.SamplingParams(max_tokens=1)
        self.held: Dict[int, Any] = {}
        self.locks: Counter = Counter()  # block id -> locks covering it
        self.events = EventContents(page_size)
        self.requests = 0
        self._drain(None)

    def _request(self, tokens, namespace):
        self.requests += 1
        return self.v.Request(str(self.requests), [int(t) for t in tokens], self.sampling, None,
                              cache_salt=namespace, block_hasher=self.hasher)

    def _drain(self, stored) -> None:
        for ev in self.pool.take_events():
            kind = type(ev).__name__
            if kind == "BlockStored":
                assert stored is not None, f"blocks stored outside an insert: {ev}"
                namespace, blocks = stored
                self.events.stored(ev.block_hashes, ev.parent_block_hash, ev.token_ids, namespace, blocks)
            elif kind == "BlockRemoved":
                self.events.removed(ev.block_hashes)
            elif kind == "AllBlocksCleared":
                self.events.cleared()

    def match(self, tokens, *, namespace=None):
        req = self._request(tokens, namespace)
        (hit,), hit_len = self.v.FullAttentionManager.find_longest_cache_hit(
            req.block_hashes, max(0, len(tokens) - 1), [0], self.pool, self.spec, False, self.page_size)
        return Match(hit_len, [b.block_id for b in hit], tuple(hit))

    def lock(self, handle):
        self.pool.touch(list(handle))
        self.locks.update(b.block_id for b in handle)

    def unlock(self, handle):
        self.pool.free_blocks(reversed(list(handle)))
        self.locks.subtract(b.block_id for b in handle)

    def allocate(self, n):
        if n > self.pool.get_num_free_blocks():
            return None
        blocks = self.pool.get_new_blocks(n) if n else []
        self.held.update((b.block_id, b) for b in blocks)
        self._drain(None)
        return [b.block_id for b in blocks]

    def insert(self, tokens, blocks, *, namespace=None):
        p = self.page_size
        req = self._request(tokens, namespace)
        n = len(req.block_hashes)
        if len(blocks) != n:
            raise ValueError(f"{len(blocks)} blocks for {n} pages")
        chain: List[Any] = []
        for h in req.block_hashes:
            cached = self.pool.get_cached_block(h, [0])
            if cached is None:
                break
            chain.append(cached[0])
        present = len(chain)
        for b, c in zip(blocks[:present], chain):  # already cached under another block: give ours back
            if int(b) != c.block_id:
                self.pool.free_blocks([self.held.pop(int(b))])
        new = [self.held.pop(int(b)) for b in blocks[present:]]
        self.pool.cache_full_blocks(req, chain + new, present, n, p, 0)
        self._drain((namespace, [b.block_id for b in new]))
        self.pool.free_blocks(reversed(new))  # the request ends: its references go
        return present

    def free(self, blocks):
        if any(int(b) not in self.held for b in blocks):
            raise ValueError(f"blocks {list(blocks)} are not all held")
        self.pool.free_blocks([self.held.pop(int(b)) for b in blocks])

    def evict(self, n):
        """vLLM evicts only when ``get_new_blocks`` reuses a block (``lazy_eviction``): nothing to do."""
        return 0

    def check(self):
        pool = self.pool
        queue = pool.free_block_queue.get_all_free_blocks()
        ids = [b.block_id for b in queue]
        assert len(ids) == len(set(ids)) == pool.get_num_free_blocks(), "free queue length or duplicates"
        for block in pool.blocks[1:]:
            want = (block.block_id in self.held) + self.locks[block.block_id]
            assert block.ref_cnt == want, f"block {block.block_id} has ref_cnt {block.ref_cnt}, {want} holders"
            assert (block.block_id in set(ids)) == (want == 0), (
                f"block {block.block_id} with ref_cnt {block.ref_cnt} is {'' if block.block_id in ids else 'not '}"
                f"in the free queue")
        cached = {b.block_id for b in pool.blocks if b.block_hash is not None}
        assert cached == set(self.events.pages.values()), "cached blocks differ from the KV events' account"

    def contents(self):
        return self.events.contents()

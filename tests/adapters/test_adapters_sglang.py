"""The SGLang-shaped adapter, driven the way SGLang 0.5.23's scheduler drives RadixCache.

SGLang is not needed: its request, ReqToTokenPool and paged allocator are
replaced by small duck-typed fakes that keep SGLang's conventions (slot =
page * page_size + offset, page 0 reserved, freeing any slot of a page frees
the page, the row state in ``req.kv``) and fail loudly on a double free. The
engine loop follows SGLang's ``match_kv_cache`` -> ``lock`` -> allocate ->
``checkpoint`` per chunk -> ``release_kv_cache``. tests/adapters/test_sglang_live.py
drives the same adapter through a real SGLang install.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import random
import sys
import warnings
from typing import List, Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

if importlib.util.find_spec("sglang") is not None and importlib.util.find_spec("torchvision") is None:
    # SGLang's mem_cache imports torchvision at module level; bench/peers stands in for it (no code copied).
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "peers"))
    import _shims  # noqa: E402

    _shims.install_stub_packages(["torchvision"])
    warnings.filterwarnings("ignore", category=DeprecationWarning)

from radixkv.policies import FIFO, LFU, LRU, SIEVE, SLRU  # noqa: E402
from radixkv.adapters.sglang import (  # noqa: E402
    SGLANG_BASE, EvictParams, EvictResult, IncLockRefResult, InsertParams, LegacyMatchResult,
    MatchPrefixParams, MatchResult, RadixKey, RadixKVCache)
from radixkv.errors import ArgumentTypeError, ArgumentValueError, InvalidBlocksError  # noqa: E402
import radixkv.events  # noqa: E402

if SGLANG_BASE is not None:  # SGLang's base frees rows with torch ops: keep rows as torch tensors there
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

    _ABORT = CacheRequestOutcome.ABORT
else:
    _ABORT = "ABORT"  # what StandaloneBase.finish compares by name


def _zeros(shape):
    if SGLANG_BASE is not None:
        return torch.zeros(shape, dtype=torch.int32)
    return np.zeros(shape, dtype=np.int32)


class FakeReqToTokenPool:
    """SGLang 0.5.23's ReqToTokenPool, reduced: ``alloc``/``free`` take the request."""

    def __init__(self, size: int, max_context_len: int) -> None:
        self.req_to_token = _zeros((size, max_context_len))
        self.free_slots = list(range(size))

    def alloc(self, req) -> int:
        req.kv.req_pool_idx = self.free_slots.pop()
        return req.kv.req_pool_idx

    def write(self, indices, values) -> None:
        self.req_to_token[indices] = values if SGLANG_BASE is not None else np.asarray(values)

    def free(self, req) -> None:
        idx = req.kv.req_pool_idx
        assert idx is not None and idx not in self.free_slots, f"request slot {idx} freed twice"
        self.free_slots.append(idx)
        req.kv.req_pool_idx = None


class FakePagedAllocator:
    """SGLang's paged allocator, reduced: pages 1..size//page_size; free() frees whole pages."""

    def __init__(self, size: int, page_size: int) -> None:
        self.size = size
        self.page_size = page_size
        self.num_pages = size // page_size
        self.free_pages = list(range(1, self.num_pages + 1))
        self.on_free = lambda pages: None

    def available_size(self) -> int:
        return len(self.free_pages) * self.page_size

    def alloc_page(self) -> Optional[int]:
        return self.free_pages.pop() if self.free_pages else None

    def free(self, indices) -> None:
        pages = np.unique(np.asarray(indices) // self.page_size).tolist()
        for page in pages:
            assert 1 <= page <= self.num_pages, f"freed slot of page {page}, outside the pool"
            assert page not in self.free_pages, f"page {page} freed twice"
        self.free_pages.extend(pages)
        self.on_free(pages)

    def free_segments(self, segments) -> None:  # what SGLang's BasePrefixCache.free_kv_row calls
        for indices, _start in segments:
            self.free(indices)


class FakeKv:
    """SGLang 0.5.23's ``ReqKvInfo``: the request's row and the tree-owned part of it."""

    def __init__(self) -> None:
        self.req_pool_idx: Optional[int] = None
        self.cache_protected_len = 0
        self.cache_inserted_len = 0
        self.kv_committed_len = 0
        self.kv_allocated_len = 0

    def get_evicted_seqlen(self, component) -> int:  # no sliding window
        return 0

    def swa_dead_lo(self, page_size: int) -> int:
        return self.cache_protected_len


class FakeReq:
    def __init__(self, prompt: List[int], extra_key: Optional[str] = None, cache_salt: Optional[str] = None) -> None:
        self.rid = f"req-{id(self)}"
        self.cache_request_handle = (self.rid, 0)  # SGLang's CacheRequestHandle(rid, attempt_id)
        self.origin_input_ids = list(prompt)
        self.output_ids: List[int] = []
        self.full_untruncated_fill_ids = list(prompt)
        self.extra_key = extra_key
        self.cache_salt = cache_salt
        self.priority = None
        self.kv = FakeKv()
        self.lock = None
        self.last_node = None
        self.prefix_len = 0
        self.extend_end = 0
        self.hit = 0  # tokens the tree served at start


class FakeEngine:
    """A scheduler loop in SGLang 0.5.23's order.

    match_prefix -> lock -> row from prefix_device_indices -> extend (checkpoint
    after every chunk but the last) -> decode -> release: checkpoint, free_kv_row
    of the request's own part, unlock, free the row. ``kv[slot]`` records which
    (namespace, prefix) a slot's KV was computed for, so a wrongly served slot
    is caught when it is read.
    """

    def __init__(self, page_size: int, num_pages: int, *, events: bool = False, policy="lru") -> None:
        self.page_size = page_size
        self.pool = FakeReqToTokenPool(16, 256)
        self.alloc = FakePagedAllocator(num_pages * page_size, page_size)
        self.tree = RadixKVCache(self.pool, self.alloc, page_size, eviction_policy=policy,
                                 enable_kv_cache_events=events)
        self.kv = {}
        self.running: List[FakeReq] = []
        self.alloc.on_free = self._poison

    def _poison(self, pages: List[int]) -> None:
        """A freed page's KV is gone: reading it through a stale slot must fail."""
        for page in pages:
            for slot in range(page * self.page_size, (page + 1) * self.page_size):
                self.kv.pop(slot, None)

    def _new_page(self) -> int:
        page = self.alloc.alloc_page()
        if page is None:
            result = self.tree.evict_for_alloc(EvictParams(num_tokens=self.page_size))
            assert isinstance(result, EvictResult)
            page = self.alloc.alloc_page()
        if page is None:
            raise MemoryError("out of KV pages")
        return page

    def _row(self, req: FakeReq, n: int) -> List[int]:
        return [int(s) for s in self.pool.req_to_token[req.kv.req_pool_idx, :n].tolist()]

    def _compute(self, req: FakeReq, start: int, end: int, tokens: List[int], *, forward: bool = True) -> None:
        """Give tokens start..end slots (continuing the request's last page) and 'compute' their KV.

        ``forward=False``: the slots are allocated and in the row, but no forward
        ran, so their KV is not written and the committed length stays.
        """
        p = self.page_size
        row = self._row(req, start)
        for i in range(start, end):
            row.append(self._new_page() * p if i % p == 0 else row[i - 1] + 1)
            if forward:
                self.kv[row[i]] = (req.extra_key, req.cache_salt or None, tuple(tokens[: i + 1]))
        if end > start:
            self.pool.write((req.kv.req_pool_idx, slice(start, end)), _as_row(row[start:end]))
        req.kv.kv_allocated_len = end
        if forward:
            req.kv.kv_committed_len = end

    def _verify(self, req: FakeReq, n: int, tokens: List[int]) -> None:
        for i, slot in enumerate(self._row(req, n)):
            assert self.kv.get(slot) == (req.extra_key, req.cache_salt or None, tuple(tokens[: i + 1])), (
                f"slot {slot} for token {i} holds KV of {self.kv.get(slot)}")

    def start(self, prompt: List[int], extra_key: Optional[str] = None, chunk: int = 0,
              cache_salt: Optional[str] = None) -> FakeReq:
        req = FakeReq(prompt, extra_key, cache_salt)
        key = RadixKey(prompt, extra_key, limit=len(prompt) - 1, cache_salt=cache_salt)
        m = self.tree.match_prefix(MatchPrefixParams(key=key))
        assert isinstance(m, MatchResult) and m.last_host_node is m.last_device_node is m.best_match_node
        req.prefix_len, req.last_node = m.device_prefix_len, m.last_device_node
        req.kv.cache_protected_len = req.prefix_len
        req.lock = self.tree.lock(req.last_node)
        prefix = self.tree.prefix_device_indices(req)
        assert len(prefix) == req.prefix_len
        self.pool.alloc(req)
        hit = req.hit = req.prefix_len
        if hit:
            self.pool.write((req.kv.req_pool_idx, slice(0, hit)), prefix)
        req.kv.kv_committed_len = req.kv.kv_allocated_len = hit
        self._verify(req, hit, prompt)
        step = chunk or len(prompt)
        while req.prefix_len < len(prompt):  # chunked prefill: checkpoint after every chunk but the last
            req.extend_end = min(len(prompt), req.prefix_len + step)
            self._compute(req, req.prefix_len, req.extend_end, prompt)
            if req.extend_end < len(prompt):
                self.tree.checkpoint(req, up_to=req.extend_end)
                self._verify(req, req.extend_end, prompt)
            req.prefix_len = req.extend_end
        self.running.append(req)
        return req

    def continue_prefill(self, req: FakeReq, more: List[int]) -> None:
        """Prefill ``more`` prompt tokens of a running request as one more chunk, then checkpoint it."""
        start = len(req.origin_input_ids)
        req.origin_input_ids += list(more)
        req.full_untruncated_fill_ids = list(req.origin_input_ids)
        self._compute(req, start, len(req.origin_input_ids), req.origin_input_ids)
        req.extend_end = len(req.origin_input_ids)
        self.tree.checkpoint(req, up_to=req.extend_end)
        self._verify(req, req.extend_end, req.origin_input_ids)

    def decode(self, req: FakeReq, new_tokens: List[int]) -> None:
        for t in new_tokens:
            seq = req.origin_input_ids + req.output_ids
            if req.output_ids:  # the previous output token is fed now: it gets a slot
                self._compute(req, len(seq) - 1, len(seq), seq)
            req.output_ids.append(t)

    def finish(self, req: FakeReq) -> None:
        """SGLang's release_kv_cache(req, tree, checkpoint=True), step by step."""
        owned = req.kv.kv_committed_len
        req.full_untruncated_fill_ids = req.origin_input_ids + req.output_ids
        self._verify(req, owned, req.full_untruncated_fill_ids)
        self.running.remove(req)
        assert not self.tree.claim_kv_row(req)
        self.tree.checkpoint(req, up_to=owned)
        self.tree.free_kv_row(req.kv, [(req.kv.cache_protected_len, owned)])
        self.tree.unlock(req.lock)
        req.lock = None
        self.tree.on_release(req, checkpointed=True)
        self.pool.free(req)

    def abort(self, req: FakeReq) -> None:
        """SGLang 0.5.23's abort: ``tree.finish(handle, ABORT)``, then ``release_kv_cache(req, tree, checkpoint=False)``.

        No checkpoint: the request's own pages (row positions from
        ``cache_protected_len`` to the committed length, then the allocated
        rest from the next page boundary) go back to the allocator.
        """
        p = self.page_size
        self.running.remove(req)
        self.tree.finish(req.cache_request_handle, _ABORT)
        assert not self.tree.claim_kv_row(req)
        committed, allocated = req.kv.kv_committed_len, req.kv.kv_allocated_len
        self.tree.free_kv_row(req.kv, [(req.kv.cache_protected_len, committed)])
        self.tree.unlock(req.lock)
        req.lock = None
        if -(-committed // p) * p < allocated:
            self.tree.free_kv_row(req.kv, [(-(-committed // p) * p, allocated)])
        self.tree.on_release(req, checkpointed=False)
        self.pool.free(req)

    def check(self) -> None:
        """No page lost, none in two places: free + cached + held by running requests == all pages."""
        self.tree.check()
        p = self.page_size
        cached = set()
        for node in self.tree.cache._tree.nodes():
            cached.update(node.blocks.tolist())
        held = set()
        for req in self.running:
            held |= {s // p for s in self._row(req, req.kv.kv_allocated_len)} - cached
        free = set(self.alloc.free_pages)
        assert not (free & cached) and not (free & held), "a page is free and in use"
        assert free | cached | held == set(range(1, self.alloc.num_pages + 1)), (
            f"pages leaked: {sorted(set(range(1, self.alloc.num_pages + 1)) - free - cached - held)[:10]}")
        assert self.tree.total_size() == len(cached) * p


def _as_row(values: List[int]):
    if SGLANG_BASE is not None:
        return torch.tensor(values, dtype=torch.int64)
    return np.asarray(values, dtype=np.int64)


def _slots(tree: RadixKVCache, tokens: List[int], extra_key: Optional[str] = None) -> List[int]:
    """Slot indices of the cached prefix of ``tokens``."""
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey(tokens, extra_key)))
    return [int(s) for s in np.asarray(tree.path_device_indices(m.last_device_node))]


# ---------------------------------------------------------------- unit behaviour
def test_match_insert_sizes_and_lock_deltas_page_size_1():
    engine = FakeEngine(page_size=1, num_pages=32)
    tree = engine.tree
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3])))
    assert m.device_prefix_len == 0 and m.host_hit_length == 0
    assert m.last_device_node.num_pages == 0 and len(tree.path_device_indices(m.last_device_node)) == 0
    req = engine.start([1, 2, 3, 4])
    engine.decode(req, [9, 8])
    engine.finish(req)
    assert tree.total_size() == 5 and tree.evictable_size() == 5 and tree.protected_size() == 0
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4, 9, 7])))
    assert m.device_prefix_len == 5 and len(tree.path_device_indices(m.last_device_node)) == 5
    inc = tree.inc_lock_ref(m.last_device_node)
    assert isinstance(inc, IncLockRefResult) and inc.delta == -5
    assert tree.protected_size() == 5 and tree.evictable_size() == 0
    assert tree.evict(EvictParams(num_tokens=5)).num_tokens_evicted == 0  # everything protected
    assert tree.dec_lock_ref(m.last_device_node, inc.to_dec_params()).delta == 5
    assert tree.evict(EvictParams(num_tokens=2)).num_tokens_evicted == 2 and tree.total_size() == 3
    engine.check()


def test_lock_and_unlock_nest_like_sglangs_tree_lock():
    engine = FakeEngine(page_size=2, num_pages=16)
    engine.finish(engine.start([1, 2, 3, 4, 5]))
    tree = engine.tree
    node = tree.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4]))).last_device_node
    first, second = tree.lock(node), tree.lock(node)
    assert tree.protected_size() == 4
    tree.unlock(first)
    assert tree.protected_size() == 4   # still held by the second lock
    tree.unlock(second)
    tree.unlock(None)                   # SGLang unlocks a request that never locked
    assert tree.protected_size() == 0 and tree.evictable_size() == 4
    engine.check()


def test_page_size_4_maps_slots_to_pages_and_frees_partial_pages():
    engine = FakeEngine(page_size=4, num_pages=16)
    req = engine.start(list(range(10)))          # 2 full pages + 2 tokens
    engine.decode(req, [50, 51, 52])
    engine.finish(req)                           # 12 tokens with KV -> 3 pages cached
    assert engine.tree.total_size() == 12
    slots = np.asarray(_slots(engine.tree, list(range(10)) + [50, 51, 99]))
    assert len(slots) == 12 and np.all(slots.reshape(3, 4) % 4 == np.arange(4))
    engine.check()


def test_insert_returns_the_cached_prefix_and_owns_new_pages():
    engine = FakeEngine(page_size=2, num_pages=8)
    tree, alloc = engine.tree, engine.alloc
    pages = [alloc.alloc_page() for _ in range(2)]
    value = _as_row([pages[0] * 2, pages[0] * 2 + 1, pages[1] * 2, pages[1] * 2 + 1, 99])
    result = tree.insert(InsertParams(key=RadixKey([1, 2, 3, 4, 5]), value=value))
    assert result.prefix_len == 0 and tree.total_size() == 4
    assert tree.path_device_indices(result.last_device_node).tolist() == [int(v) for v in value[:4]]
    dup = alloc.alloc_page()
    again = tree.insert(InsertParams(key=RadixKey([1, 2]), value=_as_row([dup * 2, dup * 2 + 1])))
    assert again.prefix_len == 2           # the caller frees its duplicate page, as with SGLang
    alloc.free([dup * 2])
    engine.check()


def test_insert_with_misaligned_slots_raises_and_changes_nothing():
    engine = FakeEngine(page_size=4, num_pages=8)
    tree = engine.tree
    before = (tree.total_size(), tree.evictable_size(), engine.alloc.free_pages[:])
    with pytest.raises(InvalidBlocksError):
        tree.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=_as_row([4, 5, 7, 6])))  # not page * 4 + offset
    with pytest.raises(ValueError):
        tree.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=_as_row([4, 5, 6])))     # one slot missing
    with pytest.raises(ValueError):
        tree.insert(InsertParams(key=RadixKey([1, 2, 3, 4])))                                # no value
    with pytest.raises(TypeError):
        tree.evict(5)                                                                        # not EvictParams
    with pytest.raises(ValueError):
        tree.evict(EvictParams(num_tokens=-1))
    assert (tree.total_size(), tree.evictable_size(), engine.alloc.free_pages) == before
    engine.check()


def test_bigram_keys_are_refused():
    tree = FakeEngine(page_size=1, num_pages=4).tree
    with pytest.raises(ValueError, match="bigram"):
        tree.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3], is_bigram=True)))


def test_extra_key_and_cache_salt_isolate_requests():
    engine = FakeEngine(page_size=2, num_pages=32)
    for key in (None, "lora-7", "tenant-b"):
        req = engine.start([5, 6, 7, 8, 9], extra_key=key)
        engine.finish(req)
    assert engine.tree.total_size() == 12  # the same 4 tokens cached once per namespace
    for key in (None, "lora-7", "tenant-b"):
        slots = _slots(engine.tree, [5, 6, 7, 8], key)
        assert len(slots) == 4 and all(engine.kv[s][0] == key for s in slots)
    assert _slots(engine.tree, [5, 6, 7, 8], "other") == []
    salted = MatchPrefixParams(key=RadixKey([5, 6, 7, 8], "lora-7", cache_salt="s1"))
    assert engine.tree.match_prefix(salted).device_prefix_len == 0
    root = engine.tree.root_node_handle("lora-7")
    assert root is engine.tree.root_node_handle("lora-7") and len(engine.tree.path_device_indices(root)) == 0
    engine.check()


def test_limit_caps_the_match_like_sglangs_logprob_rule():
    engine = FakeEngine(page_size=1, num_pages=16)
    engine.finish(engine.start([3, 1, 4, 1, 5]))
    key = RadixKey([3, 1, 4, 1, 5], limit=3)
    assert engine.tree.match_prefix(MatchPrefixParams(key=key)).device_prefix_len == 3


def test_duplicate_prefix_computed_twice_is_freed_once():
    engine = FakeEngine(page_size=2, num_pages=32)
    a = engine.start([1, 2, 3, 4, 5, 6])
    b = engine.start([1, 2, 3, 4, 5, 6, 7, 8])   # same prefix, computed concurrently: a miss
    engine.finish(a)
    engine.check()
    engine.finish(b)                              # b's copies of a's pages are duplicates: freed
    assert engine.tree.total_size() == 8
    engine.check()


def test_chunked_prefill_rewrites_the_row_to_cached_copies():
    engine = FakeEngine(page_size=2, num_pages=32)
    first = engine.start(list(range(12)), chunk=5)
    engine.finish(first)
    second = engine.start(list(range(12)) + [40, 41, 42], chunk=3)  # hits 6 pages, then chunks
    assert second.kv.cache_protected_len >= 12
    engine.decode(second, [7])
    engine.finish(second)
    engine.check()


def test_chunk_computed_twice_switches_to_the_cached_copy():
    engine = FakeEngine(page_size=2, num_pages=32)
    prompt = [4, 4, 5, 5, 6, 6, 7, 7, 8]
    b = engine.start(prompt[:4])                  # b has computed 4 tokens and keeps running
    a = engine.start(prompt)                      # a computes the same prefix (no hit yet) ...
    engine.finish(a)                              # ... and caches it first
    engine.continue_prefill(b, prompt[4:8])       # b's next chunk finds its pages already cached
    assert b.kv.cache_protected_len == 8
    assert engine._row(b, 8) == _slots(engine.tree, prompt[:8])
    engine.check()
    engine.finish(b)
    engine.check()


def test_eviction_frees_pages_to_the_allocator():
    engine = FakeEngine(page_size=2, num_pages=6)
    for start in range(0, 40, 6):
        req = engine.start(list(range(start, start + 6)))
        engine.finish(req)
        engine.check()
    assert engine.tree.cache.evicted_blocks > 0
    assert engine.tree.total_size() + engine.alloc.available_size() == 12


def test_disable_caches_nothing_and_frees_everything():
    pool, alloc = FakeReqToTokenPool(4, 64), FakePagedAllocator(32, 1)
    tree = RadixKVCache(pool, alloc, 1, disable=True)
    assert not tree.supports_prefix_sharing()
    engine = FakeEngine(1, 32)
    engine.pool, engine.alloc, engine.tree = pool, alloc, tree
    req = engine.start([1, 2, 3, 4])
    engine.decode(req, [5, 6])
    engine.finish(req)
    assert tree.total_size() == 0 and alloc.available_size() == 32
    assert tree.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3]))).device_prefix_len == 0


def _event_types():
    """The event module take_events draws from: SGLang's kv_events when installed, else radixkv.events."""
    if SGLANG_BASE is None:
        return radixkv.events
    from sglang.srt.disaggregation import kv_events

    return kv_events


def test_events_and_reset():
    ev = _event_types()
    engine = FakeEngine(page_size=2, num_pages=4, events=True)
    req = engine.start([1, 2, 3, 4, 5])
    engine.finish(req)
    stored = engine.tree.take_events()
    assert [type(e) for e in stored] == [ev.BlockStored]
    assert stored[0].token_ids == [1, 2, 3, 4] and stored[0].block_size == 2
    req = engine.start([9, 9, 8, 8, 7, 7, 1])   # needs 3 pages of 4: evicts
    engine.finish(req)
    kinds = [type(e) for e in engine.tree.take_events()]
    assert ev.BlockRemoved in kinds and ev.BlockStored in kinds
    engine.tree.reset()
    assert engine.tree.total_size() == 0 and type(engine.tree.take_events()[-1]) is ev.AllBlocksCleared
    engine.tree.check()


def test_take_events_without_sglang_are_radixkvs_events_in_order():
    """Standalone (the main suite): radixkv's mirrors, every field; with SGLang, the same sequence in its types."""
    ev = _event_types()
    engine = FakeEngine(page_size=2, num_pages=4, events=True)
    engine.finish(engine.start([1, 2, 3, 4, 5], extra_key="lora-a"))
    engine.finish(engine.start([9, 9, 8, 8, 7, 7, 1]))  # 3 pages of 3 free: evicts both of lora-a's
    engine.tree.reset()
    events = engine.tree.take_events()
    assert [type(e) for e in events] == [
        ev.BlockStored, ev.BlockRemoved, ev.BlockRemoved, ev.BlockStored, ev.AllBlocksCleared]
    first, tail, head, second, _ = events  # eviction takes a page at a time, from the leaf's tail
    assert tail.block_hashes + head.block_hashes == first.block_hashes[::-1] and len(first.block_hashes) == 2
    assert (first.parent_block_hash, first.token_ids, first.block_size, first.lora_id, first.medium) == (
        None, [1, 2, 3, 4], 2, None, "GPU")
    assert second.token_ids == [9, 9, 8, 8, 7, 7] and second.parent_block_hash is None
    assert not set(first.block_hashes) & set(second.block_hashes)
    if SGLANG_BASE is None:
        # the namespace of (extra_key="lora-a", no salt): json.dumps(["lora-a", None])
        assert isinstance(first, radixkv.events.KVCacheEvent) and first.extra_keys == [('["lora-a", null]',), None]
        assert second.extra_keys is None and tail.medium == head.medium == "GPU"
        assert [e.as_dict()["type"] for e in events] == [
            "BlockStored", "BlockRemoved", "BlockRemoved", "BlockStored", "AllBlocksCleared"]


def test_sglang_0_5_5_calling_convention_still_works():
    engine = FakeEngine(page_size=1, num_pages=16)
    engine.finish(engine.start([3, 1, 4, 1, 5]))
    m = engine.tree.match_prefix(RadixKey([3, 1, 4, 1, 5]))
    assert isinstance(m, LegacyMatchResult) and len(m.device_indices) == 5
    page = engine.alloc.alloc_page()
    assert engine.tree.insert(RadixKey([3, 1, 4, 1, 5, 9]), _as_row(list(m.device_indices) + [page])) == 5
    assert engine.tree.total_size() == 6
    engine.check()


def test_standalone_signatures_match_sglang_0_5_23_as_written_down():
    """Without SGLang: the 0.5.23 abstract methods' parameters (name, kind, default), written down here.

    The optional test below checks the same against the installed SGLang itself.
    """
    P = inspect.Parameter
    expected = {
        "reset": [], "match_prefix": [("params", P.POSITIONAL_OR_KEYWORD, P.empty)],
        "checkpoint": [("req", P.POSITIONAL_OR_KEYWORD, P.empty), ("up_to", P.KEYWORD_ONLY, P.empty),
                       ("kwargs", P.VAR_KEYWORD, P.empty)],
        "evict": [("params", P.POSITIONAL_OR_KEYWORD, P.empty)],
        "inc_lock_ref": [("node", P.POSITIONAL_OR_KEYWORD, P.empty)],
        "dec_lock_ref": [("node", P.POSITIONAL_OR_KEYWORD, P.empty), ("params", P.POSITIONAL_OR_KEYWORD, None)],
    }
    for name, params in expected.items():
        sig = inspect.signature(getattr(RadixKVCache, name))
        got = [(p.name, p.kind, p.default) for p in sig.parameters.values()][1:]
        assert got == params, f"{name}{sig}"
    for attr in ("req_to_token_pool", "token_to_kv_pool_allocator", "page_size", "disable"):
        assert hasattr(FakeEngine(1, 4).tree, attr)


class HalfAdmitting(LRU):
    """Admission control: caches only the first half of any run of new pages."""

    name = "half-admitting"

    def admit(self, node_parent, num_pages, now, *rest):
        return num_pages // 2


# ---------------------------------------------------------------- random workloads
@settings(max_examples=40, deadline=None)
@given(page_size=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**16),
       extra_keys=st.sampled_from([(None,), (None, "lora-1")]), declines=st.booleans())
def test_random_workload_never_leaks_double_frees_or_serves_wrong_kv(page_size, seed, extra_keys, declines):
    rng = random.Random(seed)
    engine = FakeEngine(page_size=page_size, num_pages=48 // page_size + 4,
                        policy=HalfAdmitting() if declines else "lru")
    prefixes = [[rng.randrange(4) for _ in range(rng.randrange(0, 10))] for _ in range(3)]
    for _ in range(12):
        if engine.running and (rng.random() < 0.5 or len(engine.running) >= 2):
            engine.finish(engine.running[0])
        else:
            prompt = rng.choice(prefixes) + [rng.randrange(4) for _ in range(rng.randrange(1, 8))]
            try:
                req = engine.start(prompt, rng.choice(extra_keys), chunk=rng.choice([0, 3, 5]))
            except MemoryError:
                continue  # every page held by running requests; the scheduler would wait
            engine.decode(req, [rng.randrange(4) for _ in range(rng.randrange(0, 4))])
        engine.check()
    while engine.running:
        engine.finish(engine.running[0])
    engine.check()
    assert engine.tree.protected_size() == 0


# ---------------------------------------------------------------- namespaces: (extra_key, cache_salt)
def _stored_salts(events) -> List[Optional[str]]:
    """The cache_salt each BlockStored event attributes its pages to.

    SGLang's events carry it; radixkv's mirrors name the namespace on a
    sequence's first page, which here is decoded (json) to its (extra_key, cache_salt).
    """
    salts = []
    for e in events:
        if type(e).__name__ != "BlockStored":
            continue
        if SGLANG_BASE is not None:
            salts.append(e.cache_salt)
        elif e.parent_block_hash is None:
            namespace = e.extra_keys[0][0] if e.extra_keys and e.extra_keys[0] else None
            salts.append(None if namespace is None else json.loads(namespace)[1])
    return salts


def test_unsalted_extra_key_spelling_a_salted_namespace_does_not_read_its_pages():
    """An unsalted extra_key whose text is the old salted encoding of (None, "tenant-b") once read tenant-b's pages."""
    engine = FakeEngine(page_size=2, num_pages=16, events=True)
    engine.finish(engine.start([1, 2, 3, 4, 5], cache_salt="tenant-b"))
    assert _stored_salts(engine.tree.take_events()) == ["tenant-b"]
    forged = engine.start([1, 2, 3, 4, 5], extra_key='[null, "tenant-b"]')  # start() checks every served slot
    assert forged.hit == 0
    engine.finish(forged)
    assert _stored_salts(engine.tree.take_events()) == [None]  # not attributed to tenant-b either
    assert engine.tree.total_size() == 8
    engine.check()


def test_extra_key_and_cache_salt_must_be_str_or_none():
    engine = FakeEngine(page_size=2, num_pages=8)
    engine.finish(engine.start([1, 2, 3, 4, 5]))
    before = (engine.tree.total_size(), engine.tree.cache.clock)
    for key in (RadixKey([1, 2, 3, 4], extra_key=7), RadixKey([1, 2, 3, 4], cache_salt=b"salt")):
        with pytest.raises(ArgumentTypeError, match="extra_key|cache_salt"):
            engine.tree.match_prefix(MatchPrefixParams(key=key))
    assert (engine.tree.total_size(), engine.tree.cache.clock) == before
    engine.check()


def _json_like(pair) -> str:
    return json.dumps(list(pair))


_TEXT = st.one_of(
    st.text(st.characters(codec=None, exclude_categories=()), max_size=5),  # surrogates included
    st.sampled_from(["", "null", "[null, null]", '[null, "tenant-b"]', '["lora-a", null]', '["", ""]', "\ud800"]))
_OPT_TEXT = st.one_of(st.none(), _TEXT)
_PAIR = st.tuples(_OPT_TEXT, _OPT_TEXT)
# An unsalted extra_key that spells another pair's json (with and without spaces) tries to alias it.
_FORGED = _PAIR.flatmap(lambda pair: st.sampled_from([
    (_json_like(pair), None), (_json_like(pair).replace(", ", ","), None), (_json_like(pair), "")]))


@given(pairs=st.lists(st.one_of(_PAIR, _FORGED), min_size=2, max_size=4))
def test_distinct_extra_key_cache_salt_pairs_never_share_pages(pairs):
    """Generated (extra_key, cache_salt) pairs, JSON-looking text included: a hit iff the pair was served before.

    SGLang treats an empty cache_salt as none. Every served slot is checked
    against the pair it was computed for (FakeEngine.start), and the events
    attribute each pair's pages to its own salt.
    """
    engine = FakeEngine(page_size=2, num_pages=4 * len(pairs) + 2, events=True)
    prompt = [3, 1, 4, 1, 5]
    seen = set()
    for extra_key, salt in pairs:
        same = (extra_key, salt or None)
        req = engine.start(prompt, extra_key=extra_key, cache_salt=salt)
        assert req.hit == (4 if same in seen else 0), (pairs, same)
        engine.finish(req)
        assert _stored_salts(engine.tree.take_events()) == ([] if same in seen else [salt or None])
        seen.add(same)
        engine.check()
    assert engine.tree.total_size() == 4 * len(seen)


# ---------------------------------------------------------------- SGLang's eviction_policy
def _tree(policy="lru", config=None, **kwargs) -> RadixKVCache:
    return RadixKVCache(FakeReqToTokenPool(2, 16), FakePagedAllocator(16, 2), 2, eviction_policy=policy,
                        eviction_policy_config=config, **kwargs)


def test_sglang_eviction_policy_names_map_to_radixkv_policies():
    for name, cls in [("lru", LRU), ("LRU", LRU), ("lfu", LFU), ("fifo", FIFO), ("slru", SLRU), ("sieve", SIEVE)]:
        assert type(_tree(name).cache.policy) is cls, name
    assert _tree("lfu").cache.policy.aging is False  # SGLang's LFU: (hit count, last use), no aging
    assert _tree("lfu-da").cache.policy.aging is True  # radixkv's LFU-DA stays reachable
    assert _tree("slru").cache.policy.protected_threshold == 2
    assert _tree("slru", {"protected_threshold": 3}).cache.policy.protected_threshold == 3
    policy = HalfAdmitting()
    assert _tree(policy).cache.policy is policy


def test_sglang_eviction_policies_without_a_radixkv_counterpart_are_refused():
    for name in ("mru", "filo", "priority", "tlru", "MRU", "no-such-policy"):
        with pytest.raises(ArgumentValueError, match=f"{name!r}.*fifo, lfu, lru, slru"):
            _tree(name)
    with pytest.raises(ArgumentValueError, match="protected_threshold"):
        _tree("lru", {"protected_threshold": 3})  # SGLang's LRU takes no options either
    with pytest.raises(ArgumentValueError, match="protected_threshold"):
        _tree("slru", {"protected_threshold": 0})
    with pytest.raises(ArgumentTypeError, match="eviction_policy_config"):
        _tree("slru", "protected_threshold=3")
    with pytest.raises(ArgumentTypeError, match="aging"):
        _tree("lfu", {"aging": 0})
    with pytest.raises(ArgumentTypeError, match="eviction_policy"):
        _tree(3)
    with pytest.raises(ArgumentValueError, match="eviction_policy_config"):
        _tree(HalfAdmitting(), {"protected_threshold": 3})
    assert _tree("mru", {"x": 1}, disable=True).cache.num_cached_blocks == 0  # as SGLang: disabled, not built


def test_from_params_honours_sglangs_eviction_policy():
    from types import SimpleNamespace

    def params(policy, config=None):
        return SimpleNamespace(req_to_token_pool=FakeReqToTokenPool(2, 16), page_size=2, disable=False,
                               token_to_kv_pool_allocator=FakePagedAllocator(16, 2), enable_kv_cache_events=False,
                               eviction_policy=policy, eviction_policy_config=config)

    assert type(RadixKVCache.from_params(params("lfu")).cache.policy) is LFU
    assert RadixKVCache.from_params(params("slru", {"protected_threshold": 4})).cache.policy.protected_threshold == 4
    assert type(RadixKVCache.from_params(params("lfu"), eviction_policy="fifo").cache.policy) is FIFO
    with pytest.raises(ArgumentValueError, match="'mru'"):
        RadixKVCache.from_params(params("mru"))


def _survivor(policy: str) -> str:
    """Cache X (two requests), then Y (one request, newer); a third prompt evicts one of them: which stays."""
    engine = FakeEngine(page_size=2, num_pages=5, policy=policy)
    x, y = [1, 1, 2, 2, 0], [3, 3, 4, 4, 0]
    for prompt in (x, x, y, [5, 5, 6, 6, 0]):
        engine.finish(engine.start(prompt))
        engine.check()
    hit = {name: engine.tree.match_prefix(MatchPrefixParams(key=RadixKey(p[:4]))).device_prefix_len
           for name, p in (("x", x), ("y", y))}
    assert sorted(hit.values()) == [0, 4], hit
    return "x" if hit["x"] else "y"


def test_sglang_policies_rank_like_sglangs_strategies():
    """SGLang's lfu and slru keep the page two requests used over a newer one used once; lru and fifo do not.

    slru also pins that one request gives a new page one use: the adapter's
    lookup after its own insert is not a use (else Y would be protected at once).
    """
    assert {policy: _survivor(policy) for policy in ("lru", "fifo", "lfu", "slru")} == {
        "lru": "y", "fifo": "y", "lfu": "x", "slru": "x"}


def test_sglang_lfu_does_not_age_like_lfu_da():
    """A prefix used often early keeps its place under SGLang's lfu while one-off prompts churn; LFU-DA ages it out."""
    def kept(policy: str) -> bool:
        engine = FakeEngine(page_size=2, num_pages=6, policy=policy)
        hot = [9, 9, 8, 8, 0]
        for _ in range(3):
            engine.finish(engine.start(hot))
        for n in range(12):
            engine.finish(engine.start([n, n, n + 1, n + 1, 0]))
            engine.check()
        return engine.tree.match_prefix(MatchPrefixParams(key=RadixKey(hot[:4]))).device_prefix_len == 4

    assert kept("lfu") and not kept("lfu-da") and not kept("lru")


# ---------------------------------------------------------------- aborted requests
def test_aborted_chunked_prefill_caches_only_its_checkpointed_chunks():
    """SGLang aborts a chunked prefill with release_kv_cache(checkpoint=False): the running chunk is never cached."""
    engine = FakeEngine(page_size=2, num_pages=12)
    prompt = list(range(20, 32))
    req = engine.start(prompt[:8], chunk=4)  # chunk [0, 4) checkpointed, [4, 8) computed, not yet checkpointed
    engine._compute(req, 8, 11, prompt, forward=False)  # the next chunk: slots allocated, its forward never ran
    engine.check()
    assert engine.tree.total_size() == 4 and engine.tree.protected_size() == 4
    engine.abort(req)
    assert engine.tree.total_size() == 4 and engine.tree.protected_size() == 0
    assert engine.alloc.available_size() + engine.tree.total_size() == 24
    engine.check()
    again = engine.start(prompt)  # start() checks that every served slot holds this prompt's KV
    assert again.hit == 4
    engine.finish(again)
    engine.check()


def test_checkpoint_never_caches_past_the_committed_kv():
    """A checkpoint asked to cache row positions whose forward has not run caches only the committed part."""
    engine = FakeEngine(page_size=2, num_pages=12)
    prompt = list(range(40, 50))
    req = engine.start(prompt[:4])
    engine._compute(req, 4, 10, prompt, forward=False)
    req.full_untruncated_fill_ids = list(prompt)
    engine.tree.checkpoint(req, up_to=10)
    assert engine.tree.total_size() == 4 and req.kv.cache_protected_len == 4
    engine.abort(req)
    engine.check()
    assert engine.tree.total_size() == 4
    engine.finish(engine.start(prompt))  # served 4 tokens, each checked; the other 6 recomputed
    engine.check()

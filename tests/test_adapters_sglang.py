"""The SGLang-shaped adapter, driven the way SGLang's scheduler drives RadixCache.

SGLang is not needed: its request, ReqToTokenPool and paged allocator are
replaced by small duck-typed fakes that keep SGLang's conventions (slot =
page * page_size + offset, page 0 reserved, freeing any slot of a page frees
the page) and fail loudly on a double free. One optional test at the end runs
only when ``sglang`` is importable.
"""

from __future__ import annotations

import inspect
import random
from types import SimpleNamespace
from typing import List, Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.policies import LRU
from radixkv.adapters.sglang import MatchResult, RadixKey, RadixKVCache, register_with_sglang
from radixkv.errors import InvalidBlocksError
from radixkv.events import BlockRemoved, BlockStored


class FakeReqToTokenPool:
    def __init__(self, size: int, max_context_len: int) -> None:
        self.req_to_token = np.zeros((size, max_context_len), dtype=np.int32)
        self.free_slots = list(range(size))

    def alloc(self) -> int:
        return self.free_slots.pop()

    def write(self, indices, values) -> None:
        self.req_to_token[indices] = np.asarray(values)

    def free(self, idx: int) -> None:
        assert idx not in self.free_slots, f"request slot {idx} freed twice"
        self.free_slots.append(idx)


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


class FakeReq:
    def __init__(self, prompt: List[int], extra_key: Optional[str] = None) -> None:
        self.origin_input_ids = list(prompt)
        self.output_ids: List[int] = []
        self.fill_ids = list(prompt)
        self.extra_key = extra_key
        self.req_pool_idx = None
        self.prefix_indices = np.empty(0, dtype=np.int64)
        self.last_node = None
        self.cache_protected_len = 0


class FakeEngine:
    """A scheduler loop in SGLang's order: match, lock, extend (chunked), decode, cache_finished_req.

    ``kv[slot]`` records which (namespace, prefix) a slot's KV was computed for,
    so a wrongly served slot is caught when it is read.
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
            self.tree.evict(self.page_size)
            page = self.alloc.alloc_page()
        if page is None:
            raise MemoryError("out of KV pages")
        return page

    def _compute(self, req: FakeReq, start: int, end: int, tokens: List[int]) -> None:
        """Give tokens start..end slots (continuing the request's last page) and 'compute' their KV."""
        p = self.page_size
        row = self.pool.req_to_token[req.req_pool_idx]
        for i in range(start, end):
            if i % p == 0:
                row[i] = self._new_page() * p
            else:
                row[i] = row[i - 1] + 1
            self.kv[int(row[i])] = (req.extra_key, tuple(tokens[: i + 1]))

    def _verify(self, req: FakeReq, n: int, tokens: List[int]) -> None:
        row = self.pool.req_to_token[req.req_pool_idx]
        for i in range(n):
            assert self.kv.get(int(row[i])) == (req.extra_key, tuple(tokens[: i + 1])), (
                f"slot {int(row[i])} for token {i} holds KV of {self.kv.get(int(row[i]))}")

    def start(self, prompt: List[int], extra_key: Optional[str] = None, chunk: int = 0) -> FakeReq:
        req = FakeReq(prompt, extra_key)
        m = self.tree.match_prefix(RadixKey(prompt, extra_key))
        assert isinstance(m, MatchResult) and m.last_host_node is m.last_device_node
        req.prefix_indices = m.device_indices
        req.last_node = m.last_device_node
        req.cache_protected_len = len(m.device_indices)
        self.tree.inc_lock_ref(req.last_node)
        req.req_pool_idx = self.pool.alloc()
        hit = len(m.device_indices)
        self.pool.write((req.req_pool_idx, slice(0, hit)), m.device_indices)
        self._verify(req, hit, prompt)
        done = hit
        step = chunk or len(prompt)
        while done < len(prompt):  # chunked prefill: cache_unfinished_req after every chunk but the last
            end = min(len(prompt), done + step)
            self._compute(req, done, end, prompt)
            done = end
            if done < len(prompt):
                req.fill_ids = prompt[:done]
                self.tree.cache_unfinished_req(req, chunked=True)
                self._verify(req, done, prompt)
        req.fill_ids = list(prompt)
        self.running.append(req)
        return req

    def continue_prefill(self, req: FakeReq, more: List[int]) -> None:
        """Prefill ``more`` prompt tokens of a running request as one more chunk, then cache it."""
        start = len(req.origin_input_ids)
        req.origin_input_ids += list(more)
        self._compute(req, start, len(req.origin_input_ids), req.origin_input_ids)
        req.fill_ids = list(req.origin_input_ids)
        self.tree.cache_unfinished_req(req, chunked=True)
        self._verify(req, len(req.fill_ids), req.fill_ids)

    def decode(self, req: FakeReq, new_tokens: List[int]) -> None:
        for t in new_tokens:
            seq = req.origin_input_ids + req.output_ids
            if req.output_ids:  # the previous output token is fed now: it gets a slot
                self._compute(req, len(seq) - 1, len(seq), seq)
            req.output_ids.append(t)

    def finish(self, req: FakeReq) -> None:
        seq = req.origin_input_ids + req.output_ids
        self._verify(req, len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0), seq)
        self.running.remove(req)
        self.tree.cache_finished_req(req)

    def check(self) -> None:
        """No page lost, none in two places: free + cached + held by running requests == all pages."""
        self.tree.check()
        p = self.page_size
        cached = set()
        for node in self.tree.cache._tree.nodes():
            cached.update(node.blocks.tolist())
        held = set()
        for req in self.running:
            n = len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)
            pages = set((self.pool.req_to_token[req.req_pool_idx, :n] // p).tolist())
            held |= pages - cached
        free = set(self.alloc.free_pages)
        assert not (free & cached) and not (free & held), "a page is free and in use"
        assert free | cached | held == set(range(1, self.alloc.num_pages + 1)), (
            f"pages leaked: {sorted(set(range(1, self.alloc.num_pages + 1)) - free - cached - held)[:10]}")
        assert self.tree.total_size() == len(cached) * p


# ---------------------------------------------------------------- unit behaviour
def test_match_insert_sizes_and_lock_deltas_page_size_1():
    engine = FakeEngine(page_size=1, num_pages=32)
    tree = engine.tree
    m = tree.match_prefix(RadixKey([1, 2, 3]))
    assert len(m.device_indices) == 0 and m.host_hit_length == 0
    req = engine.start([1, 2, 3, 4])
    engine.decode(req, [9, 8])
    engine.finish(req)
    assert tree.total_size() == 5 and tree.evictable_size() == 5 and tree.protected_size() == 0
    m = tree.match_prefix(RadixKey([1, 2, 3, 4, 9, 7]))
    assert len(m.device_indices) == 5
    assert tree.inc_lock_ref(m.last_device_node) == -5
    assert tree.protected_size() == 5 and tree.evictable_size() == 0
    assert tree.evict(5) == 0  # everything protected
    assert tree.dec_lock_ref(m.last_device_node) == 5
    assert tree.evict(2) == 2 and tree.total_size() == 3
    engine.check()


def test_page_size_4_maps_slots_to_pages_and_frees_partial_pages():
    engine = FakeEngine(page_size=4, num_pages=16)
    req = engine.start(list(range(10)))          # 2 full pages + 2 tokens
    engine.decode(req, [50, 51, 52])
    engine.finish(req)                           # 12 tokens with KV -> 3 pages cached
    assert engine.tree.total_size() == 12
    m = engine.tree.match_prefix(RadixKey(list(range(10)) + [50, 51, 99]))
    slots = np.asarray(m.device_indices)
    assert len(slots) == 12 and np.all(slots.reshape(3, 4) % 4 == np.arange(4))
    engine.check()


def test_insert_with_misaligned_slots_raises_and_changes_nothing():
    engine = FakeEngine(page_size=4, num_pages=8)
    tree = engine.tree
    before = (tree.total_size(), tree.evictable_size(), engine.alloc.free_pages[:])
    with pytest.raises(InvalidBlocksError):
        tree.insert(RadixKey([1, 2, 3, 4]), np.array([4, 5, 7, 6]))  # not page * 4 + offset
    with pytest.raises(ValueError):
        tree.insert(RadixKey([1, 2, 3, 4]), np.array([4, 5, 6]))     # one slot missing
    with pytest.raises(ValueError):
        tree.insert(RadixKey([1, 2, 3, 4]))                          # no value
    assert (tree.total_size(), tree.evictable_size(), engine.alloc.free_pages) == before
    engine.check()


def test_extra_key_isolates_requests():
    engine = FakeEngine(page_size=2, num_pages=32)
    for key in (None, "lora-7", "tenant-b"):
        req = engine.start([5, 6, 7, 8, 9], extra_key=key)
        engine.finish(req)
    assert engine.tree.total_size() == 12  # the same 4 tokens cached once per namespace
    for key in (None, "lora-7", "tenant-b"):
        m = engine.tree.match_prefix(RadixKey([5, 6, 7, 8], key))
        assert len(m.device_indices) == 4
        assert all(engine.kv[int(s)][0] == key for s in m.device_indices)
    assert len(engine.tree.match_prefix(RadixKey([5, 6, 7, 8], "other")).device_indices) == 0
    engine.check()


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
    assert second.cache_protected_len >= 12
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
    assert b.cache_protected_len == 8
    row = engine.pool.req_to_token[b.req_pool_idx, :8]
    assert np.array_equal(row, engine.tree.match_prefix(RadixKey(prompt[:8])).device_indices)
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
    engine = FakeEngine(1, 32)
    engine.pool, engine.alloc, engine.tree = pool, alloc, tree
    req = engine.start([1, 2, 3, 4])
    engine.decode(req, [5, 6])
    engine.finish(req)
    assert tree.total_size() == 0 and alloc.available_size() == 32
    assert len(tree.match_prefix(RadixKey([1, 2, 3])).device_indices) == 0


def test_events_and_reset():
    engine = FakeEngine(page_size=2, num_pages=4, events=True)
    req = engine.start([1, 2, 3, 4, 5])
    engine.finish(req)
    stored = engine.tree.take_events()
    assert [type(e) for e in stored] == [BlockStored]
    assert stored[0].token_ids == [1, 2, 3, 4] and stored[0].block_size == 2
    req = engine.start([9, 9, 8, 8, 7, 7, 1])   # needs 3 pages of 4: evicts
    engine.finish(req)
    kinds = [type(e) for e in engine.tree.take_events()]
    assert BlockRemoved in kinds and BlockStored in kinds
    engine.tree.reset()
    assert engine.tree.total_size() == 0 and engine.tree.take_events()[-1].as_dict()["type"] == "AllBlocksCleared"
    engine.tree.check()


def test_newer_sglang_parameter_objects_are_accepted():
    engine = FakeEngine(page_size=1, num_pages=16)
    engine.finish(engine.start([3, 1, 4, 1, 5]))
    m = engine.tree.match_prefix(SimpleNamespace(key=RadixKey([3, 1, 4, 1, 5])))
    assert len(m.device_indices) == 5
    assert engine.tree.evict(SimpleNamespace(num_tokens=2)) == 2
    engine.check()


def test_method_set_matches_sglang_base_prefix_cache():
    """The method names and parameters of SGLang v0.5.5's BasePrefixCache, written down here."""
    expected = {
        "reset": [], "match_prefix": ["key"], "cache_finished_req": ["req", "is_insert"],
        "cache_unfinished_req": ["req", "chunked"], "evict": ["num_tokens"], "inc_lock_ref": ["node"],
        "dec_lock_ref": ["node", "swa_uuid_for_lock"], "evictable_size": [], "protected_size": [],
        "total_size": [], "take_events": [], "insert": ["key", "value", "chunked"], "pretty_print": [],
    }
    for name, params in expected.items():
        sig = inspect.signature(getattr(RadixKVCache, name))
        names = [p for p in sig.parameters if p != "self"]
        assert names[: len(params)] == params, f"{name}{sig}"
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


# ---------------------------------------------------------------- optional: real SGLang
def test_against_real_sglang_base_class():
    """OPTIONAL: runs only where the ``sglang`` package is importable (skipped otherwise)."""
    base_module = pytest.importorskip("sglang.srt.mem_cache.base_prefix_cache")
    base = base_module.BasePrefixCache
    assert register_with_sglang()
    engine = FakeEngine(page_size=1, num_pages=8)
    assert isinstance(engine.tree, base)
    for name in getattr(base, "__abstractmethods__", ()):
        assert callable(getattr(RadixKVCache, name, None)), f"missing {name}"

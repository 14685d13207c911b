"""The SGLang adapter driven by a real SGLang install (the version bench/peers/setup.sh pins).

Collected only where ``sglang`` is importable (tests/conftest.py): the main suite
does not install SGLang and its torch dependency. Run with ``make test-sglang``.
"""

from __future__ import annotations

import inspect
import random
from array import array
from types import SimpleNamespace
from typing import List

import pytest
import torch

from .test_adapters_sglang import FakeEngine  # first: installs the torchvision stand-in SGLang imports

from radixkv.adapters.sglang import (  # noqa: E402  (after the stand-in, or SGLANG_BASE is None here)
    SGLANG_BASE, SGLANG_EVICTION_POLICIES, EvictResult, IncLockRefResult, MatchResult, RadixKey, RadixKVCache,
    register_with_sglang)
from radixkv.errors import ArgumentValueError  # noqa: E402
from radixkv.policies import LFU, SLRU  # noqa: E402


def _sglang():
    """SGLang's modules (this file is collected only where sglang is importable: a failure here is real)."""
    import dataclasses

    from sglang.srt.mem_cache import base_prefix_cache, common, radix_cache
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.managers.schedule_batch import ReqKvInfo

    return SimpleNamespace(base=base_prefix_cache, common=common, radix=radix_cache, dc=dataclasses,
                           Allocator=PagedTokenToKVPoolAllocator, CacheInitParams=CacheInitParams,
                           ReqToTokenPool=ReqToTokenPool, ReqKvInfo=ReqKvInfo)


def _no_server(sgl, monkeypatch):
    """release_kv_cache reads two server flags (speculative decoding, strip-thinking); a plain server has neither."""
    monkeypatch.setattr(sgl.common, "get_spec", lambda: SimpleNamespace(speculative_algorithm=None))
    monkeypatch.setattr(sgl.common, "get_serving", lambda: SimpleNamespace(strip_thinking_cache=False))


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_signatures_equal_sglang_base_prefix_cache():
    """OPTIONAL (needs sglang): every abstract method of the installed BasePrefixCache, parameter for parameter."""
    sgl = _sglang()
    base = sgl.base.BasePrefixCache
    assert SGLANG_BASE is base and issubclass(RadixKVCache, base) and not inspect.isabstract(RadixKVCache)
    assert base.__abstractmethods__ >= {"reset", "match_prefix", "checkpoint", "evict", "inc_lock_ref", "dec_lock_ref"}
    for name in sorted(base.__abstractmethods__):
        assert _params(getattr(RadixKVCache, name)) == _params(getattr(base, name)), name
    # RadixCache's own public methods: SGLang's parameters first, anything extra has a default
    for name in ("insert", "path_device_indices", "touch_prefix", "supports_prefix_sharing",
                 "evictable_size", "protected_size", "total_size", "take_events", "pretty_print"):
        ours, theirs = _params(getattr(RadixKVCache, name)), _params(getattr(sgl.radix.RadixCache, name))
        assert ours[: len(theirs)] == theirs, name
        assert all(default is not inspect.Parameter.empty for _, _, default in ours[len(theirs):]), name


def test_results_are_sglangs_own_types():
    """OPTIONAL (needs sglang): what the adapter returns is SGLang's type and rebuilds as one field for field."""
    sgl = _sglang()
    b = sgl.base
    assert (MatchResult, EvictResult, IncLockRefResult, RadixKey) == (
        b.MatchResult, b.EvictResult, b.IncLockRefResult, sgl.radix.RadixKey)
    engine = FakeEngine(page_size=2, num_pages=8)
    engine.finish(engine.start([1, 2, 3, 4, 5]))
    tree = engine.tree
    m = tree.match_prefix(b.MatchPrefixParams(key=sgl.radix.RadixKey(array("q", [1, 2, 3, 4, 9]))))
    assert b.MatchResult(*m) == m and b.MatchResult(**m._asdict()).device_prefix_len == 4
    inc = tree.inc_lock_ref(m.last_device_node)
    assert b.IncLockRefResult(**sgl.dc.asdict(inc)) == inc and inc.delta == -4
    dec = tree.dec_lock_ref(m.last_device_node, inc.to_dec_params())
    assert isinstance(dec, b.DecLockRefResult) and b.DecLockRefResult(**sgl.dc.asdict(dec)).delta == 4
    ev = tree.evict(b.EvictParams(num_tokens=1))
    assert isinstance(ev, b.EvictResult) and b.EvictResult(**sgl.dc.asdict(ev)).num_tokens_evicted == 2
    lock = tree.lock(tree.root_node)  # SGLang's BasePrefixCache.lock, via our inc_lock_ref
    assert isinstance(lock, b.TreeLock)
    tree.unlock(lock)
    engine.check()


class SGLangReq:
    """A fake ``Req`` holding SGLang's real ``ReqKvInfo``: the attributes its scheduler helpers read."""

    def __init__(self, sgl, rid: str, prompt: List[int]) -> None:
        self.rid = rid
        self.origin_input_ids = array("q", prompt)
        self.output_ids = array("q")
        self.full_untruncated_fill_ids = array("q", prompt)
        self.extra_key = None
        self.cache_salt = None
        self.priority = None
        self.kv = sgl.ReqKvInfo()
        self.lock = None
        self.prefix_len = 0
        self.extend_end = 0
        self.finished_reason = None
        self.skip_radix_cache_insert = False

    def finished(self) -> bool:
        return self.finished_reason is not None

    def owned_kv_len(self) -> int:
        return self.kv.kv_committed_len

    def refresh_fill_ids(self) -> None:
        self.full_untruncated_fill_ids = self.origin_input_ids + self.output_ids

    def _compute_max_prefix_len(self, input_len: int) -> int:
        return input_len - 1


def _serve(sgl, tree, allocator, pool, prompts, page_size, chunk, kv=None, keys=None):
    """Serve ``prompts`` one at a time through SGLang's own scheduler helpers; return each request's hit length.

    match_kv_cache -> tree.lock (as PrefillAdder commits) -> evict_to_free_tokens + alloc -> row write
    -> checkpoint_kv_cache per chunk -> one output token -> release_kv_cache(checkpoint=True).
    ``kv`` (slot -> (extra_key, cache_salt, prefix) it holds), when given, checks every served slot.
    ``keys``: each request's (extra_key, cache_salt), default unset.
    """
    hits = []
    for n, prompt in enumerate(prompts):
        req = SGLangReq(sgl, f"r{n}", prompt)
        req.extra_key, req.cache_salt = keys[n] if keys else (None, None)
        owner = (req.extra_key, req.cache_salt or None)
        sgl.common.match_kv_cache(req, tree)
        req.kv.cache_protected_len = req.prefix_len
        req.lock = tree.lock(req.last_node)
        hits.append(req.prefix_len)
        pool.alloc([req])
        if req.prefix_len:
            prefix = tree.prefix_device_indices(req)
            pool.write((req.kv.req_pool_idx, slice(0, req.prefix_len)), prefix)
            if kv is not None:
                for i, slot in enumerate(prefix.tolist()):
                    assert kv.get(slot) == (*owner, tuple(prompt[: i + 1])), f"slot {slot} serves the wrong KV"
        req.kv.kv_committed_len = req.kv.kv_allocated_len = req.prefix_len
        while req.prefix_len < len(prompt):
            req.extend_end = min(len(prompt), req.prefix_len + chunk)
            need = -(-(req.extend_end - req.prefix_len) // page_size) * page_size
            allocator.evict_to_free_tokens(tree, need)
            slots = allocator.alloc(need)
            assert slots is not None, "out of KV pages"
            slots = slots[: req.extend_end - req.prefix_len]
            pool.write((req.kv.req_pool_idx, slice(req.prefix_len, req.extend_end)), slots.to(torch.int32))
            if kv is not None:
                for i, slot in enumerate(slots.tolist(), start=req.prefix_len):
                    kv[slot] = (*owner, tuple(prompt[: i + 1]))
            req.kv.kv_committed_len = req.kv.kv_allocated_len = req.extend_end
            if req.extend_end < len(prompt):
                sgl.common.checkpoint_kv_cache(req, tree)
            else:
                req.prefix_len = req.extend_end
        req.output_ids.append(7)
        req.finished_reason = "length"
        sgl.common.release_kv_cache(req, tree, checkpoint=True)
        assert req.kv.req_pool_idx is None and req.lock is None
        assert tree.protected_size() == 0
    return hits


def _sglang_setup(sgl, page_size, num_pages, make_tree):
    allocator = sgl.Allocator(size=num_pages * page_size, page_size=page_size, dtype=torch.float16,
                              device="cpu", kvcache=None, need_sort=False)
    pool = sgl.ReqToTokenPool(size=4, max_context_len=256, device="cpu", enable_memory_saver=False)
    return make_tree(pool, allocator), allocator, pool


def _workload(seed, n=30):
    rng = random.Random(seed)
    stems = [[rng.randrange(50) for _ in range(rng.randrange(0, 24))] for _ in range(4)]
    return [rng.choice(stems) + [rng.randrange(50) for _ in range(rng.randrange(1, 20))] for _ in range(n)]


@pytest.mark.parametrize("page_size", [1, 4])
def test_sglang_scheduler_helpers_drive_the_adapter_like_radix_cache(page_size, monkeypatch):
    """OPTIONAL (needs sglang): SGLang's match/checkpoint/release helpers drive RadixKVCache and RadixCache.

    With room for everything, both caches must report the same hit for every
    request and end with the same cached size; every KV page is accounted for.
    """
    sgl = _sglang()
    _no_server(sgl, monkeypatch)
    prompts = _workload(seed=page_size)
    num_pages = 512 // page_size

    def sglang_tree(pool, allocator):
        return sgl.radix.RadixCache(sgl.CacheInitParams(
            disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=allocator, page_size=page_size))

    ours, our_alloc, our_pool = _sglang_setup(sgl, page_size, num_pages, lambda p, a: RadixKVCache(p, a, page_size))
    our_hits = _serve(sgl, ours, our_alloc, our_pool, prompts, page_size, chunk=3 * page_size, kv={})
    theirs, their_alloc, their_pool = _sglang_setup(sgl, page_size, num_pages, sglang_tree)
    their_hits = _serve(sgl, theirs, their_alloc, their_pool, prompts, page_size, chunk=3 * page_size)
    assert our_hits == their_hits and sum(our_hits) > 0
    assert ours.total_size() == theirs.total_size()
    assert our_alloc.available_size() + ours.total_size() == num_pages * page_size
    ours.check()


def test_sglang_eviction_path_keeps_every_page_accounted_for(monkeypatch):
    """OPTIONAL (needs sglang): under memory pressure SGLang's evict_to_free_tokens evicts through the adapter."""
    sgl = _sglang()
    _no_server(sgl, monkeypatch)
    page_size, num_pages = 2, 24
    tree, allocator, pool = _sglang_setup(sgl, page_size, num_pages, lambda p, a: RadixKVCache(p, a, page_size))
    hits = _serve(sgl, tree, allocator, pool, _workload(seed=3, n=60), page_size, chunk=4, kv={})
    assert tree.cache.evicted_blocks > 0 and sum(hits) > 0
    assert allocator.available_size() + tree.total_size() == num_pages * page_size
    tree.check()


def test_register_with_sglang_adds_a_radix_cache_backend():
    """OPTIONAL (needs sglang): ``--radix-cache-backend radixkv`` builds a RadixKVCache from CacheInitParams."""
    sgl = _sglang()
    from sglang.srt.mem_cache import registry

    assert register_with_sglang() and register_with_sglang()  # idempotent
    tree, allocator, pool = _sglang_setup(sgl, 2, 16, lambda p, a: None)
    params = sgl.CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=allocator,
                                 page_size=2, enable_kv_cache_events=True)
    built = registry.get_radix_cache_factory("radixkv")(SimpleNamespace(params=params))
    assert isinstance(built, RadixKVCache) and built.page_size == 2 and built.enable_kv_cache_events
    built.check()


def _replayed_batches(kv_events, publisher, replay_endpoint: str) -> List[bytes]:
    """Every payload ``publisher`` sent, fetched back through its replay socket (no PUB/SUB join race)."""
    import zmq

    publisher._event_queue.join()  # the publisher thread has encoded and buffered every batch
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(replay_endpoint)
    try:
        sock.send_multipart((b"", (0).to_bytes(8, "big")))
        payloads = []
        while True:
            assert sock.poll(5000), "no reply from SGLang's replay socket"
            _, _, seq, payload = sock.recv_multipart()
            if seq == kv_events.ZmqEventPublisher.END_SEQ:
                return payloads
            payloads.append(payload)
    finally:
        sock.close(linger=0)


def test_take_events_round_trip_through_sglangs_publisher(monkeypatch):
    """OPTIONAL (needs sglang): take_events -> SGLang's KVEventBatch -> its ZMQ publisher's msgpack -> decode.

    What comes out equals what radixkv recorded, field for field: hashes (the
    same 64 bits, as int64), parent hash, tokens, block size, medium, and the
    cache_salt of the page's namespace, also on pages stored below a salted prefix.
    """
    import uuid

    import msgspec
    from sglang.srt.disaggregation import kv_events

    engine = FakeEngine(page_size=2, num_pages=9, events=True)
    tree = engine.tree
    recorded: list = []
    take = tree.cache.take_events

    def spy():
        events = take()
        recorded.extend(events)
        return events

    monkeypatch.setattr(tree.cache, "take_events", spy)
    name = f"inproc://radixkv-events-{uuid.uuid4().hex}"
    publisher = kv_events.ZmqEventPublisher(0, endpoint=name, replay_endpoint=name + "-replay")
    salt_of_start = {}  # first token of each prompt -> the cache_salt it was served with
    try:
        for prompt, extra_key, salt in [([1, 2, 3, 4, 5], None, None), ([1, 2, 3, 4, 6, 7, 8], None, None),
                                        ([5, 5, 6, 6, 7], "lora-a", "tenant-1"), ([5, 5, 6, 6, 8, 8, 9], "lora-a", "tenant-1"),
                                        ([7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7], None, "tenant-2"),  # evicts
                                        ([2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2], None, None)]:   # evicts
            salt_of_start[prompt[0]] = salt
            engine.finish(engine.start(prompt, extra_key=extra_key, cache_salt=salt))
            events = tree.take_events()
            assert events and all(isinstance(e, (kv_events.BlockStored, kv_events.BlockRemoved)) for e in events)
            publisher.publish(kv_events.KVEventBatch(ts=1.0, events=events))
        engine.check()
        tree.reset()
        publisher.publish(kv_events.KVEventBatch(ts=2.0, events=tree.take_events()))
        payloads = _replayed_batches(kv_events, publisher, name + "-replay")
    finally:
        publisher.shutdown()
    decoder = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)
    decoded = [e for payload in payloads for e in decoder.decode(payload).events]

    assert len(decoded) == len(recorded) and len(payloads) == 7
    kinds = [type(e).__name__ for e in decoded]
    assert kinds == [type(e).__name__ for e in recorded] and "BlockRemoved" in kinds and kinds[-1] == "AllBlocksCleared"
    u64 = (1 << 64) - 1
    assert any(h > 1 << 63 for e in recorded if hasattr(e, "block_hashes") for h in e.block_hashes)
    token_of_hash = {}  # radixkv hash -> first token of its sequence, to find each page's salt
    for ours, theirs in zip(recorded, decoded):
        if type(ours).__name__ == "AllBlocksCleared":
            continue
        assert [h & u64 for h in theirs.block_hashes] == ours.block_hashes
        assert all(-(1 << 63) <= h < 1 << 63 for h in theirs.block_hashes)  # SGLang's int64 convention
        assert theirs.medium == "GPU" == ours.medium
        if type(ours).__name__ == "BlockRemoved":
            continue
        parent = ours.parent_block_hash
        assert (theirs.parent_block_hash is None) == (parent is None)
        assert parent is None or theirs.parent_block_hash & u64 == parent
        assert (theirs.token_ids, theirs.block_size) == (ours.token_ids, ours.block_size) == (ours.token_ids, 2)
        assert (theirs.lora_id, theirs.session_id, theirs.lora_name) == (None, None, None)
        start = ours.token_ids[0] if parent is None else token_of_hash[parent]
        token_of_hash.update(dict.fromkeys(ours.block_hashes, start))
        assert theirs.cache_salt == salt_of_start[start], (ours, theirs)
    assert any(e.cache_salt == "tenant-1" and e.parent_block_hash is not None
               for e in decoded if isinstance(e, kv_events.BlockStored))


def test_extra_key_and_cache_salt_namespaces_hit_exactly_as_sglangs_radix_cache(monkeypatch):
    """OPTIONAL (needs sglang): (extra_key, cache_salt) pairs, JSON-looking and empty ones included, hit as in RadixCache.

    An unsalted extra_key spelling a salted pair's old namespace text must miss,
    as SGLang's own tree misses; every served slot holds its own pair's KV.
    """
    sgl = _sglang()
    _no_server(sgl, monkeypatch)
    page_size, num_pages = 2, 256
    pairs = [(None, None), (None, "tenant-b"), ('[null, "tenant-b"]', None), ("lora-a", None), ("lora-a", ""),
             ('["lora-a", null]', None), ("", None), (None, ""), ("lora-a", "tenant-b"), ('[null, "tenant-b"]', "")]
    keys = [pair for pair in pairs for _ in range(2)]
    prompts = [[1, 2, 3, 4, 5, 6, 7]] * len(keys)

    def sglang_tree(pool, allocator):
        return sgl.radix.RadixCache(sgl.CacheInitParams(
            disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=allocator, page_size=page_size))

    ours, our_alloc, our_pool = _sglang_setup(sgl, page_size, num_pages, lambda p, a: RadixKVCache(p, a, page_size))
    our_hits = _serve(sgl, ours, our_alloc, our_pool, prompts, page_size, chunk=4, kv={}, keys=keys)
    theirs, their_alloc, their_pool = _sglang_setup(sgl, page_size, num_pages, sglang_tree)
    their_hits = _serve(sgl, theirs, their_alloc, their_pool, prompts, page_size, chunk=4, keys=keys)
    assert our_hits == their_hits
    # each pair's second request hits; an empty salt is no salt, so those pairs hit at once;
    # (None, "tenant-b") is not '[null, "tenant-b"]' unsalted
    assert our_hits == [0, 6, 0, 6, 0, 6, 0, 6, 6, 6, 0, 6, 0, 6, 6, 6, 0, 6, 6, 6]
    assert ours.total_size() == theirs.total_size()
    ours.check()


def test_eviction_policy_names_are_sglangs_own():
    """OPTIONAL (needs sglang): the adapter knows every --radix-eviction-policy SGLang accepts, and builds from its params."""
    from sglang.srt.mem_cache import utils as mem_utils

    sgl = _sglang()
    assert set(SGLANG_EVICTION_POLICIES) == set(mem_utils._EVICTION_POLICY_FACTORIES)
    for name in SGLANG_EVICTION_POLICIES:
        mem_utils.get_eviction_strategy(name)  # SGLang builds each one
    _, allocator, pool = _sglang_setup(sgl, 2, 16, lambda p, a: None)

    def build(policy, config=None):
        params = sgl.CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=allocator,
                                     page_size=2, eviction_policy=policy, eviction_policy_config=config)
        return RadixKVCache.from_params(params)

    lfu = build("lfu").cache.policy
    assert type(lfu) is LFU and not lfu.aging
    slru = build("slru", {"protected_threshold": 3}).cache.policy
    assert type(slru) is SLRU and slru.protected_threshold == 3
    for name, target in SGLANG_EVICTION_POLICIES.items():
        if target is None:
            with pytest.raises(ArgumentValueError, match=repr(name)):
                build(name)


def test_aborted_request_through_sglangs_release_caches_nothing_of_it(monkeypatch):
    """OPTIONAL (needs sglang): the scheduler's abort (tree.finish(ABORT), release_kv_cache without checkpoint).

    A chunked prefill aborted after its first chunk was checkpointed keeps
    that chunk cached; the running chunk's pages all go back to the allocator.
    """
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle, CacheRequestOutcome

    sgl = _sglang()
    _no_server(sgl, monkeypatch)
    page_size, num_pages = 2, 32
    tree, allocator, pool = _sglang_setup(sgl, page_size, num_pages, lambda p, a: RadixKVCache(p, a, page_size))
    prompt = list(range(10, 22))
    req = SGLangReq(sgl, "aborted", prompt)
    sgl.common.match_kv_cache(req, tree)
    req.lock = tree.lock(req.last_node)
    pool.alloc([req])
    for end in (6, 10):  # chunk [0, 6) runs and is checkpointed; chunk [6, 10) is launched
        req.extend_end = end
        need = req.extend_end - req.prefix_len
        slots = allocator.alloc(-(-need // page_size) * page_size)[:need]
        pool.write((req.kv.req_pool_idx, slice(req.prefix_len, req.extend_end)), slots.to(torch.int32))
        req.kv.kv_committed_len = req.kv.kv_allocated_len = req.extend_end
        if end == 6:
            sgl.common.checkpoint_kv_cache(req, tree)
    assert tree.total_size() == 6
    tree.finish(CacheRequestHandle(rid=req.rid, attempt_id=0), CacheRequestOutcome.ABORT)
    req.finished_reason = "abort"
    sgl.common.release_kv_cache(req, tree, checkpoint=False)
    assert req.kv.req_pool_idx is None and req.lock is None
    assert tree.total_size() == 6 and tree.protected_size() == 0
    assert allocator.available_size() + tree.total_size() == num_pages * page_size
    tree.check()
    assert _serve(sgl, tree, allocator, pool, [prompt], page_size, chunk=4) == [6]
    tree.check()

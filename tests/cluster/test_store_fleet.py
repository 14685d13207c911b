"""A shared page store under the caches: a page one cache computed is served to another, verified.

The store itself (keys, value format, backends, faults against real Redis servers) is tested in
tests/store; these tests check the engine's side: what it reads, what it writes, and that a
page that fails verification is a miss, never served.
"""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.cluster import Cluster
from radixkv.errors import ArgumentTypeError, ArgumentValueError
from radixkv.store import Fingerprint, PageStore, drop_memory
from radixkv.tenancy import Isolated, KAnonymous
from radixkv.tiers import TieredCache
from radixkv.tiers.config import open_store

PS = 2
KV = (3,)


def page(tokens, d: int) -> np.ndarray:
    return np.full((PS, *KV), float(sum(tokens[: (d + 1) * PS]) * 10 + d), dtype=np.float32)


def serve(cache, tokens, **kw) -> int:
    """Admit ``tokens``, check every hit byte for byte, compute (write) the rest; return hit pages."""
    adm = cache.admit(tokens, **kw)
    hit = adm.hit_tokens // PS
    got = cache.read(adm.blocks[:hit])
    for d in range(hit):
        np.testing.assert_array_equal(got[d], page(tokens, d))
    if len(adm.new_blocks):
        cache.write(adm.new_blocks, np.stack([page(tokens, hit + j) for j in range(len(adm.new_blocks))]))
    adm.release()
    cache.check()
    return hit


@pytest.fixture
def store_url(request):
    name = f"test-{request.node.name}"
    yield f"memory://{name}"
    drop_memory(name)


def caches(url, n=2, sharing=None):
    return [TieredCache(8, page_size=PS, kv_shape=KV, dtype="float32", store=open_store(url, PS, kv_shape=KV,
                        dtype="float32"), sharing=sharing.fresh() if sharing is not None else None) for _ in range(n)]


def test_a_page_one_cache_wrote_is_served_to_another(store_url):
    a, b = caches(store_url)
    tokens = [1, 1, 2, 2, 3, 3]
    assert serve(a, tokens) == 0
    assert serve(b, tokens + [4, 4]) == 3  # from the store, bytes checked by serve
    assert b.hit_tokens_by_tier["store"] == 6 and b.store_hit_blocks == 3
    assert b.store.stats()["hits"] == 3 and a.store.stats()["pages_written"] == 3


def test_a_corrupt_value_is_a_counted_miss_never_served(store_url):
    a, b = caches(store_url)
    tokens = [1, 1, 2, 2, 3, 3]
    serve(a, tokens)
    chain = a.store.chain(tokens)
    a.store.backend._data[chain[1]] = a.store.backend._data[chain[1]][:-1] + b"\x00"  # one byte of page 1
    assert serve(b, tokens) == 1  # page 0 only: page 1 fails its digest, page 2 is past the gap
    assert b.store.stats()["integrity_misses"] == 1


def test_partitions_never_read_each_others_pages_from_the_store(store_url):
    for sharing in (Isolated(), KAnonymous(k=1)):
        a, b = caches(store_url, sharing=sharing)
        serve(a, [1, 1, 2, 2], tenant="x")
        assert serve(b, [1, 1, 2, 2], tenant="y") == 0  # another tenant's partition: other keys
        assert serve(b, [1, 1, 2, 2], tenant="x") == 2
        drop_memory(store_url[len("memory://"):])


def test_a_store_of_another_shape_or_page_size_is_refused(store_url):
    other = PageStore.open(store_url, Fingerprint(model="m", dtype="float32", kv_shape=(4,), page_size=PS))
    with pytest.raises(ArgumentValueError, match="fingerprint"):
        PrefixCache(8, page_size=PS, kv_shape=KV, dtype="float32", store=other)
    with pytest.raises(ArgumentValueError, match="page_size"):
        PrefixCache(8, page_size=4, store=open_store(store_url, PS))
    with pytest.raises(ArgumentTypeError, match="PageStore"):
        PrefixCache(8, page_size=PS, store=object())


def test_a_fleet_sharing_a_store_serves_every_turn_s_history():
    """Round robin over 2 instances: each turn's history was computed on the other instance."""
    from radixkv.workload.traces import Request

    trace = [Request(tokens=[1000 * s + j for j in range(8 * (t + 1))]) for t in range(5) for s in range(3)]
    alone = Cluster(2, num_blocks=64, page_size=4).replay(trace)
    shared = Cluster(2, num_blocks=64, page_size=4, store="memory").replay(trace)
    pooled = Cluster(1, num_blocks=128, page_size=4).replay(trace)
    assert shared.hit_tokens == pooled.hit_tokens > alone.hit_tokens
    assert shared.store_hit_tokens == shared.hit_tokens_by_tier["store"] > 0
    assert shared.store_stats["round_trips"] > 0 and shared.store_stats["integrity_misses"] == 0
    assert shared.ttft_saving_seconds < pooled.ttft_saving_seconds  # each store page paid its transfer


def test_write_back_stores_pages_when_hbm_evicts_them(store_url):
    """Under write-back a release writes nothing; the pages reach the store as HBM evicts them
    (one round trip an eviction), with their bytes, and another cache is served them."""
    a = TieredCache(4, page_size=PS, kv_shape=KV, dtype="float32", store_policy="write_back",
                    store=open_store(store_url, PS, kv_shape=KV, dtype="float32"))
    b = caches(store_url, n=1)[0]
    tokens = [1, 1, 2, 2, 3, 3]
    serve(a, tokens)
    assert a.store.stats()["pages_written"] == 0
    serve(a, [7, 7, 8, 8])  # needs 2 blocks, 1 is free: evicts one of the three
    assert a.store.stats()["pages_written"] == 1
    a.evict(a.evictable_blocks)
    assert a.store.stats()["pages_written"] == 5
    assert serve(b, tokens + [4, 4]) == 3
    with pytest.raises(ArgumentValueError, match="store_policy"):
        PrefixCache(4, page_size=PS, store_policy="write_around")

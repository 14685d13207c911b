"""Capacity in blocks, tokens, bytes and shares of a trace; a huge pool costs what it uses."""

import tracemalloc

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.capacity import describe, parse_bytes, parse_capacities, parse_capacity, resolve_blocks
from radixkv.costs import MODELS, kv_bytes_per_token
from radixkv.errors import ArgumentValueError
from radixkv.pool import BlockPool, CACHED, FREE, HELD


def test_a_huge_pool_allocates_what_it_uses():
    tracemalloc.start()
    try:
        cache = PrefixCache(num_blocks=2**24, page_size=16)
        for i in range(50):
            cache.admit(np.arange(i, i + 200)).release()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    cache.check()
    assert peak < 8 * 2**20, f"a 16M-block pool for 50 requests peaked at {peak / 2**20:.0f} MiB"
    assert cache.num_blocks == 2**24 and cache.num_free_blocks + cache.num_cached_blocks == 2**24


def test_a_pool_past_int32_ids_is_a_typed_error():
    with pytest.raises(ArgumentValueError, match="num_blocks must be at most 2,147,483,647"):
        PrefixCache(num_blocks=10**13, page_size=16)


def test_lazy_pool_hands_out_blocks_like_an_eager_stack():
    pool = BlockPool(3000, 4)
    first = pool.take(5)
    assert first.tolist() == [0, 1, 2, 3, 4]
    pool.give_back(np.array([3, 1], dtype=np.int32))
    assert pool.take(4).tolist() == [1, 3, 5, 6]  # returned blocks first (LIFO), then fresh ones in order
    assert pool.states(np.array([0, 5, 2999])).tolist() == [HELD, HELD, FREE]
    assert pool.count(FREE) == pool.num_free == 3000 - 7
    big = pool.take(2500)  # grows the bookkeeping past its first 1024 entries
    pool.set_state(big, CACHED)
    assert pool.count(CACHED) == 2500
    pool.give_back(big)
    pool.check()
    assert pool.num_free == 3000 - 7 and sorted(pool.take(2993).tolist()) == sorted(set(range(3000)) - {0, 1, 2, 3, 4, 5, 6})
    assert pool.num_free == 0
    pool.check()


@pytest.mark.parametrize("text, value", [("40GiB", 40 * 2**30), ("40GB", 40 * 10**9), ("40G", 40 * 10**9),
                                         ("512", 512), ("1.5KiB", 1536), (" 2 MiB ", 2 * 2**20)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


def test_tokens_and_bytes_convert_to_blocks():
    assert resolve_blocks(max_total_tokens=3_000_000, page_size=16) == 187_500
    assert resolve_blocks(max_total_tokens="3M", page_size=16) == 187_500
    assert resolve_blocks(max_total_tokens=3_000_007, page_size=16) == 187_500  # a partial page holds nothing
    per_page = kv_bytes_per_token(MODELS["llama-3-8b"]) * 16
    assert resolve_blocks(kv_cache_memory="40GiB", page_size=16, model="llama-3-8b") == 40 * 2**30 // per_page
    assert resolve_blocks(num_blocks="10k", page_size=16) == 10_000
    assert describe(187_500, 16, "llama-3-8b") == {"num_blocks": 187_500, "capacity_tokens": 3_000_000,
                                                   "capacity_gib": 3_000_000 * 131072 / 2**30}


@pytest.mark.parametrize("kwargs, message", [
    ({}, "give exactly one of num_blocks, max_total_tokens or kv_cache_memory .*got none"),
    ({"num_blocks": 5, "max_total_tokens": 80}, "got num_blocks and max_total_tokens"),
    ({"max_total_tokens": 15}, "max_total_tokens 15 is less than one block"),
    ({"kv_cache_memory": "1MiB"}, "kv_cache_memory 1MiB is less than one block"),
    ({"num_blocks": 10**13}, "num_blocks 10000000000000 is 10,000,000,000,000 blocks, more than"),
    ({"max_total_tokens": "x"}, "max_total_tokens must be a number"),
])
def test_bad_sizes_name_the_size(kwargs, message):
    with pytest.raises(ArgumentValueError, match=message):
        resolve_blocks(page_size=16, **kwargs)


def test_capacity_items_in_every_unit():
    calls = []

    def pages():
        calls.append(1)
        return 1000

    assert parse_capacities("1%,25%,100%,10k,3Mtok,2GiB", page_size=16, distinct_pages=pages) == [
        10, 250, 1000, 10_000, 187_500, 2 * 2**30 // (131072 * 16)]
    assert parse_capacity("0.01%", distinct_pages=lambda: 1000) == 1  # at least one block
    assert parse_capacity("5", distinct_pages=pages) == 5 and len(calls) == 3  # only shares read the trace
    with pytest.raises(ArgumentValueError, match="share must be in"):
        parse_capacity("150%", distinct_pages=pages)
    with pytest.raises(ArgumentValueError, match="no trace given"):
        parse_capacity("5%")


def test_api_replay_sweep_curve_agree_and_convert_to_rows(tmp_path):
    import gzip

    from radixkv.api import Records, curve, distinct_pages, replay, sweep
    from radixkv.workload.generators import generate, write_token_jsonl

    requests = list(generate("multi_turn", 3, 120))
    path = tmp_path / "t.jsonl"
    write_token_jsonl(requests, str(path))
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(path.read_bytes()))
    pages = distinct_pages(requests)
    assert pages == distinct_pages(str(path)) == distinct_pages(str(tmp_path / "t.jsonl.gz"))
    by_tokens = replay(str(path), max_total_tokens=pages * 16)
    assert by_tokens.num_blocks == pages and by_tokens.evicted_blocks == 0
    rows = sweep(str(tmp_path / "t.jsonl.gz"), ["lru"], ["10%", 50, "100%"])
    assert isinstance(rows, Records) and [r.num_blocks for r in rows] == [pages // 10, 50, pages]
    points = curve(requests, [pages // 10, 50, pages])
    assert [p.hit_tokens for p in points] == [r.hit_tokens for r in rows]
    assert rows.to_records()[1]["hit_tokens"] == replay(requests, num_blocks=50).hit_tokens
    with pytest.raises(ArgumentValueError, match="give exactly one of"):
        replay(requests, num_blocks=5, kv_cache_memory="1GiB")

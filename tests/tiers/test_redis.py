"""The Redis backend against real redis-server processes started (and stopped) by the tests.

Under ``CI=true`` a missing redis-server or redis-py fails these tests; elsewhere it skips them.
"""

from __future__ import annotations

import os
import shutil
import zlib

import numpy as np
import pytest

from radixkv.tiers import HostTier, RemoteHostError, RemoteTier, SimulatedHosts, TierConfigError, TieredCache
from radixkv.testing.localredis import LocalRedis, free_port

from .test_tiers_payload import KV, PS, admit_and_verify


def _require_redis() -> None:
    missing = []
    if shutil.which("redis-server") is None:
        missing.append("redis-server (apt-get install redis-server)")
    try:
        import redis  # noqa: F401
    except ImportError:
        missing.append("redis-py (pip install 'radixkv[redis]')")
    if missing:
        message = "the Redis tests need " + " and ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def servers():
    _require_redis()
    started = []
    try:
        for _ in range(2):
            started.append(LocalRedis())
        yield started
    finally:
        for s in started:
            s.stop()


def backend_for(servers, **kw):
    from radixkv.tiers import RedisBackend
    return RedisBackend([s.url for s in servers], **kw)


def trace():
    rng = np.random.default_rng(7)
    bases = [rng.integers(0, 3, size=10).tolist() for _ in range(4)]
    return [bases[rng.integers(0, 4)][: rng.integers(2, 11)] + rng.integers(0, 3, size=rng.integers(0, 4)).tolist()
            for _ in range(120)]


def test_redis_replay_matches_the_simulation_and_bytes_round_trip(servers):
    backend = backend_for(servers)
    real = TieredCache(3, PS, kv_shape=KV, load_back="always",
                       tiers=[HostTier(2), RemoteTier(blocks_per_host=3, backend=backend)])
    sim = TieredCache(3, PS, kv_shape=KV, load_back="always",
                      tiers=[HostTier(2), RemoteTier(blocks_per_host=3, num_hosts=2)])
    for tokens in trace():
        assert admit_and_verify(real, tokens) == admit_and_verify(sim, tokens)
    real.check()
    assert real.hit_tokens_by_tier == sim.hit_tokens_by_tier and real.hit_tokens_by_tier["remote"] > 0
    keys = sum(len(c.keys(f"{backend.namespace}:*")) for c in backend._clients)
    assert keys == real.tiers[1].used  # one key per page held, none leaked
    real.close()
    assert sum(len(c.keys(f"{backend.namespace}:*")) for c in backend._clients) == 0


def test_two_caches_share_servers_without_seeing_each_other(servers):
    a = TieredCache(2, PS, load_back="always", tiers=[RemoteTier(blocks_per_host=4, backend=backend_for(servers))])
    b = TieredCache(2, PS, load_back="always", tiers=[RemoteTier(blocks_per_host=4, backend=backend_for(servers))])
    for tokens in ([1, 1, 2, 2], [3, 3, 4, 4]):
        a.admit(tokens).release()
    b.admit([3, 3, 4, 4]).release()
    b.admit([5, 5, 6, 6]).release()
    assert a.admit([1, 1, 2, 2]).hit_tokens == 4
    assert b.admit([1, 1, 2, 2]).hit_tokens == 0
    a.close()
    b.close()


def test_killing_a_server_mid_replay_turns_its_pages_into_misses(servers):
    backend = backend_for(servers, timeout=1.0)
    cache = TieredCache(2, PS, kv_shape=KV, load_back="always",
                        tiers=[RemoteTier(blocks_per_host=4, backend=backend)])
    for tokens in ([1, 1, 2, 2], [3, 3, 4, 4], [5, 5, 6, 6]):
        admit_and_verify(cache, tokens)
    servers[0].kill()  # held [1, 1, 2, 2] (most-free host first)
    assert admit_and_verify(cache, [3, 3, 4, 4]) == 2 * PS
    assert admit_and_verify(cache, [1, 1, 2, 2]) == 0
    for tokens in trace()[:40]:
        admit_and_verify(cache, tokens)  # no exception reaches us, no wrong bytes
        cache.check()
    stats = cache.tier_stats()
    assert cache.tiers[0].lost_hosts == [0] and stats.lost_pages == 2
    cache.close()


def test_unreachable_server_at_start_up_is_a_clear_error():
    _require_redis()
    url = f"redis://127.0.0.1:{free_port()}/0"
    from radixkv.tiers import RedisBackend
    with pytest.raises(RemoteHostError, match="cannot reach Redis host") as info:
        RedisBackend([url], timeout=0.5)
    assert url in str(info.value)
    assert isinstance(info.value, ConnectionError)


@pytest.mark.parametrize("urls", [[], [""], [3]])
def test_bad_urls_are_refused(urls):
    _require_redis()
    from radixkv.tiers import RedisBackend
    with pytest.raises(TierConfigError):
        RedisBackend(urls)


def test_simulated_backend_is_the_default():
    assert isinstance(RemoteTier(blocks_per_host=2).backend, SimulatedHosts)


def test_a_server_out_of_memory_drops_only_the_refused_copies(servers):
    # maxmemory a little above what the empty server uses, noeviction: SETs start failing with OOM.
    import redis

    client = redis.Redis.from_url(servers[0].url)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 512 * 1024)
    kv = (64, 64)  # 16 KiB per page of 2 tokens: the server takes a few dozen pages

    def value(tokens, i):
        return np.full((PS, *kv), zlib.crc32(bytes(tokens[: (i + 1) * PS])) % 2003, dtype=np.float16)

    backend = backend_for(servers[:1])
    cache = TieredCache(4, PS, kv_shape=kv, load_back="always",
                        tiers=[RemoteTier(blocks_per_host=200, backend=backend)])
    prompts = [[i, i, i + 1, i + 1] for i in range(0, 200, 2)]
    hits = 0
    for tokens in prompts + prompts[:20]:  # no exception out of admit, whatever the server refuses
        a = cache.admit(tokens)
        got = cache.read(a.blocks)
        for i in range(a.hit_tokens // PS):
            assert np.array_equal(got[i], value(tokens, i)), f"page {i} of {tokens} read wrong bytes"
        if len(a.new_blocks):
            cache.write(a.new_blocks, np.stack([value(tokens, i) for i in range(a.hit_tokens // PS, 2)]))
        a.release()
        hits += a.hit_tokens
        cache.check()
    stats = cache.tier_stats()
    tier = cache.tiers[0]
    assert stats.dropped_pages > 0 and tier.lost_hosts == [] and stats.lost_pages == 0
    assert hits > 0 and stats.integrity_misses == 0  # the pages stored before memory ran out still serve
    assert len(client.keys(f"{backend.namespace}:*")) == tier.used  # no copy the server refused is counted
    cache.close()

"""Every registered eviction policy ranks a lower tier: attached like HBM's, through cascades and load-backs."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import policies
from radixkv.tiers import HostTier, RemoteTier, TieredCache
from radixkv.tiers.base import PolicyScope

from .test_tiers_payload import KV, PS, admit_and_verify


def _trace(seed: int = 3, n: int = 150):
    """Prompts over a few shared bases, so pages are demoted, cascade to the remote tier and come back."""
    rng = np.random.default_rng(seed)
    bases = [rng.integers(0, 4, size=12).tolist() for _ in range(5)]
    return [bases[rng.integers(0, 5)][: rng.integers(2, 13)] + rng.integers(0, 4, size=rng.integers(0, 3)).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("name", policies.available())
@pytest.mark.parametrize("write_policy", ["write_back", "write_through_selective"])
def test_every_policy_ranks_a_lower_tier(name, write_policy):
    host, remote = HostTier(4, policy=name), RemoteTier(blocks_per_host=3, num_hosts=2, policy=name)
    cache = TieredCache(4, PS, kv_shape=KV, tiers=[host, remote], write_policy=write_policy,
                        write_through_threshold=1, load_back="always")
    hits = 0
    for i, tokens in enumerate(_trace()):
        hits += admit_and_verify(cache, tokens)
        if i % 10 == 0:
            cache.check()
    cache.check()
    stats = cache.tier_stats()
    assert sum(stats.hit_tokens_by_tier.values()) == hits
    assert stats.hit_tokens_by_tier["host"] > 0 and stats.integrity_misses == 0
    assert stats.bytes_by_route.get("host->remote", 0) > 0  # the host tier's policy picked victims


def test_a_tier_policy_sees_its_tier_and_the_cache_cost_model():
    seen = []

    class Spy(policies.LRU):
        def attach(self, cache):
            seen.append(cache)

    cache = TieredCache(4, PS, tiers=[HostTier(6, policy=Spy())])
    (scope,) = seen
    assert isinstance(scope, PolicyScope)
    assert (scope.page_size, scope.num_blocks, scope.cost_model) == (PS, 6, cache.cost_model)


@pytest.mark.parametrize("name, deep_kept", [("gdsf", True), ("lru", False)])
def test_gdsf_in_a_tier_keeps_the_page_that_costs_more_to_recompute(name, deep_kept):
    # The host holds the deep tail page of D (older) and the one page of [1, 1] (newer), each
    # used once. LRU drops the older one; gdsf ranks by recompute cost, which grows with depth.
    deep = [5] * 6
    cache = TieredCache(3, PS, tiers=[HostTier(2, policy=name)], load_back="always")
    cache.admit(deep).release()          # D in HBM
    cache.admit([1, 1]).release()        # D's tail page -> host
    cache.match(deep[:4])                # D's first two pages stay the most recent in HBM
    cache.admit([2, 2]).release()        # [1, 1] -> host; host full
    cache.match(deep[:4])
    cache.admit([3, 3]).release()        # [2, 2] -> host: the host's policy picks a victim
    cache.check()
    assert cache.peek(deep) == (2, 1 if deep_kept else 0)
    assert cache.peek([1, 1]) == (0, 0 if deep_kept else 1)

"""Every registered eviction policy ranks a lower tier: attached like HBM's, through cascades and load-backs."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import policies
from radixkv.tiers import Copy, HostTier, RemoteTier, TierConfigError, TieredCache
from radixkv.tiers.base import PolicyScope
from radixkv.tiers.config import build_cache

from .test_tiers_payload import KV, PS, admit_and_verify


def _trace(seed: int = 3, n: int = 150):
    """Prompts over a few shared bases, so pages are demoted, cascade to the remote tier and come back."""
    rng = np.random.default_rng(seed)
    bases = [rng.integers(0, 4, size=12).tolist() for _ in range(5)]
    return [bases[rng.integers(0, 5)][: rng.integers(2, 13)] + rng.integers(0, 4, size=rng.integers(0, 3)).tolist()
            for _ in range(n)]


ONLINE = [name for name in policies.available() if not policies.resolve(name).offline]


@pytest.mark.parametrize("name", ONLINE)
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


# ---------------------------------------------------------------- the victim-loop contract in a tier
def _lower_pages(cache, tokens) -> int:
    """Pages of ``tokens`` (from page 0) held below HBM, consecutive: what a lower-tier hit could serve."""
    data = np.asarray(tokens, dtype=np.uint32).tobytes()
    return cache._stack.peek(cache._tree._roots[None], data, 0, len(tokens) // PS)


def _unreachable_pages(cache) -> int:
    """Lower-tier pages no lookup can reach: some page above them is neither in HBM nor below it."""
    stack, bad = cache._stack, 0
    for hbm_root, root in stack.tree._roots.items():
        todo = list((root.children or {}).values())
        while todo:
            node = todo.pop()
            todo.extend((node.children or {}).values())
            if not isinstance(node.ext, Copy):
                continue
            _, data = cache._path_data(node)
            _, pos, _, common = cache._tree.walk(hbm_root, data, node.end)
            pos += common
            if pos < node.end and pos + stack.peek(hbm_root, data, pos, node.end) < node.end:
                bad += node.num_pages
    return bad


def _spy(cls):
    """``cls`` logging its eviction hooks (and the rank the engine passes to ``on_evict``)."""
    log = []

    class Spy(cls):
        def on_evict(self, node, pages, rank):
            if rank is not None:  # a victim (else: a copy promoted or dropped)
                log.append(("evict", node, rank, self.priority(node)))
            if pages == node.num_pages:
                log.append(("remove", node))
            super().on_evict(node, pages, rank)

    if cls.on_victim is not None:
        def on_victim(self, node):
            run = cls.on_victim(self, node)
            log.append(("victim", node, run))
            return run
        Spy.on_victim = on_victim
    return Spy, log


@pytest.mark.parametrize("name", ONLINE)
@pytest.mark.parametrize("levels", [1, 2])
def test_tier_evictions_follow_the_engine_contract_and_strand_no_copy(name, levels):
    # Write-back over one or two tiers: after every request the cache checks, and no lower
    # copy is resident behind a missing page (a lower-tier hit needs the whole prefix).
    # Every tier victim got on_victim first (when the policy has it), then on_evict at the
    # rank it was queued with, then left the tier.
    spies = [_spy(policies.resolve(name)) for _ in range(levels)]
    tiers = [HostTier(4, policy=spies[0][0]())]
    if levels == 2:
        tiers.append(RemoteTier(blocks_per_host=3, num_hosts=2, policy=spies[1][0]()))
    cache = TieredCache(4, PS, kv_shape=KV, tiers=tiers, load_back="always")
    for tokens in _trace(seed=5, n=200):
        admit_and_verify(cache, tokens)
        cache.check()
        assert _unreachable_pages(cache) == 0
    for (_, log), tier in zip(spies, tiers):
        evicts = [i for i, entry in enumerate(log) if entry[0] == "evict"]
        assert evicts, f"{tier.name}: no victim reached on_evict"
        for i in evicts:
            _, node, passed, rank = log[i]
            assert passed == rank, f"{tier.name}: on_evict got {passed!r}, the victim ranks {rank!r}"
            if tier.policy.on_victim is not None:
                assert log[i - 1][0] == "victim" and log[i - 1][1] is node and log[i - 1][2] >= 1
            assert log[i + 1][0] == "remove"  # the victim (or its evicted tail) left the tier


@pytest.mark.parametrize("name, kept", [("sieve", True), ("s3fifo", True), ("fifo", False)])
def test_a_second_chance_policy_in_a_host_tier_spares_a_visited_leaf(name, kept):
    cache = TieredCache(2, PS, tiers=[HostTier(2, policy=name)], load_back="never")
    for tokens in ([1, 1], [2, 2], [3, 3], [4, 4]):  # [1, 1] then [2, 2] demoted: the host is full
        cache.admit(tokens).release()
    assert (_lower_pages(cache, [1, 1]), _lower_pages(cache, [2, 2])) == (1, 1)
    cache.admit([1, 1]).release()  # a lower hit (not loaded: load_back=never) visits [1, 1]; [3, 3] is demoted
    cache.check()
    # The host evicted one page: sieve's hand and s3fifo's small queue pass over the visited
    # [1, 1] and take [2, 2]; fifo takes the older [1, 1].
    assert (_lower_pages(cache, [1, 1]), _lower_pages(cache, [2, 2])) == ((1, 0) if kept else (0, 1))
    assert _lower_pages(cache, [3, 3]) == 1


def test_gdsf_in_a_tier_evicts_the_deep_leaf_not_the_ancestor_and_ages():
    # D's three pages reach the host one at a time (tail first). gdsf values the shallow page
    # least (cheapest to recompute), but dropping it would strand the two below it: a lower
    # hit needs the whole prefix. Only the chain's leaf may go, and the policy's clock L rises
    # to its value.
    deep = [5] * 6
    host = HostTier(3, policy="gdsf")
    cache = TieredCache(3, PS, tiers=[host], load_back="always")
    for tokens in (deep, [1, 1], [2, 2], [3, 3]):
        cache.admit(tokens).release()
    assert _lower_pages(cache, deep) == 3 and host.used == 3 and host.policy.age == 0
    cache.admit([4, 4]).release()  # [1, 1] is demoted: the host evicts one page
    cache.check()
    assert _lower_pages(cache, deep) == 2 and _lower_pages(cache, [1, 1]) == 1
    assert _unreachable_pages(cache) == 0
    assert host.policy.age == pytest.approx(host.policy.restore_seconds(None, 2))  # D's page 2: age 0, used once


@pytest.mark.parametrize("name", ["gdsf", "lfu"])
def test_an_aging_policy_ages_in_a_tier(name):
    host = HostTier(4, policy=name)
    cache = TieredCache(4, PS, tiers=[host], load_back="always")
    for tokens in _trace(seed=7, n=100):
        cache.admit(tokens).release()
    cache.check()
    assert host.policy.age > 0


@pytest.mark.parametrize("make", [
    lambda p: HostTier(4, policy=p),
    lambda p: RemoteTier(blocks_per_host=4, policy=p),
    lambda p: build_cache(4, 2, p, host_blocks=4),
])
@pytest.mark.parametrize("policy", ["belady", policies.Belady()])
def test_an_offline_policy_is_refused_for_a_lower_tier(make, policy):
    with pytest.raises(TierConfigError, match="belady.*offline"):
        make(policy)

"""Tiered cache semantics: exact equivalences with single LRUs, write policies, accounting, bad input."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.costs import CostModel, get_hardware, get_model
from radixkv.testing.reference import reference_lru_replay
from radixkv.tiers import HostTier, RemoteTier, TierConfigError, TieredCache

PS = 2


@st.composite
def traces(draw, max_pages: int):
    """Requests that share prefixes often (tiny alphabet, prefixes of earlier requests), each <= max_pages pages."""
    n = draw(st.integers(1, 30))
    reqs: list = []
    for _ in range(n):
        prefix = []
        if reqs and draw(st.booleans()):
            base = draw(st.sampled_from(reqs))
            prefix = base[: draw(st.integers(0, len(base)))]
        ext = draw(st.lists(st.integers(0, 3), max_size=2 * max_pages * PS))
        tokens = (prefix + ext)[: max_pages * PS + draw(st.integers(0, PS - 1))]
        reqs.append(tokens)
    return reqs


def run(cache, trace, check=True):
    hits = []
    for tokens in trace:
        a = cache.admit(tokens)
        a.release()
        hits.append(a.hit_tokens)
        if check:
            cache.check()
    return hits


@settings(max_examples=150)
@given(st.integers(1, 6), st.integers(1, 10), st.data())
def test_write_back_equals_one_lru_of_sum(a, b, data):
    trace = data.draw(traces(a))
    cache = TieredCache(a, PS, tiers=[HostTier(b)], load_back="always")
    hits = run(cache, trace)
    expect = reference_lru_replay([np.array(t, dtype=np.uint32) for t in trace], PS, a + b)
    assert hits == list(expect.per_request_hits)
    by_tier = cache.tier_stats().hit_tokens_by_tier
    assert sum(by_tier.values()) == sum(hits)


@settings(max_examples=100)
@given(st.integers(1, 5), st.integers(1, 6), st.integers(1, 6), st.data())
def test_write_back_three_levels_equals_one_lru_of_sum(a, b, c, data):
    trace = data.draw(traces(a))
    cache = TieredCache(a, PS, tiers=[HostTier(b), RemoteTier(blocks_per_host=c, num_hosts=2)],
                        load_back="always")
    hits = run(cache, trace)
    expect = reference_lru_replay([np.array(t, dtype=np.uint32) for t in trace], PS, a + b + 2 * c)
    assert hits == list(expect.per_request_hits)


@settings(max_examples=100)
@given(st.integers(1, 6), st.integers(1, 10), st.sampled_from(["write_through", "write_through_selective"]),
       st.data())
def test_write_through_hbm_hits_equal_one_lru_of_hbm(a, b, policy, data):
    trace = data.draw(traces(a))
    cache = TieredCache(a, PS, tiers=[HostTier(b)], write_policy=policy, load_back="always",
                        write_through_threshold=1)
    hbm = []
    for tokens in trace:
        before = cache.hit_tokens_by_tier["hbm"]
        cache.admit(tokens).release()
        hbm.append(cache.hit_tokens_by_tier["hbm"] - before)
        cache.check()
    expect = reference_lru_replay([np.array(t, dtype=np.uint32) for t in trace], PS, a)
    assert hbm == list(expect.per_request_hits)


def test_plain_cache_has_no_spill_hook():
    assert PrefixCache(4)._spill is None


def test_host_hits_are_counted_and_charged():
    cache = TieredCache(4, PS, tiers=[HostTier(8)], load_back="always")
    run(cache, [[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 8, 8, 7, 7, 6, 6], [1, 2, 3, 4, 5, 6, 7, 8]])
    stats = cache.tier_stats()
    assert stats.hit_tokens_by_tier == {"hbm": 0, "host": 8}
    page = cache.cost_model.page_bytes
    # 4 pages down (second request), 4 pages back up, 4 pages down again (third request's room)
    assert stats.bytes_by_route == {"hbm->host": 8 * page, "host->hbm": 4 * page}
    assert stats.bytes_by_link == {"pcie": 12 * page}
    assert stats.transfer_seconds > 0
    assert stats.pages_by_tier == {"host": 4}


def test_remote_route_crosses_network_and_pcie():
    cache = TieredCache(2, PS, tiers=[RemoteTier(blocks_per_host=4)], load_back="always")
    run(cache, [[1, 1, 2, 2], [3, 3, 4, 4], [1, 1, 2, 2]])
    t = cache.transfers
    page = cache.cost_model.page_bytes
    assert t.bytes_by_route == {"hbm->remote": 4 * page, "remote->hbm": 2 * page}
    assert t.bytes_by_link == {"pcie": 6 * page, "network": 6 * page}
    assert cache.hit_tokens_by_tier == {"hbm": 0, "remote": 4}


def test_cost_rule_recomputes_when_loading_is_slower():
    # A 1 MB/s network with 0.1 s latency: recomputing 4 tokens is faster than fetching them.
    hw = replace(get_hardware("h100"), network_bandwidth=1e6, network_latency=0.1)
    slow = CostModel(get_model("llama-3-8b"), hw, PS, tier_paths={"host": ("pcie",), "remote": ("network", "pcie")})
    cache = TieredCache(2, PS, tiers=[RemoteTier(blocks_per_host=4)], cost_model=slow)
    assert not slow.should_load(0, 2, "remote") and slow.should_load(0, 2, "host")
    hits = run(cache, [[1, 1, 2, 2], [3, 3, 4, 4], [1, 1, 2, 2]])
    assert hits == [0, 0, 0]
    assert cache.tier_stats().recomputed_tokens == 4


def test_load_back_never_only_counts():
    cache = TieredCache(2, PS, tiers=[HostTier(4)], load_back="never")
    assert run(cache, [[1, 1, 2, 2], [3, 3, 4, 4], [1, 1, 2, 2]]) == [0, 0, 0]


def test_match_promotes_and_returns_hbm_blocks():
    cache = TieredCache(2, PS, tiers=[HostTier(4)], load_back="always")
    run(cache, [[1, 1, 2, 2], [3, 3, 4, 4]])
    m = cache.match([1, 1, 2, 2, 9])
    assert m.num_tokens == 4 and len(m.blocks) == 2
    assert cache.peek([3, 3, 4, 4]) == (0, 2)
    cache.check()


def test_host_smaller_than_a_chunk_keeps_the_shallow_pages():
    cache = TieredCache(4, PS, tiers=[HostTier(1)], load_back="always")
    hits = run(cache, [[1] * 8, [2] * 8, [1] * 8])
    assert hits[2] == PS  # only the first page survived in the 1-block host tier
    assert cache.tier_stats().dropped_pages > 0


def test_reset_empties_every_tier():
    cache = TieredCache(2, PS, tiers=[HostTier(4)], load_back="always")
    run(cache, [[1, 1, 2, 2], [3, 3, 4, 4]])
    cache.reset()
    cache.check()
    assert cache.tiers[0].used == 0 and cache.hit_tokens_by_tier == {"hbm": 0, "host": 0}


@pytest.mark.parametrize("kwargs, error", [
    (dict(write_policy="write_around"), TierConfigError),
    (dict(load_back="maybe"), TierConfigError),
    (dict(write_through_threshold=0), TierConfigError),
    (dict(write_through_threshold=1.5), TypeError),
    (dict(tiers=["host"]), TypeError),
    (dict(tiers=[HostTier(2), HostTier(3)]), TierConfigError),
    (dict(tiers=[HostTier(2, name="nvme")]), TierConfigError),
    (dict(cost_model="h100"), TypeError),
])
def test_bad_configuration_is_refused(kwargs, error):
    with pytest.raises(error) as info:
        TieredCache(4, PS, **kwargs)
    assert str(next(iter(kwargs.values())))[:4] in str(info.value) or kwargs.get("tiers")


@pytest.mark.parametrize("make, error", [
    (lambda: HostTier(-1), TierConfigError),
    (lambda: HostTier(0), TierConfigError),
    (lambda: HostTier(2.0), TypeError),
    (lambda: RemoteTier(blocks_per_host=-4), TierConfigError),
    (lambda: RemoteTier(blocks_per_host=4, num_hosts=0), TierConfigError),
    (lambda: HostTier(4, policy="nope"), KeyError),
    (lambda: HostTier(4, name="hbm"), TierConfigError),
])
def test_bad_tier_arguments(make, error):
    with pytest.raises(error):
        make()


def test_a_tier_belongs_to_one_cache():
    host = HostTier(4)
    TieredCache(2, PS, tiers=[host])
    with pytest.raises(TierConfigError, match="another cache"):
        TieredCache(2, PS, tiers=[host])


T = [1, 1, 2, 2]


def _demoted(**kwargs):
    """A cache whose 2-page prompt T was pushed down to the host tier by another prompt."""
    cache = TieredCache(2, PS, tiers=[HostTier(8)], **kwargs)
    cache.admit(T).release()
    cache.admit([9, 9, 8, 8]).release()
    return cache


def test_pin_loads_a_demoted_prefix_back_without_counting_a_use():
    cache = _demoted(load_back="always")
    before, clock = cache.tier_stats(), cache.clock
    assert cache.peek(T) == (0, 2)
    assert cache.pin(T) == 4
    after = cache.tier_stats()
    assert cache.peek(T) == (2, 0) and cache.protected_blocks == 2  # resident, and held there
    assert after.bytes_by_link["pcie"] > before.bytes_by_link.get("pcie", 0)  # a real transfer
    assert after.hit_tokens_by_tier == before.hit_tokens_by_tier == {"hbm": 0, "host": 0}
    assert after.recomputed_tokens == before.recomputed_tokens and cache.clock == clock
    assert cache.evict(2) == 0
    assert cache.unpin(T) == 4 and cache.evict(2) == 2
    cache.check()


def test_pin_touches_no_lower_rank_and_loads_nothing_under_load_back_never():
    cache = _demoted(load_back="never")
    copies = [n for n in cache._stack.tree.nodes() if n.ext is not None]
    ranks = [n.policy_state for n in copies]
    assert cache.pin(T) == 0
    assert [n.policy_state for n in copies] == ranks and cache.tier_stats().recomputed_tokens == 0
    cache.match(T)  # a request's lookup does rank the copies by use
    assert [n.policy_state for n in copies] != ranks
    cache.check()


def test_pin_is_not_a_selective_write_through_hit():
    cache = TieredCache(4, PS, tiers=[HostTier(8)], write_policy="write_through_selective",
                        write_through_threshold=1)
    cache.admit(T).release()
    assert cache.pin(T) == 4 and cache.tiers[0].used == 0
    cache.match(T)  # the first hit: copied down
    assert cache.tiers[0].used == 2
    cache.check()


@settings(max_examples=100)
@given(st.lists(st.tuples(st.sampled_from(["match", "admit", "pin", "unpin"]),
                          st.lists(st.integers(0, 2), max_size=8)), min_size=1, max_size=40),
       st.integers(1, 4), st.sampled_from(["write_back", "write_through", "write_through_selective"]))
def test_hits_by_tier_sum_to_what_matches_and_admissions_returned(ops, a, policy):
    cache = TieredCache(a, PS, tiers=[HostTier(3), RemoteTier(blocks_per_host=2, num_hosts=2)],
                        write_policy=policy, write_through_threshold=1, load_back="always")
    served = 0
    pinned = []
    for op, tokens in ops:
        if op == "match":
            served += cache.match(tokens).num_tokens
        elif op == "admit":
            adm = cache.admit(tokens)
            served += adm.hit_tokens
            adm.release()
        elif op == "pin":
            if cache.pin(tokens):
                pinned.append(tokens)
        elif pinned:
            cache.unpin(pinned.pop())
        assert sum(cache.hit_tokens_by_tier.values()) == served
        cache.check()


def test_a_request_looked_up_by_match_and_then_admit_is_counted_twice():
    cache = TieredCache(4, PS, tiers=[HostTier(8)])
    cache.admit(T).release()
    cache.match(T)
    cache.admit(T).release()
    assert cache.hit_tokens_by_tier == {"hbm": 8, "host": 0}  # as TierStats documents

"""Defects found in review of multi-tenant sharing, extents, request hints and miss reasons.

Each test states the behaviour radixkv documents and fails on the current code; they are
marked ``xfail(strict=True)`` until fixed, so a fix turns them into an XPASS failure that
asks for the mark to go.
"""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.analysis.attack import attack
from radixkv.analysis.replay import replay
from radixkv.analysis.stats import other_namespace_pages
from radixkv.errors import RadixKVError
from radixkv.tenancy import Adaptive, KAnonymous
from radixkv.tiers import HostTier, TieredCache
from radixkv.workload.generators import generate
from radixkv.workload.traces import Request


@pytest.mark.parametrize("make_rule", [lambda: KAnonymous(k=2), lambda: Adaptive(k=2, budget=0)],
                         ids=["k-anonymous", "adaptive"])
def test_one_sharing_rule_bound_to_two_caches_serves_no_page_the_rule_refuses(make_rule):
    rule = make_rule()
    a = PrefixCache(8, page_size=2, sharing=rule)
    with pytest.raises(RadixKVError):  # the rule keeps records by block id: one cache each
        PrefixCache(8, page_size=2, sharing=rule)
    b = PrefixCache(8, page_size=2, sharing=rule.fresh())
    assert repr(b.sharing) == repr(rule) and b.sharing is not rule
    a.admit([9, 9], tenant="x").release()  # x requests a page in cache A (block 0)
    b.admit([5, 5], tenant="victim").release()  # one victim caches a private page in B (block 0)
    a.check()
    b.check()
    # k=2: x may see the victim's page only after 2 other tenants asked; one did.
    assert b.match([5, 5], tenant="x").num_tokens == 0
    assert b.admit([5, 5], tenant="x").hit_tokens == 0


def test_attack_twice_with_one_rule_instance_measures_the_same():
    requests = list(generate("multitenant", 1, 1000, page_size=16))
    rule = KAnonymous(k=3)
    first = attack(requests, sharing=rule)
    second = attack(requests, sharing=rule)
    assert first.recovered_private_pages == 0
    assert second == first


def test_other_namespace_pages_under_isolated_tenants():
    cache = PrefixCache(64, page_size=2, sharing="isolated")
    cache.admit([1, 2, 3, 4], tenant="alice").release()
    request = Request(tokens=[1, 2, 3, 4], tenant="bob")
    # documented read-only; bob's own partition holds nothing, alice's holds both pages
    assert other_namespace_pages(cache, request) in (0, 2)
    for namespace in cache.namespaces():  # List[Optional[str]] per its annotation
        assert namespace is None or isinstance(namespace, str)


def test_tier_hit_tokens_count_only_pages_served_under_k_anonymous():
    cache = TieredCache(8, page_size=2, tiers=[HostTier(8)], sharing=KAnonymous(k=2))
    served = 0
    for tenant in ("victim", "x"):
        with cache.admit([1, 2, 3, 4], tenant=tenant) as admission:
            served += admission.hit_tokens
        cache.check()
    assert served == 0  # x was refused the victim's two pages
    assert cache.tier_stats().hit_tokens_by_tier["hbm"] == served


def test_admission_handle_covers_only_what_the_tenant_may_use():
    cache = PrefixCache(16, page_size=2, sharing=KAnonymous(k=2))
    cache.admit([1, 2, 3, 4], tenant="victim").release()
    victim_blocks = set(cache.peek_match([1, 2, 3, 4], tenant="victim").blocks.tolist())
    assert len(victim_blocks) == 2
    m = cache.match([1, 2, 3, 4], tenant="x")
    assert m.num_tokens == 0 and m.node.num_pages == 0  # match: the handle ends at the served prefix
    admission = cache.admit([1, 2, 3, 4], tenant="x")
    assert admission.hit_tokens == 0 and not set(admission.blocks.tolist()) & victim_blocks
    path = cache.path_blocks(admission.node)
    assert not set(path.tolist()) & victim_blocks, (path, admission.blocks)
    admission.release()
    cache.check()


def test_a_raising_sink_while_an_aborted_batch_mate_lets_go_leaves_the_cache_consistent():
    failing = []

    def sink(blocks):
        if failing:
            failing.pop()
            raise RuntimeError("allocator unavailable")

    cache = PrefixCache(16, page_size=2, on_free=sink)
    first = cache.admit([1, 1, 2, 2])
    mate = cache.admit([1, 1, 2, 2, 3, 3])  # matches first's unwritten page, caches one below it
    assert mate.hit_tokens == 4
    first.abort()  # both pages leave the cache; mate still holds them
    cache.check()
    failing.append(True)
    with pytest.raises(RuntimeError):
        mate.release()
    cache.check()
    assert cache.protected_blocks == 0


@pytest.mark.parametrize("sharing", ["k-anonymous", "isolated"])
def test_miss_reasons_report_no_eviction_when_nothing_was_evicted(sharing):
    requests = [Request(tokens=list(range(1, 17)), tenant="victim"), Request(tokens=list(range(1, 17)), tenant="x")]
    result = replay(requests, PrefixCache(100, page_size=4, sharing=sharing), miss_reasons=True)
    assert result.hit_tokens == 0 and result.evicted_blocks == 0
    assert result.hit_tokens + sum(result.miss_tokens_by_reason.values()) == result.prompt_tokens
    assert result.miss_tokens_by_reason["evicted"] == 0, result.miss_tokens_by_reason


def test_replay_admitted_blocks_count_only_pages_cached():
    requests = [Request(tokens=list(range(1, 17)), tenant="victim"), Request(tokens=list(range(1, 17)), tenant="x")]
    cache = PrefixCache(100, page_size=4, sharing="k-anonymous")
    result = replay(requests, cache, miss_reasons=False)
    assert result.evicted_blocks == 0
    assert result.admitted_blocks == cache.num_cached_blocks == 8  # each tenant's own copy


@pytest.mark.parametrize("name", ["lru", "2q", "density"])
def test_one_policy_instance_serves_one_cache(name):
    """A policy's history is about one cache's pages: handed to a second cache (or tier) it is
    refused, where it used to rank the second cache's pages by the first one's evictions."""
    from radixkv.policies import create

    policy = create(name)
    first = PrefixCache(8, page_size=2, policy=policy)
    with pytest.raises(RadixKVError):
        PrefixCache(8, page_size=2, policy=policy)
    with pytest.raises(RadixKVError):
        TieredCache(8, page_size=2, tiers=[HostTier(8, policy=policy)])
    first.admit([1, 2, 3, 4]).release()
    first.check()


@pytest.mark.parametrize("sharing", ["shared", "k-anonymous"])
def test_num_new_pages_counts_new_blocks_before_they_are_made(sharing):
    cache = PrefixCache(16, page_size=2, sharing=sharing)
    cache.admit([1, 2, 3, 4], tenant="victim").release()
    admission = cache.admit([1, 2, 3, 4, 5, 6], tenant="x")
    counted = admission.num_new_pages  # from the extents, before new_blocks exists
    assert counted == len(admission.new_blocks) == (3 if sharing == "k-anonymous" else 1)
    assert admission.copied_pages == 0
    admission.release()
    cache.check()


def test_tier_hit_tokens_of_pages_loaded_from_below_leave_the_tier_when_the_rule_refuses_them():
    """The refused pages are the tail of the match: pages a lower tier served count there, so
    their hits come off that tier (not HBM) when the sharing rule refuses them."""
    cache = TieredCache(4, page_size=2, tiers=[HostTier(8)], sharing=KAnonymous(k=2), load_back="always")
    cache.admit([1, 2, 3, 4], tenant="victim").release()
    cache.admit([5, 6, 7, 8], tenant="victim").release()  # [1..4] go down to the host tier
    cache.check()
    assert cache.tier_stats().hit_tokens_by_tier == {"hbm": 0, "host": 0}
    with cache.admit([1, 2, 3, 4], tenant="x") as admission:  # loaded from the host, then refused
        assert admission.hit_tokens == 0
    cache.check()
    assert cache.tier_stats().hit_tokens_by_tier == {"hbm": 0, "host": 0}

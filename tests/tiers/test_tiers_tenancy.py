"""Sharing rules over lower tiers: what a tenant is served stays what HBM alone would allow.

Each tenant's pages are its own partition, below HBM too: a tenant's demoted pages load back
for it alone; another tenant gets a copy only of pages in HBM that k others asked for.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, strategies as st

from radixkv.tenancy import KAnonymous
from radixkv.tiers import HostTier, TieredCache

from ..core.test_tenancy import run, served, steps


@given(sequence=steps, k=st.integers(1, 3), num_blocks=st.integers(2, 8), isolated=st.booleans())
def test_tiers_serve_nothing_the_rule_refuses(sequence, k, num_blocks, isolated):
    cache = TieredCache(num_blocks, page_size=2, tiers=[HostTier(6)], load_back="always",
                        sharing="isolated" if isolated else KAnonymous(k=k))
    history = defaultdict(set)

    def on_hit(tenant, path, pages):
        for d in range(1, pages + 1):
            who = history[path[:d]]
            assert tenant in who or (not isolated and len(who) >= k), (tenant, path[:d], who)

    run(cache, sequence, history, on_hit)


def test_a_tenants_pages_load_back_for_it_alone():
    cache = TieredCache(2, page_size=2, tiers=[HostTier(8)], load_back="always", sharing=KAnonymous(k=1))
    served(cache, (1, 2), "victim")
    served(cache, (3, 4), "other")  # demotes the victim's pages to the host
    assert served(cache, (1, 2), "x") == 0  # k=1 and the victim asked, but its copy is below HBM
    served(cache, (3, 4), "other")
    host = cache.tier_stats().hit_tokens_by_tier["host"]
    assert served(cache, (1, 2), "victim") == 4  # its own, loaded back
    assert cache.tier_stats().hit_tokens_by_tier["host"] == host + 4
    assert served(cache, (1, 2), "y") == 4  # a copy of the victim's, now in HBM
    cache.check()


def test_isolated_tenants_do_not_reach_each_others_lower_copies():
    cache = TieredCache(2, page_size=2, tiers=[HostTier(8)], load_back="always", sharing="isolated")
    served(cache, (1, 2), "a")
    served(cache, (3, 4), "a")  # a's first pages go to the host
    assert served(cache, (1, 2), "b") == 0
    assert served(cache, (1, 2), "a") == 4
    cache.check()

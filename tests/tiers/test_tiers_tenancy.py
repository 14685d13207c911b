"""Sharing rules over lower tiers: what a tenant is served stays what HBM alone would allow.

A page loaded back from a tier carries no requesters (they are kept per HBM block), so it is
refused to every tenant until they ask again: safe, at the cost of those hits.
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


def test_a_page_loaded_back_is_refused_until_asked_again():
    cache = TieredCache(2, page_size=2, tiers=[HostTier(8)], load_back="always", sharing=KAnonymous(k=1))
    served(cache, (1, 2), "victim")
    served(cache, (3, 4), "other")  # demotes the victim's pages to the host
    assert served(cache, (1, 2), "victim") == 0  # back in HBM, no requester recorded
    assert served(cache, (1, 2), "victim") == 4
    assert served(cache, (1, 2), "x") == 4  # k=1: the victim is one other tenant
    cache.check()


def test_isolated_tenants_do_not_reach_each_others_lower_copies():
    cache = TieredCache(2, page_size=2, tiers=[HostTier(8)], load_back="always", sharing="isolated")
    served(cache, (1, 2), "a")
    served(cache, (3, 4), "a")  # a's first pages go to the host
    assert served(cache, (1, 2), "b") == 0
    assert served(cache, (1, 2), "a") == 4
    cache.check()

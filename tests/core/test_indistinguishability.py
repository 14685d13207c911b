"""The indistinguishability game of a shared cache's sharing rules.

A victim tenant sends either X or X', two prompts of the same length (so the same page count);
an attacker tenant's operations are fixed. Every observation the attacker can make must be the
same in both worlds: each admission and match result (tokens served, blocks given, pages
copied), the tier that served each of its hits (a TTFT of its own), and the events its own
operations cause (pages stored and removed). Its own evictions show in its later hits.

The game is played under ``isolated``, ``k-anonymous`` and ``adaptive`` with no budget, with the
victim the only other tenant (fewer than ``k``), with every online policy (Belady reads the
future, every tenant's included: it is a ceiling, not a rule to deploy), HBM alone and with a
host tier, on pools small enough that nearly every admission evicts, the attacker asking for
the victim's prompts and their neighbours. It once failed under k-anonymity on a full pool:
the cache kept one copy of a page two tenants computed, so after the attacker asked for the
victim's pages the pool held one copy fewer than in the other world, and the attacker's own
pages were evicted later (the last test's script).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from radixkv import PrefixCache
from radixkv.policies import available as policies
from radixkv.tenancy import Adaptive, KAnonymous
from radixkv.tiers import HostTier, TieredCache

PAGE = 2
ONLINE = [name for name in policies() if name != "belady"]


def tokens(path) -> list:
    return [t for d, p in enumerate(path) for t in (p, 10 * d + p)]


def make(sharing: str, policy: str, capacity: int, host: int):
    rule = {"isolated": "isolated", "k-anonymous": KAnonymous(k=2), "adaptive": Adaptive(k=2, budget=0)}[sharing]
    if host:
        cache = TieredCache(capacity, page_size=PAGE, policy=policy, sharing=rule,
                            tiers=[HostTier(host, policy=policy)], load_back="always")
    else:
        cache = PrefixCache(capacity, page_size=PAGE, policy=policy, sharing=rule)
    cache.attach_page_hashes()
    return cache


def event_counts(cache) -> tuple:
    stored = removed = 0
    for event in cache.take_events():
        kind = type(event).__name__
        n = len(getattr(event, "block_hashes", ()))
        stored += n if kind == "BlockStored" else 0
        removed += n if kind == "BlockRemoved" else 0
    return stored, removed


def play(cache, secret, script) -> list:
    """Run ``script`` (attacker steps and the victim's turns) with the victim's prompt ``secret``;
    return what the attacker observed, step by step."""
    tiered = hasattr(cache, "tier_stats")
    seen = []
    for who, path, how in script:
        if who == "victim":
            cache.admit(tokens(secret), tenant="victim").release()
            cache.check()
            continue
        event_counts(cache)  # the victim's events are not the attacker's
        before = cache.tier_stats().hit_tokens_by_tier if tiered else None
        if how == "match":
            m = cache.match(tokens(path), tenant="attacker")
            result = (m.num_tokens, len(m.blocks))
        else:
            adm = cache.admit(tokens(path), tenant="attacker")
            result = (adm.hit_tokens, len(adm.blocks), adm.num_new_pages, adm.copied_pages)
            adm.abort() if how == "abort" else adm.release()
        if tiered:
            after = cache.tier_stats().hit_tokens_by_tier
            result += (tuple(after[t] - before.get(t, 0) for t in sorted(after)),)
        seen.append(result + event_counts(cache))
        cache.check()
    return seen


def scripts(touch_secrets: bool):
    """(X, X', script): the attacker's steps over paths near the secrets (when ``touch_secrets``)
    or disjoint from them, with the victim's turns interleaved."""
    alphabet = st.integers(0, 2)
    own = st.lists(st.integers(3, 5), min_size=1, max_size=3).map(tuple)

    @st.composite
    def build(draw):
        n = draw(st.integers(1, 3))
        common = draw(st.integers(0, n - 1))
        head = draw(st.lists(alphabet, min_size=common, max_size=common))
        x = tuple(head + draw(st.lists(alphabet, min_size=n - common, max_size=n - common)))
        x2 = tuple(head + draw(st.lists(alphabet, min_size=n - common, max_size=n - common)))
        near = [x, x2, x[:1], x2[:1], x + (0,), x2 + (1,)] if touch_secrets else []
        paths = st.one_of(own, st.sampled_from(near)) if near else own
        steps = draw(st.lists(st.tuples(st.just("attacker"), paths, st.sampled_from(["release", "abort", "match"])),
                              min_size=1, max_size=14))
        turns = draw(st.lists(st.integers(0, len(steps)), min_size=1, max_size=3))
        for at in sorted(turns, reverse=True):
            steps.insert(at, ("victim", None, None))
        return x, x2, steps

    return build()


def assert_indistinguishable(sharing, policy, capacity, host, game):
    x, x2, script = game
    worlds = [play(make(sharing, policy, capacity, host), secret, script) for secret in (x, x2)]
    assert worlds[0] == worlds[1], (x, x2, script)


RULES = ["isolated", "k-anonymous", "adaptive"]


@settings(max_examples=1500 if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), sharing=st.sampled_from(RULES), policy=st.sampled_from(ONLINE), host=st.sampled_from([0, 6]))
def test_the_attacker_observes_the_same_in_both_worlds(data, sharing, policy, host):
    capacity = data.draw(st.integers(4, 8), label="capacity")
    game = data.draw(scripts(touch_secrets=True), label="game")
    assert_indistinguishable(sharing, policy, capacity, host, game)


@pytest.mark.parametrize("sharing", RULES)
def test_the_dedup_channel_is_closed(sharing):
    # 4 blocks. The attacker caches a page of its own, then asks for X: with one copy per page
    # the world where the victim sent X held one copy fewer, and the victim's next turn evicted
    # the attacker's page in the other world only, which its next request showed.
    script = [("victim", None, None), ("attacker", (3,), "release"), ("attacker", (0, 0), "release"),
              ("victim", None, None), ("attacker", (3,), "release")]
    assert_indistinguishable(sharing, "lru", 4, 0, ((0, 0), (1, 0), script))

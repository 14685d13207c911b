"""The indistinguishability game of a shared cache's sharing rules.

A victim tenant sends either X or X', two prompts of the same length (so the same page count);
an attacker tenant's operations are fixed. Every observation the attacker can make must be the
same in both worlds: each admission and match result (tokens served, blocks given), and the tier
that served each of its hits (a TTFT of its own). Its own evictions show in its later hits.
Under ``isolated`` the engine's own view of the attacker's requests must match too: the pages
each release cached and the events each operation caused (pages stored and removed). Under
``k-anonymous`` those two count the one copy the cache keeps of a page two tenants computed:
they are the operator's, and they show where a request was deduplicated.

The game is played under ``isolated`` and under ``k-anonymous`` with the victim the only other
tenant (fewer than ``k``), with every online policy (Belady reads the future, every tenant's
included: it is a ceiling, not a rule to deploy), HBM alone and with a host tier, on pools small
enough that nearly every admission evicts.

What the game does not hide under ``k-anonymous`` on a full pool: the cache keeps one copy of a
page, so when the attacker asks for a page the victim cached, the pool holds one copy fewer
than in the other world, and the attacker's own pages are evicted later (dedup). The first test
plays the game where that cannot happen (the pool never fills, or the attacker never asks for the
victim's pages); the second shows the channel, a strict xfail until a refused tenant's pages are
kept as its own copy (see the KAnonymous docstring).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from radixkv import PrefixCache
from radixkv.policies import available as policies
from radixkv.tenancy import KAnonymous
from radixkv.tiers import HostTier, TieredCache

PAGE = 2
ONLINE = [name for name in policies() if name != "belady"]


def tokens(path) -> list:
    return [t for d, p in enumerate(path) for t in (p, 10 * d + p)]


def make(sharing: str, policy: str, capacity: int, host: int):
    rule = "isolated" if sharing == "isolated" else KAnonymous(k=2)
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


def play(cache, secret, script, engine_view: bool) -> list:
    """Run ``script`` (attacker steps and the victim's turns) with the victim's prompt ``secret``;
    return what the attacker observed, step by step (and the engine's view of its requests)."""
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
            result = (adm.hit_tokens, len(adm.blocks), adm.num_new_pages, adm.private_pages)
            adm.abort() if how == "abort" else adm.release()
            if engine_view:
                result += (adm.cached_pages,)
        if tiered:
            after = cache.tier_stats().hit_tokens_by_tier
            result += (tuple(after[t] - before.get(t, 0) for t in sorted(after)),)
        events = event_counts(cache)
        seen.append(result + (events if engine_view else ()))
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
    engine_view = sharing == "isolated"
    worlds = [play(make(sharing, policy, capacity, host), secret, script, engine_view) for secret in (x, x2)]
    assert worlds[0] == worlds[1], (x, x2, script)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), sharing=st.sampled_from(["isolated", "k-anonymous"]), policy=st.sampled_from(ONLINE),
       host=st.sampled_from([0, 6]))
def test_the_attacker_observes_the_same_in_both_worlds(data, sharing, policy, host):
    """Full pools (4-8 blocks) under isolated, or for an attacker that never asks for the
    victim's pages; any pool under k-anonymous when it never fills (64 blocks)."""
    full = sharing == "isolated" or data.draw(st.booleans(), label="full pool")
    capacity = data.draw(st.integers(4, 8), label="capacity") if full else 64
    touch = sharing == "isolated" or not full
    game = data.draw(scripts(touch_secrets=touch), label="game")
    assert_indistinguishable(sharing, policy, capacity, host, game)


@pytest.mark.xfail(strict=True, reason="k-anonymous keeps one copy of a page: a refused tenant's request of "
                   "the victim's pages leaves the pool one copy lighter than in the other world (dedup), "
                   "which the attacker's own evictions show on a full pool")
def test_k_anonymous_full_pool_dedup_channel():
    # 4 blocks. The attacker caches a page of its own, then asks for X: in the world where the
    # victim sent X the cache keeps one copy of X, in the other two. The victim's next turn then
    # evicts the attacker's page in one world only, which its next request shows.
    script = [("victim", None, None), ("attacker", (3,), "release"), ("attacker", (0, 0), "release"),
              ("victim", None, None), ("attacker", (3,), "release")]
    assert_indistinguishable("k-anonymous", "lru", 4, 0, ((0, 0), (1, 0), script))

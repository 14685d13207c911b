"""A refused page is invisible to the prober (issue: k-anonymous sharing without side effects).

Under k-anonymity a ``match`` or ``admit`` of pages another tenant cached, which the rule does not
copy to the prober, must not act on them: no touch, no load from below, no split, no lock, no
policy hook, no event. Each test below failed when a refused probe still did one of these; the
indistinguishability game (tests/core/test_indistinguishability.py) checks them together.
"""

from __future__ import annotations

import pytest

from radixkv import PrefixCache
from radixkv.policies.lru import LRU
from radixkv.tenancy import KAnonymous
from radixkv.tiers import HostTier, TieredCache

PAGE = 2


def pages(*ids: int) -> list:
    """Tokens of pages ``ids`` (page ``i`` is ``[i, i]``)."""
    return [t for i in ids for t in (i, i)]


def probe(cache: PrefixCache, tokens: list, how: str) -> int:
    """One refused probe by tenant ``"x"``: a match, or an admission released at once."""
    if how == "match":
        return cache.match(tokens, tenant="x").num_tokens
    with cache.admit(tokens, tenant="x") as adm:
        return adm.hit_tokens


@pytest.mark.parametrize("how", ["match", "admit"])
def test_a_refused_probe_does_not_refresh_the_pages(how):
    """The victim's pages are the least recently used; a refused probe leaves them next to go."""
    cache = PrefixCache(8, page_size=PAGE, sharing=KAnonymous(k=2))
    cache.admit(pages(1, 2), tenant="victim").release()
    cache.admit(pages(7, 8), tenant="x").release()  # the prober's own pages, used later
    first = cache.peek_victim()  # (retention, priority: the victim's last use, pages)
    assert first is not None
    assert probe(cache, pages(1, 2), how) == 0
    cache.check()
    assert cache.peek_victim()[:2] == first[:2]
    assert cache.evict(2) == 2 and cache.cached_pages(pages(1, 2), tenant="victim") == 0  # the victim's first
    assert cache.cached_pages(pages(7, 8), tenant="x") == 2


@pytest.mark.parametrize("how", ["match", "admit"])
def test_a_refused_probe_does_not_load_the_pages_back_from_below(how):
    cache = TieredCache(4, page_size=PAGE, tiers=[HostTier(8)], sharing=KAnonymous(k=2), load_back="always")
    cache.admit(pages(1, 2), tenant="victim").release()
    cache.evict(2)  # the victim's pages are on the host now
    assert cache.cached_pages(pages(1, 2), tenant="victim") == 0
    before = cache.tier_stats().as_dict()
    assert probe(cache, pages(1, 2), how) == 0
    cache.check()
    assert cache.cached_pages(pages(1, 2), tenant="victim") == 0
    stats = cache.tier_stats().as_dict()
    assert stats["bytes_by_route"].get("host->hbm", 0) == before["bytes_by_route"].get("host->hbm", 0), stats
    assert stats["hit_tokens_by_tier"] == before["hit_tokens_by_tier"]


@pytest.mark.parametrize("how", ["match", "admit"])
def test_a_refused_probe_does_not_split_the_node(how):
    cache = PrefixCache(16, page_size=PAGE, sharing=KAnonymous(k=2))
    cache.admit(pages(1, 2, 3, 4), tenant="victim").release()
    nodes = len(list(cache.nodes()))
    assert probe(cache, pages(1, 2, 9), how) == 0
    cache.check()
    victim = [n for n in cache.nodes() if n.parent.parent is None and n.parent.namespace == (None, "victim")]
    assert len(victim) == 1 and victim[0].num_pages == 4  # the victim's node is whole
    if how == "admit":  # the prober's own copy, in its own partition
        assert cache.cached_pages(pages(1, 2, 9), tenant="x") == 3


def test_a_refused_probe_does_not_lock_the_pages():
    """8 blocks, a 5-page prefix another tenant cached: the prober gets 5 blocks, as alone."""
    cache = PrefixCache(8, page_size=PAGE, sharing=KAnonymous(k=2))
    cache.admit(pages(1, 2, 3, 4, 5), tenant="victim").release()
    adm = cache.admit(pages(1, 2, 3, 4, 5), tenant="x")
    assert adm.hit_tokens == 0 and len(adm.new_blocks) == 5
    assert cache.protected_blocks == 5  # its own five, none of the victim's
    assert all(n.lock_ref == 0 for n in cache.nodes() if n.parent.namespace == (None, "victim"))
    adm.release()
    cache.check()


def test_a_refused_probe_calls_no_policy_hook_on_the_pages():
    calls = []

    class Watching(LRU):
        def on_access(self, node, now):
            calls.append(("access", node.start, node.end))
            super().on_access(node, now)

        def on_split(self, upper, lower):
            calls.append(("split", upper.end))
            super().on_split(upper, lower)

    cache = PrefixCache(16, page_size=PAGE, sharing=KAnonymous(k=2), policy=Watching())
    cache.admit(pages(1, 2, 3), tenant="victim").release()
    calls.clear()
    cache.match(pages(1, 2), tenant="x")
    cache.admit(pages(1, 2), tenant="x").abort()
    assert calls == []
    cache.check()


def test_a_refused_probe_emits_no_event():
    cache = PrefixCache(16, page_size=PAGE, sharing=KAnonymous(k=2))
    cache.attach_page_hashes()
    cache.admit(pages(1, 2, 3), tenant="victim").release()
    cache.take_events()
    cache.match(pages(1, 2, 3), tenant="x")
    cache.admit(pages(1, 2), tenant="x").abort()
    assert cache.take_events() == []
    cache.check()

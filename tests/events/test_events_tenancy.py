"""KV events under sharing rules: isolated tenants never share a hash (a router cannot link
them); under k-anonymity the tree holds one copy, stored once."""

from __future__ import annotations

from radixkv import PrefixCache
from radixkv.events import BlockStored

from ..core.test_tenancy import served


def stored_hashes(cache: PrefixCache) -> list:
    return [h for e in cache.take_events() if isinstance(e, BlockStored) for h in e.block_hashes]


def test_isolated_tenants_publish_different_hashes():
    cache = PrefixCache(16, page_size=2, enable_events=True, sharing="isolated")
    served(cache, (1, 2), "a")
    a = stored_hashes(cache)
    served(cache, (1, 2), "b")
    b = stored_hashes(cache)
    served(cache, (1, 2), None)
    plain = stored_hashes(cache)
    assert len(a) == len(b) == len(plain) == 2 and not set(a) & set(b) and not set(plain) & (set(a) | set(b))
    cache.check()


def test_k_anonymous_stores_one_copy_once():
    cache = PrefixCache(16, page_size=2, enable_events=True, sharing="k-anonymous")
    served(cache, (1, 2), "a")
    first = stored_hashes(cache)
    assert served(cache, (1, 2), "b") == 0
    assert len(first) == 2 and stored_hashes(cache) == []  # b's copies went back, never stored
    cache.check()

"""KV events under sharing rules: tenants' partitions never share a hash (a router cannot link
them), isolated or k-anonymous, copies included."""

from __future__ import annotations

import pytest

from radixkv import PrefixCache
from radixkv.events import BlockStored
from radixkv.tenancy import KAnonymous

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


@pytest.mark.parametrize("sharing", ["isolated", "k-anonymous"])
def test_each_tenants_pages_are_stored_under_its_own_hashes(sharing):
    cache = PrefixCache(16, page_size=2, enable_events=True, sharing=KAnonymous(k=1) if sharing != "isolated"
                        else sharing)
    served(cache, (1, 2), "a")
    first = stored_hashes(cache)
    assert served(cache, (1, 2), "b") == (4 if sharing == "k-anonymous" else 0)  # k=1: a copy of a's
    second = stored_hashes(cache)
    assert len(first) == len(second) == 2 and not set(first) & set(second)
    cache.check()

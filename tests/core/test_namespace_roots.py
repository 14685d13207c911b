"""An unused namespace costs nothing: roots exist only while they hold pages or locks, and the
``other_namespace`` miss reason is found through a page index, not by walking every root."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.errors import LockError
from radixkv.analysis.replay import replay
from radixkv.analysis.stats import ReplayStats, other_namespace_pages
from radixkv.workload.traces import Request
from radixkv.tree import RadixTree
from radixkv.tiers import HostTier, TieredCache


def test_lookups_in_unused_namespaces_create_no_root():
    cache = PrefixCache(num_blocks=8, page_size=2)
    for i in range(100):
        ns = f"salt-{i}"
        assert cache.match([1, 2, 3, 4], namespace=ns).num_tokens == 0
        assert cache.pin([1, 2], namespace=ns) == 0
        with pytest.raises(LockError):
            cache.unpin([1, 2], namespace=ns)
        cache.insert([], [], namespace=ns)
    assert cache.num_namespaces == 0
    cache.check()


def test_a_root_goes_when_its_last_page_and_lock_go():
    cache = PrefixCache(num_blocks=2, page_size=2)
    with cache.admit([1, 2, 3, 4], namespace="a"):
        assert cache.num_namespaces == 1
    with cache.admit([1], namespace="short"):         # no full page: the admission's lock holds the root
        assert cache.num_namespaces == 2
    assert cache.num_namespaces == 1
    cache.admit([5, 6, 7, 8], namespace="b").release()  # evicts all of "a"
    assert cache.num_namespaces == 1
    cache.evict(2)
    assert cache.num_namespaces == 0
    cache.check()


def test_a_root_handle_stays_usable_while_its_root_comes_and_goes():
    cache = PrefixCache(num_blocks=4, page_size=2)
    miss = cache.match([1, 2], namespace="x").node      # no root exists: a handle to the empty prefix
    cache.lock(miss)                                     # registers the root while locked
    assert cache.num_namespaces == 1
    cache.insert([1, 2], cache.allocate(1), namespace="x")
    cache.unlock(miss)
    assert cache.num_namespaces == 1                     # it holds a page now
    cache.evict(4)
    assert cache.num_namespaces == 0
    cache.lock(miss)                                     # the same handle, a new root
    cache.check()
    cache.unlock(miss)
    assert cache.num_namespaces == 0
    with pytest.raises(LockError):
        cache.unlock(miss)
    cache.check()


def test_single_use_namespaces_leave_no_roots_behind():
    cache = PrefixCache(num_blocks=16, page_size=4)
    trace = [Request(np.arange(i % 7, i % 7 + 32, dtype=np.uint32), namespace=f"req-{i}") for i in range(500)]
    replay(trace, cache)
    assert cache.num_namespaces <= 2                     # 16 blocks hold at most two 8-page requests
    cache.evict(16)
    assert cache.num_namespaces == 0
    cache.check()


def test_tiered_roots_stay_while_a_lower_tier_holds_their_pages():
    cache = TieredCache(num_blocks=2, page_size=2, tiers=[HostTier(8)], load_back="always")
    cache.admit([1, 1, 2, 2], namespace="a").release()
    cache.admit([3, 3, 4, 4], namespace="b").release()   # "a" demoted to the host: its root stays
    cache.check()
    assert cache.admit([1, 1, 2, 2], namespace="a").hit_tokens == 4
    cache.check()


def _count_walks(monkeypatch) -> list:
    calls = [0]
    walk = RadixTree.walk

    def counting(self, *args, **kwargs):
        calls[0] += 1
        return walk(self, *args, **kwargs)

    monkeypatch.setattr(RadixTree, "walk", counting)
    return calls


@pytest.mark.parametrize("n", [200, 400])
def test_miss_reasons_do_not_walk_every_root_per_request(monkeypatch, n):
    """Work per request stays flat as single-use namespaces pile up (counted, not timed): walking
    every other root per request made it quadratic."""
    calls = _count_walks(monkeypatch)
    cache = PrefixCache(num_blocks=64 * 1024, page_size=4)  # room for every request: every root stays
    trace = [Request((np.arange(32) + (i % 3)).astype(np.uint32), namespace=f"salt-{i}") for i in range(n)]
    result = replay(trace, cache)
    assert result.miss_tokens_by_reason["other_namespace"] > 0
    assert len(cache._tree._roots) == n
    assert calls[0] <= 4 * n, f"{calls[0]} tree walks for {n} requests"


requests = st.lists(st.tuples(st.lists(st.integers(0, 2), max_size=8), st.sampled_from([None, "a", "b", "c"])),
                    min_size=1, max_size=25)


@settings(deadline=None)
@given(trace=requests, num_blocks=st.integers(1, 10), warm=st.integers(0, 5))
def test_indexed_other_namespace_pages_equal_walking_every_root(trace, num_blocks, warm):
    """The index, attached to a warm cache and kept through admissions, evictions and an abort,
    answers as the walk over every root does."""
    cache = PrefixCache(num_blocks, page_size=2)
    for tokens, ns in trace[:warm]:
        cache.admit(tokens, namespace=ns).release()
    stats = ReplayStats(2)
    for i, (tokens, ns) in enumerate(trace):
        request = Request(np.asarray(tokens, dtype=np.uint32), namespace=ns)
        assert stats.other_pages(cache, request) == other_namespace_pages(cache, request)
        adm = cache.admit(tokens, namespace=ns)
        adm.abort() if i % 5 == 4 else adm.release()
        cache.check()
    cache.reset()
    request = Request(np.asarray(trace[0][0], dtype=np.uint32), namespace=trace[0][1])
    assert stats.other_pages(cache, request) == other_namespace_pages(cache, request) == 0

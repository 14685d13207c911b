"""ARC and LIRS: the rules behind their exact orders, their ghosts (bounded, per namespace) and their counters."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.policies.arc import ARC, T1, T2
from radixkv.policies.ghost import RunHistory
from radixkv.policies.lirs import LIRS

from ..strategies import cached_pages
from .test_policies import eviction_order


def _pages(cache):
    return {k[1] for k in cached_pages(cache)}


def _admit(cache, tokens, namespace=None):
    cache.admit(tokens, namespace=namespace).release()
    cache.check()


def test_arc_evicts_from_t2_while_t1_is_within_its_target():
    class Wide(ARC):
        def attach(self, cache):
            super().attach(cache)
            self.target = 10.0  # T1 (2 pages) never exceeds it

    # T2 by LRU: [5,6] t5, [4] t7; [1,2] is an inner node until [3] goes, so T1 gives [3]; then [1,2] (T2), [7]
    assert eviction_order(Wide()) == [[5, 6], [5], [1, 2, 4], [1, 2, 3], [1, 2], [1], [7]]


@pytest.mark.parametrize("namespace", [None, "b"])
def test_arc_ghost_hit_in_b1_raises_the_target_and_enters_t2(namespace):
    policy = ARC()
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    _admit(cache, [1, 2, 3])
    assert policy.sizes == [3, 0]
    assert cache.evict(3) == 3
    assert policy.sizes == [0, 0] and policy.ghost_sizes == [3, 0]
    _admit(cache, [1, 2, 3, 4], namespace=namespace)
    if namespace is None:  # the evicted run [1,2,3] comes back: B1 hit of 3 pages
        assert policy.target == 3.0 and policy.sizes == [1, 3] and policy.ghost_sizes == [0, 0]
    else:  # another namespace's identical pages are not the remembered ones
        assert policy.target == 0.0 and policy.sizes == [4, 0] and policy.ghost_sizes == [3, 0]


def test_arc_ghost_hit_in_b2_lowers_the_target():
    policy = ARC()
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    _admit(cache, [1, 2])
    _admit(cache, [1, 2])  # now in T2
    policy.target = 5.0
    assert cache.evict(2) == 2
    assert policy.ghost_sizes == [0, 2]
    _admit(cache, [1, 2])
    assert policy.target == 3.0 and policy.sizes == [0, 2]


def test_arc_counters_match_the_cache_through_a_random_trace():
    rng = np.random.default_rng(5)
    policy = ARC()
    cache = PrefixCache(num_blocks=24, page_size=2, policy=policy)
    bases = [rng.integers(0, 5, size=20).tolist() for _ in range(6)]
    for _ in range(300):
        tokens = bases[rng.integers(0, 6)][: rng.integers(2, 21)] + rng.integers(0, 5, size=rng.integers(0, 6)).tolist()
        _admit(cache, tokens, namespace=[None, "x"][rng.integers(0, 2)])
        assert sum(policy.sizes) == cache.num_cached_blocks and min(policy.sizes) >= 0
        assert sum(policy.ghost_sizes) == policy.history.pages <= cache.num_blocks
        assert 0.0 <= policy.target <= cache.num_blocks
    assert policy.target > 0 and min(policy.ghost_sizes) >= 0


def test_lirs_order_follows_the_current_max_of_interval_and_age():
    # [1] used at t1 and t10 (interval 9), [2] at t3 and t4 (interval 1)
    def first_victim(idle):
        cache = PrefixCache(num_blocks=8, page_size=1, policy=LIRS())
        _admit(cache, [1])
        cache.match([9])
        _admit(cache, [2])
        _admit(cache, [2])
        for _ in range(5):
            cache.match([9])
        _admit(cache, [1])
        assert cache.clock == 10
        for _ in range(idle):
            cache.match([9])
        assert cache.evict(1) == 1
        cache.check()
        return ({(1,), (2,)} - _pages(cache)).pop()

    assert first_victim(0) == (1,)  # t10: [1] max(9, 0) > [2] max(1, 6)
    assert first_victim(20) == (2,)  # t30: [1] max(9, 20) < [2] max(1, 26)


@pytest.mark.parametrize("namespace", [None, "b"])
def test_lirs_ghost_gives_a_returning_run_its_interval(namespace):
    cache = PrefixCache(num_blocks=8, page_size=1, policy=LIRS())
    _admit(cache, [1, 2])
    assert cache.evict(2) == 2
    _admit(cache, [1, 2], namespace=namespace)  # t2: remembered (interval 1) unless another namespace
    _admit(cache, [5])  # t3: first use
    assert cache.evict(1) == 1
    cache.check()
    # a first use goes before any page with a known interval; two first uses go oldest first
    assert (5,) not in _pages(cache) if namespace is None else (1, 2) not in _pages(cache)


def test_run_history_is_bounded_in_pages_and_reports_what_it_drops():
    dropped = []
    history = RunHistory(5, lambda record, pages: dropped.append((record, pages)))
    cache = PrefixCache(num_blocks=8, page_size=1, policy="lru")
    for tokens in ([1, 2, 3], [4, 5], [6, 7]):
        cache.admit(tokens).release()
    nodes = {node.first: node for node in cache._tree.nodes()}
    a, b, c = (nodes[np.array([t], dtype=np.uint32).tobytes()] for t in (1, 4, 6))
    history.remember(a, 0, 3, "a")
    history.remember(b, 0, 2, "b")
    assert history.pages == 5 and not dropped
    history.remember(c, 0, 2, "c")
    assert dropped == [("a", 3)] and history.pages == 4 and len(history) == 2

"""density with rank="density": exact orders from hand-set hit densities at the pages' ages now, learned tables, bad options."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.errors import ArgumentValueError
from radixkv.policies.base import gap_bin
from radixkv.policies.density import HitDensity
from radixkv.policies.reuse import BINS
from radixkv.victims import LaneQueue, make_queue

from .test_policies_density import replay_shared_prefixes
from .test_policies_density_rerank import LONG, SHORT, _order


def _densities(policy: HitDensity, rule) -> None:
    """Set every class's density at every age bin to ``rule(uses, category, bin)``."""
    table = np.zeros((policy.num_classes, BINS))
    for u in range(1, 5):
        for q in range(4):
            for c in range(policy.categories):
                table[policy.class_of(u, q, c)] = [rule(u, c, j) for j in range(BINS)]
    policy.densities = table


def _policy() -> HitDensity:
    policy = HitDensity(refit_every=10**6, rank="density")
    assert policy.category(1, LONG) == 2 and policy.category(1, SHORT) == 0
    return policy


def test_lru_until_the_first_fit():
    policy = _policy()
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    for tokens, hints in (([1], LONG), ([5], SHORT), ([7], SHORT)):
        cache.admit(tokens, hints=hints).release()
    assert policy.densities is None
    assert _order(cache) == [(1,), (5,), (7,)]


def test_the_lane_head_of_lowest_density_goes_first():
    policy = _policy()
    _densities(policy, lambda u, c, j: 2.0 if c == 2 else 1.0)  # long-output pages are worth more
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    for tokens, hints in (([1], LONG), ([5], SHORT), ([7], SHORT)):
        cache.admit(tokens, hints=hints).release()
    assert _order(cache) == [(5,), (7,), (1,)]  # the short lane in last-use order, then the long one


def test_a_density_that_falls_with_age_counts_at_the_age_now():
    policy = _policy()
    old = gap_bin(2, BINS)  # [1], used at t2, is 2 ticks old at t4; [8], used at t3, 1 tick
    assert gap_bin(1, BINS) < old
    _densities(policy, lambda u, c, j: (0.5 if j >= old else 2.0) if c == 2 else 1.0)
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    for tokens, hints in (([5], SHORT), ([1], LONG), ([8], LONG), ([7], SHORT)):
        cache.admit(tokens, hints=hints).release()
    # now t4: [1] is old (0.5), [8] young (2.0), the short pages 1.0 (LRU: 5, 1, 8, 7; by class alone: 5, 7, 1, 8)
    assert _order(cache) == [(1,), (5,), (7,), (8,)]


def test_pages_used_again_are_ranked_by_their_own_density():
    policy = _policy()
    _densities(policy, lambda u, c, j: 0.5 if u >= 2 else 1.0)  # here a second use is worth less
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    cache.admit([5], hints=SHORT).release()  # t1: first use
    cache.admit([1], hints=SHORT).release()  # t2
    cache.admit([1], hints=SHORT).release()  # t3: a second use
    assert policy.lanes == policy.num_classes
    assert _order(cache) == [(1,), (5,)]  # LRU and the deadline rule would evict [5] first


def test_learns_a_table_and_keeps_the_ghost_bounded():
    policy = HitDensity(refit_every=20, min_pages=20, rank="density", horizon_factor=2.0)
    replay_shared_prefixes(policy, seed=5, rounds=300)
    table = policy.densities
    assert table is not None and table.shape == (policy.num_classes, BINS) and table.max() > 0


def test_the_lanes_are_one_per_class():
    assert type(make_queue(HitDensity(rank="density"))) is LaneQueue
    assert HitDensity(rank="density").lanes == HitDensity(rank="density").num_classes
    assert HitDensity().lanes == 4 * HitDensity().categories + 1  # the default rule is unchanged


@pytest.mark.parametrize("bad", [dict(rank="lowest"), dict(rank=None), dict(rank="density", class_lanes=False),
                                 dict(rank="density", horizon_factor=0), dict(rank="density", horizon_factor=float("inf")),
                                 dict(rank="density", horizon_factor="2"), dict(rank="density", horizon_factor=True),
                                 dict(horizon_factor=2.0)])  # (the deadline rule has no horizon to scale)
def test_bad_options_are_refused(bad):
    with pytest.raises(ArgumentValueError):
        HitDensity(**bad)


def test_a_numpy_horizon_factor_is_a_number():
    assert HitDensity(rank="density", horizon_factor=np.float64(2.5)).horizon_factor == 2.5


def test_a_bad_table_is_refused_and_the_old_one_kept():
    policy = _policy()
    _densities(policy, lambda u, c, j: 1.0)
    for bad in (np.zeros((3, BINS)), np.full((policy.num_classes, BINS), np.nan), "dense", [[1.0, "x"]]):
        with pytest.raises(ArgumentValueError):
            policy.densities = bad
        assert (policy.densities == 1.0).all()

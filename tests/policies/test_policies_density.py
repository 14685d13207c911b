"""density and wa: exact orders from hand-set windows, the fits behind the windows, bounded history."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.errors import ArgumentValueError
from radixkv.policies.density import HitDensity, hit_density
from radixkv.policies.reuse import BINS, EDGES, MAX_PERIODS, ReuseStats, kaplan_meier, quarter
from radixkv.policies.wa import WorkloadAware, exponential_reuse

from ..strategies import cached_pages
from .test_policies import eviction_order


def _windows(policy, rule):
    """Set every class's window to ``rule(uses, quarter, category)``."""
    policy.windows = [rule(u, q, c) for u in range(1, 5) for q in range(4) for c in range(policy.categories)]
    assert all(policy.windows[policy.class_of(u, q, c)] == rule(u, q, c)
               for u in range(1, 5) for q in range(4) for c in range(policy.categories))
    return policy


@pytest.mark.parametrize("cls", [HitDensity, WorkloadAware])
def test_reused_pages_outrank_first_uses_for_their_window(cls):
    policy = _windows(cls(refit_every=10**6), lambda u, q, c: 100.0 if u >= 2 else 0.0)
    # deadlines: [3] 1, [7] 6 (first uses); [5,6] used at t5 (3 uses) 105; [4] and [1,2] used at t7: 107
    assert eviction_order(policy) == [[1, 2, 3], [7], [5, 6], [5], [1, 2, 4], [1, 2], [1]]


@pytest.mark.parametrize("cls", [HitDensity, WorkloadAware])
def test_a_leaf_loses_only_its_tail_quarter_at_that_quarters_rank(cls):
    policy = _windows(cls(refit_every=10**6), lambda u, q, c: 0.0 if q == 3 else 50.0)
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    cache.admit([1, 2, 3, 4]).release()  # t1: one page per quarter; [4] deadline 1, [1..3] 51
    cache.admit([9]).release()  # t2: quarter 0 of a one-page request, deadline 52
    order = []
    before = {k[1] for k in cached_pages(cache)}
    while before:
        assert cache.evict(1) == 1
        cache.check()
        after = {k[1] for k in cached_pages(cache)}
        order.append(max(before - after, key=len)[-1])
        before = after
    assert order == [4, 3, 2, 1, 9]


def test_the_ghost_counts_uses_past_eviction():
    policy = _windows(HitDensity(refit_every=10**6), lambda u, q, c: 100.0 * (u - 1))
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    cache.admit([1, 2]).release()  # t1: first use
    assert cache.evict(2) == 2
    cache.admit([1, 2]).release()  # t2: the ghost remembers one use: a second use, deadline 102
    cache.admit([5]).release()  # t3: first use, deadline 3
    assert cache.evict(1) == 1
    cache.check()
    assert {k[1] for k in cached_pages(cache)} == {(1,), (1, 2)}


def test_quarters():
    assert [quarter(d, 8) for d in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [quarter(d, 3) for d in range(4)] == [0, 1, 2, 3]


def test_kaplan_meier_counts_censored_observations_at_risk():
    # 4 observations: reused in bin 1 and bin 2, censored in bin 2, still open past bin 3
    events = np.zeros((1, BINS))
    risk = np.zeros((1, BINS))
    events[0, 1], events[0, 2] = 1, 1
    risk[0, :2], risk[0, 2], risk[0, 3] = 4, 3, 1
    s = kaplan_meier(events, risk)
    assert s[0, :4].tolist() == [1.0, 1.0, 0.75, 0.5] and s[0, -1] == 0.5


def test_reuse_stats_at_risk_from_closed_and_open_observations():
    stats = ReuseStats(1, 10)
    stats.open(0, 3, 0)  # three pages used at t0
    stats.close(0, 1, 0, 1, True)  # one reused at t1 (bin 1)
    stats.close(0, 1, 0, 4, False)  # one forgotten at t4 (bin 5: [4, 5.7))
    risk = stats.at_risk(25)  # the third still open, age 25 - 5 = 20 (bin 9: [16, 22.6))
    assert risk[0, :2].tolist() == [3, 3] and risk[0, 2:6].tolist() == [2] * 4
    assert risk[0, 6:10].tolist() == [1] * 4 and risk[0, 10] == 0
    assert stats.rates(25).tolist() == [3 / 25]


def test_reuse_stats_keep_a_bounded_number_of_periods():
    stats = ReuseStats(2, 1)
    for t in range(3 * MAX_PERIODS):
        stats.open(t % 2, 1, t)
        stats.prune(t)
    assert len(stats._opened) <= MAX_PERIODS
    assert stats.censored.sum() == 3 * MAX_PERIODS - MAX_PERIODS  # the dropped ones count censored


def test_hit_density_of_a_certain_reuse_at_a_known_age():
    # S = 1 up to age 4, then falls linearly to 0 at the next edge (4 * sqrt 2): every page is reused there
    k = int(np.searchsorted(EDGES, 4.0))
    s = np.where(EDGES <= 4.0, 1.0, 0.0)[None, :]
    width = EDGES[k + 1] - EDGES[k]
    d = hit_density(s, horizon=width)
    # at age 4: one hit within [4, 4 + width] over an area of width / 2 page-ticks
    assert d[0, k] == pytest.approx(2 / width)
    assert d[0, int(np.searchsorted(EDGES, 2.0))] == 0.0  # within [2, 2 + width] no hit comes
    assert d[0, k + 1] == 0.0  # past the reuse no hit is left


def test_exponential_reuse_matches_the_formula():
    s = np.ones((1, BINS + 1))
    s[0, 3:] = 0.6  # 40% reused, all in bin 2
    events = np.zeros((1, BINS))
    events[0, 2] = 40
    p_reuse = exponential_reuse(s, events, horizon=5.0)
    mean = np.sqrt(EDGES[2] * EDGES[3])
    lam, p = 1 / mean, 0.4
    for j in (0, 4, 10):
        a = EDGES[j]
        want = p * np.exp(-lam * a) * (1 - np.exp(-lam * 5.0)) / (1 - p + p * np.exp(-lam * a))
        assert p_reuse[0, j] == pytest.approx(want)
    assert np.all(np.diff(p_reuse[0]) <= 0)


def replay_shared_prefixes(policy, seed: int, rounds: int) -> None:
    """Admit ``rounds`` requests sharing prefixes of 8 bases (two namespaces) through a 30-block
    cache under ``policy``, checking the cache and the ghost's bound after each."""
    rng = np.random.default_rng(seed)
    cache = PrefixCache(num_blocks=30, page_size=2, policy=policy)
    bases = [rng.integers(0, 50, size=24).tolist() for _ in range(8)]
    for _ in range(rounds):
        tokens = bases[rng.integers(0, 8)][: rng.integers(4, 25)] + rng.integers(0, 50, size=rng.integers(0, 8)).tolist()
        cache.admit(tokens, namespace=[None, "x"][rng.integers(0, 2)]).release()
        cache.check()
        assert policy.history.pages <= 4 * cache.num_blocks


@pytest.mark.parametrize("cls", [HitDensity, WorkloadAware])
def test_learns_windows_and_keeps_the_ghost_bounded(cls):
    policy = cls(refit_every=20, min_pages=20)
    replay_shared_prefixes(policy, seed=3, rounds=400)
    assert policy.theta is not None and policy.windows.max() > 0  # past LRU: windows were fitted
    if cls is HitDensity:  # pages used again share one window, at least any first use's
        reused = policy.windows[policy.class_of(2, 0, 0):]
        assert len(set(reused.tolist())) == 1 and reused[0] >= policy.windows[: policy.class_of(2, 0, 0)].max()


def test_density_output_buckets_split_the_length_buckets():
    from radixkv.policies.base import RequestHints
    policy = HitDensity(length_edges=(100,), output_edges=(10, 50))
    assert policy.categories == 6
    cats = [policy.category(n, RequestHints(output_length=o)) for n in (1, 200) for o in (5, 20, 90)]
    assert cats == [0, 1, 2, 3, 4, 5] and policy.category(1, None) == 0


@pytest.mark.parametrize("bad", [dict(refit_every=0), dict(min_pages=-1), dict(length_edges=(5, 5)),
                                 dict(length_edges=()), dict(history_size=0)])
def test_bad_options_are_refused(bad):
    with pytest.raises(ArgumentValueError):
        HitDensity(output_edges=(0,))
    with pytest.raises(ArgumentValueError):
        HitDensity(**bad)
    with pytest.raises(ArgumentValueError):
        WorkloadAware(**bad)
    with pytest.raises(ArgumentValueError):
        WorkloadAware(max_types=0)


def test_wa_categories_come_from_type_and_turn_when_the_request_has_them():
    from radixkv.policies import RequestHints
    policy = WorkloadAware(max_types=2)
    assert policy.category(10, None) == policy.category(10, RequestHints(output_length=5))  # length bucket
    text1 = policy.category(10, RequestHints(type="text", turn=1))
    text2 = policy.category(10, RequestHints(type="text", turn=2))
    image = policy.category(10, RequestHints(type="image", turn=1))
    other = policy.category(10, RequestHints(type="file", turn=1))
    assert len({text1, text2, image}) == 3 and other == image  # past max_types, types share one category
    assert max(text1, text2, image) < policy.categories

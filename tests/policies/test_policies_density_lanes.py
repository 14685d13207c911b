"""density's class lanes: exact orders under the current windows (a refit shortens or lengthens them at once)."""

from __future__ import annotations

import pytest

from radixkv import PrefixCache, policies
from radixkv.errors import ArgumentValueError
from radixkv.policies.density import HitDensity
from radixkv.victims import LaneQueue, VictimQueue, make_queue

from .test_policies_density_rerank import LONG, SHORT, _order, _set

def _three(policy: HitDensity) -> PrefixCache:
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    cache.admit([1], hints=LONG).release()  # t1
    cache.admit([5], hints=SHORT).release()  # t2
    cache.admit([7], hints=SHORT).release()  # t3
    return cache


def test_a_window_shortened_since_the_last_use_counts_at_once():
    policy = HitDensity(refit_every=10**6)
    _set(policy, 100.0)
    cache = _three(policy)  # deadlines at the uses: [1] 101, [5] 2, [7] 3
    _set(policy, 0.0)  # a refit: long-output pages are worth nothing now; current deadlines [1] 1, [5] 2, [7] 3
    assert _order(cache) == [(1,), (5,), (7,)]


def test_without_lanes_a_shortened_window_waits_for_the_old_rank():
    policy = HitDensity(refit_every=10**6, class_lanes=False)
    _set(policy, 100.0)
    cache = _three(policy)
    _set(policy, 0.0)  # one static queue: [1] keeps its rank 101
    assert _order(cache) == [(5,), (7,), (1,)]


def test_a_window_lengthened_since_the_last_use_counts_without_a_spare():
    policy = HitDensity(refit_every=10**6)
    _set(policy, 0.0)
    cache = _three(policy)  # deadlines at the uses: 1, 2, 3
    _set(policy, 100.0)  # [1] now 101
    calls = []
    on_victim = policy.on_victim
    policy.on_victim = lambda node: calls.append(on_victim(node)) or calls[-1]
    assert _order(cache) == [(5,), (7,), (1,)]
    assert 0 not in calls  # nothing spared: the lanes compare current deadlines


def test_pages_used_again_queue_in_their_own_lane_and_keep_their_window():
    policy = HitDensity(refit_every=10**6)
    policy.windows = [100.0 if u >= 2 else 0.0 for u in range(1, 5) for q in range(4) for c in range(policy.categories)]
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    cache.admit([1], hints=SHORT).release()  # t1
    cache.admit([1], hints=SHORT).release()  # t2: a second use, deadline 102
    cache.admit([5], hints=SHORT).release()  # t3: first use, deadline 3
    cache.admit([6], hints=LONG).release()  # t4: first use (another lane), deadline 4
    assert policy.lanes == 4 * policy.categories + 1
    assert _order(cache) == [(5,), (6,), (1,)]


def test_class_lanes_must_be_a_bool():
    with pytest.raises(ArgumentValueError):
        HitDensity(class_lanes=1)


def test_one_queue_unless_the_policy_has_lanes():
    assert type(make_queue(policies.create("lru"))) is VictimQueue
    assert type(make_queue(HitDensity(class_lanes=False))) is VictimQueue
    assert type(make_queue(HitDensity())) is LaneQueue

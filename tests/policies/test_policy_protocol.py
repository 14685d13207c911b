"""The policy protocol: one eviction notice with the evicted range, admission as an optional
capability, and what a policy may carry from one admission to the next insert."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.policies import EvictionPolicy, create
from radixkv.policies.adaptive import AdaptiveRetention
from radixkv.policies.twoq import TwoQ
from radixkv.tiers import HostTier, TieredCache


def _leaf(cache, first_token):
    (node,) = [n for n in cache.nodes() if n.first == np.array([first_token], dtype=np.uint32).tobytes()]
    return node


@pytest.mark.parametrize("namespaces", [(None, None), ("a", "b")])
def test_adaptive_load_back_does_not_inherit_the_last_admissions_classes(namespaces):
    # A page loaded back from a lower tier was not admitted: it enters fresh, like a new page of
    # its own request. It used to take the classes and boundary of the previous admission
    # (another request, possibly another tenant's), and so that request's retention window.
    first, second = namespaces
    policy = AdaptiveRetention(solve_every=10**6)
    policy.windows = np.array([0.0] * 4 + [10.0] * 4 + [100.0] * 4)  # by use level: 1, 2, 3+
    cache = TieredCache(2, 1, policy=policy, tiers=[HostTier(2)], load_back="always")
    cache.admit([1, 2], namespace=first).release()
    assert cache.evict(2) == 2                           # [1, 2] -> host; HBM's ghost remembers it
    cache.admit([5, 6], namespace=second).release()
    assert cache.evict(2) == 2                           # [5, 6] -> host, [1, 2] dropped from it
    cache.admit([1, 2], namespace=first).release()       # a ghost hit: a reused class, 100 ticks
    assert cache.admit([5, 6], namespace=second).hit_tokens == 2   # loaded back, then used: level 2
    cache.check()
    loaded = _leaf(cache, 5)
    last, head, fresh, boundary = loaded.policy_state[:4]
    assert (head, boundary) == (fresh, loaded.start)
    assert policy.priority(loaded) == last + 10          # not the ghost hit's level 3 (100 ticks)


class Recorder(EvictionPolicy):
    """LRU recording every eviction notice as (first page's token, pages, rank, node leaves)."""

    name = "recorder"

    def __init__(self):
        self.notices = []

    def priority(self, node):
        return node.policy_state

    def on_evict(self, node, pages, rank):
        first = np.frombuffer(node.page(node.num_pages - pages), dtype=np.uint32)[0]
        self.notices.append((int(first), pages, rank, pages == node.num_pages))


def test_one_eviction_notice_carries_the_evicted_range_and_rank():
    policy = Recorder()
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    cache.admit([1, 2, 3]).release()       # t1
    cache.admit([4, 5]).release()          # t2
    assert cache.evict(2) == 2             # [1, 2, 3]'s tail pages at rank t1: the node keeps [1]
    assert policy.notices == [(2, 2, 1, False)]
    assert cache.evict(3) == 3             # [1] (t1, leaves), then [4, 5] (t2), one notice each
    assert policy.notices[1:] == [(1, 1, 1, True), (4, 2, 2, True)]
    cache.check()
    with pytest.raises(RuntimeError):
        with cache.admit([7, 8]):
            raise RuntimeError("the model failed")   # the aborted admission's pages leave unranked
    assert policy.notices[3:] == [(7, 2, None, True)]
    cache.admit([9]).release()
    cache.reset()
    assert policy.notices[4:] == [(9, 1, None, True)]


def test_admission_is_optional_and_tested_once():
    assert EvictionPolicy.admit is None and create("lru").admit is None
    assert create("belady").offline and not create("lru").offline
    assert create("2q").admit is not None and create("belady").admit is not None


def test_2q_remembers_an_aborted_admissions_pages_as_one_run_of_their_own_length():
    # Pages leaving without being evicted (an aborted admission, a reset) are remembered as the
    # run they are. 2Q used to take the run's length from the last eviction (here 1 page), so the
    # returning request was recognized for its first page only and the rest stayed probationary.
    policy = TwoQ(solve_every=10**6)
    policy.window = 100
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    cache.admit([9]).release()                          # t1
    assert cache.evict(1) == 1                          # the last eviction ends at depth 1
    with pytest.raises(RuntimeError):
        with cache.admit([1, 2, 3]):                    # t2: aborted, its 3 pages leave
            raise RuntimeError("the model failed")
    cache.admit([1, 2, 3]).release()                    # t3: the ghost recognizes all 3 pages
    cache.check()
    leaf = _leaf(cache, 1)
    assert leaf.policy_state[2] == leaf.end             # boundary: the recognized pages end there
    assert policy.priority(leaf) == 3 + 100             # protected: no probationary tail

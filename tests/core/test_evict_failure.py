"""An exception from a tier's spill in the middle of an eviction leaves the cache consistent."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.tiers import HostTier, TieredCache


class SpillFailure(RuntimeError):
    pass


class FailingSpill(TieredCache):
    """A tiered cache whose ``fail_at``-th spill raises (a backend error the tier did not absorb)."""

    fail_at = 0
    spills = 0

    def _spill(self, node, k):
        self.spills += 1
        if self.spills == self.fail_at:
            raise SpillFailure(f"spill {self.spills} failed")
        super()._spill(node, k)


def assert_consistent(cache: TieredCache) -> None:
    cache.check()
    assert cache.num_free_blocks + cache.num_held_blocks + cache.num_cached_blocks == cache.num_blocks


def test_a_failed_spill_leaks_no_block_and_no_lock():
    cache = FailingSpill(4, page_size=2, kv_shape=(1,), dtype="float32", tiers=[HostTier(8)])
    for tokens in ([1, 1], [2, 2], [3, 3], [4, 4]):
        cache.admit(tokens).release()
    cache.fail_at = cache.spills + 3  # the third victim of the next admission fails
    with pytest.raises(SpillFailure):
        cache.admit([5, 5, 6, 6, 7, 7])
    assert_consistent(cache)
    assert cache.num_held_blocks == 0
    assert cache.protected_blocks == 0  # the admission's lock went with it
    assert cache.evicted_blocks == 2  # the two victims cut before the failure are gone, and counted
    assert cache.num_free_blocks == 2
    cache.admit([5, 5, 6, 6]).release()  # and the cache keeps working
    assert_consistent(cache)


def test_a_spill_failing_while_a_load_back_makes_room_strands_no_lower_copy():
    # Pages (0, 0) and (0, 0, 0, 0) live only in the host tier; loading (0, 0) back takes its
    # host copy (write-back), then making room in HBM fails: the page is lost from both tiers,
    # and the host copy of the page below it must go too (no lookup could ever reach it).
    cache = FailingSpill(6, page_size=2, kv_shape=(1,), dtype="float32", tiers=[HostTier(6)])
    cache.fail_at = 6
    for tokens in ([0, 0, 0, 0], [0, 2, 0, 0], [0, 0], [0, 1, 0, 0, 0, 0, 0, 0], [0, 3, 0, 0, 0, 0]):
        cache.admit(np.array(tokens)).release()
        assert_consistent(cache)
    with pytest.raises(SpillFailure):
        cache.admit(np.array([0, 0]))
    assert_consistent(cache)
    assert cache.peek([0, 0, 0, 0]) == (0, 0)  # lost: recomputed next time, never served stale
    cache.admit(np.array([0, 0, 0, 0])).release()
    assert_consistent(cache)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=2, max_size=12), min_size=1, max_size=25),
       st.integers(1, 30))
def test_any_failed_spill_leaves_the_cache_consistent(prompts, fail_at):
    cache = FailingSpill(6, page_size=2, kv_shape=(1,), dtype="float32", tiers=[HostTier(6)])
    cache.fail_at = fail_at
    failures = 0
    for tokens in prompts:
        try:
            admission = cache.admit(np.array(tokens))
        except SpillFailure:
            failures += 1
        else:
            admission.release()
        assert_consistent(cache)
        assert cache.num_held_blocks == 0 and cache.protected_blocks == 0
    assert failures <= 1

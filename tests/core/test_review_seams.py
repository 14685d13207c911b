"""Defects a review found where the free-block sink meets the lower tiers and the abort path."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.errors import LockError
from radixkv.policies import LRU
from radixkv.tiers import HostTier, TieredCache


class KeepsOnePage(LRU):
    """Admits only the first of the new pages (the rest are declined)."""

    def admit(self, node_parent, num_pages, now, pages):
        return min(1, num_pages)


def test_declined_pages_are_copied_down_before_they_reach_the_sink():
    # Write-through copies an insert's pages to the host; the declined ones leave through the
    # sink, whose owner may overwrite them at once: the copy must be made while the cache still
    # holds them, never from blocks the caller already owns again.
    seen = []

    def sink(blocks):
        seen.append(cache.tier_stats().pages_by_tier.get("host", 0))  # host pages when the sink runs
        cache_payload[blocks] = -1.0  # the owner reuses the blocks at once

    cache = TieredCache(8, 2, policy=KeepsOnePage(), kv_shape=(1,), dtype="float32", tiers=[HostTier(8)],
                        write_policy="write_through", on_free=sink)
    cache_payload = cache.payload
    blocks = cache.allocate(2)
    cache.write(blocks, np.arange(1, 3, dtype=np.float32).repeat(2).reshape(2, 2, 1))
    cache.insert([1, 2, 3, 4], blocks)
    cache.check()
    assert seen == [2]  # both pages were on the host before the declined one was handed back
    assert cache.num_cached_blocks == 1


def test_reset_refuses_while_an_admission_holds_pages_a_batch_mate_aborted():
    for cache in (PrefixCache(16, 2), TieredCache(16, 2, tiers=[HostTier(16)], write_policy="write_through")):
        a = cache.admit([1, 2, 3, 4])
        b = cache.admit([1, 2, 3, 4, 5, 6, 7, 8])
        a.abort()  # b's pages hang below a's, which the abort detached: b still holds them
        cache.check()
        with pytest.raises(LockError):
            cache.reset()
        cache.check()
        b.release()
        cache.reset()
        cache.check()
        assert cache.num_free_blocks == 16


class SinkFailure(RuntimeError):
    pass


@pytest.mark.parametrize("step", ["evict", "insert", "abort", "reset"])
def test_a_sink_that_raises_loses_no_block(step):
    # The sink is a collaborator (an engine's allocator): if it raises half-way through an
    # operation, the blocks it was handed stay the cache's, on the free list, never leaked as held.
    calls = []

    def sink(blocks):
        calls.append(len(blocks))
        raise SinkFailure("allocator refused")

    cache = PrefixCache(8, 2, policy=KeepsOnePage() if step == "insert" else "lru", on_free=sink)
    if step == "insert":
        blocks = cache.allocate(2)
        with pytest.raises(SinkFailure):
            cache.insert([1, 2, 3, 4], blocks)  # the second page is declined: to the sink
    else:
        cache.on_free = None
        admission = cache.admit([1, 2, 3, 4, 5, 6])
        if step != "abort":
            admission.release()
        cache.on_free = sink
        with pytest.raises(SinkFailure):
            if step == "evict":
                cache.evict(2)
            elif step == "abort":
                admission.abort()
            else:
                cache.reset()
    cache.check()
    assert calls and cache.num_held_blocks == 0
    assert cache.num_free_blocks + cache.num_cached_blocks == cache.num_blocks
    cache.on_free = None
    cache.admit([7, 8, 9, 10]).release()  # and the cache keeps working
    cache.check()

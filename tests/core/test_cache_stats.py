"""Hit counters an engine reads (``PrefixCache.stats``, vLLM's ``PrefixCacheStats``) and the admission
that says it cached only part of a prompt (``Admission.uncached_pages``, ``all_or_nothing``)."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import CacheStats, PrefixCache
from radixkv.analysis.replay import replay
from radixkv.errors import ArgumentTypeError
from radixkv.tiers import HostTier, TieredCache
from radixkv.workload.sources import open_trace

from ..shared_traces import CONVERSATION


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_stats_equal_the_replays_own_counts_on_the_conversation_trace(policy):
    cache = PrefixCache(2000, 512, policy)
    result = replay(open_trace(str(CONVERSATION)), cache, miss_reasons=False)
    stats = cache.stats
    assert (stats.queries, stats.query_tokens, stats.hit_tokens, stats.evicted_pages) == (
        result.requests, result.prompt_tokens, result.hit_tokens, result.evicted_blocks)
    assert stats.hit_pages * 512 == stats.hit_tokens and stats.hit_rate == result.token_hit_rate
    assert stats.evicted_pages > 0 and stats.hit_tokens > 0


def test_match_counts_and_reset_starts_again():
    cache = PrefixCache(64, 4)
    cache.admit(list(range(10))).release()       # 2 pages cached, 10 tokens queried
    cache.match(list(range(9)))                  # 2 pages hit
    cache.match([7, 7, 7, 7], namespace="other")  # a namespace with nothing cached
    cache.peek_match(list(range(8)))             # inspection: no query
    assert cache.stats == CacheStats(queries=3, query_tokens=23, hit_tokens=8, hit_pages=2, evicted_pages=0)
    before = cache.reset_stats()
    assert before.queries == 3 and cache.stats == CacheStats(0, 0, 0, 0, 0)
    cache.match(list(range(8)))
    assert cache.stats.hit_tokens == 8 and cache.stats.hit_rate == 1.0


def test_a_refused_call_counts_nothing():
    cache = PrefixCache(64, 4)
    with pytest.raises(TypeError):
        cache.admit([1.5, 2, 3, 4])
    assert cache.stats.queries == 0


def test_tiered_stats_by_tier_since_reset():
    cache = TieredCache(8, 16, tiers=[HostTier(64)])
    for start in (0, 1000, 0):
        cache.admit(np.arange(start, start + 128)).release()
    assert cache.stats.hit_tokens_by_tier == {"hbm": 0, "host": 128} and cache.stats.hit_tokens == 128
    cache.reset_stats()
    cache.admit(np.arange(1000, 1128)).release()   # back from the host tier
    cache.admit(np.arange(1000, 1128)).release()   # now in HBM
    stats = cache.stats
    assert stats.hit_tokens_by_tier == {"hbm": 128, "host": 128} and stats.hit_tokens == 256
    assert stats.queries == 2 and stats.evicted_pages == 8


def test_a_partial_admission_says_so():
    cache = PrefixCache(10, 16)
    held = cache.admit(np.arange(320))          # 20 pages, 10 blocks
    assert (held.hit_tokens, len(held.new_blocks), held.uncached_pages) == (0, 10, 10)
    assert "uncached=10" in repr(held)
    other = cache.admit(np.arange(1000, 1320))  # everything protected: no block at all
    assert (len(other.blocks), other.uncached_pages) == (0, 20)
    other.release()
    held.release()
    whole = cache.admit(np.arange(160))
    assert whole.uncached_pages == 0 and "uncached" not in repr(whole)
    whole.release()
    cache.check()


def test_all_or_nothing_waits_rather_than_admit_in_part():
    cache = PrefixCache(10, 16)
    first = cache.admit(np.arange(96), all_or_nothing=True)   # 6 pages fit
    assert first is not None and first.uncached_pages == 0
    free, cached = cache.num_free_blocks, cache.num_cached_blocks
    assert cache.admit(np.arange(1000, 1096), all_or_nothing=True) is None  # 6 pages, 4 blocks to get
    assert (cache.num_free_blocks, cache.num_cached_blocks, cache.protected_blocks) == (free, cached, 6)
    assert cache.evicted_blocks == 0
    cache.check()
    first.release()
    second = cache.admit(np.arange(1000, 1096), all_or_nothing=True)       # now 2 pages can be evicted
    assert second is not None and len(second.new_blocks) == 6 and cache.evicted_blocks == 2
    second.release()
    again = cache.admit(np.arange(96), all_or_nothing=True)                # 4 of 6 hit, 2 to get
    assert again.hit_tokens == 64 and again.uncached_pages == 0
    again.release()
    cache.check()
    with pytest.raises(ArgumentTypeError):
        cache.admit(np.arange(16), all_or_nothing=1)

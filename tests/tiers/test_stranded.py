"""A page lost below HBM takes with it every copy it led to, the ones still being placed too.

Write-back demotes the tail HBM evicts; making room for it may demote an
older page whose read fails, and losing that page drops the copies below it.
Pages of the same put that are still in flight below the lost page must go
too: stored, they would hang under a page no tier holds, and no lookup could
reach them (``check()``: "lower copies no lookup can reach").
"""

from __future__ import annotations

from radixkv.tiers.tiered import stranded_copies

from .test_tier_faults import TierFaultMachine
from .test_tiers_payload import PS


def test_a_read_failing_while_a_demotion_makes_room_strands_no_copy_of_that_demotion():
    m = TierFaultMachine()
    m.build(write_policy="write_back", load_back="never", sizes=(3, 1, 1), threshold=1)
    m.consistent()
    short = m.sequence(namespace=None, tokens=[0, 0, 0, 0])
    m.admit(fault=None, seq=short)
    m.consistent()
    long = m.extended(seq=short, tokens=[0, 0])
    m.evict_reset_or_kill(action=0)  # page 1 to the host
    m.consistent()
    m.evict_reset_or_kill(action=0)  # page 0 to the host, page 1 cascades to the remote tier
    m.consistent()
    m.admit(fault="read raises", seq=long)  # load_back="never": pages 0..2 recomputed in HBM
    m.consistent()
    cache = m.cache
    assert cache.tier_stats().pages_by_tier == {"host": 1, "remote": 1}
    # HBM evicts pages 1..2: page 1 has its remote copy, page 2 goes to the host, whose room
    # demotes page 0; that read raises, page 0 is lost, and the copies below it with it.
    m.evict_reset_or_kill(action=1)
    m.consistent()  # check(), and the events name every copy dropped
    assert stranded_copies(cache) == []
    stats = cache.tier_stats()
    assert stats.pages_by_tier == {"host": 0, "remote": 0}
    assert stats.tier_errors == 1 and stats.dropped_pages == 3
    assert cache.peek(long[0]) == (1, 0)  # page 0 still in HBM; the rest recomputed, never served stale
    m.admit(fault="heal", seq=long)
    m.consistent()
    assert cache.hit_tokens_by_tier["hbm"] >= PS
    m.teardown()

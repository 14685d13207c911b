"""A tiered cache reports moves between tiers as BlockDemoted / BlockPromoted events."""

from __future__ import annotations

from radixkv.events import BlockDemoted, BlockPromoted, BlockRemoved, BlockStored
from radixkv.tiers import HostTier, TieredCache


def test_demotion_and_promotion_are_reported_with_the_page_hashes():
    cache = TieredCache(num_blocks=4, page_size=2, tiers=[HostTier(8)], write_policy="write_back",
                        load_back="always", enable_events=True)
    first = list(range(8))                  # 4 pages: fills HBM
    cache.admit(first).release()
    stored = [e for e in cache.take_events() if isinstance(e, BlockStored)]
    first_hashes = [h for e in stored for h in e.block_hashes]
    assert len(first_hashes) == 4

    cache.admit(list(range(100, 108))).release()   # evicts (demotes) all four pages of `first`
    events = cache.take_events()
    demoted = [h for e in events if isinstance(e, BlockDemoted) for h in e.block_hashes]
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert sorted(demoted) == sorted(first_hashes)
    assert sorted(removed) == sorted(first_hashes)
    assert all(e.medium == "CPU" for e in events if isinstance(e, BlockDemoted))

    adm = cache.admit(first)                  # loads them back from the host tier
    assert adm.hit_tokens == 8
    adm.release()
    events = cache.take_events()
    promoted = [e for e in events if isinstance(e, BlockPromoted)]
    assert sorted(h for e in promoted for h in e.block_hashes) == sorted(first_hashes)
    assert all(e.source_medium == "CPU" and e.medium == "GPU" for e in promoted)
    restored = [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert sorted(restored) == sorted(first_hashes)
    cache.check()

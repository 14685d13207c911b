"""Defects found in review of the tier-policy fault handling (a tier policy's ``on_insert`` or
``on_evict`` raising in the spill tree), the node-key views and the int64 token fast paths.

Each test states the behaviour radixkv documents; each failed on the code it was written
against (marked ``xfail(strict=True)`` until fixed) and passes now.
"""

from __future__ import annotations

import numpy as np
import pytest

from radixkv.policies import LRU
from radixkv.tiers import HostTier, RemoteTier, TieredCache

from .test_review_r17 import HookError, RaisingLRU  # fail names the hook that raises


def test_an_abort_whose_tier_on_evict_raises_still_uncaches_the_aborted_pages():
    """Admission.abort: 'End the admission without its KV: uncache its new pages'; the engine's
    abort 'always completes' when a hook raises. Here the aborted pages [1, 2] have a page [3, 4]
    below them copied to the host tier, whose policy raises while the abort forgets that copy."""
    tier_policy = RaisingLRU()
    cache = TieredCache(6, page_size=1, policy=LRU(), tiers=[HostTier(8, policy=tier_policy)])
    writer = cache.admit([1, 2])  # new pages [1, 2], KV not written yet
    cache.admit([1, 2, 3, 4]).release()  # shares the pending [1, 2], caches [3, 4]
    cache.admit([7, 8, 9, 10]).release()  # write-back: [3, 4] go down to the host tier
    cache.check()
    assert cache.peek([1, 2, 3, 4]) == (2, 2)
    tier_policy.fail = "on_evict"
    with pytest.raises(HookError):
        writer.abort()
    tier_policy.fail = ""
    assert cache.match([1, 2, 3, 4]).num_tokens == 0, "pages of an aborted admission (no KV) are still served"
    cache.check()


def test_a_load_whose_tier_on_evict_raises_leaves_no_unreachable_copy_below():
    """A tier policy raising while a load from below releases a copy (stack.fetch -> _release)
    drops that copy; the host copy of [3] below it can then never be served and must go too."""
    tier_policy = RaisingLRU()
    cache = TieredCache(4, page_size=1, policy=LRU(), tiers=[HostTier(8, policy=tier_policy)], load_back="always")
    cache.admit([1, 2, 3]).release()
    assert cache.evict(1) == 1 and cache.evict(2) == 2  # host: [1, 2] above [3]
    cache.check()
    assert cache.peek([1, 2, 3]) == (0, 3)
    tier_policy.fail = "on_evict"
    with pytest.raises(HookError):
        cache.admit([1, 2])  # loads [1, 2] back: their host copy is released
    tier_policy.fail = ""
    cache.check()


def test_a_demotion_whose_lower_tier_on_insert_raises_leaves_no_unreachable_copy_below():
    """Host [1, 2] above remote [3]: the host evicts [1, 2] for room, the remote's policy raises
    as they arrive (stack._assign), so [1, 2] are lost below HBM and [3] with them."""
    remote_policy = RaisingLRU()
    cache = TieredCache(4, page_size=1, policy=LRU(),
                        tiers=[HostTier(2), RemoteTier(blocks_per_host=8, policy=remote_policy)], load_back="always")
    cache.admit([1, 2, 3]).release()
    cache.evict(1)  # [3] to the host
    cache.admit([5, 6]).release()
    cache.evict(2)  # [1, 2] to the host, which sends [3] on to the remote tier
    cache.check()
    assert cache.tier_stats().pages_by_tier == {"host": 2, "remote": 1}
    remote_policy.fail = "on_insert"
    with pytest.raises(HookError):
        cache.evict(2)  # [5, 6] to the host: it demotes [1, 2] to the remote tier
    remote_policy.fail = ""
    cache.check()


def test_a_put_whose_on_insert_raises_gives_back_the_slots_of_the_nodes_not_yet_placed():
    """A put filling two placeholders at once ([1] and [2], split by the branches below them)
    reserves a slot for each; on_insert raising for the first drops both, and both slots must
    come back to the tier (check: 'slots used, tree holds ... pages')."""
    host_policy = RaisingLRU()
    cache = TieredCache(8, page_size=1, policy=LRU(), tiers=[HostTier(8, policy=host_policy)],
                        write_policy="write_through")
    cache.admit([7]).release()
    root, stack = cache._existing_root(None), cache._stack
    key = lambda tokens: np.asarray(tokens, dtype=np.uint32).tobytes()  # noqa: E731
    stack.put(root, key([1, 2, 3]), 2, 3, None)  # placeholder [1, 2] above a copy of [3]
    stack.put(root, key([1, 9]), 1, 2, None)  # placeholders [1] and [2]; a copy of [9]
    cache.check()
    host_policy.fail = "on_insert"
    with pytest.raises(HookError):
        stack.put(root, key([1, 2]), 0, 2, None)
    host_policy.fail = ""
    cache.check()


class CountdownRaisingLRU(LRU):
    """LRU whose ``on_evict`` raises once, after ``countdown`` calls that succeed."""

    name = "countdown-raising-lru"
    countdown = None

    def on_evict(self, node, pages, rank):
        if self.countdown is not None:
            self.countdown -= 1
            if self.countdown < 0:
                self.countdown = None
                raise HookError("on_evict")
        super().on_evict(node, pages, rank)


def test_a_lost_host_swept_after_a_load_leaves_nothing_in_flight_when_on_evict_raises():
    """A load from a dead remote host finds it dead; the sweep that follows forgets the other
    copies it held ([5, 6, 7]), and the tier policy raises while one is released."""
    from radixkv.tiers import SimulatedHosts

    tier_policy = CountdownRaisingLRU()
    hosts = SimulatedHosts(1)
    cache = TieredCache(6, page_size=1, policy=LRU(), load_back="always",
                        tiers=[RemoteTier(blocks_per_host=8, backend=hosts, policy=tier_policy)])
    cache.admit([1, 2, 3]).release()
    cache.admit([5, 6, 7]).release()
    assert cache.evict(6) == 6
    cache.check()
    hosts.kill(0)
    tier_policy.countdown = 1  # the load's own release of [1, 2, 3] passes, the sweep's raises
    with pytest.raises(HookError):
        cache.admit([1, 2, 3])
    tier_policy.countdown = None
    cache.check()


def test_a_crash_whose_borrowed_tier_on_evict_raises_still_forgets_every_lent_page():
    """Cluster.crash: 'the debt is written off, never served from memory that is gone'. Instance
    0's chain [1] * 8 is lent by instances 1 and 2; instance 2 crashes while instance 0's
    borrowed tier's policy raises in on_evict."""
    from ..cluster.test_cluster_ledger import at_instance_0, chain_lent_at_two_creditors
    from ..tiers.test_tiers_payload import KV

    cluster = chain_lent_at_two_creditors(kv_shape=KV)
    policy = cluster.instances[0].borrowed.policy
    real, armed = policy.on_evict, [True]

    def on_evict(node, pages, rank):
        if armed.pop() if armed else False:
            raise HookError("on_evict")
        return real(node, pages, rank)

    policy.on_evict = on_evict
    with pytest.raises(HookError):
        cluster.crash(2)
    assert cluster.manager.debt[:, 2].sum() == 0, "debts to the crashed instance were not written off"
    assert at_instance_0(cluster, [1] * 8, True) == 0, "pages lent by the crashed instance were served"
    cluster.check()


def test_a_reset_whose_tier_on_evict_raises_leaves_the_tiers_recording_and_consistent():
    tier_policy = RaisingLRU()
    cache = TieredCache(4, page_size=1, policy=LRU(), tiers=[HostTier(8, policy=tier_policy)], enable_events=True)
    cache.admit([1, 2, 3]).release()
    assert cache.evict(3) == 3
    tier_policy.fail = "on_evict"
    with pytest.raises(HookError):
        cache.reset()
    tier_policy.fail = ""
    cache.take_events()
    cache.admit([5, 6, 7]).release()
    assert cache.evict(3) == 3  # demoted to the host: a BlockDemoted event
    kinds = [type(e).__name__ for e in cache.take_events()]
    assert "BlockDemoted" in kinds, f"no lower-tier event after the failed reset: {kinds}"
    cache.check()


def test_a_host_pool_that_cannot_be_allocated_leaves_the_tier_free_for_the_corrected_call():
    tier = HostTier(10**9, policy=LRU())
    with pytest.raises(MemoryError):  # 3.7 PiB of payload: refused by the allocator at once
        TieredCache(4, page_size=1, tiers=[tier], kv_shape=(2**20,), dtype="float32")
    cache = TieredCache(4, page_size=1, tiers=[tier])
    cache.admit([1, 2, 3]).release()
    cache.check()


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_a_tier_on_split_raising_leaves_both_parts_queued(write_policy):
    """A load of part of a lower copy splits it (the tier policy's on_split); one that raises
    must still leave both parts in the tier's victim queue (or waiting to be ranked): before,
    neither was queued and the tier's check failed."""
    policy = RaisingLRU()
    cache = TieredCache(6, page_size=1, policy=LRU(), tiers=[HostTier(16, policy=policy)],
                        write_policy=write_policy, load_back="always")
    cache.admit([1, 2, 3, 4, 5, 6]).release()
    cache.admit([7, 8, 9, 10, 11, 12]).release()  # [1..6] leave HBM: one host copy of 6 pages
    cache.check()
    policy.fail = "on_split"
    with pytest.raises(HookError):
        cache.admit([1, 2, 3, 20]).release()  # loads [1, 2, 3]: the host copy splits
    policy.fail = ""
    cache.check()
    for tokens in ([1, 2, 3, 4, 5, 6], [30, 31, 32, 33, 34], [1, 2, 40]):
        cache.admit(tokens).release()
        cache.check()

"""Defects found in review of the fault-handling changes (an insert undone when a hook raises,
observers told of pages leaving whatever the others raise, the pending set of unranked leaves).

Each test states the behaviour radixkv documents and fails on the current code; they are
marked ``xfail(strict=True)`` until fixed, so a fix turns them into an XPASS failure that
asks for the mark to go.
"""

from __future__ import annotations

import pytest

from radixkv import PrefixCache
from radixkv.events import BlockRemoved, BlockStored
from radixkv.events.hashing import BlockHasher
from radixkv.policies import ARC, LRU

from .test_review_r17 import HookError
from .test_review_r17 import RaisingObserver as ArmedObserver  # armed by name: .fail = "stored" / "removed"


def test_an_undone_insert_leaves_no_pages_in_the_policys_books():
    """An ``on_insert`` that succeeded, then an observer refusing the leaf, undoes the insert
    (policies/base: 'the new pages leave the cache again'). The policy took the pages into its
    books (ARC: ``sizes``, which steer its target) and must see them leave as it sees any page
    leave; here it never does, so ARC counts pages the cache does not hold."""
    policy = ARC()
    cache = PrefixCache(8, page_size=1, policy=policy)
    observer = ArmedObserver()
    cache.attach_page_index(observer)
    blocks = cache.allocate(3)
    observer.fail = "stored"
    with pytest.raises(HookError):
        cache.insert([1, 2, 3], blocks)
    observer.fail = ""
    cache.check()
    assert cache.num_cached_blocks == 0
    assert sum(policy.sizes) == cache.num_cached_blocks, f"ARC sizes {policy.sizes} for an empty cache"


class PriorityRaisingLRU(LRU):
    name = "priority-raising-lru"
    fail = False

    def priority(self, node):
        if self.fail:
            raise HookError("priority")
        return super().priority(node)


def test_an_undone_leaf_does_not_stay_in_the_pending_set():
    """The pending set holds evictable leaves waiting to be ranked. A new leaf whose ranking
    raised goes there, then is undone (it leaves the tree); it must leave the set too, or a
    cache that seldom evicts keeps every such dead node (with its token bytes) alive."""
    policy = PriorityRaisingLRU()
    cache = PrefixCache(1000, page_size=1, policy=policy)
    for i in range(20):
        blocks = cache.allocate(4)
        policy.fail = True
        with pytest.raises(HookError):
            cache.insert([1000 * i + j for j in range(4)], blocks)
        policy.fail = False
        cache.free(blocks)
        cache.check()
    dead = [n for n in cache._unranked if not n.alive]
    assert not dead, f"{len(dead)} undone leaves still held by the pending set"


def test_an_undone_insert_emits_no_removal_of_unannounced_pages(monkeypatch):
    """Event consumers pair every BlockRemoved with an earlier BlockStored. If the recorder's
    ``stored`` fails after indexing the pages but before the BlockStored event, the undo tells
    it ``removed`` (it is 'the one that raised') and it emits BlockRemoved for hashes no
    consumer has ever seen."""
    cache = PrefixCache(8, page_size=1, enable_events=True)
    real = BlockHasher.event_hashes
    calls = {"n": 0}

    def once(self, hashes):
        calls["n"] += 1
        if calls["n"] == 1:
            raise HookError("event_hashes")
        return real(self, hashes)

    monkeypatch.setattr(BlockHasher, "event_hashes", once)
    blocks = cache.allocate(3)
    with pytest.raises(HookError):
        cache.insert([1, 2, 3], blocks)
    cache.check()
    events = cache.take_events()
    stored = {h for e in events if isinstance(e, BlockStored) for h in e.block_hashes}
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert all(h in stored for h in removed), f"BlockRemoved of never-stored hashes: {removed}"



def test_a_release_whose_ranking_raises_unlocks_the_whole_path():
    """A leaf whose priority raised while it was ranked waits in the pending set (policies/base).
    When that happens as an admission's release unlocks its path, the unlock must still reach
    the root: else the pages above stay protected with no holder, never evictable again."""
    policy = PriorityRaisingLRU()
    cache = PrefixCache(8, page_size=1, policy=policy)
    cache.admit([1, 2]).release()
    admission = cache.admit([1, 2, 3])  # a leaf [3] below [1, 2]
    policy.fail = True
    with pytest.raises(HookError):
        admission.release()
    policy.fail = False
    assert cache.protected_blocks == 0
    cache.check()
    assert cache.evict(8) == 3  # every page can go



class OnInsertRaisingLRU(LRU):
    name = "on-insert-raising-lru"
    fail = False

    def on_insert(self, node, now):
        if self.fail:
            raise HookError("on_insert")
        super().on_insert(node, now)


def test_a_tier_on_insert_raising_in_a_demotion_leaves_the_spill_tree_consistent():
    """tiers.stack: a tier policy hook raising while pages move down fails the operation and
    drops what it could not place; here the copy is made (ext set) before ``on_insert`` raises,
    so the node is neither dropped nor ranked."""
    from radixkv.tiers import HostTier, TieredCache

    tier_policy = OnInsertRaisingLRU()
    cache = TieredCache(4, page_size=1, policy=LRU(), tiers=[HostTier(4, policy=tier_policy)], load_back="always")
    cache.admit([1, 2, 3, 4]).release()
    cache.check()
    tier_policy.fail = True
    with pytest.raises(HookError):
        cache.admit([5, 6]).release()  # evicts [3, 4] from HBM: their demotion calls on_insert
    tier_policy.fail = False
    cache.check()
    for tokens in ([7, 8, 9, 10], [1, 2, 3, 4], [11, 12, 13, 14]):  # the host tier fills and evicts
        cache.admit(tokens).release()
        cache.check()



class OnEvictRaisingLRU(LRU):
    name = "on-evict-raising-lru"
    fail = False

    def on_evict(self, node, pages, rank):
        if self.fail:
            raise HookError("on_evict")
        super().on_evict(node, pages, rank)


def test_a_tier_on_evict_raising_in_a_load_from_below_leaves_the_spill_tree_consistent():
    from radixkv.tiers import HostTier, TieredCache

    tier_policy = OnEvictRaisingLRU()
    cache = TieredCache(6, page_size=1, policy=LRU(), tiers=[HostTier(4, policy=tier_policy)], load_back="always")
    cache.admit([1, 2, 5, 6]).release()
    cache.admit([1, 2, 3, 7, 8]).release()  # [6] goes down to the host tier
    cache.check()
    tier_policy.fail = True
    with pytest.raises(HookError):
        cache.admit([1, 2, 5, 6])  # loads [6] back: the host copy is released
    tier_policy.fail = False
    cache.check()



def test_a_construction_refused_after_the_tiers_bound_leaves_them_free_for_the_corrected_call():
    """PrefixCache.__init__ gives the policy back when construction fails, so the corrected call
    may use it; the tiers the refused cache bound (TierLayer.bind, Tier.attach) served no page
    either and must be free again too."""
    from radixkv import tenancy
    from radixkv.tiers import HostTier, TieredCache

    rule = tenancy.create("k-anonymous")
    PrefixCache(4, page_size=1, sharing=rule)  # the rule keeps records: it serves this cache only
    tier, policy = HostTier(4, policy=LRU()), LRU()
    with pytest.raises(ValueError):
        TieredCache(4, page_size=1, policy=policy, tiers=[tier], sharing=rule)
    cache = TieredCache(4, page_size=1, policy=policy, tiers=[tier], sharing=rule.fresh())
    cache.admit([1, 2, 3]).release()
    cache.check()


# ---------------------------------------------------------------------------- faults at every hook
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule  # noqa: E402

from radixkv.policies.density import HitDensity  # noqa: E402

# priority and lane are left out: a ranking that raises while a path is unlocked leaves locks behind
# (test_a_release_whose_ranking_raises_unlocks_the_whole_path), which this machine would find first.
HOOKS = ("", "on_insert", "on_access", "on_evict", "choose", "stored", "removed")
SEQS = [[1, 2, 3, 4], [1, 2, 5, 6], [1, 2, 3, 7, 8], [9, 10], [9, 11, 12], [13, 14, 15, 16, 17]]


def _raising(base):
    class Raising(base):
        name = f"raising-{base.name}"
        fail = ""

        def _hook(self, name):
            if self.fail == name:
                raise HookError(name)

        def on_insert(self, node, now):
            self._hook("on_insert")
            super().on_insert(node, now)

        def on_access(self, node, now):
            self._hook("on_access")
            super().on_access(node, now)

        def priority(self, node):
            self._hook("priority")
            return super().priority(node)

        def on_evict(self, node, pages, rank):
            self._hook("on_evict")
            super().on_evict(node, pages, rank)

        def lane(self, node):
            self._hook("lane")
            return super().lane(node)

        def choose(self, heads):
            self._hook("choose")
            return super().choose(heads)

    return Raising


class FaultMachine(RuleBasedStateMachine):
    """Admit, insert, match and evict with a fault armed at one hook for one call; after every
    step check() holds and no page is cached beyond what a call that returned cached (a page
    cached by a call that raised would be served to the next request with no KV written)."""

    @initialize(base=st.sampled_from([LRU, HitDensity, ARC]), events=st.booleans())
    def setup(self, base, events):
        self.policy = _raising(base)()
        self.cache = PrefixCache(6, page_size=1, policy=self.policy, enable_events=events)
        self.observer = ArmedObserver()
        self.cache.attach_page_index(self.observer)
        self.written: set = set()  # token prefixes (tuples) a returning call cached

    def _arm(self, hook):
        self.policy.fail = hook if hook not in ("stored", "removed") else ""
        self.observer.fail = hook if hook in ("stored", "removed") else ""

    def _disarm(self):
        self.policy.fail = self.observer.fail = ""

    @rule(seq=st.sampled_from(SEQS), hook=st.sampled_from(HOOKS), abort=st.booleans())
    def admit(self, seq, hook, abort):
        self._arm(hook)
        try:
            adm = self.cache.admit(seq)
        except HookError:
            return
        finally:
            self._disarm()
        self.cache.check()
        if abort:
            adm.abort()
        else:
            n = adm.hit_tokens + len(adm.new_blocks)
            self.written.update(tuple(seq[:i]) for i in range(1, n + 1))
            adm.release()

    @rule(seq=st.sampled_from(SEQS), hook=st.sampled_from(HOOKS))
    def insert(self, seq, hook):
        blocks = self.cache.allocate(len(seq))
        if blocks is None:
            return
        self._arm(hook)
        try:
            self.cache.insert(seq, blocks)
        except HookError:
            self._disarm()
            self.cache.check()
            self.cache.free(blocks)  # the caller keeps every block it passed
            return
        finally:
            self._disarm()
        self.written.update(tuple(seq[:i]) for i in range(1, len(seq) + 1))

    @rule(n=st.integers(1, 6), hook=st.sampled_from(HOOKS))
    def evict(self, n, hook):
        self._arm(hook)
        try:
            self.cache.evict(n)
        except HookError:
            pass
        finally:
            self._disarm()

    @invariant()
    def consistent(self):
        if not hasattr(self, "cache"):
            return
        self.cache.check()
        for seq in SEQS:
            k = self.cache.cached_pages(seq)
            assert k == 0 or tuple(seq[:k]) in self.written, f"{seq[:k]} cached, never written"


TestFaultMachine = FaultMachine.TestCase


class TieredFaultMachine(FaultMachine):
    """The same with a host tier below (demotions and loads from below), a fault armed at one hook
    of HBM's policy, the tier's policy or the observer; no block is lost (free + cached = all)."""

    @initialize(base=st.sampled_from([LRU, HitDensity]), events=st.booleans())
    def setup(self, base, events):
        from radixkv.tiers import HostTier, TieredCache

        self.policy = _raising(base)()
        self.tier_policy = _raising(base)()
        self.cache = TieredCache(6, page_size=1, policy=self.policy, tiers=[HostTier(4, policy=self.tier_policy)],
                                 load_back="always", enable_events=events)
        self.observer = ArmedObserver()
        self.cache.attach_page_index(self.observer)
        self.written = set()
        self.tier_hook = ""

    # on_insert and on_evict are left out: test_a_tier_on_insert_raising_in_a_demotion_leaves_the_spill_tree_consistent,
    # test_a_tier_on_evict_raising_in_a_load_from_below_leaves_the_spill_tree_consistent
    @rule(hook=st.sampled_from(("", "on_access", "choose")))
    def arm_tier(self, hook):
        self.tier_hook = hook

    def _arm(self, hook):
        super()._arm(hook)
        self.tier_policy.fail = self.tier_hook

    def _disarm(self):
        super()._disarm()
        self.tier_policy.fail = ""

    def evict(self, n, hook):  # noqa: D102 (a tier's faults surface as HookError too)
        super().evict(n, hook)

    @invariant()
    def no_block_lost(self):
        if hasattr(self, "cache"):
            assert self.cache.num_free_blocks + self.cache.num_cached_blocks == 6


TestTieredFaultMachine = TieredFaultMachine.TestCase


def test_a_tier_on_evict_raising_in_a_reset_still_forgets_every_copy():
    """reset forgets every lower copy through the tier policy's on_evict: one that raises must
    not stop it half way (a node left in flight, slots never back); the error comes after."""
    from radixkv.tiers import HostTier, TieredCache

    tier_policy = OnEvictRaisingLRU()
    cache = TieredCache(4, page_size=1, policy=LRU(), tiers=[HostTier(8, policy=tier_policy)],
                        write_policy="write_through")
    cache.admit([1, 2, 3]).release()  # write-through: copies below at the release
    cache.admit([5, 6]).release()
    cache.check()
    assert cache.tier_stats().pages_by_tier["host"] == 5
    tier_policy.fail = True
    with pytest.raises(HookError):
        cache.reset()
    tier_policy.fail = False
    assert cache.tier_stats().pages_by_tier["host"] == 0
    cache.check()
    for tokens in ([1, 2, 3, 4], [7, 8, 9], [1, 2, 5]):
        cache.admit(tokens).release()
        cache.check()


def test_a_policy_on_evict_raising_in_a_reset_still_drops_every_page():
    """PrefixCache.reset drops every cached page; the policy's on_evict raising for one of them
    must not leave the rest cached (or the tree half reset): every page goes, then the error."""
    policy = OnEvictRaisingLRU()
    cache = PrefixCache(8, page_size=1, policy=policy)
    cache.admit([1, 2, 3]).release()
    cache.admit([4, 5]).release()
    policy.fail = True
    with pytest.raises(HookError):
        cache.reset()
    policy.fail = False
    assert cache.num_cached_blocks == 0 and cache.num_free_blocks == 8
    assert cache.match([1, 2, 3]).num_tokens == 0
    cache.check()
    cache.admit([1, 2, 3]).release()
    cache.check()

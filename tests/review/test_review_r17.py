"""Defects found in review of the page-size-1 pool changes (lazy id table, take_after, add_leaf offsets).

Each test states the behaviour radixkv documents and fails on the current code; they are
marked ``xfail(strict=True)`` until fixed, so a fix turns them into an XPASS failure that
asks for the mark to go. The first was a regression of the lazy id table (fixed); the
others fail at bfe6853 too (an exception from a hook inside admit or abort).
"""

from __future__ import annotations

import tracemalloc

import pytest

from radixkv import PrefixCache
from radixkv.errors import InvalidBlocksError
from radixkv.policies import LRU

BIG_POOL = 10**7  # int32 ids: a table of all of them is 40 MB (and np.arange makes another 40 MB)


@pytest.mark.parametrize("call", ["free", "insert"])
def test_refusing_consecutive_never_handed_out_ids_costs_what_the_workload_touched(call):
    """The pool costs what the workload touches, not what ``num_blocks`` could hold (pool docs).

    Three consecutive ids at the top of a 10^7-block pool, none ever handed out, are refused
    (they are free, not held). The run test stops at the id table, which grows no further than
    the state bytes (~1 kB here): the refusal costs ~1 MB, not a 40 MB table of ids (plus 40 MB
    transient, ~0.3 s) that the lazy table built before it was capped.
    """
    cache = PrefixCache(BIG_POOL, page_size=1)
    cache.admit(list(range(100))).release()
    ids = [BIG_POOL - 3, BIG_POOL - 2, BIG_POOL - 1]
    tracemalloc.start()
    try:
        with pytest.raises(InvalidBlocksError):
            if call == "free":
                cache.free(ids)
            else:
                cache.insert([7, 8, 9], ids)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    cache.check()
    assert peak < 8 * 2**20, f"refusing 3 block ids allocated {peak / 2**20:.0f} MiB"


class HookError(RuntimeError):
    pass


class RaisingLRU(LRU):
    """LRU whose hook ``fail`` raises once armed (a policy or observer bug reaching the engine)."""

    name = "raising-lru"
    fail = ""

    def on_insert(self, node, now):
        if self.fail == "on_insert":
            raise HookError("on_insert")
        super().on_insert(node, now)

    def priority(self, node):
        if self.fail == "priority":
            raise HookError("priority")
        return super().priority(node)

    def on_split(self, upper, lower):
        if self.fail == "on_split":
            raise HookError("on_split")
        super().on_split(upper, lower)

    def on_evict(self, node, pages, rank):
        if self.fail == "on_evict":
            raise HookError("on_evict")
        super().on_evict(node, pages, rank)


class RaisingObserver:
    """A page observer (``attach_page_index``) whose ``stored`` or ``removed`` raises once armed."""

    def __init__(self) -> None:
        self.fail = ""

    def stored(self, leaf) -> None:
        if self.fail == "stored":
            raise HookError("stored")

    def removed(self, blocks) -> None:
        if self.fail == "removed":
            raise HookError("removed")

    def cleared(self) -> None:
        pass


def _cache_with_hooks():
    policy = RaisingLRU()
    observer = RaisingObserver()
    cache = PrefixCache(4, page_size=1, policy=policy)
    cache.attach_page_index(observer)
    return cache, policy, observer


@pytest.mark.parametrize("hook", ["on_insert", "stored", "priority"])
def test_a_hook_raising_in_admit_leaves_the_cache_consistent(hook):
    """A tier's spill or a free-block sink that raises leaves the cache consistent (the admission
    never happened); so does a policy hook or page observer raising in the same admission.
    ``priority`` raises when the eviction re-ranks the parent of a removed victim (the parent
    waits to be ranked by the next eviction); ``on_insert`` and ``stored`` raise after the evicted blocks were taken
    for the new leaf, which leaves the cache again (its pages hold no KV), its blocks free."""
    cache, policy, observer = _cache_with_hooks()
    cache.admit([1, 2, 3]).release()
    cache.admit([1, 2]).release()
    policy.fail = hook if hook != "stored" else ""
    observer.fail = "stored" if hook == "stored" else ""
    with pytest.raises(HookError):
        cache.admit([5, 6, 7])  # evicts 3 pages and takes their blocks back
    policy.fail = observer.fail = ""
    cache.check()
    assert cache.protected_blocks == 0
    assert cache.num_free_blocks + cache.evictable_blocks == 4  # every block can still be used


def test_a_leaf_whose_priority_raised_is_ranked_by_the_next_eviction():
    """The parent the eviction could not re-rank waits in the pending set: the next eviction
    ranks it and can take it, so every unprotected page stays evictable."""
    cache, policy, _ = _cache_with_hooks()
    cache.admit([1, 2, 3]).release()
    cache.admit([1, 2]).release()
    policy.fail = "priority"
    with pytest.raises(HookError):
        cache.admit([5, 6, 7])
    policy.fail = ""
    cache.check()
    cache.evict(4)
    cache.check()
    assert cache.num_free_blocks == 4  # the parent left too


@pytest.mark.parametrize("hook", ["on_insert", "stored", "priority"])
def test_a_hook_raising_in_insert_leaves_the_callers_blocks_held_and_caches_nothing(hook):
    """insert's new leaf is undone when the policy or an observer refuses it: the pages are not
    cached (a match would be served blocks holding no KV), the caller still holds every block it
    passed, and the namespace the insert created is dropped again."""
    cache, policy, observer = _cache_with_hooks()
    blocks = cache.allocate(3)
    policy.fail = hook if hook != "stored" else ""
    observer.fail = "stored" if hook == "stored" else ""
    with pytest.raises(HookError):
        cache.insert([5, 6, 7], blocks, namespace="a")
    policy.fail = observer.fail = ""
    cache.check()
    assert cache.match([5, 6, 7], namespace="a").num_tokens == 0
    assert "a" not in set(cache.namespaces())
    cache.free(blocks)  # still the caller's: held, freed once
    cache.check()
    assert cache.num_free_blocks == 4


@pytest.mark.parametrize("hook", ["on_insert", "stored"])
def test_a_failed_admission_serves_none_of_its_pages_later(hook):
    cache, policy, observer = _cache_with_hooks()
    policy.fail = hook if hook != "stored" else ""
    observer.fail = "stored" if hook == "stored" else ""
    with pytest.raises(HookError):
        cache.admit([5, 6, 7])
    policy.fail = observer.fail = ""
    cache.check()
    assert cache.match([5, 6, 7]).num_tokens == 0  # nobody computed their KV
    assert cache.num_free_blocks == 4


@pytest.mark.parametrize("hook", ["on_evict", "removed"])
def test_a_hook_raising_in_abort_loses_no_block(hook):
    cache, policy, observer = _cache_with_hooks()
    admission = cache.admit([1, 2, 3])
    policy.fail = hook if hook == "on_evict" else ""
    observer.fail = "removed" if hook == "removed" else ""
    with pytest.raises(HookError):
        admission.abort()
    policy.fail = observer.fail = ""
    cache.check()
    assert cache.num_free_blocks == 4


@pytest.mark.parametrize("call", ["admit", "evict"])
def test_an_observer_raising_mid_eviction_keeps_the_page_hashes_of_the_pages_it_kept(call):
    """Observers are told in order (the event recorder and its hash index first, then the attached
    page index); when the page index raises, the victim stays cached but the recorder already
    dropped its hashes and emitted its removal."""
    cache = PrefixCache(4, page_size=1, enable_events=True)
    observer = RaisingObserver()
    cache.attach_page_index(observer)
    cache.admit([1, 2, 3]).release()
    observer.fail = "removed"
    with pytest.raises(HookError):
        if call == "admit":
            cache.admit([5, 6, 7])
        else:
            cache.evict(2)
    observer.fail = ""
    cache.check()

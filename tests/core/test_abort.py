"""Admission.abort: a request whose prefill failed leaves no page with unwritten KV in the cache.

The README's embedding example writes the new pages' KV inside ``with cache.admit(...)``; if the
model raises there, the new pages must leave the cache (their blocks hold another prefix's bytes),
the matched pages stay, batch mates' locks stay valid, and no lower tier ever gets a copy.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixkv import PrefixCache
from radixkv.errors import LockError, StaleHandleError
from radixkv.events import BlockRemoved, BlockStored
from radixkv.tiers import HostTier, TieredCache

from ..strategies import cached_pages
from ..tiers.test_tiers_payload import KV, PS, page_value


class ModelFailed(RuntimeError):
    """The model's prefill raised (a CUDA OOM, a cancelled request)."""


def values(tokens, start: int, n: int) -> np.ndarray:
    return np.stack([page_value(tokens, start + j) for j in range(n)])


def serve(cache, tokens, *, fail: bool = False) -> int:
    """The README's embedding loop: read the hit pages (asserting their bytes), then either write the
    new pages or raise inside the with-block before writing them. Returns the hit tokens."""
    with cache.admit(tokens) as adm:
        hit = adm.hit_tokens // PS
        if hit:
            got = cache.read(adm.blocks[:hit])
            for i in range(hit):
                assert np.array_equal(got[i], page_value(tokens, i)), f"page {i} of {tokens} served stale bytes"
        if fail:
            raise ModelFailed("prefill failed")
        if len(adm.new_blocks):
            cache.write(adm.new_blocks, values(tokens, hit, len(adm.new_blocks)))
    return adm.hit_tokens


def test_readme_example_raising_in_the_with_block_uncaches_the_new_pages():
    cache = PrefixCache(num_blocks=4, page_size=PS, kv_shape=KV, dtype="float16")
    serve(cache, [9, 9, 8, 8, 7, 7, 6, 6])             # every block now holds another prefix's KV
    serve(cache, [1, 2, 3, 4])                         # evicts two of them, caches [1, 2, 3, 4]
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    with pytest.raises(ModelFailed):
        serve(cache, prompt, fail=True)                # recycles blocks still holding [9..6]'s KV
    cache.check()
    assert cache.match(prompt).num_tokens == 4         # the matched pages stay cached
    assert serve(cache, prompt) == 4                   # the next admission recomputes the rest ...
    assert serve(cache, prompt) == 8                   # ... and serves its own bytes afterwards
    cache.check()


def test_abort_and_release_end_the_admission_once():
    cache = PrefixCache(num_blocks=8, page_size=2)
    a = cache.admit([1, 2, 3, 4])
    a.abort()
    assert a.released and a.aborted
    a.release()                                        # no-op: the admission is over
    a.abort()                                          # idempotent
    cache.check()
    assert cache.num_free_blocks == 8 and cache.num_cached_blocks == 0
    b = cache.admit([1, 2, 3, 4])
    b.release()
    b.abort()                                          # after release the pages are cached for good
    assert not b.aborted and cache.match([1, 2, 3, 4]).num_tokens == 4
    cache.check()
    with cache.admit([1, 2, 3, 4, 5, 6]) as c:
        c.abort()                                      # explicit abort; leaving the block is then a no-op
    assert cache.match([1, 2, 3, 4, 5, 6]).num_tokens == 4
    cache.check()


def test_abort_of_a_full_hit_keeps_every_page():
    cache = PrefixCache(num_blocks=8, page_size=2)
    cache.admit([1, 2, 3, 4]).release()
    with pytest.raises(ModelFailed):
        with cache.admit([1, 2, 3, 4, 5]):
            raise ModelFailed
    assert cache.match([1, 2, 3, 4]).num_tokens == 4 and cache.protected_blocks == 0
    cache.check()


def test_batch_mate_below_aborted_pages_keeps_its_blocks_until_it_lets_go():
    cache = PrefixCache(num_blocks=8, page_size=2)
    cache.admit([1, 1]).release()
    a = cache.admit([1, 1, 2, 2, 3, 3])               # new pages [2 2] [3 3]
    b = cache.admit([1, 1, 2, 2, 4, 4])               # batch mate: hits [2 2] (unwritten), adds [4 4]
    h = cache.match([1, 1, 2, 2, 3, 3])
    cache.lock(h.node)                                 # a reader's lock on a's deepest page
    free = cache.num_free_blocks
    a.abort()
    cache.check()
    assert cache.match([1, 1, 2, 2, 3, 3]).num_tokens == 2   # nothing below [1 1] is served
    assert cache.match([1, 1, 2, 2, 4, 4]).num_tokens == 2   # b's pages sit on a's: gone too
    assert cache.num_cached_blocks == 1
    # [2 2] (under b and the lock), [3 3] (the lock) and [4 4] (b's) stay out of the pool.
    assert cache.num_free_blocks == free and cache.num_held_blocks == 3
    with pytest.raises(StaleHandleError):
        cache.lock(h.node)                             # no new lock on uncached pages
    b.release()
    cache.check()
    assert cache.num_held_blocks == 2                  # [4 4] went back; [2 2] [3 3] still locked
    cache.unlock(h.node)                               # the reader's lock is given back as usual
    cache.check()
    assert cache.num_held_blocks == 0 and cache.num_free_blocks == 7
    with pytest.raises(StaleHandleError):
        cache.unlock(h.node)                           # its pages are gone now, as after an eviction
    assert cache.admit([1, 1, 2, 2, 3, 3]).hit_tokens == 2
    cache.check()


def test_abort_ends_pins_on_the_aborted_pages():
    cache = PrefixCache(num_blocks=8, page_size=2)
    a = cache.admit([5, 5, 6, 6])
    assert cache.pin([5, 5, 6, 6]) == 4
    a.abort()
    cache.check()
    assert cache.num_free_blocks == 8
    with pytest.raises(LockError):
        cache.unpin([5, 5, 6, 6])


def test_aborted_pages_that_were_reported_stored_are_reported_removed():
    cache = PrefixCache(num_blocks=8, page_size=2, enable_events=True)
    cache.admit([1, 1]).release()
    a = cache.admit([1, 1, 2, 2, 3, 3])
    b = cache.admit([1, 1, 2, 2, 4, 4])
    b.release()
    a.abort()
    cached = set()
    for event in cache.take_events():
        if isinstance(event, BlockStored):
            cached.update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            cached.difference_update(event.block_hashes)
    log = cache.event_log
    assert cached == {int.from_bytes(log.block_hash(b)[-8:], "big") for b in range(8) if log.block_hash(b)}
    assert len(cached) == 1
    cache.check()


@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective", "write_back"])
def test_aborted_pages_never_reach_a_lower_tier(write_policy):
    host = HostTier(16)
    cache = TieredCache(num_blocks=6, page_size=PS, kv_shape=KV, dtype="float16", tiers=[host],
                        write_policy=write_policy, write_through_threshold=1, load_back="always")
    serve(cache, [1, 1])
    a = cache.admit([1, 1, 2, 2, 3, 3])
    before = host.used
    cache.match([1, 1, 2, 2, 3, 3])                    # selective: a hit at the threshold waits for release
    a.abort()
    cache.check()
    assert host.used == before                          # nothing of a was copied, at the hit or the abort
    for _ in range(2):                                  # churn HBM: demotions and loads back
        serve(cache, [7, 7, 7, 7, 7, 7])
        serve(cache, [1, 1, 2, 2, 3, 3])
        cache.check()


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_lower_copies_computed_over_aborted_pages_are_forgotten(write_policy):
    host = HostTier(16)
    cache = TieredCache(num_blocks=4, page_size=PS, kv_shape=KV, dtype="float16", tiers=[host],
                        write_policy=write_policy, load_back="always")
    a = cache.admit([1, 1, 2, 2])
    b = cache.admit([1, 1, 2, 2, 3, 3])                # batch mate, computed over a's pages
    cache.write(b.new_blocks, np.full((1, PS, *KV), -1, dtype=np.float16))  # KV derived from garbage
    b.release()                                        # write-through copies [3 3] down now
    if write_policy == "write_back":
        cache.evict(1)                                 # write-back demotes it
    assert host.used == 1
    a.abort()
    cache.check()
    assert host.used == 0
    serve(cache, [1, 1, 2, 2])                         # a's pages recomputed correctly ...
    assert serve(cache, [1, 1, 2, 2, 3, 3]) == 4       # ... never b's old copy with them
    cache.check()


class AbortMachine(RuleBasedStateMachine):
    """Admissions open together, each released (KV written) or aborted (never written), with
    matches, locks and pins in between: every page a request is served reads back its own bytes,
    unless an open admission has not written it yet; ``check()`` after every step."""

    policy = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.cache = PrefixCache(num_blocks=10, page_size=PS, kv_shape=KV, dtype="float16", enable_events=True,
                                 policy=self.policy)
        self.open = []     # (admission, tokens)
        self.locks = []
        self.stale = {}    # block -> True while an open admission has not written it

    def _trusted(self, tokens, blocks) -> None:
        got = self.cache.read(blocks) if len(blocks) else []
        for i, block in enumerate(blocks.tolist()):
            if not self.stale.get(block):
                assert np.array_equal(got[i], page_value(tokens, i)), f"page {i} of {tokens} is stale"

    @rule(tokens=st.lists(st.integers(0, 2), max_size=10))
    def admit(self, tokens):
        adm = self.cache.admit(tokens)
        self._trusted(tokens, adm.blocks[: adm.hit_tokens // PS])
        for b in adm.new_blocks.tolist():
            self.stale[b] = True
        self.open.append((adm, tokens))

    @precondition(lambda self: self.open)
    @rule(i=st.integers(0, 9), abort=st.booleans())
    def finish(self, i, abort):
        adm, tokens = self.open.pop(i % len(self.open))
        hit = adm.hit_tokens // PS
        if abort:
            adm.abort()
        else:
            if len(adm.new_blocks):
                self.cache.write(adm.new_blocks, values(tokens, hit, len(adm.new_blocks)))
            adm.release()
        for b in adm.new_blocks.tolist():
            self.stale.pop(b, None)

    @rule(tokens=st.lists(st.integers(0, 2), max_size=10))
    def match_and_lock(self, tokens):
        m = self.cache.match(tokens)
        self._trusted(tokens, m.blocks)
        self.cache.lock(m.node)
        self.locks.append(m.node)

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 9))
    def unlock(self, i):
        self.cache.unlock(self.locks.pop(i % len(self.locks)))

    @rule(tokens=st.lists(st.integers(0, 2), max_size=10))
    def pin_unpin(self, tokens):
        if self.cache.pin(tokens):
            self.cache.unpin(tokens)

    @invariant()
    def consistent(self):
        self.cache.check()
        for (ns, prefix), block in cached_pages(self.cache).items():
            if not self.stale.get(block):
                n = len(prefix) // PS
                assert np.array_equal(self.cache.read([block])[0], page_value(list(prefix), n - 1))

    def teardown(self):
        for adm, _ in self.open:
            adm.abort()
        for h in self.locks:
            self.cache.unlock(h)
        self.cache.check()
        assert self.cache.num_free_blocks + self.cache.num_cached_blocks == self.cache.num_blocks


AbortMachine.TestCase.settings = settings(stateful_step_count=30)
test_abort_machine = AbortMachine.TestCase


class AbortMachineWithHistory(AbortMachine):
    """The same under a policy whose hooks walk up to the namespace root (2Q's ghost keys pages by
    namespace): an abort must run them before it cuts the subtree."""

    policy = "2q"


AbortMachineWithHistory.TestCase.settings = settings(stateful_step_count=30, max_examples=30)
test_abort_machine_with_history = AbortMachineWithHistory.TestCase

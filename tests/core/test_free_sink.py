"""PrefixCache's free-block sink (``on_free``): freed blocks go to the caller's allocator, once each.

The state machine holds the caller's side: every block it holds (allocated,
or received from the sink) in ``mine``. A block must reach the sink at most
once while it is the caller's, never be handed out while the caller holds it,
and ``check()`` must hold after every step (sunk blocks count as held).
"""

from __future__ import annotations

from typing import List

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixkv import PrefixCache
from radixkv.errors import ArgumentTypeError
from radixkv.policies import LRU

from radixkv.testing.strategies import token_lists

small_tokens = token_lists(max_size=14)

PAGE = 2


class DeclinesLongRuns(LRU):
    """Admission control: of three or more new pages, the last one is declined."""

    name = "declines-long-runs"

    def admit(self, node_parent, num_pages, *rest):
        return num_pages - 1 if num_pages >= 3 else num_pages


def _cached(cache: PrefixCache) -> List[int]:
    return [int(b) for node in cache.nodes() for b in node.blocks]


class Sink:
    """A caller's allocator: records every sunk block and fails on one it already holds."""

    def __init__(self) -> None:
        self.mine: set = set()
        self.calls: List[List[int]] = []

    def __call__(self, blocks: np.ndarray) -> None:
        got = [int(b) for b in blocks]
        assert len(got) == len(set(got)), f"sink got a block twice in one call: {got}"
        assert not (set(got) & self.mine), f"sink got blocks the caller already holds: {set(got) & self.mine}"
        self.mine.update(got)
        self.calls.append(got)


class FreeSinkMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(4, 12))
    def setup(self, num_blocks):
        self.sink = Sink()
        self.cache = PrefixCache(num_blocks, PAGE, policy=DeclinesLongRuns(), on_free=self.sink)
        self.admissions = []
        self.locks = []

    @property
    def mine(self) -> set:
        return self.sink.mine

    def _take(self, blocks) -> None:
        """The cache handed ``blocks`` out: none may be one the caller holds already."""
        got = [int(b) for b in blocks]
        assert not (set(got) & self.mine), f"handed out twice: {set(got) & self.mine}"
        self.mine.update(got)

    @rule(n=st.integers(0, 4))
    def allocate(self, n):
        blocks = self.cache.allocate(n)
        if blocks is not None:
            self._take(blocks)

    @rule(data=st.data())
    def free(self, data):
        if self.mine:
            blocks = data.draw(st.lists(st.sampled_from(sorted(self.mine)), unique=True, max_size=3))
            self.cache.free(blocks)
            self.mine.difference_update(blocks)

    @rule(tokens=small_tokens, data=st.data())
    def insert(self, tokens, data):
        need = len(tokens) // PAGE
        if need > len(self.mine):
            return
        blocks = data.draw(st.permutations(sorted(self.mine)))[:need]
        self.mine.difference_update(blocks)
        self.cache.insert(tokens, blocks)
        cached = set(_cached(self.cache))
        lost = [b for b in blocks if b not in cached and b not in self.mine]
        assert not lost, f"insert kept neither cached nor sunk: {lost}"

    @rule(tokens=small_tokens)
    def admit(self, tokens):
        a = self.cache.admit(tokens)  # may reuse blocks it evicts: those are not the caller's
        new = [int(b) for b in a.new_blocks]
        assert not (set(new) & self.mine), f"admit handed out blocks the caller holds: {new}"
        self.admissions.append(a)

    @precondition(lambda self: self.admissions)
    @rule(data=st.data(), abort=st.booleans())
    def end_admission(self, data, abort):
        a = self.admissions.pop(data.draw(st.integers(0, len(self.admissions) - 1)))
        a.abort() if abort else a.release()

    @rule(tokens=small_tokens)
    def lock(self, tokens):
        m = self.cache.match(tokens)
        self.cache.lock(m.node)
        self.locks.append(m.node)

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        self.cache.unlock(self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1))))

    @rule(n=st.integers(0, 5))
    def evict(self, n):
        cached, calls, free = self.cache.num_cached_blocks, len(self.sink.calls), self.cache.num_free_blocks
        freed = self.cache.evict(n)
        assert self.cache.num_cached_blocks == cached - freed and self.cache.num_free_blocks == free
        assert len(self.sink.calls) == calls + (freed > 0) and (not freed or len(self.sink.calls[-1]) == freed)

    @precondition(lambda self: not self.admissions and not self.locks)
    @rule()
    def reset(self):
        cached = set(_cached(self.cache))
        self.cache.reset()
        assert cached <= self.mine, "reset kept blocks that are neither cached nor sunk"

    @invariant()
    def accounted(self):
        cache = self.cache
        cache.check()
        cached = _cached(cache)
        assert not (set(cached) & self.mine), "a block is both cached and the caller's"
        detached = cache.num_held_blocks - len(self.mine)  # aborted pages another holder still protects
        assert detached >= 0, f"the caller holds {len(self.mine)} blocks, the pool counts {cache.num_held_blocks} held"
        assert cache.num_free_blocks + len(self.mine) + len(cached) + detached == cache.num_blocks
        if not self.admissions and not self.locks:
            assert detached == 0, f"{detached} blocks neither free, cached nor the caller's"

    def teardown(self):
        for a in self.admissions:
            a.release()
        for handle in self.locks:
            self.cache.unlock(handle)
        if hasattr(self, "cache"):
            self.cache.check()
            assert self.cache.num_free_blocks + len(self.mine) + self.cache.num_cached_blocks == self.cache.num_blocks


TestFreeSink = FreeSinkMachine.TestCase
TestFreeSink.settings = settings(stateful_step_count=30, deadline=None)


def _filled(num_blocks: int = 6, **kwargs):
    sink = Sink()
    cache = PrefixCache(num_blocks, PAGE, on_free=sink, **kwargs)
    return cache, sink


def test_evicted_blocks_go_to_the_sink_not_the_free_list():
    cache, sink = _filled()
    a = cache.admit([1, 1, 2, 2, 3, 3])
    a.release()
    free = cache.num_free_blocks
    assert cache.evict(2) == 2
    assert len(sink.calls) == 1 and sorted(sink.calls[0]) == sorted(a.blocks[1:].tolist())
    assert cache.num_free_blocks == free and cache.num_held_blocks == 2
    cache.check()
    cache.free(sink.calls[0])  # the owner may give them to the pool after all
    assert cache.num_free_blocks == free + 2 and len(sink.calls) == 1
    cache.check()


def test_insert_sinks_its_duplicates_then_its_declined_pages_in_one_call():
    sink = Sink()
    cache = PrefixCache(12, PAGE, policy=DeclinesLongRuns(), on_free=sink)
    first = cache.allocate(2)
    cache.insert([1, 1, 2, 2], first)
    again = cache.allocate(5)
    assert cache.insert([1, 1, 2, 2, 3, 3, 4, 4, 5, 5], again) == 2
    assert sink.calls == [[int(again[0]), int(again[1]), int(again[4])]]
    assert cache.num_cached_blocks == 4
    cache.check()


def test_aborted_pages_reach_the_sink_when_their_last_holder_lets_go():
    cache, sink = _filled()
    a = cache.admit([4, 4, 5, 5])
    held = cache.match([4, 4, 5, 5]).node
    cache.lock(held)
    a.abort()
    assert sink.calls == [] and cache.num_held_blocks == 2
    cache.check()
    cache.unlock(held)
    assert sorted(sink.calls[0]) == sorted(a.new_blocks.tolist())
    cache.check()
    b = cache.admit([6, 6])
    b.abort()
    assert sink.calls[-1] == b.new_blocks.tolist()
    cache.check()


def test_reset_sinks_every_cached_block_and_free_returns_to_the_pool():
    cache, sink = _filled()
    cache.admit([1, 1, 2, 2]).release()
    cache.admit([1, 1, 3, 3]).release()
    held = cache.allocate(1)
    cache.free(held)
    assert sink.calls == []
    cached = sorted(_cached(cache))
    cache.reset()
    assert [sorted(c) for c in sink.calls] == [cached]
    assert cache.num_cached_blocks == 0 and cache.num_held_blocks == 3
    cache.check()


def test_allocate_and_admit_reuse_what_they_evict_without_sinking_it():
    cache, sink = _filled(4)
    cache.admit([1, 1, 2, 2, 3, 3, 4, 4]).release()
    assert cache.num_free_blocks == 0
    got = cache.allocate(2)
    assert got is not None and len(got) == 2 and sink.calls == []
    a = cache.admit([9, 9, 8, 8])
    assert len(a.new_blocks) == 2 and not set(a.new_blocks.tolist()) & set(got.tolist()) and sink.calls == []
    a.release()
    cache.check()
    assert cache.num_held_blocks == 2 and cache.num_cached_blocks == 2


def test_on_free_must_be_callable_or_none():
    with pytest.raises(ArgumentTypeError, match="on_free"):
        PrefixCache(4, PAGE, on_free=3)
    cache, sink = _filled()
    with pytest.raises(ArgumentTypeError, match="on_free"):
        cache.on_free = "allocator"
    assert cache.on_free is sink
    cache.on_free = None
    cache.admit([1, 1]).release()
    assert cache.evict(1) == 1 and sink.calls == [] and cache.num_free_blocks == 6
    cache.check()


def test_a_tiered_cache_demotes_then_sinks_and_loads_back_into_its_own_free_blocks():
    from radixkv.tiers import HostTier, TieredCache

    sink = Sink()
    cache = TieredCache(4, PAGE, tiers=[HostTier(8)], load_back="always")
    cache.on_free = sink
    cache.admit([1, 1, 2, 2]).release()
    cache.admit([3, 3, 4, 4]).release()
    assert cache.evict(2) == 2
    assert len(sink.calls) == 1 and len(sink.calls[0]) == 2
    cache.check()
    cache.free(sink.calls[0])  # the owner lends them back: the demoted pages load into them
    a = cache.admit([1, 1, 2, 2])
    assert a.hit_tokens == 4
    a.release()
    cache.check()
    assert cache.num_cached_blocks == 4 and len(sink.calls) == 1

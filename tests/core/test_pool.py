"""The block pool moves runs of ids and grows lazily: same ids as a plain LIFO free list, exact recount, checks on.

The model is the free list radixkv had before runs: a Python list used as a
stack (``take`` pops from the top, ``give_back`` pushes in order). The pool
must hand out exactly the ids the model does, keep per-block states equal to
the model's, and :meth:`BlockPool.check` must pass after every step.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.errors import InvalidBlocksError
from radixkv.pool import CACHED, FREE, HELD, BlockPool

NUM_BLOCKS = 3000  # large enough for multi-run splits (1024+ ids), fragmented segments and table growth
ALL_IDS = np.arange(NUM_BLOCKS, dtype=np.int32)


class ListPool:
    """The reference: a free stack of single ids and a state per id."""

    def __init__(self, n: int) -> None:
        self.free = list(range(n - 1, -1, -1))
        self.state = [FREE] * n

    def take(self, n: int, state: int) -> list:
        out = [self.free.pop() for _ in range(n)]
        for b in out:
            self.state[b] = state
        return out

    def give_back(self, blocks) -> None:
        for b in blocks:
            assert self.state[b] != FREE
            self.state[b] = FREE
            self.free.append(b)


def _order(owned: list, how: str, rng: np.random.Generator) -> list:
    """Some of ``owned`` in an order that forms runs (as evicted tails do) or none."""
    if how == "tail":
        k = int(rng.integers(1, len(owned) + 1))
        return owned[-k:]
    if how == "sorted":
        return sorted(owned)
    if how == "reversed":
        return sorted(owned, reverse=True)
    picked = list(rng.permutation(owned)[: int(rng.integers(1, len(owned) + 1))])
    return [int(b) for b in picked]


@settings(deadline=None)
@given(seed=st.integers(0, 2**32 - 1),
       steps=st.lists(st.tuples(st.sampled_from(["take", "give", "parts", "state"]),
                                st.integers(0, NUM_BLOCKS),
                                st.sampled_from(["tail", "sorted", "reversed", "shuffled"])),
                      min_size=1, max_size=25))
def test_pool_matches_lifo_list(seed, steps):
    rng = np.random.default_rng(seed)
    pool, model = BlockPool(NUM_BLOCKS, 1), ListPool(NUM_BLOCKS)
    owned: list = []  # blocks not free, in the order they were handed out
    for op, size, how in steps:
        if op == "take":
            n = min(size, pool.num_free)
            state = HELD if size % 2 else CACHED
            got = pool.take(n, state)
            assert got.dtype == np.int32 and got.flags.writeable
            assert got.tolist() == model.take(n, state)
            owned.extend(got.tolist())
        elif owned and op in ("give", "parts"):
            blocks = _order(owned, how, rng)
            chosen = set(blocks)
            owned = [b for b in owned if b not in chosen]
            arr = np.asarray(blocks, dtype=np.int32)
            if op == "give":
                pool.give_back(arr)
            else:  # cut into a few parts, as _evict passes the tails of several leaves
                cuts = sorted(set(rng.integers(0, len(arr) + 1, size=3).tolist()))
                pool.give_back_parts(np.split(arr, cuts))
            model.give_back(blocks)
        elif owned and op == "state":
            blocks = _order(owned, how, rng)
            new = HELD if size % 2 else CACHED
            pool.set_state(np.asarray(blocks, dtype=np.int32), new)
            for b in blocks:
                model.state[b] = new
        assert pool.num_free == len(model.free)
        np.testing.assert_array_equal(pool.states(ALL_IDS), np.asarray(model.state, dtype=np.uint8))
        assert pool.high_water == NUM_BLOCKS - sum(1 for b in model.free if b >= pool.high_water)
        probe = np.asarray(owned[: size % 2000], dtype=np.int32)
        np.testing.assert_array_equal(pool.states(probe), [model.state[b] for b in probe.tolist()])
        pool.check()
    # what is left comes out in the model's order
    assert pool.take(pool.num_free).tolist() == model.take(len(model.free), HELD)
    pool.check()


def test_contiguous_moves_stay_runs():
    """A million blocks taken and given back as one run are one stack entry, not a million ids."""
    pool = BlockPool(10**6, 1)
    blocks = pool.take(10**6, CACHED)
    assert pool.high_water == 10**6
    assert pool.num_free_runs == 0
    pool.give_back_parts([blocks[500_000:], blocks[:500_000]])
    assert pool.num_free == 10**6 and pool.num_free_runs == 2
    again = pool.take(10**6)
    assert pool.num_free_runs == 0 and again[0] == 499_999 and again[-1] == 500_000
    pool.give_back(again[::-1])
    assert pool.num_free_runs == 2
    pool.check()


def test_page1_replay_keeps_the_free_stack_short():
    """At page size 1 a request moves ~10^3..10^4 ids; the free stack holds runs, not ids."""
    rng = np.random.default_rng(3)
    cache = PrefixCache(num_blocks=20_000, page_size=1)
    prompts = [rng.integers(0, 1000, size=int(rng.integers(2000, 6000)), dtype=np.uint32) for _ in range(12)]
    runs = []
    for i in range(60):
        base = prompts[int(rng.integers(len(prompts)))]
        tail = rng.integers(0, 2**31, size=int(rng.integers(1000, 5000)), dtype=np.uint32)
        cache.admit(np.concatenate([base[: int(rng.integers(len(base)))], tail])).release()
        cache.check()
        runs.append(cache._pool.num_free_runs)
    assert cache.evicted_blocks > 20_000  # the pool turned over
    assert max(runs) <= 64, runs


def test_check_catches_a_double_listed_block():
    pool = BlockPool(100, 1)
    pool.take(10)
    pool.give_back(np.array([7], dtype=np.int32))
    pool._stack.append((7, 7))  # block 7 listed twice
    pool._num_free += 1
    with pytest.raises(AssertionError, match="duplicates"):
        pool.check()


def test_check_catches_a_state_the_free_list_disagrees_with():
    pool = BlockPool(100, 1)
    pool.give_back(pool.take(60)[40:])
    pool._state[50] = CACHED  # on the free list but marked cached
    with pytest.raises(AssertionError, match="disagree"):
        pool.check()
    pool = BlockPool(100, 1)
    pool.take(10)
    pool._state[5] = FREE  # handed out but marked free
    with pytest.raises(AssertionError, match="disagree"):
        pool.check()


def test_take_more_than_free_raises_and_changes_nothing():
    pool = BlockPool(10, 1)
    pool.take(8)
    with pytest.raises(ValueError):
        pool.take(3)
    assert pool.num_free == 2
    pool.check()


@pytest.mark.parametrize("shape", ["run", "reversed run", "fragmented"])
def test_free_catches_double_free_and_blocks_not_held(shape):
    """PrefixCache.free raises (cache unchanged) on a block freed twice, cached, or never allocated."""
    cache = PrefixCache(num_blocks=4096, page_size=1)
    held = cache.allocate(2048)
    if shape == "reversed run":
        held = held[::-1].copy()
    elif shape == "fragmented":
        held = np.random.default_rng(0).permutation(held).astype(np.int32)
    first, second = held[:1024], held[1024:]
    cache.free(first)
    cache.check()
    before = (cache.num_free_blocks, cache.num_held_blocks, cache._pool._state.copy())
    with pytest.raises(InvalidBlocksError, match="is free"):
        cache.free(first)  # double free
    with pytest.raises(InvalidBlocksError, match="is free"):
        cache.free(np.concatenate([second, first[:1]]))  # one of them free
    adm = cache.admit(np.arange(600, dtype=np.uint32))
    with pytest.raises(InvalidBlocksError, match="is cached"):
        cache.free(adm.new_blocks)  # owned by the tree, not the caller
    adm.release()
    assert cache.num_held_blocks == before[1]
    cache.check()
    cache.free(second)
    assert cache.num_held_blocks == 0
    cache.check()


def test_validate_ids_still_finds_duplicates_and_range_errors():
    pool = BlockPool(5000, 1)
    assert pool.validate_ids(np.arange(100, 2100)).tolist() == list(range(100, 2100))
    assert pool.validate_ids(np.arange(2100, 100, -1)).tolist() == list(range(2100, 100, -1))
    looks_like_a_run = np.arange(0, 1000)
    looks_like_a_run[500] = 3  # same first, last and length as a run
    with pytest.raises(InvalidBlocksError, match="duplicate"):
        pool.validate_ids(looks_like_a_run)
    with pytest.raises(InvalidBlocksError, match="must be in"):
        pool.validate_ids(np.arange(4000, 5001))
    beyond = np.arange(1500, 2600)  # a run above the high-water mark and the state bytes' length
    beyond[700] = 1600
    with pytest.raises(InvalidBlocksError, match="duplicate"):
        pool.validate_ids(beyond)
    assert pool.validate_ids(np.arange(1500, 2600)).tolist() == list(range(1500, 2600))
    assert pool.high_water == 0 and pool.states(np.arange(1500, 2600)).tolist() == [FREE] * 1100


def test_a_huge_pool_stays_lazy_while_moving_runs():
    """A 2**31 - 1 block pool: the never-used tail is one implicit run, state bytes follow the high-water mark."""
    tracemalloc.start()
    try:
        pool = BlockPool(2**31 - 1, 1)
        first = pool.take(5000, CACHED)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, f"5000 blocks of a 2**31 - 1 block pool peaked at {peak} bytes"
    assert first.tolist() == list(range(5000)) and pool.high_water == 5000
    pool.give_back(first[1000:])  # one run: one stack entry
    assert pool.num_free_runs == 1 and pool.num_free == 2**31 - 1 - 1000
    again = pool.take(6000)  # the returned run (last freed first), then fresh ids in order
    assert again[:4000].tolist() == list(range(4999, 999, -1)) and again[4000:].tolist() == list(range(5000, 7000))
    assert pool.high_water == 7000 and pool.num_free_runs == 0
    assert pool.states(np.array([0, 6999, 7000, 2**31 - 2])).tolist() == [CACHED, HELD, FREE, FREE]
    assert pool.count(FREE) == pool.num_free
    pool.check()


def test_check_catches_a_listed_block_above_the_high_water_mark():
    pool = BlockPool(100, 1)
    pool.take(10)
    pool._stack.append((20, 20))  # never handed out, so also counted as fresh
    pool._num_free += 1
    with pytest.raises(AssertionError, match="never handed out"):
        pool.check()


def test_evict_to_a_sink_hands_over_exactly_the_evicted_runs():
    """evict() with on_free takes back the top of the free stack: the blocks it just evicted, page 1."""
    got = []
    cache = PrefixCache(num_blocks=4096, page_size=1, on_free=lambda b: got.append(b.copy()))
    for i in range(3):
        cache.admit(np.arange(i * 10**6, i * 10**6 + 1200, dtype=np.uint32)).release()
    cached = {int(b) for node in cache.nodes() for b in node.blocks}
    free_before = cache.num_free_blocks
    assert cache.evict(2000) == 2000
    assert len(got) == 1 and len(got[0]) == 2000 and len(set(got[0].tolist())) == 2000
    assert set(got[0].tolist()) <= cached and cache.num_free_blocks == free_before
    assert cache.num_held_blocks == 2000
    cache.check()

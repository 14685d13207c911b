"""Block ids kept as extents (runs and int32 segments): same ids as arrays, exact recount, checks on.

:mod:`radixkv.extents` is checked against plain id arrays; the pool's
``take_parts`` / ``give_back_parts`` against the plain LIFO list of
tests/core/test_pool.py; and a page-1 cache, whose nodes hold runs, with
``check()`` after every step, plus the always-on ownership checks (double free,
a free of a block not held) and ``check()`` catching runs that overlap.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import PrefixCache, extents
from radixkv.errors import InvalidBlocksError
from radixkv.pool import CACHED, HELD, BlockPool

from .test_pool import ALL_IDS, NUM_BLOCKS, ListPool, _order

part_strategy = st.one_of(
    st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)),
    st.lists(st.integers(0, 10_000), min_size=1, max_size=20).map(lambda v: np.asarray(v, dtype=np.int32)),
)


def as_parts(blocks: list) -> extents.Parts:
    """``blocks`` cut into maximal runs (as tuples) with single ids gathered into array segments."""
    parts, i = [], 0
    loose: list = []
    while i < len(blocks):
        j = i
        while j + 1 < len(blocks) and abs(blocks[j + 1] - blocks[j]) == 1 and (
                j == i or blocks[j + 1] - blocks[j] == blocks[j] - blocks[j - 1]):
            j += 1
        if j > i:
            if loose:
                parts.append(np.asarray(loose, dtype=np.int32))
                loose = []
            parts.append((blocks[i], blocks[j]))
        else:
            loose.append(blocks[i])
        i = j + 1
    if loose:
        parts.append(np.asarray(loose, dtype=np.int32))
    return tuple(parts)


@given(parts=st.lists(part_strategy, max_size=6).map(tuple), data=st.data())
def test_extents_cut_and_expand_like_an_array(parts, data):
    ids = np.concatenate([extents.run_ids(*p) if p.__class__ is tuple else p for p in parts]) if parts else (
        np.empty(0, np.int32))
    extents.check(parts)
    assert extents.size(parts) == len(ids)
    got = extents.to_array(parts)
    assert got.dtype == np.int32 and got.flags.writeable and got.tolist() == ids.tolist()
    listed = extents.id_list(parts)
    assert listed == ids.tolist() and all(type(i) is int for i in listed)
    k = data.draw(st.integers(0, len(ids)))
    head, tail = extents.cut(parts, k)
    assert extents.to_array(head).tolist() == ids[:k].tolist()
    assert extents.to_array(tail).tolist() == ids[k:].tolist()
    keep, removed = extents.cut_tail(parts, k)
    assert extents.to_array(keep).tolist() == ids[: len(ids) - k].tolist()
    assert extents.to_array(removed).tolist() == ids[len(ids) - k :].tolist()
    for piece in (head, tail, keep, removed):
        extents.check(piece)
        assert all(extents.part_size(p) > 0 for p in piece)
    assert extents.to_array(extents.join([head, tail])).tolist() == ids.tolist()
    if len(ids):
        assert extents.last_id(parts) == int(ids[-1])
    got[:] = -1  # a new array: writing it changes no part
    assert extents.to_array(parts).tolist() == ids.tolist()


def test_extents_check_names_a_bad_part():
    with pytest.raises(AssertionError, match="bad run"):
        extents.check(((1, 2, 3),))
    with pytest.raises(AssertionError, match="bad id segment"):
        extents.check((np.empty(0, np.int32),))


@settings(deadline=None)
@given(seed=st.integers(0, 2**32 - 1),
       steps=st.lists(st.tuples(st.sampled_from(["take", "give"]), st.integers(0, NUM_BLOCKS),
                                st.sampled_from(["tail", "sorted", "reversed", "shuffled"])),
                      min_size=1, max_size=25))
def test_take_parts_and_runs_given_back_match_the_lifo_list(seed, steps):
    """Runs handed out and taken back as extents: exactly the ids and states of a plain LIFO list."""
    rng = np.random.default_rng(seed)
    pool, model = BlockPool(NUM_BLOCKS, 1), ListPool(NUM_BLOCKS)
    owned: list = []
    for op, size, how in steps:
        if op == "take":
            n = min(size, pool.num_free)
            state = HELD if size % 2 else CACHED
            parts = pool.take_parts(n, state)
            extents.check(parts)
            assert extents.to_array(parts).tolist() == model.take(n, state)
            owned.extend(extents.to_array(parts).tolist())
        elif owned:
            blocks = _order(owned, how, rng)
            chosen = set(blocks)
            owned = [b for b in owned if b not in chosen]
            pool.give_back_parts(as_parts(blocks))
            model.give_back(blocks)
        assert pool.num_free == len(model.free)
        np.testing.assert_array_equal(pool.states(ALL_IDS), np.asarray(model.state, dtype=np.uint8))
        pool.check()
    assert extents.to_array(pool.take_parts(pool.num_free)).tolist() == model.take(len(model.free), HELD)
    pool.check()


@settings(deadline=None)
@given(seed=st.integers(0, 2**32 - 1),
       steps=st.lists(st.tuples(st.sampled_from(["take", "give", "take_after"]), st.integers(0, NUM_BLOCKS),
                                st.sampled_from(["tail", "sorted", "reversed", "shuffled"]), st.integers(0, 40)),
                      min_size=1, max_size=25))
def test_take_after_is_give_back_then_take(seed, steps):
    """take_after(returned, n): the ids, states and free list of give_back_parts then take_parts,
    checked against the plain LIFO list, whether ``returned`` holds only runs or id arrays too."""
    rng = np.random.default_rng(seed)
    pool, model = BlockPool(NUM_BLOCKS, 1), ListPool(NUM_BLOCKS)
    owned: list = []  # cached blocks (the only ones take_after takes back)
    for op, size, how, extra in steps:
        if op == "take" or not owned:
            n = min(size, pool.num_free)
            parts = pool.take_parts(n, CACHED)
            assert extents.to_array(parts).tolist() == model.take(n, CACHED)
            owned.extend(extents.to_array(parts).tolist())
            continue
        blocks = _order(owned, how, rng)[: max(1, size % (len(owned) + 1))]
        chosen = set(blocks)
        owned = [b for b in owned if b not in chosen]
        returned = []  # maximal runs cut at random points, as tails of several leaves come back
        for part in as_parts(blocks):
            if part.__class__ is tuple:
                head, tail = extents.cut((part,), int(rng.integers(0, extents.part_size(part))))
                returned.extend(head + tail)
            else:
                returned.append(part)
        if op == "give":
            pool.give_back_parts(returned)
            model.give_back(blocks)
        else:
            n = len(blocks) + min(extra, pool.num_free)
            state = HELD if extra % 2 else CACHED
            parts = pool.take_after(returned, n, state)
            extents.check(parts)
            model.give_back(blocks)
            got = extents.to_array(parts).tolist()
            assert got == model.take(n, state)
            if state == CACHED:
                owned.extend(got)
        assert pool.num_free == len(model.free)
        np.testing.assert_array_equal(pool.states(ALL_IDS), np.asarray(model.state, dtype=np.uint8))
        pool.check()
    assert extents.to_array(pool.take_parts(pool.num_free)).tolist() == model.take(len(model.free), HELD)


def test_take_after_more_than_free_leaves_the_returned_blocks_on_the_free_list():
    pool = BlockPool(100, 1)
    held = pool.take_parts(100, CACHED)
    with pytest.raises(ValueError, match="only 10 blocks free"):
        pool.take_after(extents.cut_tail(held, 10)[1], 11)
    assert pool.num_free == 10
    pool.check()
    assert extents.to_array(pool.take_parts(10)).tolist() == list(range(99, 89, -1))


def test_runs_move_without_id_arrays():
    """A page-1 request's blocks are a run in its node and go back to the free list as one."""
    pool = BlockPool(10**6, 1)
    parts = pool.take_parts(600_000, CACHED)
    assert parts == ((0, 599_999),)
    keep, removed = extents.cut_tail(parts, 400_000)
    assert keep == ((0, 199_999),) and removed == ((200_000, 599_999),)
    pool.give_back_parts(removed)
    assert pool.num_free_runs == 1 and pool.num_free == 800_000
    assert pool.take_parts(3, HELD) == ((599_999, 599_997),)  # most recently freed first
    pool.check()


def _page1_cache() -> PrefixCache:
    return PrefixCache(num_blocks=12_000, page_size=1)


def test_page1_nodes_hold_runs_and_check_recounts_them():
    rng = np.random.default_rng(7)
    cache = _page1_cache()
    base = rng.integers(0, 1000, size=5000, dtype=np.uint32)
    held = []
    for i in range(40):
        tail = rng.integers(0, 2**31, size=int(rng.integers(500, 5000)), dtype=np.uint32)
        tokens = np.concatenate([base[: int(rng.integers(len(base)))], tail])
        adm = cache.admit(tokens)
        cache.check()
        assert adm.blocks.tolist() == cache.peek_match(tokens).blocks.tolist()
        assert adm.blocks[len(adm.blocks) - len(adm.new_blocks):].tolist() == adm.new_blocks.tolist()
        if i % 5 == 4:
            adm.abort()
        else:
            adm.release()
        cache.check()
        if i % 7 == 0:
            got = cache.allocate(int(rng.integers(1, 3000)))
            if got is not None:
                held.append(got)
            cache.check()
        if held and i % 3 == 0:
            cache.free(held.pop())
            cache.check()
        if i % 11 == 0:
            cache.evict(int(rng.integers(1, 4000)))
            cache.check()
    assert cache.evicted_blocks > 12_000
    # a take spanning many short runs comes back as one array: parts stay few per id
    nodes = list(cache.nodes())
    assert sum(len(node.parts) for node in nodes) <= 17 * len(nodes) + cache.num_cached_blocks // 128
    assert any(p.__class__ is tuple and extents.part_size(p) > 1 for node in cache.nodes() for p in node.parts)


def test_double_free_and_foreign_blocks_are_refused_and_change_nothing():
    cache = _page1_cache()
    adm = cache.admit(np.arange(5000, dtype=np.uint32))
    adm.release()
    got = cache.allocate(3000)
    cache.free(got)
    before = (cache.num_free_blocks, cache.num_held_blocks, cache.num_cached_blocks)
    with pytest.raises(InvalidBlocksError, match="is free"):
        cache.free(got)  # double free
    with pytest.raises(InvalidBlocksError, match="is cached"):
        cache.free(adm.new_blocks[:2500])  # the tree's blocks: not the caller's
    with pytest.raises(InvalidBlocksError, match="is free"):
        cache.free([11_999])  # never handed out
    assert (cache.num_free_blocks, cache.num_held_blocks, cache.num_cached_blocks) == before
    cache.check()


def test_check_catches_runs_owned_twice():
    cache = _page1_cache()
    cache.admit(np.arange(3000, dtype=np.uint32)).release()
    cache.admit(np.arange(100_000, 103_000, dtype=np.uint32)).release()
    cache.check()
    a, b = list(cache.nodes())[:2]
    a.parts, saved = b.parts, a.parts  # two nodes claim the same run
    with pytest.raises(AssertionError, match="owned twice"):
        cache.check()
    a.parts = saved
    cache.check()
    a.parts = extents.cut_tail(a.parts, 1)[0]  # a node's runs shorter than its pages
    with pytest.raises(AssertionError, match="has 2999 blocks"):
        cache.check()


def test_a_take_over_many_short_runs_comes_back_as_one_array():
    pool = BlockPool(10_000, 1)
    pool.take_parts(10_000, CACHED)
    pool.give_back_parts([(i, i) for i in range(0, 40, 2)])  # 20 runs of one id: 20 stack entries
    assert pool.num_free_runs == 20
    parts = pool.take_parts(20, HELD)
    assert len(parts) == 1 and parts[0].__class__ is not tuple
    assert parts[0].tolist() == list(range(38, -1, -2))
    pool.give_back_parts([(i, i + 199) for i in range(1000, 9000, 400)])  # 20 runs of 200 ids: kept as runs
    parts = pool.take_parts(4000, CACHED)
    assert len(parts) == 20 and all(p.__class__ is tuple for p in parts) and parts[0] == (8799, 8600)
    pool.check()

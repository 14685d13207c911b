"""A node keeps its pages' bytes as a view of the request's key where that is cheap, never more.

The tree shares a new leaf's bytes with the key the request was made into
(:func:`radixkv.tree.share`) instead of copying them; a node that shrinks (a
split, a tail eviction) copies what it keeps once a view would keep more than
twice its bytes alive. These tests pin that bound, and that nothing a caller
holds is ever viewed: changing the caller's token array after a call changes
nothing cached.
"""
from __future__ import annotations

from array import array

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.tree import share


def leaves(cache):
    return [n for n in cache.nodes() if n.children is None and n.parent is not None]


def test_a_new_leaf_views_the_request_key():
    cache = PrefixCache(num_blocks=100, page_size=1)
    cache.admit(np.arange(100, dtype=np.uint32)).release()
    (leaf,) = leaves(cache)
    assert leaf.rest.__class__ is memoryview and leaf.rest.obj.__class__ is bytes
    assert leaf.key == np.arange(100, dtype=np.uint32).tobytes()
    cache.check()


def test_a_leaf_evicted_below_half_its_key_copies_what_it_keeps():
    cache = PrefixCache(num_blocks=100, page_size=1)
    cache.admit(np.arange(100, dtype=np.uint32)).release()
    cache.admit(np.arange(1000, 1060, dtype=np.uint32)).release()  # evicts 60 tail pages of the first
    first = [n for n in leaves(cache) if n.first == np.uint32(0).tobytes()]
    assert len(first) == 1 and first[0].num_pages == 40
    assert first[0].rest.__class__ is bytes and len(first[0].rest) == 39 * 4
    assert cache.match(np.arange(100, dtype=np.uint32)).num_tokens == 40
    cache.check()


def test_a_split_copies_the_small_side_and_views_the_large_one():
    cache = PrefixCache(num_blocks=200, page_size=1)
    cache.admit(np.arange(100, dtype=np.uint32)).release()
    cache.admit(np.concatenate([np.arange(10), np.arange(500, 520)]).astype(np.uint32)).release()
    by_first = {int(np.frombuffer(n.first, np.uint32)[0]): n for n in cache.nodes() if n.parent is not None}
    upper, lower = by_first[0], by_first[10]
    assert upper.num_pages == 10 and upper.rest.__class__ is bytes  # 9 pages of a 100-page key
    assert lower.num_pages == 90 and lower.rest.__class__ is memoryview
    cache.check()


@pytest.mark.parametrize("form", ["ndarray", "array_q", "list"])
def test_changing_the_callers_tokens_afterwards_changes_nothing_cached(form):
    cache = PrefixCache(num_blocks=64, page_size=4)
    tokens = np.arange(40, dtype=np.uint32)
    held = {"ndarray": tokens.copy(), "array_q": array("q", tokens.tolist()), "list": tokens.tolist()}[form]
    cache.admit(held).release()
    for i in range(len(held)):
        held[i] = 7
    assert cache.match(tokens).num_tokens == 40
    assert cache.match(np.full(40, 7, dtype=np.uint32)).num_tokens == 0
    cache.check()


def test_share_copies_mutable_memory_and_views_only_bytes():
    key = bytes(range(100))
    assert share(key, 10, 100).__class__ is memoryview  # 90 of 100 bytes: a view
    assert share(key, 10, 40) == key[10:40] and share(key, 10, 40).__class__ is bytes  # under half: a copy
    assert share(key, 0, 100) is key
    view = share(key, 0, 80)
    assert share(view, 0, 60).__class__ is memoryview and share(view, 0, 30).__class__ is bytes
    mutable = bytearray(key)
    part = share(mutable, 0, 100)
    assert part.__class__ is bytes and part == key
    mutable[0] = 255
    assert part[0] == 0
    assert share(memoryview(mutable), 0, 100).__class__ is bytes

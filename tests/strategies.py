"""Shared hypothesis strategies and helpers for radixkv's tests."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
from hypothesis import strategies as st

from radixkv import InvalidBlocksError, InvalidTokensError, PrefixCache
from radixkv.keys import TOKEN_DTYPE

# A tiny alphabet makes token sequences collide on prefixes often.
small_tokens = st.lists(st.integers(0, 2), min_size=0, max_size=14)

PageKey = Tuple[Optional[str], Tuple[int, ...]]


def cached_pages(cache: PrefixCache, with_locks: bool = False) -> Dict[PageKey, int]:
    """Every cached page as ``(namespace, token prefix through that page) -> block``, read from the tree.

    With ``with_locks`` the value is ``(block, lock_ref of its node)``: independent of how
    the pages happen to be split into nodes.
    """
    out: Dict[PageKey, int] = {}
    pb = cache._tree.page_bytes
    for namespace, root in cache._tree.roots():
        stack = [(root, ())]
        while stack:
            node, prefix = stack.pop()
            for child in (node.children or {}).values():
                tokens = np.frombuffer(child.key[: child.num_pages * pb], dtype=TOKEN_DTYPE).tolist()
                p = prefix
                for i in range(child.num_pages):
                    p = p + tuple(tokens[i * cache.page_size : (i + 1) * cache.page_size])
                    out[(namespace, p)] = (int(child.blocks[i]), child.lock_ref) if with_locks else int(child.blocks[i])
                stack.append((child, p))
    return out


def longest_cached(pages: Dict[PageKey, int], tokens, page_size: int, namespace=None) -> list:
    """Blocks of the longest cached page prefix of ``tokens`` according to the model ``pages``."""
    blocks = []
    tokens = tuple(int(t) for t in tokens)
    for end in range(page_size, len(tokens) + 1, page_size):
        block = pages.get((namespace, tokens[:end]))
        if block is None:
            break
        blocks.append(block)
    return blocks


def snapshot(cache: PrefixCache):
    """Everything observable about a cache, to assert that a failed call changed nothing.

    Pages with their lock counts, every counter, the logical clock, pins and
    unreleased admissions, and (for a :class:`~radixkv.tiers.TieredCache`) the
    tier statistics.
    """
    tier_stats = cache.tier_stats().as_dict() if hasattr(cache, "tier_stats") else None
    return (
        cached_pages(cache, with_locks=True), cache.num_free_blocks, cache.num_cached_blocks,
        cache.protected_blocks, cache.evictable_blocks, cache.num_held_blocks, cache.evicted_blocks,
        cache.declined_blocks, cache.clock, sorted(cache._pins.values()), sorted(getattr(cache, "_admitted", {}).values()),
        tier_stats,
    )


# ---------------------------------------------------------------- bad arguments
# Each strategy draws (bad value, exception the API must raise for it). A wrong *type*
# is a TypeError; a value of the right type that is out of range or misshapen is a
# ValueError (the radixkv.errors subclasses are ValueErrors).


def _typed(values, error):
    return st.sampled_from(values).map(lambda v: (v, error))


not_a_sequence = st.sampled_from([None, 12, 2.5, "abc", b"ab", {1: 2}, {1, 2}, frozenset({3}), np.int64(4)])

bad_tokens_typed = st.one_of(
    not_a_sequence.map(lambda v: (v, TypeError)),
    st.lists(st.floats(allow_nan=False), min_size=1, max_size=3).map(lambda v: (v, TypeError)),
    _typed([[1, "2"], [True, False], [1, None], np.array([1.0, 2.0]), np.array([True]),
            [True, 1], [1, np.True_], np.array([1, True], dtype=object)], TypeError),
    st.lists(st.integers(max_value=-1), min_size=1, max_size=3).map(lambda xs: ([0, 1] + xs, InvalidTokensError)),
    st.lists(st.integers(min_value=2**32, max_value=2**70), min_size=1, max_size=3).map(
        lambda v: (v, InvalidTokensError)),
    _typed([np.array([[1, 2], [3, 4]]), [[1, 2]], np.array([-1, 2], dtype=np.int8)], InvalidTokensError),
)

bad_blocks_typed = st.one_of(
    not_a_sequence.map(lambda v: (v, TypeError)),
    _typed([[0.0], [True], ["1"], np.array([1.5]), [True, 0], [0, np.False_]], TypeError),
    st.integers(max_value=-1).map(lambda b: ([b], InvalidBlocksError)),
    st.integers(min_value=10**4, max_value=2**70).map(lambda b: ([b], InvalidBlocksError)),
    _typed([[[0]], np.zeros((1, 1), dtype=np.int32)], InvalidBlocksError),
)

bad_counts_typed = st.one_of(
    _typed([None, "3", 1.0, 2.5, True, False, np.float64(1.0), np.bool_(True), [1]], TypeError),
    st.integers(max_value=-1).map(lambda v: (v, ValueError)),
    st.integers(min_value=-2**31, max_value=-1).map(lambda v: (np.int64(v), ValueError)),
)

bad_namespaces_typed = st.one_of(
    st.integers(), st.binary(max_size=3), st.lists(st.text(max_size=2), max_size=2), st.tuples(st.text(max_size=2)),
).map(lambda v: (v, TypeError))

good_counts = st.one_of(st.integers(0, 3), st.integers(0, 3).map(np.int64), st.integers(0, 3).map(np.int32),
                        st.integers(0, 3).map(np.uint8))


def payload_for(page_key: Tuple[int, ...], shape) -> np.ndarray:
    """Deterministic payload of one page, derived from its token prefix."""
    rng = np.random.default_rng(abs(hash(page_key)) % (2**32))
    return rng.standard_normal(shape).astype(np.float32)

"""radixkv's own test helpers: strategies of bad arguments, cache snapshots, page payloads.

Token strategies for any prefix cache are the kit's, :mod:`radixkv.testing.strategies`;
the page-set model (every cached page, the longest cached run) is :mod:`radixkv.testing.protocol`'s.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
from hypothesis import strategies as st

from radixkv import InvalidBlocksError, InvalidTokensError, PrefixCache
from radixkv.testing.protocol import longest_cached, page_map  # noqa: F401  (the tests import both from here)

cached_pages = page_map
"""Every cached page as ``(namespace, token prefix) -> block`` (``with_locks``: ``(block, lock count)``)."""


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

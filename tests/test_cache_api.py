"""Bad input at every public method: a typed error naming the value, and the cache unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixkv import (
    InvalidBlocksError, InvalidTokensError, LockError, PrefixCache, RadixKVError, StaleHandleError,
    UnknownPolicyError,
)

from .strategies import snapshot

bad_tokens = st.one_of(
    st.lists(st.integers(max_value=-1), min_size=1, max_size=3).map(lambda xs: [0, 1] + xs),
    st.lists(st.integers(min_value=2**32), min_size=1, max_size=3),
    st.lists(st.floats(allow_nan=False), min_size=1, max_size=3),
    st.just(np.array([[1, 2], [3, 4]])),
    st.just(np.array([1.0, 2.0])),
    st.just(np.array([1, -2], dtype=np.int64)),
    st.just("abc"),
    st.just(None),
    st.just(12),
    st.just([1, "2"]),
    st.just([True, False]),
)


def busy_cache(kv: bool = False) -> PrefixCache:
    """A cache with cached, protected, evictable and held blocks."""
    cache = PrefixCache(num_blocks=16, page_size=2, kv_shape=(2,) if kv else None, dtype="float32")
    cache.admit([1, 2, 3, 4, 5, 6]).release()
    cache.admit([1, 2, 9, 9])  # kept protected
    cache.admit([7, 7, 7, 7]).release()
    cache.held = cache.allocate(2)
    return cache


def unchanged(call, expected_error):
    cache = busy_cache()
    before = snapshot(cache)
    with pytest.raises(expected_error):
        call(cache)
    cache.check()
    assert snapshot(cache) == before


@given(tokens=bad_tokens)
def test_bad_tokens_everywhere(tokens):
    for method in ("match", "admit", "pin"):
        unchanged(lambda c: getattr(c, method)(tokens), (TypeError, ValueError))
    unchanged(lambda c: c.insert(tokens, []), (TypeError, ValueError))


def test_token_errors_name_the_value():
    cache = PrefixCache(num_blocks=4, page_size=2)
    with pytest.raises(InvalidTokensError, match="-5"):
        cache.match([1, -5])
    with pytest.raises(TypeError, match="float"):
        cache.match([1.5, 2.0])
    with pytest.raises(InvalidTokensError, match=r"shape \(2, 2\)"):
        cache.match(np.zeros((2, 2), dtype=np.int64))


def test_accepts_any_integer_sequence():
    cache = PrefixCache(num_blocks=8, page_size=2)
    cache.admit(np.array([1, 2, 3, 4], dtype=np.int64)).release()
    for form in ([1, 2, 3, 4], (1, 2, 3, 4), np.array([1, 2, 3, 4], dtype=np.uint16), range(1, 5)):
        assert cache.match(form).num_tokens == 4
    assert cache.match([]).num_tokens == 0
    assert cache.match(np.array([], dtype=np.float64)).num_tokens == 0


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(num_blocks=0), ValueError, "num_blocks must be > 0, got 0"),
    (dict(num_blocks=-3), ValueError, "got -3"),
    (dict(num_blocks=2.5), TypeError, "got 2.5"),
    (dict(num_blocks=4, page_size=0), ValueError, "page_size"),
    (dict(num_blocks=4, policy="nope"), UnknownPolicyError, "available: .*lru"),
    (dict(num_blocks=4, kv_shape=(2, 0)), ValueError, "kv_shape"),
])
def test_bad_constructor_arguments(kwargs, error, text):
    with pytest.raises(error, match=text):
        PrefixCache(**kwargs)


@pytest.mark.parametrize("call, error", [
    (lambda c: c.allocate(-1), ValueError),
    (lambda c: c.allocate(1.0), TypeError),
    (lambda c: c.evict(-2), ValueError),
    (lambda c: c.free([99]), InvalidBlocksError),                  # out of range
    (lambda c: c.free([-1]), InvalidBlocksError),
    (lambda c: c.free([[0]]), InvalidBlocksError),                 # 2-D
    (lambda c: c.free([0.0]), TypeError),
    (lambda c: c.free(c.match([1, 2]).blocks), InvalidBlocksError),  # cached, not held
    (lambda c: c.free([c.held[0], c.held[0]]), InvalidBlocksError),  # duplicate
    (lambda c: c.free([15]), InvalidBlocksError),                  # free, not held
    (lambda c: c.insert([1, 2, 3, 4], [0]), InvalidBlocksError),   # wrong count
    (lambda c: c.insert([5, 5, 6, 6], [15, 14]), InvalidBlocksError),  # not held
    (lambda c: c.insert([5, 5, 6, 6], [int(c.held[0]), int(c.held[0])]), InvalidBlocksError),
    (lambda c: c.insert([5, 5, 6, 6], [int(c.held[0]), 100]), InvalidBlocksError),
    (lambda c: c.insert([1, 2, 3, 4], [int(c.match([7, 7]).blocks[0]), int(c.held[0])]), InvalidBlocksError),
    (lambda c: c.unlock(c.match([7, 7]).node), LockError),
    (lambda c: c.lock("node"), TypeError),
    (lambda c: c.unlock(None), TypeError),
    (lambda c: c.read([0]), RadixKVError),                         # no payload configured
])
def test_bad_calls_leave_cache_unchanged(call, error):
    unchanged(call, error)


def test_double_free_raises():
    cache = PrefixCache(num_blocks=4, page_size=2)
    blocks = cache.allocate(2)
    cache.free(blocks)
    with pytest.raises(InvalidBlocksError, match="free"):
        cache.free(blocks)
    cache.check()


def test_unlock_below_zero_and_nesting():
    cache = PrefixCache(num_blocks=8, page_size=1)
    cache.admit([1, 2, 3]).release()
    handle = cache.match([1, 2, 3]).node
    cache.lock(handle)
    cache.lock(handle)
    assert cache.protected_blocks == 3
    cache.unlock(handle)
    assert cache.protected_blocks == 3
    cache.unlock(handle)
    assert cache.protected_blocks == 0
    with pytest.raises(LockError):
        cache.unlock(handle)
    cache.check()


def test_unlock_of_an_ancestor_that_holds_no_lock_of_its_own():
    cache = PrefixCache(num_blocks=8, page_size=1)
    cache.admit([1, 2, 3]).release()
    child = cache.match([1, 2, 3]).node
    parent = cache.match([1, 2]).node   # splits: parent is the new upper node
    cache.lock(child)
    with pytest.raises(LockError):
        cache.unlock(parent)
    cache.check()


def test_stale_handle_raises_after_eviction():
    cache = PrefixCache(num_blocks=4, page_size=1)
    cache.admit([1, 2, 3]).release()
    handle = cache.match([1, 2, 3]).node
    cache.evict(1)
    with pytest.raises(StaleHandleError):
        cache.lock(handle)
    cache.check()


def test_handle_survives_a_split():
    cache = PrefixCache(num_blocks=8, page_size=1)
    cache.admit([1, 2, 3, 4]).release()
    handle = cache.match([1, 2, 3, 4]).node
    cache.match([1, 2])          # splits the node under the handle
    cache.lock(handle)
    assert cache.protected_blocks == 4
    assert cache.evict(10) == 0
    cache.unlock(handle)
    cache.check()


def test_allocate_none_when_everything_is_locked_changes_nothing():
    cache = PrefixCache(num_blocks=4, page_size=1)
    adm = cache.admit([1, 2, 3])
    before = snapshot(cache)
    assert cache.allocate(2) is None
    assert snapshot(cache) == before
    assert cache.allocate(1) is not None
    adm.release()
    cache.check()


def test_write_rejects_wrong_shape_and_free_blocks():
    cache = busy_cache(kv=True)
    blocks = cache.match([1, 2, 3, 4]).blocks
    with pytest.raises(ValueError, match="shape"):
        cache.write(blocks, np.zeros((1, 2, 2)))
    with pytest.raises(InvalidBlocksError, match="free"):
        cache.write([15], np.zeros((1, 2, 2)))
    with pytest.raises(InvalidBlocksError, match="free"):
        cache.read([15])
    cache.check()


def test_payload_round_trip():
    cache = PrefixCache(num_blocks=8, page_size=2, kv_shape=(3,), dtype="float32")
    adm = cache.admit([1, 2, 3, 4])
    data = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    cache.write(adm.new_blocks, data)
    adm.release()
    np.testing.assert_array_equal(cache.read(cache.match([1, 2, 3, 4, 5]).blocks), data)


def test_partial_page_is_ignored():
    cache = PrefixCache(num_blocks=8, page_size=4)
    adm = cache.admit(list(range(10)))
    assert len(adm.new_blocks) == 2
    adm.release()
    assert cache.match(list(range(8)) + [99]).num_tokens == 8
    assert cache.match(list(range(7))).num_tokens == 4


def test_reset_requires_no_locks_and_frees_everything():
    cache = PrefixCache(num_blocks=8, page_size=1)
    adm = cache.admit([1, 2, 3])
    with pytest.raises(LockError):
        cache.reset()
    adm.release()
    cache.reset()
    cache.check()
    assert cache.num_free_blocks == 8 and cache.match([1, 2, 3]).num_tokens == 0


def test_insert_returns_present_pages_and_gives_back_duplicates():
    cache = PrefixCache(num_blocks=8, page_size=1)
    first = cache.allocate(3)
    assert cache.insert([1, 2, 3], first) == 0
    second = cache.allocate(4)
    assert cache.insert([1, 2, 3, 4], second) == 3
    # the three duplicates went back; the fourth page is cached in second[3]
    assert cache.num_free_blocks == 8 - 4
    assert cache.match([1, 2, 3, 4]).blocks.tolist() == first.tolist() + [second[3]]
    cache.check()


@pytest.mark.parametrize("namespace", [["a"], 3, ("a",), b"x"])
def test_namespace_must_be_a_string(namespace):
    for call in (lambda c: c.match([1, 2], namespace=namespace),
                 lambda c: c.admit([1, 2], namespace=namespace),
                 lambda c: c.insert([1, 2], [int(c.held[0])], namespace=namespace)):
        unchanged(call, TypeError)


def test_returned_block_arrays_cannot_corrupt_the_tree():
    cache = PrefixCache(num_blocks=8, page_size=2)
    adm = cache.admit([1, 2, 3, 4])
    with pytest.raises(ValueError):
        adm.new_blocks[0] = 7
    m = cache.match([1, 2, 3, 4])
    m.blocks[0] = 7          # a copy: the caller may do what it likes with it
    assert cache.match([1, 2, 3, 4]).blocks.tolist() == adm.blocks.tolist()
    adm.release()
    cache.check()

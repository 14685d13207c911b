"""Bad input at every public method: a typed error naming the value, and the cache unchanged."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import (
    InvalidBlocksError, InvalidTokensError, LockError, PrefixCache, RadixKVError, StaleHandleError,
    UnknownPolicyError,
)

from radixkv.tiers import HostTier, TieredCache

from ..strategies import (
    bad_blocks_typed, bad_counts_typed, bad_namespaces_typed, bad_tokens_typed, good_counts, not_a_sequence,
    snapshot,
)

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
    # looked up before any snapshot is taken: a match moves the clock
    cache.blocks_12 = cache.match([1, 2]).blocks
    cache.handle_77 = cache.match([7, 7]).node
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
    (lambda c: c.free(c.blocks_12), InvalidBlocksError),            # cached, not held
    (lambda c: c.free([c.held[0], c.held[0]]), InvalidBlocksError),  # duplicate
    (lambda c: c.free([15]), InvalidBlocksError),                  # free, not held
    (lambda c: c.insert([1, 2, 3, 4], [0]), InvalidBlocksError),   # wrong count
    (lambda c: c.insert([5, 5, 6, 6], [15, 14]), InvalidBlocksError),  # not held
    (lambda c: c.insert([5, 5, 6, 6], [int(c.held[0]), int(c.held[0])]), InvalidBlocksError),
    (lambda c: c.insert([5, 5, 6, 6], [int(c.held[0]), 100]), InvalidBlocksError),
    (lambda c: c.insert([1, 2, 3, 4], [int(c.handle_77._node.blocks[0]), int(c.held[0])]), InvalidBlocksError),
    (lambda c: c.unlock(c.handle_77), LockError),
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


# ---------------------------------------------------------------- every entry point, generated bad input
def busy(kind: str) -> PrefixCache:
    """A cache (plain, or tiered with a host tier) with cached, protected, pinned, evictable and held
    blocks, payloads, and pages already demoted to the tier."""
    common = dict(num_blocks=12, page_size=2, kv_shape=(2,), dtype="float32")
    if kind == "tiered":
        cache = TieredCache(**common, tiers=[HostTier(8)], load_back="always")
    else:
        cache = PrefixCache(**common)
    for tokens in ([1, 2, 3, 4, 5, 6], [8, 8, 9, 9, 8, 8, 9, 9], [6, 6, 5, 5, 4, 4]):
        cache.admit(tokens).release()
    cache.admit([1, 2, 9, 9])              # kept protected
    cache.admit([7, 7, 7, 7]).release()
    cache.pin([7, 7])
    cache.held = cache.allocate(2)
    return cache


def held(cache, n=1):
    return [int(b) for b in cache.held[:n]]


ENTRY_POINTS = {
    # name: (strategy of (bad value, expected error), call(cache, bad value))
    "match tokens": (bad_tokens_typed, lambda c, v: c.match(v)),
    "admit tokens": (bad_tokens_typed, lambda c, v: c.admit(v)),
    "pin tokens": (bad_tokens_typed, lambda c, v: c.pin(v)),
    "unpin tokens": (bad_tokens_typed, lambda c, v: c.unpin(v)),
    "insert tokens": (bad_tokens_typed, lambda c, v: c.insert(v, held(c))),
    "match namespace": (bad_namespaces_typed, lambda c, v: c.match([1, 2, 3, 4], namespace=v)),
    "admit namespace": (bad_namespaces_typed, lambda c, v: c.admit([1, 2, 3, 4], namespace=v)),
    "pin namespace": (bad_namespaces_typed, lambda c, v: c.pin([1, 2], namespace=v)),
    "unpin namespace": (bad_namespaces_typed, lambda c, v: c.unpin([7, 7], namespace=v)),
    "insert namespace": (bad_namespaces_typed, lambda c, v: c.insert([5, 5], held(c), namespace=v)),
    "insert blocks": (bad_blocks_typed, lambda c, v: c.insert([5, 5], v)),
    "free blocks": (bad_blocks_typed, lambda c, v: c.free(v)),
    "read blocks": (bad_blocks_typed, lambda c, v: c.read(v)),
    "write blocks": (bad_blocks_typed, lambda c, v: c.write(v, np.zeros((1, 2, 2), np.float32))),
    "allocate n": (bad_counts_typed, lambda c, v: c.allocate(v)),
    "evict n": (bad_counts_typed, lambda c, v: c.evict(v)),
    "admit priority": (bad_counts_typed, lambda c, v: c.admit([5, 5, 6, 6], priority=v)),
    "admit expires_at": (bad_counts_typed.filter(lambda p: p[0] is not None), lambda c, v: c.admit([5, 5, 6, 6], priority=1, expires_at=v)),
    "lock handle": (not_a_sequence.map(lambda v: (v, TypeError)), lambda c, v: c.lock(v)),
    "unlock handle": (not_a_sequence.map(lambda v: (v, TypeError)), lambda c, v: c.unlock(v)),
    "write data": (st.sampled_from([
        (np.ones((1, 2, 2), dtype=complex) * 1j, TypeError), (np.full((1, 2, 2), 1 + 0j), TypeError),
        (np.array([[[object()] * 2] * 2]), TypeError), ("abc", TypeError), (None, TypeError),
        (np.zeros((2, 2, 2), np.float32), ValueError), (np.zeros((1, 2)), ValueError), ([[[1, 2], [3]]], ValueError),
    ]), lambda c, v: c.write(held(c), v)),
}
NAMES = {"tokens": "tokens", "namespace": "namespace", "blocks": "blocks", "n": "n", "priority": "priority",
         "expires_at": "expires_at", "handle": "NodeHandle", "data": "data"}


@pytest.mark.parametrize("kind", ["plain", "tiered"])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@settings(max_examples=25)
@given(data=st.data())
def test_generated_bad_argument_raises_its_type_and_changes_nothing(kind, entry, data):
    """For every public entry point: the exception type the argument's fault calls for (TypeError for a
    wrong type, ValueError for a wrong value), a message naming the argument, and no state change at all
    (clock, counters, pages with lock counts, pins, admissions, tier statistics, check())."""
    strategy, call = ENTRY_POINTS[entry]
    value, error = data.draw(strategy, label="bad value")
    cache = busy(kind)
    before = snapshot(cache)
    with pytest.raises(error, match=NAMES[entry.split()[1]]) as info:
        call(cache, value)
    if error is TypeError:  # never a ValueError subclass for a wrong type
        assert not isinstance(info.value, ValueError), repr(info.value)
    else:
        assert not isinstance(info.value, TypeError), repr(info.value)
    assert isinstance(info.value, RadixKVError), repr(info.value)  # catchable as the library's own
    cache.check()
    assert snapshot(cache) == before


@pytest.mark.parametrize("kind", ["plain", "tiered"])
@given(priority=good_counts, expires_at=st.one_of(st.none(), good_counts), n=good_counts)
def test_numpy_and_python_integers_are_accepted_alike(kind, priority, expires_at, n):
    cache = busy(kind)
    adm = cache.admit([5, 5, 6, 6], priority=priority, expires_at=expires_at)
    assert type(adm.node._node.retention) is int
    adm.release()
    assert cache.evict(n) <= int(n)
    blocks = cache.allocate(n)
    assert blocks is not None and len(blocks) == int(n)
    cache.check()


@pytest.mark.parametrize("data, payload", [
    (np.arange(4, dtype=np.int64).reshape(1, 2, 2), [[[0, 1], [2, 3]]]),     # int -> float: same kind
    ([[[0.5, 1], [2, 3]]], [[[0.5, 1], [2, 3]]]),                            # nested lists
    (np.full((1, 2, 2), 0.25, dtype=np.float64), [[[0.25] * 2] * 2]),        # float64 -> float32
    (np.full((1, 2, 2), np.nan, dtype=np.float16), [[[np.nan] * 2] * 2]),    # NaN is a float
])
def test_write_accepts_data_of_the_same_kind(data, payload):
    cache = busy("plain")
    cache.write(held(cache), data)
    np.testing.assert_array_equal(cache.read(held(cache)), np.array(payload, dtype=np.float32))


def test_write_rejects_data_that_would_lose_information_without_a_warning():
    cache = PrefixCache(num_blocks=4, page_size=2, kv_shape=(1,), dtype="int8")
    blocks = cache.allocate(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="int8"):
            cache.write(blocks, np.full((1, 2, 1), 1.5))          # float -> int truncates
        with pytest.raises(TypeError, match="complex"):
            cache.write(blocks, np.full((1, 2, 1), 1 + 2j))
    cache.write(blocks, np.full((1, 2, 1), 7, dtype=np.int64))   # int64 -> int8 is the same kind
    assert cache.read(blocks).ravel().tolist() == [7, 7]


# ---------------------------------------------------------------- admissions and unlock, in every order
@settings(max_examples=150)
@given(ops=st.lists(st.sampled_from(["release a", "release b", "unlock", "lock", "pin", "unpin"]), max_size=12),
       same_node=st.booleans())
def test_release_and_unlock_in_any_order_never_unlock_twice(ops, same_node):
    """An admission's lock is given up by its release only (idempotent); unlock undoes only lock();
    unpin only pin(). Every refused call raises LockError and changes nothing."""
    cache = PrefixCache(num_blocks=16, page_size=2)
    a = cache.admit([1, 2, 3, 4])
    b = cache.admit([1, 2, 3, 4] if same_node else [1, 2, 3, 4, 5, 6])
    handle = a.node
    locks = pins = 0
    for op in ops:
        before = snapshot(cache)
        if op.startswith("release"):
            adm = a if op == "release a" else b
            was = adm.released
            adm.release()
            if was:
                assert snapshot(cache) == before  # idempotent
        elif op == "lock":
            cache.lock(handle)
            locks += 1
        elif op == "pin":
            cache.pin([1, 2, 3, 4])
            pins += 1
        elif op == "unpin":
            if pins:
                cache.unpin([1, 2, 3, 4])
                pins -= 1
            else:
                with pytest.raises(LockError):
                    cache.unpin([1, 2, 3, 4])
                assert snapshot(cache) == before
        elif locks:
            cache.unlock(handle)
            locks -= 1
        else:
            with pytest.raises(LockError, match="Admission.release"):
                cache.unlock(handle)
            assert snapshot(cache) == before
        cache.check()
        held_a = (not a.released) or (not b.released and same_node) or locks or pins
        assert (cache.protected_blocks >= 2) == bool(held_a or not b.released)
        assert (handle._node.lock_ref > 0) == bool(held_a or (not b.released))
    a.release(), b.release()
    for _ in range(locks):
        cache.unlock(handle)
    for _ in range(pins):
        cache.unpin([1, 2, 3, 4])
    cache.check()
    assert cache.protected_blocks == 0 and handle._node.lock_ref == 0


def test_reviewers_unlock_then_release_sequence():
    cache = PrefixCache(num_blocks=8, page_size=2)
    a = cache.admit([1, 2, 3, 4])
    before = snapshot(cache)
    with pytest.raises(LockError):
        cache.unlock(a.node)                 # the admission's lock is not unlock()'s to take
    assert snapshot(cache) == before
    a.release()
    assert cache.protected_blocks == 0
    with pytest.raises(LockError):
        cache.unlock(a.node)                 # after release: nothing left to unlock
    a.release()                              # idempotent
    cache.check()
    with cache.admit([1, 2, 3, 4]) as b:     # a with block releases once even after an explicit release
        b.release()
    cache.check()
    assert cache.protected_blocks == 0

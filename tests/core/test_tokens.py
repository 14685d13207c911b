"""Token and block-id validation: one rule for every input form.

Lists, tuples, ``range``, ``array.array`` of every integer typecode, numpy arrays
of every integer dtype and object arrays must get the same verdict for the same
elements (the same error class and message, or the same bytes), and a bool
(Python or numpy) is never taken for an integer.
"""
from __future__ import annotations

import sys
from array import array

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixkv import ArgumentTypeError, ArgumentValueError, InvalidBlocksError, InvalidTokensError, PrefixCache
from radixkv.keys import as_tokens, page_key, uint32_array

from ..strategies import snapshot

# C long long has numpy type numbers of its own (what array('q') and some C extensions give).
INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
              np.longlong, np.ulonglong]
INT_TYPECODES = "bBhHiIlLqQ"


# ---------------------------------------------------------------- defect: bools and numpy ints in mixed lists


@pytest.mark.parametrize("tokens", [
    [True, 1], [1, True], [0, 5, False], (3, True), [np.True_, 1], [1, np.False_],
    np.array([True, 1], dtype=object), np.array([1, np.True_], dtype=object),
])
@pytest.mark.parametrize("method", ["match", "admit", "pin", "insert"])
def test_bools_in_mixed_tokens_are_a_type_error(tokens, method):
    cache = PrefixCache(num_blocks=8, page_size=2)
    cache.admit([1, 1, 2, 2]).release()
    before = snapshot(cache)
    call = (lambda: cache.insert(tokens, [])) if method == "insert" else (lambda: getattr(cache, method)(tokens))
    with pytest.raises(ArgumentTypeError, match=r"bool.* at position"):
        call()
    cache.check()
    assert snapshot(cache) == before


@pytest.mark.parametrize("blocks", [[True, 0], [0, True], (False,), [np.True_, 0], np.array([True, 0], dtype=object)])
def test_bools_in_block_ids_are_a_type_error(blocks):
    cache = PrefixCache(num_blocks=4, page_size=2)
    held = cache.allocate(2)
    assert sorted(held.tolist()) == [0, 1]
    before = snapshot(cache)
    with pytest.raises(ArgumentTypeError, match="bool"):
        cache.free(blocks)  # freed block 1 (True) before the fix
    cache.check()
    assert snapshot(cache) == before
    assert cache.num_held_blocks == 2


@pytest.mark.parametrize("tokens", [
    [1, np.uint64(5)], [np.uint64(2**32 - 1), 7], [np.int64(3), np.uint32(4), 5],
    np.array([1, 5], dtype=object), np.array([np.uint64(1), 5], dtype=object), [np.array(1), 5],
])
def test_valid_ints_of_mixed_kinds_are_tokens(tokens):
    expected = [int(t) for t in tokens]
    assert as_tokens(tokens).tolist() == expected
    cache = PrefixCache(num_blocks=4, page_size=2)
    cache.admit(expected).release()
    assert cache.match(tokens).num_tokens == 2


def test_block_ids_of_mixed_kinds_are_accepted():
    cache = PrefixCache(num_blocks=4, page_size=2)
    cache.allocate(2)
    cache.free([np.uint64(1), 0])
    assert cache.num_free_blocks == 4
    cache.allocate(2)
    cache.free(np.array([1, 0], dtype=object))
    assert cache.num_free_blocks == 4


@pytest.mark.parametrize("tokens, text", [
    ([1, -5], "got -5 at position 1"),
    ([0, 1, 2**32], "got 4294967296 at position 2"),
    ([7, 2**70, -1], r"got 1180591620717411303424 at position 1"),
    (np.array([4, 2**40], dtype=object), "got 1099511627776 at position 1"),
    (np.array([4, 2**40, 3], dtype=np.uint64), "got 1099511627776 at position 1"),
    (array("q", [4, -3]), "got -3 at position 1"),
    (range(2**32 - 2, 2**32 + 5), "got 4294967296 at position 2"),
    (range(3, -3, -2), "got -1 at position 2"),
])
def test_range_errors_name_the_value_and_position(tokens, text):
    with pytest.raises(InvalidTokensError, match=text) as info:
        as_tokens(tokens)
    assert isinstance(info.value, ArgumentValueError)


@pytest.mark.parametrize("tokens, text", [
    ([1, 2.0], r"got 2.0 \(float\) at position 1"),
    ([1, np.float32(2)], r"numpy.float32\) at position 1"),
    ([1, True, -1], r"got True \(bool\) at position 1"),  # a type error before a range error
    ([1, "2"], r"'2' \(str\) at position 1"),
    (array("d", [1.0]), r"got 1.0 \(float\) at position 0"),
    (np.array([1.0, 2.0]), r"dtype float64 \(1.0 at position 0\)"),
])
def test_type_errors_name_the_value_and_position(tokens, text):
    with pytest.raises(ArgumentTypeError, match=text):
        as_tokens(tokens)


def test_nested_sequences_are_a_shape_error():
    for tokens in ([[1, 2]], [1, [2]], [1, np.array([2])], np.array([[1, 2]]), np.array([[1.5]])):
        with pytest.raises(InvalidTokensError, match="1-D"):
            as_tokens(tokens)


# ---------------------------------------------------------------- one rule for every form

elements = st.one_of(
    st.integers(0, 2**32 - 1),
    st.integers(0, 300),
    st.integers(),                                             # any size, negative and huge
    st.integers(2**32 - 3, 2**32 + 3),
    st.booleans(),
    st.booleans().map(np.bool_),
    st.sampled_from(INT_DTYPES).flatmap(
        lambda t: st.integers(int(np.iinfo(t).min), int(np.iinfo(t).max)).map(t)),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(0, 10).map(float),                             # integral floats are floats too
    st.integers(0, 10).map(np.float64),
)


def expected_verdict(items, bound=2**32):
    """The documented rule, written out: the first non-integer is a TypeError, else the
    first value outside [0, bound) a ValueError, else the uint32 bytes."""
    for i, x in enumerate(items):
        if isinstance(x, (bool, np.bool_, float, np.floating)):
            return ArgumentTypeError, i
    for i, x in enumerate(items):
        if not 0 <= int(x) < bound:
            return ArgumentValueError, i
    return b"".join(int(x).to_bytes(4, sys.byteorder) for x in items), None


def forms(items):
    """Every form that can hold ``items`` exactly: (label, value)."""
    out = [("list", list(items)), ("tuple", tuple(items)), ("object array", np.array(items, dtype=object))]
    if all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in items):
        values = [int(x) for x in items]
        for dtype in INT_DTYPES:
            info = np.iinfo(dtype)
            if all(info.min <= v <= info.max for v in values):
                name = f"{np.dtype(dtype)} ({np.dtype(dtype).char!r})"  # int64 and longlong apart
                out.append((f"ndarray {name}", np.array(values, dtype=dtype)))
                out.append((f"strided ndarray {name}", np.repeat(np.array(values, dtype=dtype), 2)[::2]))
                swapped = np.dtype(dtype).newbyteorder()
                out.append((f"ndarray {swapped.str}", np.array(values, dtype=swapped)))
        for code in INT_TYPECODES:
            try:
                out.append((f"array('{code}')", array(code, values)))
            except OverflowError:
                pass
        if len(values) >= 2 and values[1] != values[0] and all(
                b - a == values[1] - values[0] for a, b in zip(values, values[1:])):
            out.append(("range", range(values[0], values[-1] + (1 if values[1] > values[0] else -1),
                                       values[1] - values[0])))
        elif len(values) == 1:
            out.append(("range", range(values[0], values[0] + 1)))
    return out


def verdicts(items, convert):
    seen = {}
    for label, value in forms(items):
        try:
            seen[label] = convert(value).tobytes()
        except (TypeError, ValueError) as exc:
            seen[label] = (type(exc), str(exc))
    return seen


@given(items=st.lists(elements, max_size=8))
def test_every_form_gets_the_same_verdict(items):
    want, position = expected_verdict(items)
    seen = verdicts(items, as_tokens)
    assert len(set(seen.values())) == 1, seen
    got = next(iter(seen.values()))
    if isinstance(want, bytes):
        assert got == want
    else:
        error, text = got
        assert issubclass(error, want) and f"at position {position}" in text, (got, want, position)
        if want is ArgumentValueError:
            assert issubclass(error, InvalidTokensError) and f"got {int(items[position])!r}" in text


@given(items=st.lists(st.one_of(elements, st.integers(0, 12)), max_size=6))
def test_block_ids_follow_the_same_rule(items):
    num_blocks = 12
    want, position = expected_verdict(items, num_blocks)
    seen = verdicts(items, lambda v: uint32_array(v, "blocks", InvalidBlocksError, num_blocks))
    assert len(set(seen.values())) == 1, seen
    got = next(iter(seen.values()))
    assert got == want if isinstance(want, bytes) else issubclass(got[0], want)
    # the pool adds only distinctness; a bool is never taken for block 0 or 1
    cache = PrefixCache(num_blocks=num_blocks, page_size=2)
    cache.allocate(num_blocks)
    before = snapshot(cache)
    distinct = isinstance(want, bytes) and len({int(x) for x in items}) == len(items)
    if distinct:
        cache.free(list(items))
        assert cache.num_free_blocks == len(items)
    else:
        with pytest.raises(want if not isinstance(want, bytes) else InvalidBlocksError):
            cache.free(list(items))
        assert snapshot(cache) == before
    cache.check()


@given(start=st.integers(-5, 2**32 + 5), stop=st.integers(-5, 2**32 + 5), step=st.integers(-2**31, 2**31).filter(bool))
def test_ranges_match_their_lists(start, stop, step):
    r = range(start, stop, step)
    if len(r) > 64:
        r = r[:64]
    items = list(r)
    try:
        got = as_tokens(r).tobytes()
    except (TypeError, ValueError) as exc:
        got = (type(exc), str(exc))
    want = verdicts(items, as_tokens)["list"]
    assert got == want


def test_a_huge_range_is_checked_without_walking_it():
    with pytest.raises(InvalidTokensError, match=f"got {2**32} at position {2**32}"):
        as_tokens(range(2**40))


def test_uint32_input_is_not_copied():
    tokens = np.arange(10, dtype=np.uint32)
    assert as_tokens(tokens) is tokens


@given(items=st.lists(elements, max_size=9), page_size=st.integers(1, 4))
def test_page_keys_follow_the_same_rule(items, page_size):
    """page_key (what every cache call makes of its tokens; array('q') has a path of its own)
    gives each form the bytes of as_tokens' whole pages, or as_tokens' error."""
    want, position = expected_verdict(items)
    for label, value in forms(items):
        try:
            got = page_key(value, page_size)
        except (TypeError, ValueError) as exc:
            got = (type(exc), str(exc))
        if isinstance(want, bytes):
            n = len(items) // page_size
            assert got == (want[: 4 * n * page_size], n), label
        else:
            assert got == verdicts(items, as_tokens)[label], label


@given(items=st.lists(elements, max_size=9), page_size=st.integers(1, 4))
def test_int64_tokens_follow_the_rule_on_either_cast(items, page_size):
    """The int64 short way (numpy's checked cast where it has one, a range pass then a cast where
    not) gives as_tokens and page_key the list's verdict either way."""
    import radixkv.keys as keys

    want = verdicts(items, as_tokens)["list"]
    for same_value in (True, False) if keys._SAME_VALUE else (False,):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(keys, "_SAME_VALUE", same_value)
            for label, value in forms(items):
                if label.startswith(("array('q')", "array('l')", "ndarray int64", "strided ndarray int64")):
                    try:
                        got = as_tokens(value).tobytes()
                    except (TypeError, ValueError) as exc:
                        got = (type(exc), str(exc))
                    assert got == want, (label, same_value)
                    try:
                        key = page_key(value, page_size)
                    except (TypeError, ValueError) as exc:
                        key = (type(exc), str(exc))
                    n = len(items) // page_size
                    assert key == (want if not isinstance(want, bytes) else (want[: 4 * n * page_size], n)), label

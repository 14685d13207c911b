"""TokenBuffer: a growing request's tokens, converted once and accepted wherever tokens are."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixkv import ArgumentTypeError, ArgumentValueError, InvalidTokensError, PrefixCache, TokenBuffer
from radixkv.events.hashing import BlockHasher
from radixkv.keys import as_tokens

from ..strategies import snapshot


def test_accepted_wherever_tokens_are():
    tokens = list(range(100, 137))
    buf = TokenBuffer(tokens[:5])
    buf.extend(tokens[5:30])
    for t in tokens[30:]:
        buf.append(t)
    assert as_tokens(buf).tolist() == tokens and len(buf) == len(tokens)
    a, b = PrefixCache(num_blocks=32, page_size=4), PrefixCache(num_blocks=32, page_size=4)
    for cache, form in ((a, tokens), (b, buf)):
        cache.admit(form[:20] if form is tokens else TokenBuffer(tokens[:20])).release()
        assert cache.match(form).num_tokens == 20
        held = cache.allocate(len(tokens) // 4 - 5)
        cache.insert(form, np.concatenate([cache.match(form).blocks, held]))
        assert cache.pin(form) == 36 and cache.unpin(form) == 36
        cache.check()
    assert snapshot(a) == snapshot(b)
    assert BlockHasher().hash_pages(buf, 4) == BlockHasher().hash_pages(tokens, 4)


@pytest.mark.parametrize("bad, error", [
    ([1, True], ArgumentTypeError), ([2.0], ArgumentTypeError), ([-1], InvalidTokensError),
    ([2**32], InvalidTokensError), ([[1]], InvalidTokensError), (None, ArgumentTypeError),
])
def test_extend_validates_and_appends_nothing_on_error(bad, error):
    buf = TokenBuffer([1, 2, 3])
    with pytest.raises(error):
        buf.extend(bad)
    assert buf.tokens().tolist() == [1, 2, 3]


@pytest.mark.parametrize("bad, error", [
    (True, ArgumentTypeError), (np.True_, ArgumentTypeError), (1.0, ArgumentTypeError), ("1", ArgumentTypeError),
    (-1, InvalidTokensError), (2**32, InvalidTokensError), (np.int64(-2), InvalidTokensError),
])
def test_append_follows_the_token_rule(bad, error):
    buf = TokenBuffer([1])
    with pytest.raises(error):
        buf.append(bad)
    buf.append(np.uint64(7))
    assert buf.tokens().tolist() == [1, 7]


def test_truncate_and_bad_arguments():
    buf = TokenBuffer(range(10))
    with pytest.raises(ArgumentValueError, match="<= 10"):
        buf.truncate(11)
    with pytest.raises(ArgumentTypeError):
        buf.truncate(True)
    with pytest.raises(ArgumentTypeError):
        TokenBuffer(capacity=1.5)
    buf.truncate(4)
    assert as_tokens(buf).tolist() == [0, 1, 2, 3]


def test_taken_without_a_copy():
    buf = TokenBuffer(range(1000))
    assert np.shares_memory(as_tokens(buf), buf.tokens())


def test_views_are_read_only():
    view = TokenBuffer([1, 2]).tokens()
    with pytest.raises(ValueError):
        view[0] = 5
    assert np.asarray(TokenBuffer([1, 2]), dtype=np.int64).dtype == np.int64


ops = st.lists(st.one_of(
    st.tuples(st.just("extend"), st.lists(st.integers(0, 2**32 - 1), max_size=40)),
    st.tuples(st.just("append"), st.integers(0, 2**32 - 1)),
    st.tuples(st.just("truncate"), st.integers(0, 60)),
), max_size=30)


@given(initial=st.lists(st.integers(0, 2**32 - 1), max_size=20), steps=ops)
def test_matches_a_list_and_never_changes_what_it_handed_out(initial, steps):
    buf, model = TokenBuffer(initial), list(initial)
    handed_out = []
    for op, arg in steps:
        if op == "truncate":
            arg = min(arg, len(model))
            buf.truncate(arg)
            del model[arg:]
        else:
            getattr(buf, op)(arg)
            getattr(model, op)(arg)
        handed_out.append((as_tokens(buf), list(model)))
        assert len(buf) == len(model) and as_tokens(buf).tobytes() == as_tokens(model).tobytes()
    for view, then in handed_out:
        assert view.tolist() == then

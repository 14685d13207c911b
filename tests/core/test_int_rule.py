"""One integer rule: every count radixkv takes as an argument passes or fails the same way.

:func:`radixkv.keys.check_int` is the rule; the cost model, the capacity parser, the
workload generators, the LRU curve, the ShareGPT loader, the tokenizer, the tier
configuration and the CLI's count options all call it, each with its own error
types and wording. (The capacity parser also reads text and whole floats such as
``"1.5M"`` or ``2.0``; an int it hands to the rule.)
"""

from __future__ import annotations

import numpy as np
import pytest

from radixkv.workload import sharegpt
from radixkv.capacity import parse_count
from radixkv.costs import CostTypeError, get_model, kv_bytes_per_page
from radixkv.analysis.curve import lru_curve
from radixkv.errors import ArgumentTypeError, ArgumentValueError
from radixkv.workload.generators import generate
from radixkv.keys import check_int, check_positive_int
from radixkv.tiers import HostTier, TierConfigError
from radixkv.workload.tokenizer import tokenize

NOT_INTS = [True, np.bool_(False), 1.0, np.float64(2.0), "3", None, [4]]


@pytest.mark.parametrize("value", NOT_INTS)
def test_not_an_int_is_a_type_error(value):
    with pytest.raises(ArgumentTypeError, match=r"n must be an int, got "):
        check_int(value, "n")


@pytest.mark.parametrize("value", [0, 7, np.int8(7), np.uint64(2**63), 2**70])
def test_python_and_numpy_ints_come_back_as_python_ints(value):
    got = check_int(value, "n")
    assert got == int(value) and type(got) is int


def test_bounds_and_their_wording():
    assert check_int(5, "n", minimum=5, maximum=5) == 5
    with pytest.raises(ArgumentValueError, match=r"^n must be >= 2, got 1$"):
        check_int(1, "n", minimum=2)
    with pytest.raises(ArgumentValueError, match=r"^n must be in \[0, 3\], got 4$"):
        check_int(4, "n", maximum=3)
    with pytest.raises(ArgumentValueError, match=r"^n must be > 0, got 0$"):
        check_positive_int(np.int64(0), "n")
    with pytest.raises(ArgumentValueError, match=r"^n must be >= 0, got -1$"):
        check_positive_int(-1, "n", allow_zero=True)


def test_callers_name_their_own_error_types():
    with pytest.raises(CostTypeError):
        check_int(1.5, "n", type_error=CostTypeError)
    with pytest.raises(TierConfigError, match="n must be > 0"):
        check_positive_int(0, "n", value_error=TierConfigError)


CALLERS = [
    pytest.param(lambda n: kv_bytes_per_page(get_model("llama-3-8b"), n), id="costs"),
    pytest.param(lambda n: next(generate("scan", 0, 1, prompt_tokens=n)), id="generators"),
    pytest.param(lambda n: lru_curve([], n, [1]), id="curve"),
    pytest.param(lambda n: sharegpt.load_sharegpt("unused.json", num_sessions=n), id="sharegpt"),
    pytest.param(lambda n: tokenize("a b", vocab_size=n), id="tokenizer"),
    pytest.param(lambda n: HostTier(n), id="tiers"),
]


@pytest.mark.parametrize("call", CALLERS)
@pytest.mark.parametrize("value", [True, 2.0, np.float32(2.0)])
def test_every_caller_refuses_bools_and_floats_as_type_errors(call, value):
    with pytest.raises(TypeError, match="must be an int"):
        call(value)


@pytest.mark.parametrize("call", CALLERS + [pytest.param(lambda n: parse_count(n, "n"), id="capacity")])
def test_every_caller_refuses_zero_as_a_value_error(call):
    with pytest.raises(ValueError, match=r"must be (> 0|>= 1|in \[1, 2\*\*32\]), got 0"):
        call(np.int64(0))

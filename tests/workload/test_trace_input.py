"""Trace input: every reader turns any line into requests, a ``file:line:`` error, or a counted skip.

Regression tests for ids past int64 and non-finite timestamps, then generated JSON lines (big
ints, floats, NaN/inf, nested values, unicode, lone surrogates, missing fields, wrong types,
bools, broken UTF-8) through the token, Mooncake and ShareGPT readers and through
``radixkv replay``: never a traceback.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.cli import main
from radixkv.analysis.curve import lru_curve_mooncake
from radixkv.errors import TraceFormatError
from radixkv.analysis.replay import replay
from radixkv.workload.sharegpt import load_sharegpt
from radixkv.workload.sources import open_trace
from radixkv.workload.traces import Request, TraceReader


def run(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


def strict_json(text: str) -> dict:
    """``json.loads`` that refuses NaN and Infinity, as every parser but Python's does."""
    def refuse(constant: str):
        raise AssertionError(f"non-JSON constant {constant} in output")
    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------------------ regressions (issue 11.7)

@pytest.mark.parametrize("line, message", [
    ('{"tokens": [1, 99999999999999999999]}', "field 'tokens' value 99999999999999999999 outside"),
    ('{"tokens": [1, -99999999999999999999]}', "field 'tokens' value -99999999999999999999 outside"),
    ('{"hash_ids": [99999999999999999999], "input_length": 5}', "field 'hash_ids' value 99999999999999999999"),
    ('{"tokens": [1, 2], "timestamp": NaN}', "field 'timestamp' must be a finite number, got nan"),
    ('{"tokens": [1, 2], "timestamp": Infinity}', "field 'timestamp' must be a finite number, got inf"),
    ('{"tokens": [1, 2], "timestamp": -Infinity}', "field 'timestamp' must be a finite number, got -inf"),
    ('{"tokens": [1, 2], "timestamp": 1e999}', "field 'timestamp' must be a finite number, got inf"),
    ('{"tokens": [1, 2], "timestamp": 1' + "0" * 400 + '}', "field 'timestamp' must be a finite number"),
    ('{"hash_ids": [1], "input_length": 5, "timestamp": NaN}', "field 'timestamp' must be a finite number"),
    ('{"hash_ids": [1], "input_length": 99999999999999999999}', "field 'input_length' must be in [0, "),
    ('{"tokens": [1], "output_length": 99999999999999999999}', "field 'output_length' must be in [0, "),
    ('{"tokens": [1], "namespace": "\\ud800"}', "field 'namespace' holds a lone surrogate"),
    ('{"tokens": [' + "1" * 5000 + "]}", "invalid JSON: "),
    ("[" * 100_000 + "]" * 100_000, "invalid JSON: "),
])
def test_out_of_range_and_non_finite_values_are_file_line_errors(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text('{"tokens": [1, 2, 3], "timestamp": 0}\n' if "hash_ids" not in line
                    else '{"hash_ids": [1], "input_length": 3, "timestamp": 0}\n')
    with path.open("a") as f:
        f.write(line + "\n")
    with pytest.raises(TraceFormatError) as info:
        list(TraceReader(str(path)))
    assert str(info.value).startswith(f"{path}:2: ") and message in str(info.value)
    result = run("replay", path, "--num-blocks", 10, "--quiet", "--json")
    assert result.exit_code == 2
    assert result.output == f"radixkv: error: {info.value}\n"
    skipped = run("replay", path, "--num-blocks", 10, "--quiet", "--json", "--skip-bad")
    assert skipped.exit_code == 0, skipped.output
    out = strict_json(skipped.output.strip().splitlines()[-1])
    assert out["requests"] == 1 and out["skipped_lines"] == 1 and out["first_timestamp"] == 0.0


def test_invalid_utf8_names_its_line_in_every_reader(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"tokens": [1, 2]}\n{"tokens": [1], "namespace": "\xff"}\n')
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: invalid UTF-8"):
        list(TraceReader(str(path)))
    chat = tmp_path / "c.json"
    chat.write_bytes(b'[{"conversations": [{"from": "human", "value": "hi"}]},\n{"conversations": "\xff"}]')
    with pytest.raises(TraceFormatError, match=r"c\.json:2: invalid UTF-8"):
        list(load_sharegpt(chat))


def test_replay_refuses_a_nan_timestamp_given_as_a_request():
    requests = [Request(np.array([1, 2], dtype=np.uint32), 1.0), Request(np.array([1], dtype=np.uint32), math.nan),
                Request(np.array([3], dtype=np.uint32), 0.5)]
    with pytest.raises(ValueError, match=r"requests\[1\]\.timestamp must be finite, got nan"):
        replay(requests, PrefixCache(4, 1))


def test_sharegpt_skip_bad_counts_malformed_conversations(tmp_path):
    """--skip-bad was refused for ShareGPT (a ValueError naming ``skip_bad``); it now skips and counts."""
    good = {"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"}]}
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join([json.dumps(good), "{oops", json.dumps({"messages": 3}), json.dumps(good)]) + "\n")
    trace = open_trace(str(path), skip_bad=True)
    assert len(list(trace)) == 2 and trace.skipped == 2
    result = run("replay", path, "--num-blocks", 100, "--page-size", 1, "--quiet", "--json", "--skip-bad")
    assert result.exit_code == 0, result.output
    out = strict_json(result.output.strip().splitlines()[-1])
    assert out["requests"] == 2 and out["skipped_lines"] == 2 and out["hit_tokens"] > 0


# ------------------------------------------------------------------ generated input

BIG_INTS = st.sampled_from([2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64, -1, -2**63 - 1, 10**30,
                            8_388_607, 8_388_608, 0])
SCALARS = (st.none() | st.booleans() | st.integers() | BIG_INTS
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
           | st.sampled_from(["\ud800", "\udfff", "é", "中文", "\u2028", "\x00"]))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)


def plausible_or(plausible):
    return st.one_of(plausible, plausible, JSON_VALUES)


TOKEN_FIELDS = {
    "tokens": plausible_or(st.lists(st.integers(0, 40), max_size=12)),
    "timestamp": plausible_or(st.integers(0, 5) | st.floats(0, 5)),
    "output_length": plausible_or(st.integers(0, 9)),
    "namespace": plausible_or(st.sampled_from(["a", "b"])),
}
MOONCAKE_FIELDS = {
    "hash_ids": plausible_or(st.lists(st.integers(0, 6), max_size=3)),
    "input_length": plausible_or(st.integers(0, 1600)),
    "timestamp": plausible_or(st.integers(0, 5000)),
    "output_length": plausible_or(st.integers(0, 9)),
}
GARBAGE = (st.text(min_size=1, max_size=20).filter(lambda t: t.strip() and "\n" not in t).map(str.encode)
           | st.sampled_from([b"\xff\xfe", b"{\"tokens\": [1, \xc3]}", b"[" * 3000 + b"]" * 3000,
                              b'{"tokens": [' + b"9" * 4400 + b"]}", b"NaN", b"[]", b'"x"']))


def record_lines(fields: dict) -> st.SearchStrategy[bytes]:
    record = st.fixed_dictionaries({}, optional=fields)
    other = st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=2)
    return st.one_of(record, record, record, st.builds(lambda a, b: {**a, **b}, record, other)).map(
        lambda r: json.dumps(r).encode("utf-8", "surrogatepass"))


def lines_of(fields: dict) -> st.SearchStrategy[list]:
    return st.lists(st.one_of(record_lines(fields), record_lines(fields), record_lines(fields), GARBAGE),
                    min_size=1, max_size=6)


def turn(keys: tuple) -> st.SearchStrategy:
    role_key, content_key = keys
    roles = st.sampled_from(["human", "gpt", "user", "Assistant", "system", "tool", "robot"])
    return st.fixed_dictionaries({}, optional={role_key: plausible_or(roles),
                                               content_key: plausible_or(st.text(max_size=10))})


CONVERSATION = st.one_of(
    st.fixed_dictionaries({}, optional={"conversations": plausible_or(st.lists(turn(("from", "value")), max_size=4)),
                                        "id": JSON_VALUES}),
    st.fixed_dictionaries({}, optional={"messages": plausible_or(st.lists(turn(("role", "content")), max_size=4))}),
    JSON_VALUES)


def check_requests(requests: list) -> None:
    for r in requests:
        assert isinstance(r, Request) and r.tokens.dtype == np.uint32 and r.tokens.ndim == 1
        assert r.timestamp is None or math.isfinite(r.timestamp)
        assert isinstance(r.output_length, int) and r.output_length >= 0
        assert r.namespace is None or isinstance(r.namespace, str) and r.namespace.encode("utf-8")


def read_all(make, num_lines: int):
    """``(requests, None)`` or ``(None, error)``; an error must be a TraceFormatError naming a line of the file."""
    try:
        requests = list(make())
    except TraceFormatError as exc:
        match = re.match(rf"{re.escape(exc.path)}:(\d+): \S", str(exc))
        assert match and 0 <= int(match.group(1)) <= num_lines, str(exc)
        return None, exc
    check_requests(requests)
    return requests, None


def check_cli(path: Path, *options: object) -> None:
    """``radixkv replay``: exit 0 with strict JSON, or exit 2 with one ``radixkv: error: file:line: ...`` line."""
    result = run("replay", path, "--num-blocks", 4, "--page-size", 2, "--quiet", "--json", *options)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code == 2:
        assert re.fullmatch(rf"radixkv: error: {re.escape(str(path))}:\d+: [^\n]+\n", result.output), result.output
    else:
        assert result.exit_code == 0, result.output
        strict_json(result.output.strip().splitlines()[-1])


@pytest.mark.parametrize("fmt, fields", [("tokens", TOKEN_FIELDS), ("mooncake", MOONCAKE_FIELDS)])
@given(data=st.data())
def test_generated_jsonl_through_the_readers_and_the_cli(fmt, fields, data):
    lines = data.draw(lines_of(fields), label="lines")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        requests, error = read_all(lambda: TraceReader(str(path), fmt), len(lines))
        skipping = TraceReader(str(path), fmt, skip_bad=True)
        kept = list(skipping)
        check_requests(kept)
        assert len(kept) + skipping.skipped == len(lines)  # every line is read or counted
        if error is None:
            assert skipping.skipped == 0 and len(kept) == len(requests)
            replay(requests, PrefixCache(4, 2)).as_dict()  # what the reader accepts, the cache takes
        if fmt == "mooncake":
            for page_size in (16, 24):  # hash ids read directly, tokens expanded
                try:
                    lru_curve_mooncake(str(path), page_size, [4])
                except TraceFormatError as exc:
                    assert re.match(rf"{re.escape(str(path))}:[1-9]\d*: \S", str(exc)), str(exc)
        check_cli(path, "--format", fmt)
        check_cli(path, "--format", fmt, "--skip-bad")
        check_cli(path)  # format detected from the first line


@given(conversations=st.lists(CONVERSATION, max_size=4), layout=st.sampled_from(["json", "jsonl"]),
       garbage=st.lists(GARBAGE, max_size=1))
def test_generated_sharegpt_through_the_reader_and_the_cli(conversations, layout, garbage):
    if layout == "json":
        body = json.dumps(conversations, indent=1).encode("utf-8", "surrogatepass")
        num_lines = body.count(b"\n") + 1
    else:
        lines = [json.dumps(c).encode("utf-8", "surrogatepass") for c in conversations] + garbage
        body, num_lines = b"\n".join(lines) + b"\n", len(lines)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"chat.{layout}"
        path.write_bytes(body)
        requests, error = read_all(lambda: load_sharegpt(path, num_sessions=2), num_lines)
        if requests:
            replay(requests, PrefixCache(4, 2))
        # (a first line starting with "[" makes the file a JSON list, whose broken syntax is not skipped)
        if layout == "jsonl" and garbage == [] and conversations and not isinstance(conversations[0], list):
            trace = open_trace(str(path), "sharegpt", skip_bad=True)
            try:
                check_requests(list(trace))
            except TraceFormatError as exc:  # nothing to replay, nothing malformed
                assert "trace is empty" in str(exc) and error is None and not requests
            assert (trace.skipped == 0) == (error is None)
        check_cli(path, "--format", "sharegpt")
        check_cli(path, "--format", "sharegpt", "--skip-bad")

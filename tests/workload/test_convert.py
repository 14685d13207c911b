"""radixkv convert: any trace as Mooncake JSONL (replayed at page size 512, the same hits as the
original) or token JSONL (the same tokens)."""

from __future__ import annotations

import io
import json

import pytest

from radixkv import PrefixCache
from radixkv.analysis.replay import replay
from radixkv.errors import ArgumentValueError
from radixkv.workload.convert import convert, mooncake_records
from radixkv.workload.sources import open_trace
from radixkv.workload.traces import Request

from ..analysis.test_tool_cli import fails, ok
from ..shared_traces import CONVERSATION, SYNTHETIC


def hits(path, page_size, blocks, policy="lru"):
    return replay(open_trace(str(path)), PrefixCache(blocks, page_size, policy), miss_reasons=False).hit_tokens


@pytest.mark.parametrize("source", [CONVERSATION, SYNTHETIC])
def test_a_mooncake_trace_converted_replays_with_its_hits_at_page_512(source, tmp_path):
    head = tmp_path / "head.jsonl"
    with open(source) as src:
        head.write_text("".join(next(src) for _ in range(1500)))
    out = tmp_path / "mc.jsonl"
    ok("convert", head, "--to", "mooncake", "-o", out)
    for blocks, policy in ((500, "lru"), (5000, "lru"), (2000, "s3fifo")):
        assert hits(out, 512, blocks, policy) == hits(head, 512, blocks, policy) > 0
    first, converted = json.loads(head.read_text().splitlines()[0]), json.loads(out.read_text().splitlines()[0])
    assert converted["timestamp"] == first["timestamp"] and converted["input_length"] == first["input_length"]


def test_a_token_trace_converted_to_mooncake_and_back(tmp_path):
    tokens = tmp_path / "mix.jsonl"
    ok("gen", "mix", "--num-requests", "400", "-o", tokens)
    mooncake, back = tmp_path / "mc.jsonl", tmp_path / "back.jsonl"
    ok("convert", tokens, "--to", "mooncake", "-o", mooncake)
    ok("convert", mooncake, "--to", "tokens", "-o", back)
    for blocks in (20, 200, 2000):
        assert hits(mooncake, 512, blocks) == hits(tokens, 512, blocks) == hits(back, 512, blocks)
    assert [len(r.tokens) for r in open_trace(str(back))] == [len(r.tokens) for r in open_trace(str(tokens))]


def test_mooncake_to_tokens_keeps_every_token(tmp_path):
    head = tmp_path / "head.jsonl"
    with open(CONVERSATION) as src:
        head.write_text("".join(next(src) for _ in range(50)))
    out = tmp_path / "t.jsonl"
    ok("convert", head, "--to", "tokens", "-o", out)
    for a, b in zip(open_trace(str(head)), open_trace(str(out))):
        assert (a.tokens == b.tokens).all() and a.timestamp == b.timestamp and a.output_length == b.output_length


def test_ids_are_dense_and_chained():
    shared = list(range(1024))
    records = list(mooncake_records([Request(shared + [1] * 10), Request(shared + [2] * 600), Request([5] * 512)]))
    assert [r["hash_ids"] for r in records] == [[0, 1, 2], [0, 1, 3, 4], [5]]
    with pytest.raises(ArgumentValueError, match="namespace"):
        list(mooncake_records([Request(shared, namespace="a")]))
    with pytest.raises(ArgumentValueError, match="to must be one of"):
        convert([], "csv", io.StringIO())
    fails("convert", "nope.jsonl", "--to", "mooncake", message="TRACE nope.jsonl")

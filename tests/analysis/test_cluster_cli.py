"""``radixkv cluster`` reports like ``radixkv replay``: miss reasons, per-request records, --model, progress."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from radixkv.analysis.replay import replay
from radixkv.cache import PrefixCache
from radixkv.cli import main
from radixkv.cluster import Cluster
from radixkv.workload.generators import generate, write_token_jsonl
from radixkv.workload.traces import Request, TraceReader

PS = 16


def ok(*args):
    result = CliRunner().invoke(main, [str(a) for a in args], env={"COLUMNS": "100"})
    assert result.exit_code == 0, (args, result.output)
    return result.output


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("cluster") / "mix.jsonl"
    write_token_jsonl(generate("mix", 5, 200), str(path))
    return path


def test_one_instance_reports_what_replay_reports(trace):
    requests = list(TraceReader(str(trace)))
    mine, theirs = [], []
    expected = replay(requests, PrefixCache(400, PS), on_record=theirs.append)
    calls = []
    cluster = Cluster(1, 400, PS)
    result = cluster.replay(requests, miss_reasons=True, on_record=lambda rec, i: mine.append((rec, i)),
                            on_request=lambda r, h: calls.append(h))
    cluster.check()
    assert expected.miss_tokens_by_reason["evicted"] > 0  # the capacity is small enough to matter
    assert result.miss_tokens_by_reason == expected.miss_tokens_by_reason
    assert (result.hit_tokens, result.prefill_flops_saved, result.evicted_blocks) == (
        expected.hit_tokens, expected.prefill_flops_saved, expected.evicted_blocks)
    assert [rec for rec, _ in mine] == theirs and {i for _, i in mine} == {0}
    assert calls == [rec.hit_tokens for rec in theirs]


def test_many_instances_account_for_every_token_and_request(trace):
    requests = list(TraceReader(str(trace)))
    records = []
    cluster = Cluster(3, 300, PS, routing="cache_aware", host_blocks=200, borrowing=True)
    result = cluster.replay(requests, miss_reasons=True, on_record=lambda rec, i: records.append((rec, i)))
    cluster.check()
    assert result.hit_tokens + sum(result.miss_tokens_by_reason.values()) == result.prompt_tokens
    assert [rec.index for rec, _ in records] == list(range(len(requests)))
    assert [rec.prompt_tokens for rec, _ in records] == [len(r.tokens) for r in requests]
    assert sum(rec.hit_tokens for rec, _ in records) == result.hit_tokens
    assert [sum(1 for _, i in records if i == k) for k in range(3)] == result.requests_by_instance
    for rec, _ in records:
        assert rec.hit_tokens + sum(rec.miss_tokens_by_reason.values()) == rec.prompt_tokens


def test_miss_reasons_are_about_the_serving_instance():
    """A prefix cached on instance 0 only is a first sight on instance 1, never 'evicted'."""
    tokens = list(range(4 * PS))
    cluster = Cluster(2, 64, PS, routing="round_robin")
    result = cluster.replay([Request(tokens), Request(tokens), Request(tokens)], miss_reasons=True)
    # instance 0: miss then hit; instance 1: first sight
    assert result.hit_tokens == 4 * PS
    assert result.miss_tokens_by_reason["first_sight"] == 2 * 4 * PS
    assert result.miss_tokens_by_reason["evicted"] == 0


def test_cli_records_model_and_miss_reasons(trace, tmp_path):
    records = tmp_path / "records.jsonl"
    args = ["cluster", trace, "--num-blocks", "300", "--instances", "2", "--routing", "cache_aware", "--quiet"]
    out = json.loads(ok(*args, "--records", records, "--model", "llama-3-70b", "--format", "json").splitlines()[-1])
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) == out["requests"] == 200
    assert sum(line["hit_tokens"] for line in lines) == out["hit_tokens"]
    assert sorted({line["instance"] for line in lines}) == [0, 1]
    assert out["model"] == "llama-3-70b"
    assert out["hit_tokens"] + sum(out["miss_tokens_by_reason"].values()) == out["prompt_tokens"]
    small = json.loads(ok(*args, "--format", "json").splitlines()[-1])
    assert small["hit_tokens"] == out["hit_tokens"] and small["prefill_flops_saved"] < out["prefill_flops_saved"]
    assert json.loads(ok(*args, "--no-miss-reasons", "--format", "json").splitlines()[-1])[
        "miss_tokens_by_reason"] == {}
    table = ok(*args)
    assert "| first_sight" in table and "prefill saved:" in table
    assert max(len(line) for line in table.splitlines() if line.startswith("|")) <= 100


def test_other_namespace_misses_are_taken_on_the_serving_instance(trace):
    """Namespaced requests: the cluster's 'other_namespace' count equals replay's on one instance."""
    requests = [Request(r.tokens, r.timestamp, namespace="ab"[k % 2]) for k, r in enumerate(TraceReader(str(trace)))]
    expected = replay(requests, PrefixCache(400, PS))
    result = Cluster(1, 400, PS).replay(requests, miss_reasons=True)
    assert expected.miss_tokens_by_reason["other_namespace"] > 0
    assert result.miss_tokens_by_reason == expected.miss_tokens_by_reason


def test_global_index_pulls_pages_between_instances(trace):
    base = ["cluster", trace, "--instances", 3, "--num-blocks", 400, "--quiet"]
    plain = json.loads(ok(*base, "--json"))
    indexed = json.loads(ok(*base, "--global-index", "--json"))
    assert not plain["global_index"] and plain["pages_pulled"] == 0
    assert indexed["global_index"] and indexed["pages_pulled"] > 0
    assert indexed["hit_tokens_by_tier"]["peer"] == indexed["peer_hit_tokens"] == indexed["pages_pulled"] * PS
    assert indexed["token_hit_rate"] > plain["token_hit_rate"] and indexed["peer_transfer_seconds"] > 0
    table = ok(*base, "--global-index")
    assert "pulled from peers:" in table and "cluster-wide index:" in table
    assert max(len(line) for line in table.splitlines()) <= 100

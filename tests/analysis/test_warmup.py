"""--warmup: the first requests fill the cache and count nothing, in replay, sweep (the curve's LRU rows
too) and curve; the numbers after it are those of the same requests in a whole replay."""

from __future__ import annotations

import json

import pytest

from radixkv import PrefixCache
from radixkv.analysis.replay import replay
from radixkv.analysis.sweep import SweepJob, lru_rows, run_job, trace_curve
from radixkv.workload.sources import open_trace

from ..shared_traces import conversation_head
from .test_tool_cli import fails, ok


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conversation_head(tmp_path_factory.mktemp("traces"), 600)


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_the_warm_totals_are_the_whole_replays_later_requests(conv, policy):
    records = []
    replay(open_trace(conv), PrefixCache(3000, 16, policy), on_record=records.append)
    warm = replay(open_trace(conv), PrefixCache(3000, 16, policy), warmup=250)
    later = records[250:]
    assert (warm.requests, warm.warmup_requests) == (350, 250)
    assert warm.hit_tokens == sum(r.hit_tokens for r in later) > 0
    assert warm.prompt_tokens == sum(r.prompt_tokens for r in later)
    assert warm.evicted_blocks == sum(r.evicted_blocks for r in later)
    assert warm.prefill_flops_saved == sum(r.prefill_flops_saved for r in later)
    for reason, tokens in warm.miss_tokens_by_reason.items():
        assert tokens == sum(r.miss_tokens_by_reason[reason] for r in later), reason
    assert warm.first_timestamp == later[0].timestamp


def test_curve_and_curve_rows_warm_up_as_the_replay(conv):
    caps = [5, 300, 3000, 40_000]
    jobs = [SweepJob(conv, "lru", c, warmup=250) for c in caps]
    curve = trace_curve(open_trace(conv), 16, caps, mooncake=True, warmup=250)
    for job, row, hits in zip(jobs, lru_rows(jobs), curve.hit_tokens):
        ref = run_job(job)
        assert {k: v for k, v in row.items() if k not in ("wall_seconds", "source")} == \
            {k: v for k, v in ref.items() if k != "wall_seconds"}
        assert hits == ref["hit_tokens"] and curve.prompt_tokens == ref["prompt_tokens"]


def test_warmup_flag_takes_a_count_or_a_share(conv):
    out = json.loads(ok("replay", conv, "--num-blocks", "3k", "--warmup", "25%", "--json", "--quiet"))
    assert (out["warmup_requests"], out["requests"]) == (150, 450)
    rows = [json.loads(line) for line in ok("sweep", conv, "--policies", "lru,fifo", "--capacities", "1k,3k,9k",
                                            "--warmup", "150", "--json", "--quiet").splitlines()]
    assert {(r["warmup_requests"], r["requests"]) for r in rows} == {(150, 450)}
    curve = json.loads(ok("curve", conv, "--capacities", "1k,3k,9k", "--warmup", "150", "--json", "--quiet"))
    assert curve["hit_tokens"] == [r["hit_tokens"] for r in rows if r["policy"] == "lru"]
    table = ok("replay", conv, "--num-blocks", "3k", "--warmup", "150", "--quiet")
    assert "450 requests (after a warm-up of 150)" in table
    fails("replay", conv, "--num-blocks", "3k", "--warmup", "600", message="--warmup 600 leaves no request")
    fails("curve", conv, "--warmup", "100%", message="--warmup: a share must be in [0%, 100%)")
    fails("sweep", conv, "--warmup", "-3", message="--warmup")


def test_cluster_warms_up_as_the_library_and_refuses_it_with_processes(conv, tmp_path):
    """``cluster --warmup``: the JSON equals ``Cluster.replay(warmup=...)``'s, its records are the whole
    run's later ones (trace-order index), and ``--processes`` refuses it in one line."""
    from radixkv.cluster import Cluster

    records = tmp_path / "records.jsonl"
    got = json.loads(ok("cluster", conv, "--instances", "2", "--num-blocks", "1500", "--warmup", "40%", "--json",
                        "--quiet", "--records", records))
    want = Cluster(2, 1500, 16).replay(open_trace(conv), warmup=240)
    assert got["warmup_requests"] == 240 and got["requests"] == 360
    assert (got["hit_tokens"], got["requests_by_instance"]) == (want.hit_tokens, want.requests_by_instance)
    assert want.hit_tokens > 0
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) == 360 and lines[0]["index"] == 240
    fails("cluster", conv, "--processes", "2", "--num-blocks", "1500", "--warmup", "10",
          message="--warmup is not supported with --processes")

"""--interval: the hit rate over time, window by window, in the JSON (replay, sweep, the curve's LRU
rows) and drawn by ``radixkv plot --over-time``."""

from __future__ import annotations

import json

import pytest

from radixkv import PrefixCache
from radixkv.analysis.replay import replay
from radixkv.analysis.sweep import SweepJob, lru_rows, run_job
from radixkv.workload.sources import open_trace

from ..shared_traces import conversation_head
from .test_tool_cli import fails, ok


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conversation_head(tmp_path_factory.mktemp("traces"), 500)


def test_windows_are_the_records_summed_window_by_window(conv):
    records = []
    whole = replay(open_trace(conv), PrefixCache(2000, 16), on_record=records.append)
    windows = replay(open_trace(conv), PrefixCache(2000, 16), interval=120, warmup=20).intervals
    later = records[20:]
    assert [w["requests"] for w in windows] == [120, 120, 120, 120]
    assert [w["end_request"] for w in windows] == [120, 240, 360, 480]
    for n, w in enumerate(windows):
        chunk = later[n * 120:(n + 1) * 120]
        assert w["hit_tokens"] == sum(r.hit_tokens for r in chunk)
        assert w["prompt_tokens"] == sum(r.prompt_tokens for r in chunk)
        assert w["token_hit_rate"] == pytest.approx(w["hit_tokens"] / w["prompt_tokens"])
        assert w["last_timestamp"] == chunk[-1].timestamp
    assert not whole.intervals


def test_curve_rows_have_the_replays_windows(conv):
    jobs = [SweepJob(conv, "lru", c, interval=70, warmup=33) for c in (10, 900, 30_000)]
    for job, row in zip(jobs, lru_rows(jobs)):
        assert row["intervals"] == run_job(job)["intervals"] and len(row["intervals"]) == 7  # 467 = 6 x 70 + 47


def test_interval_in_the_json_and_plot_over_time(conv, tmp_path):
    out = json.loads(ok("replay", conv, "--num-blocks", "2k", "--interval", "100", "--json", "--quiet"))
    assert [w["end_request"] for w in out["intervals"]] == [100, 200, 300, 400, 500]
    results = tmp_path / "r.jsonl"
    ok("sweep", conv, "--policies", "lru,s3fifo", "--capacities", "1k,10k", "--interval", "100", "-o", results,
       "--quiet")
    ok("plot", results, "--over-time", "-o", tmp_path / "t.svg")
    assert (tmp_path / "t.svg").read_text().count("<svg") == 1
    plain = tmp_path / "p.jsonl"
    ok("sweep", conv, "--policies", "lru", "--capacities", "1k", "-o", plain, "--quiet")
    fails("plot", plain, "--over-time", "-o", tmp_path / "x.png", message="--over-time needs")

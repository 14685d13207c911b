"""The sweep, curve, plot, gen and demo commands, replay --records/--format sharegpt, and bad input (exit 2)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from radixkv import PrefixCache
from radixkv.cli import main
from radixkv.analysis.replay import replay
from radixkv.analysis.stats import MISS_REASONS
from radixkv.workload.traces import TraceReader

from ..shared_traces import SYNTHETIC


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result


def ok(*args):
    result = run(*args)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    """The first 120 requests of the synthetic Mooncake trace."""
    path = tmp_path_factory.mktemp("traces") / "synthetic120.jsonl"
    with SYNTHETIC.open() as src:
        path.write_text("".join(next(src) for _ in range(120)))
    return path


def numbers(row):
    return {k: v for k, v in row.items() if k != "wall_seconds"}


def test_sweep_writes_one_line_per_pair_and_a_table(small_trace, tmp_path):
    out = tmp_path / "results.jsonl"
    text = ok("sweep", small_trace, "--policies", "lru,s3fifo", "--capacities", "1k,5k,20k", "-o", out, "--quiet")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["policy"], r["num_blocks"]) for r in rows] == [
        ("lru", 1000), ("lru", 5000), ("lru", 20000), ("s3fifo", 1000), ("s3fifo", 5000), ("s3fifo", 20000)]
    requests = list(TraceReader(str(small_trace)))
    for row in rows:  # the LRU rows come from one pass of the curve, with a replay's numbers
        expected = replay(requests, PrefixCache(row["num_blocks"], 16, policy=row["policy"]))
        assert row.pop("source", None) == ("curve" if row["policy"] == "lru" else None)
        assert numbers(row) == {"trace": str(small_trace), **numbers(expected.as_dict()), "skipped_lines": 0}
        assert row["hit_tokens"] + sum(row["miss_tokens_by_reason"].values()) == row["prompt_tokens"]
    lines = text.strip().splitlines()
    assert lines[0].startswith("| policy") and "token_hit_rate" in lines[0] and len(lines) == 2 + 6 + 2
    assert "| s3fifo |" in lines[-3].replace("  ", " ").replace("  ", " ")
    assert lines[-1].startswith("lru: 3 capacities from one pass of the LRU curve")


def test_sweep_jobs_2_gives_the_numbers_of_jobs_1(small_trace):
    args = ["sweep", small_trace, "--policies", "lru,lfu", "--capacities", "2k,10k", "--json", "--quiet"]
    one = [json.loads(line) for line in ok(*args, "--jobs", "1").splitlines()]
    two = [json.loads(line) for line in ok(*args, "--jobs", "2").splitlines()]
    assert len(one) == 4 and [numbers(r) for r in one] == [numbers(r) for r in two]


def test_curve_json_last_line_equals_replays(small_trace):
    text = ok("curve", small_trace, "--page-size", "16", "--capacities", "100,1k,3k,10k,30k,100k", "--json", "--quiet")
    curve = json.loads(text.strip().splitlines()[-1])
    requests = list(TraceReader(str(small_trace)))
    assert curve["capacities"] == [100, 1000, 3000, 10000, 30000, 100000]
    assert curve["hit_tokens"] == [replay(requests, PrefixCache(c, 16), miss_reasons=False).hit_tokens
                                   for c in curve["capacities"]]
    assert curve["prompt_tokens"] == sum(len(r.tokens) for r in requests)
    table = ok("curve", small_trace, "--capacities", "1k,10k")
    assert "| num_blocks" in table and "10,000" in table  # thousands separators in tables


def test_curve_of_a_token_trace(tmp_path):
    trace = tmp_path / "chat.jsonl"
    ok("gen", "multi_turn", "--seed", "2", "--num-requests", "60", "-o", trace)
    curve = json.loads(ok("curve", trace, "--capacities", "10,100,1k", "--json").splitlines()[-1])
    requests = list(TraceReader(str(trace)))
    assert curve["hit_tokens"] == [replay(requests, PrefixCache(c, 16)).hit_tokens for c in (10, 100, 1000)]


def test_plot_writes_a_png(small_trace, tmp_path):
    results = tmp_path / "results.jsonl"
    ok("sweep", small_trace, "--policies", "lru,belady", "--capacities", "1k,5k,20k", "-o", results, "--quiet")
    png = tmp_path / "plots" / "curve.png"
    ok("plot", results, "-o", png)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    curve = tmp_path / "curve.json"
    curve.write_text(ok("curve", small_trace, "--capacities", "1k,5k,20k", "--json").splitlines()[-1] + "\n")
    ok("plot", curve, "-o", tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_gen_is_deterministic_and_passes_params(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    ok("gen", "rag", "--seed", "5", "--num-requests", "30", "-o", a, "--param", "num_docs=7", "--param", "zipf_alpha=1.5")
    ok("gen", "rag", "--seed", "5", "--num-requests", "30", "-o", b, "--param", "num_docs=7", "--param", "zipf_alpha=1.5")
    ok("gen", "rag", "--seed", "6", "--num-requests", "30", "-o", c, "--param", "num_docs=7", "--param", "zipf_alpha=1.5")
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    assert len(a.read_text().splitlines()) == 30
    stdout = ok("gen", "rag", "--seed", "5", "--num-requests", "30", "--param", "num_docs=7", "--param", "zipf_alpha=1.5")
    assert stdout == a.read_text()
    default = tmp_path / "d.jsonl"
    ok("gen", "rag", "--seed", "5", "--num-requests", "30", "-o", default)
    assert default.read_bytes() != a.read_bytes()  # the params made a difference


def test_replay_records_and_sharegpt(tmp_path):
    chats = tmp_path / "chats.json"
    chats.write_text(json.dumps([{"conversations": [{"from": "human", "value": f"hello number {i} " * 8},
                                                    {"from": "gpt", "value": "sure " * 30},
                                                    {"from": "human", "value": "more please"}]}
                                 for i in range(4)]))
    records = tmp_path / "records.jsonl"
    out = json.loads(ok("replay", chats, "--format", "sharegpt", "--num-blocks", "500", "--page-size", "4",
                        "--records", records, "--json").splitlines()[-1])
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert out["requests"] == len(lines) == 8
    assert sum(r["hit_tokens"] for r in lines) == out["hit_tokens"] > 0
    for r in lines:
        assert r["hit_tokens"] + sum(r["miss_tokens_by_reason"].values()) == r["prompt_tokens"]
    assert [r["timestamp"] for r in lines] == sorted(r["timestamp"] for r in lines)
    table = ok("replay", chats, "--num-blocks", "500", "--page-size", "4", "--model", "llama-3-70b",
               "--hardware", "a100")
    assert "first_sight" in table and "llama-3-70b on a100" in table


def test_demo_prints_the_table_and_writes_the_plot(tmp_path):
    text = ok("demo", "--requests", "150", "--out-dir", tmp_path / "out", "--quiet")
    assert "| policy" in text and "| belady" in text.replace("|   ", "| ").replace("|  ", "| ")
    assert "one-pass LRU curve equals the LRU replays at 5 capacities: True" in text
    assert (tmp_path / "out" / "demo.png").read_bytes()[:4] == b"\x89PNG"
    rows = [json.loads(line) for line in (tmp_path / "out" / "demo.jsonl").read_text().splitlines()]
    assert {r["policy"] for r in rows} >= {"lru", "belady"}


# ------------------------------------------------------------------ bad input: one line, exit 2

BAD_LINES = [
    ('{"hash_ids": [1, 2], "input_length": 700, "timestamp": 5}\n{"hash_ids": [1], "input_length": "x"}\n',
     ":2: field 'input_length' must be int"),
    ('{"hash_ids": [1, 2], "input_length": 700}\n{"input_length": 3}\n', ":2: missing field 'hash_ids'"),
    ('{"hash_ids": [1], "input_length": 5, "timestamp": 9}\n{"hash_ids": [2], "input_length": 5, "timestamp": 3}\n',
     ":2: field 'timestamp' goes backwards"),
    ('{"hash_ids": [1], "input_length": 5}\n{oops\n', ":2: invalid JSON"),
    ("", ":0: trace is empty"),
]


@pytest.mark.parametrize("command", [["sweep", "--capacities", "10"], ["curve", "--capacities", "10"],
                                     ["replay", "--num-blocks", "10"]])
@pytest.mark.parametrize("content, message", BAD_LINES)
def test_malformed_traces_exit_2_with_file_line_and_field(tmp_path, command, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    result = run(command[0], path, *command[1:], "--quiet")
    assert result.exit_code == 2, result.output
    assert f"{path}{message}" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.parametrize("command", ["sweep", "curve"])
@pytest.mark.parametrize("capacities, message", [("0", "capacity must be > 0"), ("-5", "capacity must be"),
                                                 ("1k,abc", "'abc'"), ("1.5", "whole number")])
def test_bad_capacities_exit_2(small_trace, command, capacities, message):
    result = run(command, small_trace, "--capacities", capacities, "--quiet")
    assert result.exit_code == 2 and message in result.output and "--capacities" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_other_bad_options_exit_2(small_trace, tmp_path):
    cases = [
        (["sweep", small_trace, "--capacities", "1k", "--policies", "lru,nope"], "unknown policy 'nope'"),
        (["sweep", small_trace, "--capacities", "1k", "--jobs", "0"], ""),
        (["sweep", tmp_path / "missing.jsonl", "--capacities", "1k"], "missing.jsonl"),
        (["gen", "nope"], "unknown workload kind 'nope'"),
        (["gen", "rag", "--param", "num_docs=many"], "num_docs must be an int"),
        (["gen", "rag", "--param", "zipf_alpha"], "KEY=VALUE"),
        (["plot", tmp_path / "missing.jsonl"], "missing.jsonl"),
        (["replay", small_trace, "--num-blocks", "10", "--format", "sharegpt"], ""),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)


@pytest.mark.parametrize("content, message", [
    ("", ":0: no results"),
    ('{"policy": "lru", "num_blocks": 5}\n', ":1: missing field 'token_hit_rate'"),
    ('{"policy": "lru", "num_blocks": "5", "token_hit_rate": 0.1}\n', ":1: field 'num_blocks' has the wrong type"),
    ("[1]\n", ":1: expected a JSON object"),
])
def test_bad_results_file_for_plot_exits_2(tmp_path, content, message):
    path = tmp_path / "results.jsonl"
    path.write_text(content)
    result = run("plot", path, "-o", tmp_path / "x.png")
    assert result.exit_code == 2 and f"{path}{message}" in result.output


def test_skip_bad_counts_lines_in_sweep_and_curve(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"tokens": [1, 2, 3, 4]}\nnot json\n{"tokens": [1, 2, 3, 4]}\n')
    row = json.loads(ok("sweep", path, "--capacities", "10", "--page-size", "2", "--skip-bad", "--json").splitlines()[-1])
    assert (row["requests"], row["skipped_lines"], row["hit_tokens"]) == (2, 1, 4)
    assert set(row["miss_tokens_by_reason"]) == set(MISS_REASONS)
    curve = json.loads(ok("curve", path, "--capacities", "10", "--page-size", "2", "--skip-bad",
                          "--json").splitlines()[-1])
    assert curve["hit_tokens"] == [4]

"""The command line as a user meets it: capacity units, compressed and piped traces, output formats,
one-line errors, and default tables that fit 100 columns."""

from __future__ import annotations

import gzip
import json
import sys

import pytest
from click.testing import CliRunner

from radixkv.cli import main
from radixkv.costs import MODELS, kv_bytes_per_page

from ..shared_traces import CONVERSATION

WIDTH = 100


def run(*args, input=None, env=None):
    runner = CliRunner(mix_stderr=False) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else CliRunner()
    return runner.invoke(main, [str(a) for a in args], input=input, env={"COLUMNS": str(WIDTH), **(env or {})})


def ok(*args, **kwargs):
    result = run(*args, **kwargs)
    assert result.exit_code == 0, (args, result.output, result.stderr)
    return result.stdout


def last_json(text):
    row = json.loads(text.strip().splitlines()[-1])
    row.pop("wall_seconds", None)
    return row


def fails(*args, message, **kwargs):
    """Exit 2 with exactly one stderr line, ``radixkv: error: ...`` containing ``message``."""
    result = run(*args, **kwargs)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, (args, result.stderr)
    assert lines[0].startswith("radixkv: error: ") and message in lines[0], (args, lines)
    return lines[0]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """The first 300 requests of the Mooncake conversation trace, plain and gzip."""
    path = tmp_path_factory.mktemp("traces") / "conv300.jsonl"
    with CONVERSATION.open() as src:
        path.write_text("".join(next(src) for _ in range(300)))
    gz = path.with_suffix(".jsonl.gz")
    gz.write_bytes(gzip.compress(path.read_bytes()))
    return path


# ------------------------------------------------------------------ capacity units

def test_max_total_tokens_equals_num_blocks(trace):
    blocks = last_json(ok("replay", trace, "--num-blocks", "187500", "--json", "--quiet"))
    tokens = last_json(ok("replay", trace, "--max-total-tokens", "3000000", "--json", "--quiet"))
    assert tokens == blocks and tokens["num_blocks"] == 187_500
    small = last_json(ok("replay", trace, "--max-total-tokens", "48k", "--json", "--quiet"))
    assert small["num_blocks"] == 3000 and small["evicted_blocks"] > 0  # a capacity that evicts


def test_kv_cache_memory_converts_with_the_model(trace):
    per_page = kv_bytes_per_page(MODELS["llama-3-70b"], 16)
    row = last_json(ok("replay", trace, "--kv-cache-memory", "2GiB", "--model", "llama-3-70b", "--json", "--quiet"))
    assert row["num_blocks"] == 2 * 2**30 // per_page
    assert row == last_json(ok("replay", trace, "--num-blocks", str(2 * 2**30 // per_page), "--model", "llama-3-70b",
                               "--json", "--quiet"))


@pytest.mark.parametrize("args, message", [
    ([], "give exactly one of --num-blocks, --max-total-tokens or --kv-cache-memory"),
    (["--num-blocks", "5", "--max-total-tokens", "80"], "got --num-blocks and --max-total-tokens"),
    (["--num-blocks", "0"], "--num-blocks must be > 0"),
    (["--num-blocks", str(10**13)], "--num-blocks 10000000000000 is 10,000,000,000,000 blocks"),
    (["--max-total-tokens", "8"], "--max-total-tokens 8 is less than one block"),
    (["--kv-cache-memory", "lots"], "--kv-cache-memory must be a size like 40GiB"),
    (["--num-blocks", "100", "--host-blocks", "1MiB"], "--host-blocks 1MiB is less than one block"),
])
def test_bad_capacities_are_one_line_naming_the_flag(trace, args, message):
    fails("replay", trace, *args, "--quiet", message=message)


def test_a_huge_capacity_replays_a_small_trace(trace):
    # The largest a command takes (radixkv.workload.limits.MAX_CAPACITY_BLOCKS); past it: test_cli_bounds
    row = last_json(ok("replay", trace, "--num-blocks", str(2**28), "--json", "--quiet"))
    assert row["num_blocks"] == 2**28 and row["evicted_blocks"] == 0


def test_capacity_shares_of_the_trace(trace):
    rows = [json.loads(line) for line in ok("sweep", trace, "--capacities", "1%,100%", "--policies", "lru",
                                            "--json", "--quiet").splitlines()]
    curve = last_json(ok("curve", trace, "--capacities", "1%,100%", "--json", "--quiet"))
    assert [r["num_blocks"] for r in rows] == curve["capacities"]
    assert rows[1]["evicted_blocks"] == 0 and rows[0]["evicted_blocks"] > 0
    assert rows[1]["num_blocks"] // 100 == rows[0]["num_blocks"]
    assert [r["hit_tokens"] for r in rows] == curve["hit_tokens"]


# ------------------------------------------------------------------ traces: gzip, zstd, stdin

@pytest.mark.parametrize("command", [["replay", "--num-blocks", "3000"], ["sweep", "--capacities", "3000,9000"],
                                     ["curve", "--capacities", "3000,9000"],
                                     ["cluster", "--num-blocks", "3000", "--instances", "2"]])
def test_gzip_and_stdin_read_like_the_plain_file(trace, command):
    name, *rest = command
    plain = ok(name, trace, *rest, "--format", "json")
    gz = ok(name, trace.with_suffix(".jsonl.gz"), *rest, "--format", "json")
    piped = ok(name, "-", *rest, "--format", "json", input=trace.read_bytes())
    piped_gz = ok(name, "-", *rest, "--format", "json", input=trace.with_suffix(".jsonl.gz").read_bytes())

    def numbers(text):
        rows = [json.loads(line) for line in text.strip().splitlines()]
        return [{k: v for k, v in r.items() if k not in ("wall_seconds", "trace")} for r in rows]

    assert numbers(gz) == numbers(plain) == numbers(piped) == numbers(piped_gz)


def test_a_corrupt_or_misnamed_compressed_trace_names_the_file(trace, tmp_path):
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(trace.with_suffix(".jsonl.gz").read_bytes()[:3000])
    fails("replay", truncated, "--num-blocks", "100", "--quiet", message=f"{truncated}:")
    misnamed = tmp_path / "plain.jsonl.gz"
    misnamed.write_bytes(trace.read_bytes())
    fails("replay", misnamed, "--num-blocks", "100", "--quiet", message=f"{misnamed}:0: named like a gzip file")


def test_zstd_without_zstandard_is_a_clear_error(trace, tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 16)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import fails as if not installed
    fails("replay", path, "--num-blocks", "100", "--quiet", message=f"{path}:0: is zstd-compressed; reading it "
                                                                     "needs the zstandard package")


# ------------------------------------------------------------------ output formats and errors

def test_formats_and_columns(trace):
    table = ok("replay", trace, "--num-blocks", "3000", "--quiet")
    assert "wall_seconds" not in table and "| lru    |" in table and "%" in table
    csv = ok("replay", trace, "--num-blocks", "3000", "--quiet", "--format", "csv", "--columns",
             "policy,hit_tokens,token_hit_rate,wall_seconds").splitlines()
    row = last_json(ok("replay", trace, "--num-blocks", "3000", "--quiet", "--json"))
    assert csv[0] == "policy,hit_tokens,token_hit_rate,wall_seconds"
    assert csv[1].split(",")[:3] == ["lru", str(row["hit_tokens"]), repr(row["token_hit_rate"])]
    md = ok("sweep", trace, "--capacities", "3k", "--policies", "lru,fifo", "--quiet", "--format", "md").splitlines()
    assert md[1].startswith("|:-------|") and md[1].endswith(":|") and len(md) == 4
    fails("replay", trace, "--num-blocks", "3000", "--quiet", "--columns", "nope", message="--columns: unknown column")
    fails("replay", trace, "--num-blocks", "3000", "--quiet", "--json", "--format", "csv", message="disagree")
    # a trace format given to --format still reads the trace that way
    assert last_json(ok("replay", trace, "--num-blocks", "3000", "--format", "mooncake", "--json", "--quiet")) == row


@pytest.mark.parametrize("args, message", [
    (["replay", "missing.jsonl", "--num-blocks", "5"], "missing.jsonl"),
    (["replay", "TRACE", "--num-blocks", "5", "--page-size", "0"], "'--page-size'"),
    (["replay", "TRACE", "--num-blocks", "5", "--policy", "nope"], "'--policy': unknown policy 'nope'"),
    (["replay", "TRACE", "--num-blocks", "5", "--no-such-flag"], "No such option '--no-such-flag'"),
    (["replay"], "Missing argument 'TRACE'"),
    (["nope"], "No such command 'nope'"),
    (["sweep", "TRACE", "--capacities", "150%"], "--capacities: capacity: a share must be in"),
])
def test_every_error_is_one_line(trace, args, message):
    fails(*[trace if a == "TRACE" else a for a in args], message=message)


def test_help_still_exits_0():
    assert "replay" in ok("--help") and "--max-total-tokens" in ok("replay", "--help")


# ------------------------------------------------------------------ default tables fit 100 columns

@pytest.mark.parametrize("args", [
    ["replay", "TRACE", "--num-blocks", "3000"],
    ["replay", "TRACE", "--num-blocks", "3000", "--host-blocks", "3000", "--remote-hosts", "2",
     "--remote-blocks", "3000"],
    ["sweep", "TRACE", "--capacities", "1%,10%,100%", "--policies", "lru,s3fifo,belady"],
    ["curve", "TRACE", "--capacities", "1%,10%,100%"],
    ["cluster", "TRACE", "--num-blocks", "3000", "--host-blocks", "3000", "--borrowing"],
    ["demo", "--requests", "150", "--out-dir", "OUT"],
])
def test_default_tables_fit_100_columns(trace, tmp_path, args):
    text = ok(*[trace if a == "TRACE" else tmp_path / "out" if a == "OUT" else a for a in args], "--quiet")
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) >= 3 and max(map(len, table)) <= WIDTH, "\n".join(line for line in table if len(line) > WIDTH)
    assert "%" in text and "wall_seconds" not in text


def test_columns_can_show_capacity_and_wall_time(trace):
    lines = ok("replay", trace, "--max-total-tokens", "48k", "--quiet", "--columns",
               "num_blocks,capacity_tokens,wall_seconds").splitlines()
    assert lines[0].split("|")[1:4] == [" num_blocks ", " cap_tokens ", " wall_seconds "]
    assert lines[2].split("|")[1:3] == ["      3,000 ", "     48,000 "]
    cluster = ok("cluster", trace, "--num-blocks", "3000", "--instances", "2", "--format", "csv",
                 "--columns", "num_blocks,capacity_tokens,capacity_gib").splitlines()
    assert cluster[0] == "num_blocks,capacity_tokens,capacity_gib" and cluster[1].startswith("3000,48000,")

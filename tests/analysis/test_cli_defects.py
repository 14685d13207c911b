"""Small defects of the command line, each pinned: a closed pipe, files named by their flag, an attack
with nothing to measure, numbers in one notation, policy names in the help, and the API's extras."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixkv.cli import main
from radixkv.errors import MissingExtraError

from ..shared_traces import conversation_head
from .test_tool_cli import fails, ok, run

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return conversation_head(tmp_path_factory.mktemp("traces"), 200)


@pytest.mark.parametrize("args", [
    ["replay", "{t}", "--num-blocks", "1k"],
    ["sweep", "{t}", "--policies", "lru,fifo", "--capacities", "100,1k", "--jobs", "1"],
    ["cluster", "{t}", "--num-blocks", "1k", "--instances", "2"],
    ["curve", "{t}"],
    ["gen", "rag", "--num-requests", "3000"],
])
def test_a_reader_that_stops_early_is_no_error(trace, args):
    """`radixkv ... | head -1` with the reader gone before the first line: no stderr, exit 0."""
    argv = [sys.executable, "-m", "radixkv", *(a.format(t=trace) for a in args), "--quiet"] if args[0] != "gen" \
        else [sys.executable, "-m", "radixkv", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader stops before anything is written: every write meets a broken pipe
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and stderr == "", (args, stderr)


def test_a_missing_trace_names_the_argument(tmp_path):
    line = fails("replay", tmp_path / "nope.jsonl", "--num-blocks", "10", message="TRACE ")
    assert "no such file" in line and "Errno" not in line
    fails("attack", "--workload", tmp_path / "nope.jsonl", message="--workload ")
    fails("plot", tmp_path / "nope.jsonl", message="RESULTS ")


def test_output_flags_create_missing_folders(trace, tmp_path):
    ok("replay", trace, "--num-blocks", "1k", "--quiet", "--records", tmp_path / "a" / "b" / "r.jsonl")
    ok("sweep", trace, "--policies", "lru", "--capacities", "1k", "--quiet", "-o", tmp_path / "c" / "s.jsonl")
    ok("gen", "rag", "--num-requests", "5", "-o", tmp_path / "d" / "g.jsonl")
    assert len((tmp_path / "a" / "b" / "r.jsonl").read_text().splitlines()) == 200
    assert (tmp_path / "c" / "s.jsonl").read_text().count("\n") == 1
    assert (tmp_path / "d" / "g.jsonl").read_text().count("\n") == 5


def test_an_output_that_cannot_be_written_names_its_flag(trace, tmp_path):
    (tmp_path / "file").write_text("")
    fails("replay", trace, "--num-blocks", "1k", "--quiet", "--records", tmp_path / "file" / "r.jsonl",
          message="--records ")
    fails("sweep", trace, "--policies", "lru", "--capacities", "1k", "--quiet", "-o", tmp_path / "file" / "x",
          message="--output ")


def test_attack_on_a_trace_without_the_attacker_fails(trace, tmp_path):
    fails("attack", "--workload", trace, message="no request of the attacker tenant 'attacker'")
    path = tmp_path / "mt.jsonl"
    ok("gen", "multitenant", "--num-requests", "60", "-o", path)
    fails("attack", "--workload", path, "--attacker", "bob", message="'bob'")
    assert '"probes"' in ok("attack", "--workload", path)


def test_prose_numbers_are_the_tables_notation(trace):
    out = ok("replay", trace, "--num-blocks", "100", "--quiet")
    saved = next(line for line in out.splitlines() if line.startswith("prefill saved"))
    assert "e+" not in saved and "e-" not in saved
    capacity = next(line for line in out.splitlines() if line.startswith("capacity:"))
    table_gib = out.splitlines()[2].split("|")[4].strip()  # 100 blocks at page 16 of llama-3-8b: 0.20 GiB
    assert f"= {table_gib} GiB" in capacity, (capacity, table_gib)


def test_replay_and_sweep_csv_share_their_columns(trace):
    replay_csv = ok("replay", trace, "--num-blocks", "100", "--quiet", "--format", "csv").splitlines()
    sweep_csv = ok("sweep", trace, "--policies", "lru", "--capacities", "100", "--quiet", "--format",
                   "csv").splitlines()
    assert replay_csv[0] == sweep_csv[0] and "prefill_pflops_saved" in replay_csv[0]
    assert replay_csv[1] == sweep_csv[1]


def test_policy_help_lists_the_names():
    from radixkv import policies

    for command, flag in (("replay", "--policy"), ("cluster", "--policy"), ("sweep", "--policies")):
        text = " ".join(run(command, "--help").stdout.split())
        for name in policies.available():
            assert any(f" {name}{end}" in text for end in ",.;"), (command, name)


def test_curve_model_is_a_choice(trace):
    fails("curve", trace, "--model", "gpt-5", message="--model")


def test_to_dataframe_without_pandas_says_what_to_install(monkeypatch):
    from radixkv.api import Records

    real_import = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas":
            raise ModuleNotFoundError("No module named 'pandas'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setitem(sys.modules, "pandas", None)
    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(MissingExtraError, match="pip install pandas"):
        Records([]).to_dataframe()


def test_the_tiers_snippet_runs_and_prints_its_comment(capsys):
    import re

    text = README.read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "RemoteTier(" in b)
    exec(compile(block, str(README), "exec"), {})
    promised = re.search(r"^print\(.*#\s*(.*)$", block, re.M).group(1)
    assert capsys.readouterr().out.strip() == promised
    assert "RemoteTier(num_blocks" not in text


def test_cluster_borrowing_prints_its_lending_figures(trace):
    """``cluster --borrowing``'s table output says what was lent, recalled and hit in borrowed memory: the
    JSON's figures (the table had only ``bytes_lent``, which a 100-column terminal drops)."""
    import json

    args = ("cluster", trace, "--instances", "4", "--num-blocks", "300", "--borrowing", "--quiet")
    got = json.loads(ok(*args, "--json"))
    out = ok(*args)
    assert got["blocks_lent"] > 0
    assert (f"lending: {got['blocks_lent']:,} blocks lent ({got['bytes_lent'] / 2**30:,.2f} GiB), "
            f"{got['blocks_recalled']:,} recalled, {got['blocks_moved']:,} moved, {got['refusals']:,} refused") in out
    assert f"borrowed memory: {got['borrowed_hit_tokens']:,} hit tokens" in out
    assert "lending:" not in ok("cluster", trace, "--instances", "4", "--num-blocks", "300", "--quiet")

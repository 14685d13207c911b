"""`radixkv replay` with tiers and `radixkv cluster`, on the head of the Mooncake conversation trace."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from radixkv.cli import main

from ..shared_traces import CONVERSATION

TRACE = str(CONVERSATION)


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def cyclic_trace(tmp_path):
    """Six 8-page prompts visited round robin: reuse distance 48 pages, so 24 HBM + 24 host blocks hit."""
    path = tmp_path / "cyclic.jsonl"
    lines = [json.dumps({"tokens": [p * 1000 + i for i in range(16 * 8)]}) for _ in range(5) for p in range(6)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_replay_with_tiers_reports_hits_by_tier_and_bytes(cyclic_trace):
    code, out = run("replay", cyclic_trace, "--num-blocks", "24", "--host-blocks", "24",
                    "--json", "--quiet", "--load-back", "always")
    assert code == 0, out
    row = json.loads(out.strip().splitlines()[-1])
    assert row["hit_tokens"] == sum(row["hit_tokens_by_tier"].values())
    assert row["hit_tokens_by_tier"]["host"] > 0
    assert row["bytes_by_link"]["pcie"] == sum(row["bytes_by_route"].values()) and row["transfer_seconds"] > 0
    code, out = run("replay", cyclic_trace, "--num-blocks", "48", "--json", "--quiet")
    assert json.loads(out.strip().splitlines()[-1])["hit_tokens"] == row["hit_tokens"]  # one LRU of a + b
    code, out = run("replay", cyclic_trace, "--num-blocks", "24", "--json", "--quiet")
    assert json.loads(out.strip().splitlines()[-1])["hit_tokens"] == 0  # HBM alone thrashes


def test_plain_replay_json_is_unchanged():
    code, out = run("replay", TRACE, "--num-blocks", "3000", "--limit", "50", "--json", "--quiet")
    assert code == 0 and "hit_tokens_by_tier" not in json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("args, message", [
    (["--remote-blocks", "5"], "--remote-blocks 5 needs --remote-hosts N or --redis URL"),
    (["--remote-hosts", "2"], "--remote-hosts needs --remote-blocks N"),
    (["--redis", "redis://127.0.0.1:1/0"], "--redis needs --remote-blocks N"),
    (["--redis", "redis://127.0.0.1:1/0", "--remote-hosts", "2", "--remote-blocks", "4"],
     "--remote-hosts 2 does not match the 1 --redis URL(s)"),
    (["--host-blocks", "-3"], "-3"),
    (["--write-policy", "write_around"], "write_around"),
])
def test_bad_tier_options_exit_2_with_one_line(args, message):
    code, out = run("replay", TRACE, "--num-blocks", "100", "--limit", "2", "--quiet", *args)
    assert code == 2 and message in out


def test_cluster_command_json():
    code, out = run("cluster", TRACE, "--instances", "2", "--num-blocks", "2000", "--limit", "100",
                    "--routing", "cache_aware", "--borrowing", "--json")
    assert code == 0, out
    row = json.loads(out.strip().splitlines()[-1])
    assert row["requests"] == 100 and sum(row["requests_by_instance"]) == 100
    assert row["hit_tokens"] == sum(row["hit_tokens_by_tier"].values()) and row["bytes_lent"] >= 0


@pytest.mark.parametrize("command, extra", [
    ("replay", ["--num-blocks", "24", "--host-blocks", "24", "--quiet"]),
    ("cluster", ["--instances", "2", "--num-blocks", "8", "--host-blocks", "16"]),  # 24 pages per instance
])
@pytest.mark.parametrize("policy", ["gdsf", "s3fifo"])
def test_policy_ranks_the_host_tier_from_the_command_line(cyclic_trace, command, extra, policy):
    code, out = run(command, cyclic_trace, "--policy", policy, "--json", *extra)
    assert code == 0, out
    row = json.loads(out.strip().splitlines()[-1])
    assert row["hit_tokens"] == sum(row["hit_tokens_by_tier"].values())
    assert row["hit_tokens_by_tier"]["host"] > 0

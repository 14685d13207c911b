"""A failing remote tier shows in `radixkv replay`'s table, JSON and stderr (issue 11.13)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import radixkv.cli as cli
from radixkv.tiers import remote
from radixkv.testing.localredis import LocalRedis

from .test_redis import _require_redis
from .test_tiers_cli import cyclic_trace  # noqa: F401  (fixture: six 8-page prompts, round robin)


class FlakyHosts(remote.SimulatedHosts):
    """Every third get raises a plain error (a backend bug); host 1 dies at the 10th put."""

    def __init__(self, num_hosts: int) -> None:
        super().__init__(num_hosts)
        self.gets = self.puts = 0

    def get(self, host, slots):
        self.gets += 1
        if self.gets % 3 == 0:
            raise RuntimeError("disk on fire")
        return super().get(host, slots)

    def put(self, host, slots, values):
        self.puts += 1
        if self.puts == 10:
            self.kill(1)
        return super().put(host, slots, values)


def replay(trace: str, *args: str):
    return CliRunner().invoke(cli.main, ["replay", trace, "--num-blocks", "24", "--load-back", "always",
                                         "--quiet", *args])


def json_row(result) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_healthy_remote_reports_zero_faults_and_warns_nothing(cyclic_trace):
    result = replay(cyclic_trace, "--remote-hosts", "2", "--remote-blocks", "24", "--json")
    assert result.exit_code == 0 and result.stderr == ""
    row = json_row(result)
    assert row["hit_tokens_by_tier"]["remote"] > 0
    assert (row["backend_errors"], row["lost_hosts"], row["lost_pages"], row["last_backend_error"]) == (0, [], 0, None)


def test_a_failing_simulated_backend_is_in_the_json_the_table_and_one_stderr_line(cyclic_trace, monkeypatch):
    monkeypatch.setattr(remote, "SimulatedHosts", FlakyHosts)
    result = replay(cyclic_trace, "--remote-hosts", "2", "--remote-blocks", "24", "--json")
    assert result.exit_code == 0, result.output
    row = json_row(result)
    assert row["backend_errors"] > 0 and "disk on fire" in row["last_backend_error"]
    assert row["lost_hosts"] == ["remote host 1"] and row["lost_pages"] > 0
    warning = result.stderr.splitlines()
    assert len(warning) == 1 and warning[0].startswith("radixkv: warning: remote host(s) lost: remote host 1")
    assert f"{row['backend_errors']} remote backend call(s) failed" in warning[0]

    table = replay(cyclic_trace, "--remote-hosts", "2", "--remote-blocks", "24")
    assert table.exit_code == 0 and len(table.stderr.splitlines()) == 1
    header, _, values = table.stdout.split("| hit_tokens_by_tier")[1].splitlines()[:3]
    cells = dict(zip([c.strip() for c in ("hit_tokens_by_tier" + header).split("|")],
                     [c.strip() for c in values.strip("|").split("|")]))
    assert cells["backend_errors"] == str(row["backend_errors"]) and cells["lost_hosts"] == "1"
    assert cells["lost_pages"] == str(row["lost_pages"]) and cells["dropped_pages"] == str(row["dropped_pages"])


@pytest.fixture
def server():
    _require_redis()
    started = LocalRedis()
    try:
        yield started
    finally:
        started.stop()


def test_a_redis_server_killed_mid_replay_is_reported(cyclic_trace, server, monkeypatch):
    real_replay = cli.replay

    def killing_replay(requests, cache, *, on_request=None, **kw):
        seen = []

        def hook(request, hit):
            seen.append(hit)
            if len(seen) == 20:  # two rounds in: the remote holds pages and serves hits
                server.kill()
            if on_request is not None:
                on_request(request, hit)
        return real_replay(requests, cache, on_request=hook, **kw)

    monkeypatch.setattr(cli, "replay", killing_replay)
    result = replay(cyclic_trace, "--redis", server.url, "--remote-blocks", "64", "--json")
    assert result.exit_code == 0, result.output
    row = json_row(result)
    assert row["requests"] == 30 and row["hit_tokens_by_tier"]["remote"] > 0
    assert row["lost_hosts"] == [server.url] and row["lost_pages"] > 0
    warning = result.stderr.splitlines()
    assert len(warning) == 1 and warning[0].startswith(f"radixkv: warning: remote host(s) lost: {server.url} (")

"""Every size and count option of every command has an upper bound, stated in its --help and
checked before any work: a value past it is one line, ``radixkv: error: ...`` naming the flag,
and exit 2 (review issue 29, item 5: a page size of 2**40, 10**20 remote hosts or 10**8
instances died with a MemoryError or OverflowError traceback, or ran into the OOM killer)."""

from __future__ import annotations

import click
import pytest

from radixkv.cli import main

from .test_tool_cli import fails, last_json, ok

SIZE_OPTIONS = {"page_size", "num_blocks", "max_total_tokens", "kv_cache_memory", "host_blocks", "remote_hosts",
                "remote_blocks", "redis_urls", "instances", "limit", "jobs", "num_requests", "capacities", "k",
                "budget", "store_blocks", "processes", "warmup", "interval", "num_sessions", "event_lag"}
"""The options that size a run or count something in it; each must state its bound."""

NOT_SIZES = {"seed"}
"""Integer options that are no size (any non-negative seed is as cheap as another)."""


@pytest.fixture()
def trace(tmp_path):
    path = tmp_path / "scan.jsonl"
    ok("gen", "scan", "--num-requests", 8, "--param", "prompt_tokens=64", "-o", path)
    return path


class Reached(Exception):
    """Raised by the stand-ins of :func:`no_work`: the command got past its checks."""


@pytest.fixture()
def no_work(monkeypatch):
    """Make the expensive steps raise :class:`Reached`, so a value the command does not refuse
    fails fast instead of allocating 10**20 hosts or generating 2**32 requests."""
    import radixkv.analysis.sweep as sweep
    import radixkv.cluster as cluster
    import radixkv.tiers.config as config
    import radixkv.workload.generators as generators

    def reached(*args, **kwargs):
        raise Reached("the command went on to work")

    for module, name in ((generators, "generate"), (config, "build_cache"), (cluster, "Cluster"),
                         (sweep, "run_sweep"), (sweep, "trace_curve")):
        monkeypatch.setattr(module, name, reached)


def test_every_size_or_count_option_states_its_bound_in_help():
    missing, unlisted = [], []
    for name, command in main.commands.items():
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            is_int = isinstance(param.type, (click.types.IntParamType, click.IntRange))
            if param.name in SIZE_OPTIONS and "at most" not in (param.help or ""):
                missing.append(f"{name} {param.opts[0]}")
            if is_int and param.name not in SIZE_OPTIONS | NOT_SIZES:
                unlisted.append(f"{name} {param.opts[0]}")
    assert not missing, f"no bound in --help: {missing}"
    assert not unlisted, f"integer options neither bounded nor listed as no size: {unlisted}"


def test_the_help_spells_the_bound():
    text = " ".join(ok("replay", "--help").split())
    assert "at most 2**16" in text  # --page-size
    assert "at most 1,024" in " ".join(ok("cluster", "--help").split())  # --instances


BIG = 10**20


@pytest.mark.parametrize("args, flag", [
    (["replay", "{trace}", "--num-blocks", 100, "--page-size", 2**16 + 1], "--page-size"),
    (["replay", "{trace}", "--num-blocks", 100, "--page-size", 2**40], "--page-size"),
    (["replay", "{trace}", "--num-blocks", 2**28 + 1], "--num-blocks"),
    (["replay", "{trace}", "--max-total-tokens", (2**28 + 1) * 16], "--max-total-tokens"),
    (["replay", "{trace}", "--kv-cache-memory", "1000TiB"], "--kv-cache-memory"),
    (["replay", "{trace}", "--num-blocks", 100, "--host-blocks", 2**28 + 1], "--host-blocks"),
    (["replay", "{trace}", "--num-blocks", 100, "--remote-hosts", 1025, "--remote-blocks", 10], "--remote-hosts"),
    (["replay", "{trace}", "--num-blocks", 100, "--remote-hosts", BIG, "--remote-blocks", 10], "--remote-hosts"),
    (["replay", "{trace}", "--num-blocks", 100, "--remote-hosts", 1, "--remote-blocks", 2**28 + 1],
     "--remote-blocks"),
    (["replay", "{trace}", "--num-blocks", 100, "--remote-blocks", 10]
     + [a for i in range(1025) for a in ("--redis", f"redis://127.0.0.1:1/{i}")], "--redis"),
    (["replay", "{trace}", "--num-blocks", 100, "--limit", 2**32 + 1], "--limit"),
    (["sweep", "{trace}", "--capacities", 100, "--jobs", 65], "--jobs"),
    (["sweep", "{trace}", "--capacities", f"100,{2**28 + 1}"], "--capacities"),
    (["sweep", "{trace}", "--capacities", 100, "--page-size", 2**40], "--page-size"),
    (["curve", "{trace}", "--capacities", f"{2**28 + 1}"], "--capacities"),
    (["curve", "{trace}", "--page-size", 2**40], "--page-size"),
    (["curve", "{trace}", "--limit", BIG], "--limit"),
    (["cluster", "{trace}", "--num-blocks", 100, "--instances", 1025], "--instances"),
    (["cluster", "{trace}", "--num-blocks", 100, "--instances", 10**8], "--instances"),
    (["cluster", "{trace}", "--num-blocks", 100, "--instances", BIG], "--instances"),
    (["cluster", "{trace}", "--num-blocks", 2**28, "--instances", 8], "--instances"),  # 2**31 blocks in all
    (["cluster", "{trace}", "--num-blocks", 100, "--host-blocks", 2**28 + 1], "--host-blocks"),
    (["cluster", "{trace}", "--num-blocks", 100, "--page-size", 2**40], "--page-size"),
    (["gen", "scan", "--num-requests", 2**32 + 1], "--num-requests"),
    (["attack", "--num-requests", 100_001], "--num-requests"),
    (["attack", "--num-requests", 10, "--page-size", 2**40], "--page-size"),
    (["attack", "--num-requests", 10, "--num-blocks", 2**28 + 1], "--num-blocks"),
    (["attack", "--num-requests", 10, "--sharing", "k-anonymous", "--k", 2**16 + 1], "--k"),
    (["attack", "--num-requests", 10, "--sharing", "adaptive", "--budget", 2**32 + 1], "--budget"),
    (["demo", "--requests", 100_001], "--requests"),
    (["demo", "--requests", 10, "--page-size", 2**40], "--page-size"),
])
def test_past_a_bound_is_one_line_naming_the_flag(trace, no_work, args, flag):
    args = [str(trace) if a == "{trace}" else a for a in args]
    line = fails(*args, "--quiet", message=flag) if args[0] not in ("gen",) else fails(*args, message=flag)
    assert "at most" in line or "more than" in line, line


def test_the_bounds_themselves_are_accepted(trace):
    assert last_json(ok("replay", trace, "--num-blocks", 2**28, "--page-size", 2**16, "--limit", 2**32,
                        "--json", "--quiet"))["num_blocks"] == 2**28
    ok("sweep", trace, "--capacities", f"10,{2**28}", "--jobs", 64, "--json", "--quiet")
    ok("replay", trace, "--num-blocks", 100, "--remote-hosts", 1024, "--remote-blocks", 2**28, "--json", "--quiet")


def test_a_command_holding_a_whole_workload_refuses_one_past_the_token_bound(trace, tmp_path, monkeypatch):
    """demo and attack hold every request: past MAX_HELD_TOKENS prompt tokens (lowered here) they stop
    with one line naming what to lower, before the memory goes."""
    import radixkv.cli as cli

    monkeypatch.setattr(cli, "MAX_HELD_TOKENS", 500, raising=False)
    fails("attack", "--num-requests", 100, "--json", message="(--num-requests, --param)")
    fails("attack", "--workload", trace, "--json", message=str(trace))
    fails("demo", "--requests", 100, "--out-dir", tmp_path, "--quiet", message="--requests")

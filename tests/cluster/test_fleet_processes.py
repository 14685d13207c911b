"""A fleet that really runs as OS processes (radixkv.fleet, ``radixkv cluster --processes``), against the simulator.

Real worker processes and a real redis-server on loopback: the same hits, misses and tiers as the
in-process ``Cluster(..., store="memory")``, every hit page's bytes checked (``wrong_pages`` 0), the
redis-server the command starts is gone when it ends, and a killed worker ends the run in one line
with nothing left behind. Like the other Redis tests, a missing redis-server fails these under
``CI=true`` and skips them elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import numpy as np
import pytest
from click.testing import CliRunner

from radixkv.cli import main
from radixkv.errors import ArgumentValueError
from radixkv.cluster import Cluster
from radixkv.fleet import Fleet, FleetError, page_payloads, replay_fleet
from radixkv.page_keys import PrefixKeys
from radixkv.testing.localredis import LocalRedis
from radixkv.workload.generators import generate, write_token_jsonl
from radixkv.workload.traces import Request

from ..tiers.test_redis import _require_redis

PS = 4
BLOCKS = 40  # per instance: small, so pages are evicted and come back from the store


def conversations(num: int = 5, turns: int = 6, seed: int = 0) -> List[Request]:
    """``num`` conversations in two namespaces (and none), served turn by turn: with an odd ``num`` and two
    instances, each turn lands on the other instance than the turn before, so its history is
    served only through the store."""
    rng = np.random.default_rng(seed)
    history = [rng.integers(0, 1000, size=int(rng.integers(5, 40)), dtype=np.uint32) for _ in range(num)]
    out = []
    for _ in range(turns):
        for c in range(num):
            history[c] = np.concatenate([history[c], rng.integers(0, 1000, size=int(rng.integers(3, 30)),
                                                                  dtype=np.uint32)])
            out.append(Request(history[c].copy(), namespace=(None, "a", "b")[c % 3]))
    return out


STORE_BLOCKS = 120  # the store's bound in the command's run: about half the pages the trace stores


def simulate(requests: List[Request], instances: int = 2, store_blocks=None):
    """The in-process simulator's result for the same fleet (round robin, one in-process store)."""
    return Cluster(instances, BLOCKS, PS, store="memory", store_blocks=store_blocks).replay(requests,
                                                                                          miss_reasons=True)


def assert_same_serving(got: dict, want: dict) -> None:
    """Every field of the simulator's result alike but the wall time and the store's URL and counters
    (a Redis store's bytes carry the workers' payloads, and its first contact costs a round trip)."""
    for field, value in want.items():
        if field not in ("wall_seconds", "store", "store_stats"):
            assert got[field] == (pytest.approx(value) if isinstance(value, float) else value), field


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def children(pid: int) -> List[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def radixkv(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "radixkv", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """The multi-turn trace through ``radixkv cluster --processes 2 --json`` with no --store: (requests, JSON)."""
    _require_redis()
    requests = conversations()
    path = tmp_path_factory.mktemp("fleet") / "turns.jsonl"
    write_token_jsonl(requests, str(path))
    proc = radixkv("cluster", str(path), "--processes", "2", "--num-blocks", str(BLOCKS), "--page-size", str(PS),
                   "--store-blocks", str(STORE_BLOCKS), "--json", "--quiet")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return requests, json.loads(out)


def test_processes_serve_exactly_what_the_simulator_serves(cli_run):
    requests, got = cli_run
    want = simulate(requests, store_blocks=STORE_BLOCKS).as_dict()
    assert_same_serving(got, want)  # the server's LRU evicts exactly what the in-process store's does
    assert got["store_stats"]["evictions"] == want["store_stats"]["evictions"] > 0
    assert got["store_hit_tokens"] > 0  # every turn's history comes from the other instance: through the store
    assert got["processes"] == 2 and got["instances"] == 2
    assert got["wrong_pages"] == 0 and got["verified_pages"] == got["hit_tokens"] // PS
    assert got["store_stats"]["integrity_misses"] == 0 and got["store_stats"]["backend_errors"] == 0


def test_the_command_starts_and_stops_its_own_redis_server(cli_run):
    _, got = cli_run
    assert got["store"].startswith("redis://127.0.0.1:")
    port = int(got["store"].rsplit(":", 1)[1].split("/")[0])
    assert not listening(port)  # stopped with the command (it was serving: the store hits came from it)
    assert got["store_capacity_pages"] == STORE_BLOCKS and got["store"].endswith(f"?capacity={STORE_BLOCKS}")


def test_a_given_store_url_a_host_tier_and_the_records():
    """The library face over a server the caller runs, with a host tier in each process: the same totals
    and per-request records as the simulator."""
    _require_redis()
    requests = conversations(3, 5, seed=1) + list(generate("mix", 0, 60))
    want_records: list = []
    want = Cluster(2, BLOCKS, PS, host_blocks=30, store="memory").replay(
        requests, miss_reasons=True, on_record=lambda r, i: want_records.append((r, i)))
    assert want.hit_tokens_by_tier["host"] > 0
    got_records: list = []
    seen: list = []
    with LocalRedis() as server:
        result = replay_fleet(requests, 2, BLOCKS, PS, host_blocks=30, store=server.url, miss_reasons=True,
                              on_record=lambda r, i: got_records.append((r, i)), on_request=lambda r, h: seen.append(h))
        assert listening(server.port)  # the fleet leaves a server it was given alone
    assert_same_serving(result.cluster.as_dict(), want.as_dict())
    assert result.wrong_pages == 0 and result.store_capacity_pages is None
    assert got_records == want_records and seen == [r.hit_tokens for r, _ in want_records]


def test_a_killed_worker_ends_the_command_in_one_line_leaving_nothing_behind(tmp_path):
    _require_redis()
    path = tmp_path / "long.jsonl"
    write_token_jsonl(generate("mix", 1, 4000), str(path))
    proc = radixkv("cluster", str(path), "--processes", "2", "--num-blocks", "400", "--page-size", "16", "--quiet")
    try:
        workers: List[int] = []
        server: Optional[int] = None
        port = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (len(workers) == 2 and port):
            kids = children(proc.pid)
            workers = [k for k in kids if "spawn_main" in cmdline(k)]
            server = next((k for k in kids if "redis-server" in cmdline(k)), None)
            found = re.search(r"(?:127\.0\.0\.1:|--port )(\d+)", cmdline(server)) if server else None
            port = int(found.group(1)) if found else None
            time.sleep(0.05)
        assert len(workers) == 2 and port, "the fleet did not start"
        import redis

        client = redis.Redis(port=port, socket_timeout=5)
        while client.dbsize() == 0 and time.monotonic() < deadline:  # serving
            time.sleep(0.05)
        client.close()
        os.kill(workers[1], signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2
    assert err.count("\n") == 1 and err.startswith("radixkv: error: worker ")
    assert f"(pid {workers[1]}) died (killed by signal 9)" in err
    assert not listening(port) and not alive(server) and not any(alive(w) for w in workers)


def test_a_killed_worker_raises_at_once_from_the_library():
    _require_redis()
    requests = list(generate("mix", 2, 400))
    with Fleet(2, 200, 16) as fleet:
        pid, port = fleet.workers[1].pid, fleet.server.port

        def kill(request, hit, served=[0]):
            served[0] += 1
            if served[0] == 20:
                os.kill(pid, signal.SIGKILL)

        start = time.monotonic()
        with pytest.raises(FleetError, match=rf"^worker 1 \(pid {pid}\) died \(killed by signal 9\)"):
            fleet.replay(requests, on_request=kill)
        assert time.monotonic() - start < 10
    assert not listening(port)


def test_a_hung_worker_is_named_after_the_timeout():
    _require_redis()
    with Fleet(2, 200, 16, timeout=1.5) as fleet:
        pid = fleet.workers[0].pid
        os.kill(pid, signal.SIGSTOP)  # stopped, not dead: only the timeout can tell
        try:
            with pytest.raises(FleetError, match=rf"^worker 0 \(pid {pid}\) did not serve request 0 within 1.5 s$"):
                fleet.replay(generate("mix", 3, 50))
        finally:
            os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("flags,message", [
    (["--routing", "cache_aware"], "--routing cache_aware is not supported"),
    (["--routing", "kv_events", "--event-lag", "2"], "--event-lag delays the KV events of the simulator's --routing "
                                                     "kv_events; got --processes"),
    (["--borrowing"], "--borrowing is not supported"),
    (["--global-index"], "--global-index is not supported"),
    (["--policy", "belady"], "--policy belady is not supported"),
    (["--instances", "3"], "--processes 2 runs one instance a process: --instances 3 differs"),
    (["--store", "memory"], "--processes needs a store the processes share"),
    (["--store", "redis://127.0.0.1:1?capacity=5", "--store-blocks", "10"], "give the store's page bound once"),
])
def test_what_processes_cannot_do_is_refused_in_one_line(tmp_path, flags, message):
    path = tmp_path / "t.jsonl"
    write_token_jsonl(generate("mix", 0, 3), str(path))
    result = CliRunner().invoke(main, ["cluster", str(path), "--processes", "2", *flags])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and message in result.output, result.output


def test_without_redis_server_the_command_says_what_to_install(tmp_path):
    path = tmp_path / "t.jsonl"
    write_token_jsonl(generate("mix", 0, 3), str(path))
    result = CliRunner(env={"PATH": str(tmp_path)}).invoke(main, ["cluster", str(path), "--processes", "2"])
    assert result.exit_code == 2
    assert result.output == ("radixkv: error: --processes needs a redis-server on PATH (apt-get install "
                             "redis-server) or --store redis://HOST:PORT\n")


def test_a_page_payload_is_a_finite_function_of_its_namespace_and_prefix():
    keys = PrefixKeys(PS, seed=7)
    tokens = np.arange(12, dtype=np.uint32)
    a = page_payloads(keys.keys(tokens, 3), PS)
    assert a.shape == (3, PS, 1) and a.dtype == np.float16 and np.isfinite(a).all()
    assert np.array_equal(a.view(np.uint16), page_payloads(keys.keys(tokens, 3), PS).view(np.uint16))
    for other in (page_payloads(keys.keys(tokens, 3, "ns"), PS), page_payloads(keys.keys(tokens[::-1].copy(), 3), PS)):
        assert not (other.view(np.uint16) == a.view(np.uint16)).all(axis=(1, 2)).any()


# --------------------------------------------------------------------- the fleet over Mooncake Store
def test_processes_over_a_mooncake_master_they_start_serve_what_the_simulator_serves(tmp_path):
    """``--processes 2 --store mooncake``: a Mooncake master and storage node started for the run (and stopped
    after it), every hit page's bytes checked, the same serving as the simulator's unbounded store."""
    from ..store.test_store_mooncake import _require_mooncake

    _require_mooncake()
    requests = conversations(seed=3)
    path = tmp_path / "turns.jsonl"
    write_token_jsonl(requests, str(path))
    proc = radixkv("cluster", str(path), "--processes", "2", "--num-blocks", str(BLOCKS), "--page-size", str(PS),
                   "--store", "mooncake", "--json", "--quiet")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    got = json.loads(out)
    assert_same_serving(got, simulate(requests).as_dict())
    assert got["store"].startswith("mooncake://127.0.0.1:") and got["store_hit_tokens"] > 0
    assert got["wrong_pages"] == 0 and got["verified_pages"] == got["hit_tokens"] // PS
    assert got["store_stats"]["integrity_misses"] == 0 and got["store_stats"]["backend_errors"] == 0
    port = int(got["store"].split(":")[2].split("?")[0])
    assert not listening(port)  # the master went with the command


@pytest.mark.parametrize("store,blocks,message", [
    ("mooncake://127.0.0.1:1", "300000", "a running Mooncake store is bounded by its storage nodes' segments"),
    ("mooncake", "1000", "below its smallest segment (16 MiB), which holds about 136,"),
])
def test_a_mooncake_bound_it_cannot_honour_is_refused(tmp_path, store, blocks, message):
    path = tmp_path / "t.jsonl"
    write_token_jsonl(generate("mix", 0, 3), str(path))
    result = CliRunner().invoke(main, ["cluster", str(path), "--processes", "2", "--num-blocks", "100",
                                       "--store", store, "--store-blocks", blocks])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and message in result.output, result.output


@pytest.mark.parametrize("store", ["redis", "mooncake"])
def test_a_sigterm_ends_the_command_leaving_no_server_behind(tmp_path, store):
    """``timeout``, ``kill`` or a job scheduler stop a run with SIGTERM: the servers the fleet started go with it
    (they outlived the command, a Mooncake master and storage node with their segment, before the fleet turned
    SIGTERM into SystemExit)."""
    if store == "mooncake":
        from ..store.test_store_mooncake import _require_mooncake

        _require_mooncake()
    else:
        _require_redis()
    path = tmp_path / "long.jsonl"
    write_token_jsonl(generate("mix", 1, 20000), str(path))
    proc = radixkv("cluster", str(path), "--processes", "2", "--num-blocks", "400", "--page-size", "16",
                   "--store", store, "--quiet")
    try:
        kids: List[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum("spawn_main" in cmdline(k) for k in kids) < 2:
            kids = children(proc.pid)
            time.sleep(0.05)
        servers = [k for k in kids if "spawn_main" not in cmdline(k) and "resource_tracker" not in cmdline(k)]
        assert servers and len(kids) - len(servers) >= 2, "the fleet did not start"
        time.sleep(0.5)  # serving
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143
    deadline = time.monotonic() + 5
    while any(alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(k) for k in kids), [cmdline(k) for k in kids if alive(k)]


def test_a_bound_in_the_store_url_is_reported_and_a_bad_one_refused_before_any_process_starts():
    """``store='redis://...?capacity=N'`` bounds the store as ``store_blocks=N`` does: the result says so (it said
    ``None``, unbounded), and a capacity no worker could open is refused at once, not by each worker started; so
    is a ``store_timeout`` the store refuses."""
    _require_redis()
    requests = list(generate("mix", 0, 20))
    with LocalRedis() as server:
        result = replay_fleet(requests, 2, BLOCKS, PS, store=server.url + "?capacity=40")
        assert result.store_capacity_pages == 40 and result.cluster.store.endswith("?capacity=40")
        assert raw_dbsize(server) <= 40 + 1  # the pages and the order
        start = time.monotonic()
        with pytest.raises(ArgumentValueError, match="capacity must be one positive number"):
            Fleet(2, BLOCKS, PS, store=server.url + "?capacity=0")
        assert time.monotonic() - start < 0.5
        for bad in (0, 61, float("nan")):  # 61: PageStore.open's bound, which each worker then refused
            with pytest.raises(ArgumentValueError, match=r"store_timeout must be seconds in \(0, 60\]"):
                Fleet(2, BLOCKS, PS, store=server.url, store_timeout=bad)
        assert time.monotonic() - start < 0.5


def raw_dbsize(server: LocalRedis) -> int:
    import redis

    client = redis.Redis.from_url(server.url)
    try:
        return client.dbsize()
    finally:
        client.close()

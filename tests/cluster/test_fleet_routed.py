"""A fleet of processes routed by KV events (``radixkv cluster --processes N --routing kv_events``), against the
simulator.

Real worker processes publish their caches' KV events on real ZMQ sockets on loopback; the
coordinator's router subscribes to each and routes from what it heard alone. It must route, hit,
miss and mispredict exactly as the in-process ``Cluster(routing="kv_events")`` does, faults in the
streams included (the same seeded draws, applied to what each subscription hears), its view must
equal every worker's HBM at the end, and every hit page's bytes must be right. A missing
redis-server fails these under ``CI=true`` and skips them elsewhere, as the other fleet tests.
"""

from __future__ import annotations

import json
import re
import os
import signal
import sys

import pytest

from radixkv.cluster import Cluster
from radixkv.errors import ArgumentTypeError, ArgumentValueError, MissingExtraError
from radixkv.fleet import Fleet, FleetError
from radixkv.workload.generators import write_token_jsonl

from ..tiers.test_redis import _require_redis
from .test_fleet_processes import BLOCKS, PS, STORE_BLOCKS, conversations, radixkv

FAULTS = "drop=0.2,duplicate=0.2,reorder=0.2,seed=3"
HOST = 30  # host-tier blocks per instance in the library's run
TIMING = ("wall_seconds", "store", "store_stats", "router_us_per_request", "router_stats")
"""Fields that differ by nature: times, the store's URL and counters (a Redis store's first contact costs
a round trip), and the streams' counters (compared apart)."""


def simulate(requests, faults=None, instances=2):
    return Cluster(instances, BLOCKS, PS, routing="kv_events", store="memory", store_blocks=STORE_BLOCKS,
                   event_faults=faults).replay(requests, miss_reasons=True).as_dict()


def assert_routed_as_simulated(got: dict, want: dict) -> None:
    for field, value in want.items():
        if field not in TIMING:
            assert got[field] == value, field
    # the same streams: every batch heard, dropped, repeated, held and replayed alike (the probe of each
    # stream when the fleet started is before any replay: not counted in one)
    st = dict(got["router_stats"])
    assert st.pop("late") == 0
    assert st == want["router_stats"]


@pytest.fixture(scope="module")
def requests():
    return conversations(num=7, turns=8)


def test_a_routed_fleet_routes_hits_and_predicts_exactly_as_the_simulator(requests):
    _require_redis()
    more = conversations(num=5, turns=4, seed=1)
    with Fleet(2, BLOCKS, PS, routing="kv_events", store_blocks=STORE_BLOCKS, miss_reasons=True,
               host_blocks=HOST) as fleet:
        result = fleet.replay(requests)
        got = result.as_dict()
        again = fleet.replay(more).as_dict()  # a second replay on the same fleet reports its own counts
    cluster = Cluster(2, BLOCKS, PS, routing="kv_events", store="memory", store_blocks=STORE_BLOCKS,
                      host_blocks=HOST)  # host pages are published too (medium CPU) and weigh in routing
    want = cluster.replay(requests, miss_reasons=True).as_dict()
    assert_routed_as_simulated(got, want)
    assert_routed_as_simulated(again, cluster.replay(more, miss_reasons=True).as_dict())
    assert again["requests"] == len(more)
    assert got["routing"] == "kv_events" and got["event_faults"] is None
    assert got["router_false_hit_pages"] == 0 and got["router_divergent_pages"] == 0
    assert result.wrong_pages == 0 and result.verified_pages > 0
    # the router kept conversations where their history is: served from HBM, where round robin needs the store
    rr = Cluster(2, BLOCKS, PS, store="memory", store_blocks=STORE_BLOCKS, host_blocks=HOST).replay(requests)
    assert got["hit_tokens_by_tier"]["host"] > 0
    assert got["hit_tokens_by_tier"]["hbm"] > rr.hit_tokens_by_tier.get("hbm", 0)


def test_the_command_with_faulty_streams_recovers_as_the_simulator(requests, tmp_path):
    _require_redis()
    path = tmp_path / "turns.jsonl"
    write_token_jsonl(requests, str(path))
    proc = radixkv("cluster", str(path), "--processes", "2", "--routing", "kv_events", "--event-faults", FAULTS,
                   "--num-blocks", str(BLOCKS), "--page-size", str(PS), "--store-blocks", str(STORE_BLOCKS),
                   "--json", "--quiet")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    got = json.loads(out)
    want = simulate(requests, FAULTS)
    assert_routed_as_simulated(got, want)
    st = got["router_stats"]
    assert min(st["batches_dropped"], st["batches_duplicated"], st["batches_reordered"], st["gaps"]) > 0
    assert got["event_faults"] == FAULTS and got["router_false_hit_pages"] > 0
    assert got["router_divergent_pages"] == 0 and got["wrong_pages"] == 0


def test_a_worker_killed_mid_replay_ends_it_naming_the_worker_and_nothing_stays_in_flight(requests):
    _require_redis()
    with Fleet(2, BLOCKS, PS, routing="kv_events", timeout=20) as fleet:
        victim = fleet.workers[1].process

        def kill_after_five(request, instance, served=[0]):
            served[0] += 1
            if served[0] == 5:
                os.kill(victim.pid, signal.SIGKILL)

        with pytest.raises(FleetError, match=rf"worker 1 \(pid {victim.pid}\) (died \(killed by signal 9\)|closed "
                                             rf"its pipe)"):
            fleet.replay(requests * 3, on_request=kill_after_five)
        assert sum(fleet.router.router.in_flight.values()) == 0
    assert fleet.workers == [] and not victim.is_alive()


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(routing="cache_aware"), ArgumentValueError, "a fleet routes 'round_robin' or 'kv_events'"),
    (dict(event_faults="drop=0.1"), ArgumentValueError, "event_faults needs routing='kv_events'"),
    (dict(routing="kv_events", event_faults="drop=2"), ArgumentValueError, "must be a number in [0, 1)"),
    (dict(routing="kv_events", event_faults=0.1), ArgumentTypeError, "event_faults must be an EventFaults or its spec"),
])
def test_bad_routing_arguments_are_refused_before_any_process_starts(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        Fleet(2, BLOCKS, PS, store="redis://127.0.0.1:1", **kwargs)


def test_without_pyzmq_a_routed_fleet_says_what_to_install_before_starting(monkeypatch):
    monkeypatch.setitem(sys.modules, "zmq", None)  # import zmq now fails, as where it is not installed
    with pytest.raises(MissingExtraError, match=re.escape("pip install 'radixkv[events]'")):
        Fleet(2, BLOCKS, PS, store="redis://127.0.0.1:1", routing="kv_events")

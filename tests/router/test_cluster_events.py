"""cluster --routing kv_events: the simulator's instances publish their events in the wire format and a
router decides from its index alone; with faulty streams it recovers and ends equal to the instances' HBM."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from radixkv.cli import main
from radixkv.cluster import Cluster
from radixkv.errors import ArgumentTypeError, ArgumentValueError
from radixkv.tiers.base import TierConfigError
from radixkv.workload.sources import open_trace

from ..shared_traces import CONVERSATION

N = 250


@pytest.fixture(scope="module")
def requests():
    return list(open_trace(str(CONVERSATION), limit=N))


def replay(routing, requests, **kwargs):
    cluster = Cluster(4, 3000, 16, routing=routing, **kwargs)
    result = cluster.replay(requests)
    cluster.check()
    return cluster, result


def test_kv_events_routes_as_cache_aware_with_no_false_hit(requests):
    _, aware = replay("cache_aware", requests)
    cluster, events = replay("kv_events", requests)
    assert events.hit_tokens == aware.hit_tokens and events.requests_by_instance == aware.requests_by_instance
    assert (events.router_false_hit_pages, events.router_missed_pages, events.router_divergent_pages) == (0, 0, 0)
    assert events.router_stats["batches_sent"] == N and events.router_stats["lost"] == 0
    assert events.event_faults is None and cluster.events.index.instances == [0, 1, 2, 3]


def test_faulty_streams_recover_and_the_index_ends_equal_to_the_instances_hbm(requests):
    spec = "drop=0.2,duplicate=0.2,reorder=0.2,seed=3"
    _, aware = replay("cache_aware", requests)
    cluster, faulty = replay("kv_events", requests, event_faults=spec)
    st = faulty.router_stats
    assert min(st["batches_dropped"], st["batches_duplicated"], st["batches_reordered"], st["gaps"]) > 0
    assert faulty.router_divergent_pages == 0 and st["lost"] == 0 and st["malformed"] == 0
    assert abs(faulty.token_hit_rate - aware.token_hit_rate) < 0.02
    assert faulty.event_faults == "drop=0.2,duplicate=0.2,reorder=0.2,seed=3"
    _, again = replay("kv_events", requests, event_faults=spec)                  # seeded: the same run
    assert (again.hit_tokens, again.router_stats) == (faulty.hit_tokens, faulty.router_stats)


def test_a_lag_of_n_routes_each_request_on_the_batches_sent_n_decisions_before(requests):
    lag = 7
    cluster = Cluster(4, 3000, 16, routing="kv_events", event_lag=lag)
    events = cluster.events
    sent, applied = [], []

    def look(request, hit):  # after request i: sent = batches of requests < i, applied = of requests < i - lag
        sent.append(sum(link.next_seq for link in events.links))
        applied.append(sum(events.index.status(i).applied for i in range(4)))

    result = cluster.replay(requests[:120], on_request=look)
    assert applied[:lag] == [0] * lag and applied[lag:] == sent[:-lag] and sent[-1] > sent[0]
    assert result.event_lag == lag and result.router_divergent_pages == 0            # all arrived at the end
    assert result.router_false_hit_pages + result.router_missed_pages > 0
    _, prompt = replay("kv_events", requests[:120])
    assert (prompt.router_false_hit_pages, prompt.router_missed_pages, prompt.event_lag) == (0, 0, 0)


def test_with_faults_a_lagging_router_never_holds_a_batch_before_it_is_due(requests):
    """A gap's replay answers no further than the batches due: faults must not make a late view fresher."""
    cluster = Cluster(4, 3000, 16, routing="kv_events", event_lag=5, event_faults="drop=0.3,reorder=0.2,seed=4")
    events = cluster.events
    ahead = []

    def look(request, hit):
        for i, link in enumerate(events.links):
            due = -1 if link.due is None else link.due
            ahead.append(events.index.status(i).next_seq - 1 - due)

    result = cluster.replay(requests[:120], on_request=look)
    assert max(ahead) <= 0 and result.router_stats["gaps"] > 0 and result.router_divergent_pages == 0


def test_router_stats_are_each_replays_own(requests):
    cluster = Cluster(4, 3000, 16, routing="kv_events", event_faults="drop=0.2,seed=2")
    first, second = cluster.replay(requests[:60]), cluster.replay(requests[60:120])
    links = cluster.events.links
    for name, total in (("batches_sent", sum(link.sent for link in links)),
                        ("batches_dropped", sum(link.dropped for link in links))):
        assert first.router_stats[name] + second.router_stats[name] == total and second.router_stats[name] > 0
    assert second.router_stats["index_pages"] == len(cluster.events.index)


def test_a_router_that_never_hears_in_time_predicts_nothing_and_misses_every_hit(requests):
    cluster, blind = replay("kv_events", requests[:80], event_lag=80, event_faults="drop=0.3,seed=1")
    assert blind.router_false_hit_pages == 0 and blind.router_missed_pages * 16 == blind.hit_tokens > 0
    assert blind.router_divergent_pages == 0 and blind.router_stats["gaps"] > 0      # faults still mended at the end


@pytest.mark.parametrize("kwargs,error", [(dict(event_lag=-1), ArgumentValueError),
                                          (dict(event_lag="1"), ArgumentTypeError),
                                          (dict(event_lag=1, routing="cache_aware"), TierConfigError)])
def test_a_bad_event_lag_is_refused(kwargs, error):
    with pytest.raises(error, match="event_lag"):
        Cluster(2, 10, 4, **{"routing": "kv_events", **kwargs})


def test_a_crashed_instance_is_cleared_in_the_index(requests):
    cluster = Cluster(2, 3000, 16, routing="kv_events")
    cluster.replay(requests[:40])
    cluster.crash(1)
    cluster.replay(requests[40:60])
    assert cluster.events.index.status(1).clears == 1
    assert cluster.events.divergent_pages() == 0
    cluster.check()


def test_event_faults_need_kv_events_and_a_good_spec():
    with pytest.raises(TierConfigError):
        Cluster(2, 10, 4, routing="cache_aware", event_faults="drop=0.1")
    for spec in ("drop=1", "drop=x", "lose=0.1", "drop=0.1,drop=0.2", "seed=-1", "seed=4294967296"):
        with pytest.raises(ArgumentValueError):
            Cluster(2, 10, 4, routing="kv_events", event_faults=spec)
    with pytest.raises(ArgumentTypeError, match="event_faults must be an EventFaults or its spec"):
        Cluster(2, 10, 4, routing="kv_events", event_faults=0.1)


def cli(*args):
    return CliRunner().invoke(main, ["cluster", str(CONVERSATION), "--limit", "30", "--instances", "2",
                                     "--num-blocks", "2000", "--quiet", *args])


def test_the_command_reports_the_router_and_refuses_bad_faults_in_one_line():
    out = cli("--routing", "kv_events", "--event-faults", "drop=0.1,seed=2", "--json")
    assert out.exit_code == 0, out.output
    row = json.loads(out.output)
    assert row["routing"] == "kv_events" and row["router_divergent_pages"] == 0
    assert {"router_false_hit_pages", "router_missed_pages", "router_stats"} <= row.keys()
    table = cli("--routing", "kv_events")
    assert table.exit_code == 0 and "false-hit pages" in table.output
    late = cli("--routing", "kv_events", "--event-lag", "4")
    assert late.exit_code == 0 and "each batch heard 4 decisions late" in late.output, late.output
    for args, message in ((["--event-faults", "drop=0.1"], "--event-faults injects faults"),
                          (["--routing", "kv_events", "--event-faults", "drop=2"], "must be a number in [0, 1)"),
                          (["--routing", "kv_events", "--event-faults", "seed=1.5"], "must be a whole number"),
                          (["--event-lag", "3"], "--event-lag delays the KV events of the simulator's --routing "
                                                 "kv_events; got --routing round_robin"),
                          (["--routing", "kv_events", "--event-lag", "9001"], "must be at most 9,000")):
        out = cli(*args)
        assert out.exit_code == 2 and out.output.count("\n") == 1 and message in out.output, out.output

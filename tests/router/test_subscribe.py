"""KVRouter.subscribe over real ZMQ sockets on loopback: radixkv's publisher, a subscriber thread, replays."""

from __future__ import annotations

import socket
import time

import zmq

from radixkv import PrefixCache
from radixkv.events.wire import ZmqEventPublisher, publish_from
from radixkv.router import KVIndex, KVRouter


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hbm(cache):
    log = cache.event_log
    return set(log.resident_hashes())


def serve(cache, publisher, prompts):
    last = None
    for tokens in prompts:
        cache.admit(tokens).release()
        seq = publish_from(cache, publisher)
        last = seq if seq is not None else last
    return last


def test_a_late_subscriber_replays_what_it_missed_and_routes_to_the_cache_holding_the_prefix():
    cache = PrefixCache(num_blocks=40, page_size=4, enable_events=True)
    prompts = [[t % 7 + 100 * i for t in range(24)] for i in range(12)]
    replay = free_port()
    with ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint=f"tcp://127.0.0.1:{replay}") as pub:
        first = serve(cache, pub, prompts[:6])                 # sent before anyone listens: only the replay has them
        assert pub.flush()                                     # out of the publisher's queue, not only into it
        router = KVRouter(KVIndex(), ["idle"], page_size=4)
        with router:
            sub = router.subscribe(pub.endpoint, "engine", f"tcp://127.0.0.1:{replay}", idle_probe=30)
            last = serve(cache, pub, prompts[6:])
            for i in range(200):                               # until one batch came over PUB/SUB (joined)
                if sub.received:
                    break
                time.sleep(0.02)
                last = serve(cache, pub, [[t + 1000 * (i + 20) for t in range(8)]])  # new pages: a batch
            last = serve(cache, pub, [prompts[-1]]) or last    # back in HBM if the new pages pushed it out
            assert sub.wait(last, timeout=20), sub.status()
            assert router.index.block_hashes("engine") == hbm(cache)
            st = sub.status()
            assert st.exact and st.next_seq == last + 1 and first < last and sub.replays >= 1 and sub.received > 0
            route = router.route(prompts[-1])
            assert route.instance == "engine" and route.overlap_pages == 6


def test_a_publisher_restarted_on_the_same_endpoint_resets_the_view(tmp_path):
    endpoints = (f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay")  # ipc: rebound at once after a close
    index = KVIndex()
    router = KVRouter(index, page_size=4)
    with router:
        cache = PrefixCache(num_blocks=40, page_size=4, enable_events=True)
        with ZmqEventPublisher(endpoints[0], replay_endpoint=endpoints[1]) as pub:
            sub = router.subscribe(*endpoints[:1], "engine", endpoints[1], idle_probe=0.2)
            last = serve(cache, pub, [[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9]])
            assert sub.wait(last, timeout=20)
        fresh = PrefixCache(num_blocks=40, page_size=4, enable_events=True)   # a new engine process: empty
        with ZmqEventPublisher(endpoints[0], replay_endpoint=endpoints[1]) as pub:
            last = serve(fresh, pub, [[5, 5, 5, 5, 6, 6, 6, 6]])
            deadline_ok = False
            for _ in range(100):
                sub.probe(0.5)
                if index.status("engine").restarts and index.block_hashes("engine") == hbm(fresh):
                    deadline_ok = True
                    break
            assert deadline_ok, index.status("engine")
        assert sub.error is None and isinstance(zmq.Context.instance(), zmq.Context)


def test_a_faulty_live_subscription_hears_what_the_simulators_link_delivers():
    """Faults on what a real SUB socket hears, batch by batch (``wait_heard``), leave the index where the
    in-process link with the same faults and instance leaves it: the same counters after every batch,
    and after the final probe both views equal the engine's HBM. The first batch is sent before the
    subscriber exists: ``catch_up`` fetches it and hears it through the same draws (were it applied
    past them, every later draw would fall on another batch)."""
    from radixkv.events.wire import encode_batch
    from radixkv.router import EventFaults, EventLink

    faults = EventFaults(drop=0.25, duplicate=0.25, reorder=0.25, seed=5)
    cache = PrefixCache(num_blocks=24, page_size=4, enable_events=True)
    prompts = [[(t * 7 + i) % 50 for t in range(4 * (1 + i % 5))] for i in range(40)]
    sim = KVIndex()
    link = EventLink(sim, 0, faults)
    counters = ("applied", "duplicates", "gaps", "next_seq", "stale")
    with ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*") as pub:
        router = KVRouter(KVIndex(), page_size=4)

        def step(tokens):
            cache.admit(tokens).release()
            events = cache.take_events()
            if events:
                link.publish(encode_batch(events, ts=0.0))
                return pub.publish(events, ts=0.0)

        def same_as_the_link(seq):
            live, want = router.index.status(0), sim.status(0)
            assert [getattr(live, c) for c in counters] == [getattr(want, c) for c in counters], seq
            assert router.index.block_hashes(0) == sim.block_hashes(0)

        early = [step(prompts[0])]                  # nobody listens yet: the SUB never hears it (a fleet's slow joiner)
        assert pub.flush()
        with router:
            sub = router.subscribe(pub.endpoint, 0, pub.replay_endpoint, idle_probe=None, faults=faults)
            assert sub.catch_up(early[-1], 10) and sub.wait_heard(early[-1], 0)
            same_as_the_link(early[-1])
            for tokens in prompts[1:]:
                seq = step(tokens)
                if seq is None:
                    continue
                if not sub.wait_heard(seq, timeout=2):                # the SUB socket still joining: as a fleet does
                    assert sub.catch_up(seq, 10) and sub.wait_heard(seq, 0), seq
                same_as_the_link(seq)
            assert sub.wire.dropped == link.dropped > 0 and sub.wire.reordered == link.reordered > 0
            assert sub.wire.duplicated == link.duplicated > 0 and sub.replays > 1
            link.flush()
            assert sub.probe(10)
            assert router.index.block_hashes(0) == sim.block_hashes(0) == hbm(cache)
            assert not sub.wait_heard(10_000, timeout=0.05)           # a batch never sent is never heard


def test_a_dead_subscription_thread_answers_probes_and_waits_at_once():
    with ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*") as pub:
        router = KVRouter(KVIndex(), page_size=4)
        with router:
            sub = router.subscribe(pub.endpoint, "e", pub.replay_endpoint, idle_probe=None)
            sub._sub.close(linger=0)                                  # the thread's next poll raises
            sub._thread.join(5)
            assert sub.error is not None and not sub._thread.is_alive()
            start = time.monotonic()
            assert not sub.probe(30) and not sub.catch_up(3, 30) and not sub.wait_heard(0, 30)
            assert time.monotonic() - start < 1


def test_a_bad_idle_probe_or_faults_is_refused_before_any_socket_opens():
    import pytest

    from radixkv.errors import ArgumentTypeError, ArgumentValueError
    from radixkv.router.subscriber import Subscription

    index = KVIndex()
    for bad in (0, -1):
        with pytest.raises(ArgumentValueError, match="idle_probe must be a number of seconds > 0 or None"):
            Subscription(index, "tcp://127.0.0.1:1", "e", idle_probe=bad)
    for bad in (True, "1"):
        with pytest.raises(ArgumentTypeError, match="idle_probe must be a number of seconds or None"):
            Subscription(index, "tcp://127.0.0.1:1", "e", idle_probe=bad)
    with pytest.raises(ArgumentTypeError, match="faults must be EventFaults"):
        Subscription(index, "tcp://127.0.0.1:1", "e", faults="drop=0.1")
    assert index.instances == []

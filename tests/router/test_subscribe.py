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
    return set(log.hasher.event_hashes(list(log.index)))


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
                last = serve(cache, pub, [prompts[6 + i % 6]]) or last
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

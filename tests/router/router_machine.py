"""A hypothesis state machine: a KVIndex fed over real ZMQ sockets through a faulty link equals the
engine's residency once it has recovered.

An engine (a PrefixCache with events) publishes through a real publisher (radixkv's
ZmqEventPublisher, or vLLM's own: ``make_publisher`` is the machine's parameter). Between its PUB
socket and the router's subscriber sits a proxy this machine drives: every message it reads
from the publisher is delivered, dropped, sent twice or held back and sent after the next one,
as hypothesis draws. The replay socket is the publisher's own, reached directly. The engine
also clears its cache and restarts (a new process: an empty cache and a new publisher on the
same endpoints). After each ``recover`` step the router's view must equal the cache's HBM
pages, and a routed request's predicted overlap its real hit.
"""

from __future__ import annotations

import os

import shutil
import socket
import tempfile
import time
from typing import Callable, List, Optional, Tuple

import zmq
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixkv import PrefixCache
from radixkv.router import KVIndex, KVRouter

PAGE = 4
INSTANCE = "engine"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def residency(cache: PrefixCache) -> set:
    log = cache.event_log
    return set(log.resident_hashes())


class Publisher:
    """What the machine needs of a publisher: publish a cache's pending events; return their seq (or None)."""

    def publish(self, cache: PrefixCache) -> Optional[int]: ...

    def close(self) -> None: ...


PublisherFactory = Callable[[str, str], Publisher]

prefixes = st.lists(st.integers(0, 5), min_size=1, max_size=6)
actions = st.sampled_from(["deliver", "drop", "duplicate", "hold"])


class RouterMachine(RuleBasedStateMachine):
    make_publisher: PublisherFactory

    @initialize()
    def start(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="rkv")
        self.pub_endpoint = f"ipc://{self.dir}/pub"
        self.replay_endpoint = f"ipc://{self.dir}/replay"
        ctx = zmq.Context.instance()
        self.proxy_in = ctx.socket(zmq.SUB)
        self.proxy_in.setsockopt(zmq.SUBSCRIBE, b"")
        self.proxy_in.setsockopt(zmq.RECONNECT_IVL, 10)
        self.proxy_in.connect(self.pub_endpoint)
        self.proxy_out = ctx.socket(zmq.PUB)
        self.proxy_out.bind(f"ipc://{self.dir}/proxy")
        self.held: List[Tuple[bytes, ...]] = []
        self.cache = PrefixCache(num_blocks=24, page_size=PAGE, enable_events=True)
        self.publisher = self.make_publisher(self.pub_endpoint, self.replay_endpoint)
        self.last_seq: Optional[int] = None
        self.index = KVIndex()
        self.router = KVRouter(self.index, [INSTANCE], page_size=PAGE)
        self.sub = self.router.subscribe(f"ipc://{self.dir}/proxy", INSTANCE, self.replay_endpoint, idle_probe=60)
        time.sleep(0.05)
        self.prompts: List[List[int]] = []
        self.faults_seen = set()

    def teardown(self) -> None:
        if not hasattr(self, "router"):
            return
        self.router.close()
        self.publisher.close()
        self.proxy_in.close(linger=0)
        self.proxy_out.close(linger=0)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------ the engine
    def _publish(self, action: str) -> None:
        """One engine step's batch, and what the link does with it."""
        seq = self.publisher.publish(self.cache)
        if seq is not None:
            self.last_seq = seq
            self.forward(action, wait=1.0)

    @rule(prefix=prefixes, tail=st.integers(0, 9), length=st.integers(1, 4), action=actions)
    def serve(self, prefix: List[int], tail: int, length: int, action: str) -> None:
        """A request sharing a prefix with others (pages of the same few tokens), one engine step."""
        tokens = [t for p in prefix for t in [p] * PAGE] + [100 + tail] * (length * PAGE - 1)
        self.cache.admit(tokens).release()
        self.prompts.append(tokens)
        self._publish(action)

    @rule(action=actions)
    def clear(self, action: str) -> None:
        self.cache.reset()
        self._publish(action)

    @rule()
    def restart(self) -> None:
        """The engine process restarts: an empty cache, a new publisher numbering from 0 on the same endpoints."""
        self.publisher.close()
        self.held.clear()
        self.cache = PrefixCache(num_blocks=24, page_size=PAGE, enable_events=True)
        self.publisher = self.make_publisher(self.pub_endpoint, self.replay_endpoint)
        self.last_seq = None
        self.faults_seen.add("restart")
        time.sleep(0.05)  # the proxy's SUB reconnects (what it misses meanwhile is a drop the replay mends)

    # ------------------------------------------------------------ the link
    def forward(self, action: str, wait: float = 0.03) -> None:
        """Pass on what the publisher sent: the first message as ``action`` says, the rest delivered."""
        while self.proxy_in.poll(int(wait * 1000)):
            wait = 0.03
            frames = tuple(self.proxy_in.recv_multipart())
            self.faults_seen.add(action)
            held, self.held = self.held, []
            if action == "hold":
                self.held.append(frames)
            elif action != "drop":
                self.proxy_out.send_multipart(frames)
                if action == "duplicate":
                    self.proxy_out.send_multipart(frames)
            for frames in held:
                self.proxy_out.send_multipart(frames)
            action = "deliver"

    @precondition(lambda self: self.last_seq is not None)
    @rule()
    def recover(self) -> None:
        """Let the link go quiet and the subscriber catch up: then the view is the engine's HBM."""
        self.forward("deliver")
        for frames in self.held:
            self.proxy_out.send_multipart(frames)
        self.held.clear()
        assert self.sub.wait(self.last_seq, timeout=20), self.sub.status()
        deadline = time.monotonic() + 10
        while self.index.block_hashes(INSTANCE) != residency(self.cache) and time.monotonic() < deadline:
            self.sub.probe(1.0)  # a restart seen only by what the replay lacks
        assert self.index.block_hashes(INSTANCE) == residency(self.cache), self.sub.status()
        assert self.index.status(INSTANCE).exact
        for fault in sorted(self.faults_seen - {"deliver"}):
            event(f"recovered after a {fault}")
        self.faults_seen.clear()
        for tokens in self.prompts[-3:]:
            route = self.router.route(tokens)
            self.router.done(INSTANCE)
            assert route.overlap_pages == self.cache.cached_pages(tokens)

    @invariant()
    def index_is_consistent(self) -> None:
        if hasattr(self, "index"):
            self.index.check()
            assert self.sub.error is None


def state_machine_test(make_publisher: PublisherFactory) -> type:
    """The machine's unittest case over publishers ``make_publisher(endpoint, replay_endpoint)`` makes."""
    machine = type(f"RouterMachineOver{make_publisher.__name__}", (RouterMachine,),
                   {"make_publisher": staticmethod(make_publisher)})
    case = machine.TestCase
    thorough = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"  # real sockets: ~2 s an example
    case.settings = settings(max_examples=250 if thorough else 10, stateful_step_count=25, deadline=None)
    return case

"""The coordinator of a fleet of serving processes: start them, feed them the trace, count what they report.

:class:`Fleet` starts one process per instance (multiprocessing's ``spawn``
context: a fresh interpreter, no forked copy of a process holding sockets),
each running :func:`radixkv.fleet.worker.run_worker` over the shared store,
and, when it is given no store URL, the redis-server they share
(:class:`radixkv.fleet.server.LocalRedis`). A page bound (``store_blocks``) is
the store URL's ``?capacity=``: an exact LRU the server keeps
(:mod:`radixkv.store.redis_lru`), so the processes evict what the simulator's
in-process store evicts. :meth:`Fleet.replay` routes round
robin (request ``i`` to worker ``i % N``) or by KV events (below) and keeps the simulator's books:
one :class:`~radixkv.analysis.stats.ReplayStats` per instance here, fed through
:func:`radixkv.cluster.count_request` with what the workers report, and the
totals as a :class:`~radixkv.cluster.ClusterResult`
(:func:`radixkv.cluster.stats_totals`): the same figures as
``Cluster(..., store=...).replay``.

**Lockstep.** The workers pass a baton (one semaphore each): request ``i`` is
served only after request ``i - 1`` was released, whichever process served it,
so a request sees every page the ones before it stored, as in the in-process
simulator, and the result is deterministic. The coordinator ships requests in
chunks (at most :data:`CHUNK_REQUESTS` requests or :data:`CHUNK_TOKENS`
tokens, each worker's share as one ``uint32`` buffer) from a feeder thread,
up to :data:`CHUNKS_AHEAD` chunks ahead, and reads the workers' reports a
batch at a time: the processes never wait on the coordinator per request.

**Routed by KV events.** ``routing="kv_events"`` routes each request with a router of the
coordinator's own (:class:`~radixkv.fleet.routed.FleetRouter`) that knows only what the workers
publish: each worker publishes its cache's KV events over ZMQ on loopback, the router subscribes
to every stream, and a request is sent, alone, to the worker it picks once the events of the one
before were heard. No baton then: the coordinator keeps the order, one request at a time.

**Failures.** A worker that dies (killed, crashed) or raises is noticed at
once (its process sentinel, or its error message); one that stops making
progress for ``timeout`` seconds (no request served fleet-wide) is named as
the one holding the baton (routed by KV events: the one the request was sent
to). Either way :class:`FleetError` says which worker in one line, after every
process and the redis-server the fleet started are stopped. Ctrl-C stops them too (:meth:`Fleet.close`, from ``with``), and so does a SIGTERM
(``timeout``, ``kill``, a job scheduler): a fleet made in the main thread of a process that left SIGTERM
to its default turns it into ``SystemExit(143)`` while it is open, so the servers it started are not left
running without their owner.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np

from .. import policies as _policies
from ..policies import PolicySpec
from ..router.link import EventFaults
from ..analysis.stats import ReplayStats, RequestRecord
from ..cluster import ClusterResult, count_request, counts_since, stats_totals, stream_counts, sum_counts
from ..costs import DEFAULT_HARDWARE, DEFAULT_MODEL, HardwareSpec, ModelSpec
from ..errors import ArgumentTypeError, ArgumentValueError, MissingExtraError, RadixKVError
from ..keys import as_tokens, check_namespace, check_positive_int
from ..store.backends import bounded, redact
from ..tiers.tiered import default_cost_model
from ..workload.traces import Request
from .server import LocalRedis
from .routed import FleetRouter
from .worker import DTYPE, KV_SHAPE, REPORT_FIELDS, WorkerSpec, run_worker

CHUNK_REQUESTS = 256
"""Requests the coordinator ships per chunk at most (split among the workers)."""
CHUNK_TOKENS = 1 << 21
"""Prompt tokens per chunk at most (8 MiB of ``uint32``): bounds the memory of the chunks in flight."""
CHUNKS_AHEAD = 2
"""Chunks shipped ahead of the one whose reports the coordinator is counting."""
ROUTING = ("round_robin", "kv_events")
"""The routings a fleet of processes runs: those that need no look into the workers' caches."""
START_METHOD = "spawn"
"""multiprocessing start method: a fresh interpreter per worker (``forkserver`` also works)."""
START_SECONDS = 60.0
"""Seconds a worker may take to start (an interpreter, numpy and radixkv imported, its cache built), at the
least: a busy machine's imports must not pass for a hang however short the fleet's ``timeout``."""
STORE_TIMEOUT = 5.0
"""Seconds a worker's store call may take by default. A capacity-bound write of a long prompt's pages
(a Lua script stamping and evicting a few hundred pages) took over 0.25 s now and then with four
workers on two busy CPUs, and each such timeout was a miss the simulator does not have."""
WAIT_SLICE = 0.5
"""Seconds between two looks at the workers' liveness and progress while waiting."""


class FleetError(RadixKVError, RuntimeError):
    """A fleet cannot run or went wrong: no redis-server, a worker that died, raised or stopped answering.

    The message is one line and names the worker; the fleet is stopped when it is raised."""


@dataclass(frozen=True)
class FleetResult:
    """A fleet replay's totals: the in-process simulator's :class:`~radixkv.cluster.ClusterResult`, plus what
    only processes have.

    Attributes:
        cluster: the same totals as ``Cluster(...).replay`` (the fleet's routing, no lending; with
            ``kv_events`` the router's scores too).
        processes: serving processes (one instance each).
        wrong_pages: hit pages whose payload differed from what their tokens must hold (must be 0).
        verified_pages: hit pages checked, bit for bit.
        store_capacity_pages: the pages the store holds at most, least recently used evicted (``None``:
            unbounded, or bounded only by the server's own ``maxmemory``).
    """

    cluster: ClusterResult
    processes: int
    wrong_pages: int
    verified_pages: int
    store_capacity_pages: Optional[int]

    def as_dict(self) -> dict:
        """The cluster's fields, then this result's own (one flat dict: the CLI's JSON)."""
        out = self.cluster.as_dict()
        out.update((k, v) for k, v in asdict(self).items() if k != "cluster")
        return out


class _Worker:
    """The coordinator's handle on one worker process: its pipes, pid and requests served."""

    def __init__(self, index: int, process: Any, inbox: Any, outbox: Any) -> None:
        self.index = index
        self.process = process
        self.inbox = inbox  # coordinator -> worker
        self.outbox = outbox  # worker -> coordinator
        self.pid: Optional[int] = None
        self.requests = 0
        self.endpoints: Optional[tuple] = None  # its event publisher's (PUB, replay) addresses

    def describe(self) -> str:
        return f"worker {self.index} (pid {self.pid or self.process.pid})"


class Fleet:
    """``processes`` serving processes, one cache each, over one shared page store; a context manager.

    >>> with Fleet(2, num_blocks=1000, page_size=16) as fleet:     # doctest: +SKIP
    ...     result = fleet.replay(requests)

    Args:
        processes: serving processes (instances).
        num_blocks, page_size, policy, host_blocks: each instance's cache (HBM blocks, tokens per page,
            eviction policy by name or :class:`~radixkv.policies.PolicySpec`, host-tier blocks), as
            :class:`~radixkv.cluster.Cluster`'s. An offline
            policy (``belady``) is refused: its future requests would have to be shipped ahead.
        store: the shared store: ``None`` or ``"redis"`` starts a redis-server of the fleet's own on a free
            loopback port, ``"mooncake"`` a Mooncake master and storage node (both stopped by :meth:`close`);
            or a URL, ``redis://HOST:PORT[/DB]`` (a server or a cluster) or ``mooncake://HOST:PORT[?...]``.
        store_blocks: the pages the store holds. On Redis, least recently used evicted exactly (the URL's
            ``?capacity=``, kept by a single server: :mod:`~radixkv.store.redis_lru`); on the Mooncake
            master a fleet starts, about that many (its segment's size; Mooncake evicts at its watermark
            the pages whose lease ran out longest ago). ``None``: unbounded.
        miss_reasons: classify missed tokens as the simulator does (each worker reports the pages
            another namespace caches).
        timeout: seconds the fleet may go without serving a request, or a worker without answering,
            before the worker holding things up is declared hung (starting may take
            :data:`START_SECONDS` whatever this is).
        store_timeout: seconds the store may take to answer one call before that call's pages count as
            misses (default :data:`STORE_TIMEOUT`: a replay's figures must not depend on how busy the
            machine is; an engine serving users would rather miss sooner, as the store's own 0.25 s).
        routing: ``"round_robin"`` (request ``i`` to worker ``i % processes``) or ``"kv_events"``
            (a router fed only by the workers' KV events over ZMQ picks each request's worker: the
            module doc; needs pyzmq and msgspec).
        event_faults: with ``"kv_events"``, faults injected into what the router hears of each stream
            (an :class:`~radixkv.router.link.EventFaults` or its spec), drawn as the simulator's.

    A script that makes a fleet must start under ``if __name__ == "__main__":``: each ``spawn``-ed
    worker imports the script's main module again (multiprocessing's "safe importing of main
    module"). Raises :class:`~radixkv.errors.ArgumentValueError` for bad arguments and
    :class:`FleetError` when the processes or the server cannot start. Cost: a process start per worker (an interpreter and
    numpy: 0.3-1 s on a busy 2-core machine, in parallel).
    """

    def __init__(self, processes: int, num_blocks: int, page_size: int = 16,
                 policy: Union[str, PolicySpec] = "lru", *,
                 host_blocks: int = 0, store: Optional[str] = None, store_blocks: Optional[int] = None,
                 miss_reasons: bool = False, timeout: float = 60.0, store_timeout: float = STORE_TIMEOUT,
                 routing: str = "round_robin", event_faults: Union[None, str, EventFaults] = None) -> None:
        processes = check_positive_int(processes, "processes")
        if routing not in ROUTING:
            raise ArgumentValueError(f"a fleet routes {' or '.join(map(repr, ROUTING))} (the other routings read "
                                     f"the instances' caches, which are in other processes), got {routing!r}")
        if isinstance(event_faults, str):
            event_faults = EventFaults.parse(event_faults)
        elif event_faults is not None and not isinstance(event_faults, EventFaults):
            raise ArgumentTypeError(f"event_faults must be an EventFaults or its spec, got {event_faults!r}")
        if event_faults is not None and routing != "kv_events":
            raise ArgumentValueError(f"event_faults needs routing='kv_events', got routing {routing!r}")
        if routing == "kv_events":  # before any process starts: the environment's fault, said as such
            from ..events.wire import require_extras

            require_extras()
        check_positive_int(num_blocks, "num_blocks")
        check_positive_int(page_size, "page_size")
        check_positive_int(host_blocks, "host_blocks", allow_zero=True)
        if _policies.create(policy).offline:
            raise ArgumentValueError(f"policy {policy!r} is offline: a fleet of processes would have to ship each "
                                     "worker its future requests first; use an online policy")
        if store_blocks is not None:
            check_positive_int(store_blocks, "store_blocks")
        store = check_store(store, store_blocks)
        bound = store_blocks
        if store.startswith(("redis://", "rediss://")):  # its ?capacity=, store_blocks' or its own
            from ..store.redis_backends import split_capacity

            bound = split_capacity(store)[1]  # a bad one refused here, not by each worker started
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ArgumentValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        if isinstance(store_timeout, bool) or not isinstance(store_timeout, (int, float)) or \
                not 0 < store_timeout <= 60:  # what PageStore.open takes: refused here, not by each worker started
            raise ArgumentValueError(f"store_timeout must be seconds in (0, 60], got {store_timeout!r}")
        self.processes = processes
        self.routing = routing
        self.event_faults = event_faults or EventFaults()
        self.router: Optional[FleetRouter] = None
        """The router fed by the workers' KV events (``routing="kv_events"``), else ``None``."""
        self.num_blocks = num_blocks
        self.page_size = page_size
        self.timeout = float(timeout)
        self.miss_reasons = bool(miss_reasons)
        self.server: Optional[Union[LocalRedis, Any]] = None
        """The store server the fleet started: a :class:`LocalRedis` or a
        :class:`~radixkv.store.mooncake_backend.MooncakeMaster` (``None``: it was given a store URL)."""
        self.store_capacity_pages = bound
        self.workers: List[_Worker] = []
        self._totals: List[Dict[str, Any]] = [{} for _ in range(processes)]  # each worker's, at the last replay's end
        self._requests0 = [0] * processes  # each worker's requests served when this replay began
        self._next = 0  # the worker the next request goes to (round robin)
        self._start = 0  # the worker of the replay's first request
        self._idle = False  # no replay under way and none failed: the workers read their pipes
        self._error: Optional[BaseException] = None  # the feeder thread's
        self._sending: Optional[int] = None  # the worker the feeder is shipping to, while it does
        self._feeder: Optional[threading.Thread] = None
        self._closing = False
        self._sigterm: Any = None  # the SIGTERM handler to restore at close (None: left alone)
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._sigterm = signal.signal(signal.SIGTERM, _terminated)
        try:
            if store in ("redis", "mooncake"):
                self.server = self._start_server(store, store_blocks)
            self.store_url = (bounded(self.server.url, store_blocks) if store == "redis"
                              else self.server.url if self.server is not None else store)
            ctx = multiprocessing.get_context(START_METHOD)
            self._batons = [ctx.Semaphore(0) for _ in range(processes)]
            self._served = ctx.RawValue("q", 0)
            for index in range(processes):
                spec = WorkerSpec(index, processes, num_blocks, page_size, policy, host_blocks, self.store_url,
                                  float(store_timeout), self.miss_reasons, os.getpid(), events=routing == "kv_events")
                inbox_r, inbox_w = ctx.Pipe(duplex=False)
                outbox_r, outbox_w = ctx.Pipe(duplex=False)
                process = ctx.Process(target=run_worker, args=(spec, inbox_r, outbox_w, self._batons, self._served),
                                      name=f"radixkv-fleet-{index}", daemon=True)
                process.start()
                inbox_r.close()
                outbox_w.close()
                self.workers.append(_Worker(index, process, inbox_w, outbox_r))
            for w in self.workers:
                _, w.pid, self.lower, w.endpoints = self._receive(w, "ready", progress=False,
                                                                  within=max(START_SECONDS, timeout))
            if routing == "kv_events":
                try:
                    self.router = FleetRouter([w.endpoints for w in self.workers], page_size, self.event_faults,
                                              timeout=self.timeout)
                except MissingExtraError:
                    raise
                except RadixKVError as exc:
                    raise FleetError(str(exc)) from None
            self._batons[0].release()  # request 0 is worker 0's
            self._idle = True
        except BaseException:
            self.close()
            raise

    def _start_server(self, kind: str, store_blocks: Optional[int]) -> Any:
        """A redis-server (``kind="redis"``), or a Mooncake master and one storage node whose segment holds
        about ``store_blocks`` of the workers' pages (:func:`~radixkv.store.mooncake_backend.segment_for_pages`;
        without a bound, :data:`~radixkv.store.mooncake_backend.EMBEDDED_SEGMENT`), on free loopback ports."""
        if kind == "mooncake":
            from ..store.mooncake_backend import MooncakeMaster, MooncakeStartError, sizing

            segment, watermark = sizing(store_blocks, self.page_size, KV_SHAPE, DTYPE)
            try:
                return MooncakeMaster(segment, watermark=watermark)
            except MooncakeStartError as exc:
                raise FleetError(f"the fleet's store: {exc}") from None
        try:
            return LocalRedis()
        except FileNotFoundError:
            raise FleetError("a fleet needs a redis-server on PATH (apt-get install redis-server) or a store URL "
                             "(redis://HOST:PORT)") from None
        except RuntimeError as exc:
            raise FleetError(f"the fleet's store: {exc}") from None

    # ------------------------------------------------------------------ waiting
    def _check(self, last: List[Any]) -> None:
        """Raise :class:`FleetError` if a worker died, or if no request was served for :attr:`timeout` seconds
        (``last`` = [served count, when it last moved], updated here)."""
        for w in self.workers:
            code = w.process.exitcode
            if code is not None:
                said = _last_words(w)
                how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                raise FleetError(f"{w.describe()} {said or f'died ({how})'} after {self._served.value:,} requests "
                                 "served")
        served, now = self._served.value, time.monotonic()
        if served != last[0]:
            last[0], last[1] = served, now
        elif now - last[1] > self.timeout:
            holder = self.workers[(served + self._start) % self.processes]
            raise FleetError(f"{holder.describe()} did not serve request {served:,} within {self.timeout:g} s")

    def _receive(self, w: _Worker, kind: str, progress: bool = True, within: Optional[float] = None) -> tuple:
        """The next message of worker ``w``, which must be ``kind``; raises :class:`FleetError` on an error
        message, a dead worker, or a fleet stuck for :attr:`timeout` seconds (``progress=False``: ``w``
        itself must answer within ``within`` seconds, default :attr:`timeout`)."""
        last = [self._served.value, time.monotonic()]
        deadline = time.monotonic() + (self.timeout if within is None else within)
        sentinels = [x.process.sentinel for x in self.workers]
        while True:
            if w.outbox in multiprocessing.connection.wait([w.outbox, *sentinels], timeout=WAIT_SLICE):
                try:
                    message = w.outbox.recv()
                except (EOFError, OSError):
                    w.process.join(1.0)
                    self._check(last)
                    raise FleetError(f"{w.describe()} closed its pipe") from None
                if message[0] == "error":
                    raise FleetError(f"{w.describe()}: {message[1]}")
                if message[0] != kind:
                    raise FleetError(f"{w.describe()} sent {message[0]!r}, expected {kind!r}")
                return message
            if progress:
                self._check(last)
            else:
                self._check([None, 0.0])
                if time.monotonic() > deadline:
                    raise FleetError(f"{w.describe()} did not answer {kind!r} within "
                                     f"{self.timeout if within is None else within:g} s")

    # ------------------------------------------------------------------ feeding
    def _feed(self, requests: Iterable[Request], chunks: "queue.Queue") -> None:
        """The feeder thread: cut ``requests`` into chunks, ship each worker its share, queue the chunk for
        counting; ``None`` at the end, or the exception that stopped it."""
        try:
            chunk: List[Request] = []
            tokens = 0
            for request in requests:
                chunk.append(request)
                tokens += len(request.tokens)
                if len(chunk) >= CHUNK_REQUESTS or tokens >= CHUNK_TOKENS:
                    self._ship(chunk, chunks)
                    chunk, tokens = [], 0
            if chunk:
                self._ship(chunk, chunks)
        except BaseException as exc:
            self._error = exc
        self._put(chunks, None)

    def _put(self, chunks: "queue.Queue", item: Any) -> None:
        """Queue ``item`` for the counting thread, unless the fleet closes meanwhile (nobody would take it)."""
        while not self._closing:
            try:
                chunks.put(item, timeout=WAIT_SLICE)
                return
            except queue.Full:
                continue

    def _ship(self, chunk: List[Request], chunks: "queue.Queue") -> None:
        """Send each worker its share of ``chunk`` (in trace order), then queue the chunk with its first worker."""
        n, first = self.processes, self._next
        arrays = [as_tokens(r.tokens) for r in chunk]
        for r in chunk:
            check_namespace(r.namespace)
        for k in range(min(n, len(chunk))):
            w = self.workers[(first + k) % n]
            mine = range(k, len(chunk), n)
            namespaces = [chunk[j].namespace for j in mine]
            self._sending = w.index
            named = any(ns is not None for ns in namespaces)
            w.inbox.send(("batch", [len(arrays[j]) for j in mine], namespaces if named else None))
            w.inbox.send_bytes(np.concatenate([arrays[j] for j in mine]) if len(mine) > 1 else arrays[k])
            self._sending = None
        self._next = (first + len(chunk)) % n
        self._put(chunks, (chunk, first))

    def _next_chunk(self, chunks: "queue.Queue") -> Any:
        """The next shipped chunk; meanwhile watch the workers (the feeder may be blocked shipping to a hung one)."""
        last = [self._served.value, time.monotonic()]
        while True:
            try:
                return chunks.get(timeout=WAIT_SLICE)
            except queue.Empty:
                if self._sending is not None:
                    self._check(last)
                else:  # reading the trace: the workers idle, as they should
                    self._check([None, 0.0])

    # ------------------------------------------------------------------ replay
    def replay(self, requests: Iterable[Request], *,
               on_request: Optional[Callable[[Request, int], None]] = None,
               on_record: Optional[Callable[[RequestRecord, int], None]] = None,
               model: Union[str, ModelSpec] = DEFAULT_MODEL,
               hardware: Union[str, HardwareSpec] = DEFAULT_HARDWARE) -> FleetResult:
        """Serve ``requests`` in order across the processes, as the fleet routes; return the totals.

        As :meth:`radixkv.cluster.Cluster.replay` (``on_request``, ``on_record`` with the instance, ``model``
        / ``hardware``; miss reasons as the fleet was made), with ``store`` / ``store_stats`` from the
        shared store and the payload checks (``wrong_pages``). Raises :class:`FleetError` (the fleet is
        then unusable: close it) when a worker dies, raises or hangs. Cost per request: the worker's
        admission with its store round trips, one semaphore hand-off, and the accounting here, which
        overlaps the serving; routed by KV events, also the worker's publishing, the router's hashing
        and the wait for the batch to be heard, none of it overlapped (about 20 ms a request on the
        conversation trace on 2 busy cores).
        """
        if not self._idle:
            raise FleetError("this fleet failed or is replaying already: close it and start another")
        self._idle = False
        self._error = None
        start = time.perf_counter()
        p, n = self.page_size, self.processes
        costs = default_cost_model(p)
        stats = [ReplayStats(p, model=model, hardware=hardware, miss_reasons=self.miss_reasons, tier_costs=costs)
                 for _ in range(n)]
        self._start = self._next
        self._served.value = 0
        serve = self._serve_routed if self.router is not None else self._serve_in_turn
        before = (self.router.counters(), self.router.stats()) if self.router is not None else None
        self._requests0 = [w.requests for w in self.workers]
        count, wrong, verified = serve(requests, stats, on_request, on_record)
        totals = [self._receive(w, "totals", progress=False)[1] for w in self._ask_all("totals")]
        since, self._totals = [_since(now, then) for now, then in zip(totals, self._totals)], totals
        router = self._finish_router(count, before) if self.router is not None else {}
        self._idle = True
        return self._result(stats, since, count, wrong, verified, time.perf_counter() - start, router)

    def _serve_in_turn(self, requests: Iterable[Request], stats: List[ReplayStats],
                       on_request: Optional[Callable], on_record: Optional[Callable]) -> Tuple[int, int, int]:
        """Round robin: the feeder ships chunks ahead, the workers pass the baton, the reports are counted here
        a chunk at a time. Returns (requests, wrong pages, verified pages)."""
        n = self.processes
        width = len(REPORT_FIELDS) + len(self.lower)
        chunks: "queue.Queue" = queue.Queue(maxsize=CHUNKS_AHEAD)
        self._feeder = feeder = threading.Thread(target=self._feed, args=(requests, chunks),
                                                 name="radixkv-fleet-feeder", daemon=True)
        feeder.start()
        count = wrong = verified = 0
        while True:
            item = self._next_chunk(chunks)
            if item is None:
                break
            chunk, first = item
            rows = {}
            for k in range(min(n, len(chunk))):
                w = self.workers[(first + k) % n]
                _, data = self._receive(w, "rows")
                rows[w.index] = iter(np.frombuffer(data, dtype=np.int64).reshape(-1, width).tolist())
            for j, request in enumerate(chunk):
                i = (first + j) % n
                hit, new, declined, evicted, other, bad, checked, _, *loads = next(rows[i])
                loaded = {t: c for t, c in zip(self.lower, loads) if c}
                count_request(stats[i], request, hit, new, declined, evicted, other, loaded, count, i,
                              on_request, on_record)
                self.workers[i].requests += 1
                wrong += bad
                verified += checked
                count += 1
        feeder.join()
        if self._error is not None:
            if isinstance(self._error, OSError):  # a pipe to a worker broke: say which worker, and why
                time.sleep(WAIT_SLICE)
                self._check([None, 0.0])
            raise self._error
        return count, wrong, verified

    def _serve_routed(self, requests: Iterable[Request], stats: List[ReplayStats],
                      on_request: Optional[Callable], on_record: Optional[Callable]) -> Tuple[int, int, int]:
        """Routed by KV events: each request routed from the router's index, sent alone to its worker, its
        report awaited, then its worker's event batch heard before the next is routed. Returns (requests,
        wrong pages, verified pages)."""
        router, p = self.router, self.page_size
        count = wrong = verified = 0
        for request in requests:
            tokens = as_tokens(request.tokens)
            check_namespace(request.namespace)
            route = router.route(tokens, request.namespace)
            i = route.instance
            w = self.workers[i]
            try:
                try:
                    w.inbox.send(("serve", request.namespace))
                    w.inbox.send_bytes(tokens)
                except OSError:  # its pipe broke: say which worker, and why
                    time.sleep(WAIT_SLICE)
                    self._check([None, 0.0])
                    raise FleetError(f"{w.describe()} closed its pipe") from None
                _, data = self._receive(w, "rows", progress=False)
            except BaseException:
                router.failed(route)
                raise
            hit, new, declined, evicted, other, bad, checked, batch, *loads = \
                np.frombuffer(data, dtype=np.int64).tolist()
            try:
                router.served(route, hit // p, batch)
            except RadixKVError as exc:
                raise FleetError(str(exc)) from None
            loaded = {t: c for t, c in zip(self.lower, loads) if c}
            count_request(stats[i], request, hit, new, declined, evicted, other, loaded, count, i, on_request,
                          on_record)
            w.requests += 1
            wrong += bad
            verified += checked
            count += 1
        return count, wrong, verified

    def _finish_router(self, count: int, before: Tuple[Tuple[int, int, float], Dict[str, int]]) -> Dict[str, Any]:
        """The router's fields of this replay's result, once every stream was probed: scored against the
        workers' HBM."""
        router = self.router
        try:
            router.finish()
        except RadixKVError as exc:
            raise FleetError(str(exc)) from None
        residencies = [self._receive(w, "residency", progress=False)[1] for w in self._ask_all("residency")]
        false, missed, seconds = (now - then for now, then in zip(router.counters(), before[0]))
        return dict(event_faults=self.event_faults.spec, router_false_hit_pages=false, router_missed_pages=missed,
                    router_divergent_pages=router.divergent_pages(residencies),
                    router_us_per_request=seconds / count * 1e6 if count else 0.0,
                    router_stats=stream_counts(router.stats(), before[1]))

    def _ask_all(self, what: str) -> List[_Worker]:
        for w in self.workers:
            w.inbox.send((what,))
        return self.workers

    def _result(self, stats: List[ReplayStats], totals: List[Dict[str, Any]], count: int, wrong: int,
                verified: int, seconds: float, router: Dict[str, Any]) -> FleetResult:
        """The totals as the simulator reports them. ``bytes_by_link`` stays empty, as the simulator's does
        without a global index: the workers' transfer ledgers count their own 32-byte payloads, not the
        model's KV, so their sum would mean something else under the same name."""
        by_tier = sum_counts(t["hit_tokens_by_tier"] for t in totals)
        cluster = ClusterResult(
            routing=self.routing, borrowing=False, instances=self.processes, num_blocks=self.num_blocks,
            requests=count, hit_tokens_by_tier=by_tier, requests_by_instance=[w.requests - r for w, r in zip(self.workers, self._requests0)],
            blocks_lent=0, bytes_lent=0, blocks_recalled=0, blocks_moved=0, pages_demoted_on_recall=0, refusals=0,
            bytes_by_link={}, lending="free", pages_evicted_to_lend=0,
            borrowed_hit_tokens=0, borrowed_transfer_seconds=0.0, manager_seconds=0.0, manager_us_per_request=0.0,
            wall_seconds=seconds, **stats_totals(stats), store=redact(self.store_url),
            store_hit_tokens=by_tier.get("store", 0), store_stats=sum_counts(t["store_stats"] for t in totals),
            **router)
        return FleetResult(cluster, self.processes, wrong, verified, self.store_capacity_pages)

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """Stop every worker (asked, then SIGTERM, then SIGKILL) and the redis-server the fleet started.
        Idempotent; safe after any error. Cost: up to a few seconds for a worker that does not exit."""
        if self._sigterm is not None:  # a second SIGTERM while stopping ends the process as it would have
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        if self._idle:  # their pipes are empty: a stop message cannot block, and they exit at once
            for w in self.workers:
                if w.process.is_alive():
                    try:
                        w.inbox.send(("stop",))
                    except (OSError, ValueError):
                        pass
            deadline = time.monotonic() + 2.0
            for w in self.workers:
                w.process.join(max(0.0, deadline - time.monotonic()))
        self._idle = False
        if self.router is not None:
            self.router.close()
        for w in self.workers:  # after an error (or a worker that did not stop): SIGTERM, then SIGKILL
            if w.process.is_alive():
                w.process.terminate()
                w.process.join(2.0)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(2.0)
        self._closing = True
        if self._feeder is not None:  # shipping to a process that is gone fails: the feeder ends
            self._feeder.join(2.0)
        for w in self.workers:
            for conn in (w.inbox, w.outbox):
                conn.close()
        self.workers = []
        if self.server is not None:
            self.server.stop()

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM while a fleet is open: unwind (``with`` and ``finally`` blocks run, :meth:`Fleet.close` among
    them), exiting with the status a SIGTERM death reports to a shell."""
    raise SystemExit(128 + signum)


def _since(now: Dict[str, Any], then: Dict[str, Any]) -> Dict[str, Any]:
    """A worker's cumulative totals (:meth:`~radixkv.fleet.worker.Worker.totals`) less those at the last replay's
    end: what this replay added, as every count of a cluster result is its replay's own. O(counters)."""
    return {name: counts_since(counts, then.get(name, {})) for name, counts in now.items() if isinstance(counts, dict)}


def _last_words(w: _Worker) -> str:
    """The error a dead worker sent before it died ("" if none). O(1)."""
    try:
        while w.outbox.poll():
            message = w.outbox.recv()
            if message[0] == "error":
                return f"failed: {message[1]}"
    except (EOFError, OSError):
        pass
    return ""


def check_store(store: Optional[str], store_blocks: Optional[int]) -> str:
    """A fleet's ``store`` and ``store_blocks`` checked, before anything starts: ``"redis"`` (for ``None``)
    or ``"mooncake"`` (a server of the fleet's own), or the URL its processes share, bounded to
    ``store_blocks`` (:func:`~radixkv.store.backends.bounded`). Raises
    :class:`~radixkv.errors.ArgumentValueError`."""
    if store is None:
        return "redis"
    if store in ("redis", "mooncake"):
        return store
    if not isinstance(store, str) or not store.startswith(("redis://", "rediss://", "mooncake://")):
        raise ArgumentValueError(f"a fleet's store must be one its processes share: redis://HOST:PORT, "
                                 f"mooncake://HOST:PORT, or 'redis' / 'mooncake' (one started for the fleet), "
                                 f"got {store!r}")
    if store_blocks is not None and store.startswith("mooncake://"):
        raise ArgumentValueError("a page bound applies to a Redis store or to the Mooncake master started for "
                                 "the fleet; a running Mooncake store is bounded by its storage nodes' segments")
    return store if store.startswith("mooncake://") else bounded(store, store_blocks)


def replay_fleet(requests: Iterable[Request], processes: int, num_blocks: int, page_size: int = 16,
                 policy: Union[str, PolicySpec] = "lru", *, host_blocks: int = 0, store: Optional[str] = None,
                 store_blocks: Optional[int] = None, miss_reasons: bool = False, timeout: float = 60.0,
                 store_timeout: float = STORE_TIMEOUT, routing: str = "round_robin",
                 event_faults: Union[None, str, EventFaults] = None, **replay: Any) -> FleetResult:
    """Start a :class:`Fleet`, :meth:`Fleet.replay` ``requests`` (``replay``: its keyword arguments), stop it."""
    with Fleet(processes, num_blocks, page_size, policy, host_blocks=host_blocks, store=store,
               store_blocks=store_blocks, miss_reasons=miss_reasons, timeout=timeout,
               store_timeout=store_timeout, routing=routing, event_faults=event_faults) as fleet:
        return fleet.replay(requests, **replay)


__all__ = ["CHUNK_REQUESTS", "CHUNK_TOKENS", "Fleet", "FleetError", "FleetResult", "STORE_TIMEOUT", "check_store",
           "replay_fleet"]

"""One serving process of a fleet: its own cache over the shared store, serving its requests in turn.

A worker is started by :class:`radixkv.fleet.Fleet` (multiprocessing, ``spawn``)
and runs :func:`run_worker`: it builds a :class:`~radixkv.tiers.TieredCache`
(:func:`~radixkv.tiers.config.build_cache`) over the shared page store
(:func:`~radixkv.tiers.config.open_store`), says it is ready, then serves the
batches of requests the coordinator sends it, one request at a time and only
when it holds the *baton*: routed round robin, request ``i`` goes to worker ``i % N``, which waits
on its semaphore, serves the request (admit, write the new pages' payload,
release: the store has every page the request wrote) and posts the next
worker's semaphore. So the fleet serves the trace strictly in order, each
request seeing every page the requests before it stored, and the result does
not depend on scheduling. A hand-off is one semaphore post and one wake-up,
no coordinator round trip; the coordinator only ships batches and reads
the reports (:data:`REPORT_FIELDS`) of whole batches.

**Routed by KV events.** A worker made with ``events`` keeps its cache's KV events and publishes
them after each request, one batch a request (an engine step), on a ZMQ PUB socket of its own
with a replay socket beside it (:class:`~radixkv.events.wire.ZmqEventPublisher`, bound to free
loopback ports it reports when ready). The coordinator's router then decides where each request
goes and sends it alone (``("serve", ...)``): no baton, the coordinator keeps the order.

**Payloads.** The caches keep ``kv_shape=(1,)`` ``float16`` payloads: one page
is ``page_size`` values, 32 bytes at page 16. A page's values are a function of
its namespace and the token prefix through it (:func:`page_payloads`, from a
64-bit prefix key), written into the admission's new blocks before the
release. On every hit the worker reads the hit pages back and compares them,
bit for bit, with what they must hold (:func:`wrong_pages`): a page served
under the wrong tokens, a torn or stale value, counts in ``wrong_pages``.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from ..analysis.replay import pages_loaded
from ..analysis.stats import ReplayStats
from ..cluster import store_counters
from ..events.wire import ZmqEventPublisher, publish_from
from ..policies import PolicySpec
from ..keys import TOKEN_DTYPE
from ..page_keys import PrefixKeys
from ..tiers.config import build_cache, open_store
from ..workload.traces import Request

KV_SHAPE = (1,)
"""The KV shape of one token in a fleet worker's cache: one value, enough to check every page's bytes."""
DTYPE = np.dtype("float16")
"""The payload type (:func:`~radixkv.tiers.config.build_cache` makes ``float16`` caches)."""
PAYLOAD_SEED = 0x6F1EE7
"""Seed of the prefix keys the payloads come from (any fixed value: every worker must use the same)."""
REPORT_FIELDS = ("hit_tokens", "new_pages", "declined", "evicted", "other_pages", "wrong_pages", "verified_pages",
                 "event_batch")
"""What a worker reports per request, in this order, then the hit pages loaded from each lower tier
(the tiers it names when ready). ``event_batch``: the sequence number of the KV event batch it
published after the request (-1: none, or no events)."""
EVENT_ENDPOINT = "tcp://127.0.0.1:*"
"""Where a worker with events binds its PUB and replay sockets: loopback, a free port each."""
BATON_POLL = 1.0
"""Seconds between two looks at whether the coordinator is still alive while waiting for the baton."""

_MIX = np.uint64(0x9E3779B97F4A7C15)
_MUL = np.uint64(0xBF58476D1CE4E5B9)


def page_payloads(keys: np.ndarray, page_size: int) -> np.ndarray:
    """The payloads of the pages with prefix keys ``keys`` (``uint64``): shape ``(len(keys), page_size, 1)``.

    Each value is 16 bits of a multiply-xorshift of the page's key and its position in the
    page, with the exponent's top bit cleared so every value is a finite ``float16`` (no NaN
    whose bits a copy might canonicalize). Deterministic across processes. O(pages x page_size)
    numpy.
    """
    x = keys.astype(np.uint64)[:, None] ^ (np.arange(1, page_size + 1, dtype=np.uint64) * _MIX)[None, :]
    x *= _MUL
    x ^= x >> np.uint64(31)
    x *= _MUL
    words = (x >> np.uint64(48)).astype(np.uint16) & np.uint16(0xBFFF)
    return words.view(DTYPE).reshape(len(keys), page_size, *KV_SHAPE)


def wrong_pages(got: np.ndarray, want: np.ndarray) -> int:
    """How many pages of ``got`` differ from ``want`` in any bit (both ``(pages, page_size, 1)`` float16). O(bytes)."""
    if not len(got):
        return 0
    diff = got.view(np.uint16).reshape(len(got), -1) != want.view(np.uint16).reshape(len(want), -1)
    return int(diff.any(axis=1).sum())


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker builds and how it finds its turn.

    Attributes:
        index: the worker's number (it serves requests ``i`` with ``i % processes == index``).
        processes: workers in the fleet.
        num_blocks, page_size, policy, host_blocks: its cache (as :class:`~radixkv.cluster.Cluster`'s instances).
        store_url: the shared page store (``redis://...``).
        store_timeout: seconds the store may take to answer a call (a later answer is a miss).
        miss_reasons: report, per request, the pages another namespace caches (the ``other_namespace``
            miss reason needs the cache, which lives here).
        parent: the coordinator's pid: a worker whose parent is gone stops waiting and exits.
        events: publish the cache's KV events (vLLM's wire format, ZMQ on loopback) after each request.
    """

    index: int
    processes: int
    num_blocks: int
    page_size: int
    policy: Union[str, PolicySpec]
    host_blocks: int
    store_url: str
    store_timeout: float
    miss_reasons: bool
    parent: int
    events: bool = False


class Worker:
    """A worker's cache and the serving of one request (see the module doc)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        store = open_store(spec.store_url, spec.page_size, kv_shape=KV_SHAPE, dtype=DTYPE.name,
                           timeout=spec.store_timeout)
        self.cache = build_cache(spec.num_blocks, spec.page_size, spec.policy, host_blocks=spec.host_blocks,
                                 load_back="always", kv_shape=KV_SHAPE, store=store, enable_events=spec.events)
        self.publisher: Optional[ZmqEventPublisher] = None
        """The worker's KV event publisher (``events``), else ``None``."""
        if spec.events:
            self.publisher = ZmqEventPublisher(EVENT_ENDPOINT, replay_endpoint=EVENT_ENDPOINT)
        self.lower = tuple(self.cache.cost_model.tier_paths)
        """The lower tiers whose loads each report counts (the cost model's, as a cluster replay counts them)."""
        self._keys = PrefixKeys(spec.page_size, seed=PAYLOAD_SEED)
        # other_pages only: the index it keeps on the cache makes the other-namespace depth O(pages)
        self._others = ReplayStats(spec.page_size, miss_reasons=True) if spec.miss_reasons else None
        self.requests = 0

    def serve(self, tokens: np.ndarray, namespace: Optional[str]) -> List[int]:
        """Admit ``tokens``, check every hit page, write the new pages, release; return its report.

        Cost: the cache's admission (with its store round trips: one read of the chain past the
        cache's own pages, one write of the new pages) plus O(pages) numpy for the payloads.
        """
        cache, p = self.cache, self.spec.page_size
        before = cache.hit_tokens_by_tier
        evicted, declined = cache.evicted_blocks, cache.declined_blocks
        other = self._others.other_pages(cache, Request(tokens, namespace=namespace)) if self._others else 0
        admission = cache.admit(tokens, namespace=namespace)
        hit, new = admission.hit_tokens // p, admission.num_new_pages
        payloads = page_payloads(self._keys.keys(tokens, hit + new, namespace), p)
        wrong = wrong_pages(cache.read(admission.blocks[:hit]), payloads[:hit]) if hit else 0
        if new:
            cache.write(admission.new_blocks, payloads[hit:])
        admission.release()
        batch = publish_from(cache, self.publisher) if self.publisher is not None else None
        loaded = pages_loaded(before, cache.hit_tokens_by_tier, self.lower, p)
        self.requests += 1
        return [admission.hit_tokens, new, cache.declined_blocks - declined, cache.evicted_blocks - evicted, other,
                wrong, hit, -1 if batch is None else batch] + [loaded.get(t, 0) for t in self.lower]

    @property
    def endpoints(self) -> Optional[tuple]:
        """``(PUB address, replay address)`` of the event publisher, ``None`` without events."""
        pub = self.publisher
        return None if pub is None else (pub.endpoint, pub.replay_endpoint)

    def residency(self) -> List[int]:
        """The event hashes of the pages in this worker's HBM (what a router's view of it should hold). O(pages)."""
        log = self.cache.event_log
        return [] if log is None else log.resident_hashes()

    def totals(self) -> Dict[str, Any]:
        """The cumulative counters a fleet result sums: hits per tier and the store's counters."""
        cache = self.cache
        return {"hit_tokens_by_tier": cache.hit_tokens_by_tier, "store_stats": store_counters(cache.store),
                "requests": self.requests}

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
        self.cache.close()
        self.cache.store.close()


def _take_baton(baton: Any, parent: int) -> None:
    """Wait for this worker's turn; exit if the coordinator died meanwhile (nobody would pass it on)."""
    while not baton.acquire(timeout=BATON_POLL):
        if os.getppid() != parent:
            sys.exit(3)


def serve_batch(worker: Worker, tokens: np.ndarray, lengths: Sequence[int], namespaces: Optional[Sequence],
                batons: Sequence[Any], served: Any) -> np.ndarray:
    """Serve a batch of this worker's requests, each in its turn; return their reports (one row each, int64)."""
    spec = worker.spec
    mine, following = batons[spec.index], batons[(spec.index + 1) % spec.processes]
    rows = np.empty((len(lengths), len(REPORT_FIELDS) + len(worker.lower)), dtype=np.int64)
    start = 0
    for j, n in enumerate(lengths):
        _take_baton(mine, spec.parent)
        rows[j] = worker.serve(tokens[start : start + n], namespaces[j] if namespaces else None)
        served.value += 1  # only the baton's holder writes it
        following.release()
        start += n
    return rows


def run_worker(spec: WorkerSpec, inbox: Any, outbox: Any, batons: Sequence[Any], served: Any) -> None:
    """A worker process's body: build the cache, report ``("ready", pid, lower tiers, event endpoints)``, then
    answer messages.

    ``("batch", lengths, namespaces)`` followed by the requests' tokens (``uint32`` bytes, one
    ``send_bytes``): ``("rows", bytes of the int64 reports)`` once the batch is served, each request
    in its turn (the batons); ``("serve", namespace)`` followed by one request's tokens: its row, served
    at once; ``("totals",)``: ``("totals", dict)`` (:meth:`Worker.totals`); ``("residency",)``:
    ``("residency", hashes)`` (:meth:`Worker.residency`); ``("stop",)``: close and exit.
    Any error is reported as ``("error", one line)`` and ends the process (exit 1). Ctrl-C is
    the coordinator's to handle: the worker ignores SIGINT and is stopped by it.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = None
    try:
        worker = Worker(spec)
        outbox.send(("ready", os.getpid(), worker.lower, worker.endpoints))
        while True:
            message = inbox.recv()
            if message[0] == "batch":
                tokens = np.frombuffer(inbox.recv_bytes(), dtype=TOKEN_DTYPE)
                rows = serve_batch(worker, tokens, message[1], message[2], batons, served)
                outbox.send(("rows", rows.tobytes()))
            elif message[0] == "serve":
                tokens = np.frombuffer(inbox.recv_bytes(), dtype=TOKEN_DTYPE)
                row = np.asarray(worker.serve(tokens, message[1]), dtype=np.int64)
                served.value += 1
                outbox.send(("rows", row.tobytes()))
            elif message[0] == "totals":
                outbox.send(("totals", worker.totals()))
            elif message[0] == "residency":
                outbox.send(("residency", worker.residency()))
            else:
                return
    except (EOFError, BrokenPipeError):  # the coordinator is gone: nothing to report to
        return
    except Exception as exc:
        try:
            outbox.send(("error", f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
        finally:
            sys.exit(1)
    finally:
        if worker is not None:
            worker.close()


__all__ = ["DTYPE", "KV_SHAPE", "REPORT_FIELDS", "Worker", "WorkerSpec", "page_payloads", "run_worker", "wrong_pages"]

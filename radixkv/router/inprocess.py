"""EventRouting: a :class:`~radixkv.router.routing.KVRouter` over caches in this process, fed only by their events.

What ``Cluster(routing="kv_events")`` routes with. Before each decision every cache's pending
events are encoded as one vLLM ``KVEventBatch`` (:func:`~radixkv.events.wire.encode_batch`, the
bytes a ZMQ publisher sends) and delivered to the router's index through an
:class:`~radixkv.router.link.EventLink` (faults optional), at once or, with a ``lag`` of N
requests, N decisions later: the router then routes request ``i`` knowing the events of the
requests before ``i - N`` only, as a router whose events take that long to arrive. The router never reads a cache: the
caches are read only to publish their events and, for the report, to compare what the router
predicted with what was served (:attr:`false_hit_pages`, :attr:`missed_pages`) and its view with
their HBM residency (:meth:`divergent_pages`).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from ..errors import ArgumentValueError
from ..keys import check_int
from ..events.log import MEDIUM_GPU
from ..events.wire import encode_batch
from .index import KVIndex
from .link import EventFaults, EventLink
from .routing import KVRouter


class EventRouting:
    """Routes over ``caches`` (each created with ``enable_events``) from their published events alone.

    Args:
        caches: the instances' caches, instance ``i`` being ``caches[i]``.
        page_size: their page size.
        faults: what the event transport does wrong (default: nothing).
        balance: as :class:`KVRouter`.
        lag: decisions a batch takes to arrive (0: before the next one); a replay's answer, as slow,
            carries only the batches due by then. :meth:`finish` lets every batch arrive, so a
            later replay starts from a current view (``Cluster.replay(warmup=...)`` keeps the lag
            across its warm-up).

    Cost per request: encoding and applying the events the caches recorded since the last one
    (O(pages entering or leaving)), and the router's (hashing the prompt's pages).
    """

    def __init__(self, caches: Sequence[Any], page_size: int, faults: Optional[EventFaults] = None, *,
                 balance: float = 0.1, lag: int = 0) -> None:
        self.lag = check_int(lag, "event lag", minimum=0)
        for i, cache in enumerate(caches):
            if getattr(cache, "event_log", None) is None:
                raise ArgumentValueError(f"routing by KV events needs caches created with enable_events "
                                         f"(instance {i} has none)")
        self.caches = list(caches)
        self.index = KVIndex()
        self.router = KVRouter(self.index, range(len(self.caches)), page_size=page_size,
                               hasher=self.caches[0].event_log.hasher, balance=balance)
        self.links = [EventLink(self.index, i, faults) for i in range(len(self.caches))]
        self.false_hit_pages = 0
        """Pages the router predicted on the instance it chose that the admission did not hit."""
        self.missed_pages = 0
        """Pages the admission hit that the router did not predict."""
        self.seconds = 0.0
        """Wall time publishing, applying and routing."""
        self._predicted: Optional[int] = None
        self._decisions = 0
        self._in_flight: Deque[Tuple[int, EventLink, int, bytes]] = deque()  # (decision sent before, link, seq, bytes)

    def publish(self) -> None:
        """Send every cache's pending events as one batch each (an engine step), and let arrive the batches
        due (sent :attr:`lag` decisions ago or more). O(events)."""
        for cache, link in zip(self.caches, self.links):
            events = cache.take_events()
            if events:
                payload = encode_batch(events, ts=0.0)
                self._in_flight.append((self._decisions, link, link.send(payload), payload))
        self._arrive(self._decisions - self.lag)

    def _arrive(self, sent_by: float) -> None:
        """Let arrive, in the order sent, the batches sent before decision ``sent_by``; a replay one of them
        sets off answers up to the newest batch due on its link, not past it (its answer travels as slowly)."""
        in_flight, due = self._in_flight, []
        while in_flight and in_flight[0][0] <= sent_by:
            due.append(in_flight.popleft())
        for _, link, seq, _ in due:
            link.due = seq
        for _, link, seq, payload in due:
            link.arrive(seq, payload)

    def route(self, tokens, namespace: Optional[str] = None) -> int:
        """The instance for a request: events published, then the router's choice. Counts it in flight."""
        start = time.perf_counter()
        self.publish()
        choice = self.router.route(tokens, cache_salt=namespace)
        self._decisions += 1
        self._predicted = choice.overlap_pages
        self.seconds += time.perf_counter() - start
        return choice.instance

    def served(self, instance: int, hit_pages: int) -> None:
        """The request routed last was admitted on ``instance`` with ``hit_pages``: count the prediction's
        error and take it out of flight (a simulated request completes at once)."""
        if self._predicted is None:
            raise ArgumentValueError("served() without a route() before it")
        self.false_hit_pages += max(0, self._predicted - hit_pages)
        self.missed_pages += max(0, hit_pages - self._predicted)
        self._predicted = None
        self.router.done(instance)

    def finish(self) -> None:
        """Publish what is pending, let every batch in flight arrive, send what the links hold back and probe
        every stream's tail: afterwards the index has every batch its replay ring still held."""
        self.publish()
        self._arrive(float("inf"))
        for link in self.links:
            link.flush()

    def divergent_pages(self) -> int:
        """Pages where the index's HBM view and the caches' HBM differ (both ways, all instances). O(pages)."""
        return hbm_divergence(self.index, [cache.event_log.resident_hashes() for cache in self.caches])

    def stats(self) -> Dict[str, int]:
        """The streams' counters summed over instances (index side and transport side)."""
        return stream_totals(self.index, [(link.sent, link.dropped, link.duplicated, link.reordered, link.replays,
                                           link.replayed) for link in self.links])


STREAM_COUNTERS = ("applied", "duplicates", "gaps", "restarts", "clears", "lost", "malformed", "unknown_events")
"""The index's counters of a stream that a router's ``router_stats`` sums over its instances."""
TRANSPORT_COUNTERS = ("sent", "dropped", "duplicated", "reordered", "replays", "replayed")
"""The transport's counters of a stream, each reported as ``batches_<name>``."""


def stream_totals(index: KVIndex, transports: Sequence[Sequence[int]]) -> Dict[str, int]:
    """``router_stats``: the index's :data:`STREAM_COUNTERS` of instances ``0..n-1`` and their transports'
    :data:`TRANSPORT_COUNTERS` (one tuple an instance, in that order), summed, and ``index_pages``. O(n)."""
    totals: Dict[str, int] = {}
    for i, counts in enumerate(transports):
        st = index.status(i)
        for name in STREAM_COUNTERS:
            totals[name] = totals.get(name, 0) + getattr(st, name)
        for name, value in zip(TRANSPORT_COUNTERS, counts):
            totals[f"batches_{name}"] = totals.get(f"batches_{name}", 0) + value
    totals["index_pages"] = len(index)
    return totals


def hbm_divergence(index: KVIndex, residencies: Sequence[Sequence[Any]]) -> int:
    """Pages where ``index``'s HBM view of instances ``0..n-1`` and their true HBM (``residencies``: each one's
    event hashes) differ, both ways, summed. O(pages)."""
    return sum(len(set(truth) ^ index.block_hashes(i, (MEDIUM_GPU, None))) for i, truth in enumerate(residencies))


__all__: List[str] = ["EventRouting", "STREAM_COUNTERS", "TRANSPORT_COUNTERS", "hbm_divergence", "stream_totals"]

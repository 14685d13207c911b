"""The router of a fleet routed by KV events: subscribed to every worker's ZMQ stream, deciding from it alone.

``Fleet(routing="kv_events")`` (``radixkv cluster --processes N --routing kv_events``) runs a
:class:`FleetRouter` in the coordinator: a :class:`~radixkv.router.KVRouter` whose
:class:`~radixkv.router.KVIndex` is fed only by the workers' event batches, each heard on a real
SUB socket (:class:`~radixkv.router.subscriber.Subscription`, one thread a worker) with the
worker's replay socket for gaps. It never reads a worker's cache; the workers' reports and, at
the end, their HBM residency are read only to score it: pages predicted and not served
(:attr:`FleetRouter.false_hit_pages`), served and not predicted (:attr:`~FleetRouter.missed_pages`),
and where its view and the workers' HBM differ at the end (:meth:`FleetRouter.divergent_pages`).

**Timing.** A request is routed once the batch its predecessor's worker published was heard and
handled (:meth:`~radixkv.router.subscriber.Subscription.wait_heard`): the view a router has when
events arrive before the next request does, which makes the run deterministic and equal to the
simulator's ``Cluster(routing="kv_events")``. A batch lost on the wire (``faults``) is, as there,
noticed when the worker's next batch shows the gap, and replayed then; no timer probes a quiet
stream (a probe's timing would make the figures depend on the machine's speed). A batch not heard
within :data:`HEARD_SECONDS` (the SUB socket still joining when it was sent, or a machine too busy)
is fetched by a replay and handled as if heard, through the same fault draws
(:meth:`~radixkv.router.subscriber.Subscription.catch_up`): the run stays the one it would have
been, and ``late`` counts it.

``router_us_per_request`` here is the router's hashing and choosing plus the wait for the batch
to be heard over ZMQ (the simulator's counts encoding, applying and choosing, in one process).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import MissingExtraError, RadixKVError
from ..router import EventFaults, KVIndex, KVRouter, Route
from ..router.inprocess import hbm_divergence, stream_totals

HEARD_SECONDS = 2.0
"""Seconds the router waits to hear a batch a worker says it published before fetching it by a replay."""


class FleetRouter:
    """Routes a fleet's requests from the KV events its workers publish (see the module doc).

    Args:
        endpoints: per worker, ``(PUB address, replay address)`` of its event publisher.
        page_size: the workers' page size.
        faults: faults injected into what each subscription hears (seeded as the simulator's links).
        timeout: seconds a probe may take.
        balance: as :class:`~radixkv.router.KVRouter`.

    Raises :class:`~radixkv.errors.RadixKVError` naming the worker when a subscription cannot connect or
    its thread fails, and :class:`~radixkv.errors.MissingExtraError` without pyzmq and msgspec.
    """

    def __init__(self, endpoints: Sequence[Tuple[str, str]], page_size: int, faults: Optional[EventFaults] = None,
                 *, timeout: float = 60.0, balance: float = 0.1) -> None:
        self.faults = faults or EventFaults()
        self.timeout = float(timeout)
        self.index = KVIndex()
        self.router = KVRouter(self.index, range(len(endpoints)), page_size=page_size, balance=balance)
        self.subscriptions = []
        try:
            for i, (pub, replay) in enumerate(endpoints):
                try:
                    sub = self.router.subscribe(pub, i, replay, idle_probe=None,
                                                faults=faults if self.faults.any else None)
                except MissingExtraError:
                    raise
                except RadixKVError as exc:
                    raise RadixKVError(f"the router's subscription to worker {i}: {exc}") from None
                self.subscriptions.append(sub)
            for sub in self.subscriptions:  # a replay round trip each: the streams answer
                self._probe(sub)
        except BaseException:
            self.close()
            raise
        self.false_hit_pages = 0
        """Pages the router predicted on the worker it chose that the worker did not hit."""
        self.missed_pages = 0
        """Pages a worker hit that the router did not predict."""
        self.late = 0
        """Batches not heard within :data:`HEARD_SECONDS` of their worker's report, fetched by a probe."""
        self.seconds = 0.0
        """Wall time routing and waiting for batches to be heard."""

    def route(self, tokens: Any, namespace: Optional[str]) -> Route:
        """The worker for a request, from the index alone; counted in flight there."""
        start = time.perf_counter()
        try:
            return self.router.route(tokens, cache_salt=namespace)
        finally:
            self.seconds += time.perf_counter() - start

    def served(self, route: Route, hit_pages: int, batch: int) -> None:
        """The request routed by ``route`` was served with ``hit_pages`` and its worker published event batch
        ``batch`` (-1: none): score the prediction, take it out of flight, and wait until the batch was heard."""
        start = time.perf_counter()
        self.false_hit_pages += max(0, route.overlap_pages - hit_pages)
        self.missed_pages += max(0, hit_pages - route.overlap_pages)
        self.router.done(route.instance)
        if batch >= 0:
            sub = self.subscriptions[route.instance]
            if not sub.wait_heard(batch, HEARD_SECONDS):
                self._raise_if_failed(sub)
                self.late += 1
                if not (sub.catch_up(batch, self.timeout) and sub.wait_heard(batch, 0)):
                    self._raise_if_failed(sub)
                    raise RadixKVError(f"the router neither heard nor fetched event batch {batch} of worker "
                                       f"{route.instance} within {HEARD_SECONDS + self.timeout:g} s")
        self.seconds += time.perf_counter() - start

    def failed(self, route: Route) -> None:
        """The request routed by ``route`` was not served (its worker failed): take it out of flight."""
        self.router.done(route.instance)

    def counters(self) -> Tuple[int, int, float]:
        """(false-hit pages, missed pages, seconds) so far: a replay reports its own as a difference."""
        return self.false_hit_pages, self.missed_pages, self.seconds

    def finish(self) -> None:
        """Every stream probed (what faults hold back delivered, the tail replayed): the index then has every
        batch the publishers' rings still hold."""
        for sub in self.subscriptions:
            self._probe(sub)

    def divergent_pages(self, residencies: Sequence[Sequence[int]]) -> int:
        """Pages where the index's HBM view and the workers' HBM (``residencies``: each worker's event
        hashes) differ, both ways, all workers. O(pages)."""
        return hbm_divergence(self.index, residencies)

    def stats(self) -> Dict[str, int]:
        """The streams' counters summed over workers, named as the simulator's
        (:meth:`~radixkv.router.inprocess.EventRouting.stats`; a batch sent is one heard), plus ``late``."""
        totals = stream_totals(self.index, [
            (sub.received, *((sub.wire.dropped, sub.wire.duplicated, sub.wire.reordered) if sub.wire else (0, 0, 0)),
             sub.replays, sub.replayed) for sub in self.subscriptions])
        totals["late"] = self.late
        return totals

    def close(self) -> None:
        """Stop the subscriptions' threads and close their sockets. Idempotent."""
        self.router.close()

    def _probe(self, sub: Any) -> None:
        if not sub.probe(self.timeout):
            self._raise_if_failed(sub)
            raise RadixKVError(f"the router's subscription to worker {sub.instance} did not answer a probe within "
                               f"{self.timeout:g} s")

    @staticmethod
    def _raise_if_failed(sub: Any) -> None:
        if sub.error is not None:
            raise RadixKVError(f"the router's subscription to worker {sub.instance} failed: "
                               f"{type(sub.error).__name__}: {sub.error}")


__all__: List[str] = ["FleetRouter", "HEARD_SECONDS"]

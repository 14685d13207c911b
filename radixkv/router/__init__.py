"""A KV-aware router that knows only what the engines publish.

- :mod:`~radixkv.router.index`: :class:`KVIndex`, per instance the pages it holds and on which
  medium, built from vLLM-format KV event batches, exact under lost, repeated and reordered
  batches, publisher restarts and clears.
- :mod:`~radixkv.router.routing`: :class:`KVRouter`, the instance for a request from the index's
  overlap (weighted by medium) and the load the router sent.
- :mod:`~radixkv.router.subscriber`: :class:`Subscription`, a live ZMQ stream on a thread (pyzmq).
- :mod:`~radixkv.router.link`: :class:`EventLink`, an in-process stream with seeded faults
  (:class:`EventFaults`), for the simulator and tests.

Decoding needs msgspec, subscribing pyzmq (``pip install 'radixkv[events]'``).
"""

from .index import KVIndex, StreamStatus, fill_gaps
from .link import EventFaults, EventLink
from .routing import DEFAULT_MEDIUM_WEIGHTS, KVRouter, Route

__all__ = ["DEFAULT_MEDIUM_WEIGHTS", "EventFaults", "EventLink", "KVIndex", "KVRouter", "Route", "StreamStatus",
           "fill_gaps"]

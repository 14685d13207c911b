"""A fleet of caches that really runs as separate OS processes over one shared page store.

``radixkv cluster TRACE --processes N [--store redis://HOST:PORT]`` (and
:func:`replay_fleet` / :class:`Fleet`) runs each instance of a
:class:`~radixkv.cluster.Cluster`-like fleet in a process of its own, each
embedding its own :class:`~radixkv.tiers.TieredCache` over the shared
:class:`~radixkv.store.PageStore`, and reports what the in-process simulator
reports (round robin, or routed by the workers' KV events), with every hit page's bytes checked. Modules:
:mod:`~radixkv.fleet.server` (the redis-server a fleet starts when it is given
no store), :mod:`~radixkv.fleet.worker` (one
serving process, its payloads and checks), :mod:`~radixkv.fleet.coordinator`
(starting, feeding, counting, stopping), :mod:`~radixkv.fleet.routed` (with
``routing="kv_events"``, the router that hears each worker's KV events over ZMQ
and routes from them alone).
"""

from .coordinator import Fleet, FleetError, FleetResult, replay_fleet
from .server import LocalRedis
from .worker import page_payloads

__all__ = ["Fleet", "FleetError", "FleetResult", "LocalRedis", "page_payloads", "replay_fleet"]

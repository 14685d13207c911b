"""KV events and page hashes: what a router or an offloading connector learns of the cache.

- :mod:`~radixkv.events.hashing`: vLLM's chained page hashes (``BlockHasher``), byte for byte.
- :mod:`~radixkv.events.page_hashes`: the page-hash index, block <-> chain hash of every cached
  page, hashed once when a page enters HBM (``PrefixCache.attach_page_hashes``).
- :mod:`~radixkv.events.log`: the event types and the recorder (``enable_events=True``).
- :mod:`~radixkv.events.wire`: vLLM's ZMQ KV-event protocol (optional ``pyzmq`` and ``msgspec``;
  imported only when used).

Every name below is importable from ``radixkv.events``.
"""

from typing import Any

from .log import (
    EVENT_TYPES, MEDIUM_CPU, MEDIUM_DISK, MEDIUM_GPU, MEDIUM_REMOTE, TIER_MEDIUM, AllBlocksCleared, BlockDemoted,
    BlockPromoted, BlockRemoved, BlockStored, EventLog, ExternalBlockHash, KVCacheEvent, RecordedCache,
    event_field_names, make_event_log)
from .page_hashes import PageHashIndex, PageObserver


def __getattr__(name: str) -> Any:
    """``ZmqEventPublisher`` and ``publish_from`` live in :mod:`radixkv.events.wire`, imported on first
    use (it needs pyzmq)."""
    if name in ("ZmqEventPublisher", "publish_from"):
        from . import wire

        return getattr(wire, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AllBlocksCleared", "BlockDemoted", "BlockPromoted", "BlockRemoved", "BlockStored",
    "EVENT_TYPES", "EventLog", "ExternalBlockHash", "KVCacheEvent", "MEDIUM_CPU", "MEDIUM_DISK",
    "MEDIUM_GPU", "MEDIUM_REMOTE", "PageHashIndex", "PageObserver", "RecordedCache", "TIER_MEDIUM", "event_field_names",
    "make_event_log",
]

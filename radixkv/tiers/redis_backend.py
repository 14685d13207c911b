"""Remote hosts backed by Redis servers: one server is one remote host.

Keys are ``<namespace>:<slot>``, one string value per page (its payload
bytes, or a one-byte marker without payload), namespaced per cache instance
so several caches can share servers. Capacity is enforced by
:class:`~radixkv.tiers.remote.RemoteTier`, never by Redis eviction: run the
servers without ``maxmemory`` eviction (or with ``noeviction``), or a page
evicted by Redis shows up as a counted miss. Each transfer is one pipelined
round trip per host (``SET``s or one ``MGET``), as LMCache's Redis connector
batches.

A server that answers but refuses a write (``OOM`` at ``maxmemory`` under
``noeviction``, a read-only replica: any ``ResponseError``) loses only that
page's copy: :meth:`RedisBackend.put` reports the slot as not stored, the
stack drops the page (``dropped_pages``) and a later lookup of it is a plain
miss. The host stays live; its stored pages keep serving.

Needs redis-py: ``pip install radixkv[redis]``.
"""

from __future__ import annotations

import re
import uuid
from typing import List, Optional, Sequence

from ..store.redisio import client_from_url, load_redis, transport_errors
from .base import RemoteHostError, TierConfigError
from .remote import HostDown


class RedisBackend:
    """Byte storage on Redis servers, one per URL (``redis://host:port/db``).

    Connects and pings every server at construction: an unreachable address
    raises :class:`~radixkv.tiers.base.RemoteHostError` naming it. Later
    connection failures (a server killed mid-replay) raise
    :class:`~radixkv.tiers.remote.HostDown`, which the tier turns into misses.
    Error replies (``ResponseError``: out of memory, read-only) never raise:
    a refused ``SET`` is a slot not stored, a refused ``MGET`` reads as missing
    values, a refused ``UNLINK`` leaves the key to be overwritten.

    Args:
        urls: one Redis URL per remote host.
        namespace: key prefix; default a fresh ``radixkv:<uuid>`` per instance.
        timeout: socket connect/read timeout in seconds (a dead server costs at most this).
    """

    def __init__(self, urls: Sequence[str], namespace: Optional[str] = None, timeout: float = 2.0) -> None:
        if isinstance(urls, str):
            urls = [urls]
        urls = list(urls)
        if not urls or not all(isinstance(u, str) and u for u in urls):
            raise TierConfigError(f"urls must be a non-empty list of Redis URLs, got {urls!r}")
        if namespace is not None and (not isinstance(namespace, str) or not namespace):
            raise TierConfigError(f"namespace must be a non-empty string, got {namespace!r}")
        redis = load_redis(TierConfigError)
        self._errors = transport_errors(redis)
        self._refused = redis.exceptions.ResponseError
        self.urls = urls
        self.num_hosts = len(urls)
        self.namespace = namespace or f"radixkv:{uuid.uuid4().hex[:16]}"
        self._clients = []
        for url in urls:
            try:
                client = client_from_url(url, timeout)
                client.ping()
            except (ValueError, *self._errors) as exc:
                for c in self._clients:
                    c.close()
                raise RemoteHostError(f"cannot reach Redis host {url!r}: {exc}") from None
            self._clients.append(client)

    def _key(self, slot: int) -> str:
        return f"{self.namespace}:{slot}"

    def put(self, host: int, slots: Sequence[int], values: Sequence[bytes]) -> List[bool]:
        """``SET`` each slot's value in one pipeline; per slot, whether the server stored it."""
        try:
            pipe = self._clients[host].pipeline(transaction=False)
            for slot, value in zip(slots, values):
                pipe.set(self._key(slot), value)
            # Error replies come back as exception objects, one per refused SET.
            replies = pipe.execute(raise_on_error=False)
        except self._errors as exc:
            raise HostDown(host, exc) from None
        except self._refused:
            return [False] * len(slots)
        return [not isinstance(r, Exception) for r in replies]

    def get(self, host: int, slots: Sequence[int]) -> List[Optional[bytes]]:
        try:
            return self._clients[host].mget([self._key(s) for s in slots])
        except self._errors as exc:
            raise HostDown(host, exc) from None
        except self._refused:
            return [None] * len(slots)

    def delete(self, host: int, slots: Sequence[int]) -> None:
        if not slots:
            return
        try:
            self._clients[host].unlink(*[self._key(s) for s in slots])
        except self._errors as exc:
            raise HostDown(host, exc) from None
        except self._refused:
            pass  # the key stays until its slot is written again; the tier never reads a freed slot

    def clear(self) -> None:
        """Delete this namespace's keys on every reachable server. O(keys)."""
        # SCAN's glob would also match another backend's namespace that extends this one
        # ("team" and "team:eu") and reads glob characters in ours as patterns: escape them,
        # and keep only "<namespace>:<digits>", the keys this backend writes.
        pattern = re.sub(r"([\\*?\[\]])", r"\\\1", self.namespace) + ":*"
        cut = len(self.namespace.encode("utf-8")) + 1
        for client in self._clients:
            try:
                keys = [k for k in client.scan_iter(match=pattern, count=1000)
                        if (k if isinstance(k, bytes) else k.encode("utf-8"))[cut:].isdigit()]
                for i in range(0, len(keys), 1000):
                    client.unlink(*keys[i: i + 1000])
            except self._errors:
                continue

    def close(self) -> None:
        """Delete this namespace's keys and close the connections."""
        self.clear()
        for client in self._clients:
            client.close()

    def __repr__(self) -> str:
        return f"RedisBackend({self.urls!r}, namespace={self.namespace!r})"

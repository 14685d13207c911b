"""The store on Redis or Valkey: one server, or a Redis Cluster, told apart at first contact.

:class:`RedisPages` opens ``redis://HOST:PORT[/DB]`` without a round trip
and, on the first call that reaches the server (at open if it is up), asks
``INFO cluster``: with ``cluster_enabled:1`` it goes on through redis-py's
``RedisCluster`` (which learns every node from that one), else through one
``redis.Redis``. Round trips per call, for a chain of n pages:

============  ===================================  ==================================
call          one server                           cluster (m masters hold the keys)
============  ===================================  ==================================
``exists``    1: a read-only Lua script counts the  m: a pipeline of ``EXISTS`` per
              leading present keys server-side       node, one node after the other
              (a pipeline of ``EXISTS`` if the
              server refuses scripts)
``get``       1: ``MGET``                           m: a pipeline of ``GET`` per node
``set_nx``    1: a pipeline of ``SET NX``            m: a pipeline of ``SET NX`` per node
``delete``    1: ``UNLINK``                         m: a pipeline of ``UNLINK`` per node
============  ===================================  ==================================

plus one ``INFO cluster`` on the first contact. A single server opened with
``?capacity=PAGES`` reads and writes through Lua scripts that keep an exact LRU
order and evict past the bound (:mod:`~radixkv.store.redis_lru`): still one
round trip a call. Keys spread over the slots
(no hash tags, so no node holds every chain's hot first page), so a chain of
a few pages already touches every master. The cluster is driven node by node
rather than through redis-py's cluster pipeline, which fails as a whole when
one node is down: here a dead node costs only its own keys.

Failures never raise. Every socket has ``timeout`` seconds (0.25 by
default) to connect and to answer, and redis-py does not retry (the store
would rather miss than wait): a server or node that does not answer fails
that call's keys (:data:`~radixkv.store.backends.FAILED`, a miss), then is
skipped for 0.05 s, 0.1 s, ... at most 0.5 s between tries
(:class:`~radixkv.store.backends.Cooloff`), so a restarted server is used
again within half a second. Error replies (``OOM`` at ``maxmemory`` under
``noeviction``, ``MOVED`` during a reshard, ``CLUSTERDOWN``) fail only the
keys they answer; a ``MOVED`` or a lost node also refreshes the cluster's
slot map (at most once a second). A cluster keeps serving the live nodes'
slots only if its nodes run with ``cluster-require-full-coverage no`` (or
have replicas): with the default ``yes`` a dead master stops the whole
cluster after ``cluster-node-timeout``.

Values that are not strings (a hash someone wrote under a store key) read as
missing through ``MGET`` and as failed through ``GET``: never served, but not
deleted either.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union
from urllib.parse import unquote_plus

from ..errors import ArgumentValueError
from . import redis_lru
from .backends import FAILED, Cooloff, Reply, redact, url_capacity
from .redisio import client_from_url, load_redis, transport_errors

LEADING_SCRIPT = """#!lua flags=no-writes
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 0 then return i - 1 end
end
return #KEYS
"""
"""Counts the leading keys that exist, stopping at the first gap (``no-writes``: allowed on replicas and at OOM)."""

_TRANSIENT = ("BUSY", "LOADING", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN")
"""Error replies that say "not now", not "never": a script refused with one of them is tried again next time."""

REFRESH_INTERVAL = 1.0
"""Seconds between two slot-map refreshes of a cluster."""


def split_capacity(url: str) -> Tuple[str, Optional[int]]:
    """``url`` without its ``capacity`` query parameter, and that capacity (``None`` if absent).

    Raises :class:`~radixkv.errors.ArgumentValueError` for a capacity that is
    not a positive integer, or given twice.
    """
    capacity = url_capacity(url)
    if capacity is None:
        return url, None
    # Cut the parameter out of the text rather than rebuild the URL: urlunsplit turns unix:///PATH into
    # unix:/PATH, which redis-py refuses, and re-encoding would rewrite the other parameters.
    base, _, tail = url.partition("?")
    rest, hashed, fragment = tail.partition("#")
    kept = "&".join(p for p in rest.split("&") if unquote_plus(p.partition("=")[0]) != "capacity")
    return base + ("?" + kept if kept else "") + hashed + fragment, capacity


class _Server:
    """One Redis server behind one ``redis.Redis`` (whose pool reconnects on demand)."""

    kind = "redis"

    def __init__(self, owner: "RedisPages", client: Any) -> None:
        self._o = owner
        self._client = client
        self.scripts = True
        """Whether ``exists`` runs :data:`LEADING_SCRIPT` (turned off the first time the server refuses it)."""
        self.evictions = 0
        """Pages this client's writes evicted under a capacity (:mod:`~radixkv.store.redis_lru`)."""

    def _run(self, n: int, fn: Callable[[], Tuple[List[Any], int]]) -> Reply:
        """``fn()``'s ``(values, round trips)`` as a Reply; a failure fails all ``n`` keys."""
        cool = self._o.cooloff
        if not cool.ready():
            return Reply.failed(n, skipped=1)
        try:
            values, trips = fn()
        except self._o.transport as exc:
            cool.failed()
            self._client.connection_pool.disconnect(inuse_connections=False)
            return Reply.failed(n, errors=1, error=exc, round_trips=1)
        except self._o.failures as exc:  # an error reply, or redis-py refusing what it got
            return Reply.failed(n, errors=1, error=exc, round_trips=1)
        cool.ok()
        errors = [v for v in values if isinstance(v, Exception)]
        if errors:
            values = [FAILED if isinstance(v, Exception) else v for v in values]
        return Reply(values, trips, int(bool(errors)), 0, errors[-1] if errors else None)

    def exists(self, keys: Sequence[bytes]) -> Reply:
        def leading() -> Tuple[List[Any], int]:
            if self.scripts:
                n, trips = self._leading(keys)
                if n is not None:
                    return [True] * n + [False] * (len(keys) - n), trips
            else:
                trips = 0
            pipe = self._client.pipeline(transaction=False)
            for k in keys:
                pipe.exists(k)
            replies = pipe.execute(raise_on_error=False)
            return [v if isinstance(v, Exception) else bool(v) for v in replies], trips + 1
        return self._run(len(keys), leading)

    def _leading(self, keys: Sequence[bytes]) -> Tuple[Optional[int], int]:
        """The script's count and its round trip; ``None`` when the server refuses scripts (then never again).

        ``EVAL`` with the script's text every time (120 bytes; the server
        compiles it once and keeps it by its SHA-1) rather than ``EVALSHA``,
        which costs a second round trip whenever the server has not seen it.
        """
        try:
            return int(self._client.eval(LEADING_SCRIPT, len(keys), *keys)), 1
        except self._o.refused as exc:
            if str(exc).startswith(_TRANSIENT):
                raise  # this call fails; scripts stay on
            self.scripts = False  # scripting disabled, denied, or too old for the flags: pipelines from now on
            return None, 1

    def get(self, keys: Sequence[bytes], touch: Sequence[bytes] = ()) -> Reply:
        if self._o.capacity is not None:
            return self._run(len(keys), lambda: (redis_lru.get(self._client, keys, touch), 1))
        if not touch:
            return self._run(len(keys), lambda: (self._client.mget(keys), 1))

        def touch_and_get() -> Tuple[List[Any], int]:  # TOUCH and MGET in one pipeline: one round trip
            pipe = self._client.pipeline(transaction=False)
            pipe.touch(*touch)
            pipe.mget(keys)
            replies = pipe.execute(raise_on_error=False)
            got = replies[-1]
            return ([got] * len(keys) if isinstance(got, Exception) else got), 1
        return self._run(len(keys), touch_and_get)

    def set_nx(self, keys: Sequence[bytes], values: Sequence[bytes]) -> Reply:
        capacity = self._o.capacity
        if capacity is not None:
            def write_bounded() -> Tuple[List[Any], int]:
                stored, evicted = redis_lru.set_nx(self._client, keys, values, capacity)
                self.evictions += evicted
                return stored, 1
            return self._run(len(keys), write_bounded)

        def write() -> Tuple[List[Any], int]:
            pipe = self._client.pipeline(transaction=False)
            for k, v in zip(keys, values):
                pipe.set(k, v, nx=True)
            return [r if isinstance(r, Exception) else bool(r) for r in pipe.execute(raise_on_error=False)], 1
        return self._run(len(keys), write)

    def delete(self, keys: Sequence[bytes]) -> Reply:
        def unlink() -> Tuple[List[Any], int]:
            if self._o.capacity is not None:
                redis_lru.delete(self._client, keys)
            else:
                self._client.unlink(*keys)
            return [True] * len(keys), 1
        return self._run(len(keys), unlink)

    def info(self) -> Dict[str, Any]:
        info: Dict[str, Any] = {"lookup": "script" if self.scripts else "pipeline"}
        if self._o.capacity is not None:
            info.update(capacity=self._o.capacity, evictions=self.evictions)
        return info

    def close(self) -> None:
        self._client.close()


class _Cluster:
    """A Redis Cluster through ``RedisCluster``'s slot map, one pipeline per node, each node cooled off alone."""

    kind = "redis-cluster"

    def __init__(self, owner: "RedisPages", cluster: Any) -> None:
        self._o = owner
        self._rc = cluster
        self._cooloffs: Dict[str, Cooloff] = {}
        self._next_refresh = 0.0
        self.refreshes = 0

    def _fan(self, keys: Sequence[bytes], queue: Callable[[Any, List[int]], None],
             parse: Callable[[Any], Any]) -> Reply:
        """Queue each node's keys (``queue(pipe, indices)``) on its own pipeline and run them node by node."""
        o, rc = self._o, self._rc
        values: List[Any] = [FAILED] * len(keys)
        groups: Dict[str, Tuple[Any, List[int]]] = {}
        trips = errors = skipped = 0
        error: Optional[BaseException] = None
        refresh = False
        for i, key in enumerate(keys):
            try:
                node = rc.get_node_from_key(key)
            except o.cluster_error as exc:  # a slot no node serves
                error, refresh = exc, True
                continue
            groups.setdefault(node.name, (node, []))[1].append(i)
        for name, (node, idx) in groups.items():
            cool = self._cooloffs.setdefault(name, Cooloff())
            if not cool.ready():
                skipped += 1
                continue
            trips += 1
            client = rc.get_redis_connection(node)
            try:
                pipe = client.pipeline(transaction=False)
                queue(pipe, idx)
                replies = pipe.execute(raise_on_error=False)
            except o.transport as exc:
                cool.failed()
                client.connection_pool.disconnect(inuse_connections=False)
                errors, error, refresh = errors + 1, exc, True
                continue
            except o.failures as exc:
                errors, error = errors + 1, exc
                continue
            cool.ok()
            failed = False
            for i, r in zip(idx, replies):
                if isinstance(r, Exception):
                    failed, error = True, r
                    refresh = refresh or str(r).startswith(("MOVED", "ASK", "CLUSTERDOWN"))
                else:
                    values[i] = parse(r)
            errors += failed
        if refresh:
            trips += self._refresh()
        return Reply(values, trips, errors, skipped, error)

    def _refresh(self) -> int:
        """Reload the slot map if the last reload is :data:`REFRESH_INTERVAL` old; its round trips (0 or 1)."""
        now = time.monotonic()
        if now < self._next_refresh:
            return 0
        self._next_refresh = now + REFRESH_INTERVAL
        try:
            self._rc.nodes_manager.initialize()
            self.refreshes += 1
        except (*self._o.transport, self._o.cluster_error, self._o.failures):
            pass
        return 1

    def exists(self, keys: Sequence[bytes]) -> Reply:
        return self._fan(keys, lambda pipe, idx: [pipe.exists(keys[i]) for i in idx], bool)

    def get(self, keys: Sequence[bytes], touch: Sequence[bytes] = ()) -> Reply:
        if touch:  # one more pipeline per node holding them: recency only, its failures change nothing
            self._fan(touch, lambda pipe, idx: [pipe.touch(touch[i]) for i in idx], lambda v: v)
        return self._fan(keys, lambda pipe, idx: [pipe.get(keys[i]) for i in idx], lambda v: v)

    def set_nx(self, keys: Sequence[bytes], values: Sequence[bytes]) -> Reply:
        return self._fan(keys, lambda pipe, idx: [pipe.set(keys[i], values[i], nx=True) for i in idx], bool)

    def delete(self, keys: Sequence[bytes]) -> Reply:
        return self._fan(keys, lambda pipe, idx: [pipe.unlink(keys[i]) for i in idx], lambda v: True)

    def info(self) -> Dict[str, Any]:
        down = sorted(name for name, c in self._cooloffs.items() if c.failures)
        return {"nodes": len(self._rc.get_primaries()), "nodes_failing": down, "slot_map_refreshes": self.refreshes}

    def close(self) -> None:
        self._rc.close()


class RedisPages:
    """The store's values on a Redis/Valkey server or cluster (see the module docstring).

    Args:
        url: ``redis://HOST:PORT[/DB]``, ``rediss://...`` or ``unix://PATH``; a cluster
            is found from any one of its nodes (DB must then be 0). ``?capacity=PAGES``
            bounds a single server to that many pages, least recently used evicted
            exactly (:mod:`~radixkv.store.redis_lru`).
        timeout: seconds to connect and to answer, per socket operation.

    Raises :class:`~radixkv.errors.ArgumentValueError` for a URL redis-py
    cannot parse, a capacity that is not a positive integer, or a cluster
    reached with a DB other than 0 or with a capacity.
    """

    def __init__(self, url: str, timeout: float = 0.25) -> None:
        redis = self.redis = load_redis()
        self.transport = transport_errors(redis)
        self.refused = redis.exceptions.ResponseError
        """Error replies: the server answered, and said no."""
        self.failures = redis.exceptions.RedisError
        """Anything else redis-py raises (error replies included); a call failing so fails its keys."""
        self.cluster_error = redis.exceptions.RedisClusterException
        self.url = redact(url)
        self.timeout = timeout
        self.cooloff = Cooloff()
        """The cool-off of the server named by the URL (first contact; every call of a single server)."""
        url, self.capacity = split_capacity(url)
        """The page bound of ``?capacity=`` (``None``: the server's own ``maxmemory``, if any)."""
        self._url = url
        try:
            self._client = client_from_url(url, timeout, retries=0)
        except ValueError as exc:
            raise ArgumentValueError(f"bad Redis URL {self.url!r}: {exc}") from None
        self._impl: Optional[Union[_Server, _Cluster]] = None
        self._contact_lock = threading.Lock()
        self.open_round_trips = self._contact(raise_config=True)[0]
        """Round trips made while opening: :meth:`_contact`'s, if the server answered."""

    @property
    def kind(self) -> str:
        return self._impl.kind if self._impl is not None else "redis?"

    def _contact(self, raise_config: bool = False) -> Tuple[int, Optional[BaseException]]:
        """Ask the server what it is and build the client for it; ``(round trips, the failure or None)``.

        One round trip (``INFO cluster``); a cluster's start-up (``RedisCluster``
        reading the slot map) counts as one more.
        """
        with self._contact_lock:
            if self._impl is not None or not self.cooloff.ready():
                return 0, None
            return self._contact_locked(raise_config)

    def _contact_locked(self, raise_config: bool) -> Tuple[int, Optional[BaseException]]:
        trips = 1
        try:
            try:
                clustered = self._client.info("cluster").get("cluster_enabled") == 1
            except self.refused:  # INFO renamed or denied: only a cluster needs it, and a cluster allows it
                clustered = False
            if clustered:
                if self.capacity is not None:
                    raise ValueError("a capacity needs a single server (its LRU order is one sorted set); bound "
                                     "a cluster's nodes with maxmemory")
                trips += 1
                cluster = self._open_cluster()
                self._client.close()
                self._impl = _Cluster(self, cluster)
            else:
                self._impl = _Server(self, self._client)
        except self.transport as exc:
            self.cooloff.failed()
            self._client.connection_pool.disconnect(inuse_connections=False)
            return trips, exc
        except (self.cluster_error, self.failures, ValueError) as exc:
            if raise_config:
                raise ArgumentValueError(f"cannot use Redis Cluster at {self.url!r}: {exc}") from None
            self.cooloff.failed()
            return trips, exc
        self.cooloff.ok()
        return trips, None

    def _open_cluster(self) -> Any:
        from redis.backoff import NoBackoff
        from redis.cluster import RedisCluster
        from redis.retry import Retry

        return RedisCluster.from_url(self._url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout,
                                     retry=Retry(NoBackoff(), 0), require_full_coverage=False)

    def _call(self, op: str, keys: Sequence[bytes], *args: Any) -> Reply:
        if not keys:
            return Reply([])
        trips = 0
        if self._impl is None:  # not reached yet: try now, unless it is cooling off
            trips, error = self._contact()
            if self._impl is None:
                return Reply.failed(len(keys), errors=int(error is not None), skipped=int(error is None),
                                    error=error, round_trips=trips)
        reply = getattr(self._impl, op)(keys, *args)
        reply.round_trips += trips
        return reply

    def exists(self, keys: Sequence[bytes]) -> Reply:
        return self._call("exists", keys)

    def get(self, keys: Sequence[bytes], touch: Sequence[bytes] = ()) -> Reply:
        return self._call("get", keys, touch)

    def set_nx(self, keys: Sequence[bytes], values: Sequence[bytes]) -> Reply:
        return self._call("set_nx", keys, values)

    def delete(self, keys: Sequence[bytes]) -> Reply:
        return self._call("delete", keys)

    def info(self) -> Dict[str, Any]:
        return self._impl.info() if self._impl is not None else {}

    def close(self) -> None:
        if self._impl is not None:
            self._impl.close()
        else:
            self._client.close()

    def __repr__(self) -> str:
        return f"RedisPages({self.url!r}, kind={self.kind!r})"

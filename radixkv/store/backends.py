"""Where the store's values live: the backend contract, the in-process backend, and opening one by URL.

A backend stores opaque values under byte keys and answers in batches: one
call per request (one round trip to a server, one lock hold in process). It
never raises for an unreachable or failing server: the keys it could not
answer come back as :data:`FAILED`, and the :class:`Reply` says how many
calls failed or were not sent. The store above it decides what a value means.

URLs (:func:`open_backend`):

* ``memory://NAME[?capacity=PAGES]``: :class:`MemoryBackend`, a dict shared by
  every store of the process that opens the same name (the simulator's store);
  with a capacity, least recently used pages are evicted (each call makes its
  pages the newest, a chain's last page first, so a chain shortens from its
  end), exactly as a Redis server opened with ``?capacity=`` does.
* ``redis://HOST:PORT[/DB][?capacity=PAGES]`` (also ``rediss://``, ``unix://``):
  one Redis or Valkey server, or a Redis Cluster, told apart at first contact
  (:mod:`radixkv.store.redis_backends`; needs ``radixkv[redis]``).
* ``mooncake://HOST:RPC_PORT[?metadata=URL&...]``: a Mooncake Store master and
  the storage nodes it places pages on (:mod:`radixkv.store.mooncake_backend`;
  needs ``radixkv[mooncake]``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Protocol, Sequence
from urllib.parse import parse_qs, parse_qsl, urlsplit

from ..errors import ArgumentTypeError, ArgumentValueError
from ..keys import check_int


class _Failed:
    """The answer for a key whose server did not answer (or answered with an error)."""

    _instance: Optional["_Failed"] = None

    def __new__(cls) -> "_Failed":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "FAILED"

    def __bool__(self) -> bool:
        return False


FAILED: Any = _Failed()
"""Per-key answer of a backend call that failed for that key (a miss to the store)."""


@dataclasses.dataclass
class Reply:
    """A backend's answer to one batched call.

    ``values`` holds one answer per key: for ``exists`` a bool, for ``get``
    the value or ``None``, for ``set_nx`` ``True`` (stored) or ``False``
    (a value was there already), for ``delete`` ``True``; or :data:`FAILED`.
    ``round_trips`` counts requests sent to servers, ``errors`` the ones that
    failed (no answer, or an error reply), ``skipped`` the ones not sent
    because their server is cooling off after a failure.
    """

    values: List[Any]
    round_trips: int = 0
    errors: int = 0
    skipped: int = 0
    error: Optional[BaseException] = None

    @classmethod
    def failed(cls, n: int, *, errors: int = 0, skipped: int = 0, error: Optional[BaseException] = None,
               round_trips: int = 0) -> "Reply":
        """Every key failed."""
        return cls([FAILED] * n, round_trips, errors, skipped, error)


class Backend(Protocol):
    """Batched byte storage by key. No method raises for a server that fails; see :class:`Reply`."""

    kind: str
    """``"memory"``, ``"redis"``, ``"redis-cluster"`` (``"redis?"`` until a server first answered) or ``"mooncake"``."""
    url: str
    """The URL it was opened with, any password masked."""
    open_round_trips: int
    """Round trips made while opening (a Redis backend's first contact); the store counts them."""

    def exists(self, keys: Sequence[bytes]) -> Reply:
        """Whether each key is present; may answer ``False`` for every key after the first absent one."""

    def get(self, keys: Sequence[bytes], touch: Sequence[bytes] = ()) -> Reply:
        """The values of ``keys`` (``None`` where absent), one round trip; ``touch``: keys whose
        recency is refreshed in the same round trip (the pages a reader holds already)."""

    def set_nx(self, keys: Sequence[bytes], values: Sequence[bytes]) -> Reply:
        """Store each value unless its key exists (first writer wins)."""

    def delete(self, keys: Sequence[bytes]) -> Reply: ...

    def info(self) -> Dict[str, Any]:
        """Backend-specific numbers for :meth:`PageStore.stats`."""

    def close(self) -> None: ...


class Cooloff:
    """When to try a failed server again: after ``base * 2**k`` seconds for its ``k+1``-th failure in a row,
    at most ``cap``. A success resets it.

    Between tries every call to that server is skipped (an immediate miss), so
    a dead or black-holed server costs one failed call per period, not one
    per request. ``cap`` bounds how long a restarted server goes unused.
    """

    def __init__(self, base: float = 0.05, cap: float = 0.5) -> None:
        self.base, self.cap = base, cap
        self.failures = 0
        self._until = 0.0

    def ready(self) -> bool:
        return self.failures == 0 or time.monotonic() >= self._until

    def failed(self) -> None:
        self.failures += 1
        self._until = time.monotonic() + min(self.cap, self.base * 2 ** min(self.failures - 1, 30))

    def ok(self) -> None:
        self.failures = 0


class MemoryBackend:
    """In-process pages: one ordered dict behind a lock, shared by name, optionally LRU-bounded.

    ``get`` makes the pages it finds the most recently used (Redis's ``GET``
    does the same); ``exists`` and a refused ``set_nx`` leave recency alone.
    Setting :attr:`available` to ``False`` makes every call fail as an
    unreachable server's would (an outage drill for simulations). Thread-safe.

    Args:
        name: the name it is shared under (:func:`open_backend` keeps one per name).
        capacity: most pages held (``None``: unbounded); the least recently used go first.
    """

    kind = "memory"

    def __init__(self, name: str, capacity: Optional[int] = None) -> None:
        self.name = name
        self.url = f"memory://{name}" + (f"?capacity={capacity}" if capacity is not None else "")
        self.capacity = None if capacity is None else check_int(capacity, "capacity", minimum=1, bound="> 0")
        self.available = True
        self.open_round_trips = 0
        self.evictions = 0
        self._data: "OrderedDict[bytes, bytes]" = OrderedDict()
        self._lock = threading.Lock()

    def _down(self, n: int) -> Reply:
        return Reply.failed(n, errors=1, error=ConnectionError(f"{self.url} is unavailable"))

    def exists(self, keys: Sequence[bytes]) -> Reply:
        if not self.available:
            return self._down(len(keys))
        data = self._data
        with self._lock:
            return Reply([k in data for k in keys], 1)

    def get(self, keys: Sequence[bytes], touch: Sequence[bytes] = ()) -> Reply:
        if not self.available:
            return self._down(len(keys))
        data = self._data
        with self._lock:
            values = [data.get(k) for k in keys]
            for k, v in zip(reversed(keys), reversed(values)):  # last first: a chain's root ends up newest
                if v is not None:
                    data.move_to_end(k)
            for k in reversed(touch):
                if k in data:
                    data.move_to_end(k)
        return Reply(values, 1)

    def set_nx(self, keys: Sequence[bytes], values: Sequence[bytes]) -> Reply:
        if not self.available:
            return self._down(len(keys))
        data, stored = self._data, []
        with self._lock:
            added: Dict[bytes, bytes] = {}
            for k, v in zip(keys, values):
                new = k not in data and k not in added  # a key given twice is stored once, its first value
                if new:
                    added[k] = v
                stored.append(new)
            for k in reversed(list(added)):  # last first: a chain's root ends up newest
                data[k] = added[k]
            if self.capacity is not None:
                while len(data) > self.capacity:
                    data.popitem(last=False)
                    self.evictions += 1
        return Reply(stored, 1)

    def delete(self, keys: Sequence[bytes]) -> Reply:
        if not self.available:
            return self._down(len(keys))
        with self._lock:
            for k in keys:
                self._data.pop(k, None)
        return Reply([True] * len(keys), 1)

    def keys(self) -> List[bytes]:
        """The keys held, least recently used first (a snapshot; for tests and inspection). O(n)."""
        with self._lock:
            return list(self._data)

    def raw(self) -> Dict[bytes, bytes]:
        """The stored values by key, unverified (a snapshot; for tests and inspection). O(n)."""
        with self._lock:
            return dict(self._data)

    def clear(self) -> None:
        """Drop every page. O(n)."""
        with self._lock:
            self._data.clear()

    def info(self) -> Dict[str, Any]:
        return {"pages": len(self._data), "capacity": self.capacity, "evictions": self.evictions}

    def close(self) -> None:
        """Nothing to release: the pages stay for the other stores of the name (:func:`drop_memory` frees them)."""

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"MemoryBackend({self.name!r}, capacity={self.capacity!r}, pages={len(self._data)})"


_MEMORY: Dict[str, MemoryBackend] = {}
_MEMORY_LOCK = threading.Lock()


def memory_backend(name: str, capacity: Optional[int] = None) -> MemoryBackend:
    """The process's :class:`MemoryBackend` called ``name``, made on first use.

    Raises :class:`~radixkv.errors.ArgumentValueError` when it exists with
    another capacity (two simulated engines must agree on the store's size).
    """
    with _MEMORY_LOCK:
        backend = _MEMORY.get(name)
        if backend is None:
            backend = _MEMORY[name] = MemoryBackend(name, capacity)
        elif capacity is not None and backend.capacity != capacity:
            raise ArgumentValueError(f"memory://{name} is open with capacity {backend.capacity}, not {capacity}")
        return backend


def drop_memory(name: str) -> None:
    """Forget the in-process store ``name`` and its pages (stores still holding it keep their reference)."""
    with _MEMORY_LOCK:
        _MEMORY.pop(name, None)


def bounded(url: str, pages: Optional[int]) -> str:
    """``url`` bounded to ``pages`` (its ``?capacity=``; ``url`` itself for ``None``): how a page bound
    given apart from the URL (``store_blocks``, ``--store-blocks``) reaches a memory or Redis backend.
    Raises :class:`~radixkv.errors.ArgumentValueError` when the URL names a capacity already. O(len(url))."""
    if pages is None:
        return url
    query = urlsplit(url).query
    if any(key == "capacity" for key, _ in parse_qsl(query, keep_blank_values=True)):
        raise ArgumentValueError(f"give the store's page bound once, not also in the URL's ?capacity=: {redact(url)!r}")
    return url + ("&" if query else "?") + f"capacity={pages}"


def url_capacity(url: str) -> Optional[int]:
    """The page bound ``url``'s ``?capacity=`` names (``None``: none). Raises
    :class:`~radixkv.errors.ArgumentValueError` unless it is one positive ASCII number (unicode digits
    such as "²" pass ``isdigit`` and fail ``int``). O(len(url))."""
    found = [v for k, v in parse_qsl(urlsplit(url).query, keep_blank_values=True) if k == "capacity"]
    if not found:
        return None
    if len(found) > 1 or not (found[0].isascii() and found[0].isdigit()) or int(found[0]) < 1:
        raise ArgumentValueError(f"capacity must be one positive number of pages, got {found} in {redact(url)!r}")
    return int(found[0])


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for stats and messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return parts._replace(netloc=f"{user}:***@{netloc[-1]}").geturl()


def _memory_from_url(url: str) -> MemoryBackend:
    parts = urlsplit(url)
    name = parts.netloc + parts.path
    if not name:
        raise ArgumentValueError(f"memory store URL needs a name (memory://NAME), got {url!r}")
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"capacity"})
    if unknown or parts.fragment:
        raise ArgumentValueError(f"memory store URL takes only ?capacity=PAGES, got {url!r}")
    return memory_backend(name, url_capacity(url))


REDIS_SCHEMES = ("redis", "rediss", "unix")


def open_backend(url: str, timeout: float = 0.25) -> Backend:
    """The backend ``url`` names (see the module docstring); ``timeout`` is a Redis socket timeout in seconds
    (for Mooncake, what a request to the master may take).

    Raises :class:`~radixkv.errors.ArgumentValueError` for a URL it cannot
    use, :class:`~radixkv.errors.MissingExtraError` for a Redis URL without
    redis-py or a Mooncake URL without Mooncake. Never for an unreachable
    server: that is a miss on every call until it answers.
    """
    if not isinstance(url, str):
        raise ArgumentTypeError(f"store URL must be a str, got {url!r}")
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        return _memory_from_url(url)
    if scheme in REDIS_SCHEMES:
        from .redis_backends import RedisPages

        return RedisPages(url, timeout)
    if scheme == "mooncake":
        from .mooncake_backend import MooncakePages

        return MooncakePages(url, timeout)
    raise ArgumentValueError(f"store URL must be memory://NAME, redis://HOST:PORT[/DB] or mooncake://HOST:PORT, "
                             f"got {redact(url)!r}")


__all__ = ["Backend", "Cooloff", "FAILED", "MemoryBackend", "Reply", "bounded", "drop_memory", "memory_backend",
           "open_backend"]

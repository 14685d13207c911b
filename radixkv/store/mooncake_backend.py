"""The store on Mooncake Store: a ``mooncake_master`` that places pages in memory lent by storage nodes.

Mooncake keeps no values itself: its master holds metadata (which key is in
which node's segment, its lease) and the bytes live in the *segments* that
clients mount, moved by Mooncake's transfer engine (TCP here, RDMA where the
hardware has it). :class:`MooncakePages` is a client that lends no memory by
default (``segment=0``), so a page outlives the engine that wrote it as it
does on Redis; the memory comes from storage nodes (``mooncake_client``
processes, or engines opened with ``segment=BYTES``). :class:`MooncakeMaster`
starts a master and one storage node on free loopback ports: the store of
``open_store("mooncake")`` and the tests'.

URL: ``mooncake://HOST:RPC_PORT[?metadata=URL&segment=BYTES&buffer=BYTES&local=HOST]``;
``metadata`` is the master's HTTP metadata server (default
``http://HOST:8080/metadata``, Mooncake's default port), ``segment`` the
memory this process lends to the pool (default 0), ``buffer`` its transfer
buffer (default 64 MiB: one Mooncake call moves at most half of it), ``local``
the address it registers and binds its transfer engine to (default: the
address that routes to HOST, 127.0.0.1 for a loopback master). Sizes take
``K``/``M``/``G`` suffixes (powers of 1024).

Keys are strings: a store key's leading printable ASCII through its first
``:`` stays text and the rest is hex, so ``b"rkv:" + 32 bytes`` is
``"rkv:" + 64 hex digits`` (:func:`mooncake_key`; one-to-one).

Calls, for a chain of n pages (each Mooncake call is one request to the
master, and a get or put also moves the bytes to or from the segments):

==========  =====================================================================
call        Mooncake calls (round trips counted)
==========  =====================================================================
``exists``  1: ``batch_is_exist``
``get``     1: ``batch_is_exist`` of the held pages (``touch``) and the chain; then,
            if the chain starts with a present page, 1 ``get_batch`` per 512 pages
            (fewer if the largest value seen says they would not fit half the
            transfer buffer) of the leading present run only (nothing past a gap
            is moved)
``set_nx``  1: ``batch_is_exist``; then 1 ``put_batch`` per 512 absent pages or
            ``buffer / 2`` bytes of their values, whichever comes first
``delete``  1: ``batch_remove(force=True)``
==========  =====================================================================

Mooncake's put never overwrites (the master refuses a second ``PutStart`` of
a key, and the client reports that as success), so the first writer wins
even between two engines racing. The existence check before it tells pages
stored from pages already there and keeps their bytes off the wire; the race
it leaves is in the counts only: two engines that both find a page absent
both count it as written, while Mooncake keeps one of the two values.

Recency: Mooncake evicts at its high watermark (``eviction_high_watermark_ratio``,
0.9) the objects whose read lease ran out longest ago, in the background, and
refuses a put while it has no room (that put's pages fail: ``pages_failed``).
The watermark counts bytes only: with its default allocator (``offset``) a
segment also holds at most 2**20 - 1 objects, and a store of small pages that
reaches that count refuses every put from then on without evicting anything
(measured: 1,048,575 pages of 77 bytes in a 1 GiB segment, 8% full).
:class:`MooncakeMaster` starts its master with ``-memory_allocator=cachelib``,
which has no such count (1.3 million such pages stored).
Every existence check and every get grants a read lease (``default_kv_lease_ttl``
of the master; an object under a lease is never evicted), so a lookup, a
get, and ``touch`` (the held pages are in the get's existence check) all make
pages recently used, at no extra round trip.

Failures never raise. Every request to the master has ``timeout`` seconds
(0.25 by default; Mooncake's own is 30 s). A call whose master does not
answer fails its keys (:data:`~radixkv.store.backends.FAILED`); then the
master is skipped while it cools off (:class:`~radixkv.store.backends.Cooloff`),
and before the next call a TCP connect (``timeout`` seconds at most) checks
that its port accepts: Mooncake's client spends about 4 s inside every call
while its master is down, and a ``setup`` against a dead master about 90 s,
so neither is made until the port answers. A master that accepts and never
answers (stopped, or hung) costs one ``timeout`` per cool-off. The client
reconnects and the storage nodes remount their segments by themselves once
the master is back (about a second); a restarted master has lost every key,
so that is a cold store. A backend opened while its master is down sets its
client up at the first call that finds the master up.
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import parse_qs, urlsplit

import numpy as np

from ..errors import ArgumentValueError, MissingExtraError, RadixKVError
from .backends import FAILED, Cooloff, Reply
from .codec import HEADER_BYTES

DEFAULT_METADATA_PORT = 8080
"""Mooncake's default HTTP metadata port (``-http_metadata_server_port``): ``metadata`` defaults to it."""
DEFAULT_BUFFER = 64 << 20
"""Bytes of a client's transfer buffer: one Mooncake call moves at most half of it."""
LEASE_MS = 500
"""The read lease of the masters :class:`MooncakeMaster` starts (Mooncake's default is 10 s): how long a
page read or looked up is safe from eviction. Short, so a full store can evict what was read a moment ago."""
EMBEDDED_SEGMENT = 256 << 20
"""The storage node's segment of ``open_store("mooncake")``."""
MAX_PAGES_PER_CALL = 512
"""Most pages one ``get_batch`` or ``put_batch`` moves: Mooncake's TCP transport queues 1,024 transfers per
peer (and admits 1,024 more), and a call past that stalls 60 s and fails (0.3.13)."""
MIN_SEGMENT = 16 << 20
"""The smallest segment a ``mooncake_client`` storage node accepts."""
RESIDENT_BYTES_PER_VALUE_BYTE = 1.13
"""Segment bytes a stored page takes per byte of its value, in a segment that has reached the default
eviction watermark (:data:`DEFAULT_WATERMARK`; cachelib's allocation classes, and the room the watermark
keeps free): a 32 MiB segment held 273,735 values of 109 bytes (122.6 bytes each), a 64 MiB one 99,962
of 589 (671.3)."""
DEFAULT_WATERMARK = 0.9
"""The master's ``-eviction_high_watermark_ratio`` by default: eviction starts at this share of a segment."""
SEGMENT_STEP = 16 << 20
"""A storage node's segment is a whole number of these (found by trial on 0.3.13: segments of 16, 32 and
48 MiB start; 24 and 31 MiB abort the node at start-up)."""
_TRANSPORT = (-900, -901)
"""RPC_FAIL, RPC_TIMEOUT: the master did not answer (anything else negative is an answer that says no)."""
_ABSENT = (-704,)
"""OBJECT_NOT_FOUND: what removing an absent key answers."""
_Answer = Tuple[List[Any], int, Optional[BaseException]]
"""What one of :class:`MooncakePages`' calls found: a value per key, the round trips, the failure if any."""
_EXTRA = "the Mooncake backend needs Mooncake Store: pip install 'radixkv[mooncake]'"
_LIBS = "Debian: apt-get install libibverbs1 librdmacm1 libnuma1"


class MooncakeStartError(RadixKVError, RuntimeError):
    """A local ``mooncake_master`` or storage node did not start; the message quotes its log's last line."""


def mooncake_key(key: bytes) -> str:
    """The Mooncake key of a store key: its printable ASCII head through the first ``:`` as text, the rest in
    hex (``rkv:`` + 64 hex digits for a default key). One-to-one: a key without such a head is all hex,
    which has no ``:``. O(len(key))."""
    cut = key.find(b":") + 1
    head = key[:cut]
    if cut and head.isascii() and all(32 < c < 127 for c in head):
        return head.decode("ascii") + key[cut:].hex()
    return key.hex()


def parse_size(text: str, name: str) -> int:
    """Bytes from ``"4096"``, ``"64M"``, ``"1GiB"`` (powers of 1024); ArgumentValueError otherwise."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = 1 << (10 * "KMG".index(t[-1]) + 10) if t and t[-1] in "KMG" else 1
    digits = t[:-1] if scale > 1 else t
    if not digits.isdigit():
        raise ArgumentValueError(f"{name} must be bytes (a number, or with K, M or G), got {text!r}")
    return int(digits) * scale


def load_mooncake() -> Any:
    """Mooncake Store's ``MooncakeDistributedStore`` class, imported on first use, with its C++ log cut to fatal
    errors (it logs benign errors at every setup; ``GLOG_minloglevel=0`` shows all). Raises
    MissingExtraError without the package or its Debian libraries."""
    try:
        from mooncake import store
    except ImportError as exc:
        missing = "" if "mooncake" in str(exc) else f" and its libraries ({_LIBS}; {exc})"
        raise MissingExtraError(_EXTRA + missing) from None
    _quiet(store.__file__)
    return store.MooncakeDistributedStore


def _quiet(library: str) -> None:
    """Set glog's ``FLAGS_minloglevel`` in Mooncake's library: its log is INFO by default, and the bundled
    glog reads no environment variable for it. Best effort: a library without the symbol keeps its log."""
    try:
        level = int(os.environ.get("GLOG_minloglevel", "3"))
        ctypes.c_int.in_dll(ctypes.CDLL(library), "_ZN3fLI17FLAGS_minloglevelE").value = level
    except (OSError, ValueError):
        pass


def _reachable(host: str, port: int, timeout: float) -> bool:
    """Whether ``host:port`` accepts a TCP connection within ``timeout`` seconds. One connect, no bytes."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _local_address(host: str) -> str:
    """The local address that routes to ``host`` (a UDP socket's connect sends nothing); 127.0.0.1 for loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


class _Config:
    """A ``mooncake://`` URL, parsed and checked."""

    OPTIONS = ("metadata", "segment", "buffer", "local")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        try:
            host, port = parts.hostname, parts.port
        except ValueError:
            host = port = None
        query = parse_qs(parts.query, keep_blank_values=True)
        unknown = sorted(set(query) - set(self.OPTIONS))
        if not host or port is None or parts.path not in ("", "/") or unknown or parts.fragment or parts.username:
            options = "=...&".join(self.OPTIONS)
            raise ArgumentValueError(f"Mooncake URL must be mooncake://HOST:RPC_PORT[?{options}=...], got {url!r}")
        opt = {name: values[-1] for name, values in query.items()}
        self.host, self.port = host, port
        name = host if ":" not in host else f"[{host}]"  # an IPv6 address in brackets
        self.master = f"{name}:{port}"
        self.metadata = opt.get("metadata") or f"http://{name}:{DEFAULT_METADATA_PORT}/metadata"
        meta = urlsplit(self.metadata)
        try:
            self.metadata_addr = (meta.hostname, meta.port or 80)
        except ValueError:  # a port out of range
            self.metadata_addr = (None, 0)
        if meta.scheme != "http" or not self.metadata_addr[0]:
            raise ArgumentValueError(f"metadata must be the master's http://HOST:PORT/metadata, got {self.metadata!r}")
        self.segment = parse_size(opt.get("segment", "0"), "segment")
        if 0 < self.segment < MIN_SEGMENT:
            raise ArgumentValueError(f"segment must be 0 or at least {MIN_SEGMENT} bytes, got {self.segment}")
        self.buffer = parse_size(opt.get("buffer", str(DEFAULT_BUFFER)), "buffer")
        if self.buffer < 1 << 20:
            raise ArgumentValueError(f"buffer must be at least 1M, got {self.buffer}")
        self.local = opt.get("local") or _local_address(host)


class _Client:
    """What :class:`MooncakePages` closes, apart from the backend so a finalizer can hold it: the Mooncake
    client (``None`` until set up) and the master it started, if any."""

    def __init__(self, master: Optional["MooncakeMaster"]) -> None:
        self.store: Any = None
        self.master = master

    def close(self) -> None:
        """Close the client (about 1 s if its master is gone), then stop the master it owns. Idempotent."""
        store, self.store = self.store, None
        if store is not None:
            store.close()
        if self.master is not None:
            self.master.stop()


class MooncakePages:
    """The store's values on Mooncake Store (see the module docstring).

    Args:
        url: ``mooncake://HOST:RPC_PORT[?metadata=...&segment=...&buffer=...&local=...]``.
        timeout: seconds a request to the master, or the TCP check of a master that failed, may take.
        master: a :class:`MooncakeMaster` this backend owns: stopped by :meth:`close`, or when the backend
            is garbage collected.

    Raises ArgumentValueError for a bad URL, MissingExtraError without Mooncake. Never for a master that
    is down: every call misses until it is up.
    """

    kind = "mooncake"

    def __init__(self, url: str, timeout: float = 0.25, *, master: Optional["MooncakeMaster"] = None) -> None:
        self.config = _Config(url)
        self._factory = load_mooncake()
        self.url = url
        self.timeout = timeout
        self.cooloff = Cooloff()
        self.setups = 0
        self._largest = 0
        """The largest value this backend has put or got: how many pages one ``get_batch`` can hold."""
        self._lock = threading.Lock()
        self._client = _Client(master)
        self._finalizer = weakref.finalize(self, self._client.close)
        self.open_round_trips = self._ensure()[1]
        """Round trips made while opening: a TCP check, then the client's setup, if the master is up."""

    def _ensure(self) -> Tuple[Any, int, Optional[BaseException]]:
        """``(client, round trips, None)`` when a call may go ahead; ``(None, trips, failure)`` when the master
        is down; ``(None, 0, None)`` while it cools off. A client that is set up and whose last call was
        answered goes ahead at once; else a TCP connect to the master (and to the metadata server before
        a setup) must succeed first, then the setup if there is none yet (one round trip counted: a few
        requests, about 0.1 s)."""
        with self._lock:
            cool, cfg, store = self.cooloff, self.config, self._client.store
            if store is not None and not cool.failures:
                return store, 0, None
            if not cool.ready():
                return None, 0, None
            trips, error = 1, None
            down = next((addr for addr in ((cfg.host, cfg.port), cfg.metadata_addr)
                         if not _reachable(addr[0], addr[1], self.timeout)), None)
            if down is not None:
                error = ConnectionError(f"{down[0]}:{down[1]} refused or did not answer")
            elif store is None:
                trips += 1
                error = self._setup()
            if error is not None:
                cool.failed()
                return None, trips, error
            return self._client.store, trips, None

    def _setup(self) -> Optional[BaseException]:
        """Set the Mooncake client up, with what it reads from the environment then (unless set already): its
        transfer engine bound to ``local`` (else it binds the first LAN address it finds) and ``timeout`` on
        every request to the master and every connect (else 30 s: a master that accepts and never answers
        would hold each call that long)."""
        cfg = self.config
        store = self._factory()
        ms = str(max(1, round(self.timeout * 1000)))
        env = {"MC_TCP_BIND_ADDRESS": cfg.local, "MC_RPC_TIMEOUT_MS": ms, "MC_RPC_CONNECT_TIMEOUT_MS": ms}
        added = [name for name in env if name not in os.environ]
        os.environ.update({name: env[name] for name in added})
        try:
            code = store.setup(cfg.local, cfg.metadata, cfg.segment, cfg.buffer, "tcp", "", cfg.master)
        finally:
            for name in added:
                os.environ.pop(name, None)
        if code != 0:
            store.close()
            return ConnectionError(f"Mooncake setup with master {cfg.master} failed ({code})")
        self._client.store = store
        self.setups += 1
        return None

    def _begin(self, n: int) -> Tuple[Any, int, Optional[Reply]]:
        """``(client, round trips, None)`` to go on with, or ``(None, 0, a failed Reply of n keys)``."""
        client, trips, error = self._ensure()
        if client is not None:
            return client, trips, None
        if error is None:
            return None, 0, Reply.failed(n, skipped=1)
        return None, 0, Reply.failed(n, errors=1, error=error, round_trips=trips)

    def _answered(self, codes: Sequence[int]) -> Optional[BaseException]:
        """Settle the cool-off after a call; the error if the master did not answer."""
        bad = next((c for c in codes if c in _TRANSPORT), None)
        if bad is None:
            self.cooloff.ok()
            return None
        self.cooloff.failed()
        return ConnectionError(f"Mooncake master {self.config.master} did not answer ({bad})")

    def _exist(self, client: Any, names: List[str]) -> _Answer:
        """``batch_is_exist``: True, False or FAILED per name. One round trip."""
        codes = client.batch_is_exist(names)
        if len(codes) != len(names):
            return [FAILED] * len(names), 1, ConnectionError(f"batch_is_exist answered {len(codes)} of {len(names)}")
        error = self._answered(codes)
        return [True if c == 1 else False if c == 0 else FAILED for c in codes], 1, error

    def _call(self, keys: Sequence[bytes], op: Callable[[Any, List[str]], _Answer]) -> Reply:
        """``op(client, Mooncake keys)``'s ``(values, round trips, failure)`` as a Reply, once the client may go
        ahead (:meth:`_begin`); a failure counts one error."""
        if not keys:
            return Reply([])
        client, trips, failed = self._begin(len(keys))
        if failed is not None:
            return failed
        values, calls, error = op(client, [mooncake_key(k) for k in keys])
        return Reply(values, trips + calls, int(error is not None or FAILED in values), 0, error)

    def exists(self, keys: Sequence[bytes]) -> Reply:
        return self._call(keys, self._exist)

    def get(self, keys: Sequence[bytes], touch: Sequence[bytes] = ()) -> Reply:
        """The values of the leading present run of ``keys``; ``None`` for the absent key that ends it and
        for every key after it (not fetched). ``touch``: refreshed in the same existence check."""
        held = [mooncake_key(k) for k in touch]
        return self._call(keys, lambda client, names: self._get(client, names, held))

    def _get(self, client: Any, names: List[str], held: List[str]) -> _Answer:
        present, trips, error = self._exist(client, held + names)
        present = present[len(held):]
        n = next((i for i, p in enumerate(present) if p is not True), len(names))
        values: List[Any] = [None] * len(names)
        if present[n:n + 1] == [FAILED]:
            values[n] = FAILED
        i = 0
        while i < n:
            per = self._pages_per_get()
            asked = names[i:min(n, i + per)]
            got = client.get_batch(asked)
            trips += 1
            if len(got) != len(asked):  # the client refused the whole call
                got = [b""] * len(asked)
            self._largest = max(self._largest, *map(len, got))
            ok = next((j for j, value in enumerate(got) if not value), len(got))
            values[i:i + ok] = got[:ok]
            i += ok
            if ok < len(got):
                if self._pages_per_get() < per:  # the values did not fit the buffer: the rest in smaller calls
                    continue
                values[i] = FAILED  # present a moment ago: evicted since, or not transferred; nothing after it serves
                error = error or ConnectionError(f"get_batch answered {ok} of {len(got)} present pages")
                break
        return values, trips, error

    def _pages_per_get(self) -> int:
        """Pages one ``get_batch`` asks for: :data:`MAX_PAGES_PER_CALL`, or fewer if the largest value seen
        (put or got) says they would not fit half the transfer buffer."""
        if not self._largest:
            return MAX_PAGES_PER_CALL
        return max(1, min(MAX_PAGES_PER_CALL, self.config.buffer // 2 // self._largest))

    def set_nx(self, keys: Sequence[bytes], values: Sequence[bytes]) -> Reply:
        return self._call(keys, lambda client, names: self._set_nx(client, names, values))

    def _set_nx(self, client: Any, names: List[str], values: Sequence[bytes]) -> _Answer:
        present, trips, error = self._exist(client, names)
        self._largest = max(self._largest, *map(len, values))
        stored: List[Any] = [False if p is True else FAILED for p in present]
        absent = [i for i, p in enumerate(present) if p is False]
        for chunk in self._batches(absent, values):
            code = client.put_batch([names[i] for i in chunk], [values[i] for i in chunk])
            trips += 1
            error = self._answered([code]) or error
            if code != 0 and error is None:
                error = RuntimeError(f"put_batch refused {len(chunk)} pages ({code})")  # -200: no room
            for i in chunk:
                stored[i] = True if code == 0 else FAILED
        return stored, trips, error

    def _batches(self, indices: List[int], values: Sequence[bytes]) -> List[List[int]]:
        """``indices`` cut into runs of at most :data:`MAX_PAGES_PER_CALL` values and at most half the transfer
        buffer in bytes (a value larger than that goes alone: Mooncake fails it if it does not fit)."""
        budget, batches, size = self.config.buffer // 2, [], 0
        for i in indices:
            n = len(values[i])
            if not batches or size + n > budget or len(batches[-1]) == MAX_PAGES_PER_CALL:
                batches.append([])
                size = 0
            batches[-1].append(i)
            size += n
        return batches

    def delete(self, keys: Sequence[bytes]) -> Reply:
        """Remove ``keys`` even under a read lease (``force``): the store deletes a value it just read and refused."""
        return self._call(keys, self._delete)

    def _delete(self, client: Any, names: List[str]) -> _Answer:
        codes = client.batch_remove(names, force=True)
        if len(codes) != len(names):
            codes = [-1] * len(names)
        error = self._answered(codes)
        return [True if c == 0 or c in _ABSENT else FAILED for c in codes], 1, error

    def info(self) -> Dict[str, Any]:
        return {"master": self.config.master, "master_failing": bool(self.cooloff.failures),
                "client_setups": self.setups, "segment_bytes": self.config.segment}

    def close(self) -> None:
        """Close the client (the pages stay, in the storage nodes' segments), and stop the master this backend
        started, if it did. Idempotent."""
        self._finalizer()

    def __repr__(self) -> str:
        return f"MooncakePages({self.url!r})"


def _binary(name: str) -> str:
    """The path of a Mooncake executable: in the installed ``mooncake`` package, else on PATH."""
    spec = importlib.util.find_spec("mooncake")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    path = shutil.which(name)
    if path is None:
        raise MissingExtraError(f"{name} not found: {_EXTRA}")
    return path


def _wait_state(pid: int, stopped: bool, timeout: float = 2.0) -> None:
    """Wait until every thread of ``pid`` is stopped (or none is), as Linux's ``/proc`` tells: a signal is
    delivered to a busy process's running threads only at their next trip through the kernel, so a call
    made right after ``SIGSTOP`` could still be answered. Returns at once where ``/proc`` is missing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = [Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                      for tid in os.listdir(f"/proc/{pid}/task")]
        except (OSError, IndexError):
            return
        if all((state == "T") == stopped for state in states):
            return
        time.sleep(0.005)


def _kill(proc: Optional[subprocess.Popen]) -> None:
    """SIGKILL ``proc`` if it runs, and reap it."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MooncakeMaster:
    """A ``mooncake_master`` and a storage node lending ``segment_bytes`` on free loopback ports; a context manager.

    The master serves its HTTP metadata itself (no etcd), with a short read lease
    (:data:`LEASE_MS`), cachelib's allocator (no cap on the objects a segment holds: see
    the module docstring) and without periodic metric reports; the storage node is a
    ``mooncake_client`` process. Both work in a temporary directory of their own
    (their logs), both are stopped by :meth:`stop`. :meth:`kill` and :meth:`restart`
    crash and restart the master alone, on the same ports: the storage node
    remounts its (now empty) segment by itself, as in a deployment.
    Cost: about 1.1 s to start (the master opens its RPC port after a second).

    Args:
        segment_bytes: the storage node's segment (a multiple of 16 MiB: :data:`SEGMENT_STEP`); 0 for none.
        lease_ms: the master's read lease (``-default_kv_lease_ttl``).
        allocator: the master's ``-memory_allocator``, ``"cachelib"`` or ``"offset"`` (Mooncake's default).
        startup_timeout: seconds to wait for the master's RPC port, then the mounted segment.
        watermark: the share of a segment at which the master starts evicting
            (``-eviction_high_watermark_ratio``; :func:`segment_for_pages` computes one).
        args: more master flags (``["-eviction_ratio=0.1"]``).
    """

    def __init__(self, segment_bytes: int = 64 << 20, *, lease_ms: int = LEASE_MS, allocator: str = "cachelib",
                 startup_timeout: float = 20.0, watermark: float = DEFAULT_WATERMARK, args: Sequence[str] = ()) -> None:
        if segment_bytes < 0 or segment_bytes % SEGMENT_STEP:
            raise ArgumentValueError(f"segment_bytes must be 0 or a multiple of {SEGMENT_STEP} (16 MiB), "
                                     f"got {segment_bytes}")
        if isinstance(watermark, bool) or not isinstance(watermark, (int, float)) or not 0 < watermark <= 1:
            raise ArgumentValueError(f"watermark must be a share in (0, 1], got {watermark!r}")
        self._master_bin, self._client_bin = _binary("mooncake_master"), _binary("mooncake_client")
        self.segment_bytes = segment_bytes
        self.rpc_port, self.metadata_port, self.admin_port, self.storage_port = (_free_port() for _ in range(4))
        self.metadata = f"http://127.0.0.1:{self.metadata_port}/metadata"
        self.url = f"mooncake://127.0.0.1:{self.rpc_port}?metadata={self.metadata}"
        """The URL :class:`MooncakePages` (``open_backend``, ``--store``) opens it by."""
        self._args = [f"-default_kv_lease_ttl={lease_ms}", f"-memory_allocator={allocator}",
                      f"-eviction_high_watermark_ratio={watermark}", *map(str, args)]
        self._timeout = startup_timeout
        self.dir = tempfile.mkdtemp(prefix="radixkv-mooncake-")
        self._env = dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1")
        self._master: Optional[subprocess.Popen] = None
        self._storage: Optional[subprocess.Popen] = None
        try:
            self._start_master()
            if segment_bytes:
                self._storage = self._spawn("storage", [
                    self._client_bin, "-host=127.0.0.1", f"-port={self.storage_port}",
                    f"-global_segment_size={segment_bytes}", f"-master_server_address=127.0.0.1:{self.rpc_port}",
                    f"-metadata_server={self.metadata}", "-protocol=tcp"])
                self._wait_mounted()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, argv: List[str]) -> subprocess.Popen:
        log = open(os.path.join(self.dir, f"{name}.log"), "ab")
        with log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self._env)

    def _start_master(self) -> None:
        self._master = self._spawn("master", [
            self._master_bin, f"-rpc_port={self.rpc_port}", "-rpc_address=127.0.0.1",
            "-enable_http_metadata_server=true", f"-http_metadata_server_port={self.metadata_port}",
            "-http_metadata_server_host=127.0.0.1", f"-metrics_port={self.admin_port}", "-metrics_host=127.0.0.1",
            "-enable_metric_reporting=false", *self._args])
        self._wait("master", lambda: _reachable("127.0.0.1", self.rpc_port, 0.2))

    def _wait(self, name: str, ready: Any) -> None:
        proc = self._master if name == "master" else self._storage
        deadline = time.monotonic() + self._timeout
        while not ready():
            if proc is None or proc.poll() is not None or time.monotonic() > deadline:
                raise MooncakeStartError(f"mooncake {name} did not start on 127.0.0.1 ({self._last_log(name)})")
            time.sleep(0.02)

    def _last_log(self, name: str) -> str:
        try:
            with open(os.path.join(self.dir, f"{name}.log"), "rb") as f:
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        last = lines[-1][-200:] if lines else "no log"
        return f"{last}; {_LIBS}" if "cannot open shared object" in last else last

    def segments(self) -> List[str]:
        """The segments the master has mounted now (its admin ``/get_all_segments``); [] if it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/get_all_segments", timeout=1) as r:
                return r.read().decode().split()
        except OSError:
            return []

    def _wait_mounted(self) -> None:
        self._wait("storage", lambda: bool(self.segments()))

    @property
    def running(self) -> bool:
        return self._master is not None and self._master.poll() is None

    def kill(self) -> None:
        """Crash the master (SIGKILL): every key is forgotten, and clients' calls fail until it is back."""
        _kill(self._master)

    def pause(self, paused: bool = True) -> None:
        """Stop the master (SIGSTOP; its ports still accept, nothing answers), or let it go on (SIGCONT)."""
        if self.running:
            self._master.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)
            _wait_state(self._master.pid, stopped=paused)

    def restart(self) -> None:
        """Start the master again on the same ports (killing it first), empty; wait until the storage node has
        mounted its segment again (about a second)."""
        self.kill()
        self._start_master()
        if self._storage is not None:
            self._wait_mounted()

    def stop(self) -> None:
        """Kill the storage node and the master (nothing they hold is kept), reap them, remove the directory.
        Idempotent."""
        _kill(self._storage)
        _kill(self._master)
        self._storage = self._master = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "MooncakeMaster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"MooncakeMaster({self.url!r}, segment_bytes={self.segment_bytes})"


def segment_for_pages(pages: int, value_bytes: int) -> Tuple[int, float]:
    """The segment a storage node must lend, and the master's eviction watermark, to hold about ``pages``
    values of ``value_bytes`` each once Mooncake evicts (:data:`RESIDENT_BYTES_PER_VALUE_BYTE`): the
    segment is rounded up to :data:`SEGMENT_STEP`, and the watermark lowered from
    :data:`DEFAULT_WATERMARK` by as much, so the rounding adds no pages. Raises
    :class:`~radixkv.errors.ArgumentValueError` when that is below the smallest segment, which would hold
    more pages than asked. O(1)."""
    needed = pages * value_bytes * RESIDENT_BYTES_PER_VALUE_BYTE
    if needed < MIN_SEGMENT:
        least = math.ceil(MIN_SEGMENT / (value_bytes * RESIDENT_BYTES_PER_VALUE_BYTE))
        raise ArgumentValueError(f"a Mooncake store of {pages:,} pages is below its smallest segment (16 MiB), "
                                 f"which holds about {least:,} pages of {value_bytes} bytes")
    segment = math.ceil(needed / SEGMENT_STEP) * SEGMENT_STEP
    return segment, round(DEFAULT_WATERMARK * needed / segment, 4)


def sizing(pages: Optional[int], page_size: int, kv_shape: Optional[Sequence[int]], dtype: Any) -> Tuple[int, float]:
    """(segment bytes, eviction watermark) of a Mooncake master started for a store of about ``pages`` pages
    of ``page_size`` tokens of ``kv_shape`` values of ``dtype`` each (``kv_shape=None``: no payload), as
    :func:`segment_for_pages` sizes it; ``pages=None``: :data:`EMBEDDED_SEGMENT` at the default watermark.
    The one sizing ``open_store("mooncake")`` and a fleet's master share. O(1)."""
    if pages is None:
        return EMBEDDED_SEGMENT, DEFAULT_WATERMARK
    payload = page_size * int(np.prod(kv_shape)) * np.dtype(dtype).itemsize if kv_shape else 0
    return segment_for_pages(pages, HEADER_BYTES + payload)


def embedded_backend(segment_bytes: int = EMBEDDED_SEGMENT, timeout: float = 0.25, *,
                     watermark: float = DEFAULT_WATERMARK) -> MooncakePages:
    """A backend on a :class:`MooncakeMaster` of its own, stopped when the backend is closed or garbage
    collected: ``open_store("mooncake")``. Cost: about 1.2 s (the master's start and the client's setup)."""
    master = MooncakeMaster(segment_bytes, watermark=watermark)
    try:
        return MooncakePages(master.url, timeout, master=master)
    except BaseException:
        master.stop()
        raise


__all__ = ["EMBEDDED_SEGMENT", "LEASE_MS", "MooncakeMaster", "MooncakePages", "MooncakeStartError",
           "RESIDENT_BYTES_PER_VALUE_BYTE", "SEGMENT_STEP", "embedded_backend", "load_mooncake", "mooncake_key", "parse_size",
           "segment_for_pages"]

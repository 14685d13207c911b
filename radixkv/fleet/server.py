"""A redis-server child process on a free loopback port: the store a fleet starts when it is given none.

:class:`LocalRedis` starts ``redis-server`` on ``127.0.0.1:<free port>`` with no
persistence (``--save "" --appendonly no``), working in a temporary
directory of its own, and stops it (SIGTERM, then SIGKILL; the process is
reaped and the directory removed) on :meth:`LocalRedis.stop` or leaving its
``with`` block; it can be killed and restarted on the same port (the fault
tests use that). :func:`store_server` starts one sized for a fleet's shared
page store: ``maxmemory`` from a page count (:func:`maxmemory_bytes`),
``allkeys-lru``.

The tests' fixtures (:mod:`radixkv.testing.localredis`) re-export
:class:`LocalRedis` and :func:`free_port` from here: the library proper (the
``radixkv cluster --processes`` command) must not import test fixtures.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional, Sequence

from ..store import DEFAULT_PREFIX, HASH_BYTES, HEADER_BYTES


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRedis:
    """A ``redis-server`` child process on ``127.0.0.1:<free port>``; a context manager.

    >>> with LocalRedis() as server:          # doctest: +SKIP
    ...     store = PageStore.open(server.url, fingerprint=fp)

    Args:
        executable: the server binary (``redis-server``, or ``valkey-server``).
        startup_timeout: seconds to wait for the first ``PONG``.
        args: more server arguments (``["--maxmemory", "2mb"]``).
        port: the port; default a free one.
    """

    def __init__(self, executable: str = "redis-server", startup_timeout: float = 10.0, *,
                 args: Sequence[str] = (), port: Optional[int] = None) -> None:
        path = shutil.which(executable)
        if path is None:
            raise FileNotFoundError(f"{executable!r} not found on PATH (Debian: apt-get install redis-server)")
        self._path = path
        self._args = [str(a) for a in args]
        self._startup_timeout = startup_timeout
        self.port = free_port() if port is None else port
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tempfile.mkdtemp(prefix="radixkv-redis-")
        """The server's working directory (``--dir``), removed by :meth:`stop`."""
        self._proc: Optional[subprocess.Popen] = None
        self._start()

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [self._path, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning", "--dir", self.dir,
             *self._args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + self._startup_timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """Crash the server (SIGKILL): its data is gone and connections fail."""
        if self.running:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(timeout=10)

    def restart(self) -> None:
        """Start the server again on the same port and directory (killing it first if it runs); empty."""
        self.kill()
        self._start()

    def stop(self) -> None:
        """Stop the server, reap the process and remove its directory. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LocalRedis":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


KEY_BYTES = len(DEFAULT_PREFIX) + HASH_BYTES
"""36: a page's key in the store (``b"rkv:"`` and 32 bytes of chain hash)."""
ENTRY_OVERHEAD_BYTES = 88
"""Redis's own bytes per stored page on top of its key and value, measured on redis-server 7.0
(jemalloc, 64-bit) with 36-byte keys and 109-byte values: a 24-byte dict entry in a 32-byte
allocation, a 16-byte value object, the SDS headers of key and value and the allocator's size
classes rounding them up (key 40 -> 48 bytes, value 113 -> 128), and 8 bytes of hash bucket per
key, about 8.4 with the table at a power of two. 250,000 pages took 232.6 bytes each of
``used_memory``, 145 of them key and value."""
BASE_BYTES = 1 << 20
"""An empty server's ``used_memory`` (0.92 MiB measured on 7.0), rounded up."""
CLIENT_BYTES = 256 << 10
"""Headroom per connected process for its query and reply buffers, which ``used_memory`` counts
while a command runs (an ``MGET`` of a 12k-token prompt's 780 pages replies with 113 KB)."""


EVICTION_SAMPLES = 64
"""Keys Redis samples per eviction (``maxmemory-samples``; its default 5, its most 64). Redis evicts the
least recently used of the samples (and of a pool of 16 earlier candidates), on an LRU clock of
one second: with a replay's turnover (the whole store every few seconds) 10 samples cost 2.4
points of hit rate against exact LRU on the Mooncake conversation trace's first 3,000 requests,
64 samples 1.1 (and 25% more wall time). The second-resolution clock stays: pages written in the
same second are evicted in random order, which leaves holes in chains (a store serves a chain
only up to its first hole)."""


def maxmemory_bytes(pages: int, payload_bytes: int, clients: int) -> int:
    """A ``maxmemory`` under which a redis-server holds about ``pages`` store pages of ``payload_bytes`` each
    while ``clients`` processes talk to it:

        BASE_BYTES + clients x CLIENT_BYTES + pages x (HEADER_BYTES 77 + KEY_BYTES 36 + payload_bytes
        + ENTRY_OVERHEAD_BYTES 88)

    The per-page overhead was measured for small values (:data:`ENTRY_OVERHEAD_BYTES`): allocator
    rounding grows with the value, so for other payload sizes the count is approximate (a value
    of a few KiB rounds up by at most a quarter). O(1).
    """
    return BASE_BYTES + clients * CLIENT_BYTES + pages * (HEADER_BYTES + KEY_BYTES + payload_bytes
                                                          + ENTRY_OVERHEAD_BYTES)


def store_server(pages: Optional[int], payload_bytes: int, clients: int) -> LocalRedis:
    """Start a redis-server for a fleet's shared page store; stop it with :meth:`LocalRedis.stop`.

    With ``pages`` it holds about that many pages (:func:`maxmemory_bytes`) and evicts the least
    recently used past them (``allkeys-lru``, sampling :data:`EVICTION_SAMPLES` keys per eviction:
    closer to exact LRU, for some CPU); without, it grows as the machine lets it. Raises
    ``FileNotFoundError`` when no redis-server is on PATH, ``RuntimeError`` when it does not start.
    Cost: a process start, about 20-50 ms.
    """
    args = ["--maxmemory-policy", "allkeys-lru", "--maxmemory-samples", str(EVICTION_SAMPLES)]
    if pages is not None:
        args += ["--maxmemory", str(maxmemory_bytes(pages, payload_bytes, clients))]
    return LocalRedis(args=args)

"""A redis-server child process on a free loopback port: the store a fleet starts when it is given none.

:class:`LocalRedis` starts ``redis-server`` on ``127.0.0.1:<free port>`` with no
persistence (``--save "" --appendonly no``), working in a temporary
directory of its own, and stops it (SIGTERM, then SIGKILL; the process is
reaped and the directory removed) on :meth:`LocalRedis.stop` or leaving its
``with`` block; it can be killed and restarted on the same port (the fault
tests use that). A fleet bounds its store by pages, not by the server's
``maxmemory`` (``redis://...?capacity=PAGES``: an exact LRU the server keeps in
Lua, :mod:`radixkv.store.redis_lru`), so the server it starts is a plain one.

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

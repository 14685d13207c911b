"""Throwaway local Redis servers for tests, benchmarks and demos of the Redis backend.

``LocalRedis`` starts ``redis-server`` on a free loopback port with no
persistence (``--save "" --appendonly no``) and stops it on exit. It is not
used by the cache itself.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from typing import Optional


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRedis:
    """A ``redis-server`` child process on ``127.0.0.1:<free port>``; a context manager.

    >>> with LocalRedis() as server:          # doctest: +SKIP
    ...     backend = RedisBackend([server.url])
    """

    def __init__(self, executable: str = "redis-server", startup_timeout: float = 10.0) -> None:
        path = shutil.which(executable)
        if path is None:
            raise FileNotFoundError(f"{executable!r} not found on PATH (Debian: apt-get install redis-server)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: Optional[subprocess.Popen] = subprocess.Popen(
            [path, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + startup_timeout
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

    def stop(self) -> None:
        """Stop the server and reap the process. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def __enter__(self) -> "LocalRedis":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

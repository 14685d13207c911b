"""Throwaway local Redis servers for tests, benchmarks and demos of the Redis backends.

``LocalRedis`` starts ``redis-server`` on a free loopback port with no
persistence (``--save "" --appendonly no``), working in a temporary
directory of its own, and stops it on exit; it can be killed and restarted
on the same port. ``LocalRedisCluster`` starts several cluster-enabled
servers and joins them into one Redis Cluster. Neither is used by the cache
itself.
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import List, Optional, Sequence


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_cluster_port() -> int:
    """A port P on 127.0.0.1 with P and its cluster bus port P + 10000 both free a moment ago.

    A cluster node listens on both, so P must be at most 55535 (below the
    usual ephemeral range, where :func:`free_port` draws from).
    """
    for _ in range(200):
        port = random.randrange(12000, 30000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair (P, P + 10000) on 127.0.0.1")


class LocalRedis:
    """A ``redis-server`` child process on ``127.0.0.1:<free port>``; a context manager.

    >>> with LocalRedis() as server:          # doctest: +SKIP
    ...     backend = RedisBackend([server.url])

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


class LocalRedisCluster:
    """A Redis Cluster of ``masters`` local servers without replicas; a context manager.

    The servers run with ``cluster-require-full-coverage no``, so the live
    masters keep serving their slots when one dies. The slots are split into
    equal ranges (``CLUSTER ADDSLOTS``) and the nodes introduced to each
    other (``CLUSTER MEET``), what ``redis-cli --cluster create ...
    --cluster-replicas 0`` does, through redis-py (no redis-cli needed);
    then it waits until every node reports ``cluster_state:ok``.

    Args:
        masters: number of servers.
        startup_timeout: seconds to wait for the cluster to agree.
        args: more arguments for every server.
    """

    def __init__(self, masters: int = 3, startup_timeout: float = 20.0, *, args: Sequence[str] = ()) -> None:
        import redis

        self.nodes: List[LocalRedis] = []
        try:
            for _ in range(masters):
                self.nodes.append(LocalRedis(port=free_cluster_port(), args=[
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-require-full-coverage", "no", *args]))
            clients = [redis.Redis(port=n.port, socket_timeout=5) for n in self.nodes]
            try:
                for i, client in enumerate(clients):
                    client.execute_command("CLUSTER", "ADDSLOTS",
                                           *range(i * 16384 // masters, (i + 1) * 16384 // masters))
                for client in clients:
                    for node in self.nodes:
                        client.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
                deadline = time.monotonic() + startup_timeout
                while not all(self._agreed(c, masters) for c in clients):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the cluster on ports {self.ports} did not reach cluster_state:ok")
                    time.sleep(0.05)
            finally:
                for client in clients:
                    client.close()
        except BaseException:
            self.stop()
            raise
        self.url = self.nodes[0].url

    @staticmethod
    def _agreed(client, masters: int) -> bool:
        info = client.cluster("info")
        return info.get("cluster_state") == "ok" and int(info.get("cluster_known_nodes", 0)) == masters

    @property
    def ports(self) -> List[int]:
        return [n.port for n in self.nodes]

    def stop(self) -> None:
        """Stop every server. Idempotent."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> "LocalRedisCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

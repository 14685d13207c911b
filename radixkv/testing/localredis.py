"""Throwaway local Redis servers for tests, benchmarks and demos of the Redis backends.

``LocalRedis`` starts ``redis-server`` on a free loopback port with no
persistence (``--save "" --appendonly no``), working in a temporary
directory of its own, and stops it on exit; it can be killed and restarted
on the same port. It lives in :mod:`radixkv.fleet.server` (``radixkv cluster
--processes`` starts one for its shared store, and the library imports no
fixture) and is re-exported here with :func:`free_port`.
``LocalRedisCluster`` starts several cluster-enabled servers and joins them
into one Redis Cluster. The cache itself uses neither.
"""

from __future__ import annotations

import random
import socket
import time
from typing import List, Sequence

from ..fleet.server import LocalRedis, free_port

__all__ = ["LocalRedis", "LocalRedisCluster", "free_cluster_port", "free_port"]


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

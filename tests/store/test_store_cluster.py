"""The store on a 3-node Redis Cluster on loopback: detected from one node, keys spread, one dead node misses alone."""

from __future__ import annotations

import time

from radixkv.store import PageStore, codec

from .conftest import FP

PS = FP.page_size


def owner(cluster, key: bytes) -> int:
    """Which node holds ``key``: LocalRedisCluster gives node i the i-th third of the slots."""
    from redis.crc import key_slot  # imported here: without redis-py the fixture skips (or fails under CI)

    return key_slot(key) * len(cluster.nodes) // 16384


def node_client(cluster, i: int):
    import redis

    return redis.Redis(port=cluster.ports[i])


def test_a_cluster_is_detected_spread_over_and_read_node_by_node(cluster):
    store = PageStore.open(cluster.url, FP)
    assert store.backend.kind == "redis-cluster" and store.stats()["nodes"] == 3
    chain = store.chain(range(64 * PS))
    nodes = {owner(cluster, k) for k in chain}
    assert nodes == {0, 1, 2}  # no hash tags: a chain's pages spread over the masters
    for call in (lambda: store.lookup(chain), lambda: store.put(chain, [b"%d" % i for i in range(64)]),
                 lambda: store.get(chain), lambda: store.put(chain, [b"late"] * 64)):
        before = store.stats()["round_trips"]
        call()
        assert store.stats()["round_trips"] == before + 3  # one pipeline per node holding keys
    got, n = store.get(chain)
    assert n == 64 and [bytes(p) for p in got] == [b"%d" % i for i in range(64)]  # first writer won
    sizes = [node_client(cluster, i).dbsize() for i in range(3)]
    assert sum(sizes) == 64 and all(sizes)
    other = PageStore.open(cluster.nodes[2].url, FP)  # any node finds the whole cluster
    assert other.lookup(chain) == 64
    # a bad value on one node: refused, counted, deleted there
    bad = chain[10]
    node = node_client(cluster, owner(cluster, bad))
    node.set(bad, codec.encode(store.keys.fingerprint_digest, chain[11][4:], memoryview(b"10")))
    assert store.get(chain)[1] == 10 and store.stats()["integrity_misses"] == 1 and not node.exists(bad)
    assert store.stats()["backend_errors"] == 0


def test_killing_one_node_misses_only_its_pages(cluster):
    store = PageStore.open(cluster.url, FP)
    singles = [store.chain([i] * PS) for i in range(300)]  # 300 one-page chains over the three nodes
    for chain in singles:
        assert store.put(chain, [chain[0][4:]]) == 1
    long = store.chain(range(1000, 1000 + 64 * PS))
    store.put(long, [k[4:] for k in long])
    dead = 1
    cluster.nodes[dead].kill()
    started = time.monotonic()
    served = [store.get(chain)[1] for chain in singles]  # no exception, whatever the node
    for chain, n in zip(singles, served):
        assert n == (owner(cluster, chain[0]) != dead), "a live node's page missed, or a dead one's was served"
    assert 50 < sum(served) < 250
    first_dead = next(i for i, k in enumerate(long) if owner(cluster, k) == dead)
    got, n = store.get(long)
    assert n == first_dead == store.lookup(long) and [bytes(p) for p in got] == [k[4:] for k in long[:n]]
    fresh = store.chain(range(5000, 5000 + 32 * PS))
    stored = store.put(fresh, [b"new"] * 32)
    assert stored == sum(owner(cluster, k) != dead for k in fresh)  # the live nodes take their pages
    assert time.monotonic() - started < 5.0  # the dead node costs a refused connect, then is skipped
    s = store.stats()
    assert s["backend_errors"] >= 1 and s["backend_skips"] > 0 and s["integrity_misses"] == 0
    assert s["nodes_failing"] == [f"127.0.0.1:{cluster.ports[dead]}"]
    assert isinstance(store.last_error, store.backend.transport)

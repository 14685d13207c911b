"""The shared page store's per-page costs on each backend, and in-process cluster replays over each; a markdown table.

    .venv/bin/python bench/perf/store_backends.py --out bench/results/store_backends   # writes .md and .jsonl

* ``calls``: one PageStore per backend (memory://, a local redis-server, a local Mooncake master with a
  storage node; all on loopback) times ``lookup`` (existence of a chain's pages), ``get`` (every page
  present, verified), ``put`` of new pages and ``put`` of pages already there, in batches of 1 and of 32
  pages, with payloads of 512 B and 64 KiB. Each figure is the median over ``--rounds`` calls (each on
  a chain of its own), divided by the pages in the call: microseconds per page, a round trip included.
* ``cluster``: ``Cluster(4, 62500, 16, store=URL)`` replays the first ``--requests`` requests of the
  Mooncake conversation trace over each backend (no payload: 77-byte values), round robin; hits,
  tokens served from the store, the store's round trips and wall time.

Every server is started here on free loopback ports and stopped at the end; the machine (CPU, load
average) is recorded with the figures (``bench/machine_facts.py``).
"""

from __future__ import annotations

import argparse
import os
from importlib import metadata
import statistics
import sys
import time
from typing import Callable, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from machine_facts import emit, machine  # noqa: E402

from radixkv.cluster import Cluster  # noqa: E402
from radixkv.store import Fingerprint, PageStore, drop_memory  # noqa: E402
from radixkv.testing.localmooncake import LocalMooncakeMaster  # noqa: E402
from radixkv.testing.localredis import LocalRedis  # noqa: E402
from radixkv.workload.traces import TraceReader  # noqa: E402

TRACE = "../shared/traces/mooncake_conversation.jsonl"
FP = Fingerprint(model="bench", dtype="float16", kv_shape=(2, 8, 128), page_size=16)
CALLS = ("lookup", "get", "put new", "put existing")


CAPACITY = 250_000
"""The page bound of the ``redis-lru`` rows: the fleet run's store (the call rows stay below it, the
cluster rows evict past it)."""


def redis_flush(server: LocalRedis) -> None:
    """Empty the server between two backends' rows (one round trip)."""
    import redis

    redis.Redis.from_url(server.url).flushall()


def median_us(fn: Callable[[int], int], rounds: int) -> float:
    """The median wall time of ``fn(i)`` over ``rounds`` calls, in microseconds per page it reports."""
    times = []
    for i in range(rounds):
        t = time.perf_counter()
        pages = fn(i)
        times.append((time.perf_counter() - t) / pages)
    return statistics.median(times) * 1e6


def call_rows(label: str, url: str, rounds: int) -> List[Dict]:
    store = PageStore.open(url, FP)
    rows = []
    for size in (512, 64 << 10):
        payload = os.urandom(size)
        for batch in (1, 32):
            base = len(rows) * 10 * rounds
            chains = [store.chain([base + i, *range(1, batch * 16)]) for i in range(rounds)]
            row = {"bench": "store_calls", "backend": label, "payload_bytes": size, "pages_per_call": batch}
            row["put new"] = median_us(lambda i: store.put(chains[i], [payload] * batch) or batch, rounds)
            row["put existing"] = median_us(lambda i: store.put(chains[i], [payload] * batch) + batch, rounds)
            row["lookup"] = median_us(lambda i: store.lookup(chains[i]) or batch, rounds)
            row["get"] = median_us(lambda i: store.get(chains[i])[1] or batch, rounds)
            s = store.stats()
            assert s["hits"] == s["lookup_pages"] == s["pages_written"] and not s["backend_errors"], s
            rows.append(row)
            store.backend.delete([k for c in chains for k in c])
    store.close()
    return rows


def cluster_row(label: str, url: str, requests) -> Dict:
    cluster = Cluster(4, 62_500, 16, store=url)
    r = cluster.replay(requests)
    st = r.store_stats
    row = {"bench": "store_cluster", "backend": label, "requests": r.requests, "hit_rate": r.token_hit_rate,
           "store_hit_tokens": r.store_hit_tokens, "store_round_trips": st.get("round_trips", 0),
           "pages_written": st.get("pages_written", 0), "store_hits": st.get("hits", 0),
           "backend_errors": st.get("backend_errors", 0), "wall_seconds": r.wall_seconds}
    for inst in cluster.instances:
        inst.cache.store.close()
    return row


def table(rows: List[Dict], clusters: List[Dict], facts: Dict) -> str:
    out = [f"Per-page cost of the shared page store's calls, microseconds per page (median of the calls, on "
           f"loopback; get verifies every page). Round trips per call: memory none, redis 1 each (redis-lru: "
           f"through Lua scripts that also stamp and evict: radixkv.store.redis_lru), mooncake "
           f"lookup 1, get 2 (existence, then the leading run), put new 2 (existence, then put_batch), put "
           f"existing 1. Machine: {facts['cpu']}, {facts['nproc']} CPUs (shared), load average {facts['load']}, "
           f"Python {facts['python']}, Mooncake Store {facts['mooncake']} (cachelib allocator, one storage "
           f"node).", "",
           "| backend | payload | pages per call | " + " | ".join(CALLS) + " |",
           "|---|---:|---:|" + "---:|" * len(CALLS)]
    for r in rows:
        out.append(f"| {r['backend']} | {r['payload_bytes']:,} B | {r['pages_per_call']} | "
                   + " | ".join(f"{r[c]:,.1f}" for c in CALLS) + " |")
    out += ["", f"In-process `Cluster(4, 62500, 16, store=URL)`, round robin, first {clusters[0]['requests']:,} "
                f"requests of mooncake_conversation.jsonl (no payload: 77-byte values):", "",
            "| backend | token hit rate | tokens served by the store | store round trips | pages written | "
            "backend errors | wall s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for c in clusters:
        out.append(f"| {c['backend']} | {c['hit_rate']:.4f} | {c['store_hit_tokens']:,} | {c['store_round_trips']:,} "
                   f"| {c['pages_written']:,} | {c['backend_errors']} | {c['wall_seconds']:.1f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.jsonl")
    parser.add_argument("--backends", default="memory,redis,redis-lru,mooncake",
                        help="which, comma-separated (redis-lru: a server bounded with ?capacity=, its exact LRU)")
    args = parser.parse_args()
    facts = dict(machine(), load=" ".join(f"{x:.2f}" for x in os.getloadavg()),
                 mooncake=metadata.version("mooncake-transfer-engine-non-cuda"))
    requests = list(TraceReader(TRACE, limit=args.requests))
    rows: List[Dict] = []
    clusters: List[Dict] = []
    wanted = args.backends.split(",")
    with LocalRedis() as redis, LocalMooncakeMaster(1 << 30) as mooncake:
        urls = {"memory": "memory://bench-store", "redis": redis.url,
                "redis-lru": redis.url + f"?capacity={CAPACITY}", "mooncake": mooncake.url}
        for label in wanted:
            rows += call_rows(label, urls[label], args.rounds)
            drop_memory("bench-store")
            redis_flush(redis)
        urls["memory"] = "memory://bench-cluster"
        for label in wanted:
            clusters.append(cluster_row(label, urls[label], requests))
            redis_flush(redis)
    out = args.out and args.out + ".jsonl"
    if out and os.path.exists(out):
        os.remove(out)
    for row in rows + clusters:
        emit(dict(row, machine=facts), out)
    text = table(rows, clusters, facts)
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    sys.exit(main())

"""The cluster-wide page index on a trace: hit rate with and without it, beside one pooled cache.

    python bench/studies/fleet_index.py [TRACE] [--instances 4] [--num-blocks 62500] [--page-size 16]

Prints a markdown table (the rows of bench/results/fleet.md): round robin and cache-aware routing,
each without and with ``global_index``, a shared in-process page store as large as the fleet's
HBM under round robin, and one cache of the fleet's total memory (and 1.25x, 2x).
Also the index's cost per request and its memory per indexed page, measured on the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from machine_facts import machine  # noqa: E402

from radixkv.cluster import Cluster
from radixkv.workload.sources import open_trace


def index_bytes(index) -> int:
    """Bytes the index holds (:meth:`~radixkv.global_index.GlobalPageIndex.nbytes`)."""
    return index.nbytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default="../shared/traces/mooncake_conversation.jsonl")
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--num-blocks", type=int, default=62500)
    parser.add_argument("--page-size", type=int, default=16)
    args = parser.parse_args()
    requests = list(open_trace(args.trace))
    n, blocks, ps = args.instances, args.num_blocks, args.page_size
    print(f"{args.trace}: {len(requests)} requests, page {ps}, LRU\n")
    print("| configuration | token hit rate | peer hit tokens | pages pulled | transfer s | TTFT saving s "
          "| index us/request | replay s |")
    print("|---|---|---|---|---|---|---|---|")
    for routing in ("round_robin", "cache_aware"):
        for index, duplicates in ((False, "move"), (True, "copy"), (True, "move")):
            cluster = Cluster(n, blocks, ps, "lru", routing=routing, global_index=index, duplicates=duplicates)
            start = time.perf_counter()
            r = cluster.replay(requests)
            wall = time.perf_counter() - start
            name = f"{n} x {blocks:,} blocks, {routing}" + (f", global index, pulls {duplicates}" if index else "")
            print(f"| {name} | {r.token_hit_rate:.2%} | {r.peer_hit_tokens:,} | {r.pages_pulled:,} | "
                  f"{r.peer_transfer_seconds:.1f} | {r.ttft_saving_seconds:.1f} | {r.index_us_per_request:.0f} "
                  f"| {wall:.1f} |")
            if index and routing == "round_robin" and duplicates == "move":
                per_page = index_bytes(cluster.index) / max(len(cluster.index), 1)
    for index in (False, True):  # a shared in-process store of the fleet's HBM size under the instances
        cluster = Cluster(n, blocks, ps, "lru", global_index=index, store="memory", store_blocks=n * blocks)
        start = time.perf_counter()
        r = cluster.replay(requests)
        wall = time.perf_counter() - start
        name = f"{n} x {blocks:,} blocks, round_robin, a {n * blocks:,}-page shared store" + (
            ", global index" if index else "")
        print(f"| {name} | {r.token_hit_rate:.2%} | {r.peer_hit_tokens + r.store_hit_tokens:,} (store "
              f"{r.store_hit_tokens:,}) | {r.pages_pulled:,} | {r.peer_transfer_seconds:.1f} | "
              f"{r.ttft_saving_seconds:.1f} | {r.index_us_per_request:.0f} | {wall:.1f} |")
        trips = r.store_stats.get("round_trips", 0) / max(r.requests, 1)
    for factor in (1.0, 1.25, 2.0):
        total = int(n * blocks * factor)
        r = Cluster(1, total, ps, "lru").replay(requests)
        print(f"| one cache of {total:,} blocks | {r.token_hit_rate:.2%} | | | | {r.ttft_saving_seconds:.1f} | | |")
    print(f"\nindex memory: {per_page:.0f} bytes per indexed page (dict entry, key and mask ints, "
          f"and each instance's block -> key slots, at the end of the round-robin run)")
    print(f"store: {trips:.2f} round trips a request (a read past HBM and a write-through)")
    facts = machine()
    print(f"\nMachine: {facts['cpu']}, {facts['nproc']} CPUs, Python {facts['python']}, numpy {facts['numpy']}, "
          f"load average {os.getloadavg()[0]:.1f} at the end.")


if __name__ == "__main__":
    main()

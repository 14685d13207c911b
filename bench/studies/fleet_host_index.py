"""Host tiers in the cluster-wide index: what a peer's host copies add, and what a move from one means.

    python bench/studies/fleet_host_index.py [TRACE] [--instances 4] [--num-blocks 62500]
        [--host-blocks 62500] [--page-size 16] [--only NAME ...]

Prints markdown rows (bench/results/fleet.md, "Host tiers in the index"), round robin, LRU:

* ``host``: HBM over a host tier, no index;
* ``host+index``: the same with the index over HBM and host (``duplicates="move"``: a pull's
  source copy is ranked next to go where it was read, HBM or host);
* ``host+index, host copies kept ranked``: as ``host+index``, but a copy read from a source's
  host tier keeps its rank (only HBM copies are moved): what moving from a host tier is worth;
* ``index``: no host tier, the index over HBM.

The CLI's ``radixkv cluster ... --json`` gives the same figures for the first, second and last.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from machine_facts import machine  # noqa: E402

from radixkv.cluster import Cluster
from radixkv.tiers.tiered import TieredCache
from radixkv.workload.sources import open_trace

CONFIGS = ("host", "host+index", "host+index, host copies kept ranked", "index")


def build(name: str, n: int, blocks: int, host: int, ps: int) -> Cluster:
    """The cluster of configuration ``name`` (see the module doc)."""
    return Cluster(n, blocks, ps, "lru", routing="round_robin", host_blocks=0 if name == "index" else host,
                   global_index=name != "host", duplicates="move")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default="../shared/traces/mooncake_conversation.jsonl")
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--num-blocks", type=int, default=62500)
    parser.add_argument("--host-blocks", type=int, default=62500)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--only", nargs="*", choices=CONFIGS, default=CONFIGS)
    args = parser.parse_args()
    requests = list(open_trace(args.trace))
    n, blocks, host, ps = args.instances, args.num_blocks, args.host_blocks, args.page_size
    print(f"{args.trace}: {len(requests)} requests, page {ps}, LRU, round robin, {n} x {blocks:,} HBM blocks\n")
    print("| configuration | token hit rate | host hit tokens | peer hit tokens (from a host) | pages pulled "
          "| transfer s | TTFT saving s | index us/request | index bytes/page | replay s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    export = TieredCache.export_pages
    for name in args.only:
        cluster = build(name, n, blocks, host, ps)
        if name.endswith("kept ranked"):  # a host copy read by a peer keeps its rank
            for inst in cluster.instances:
                inst.cache.export_pages = functools.partial(_no_host_move, export, inst.cache)
        start = time.perf_counter()
        r = cluster.replay(requests)
        wall = time.perf_counter() - start
        index = cluster.index
        per_page = (index.nbytes() / max(len(index) + index.lower_pages, 1)) if index is not None else 0
        print(f"| {name} | {r.token_hit_rate:.2%} | {r.hit_tokens_by_tier.get('host', 0):,} | "
              f"{r.peer_hit_tokens:,} ({r.peer_host_hit_tokens:,}) | {r.pages_pulled:,} | "
              f"{r.peer_transfer_seconds:.1f} | {r.ttft_saving_seconds:.1f} | {r.index_us_per_request:.0f} | "
              f"{per_page:.0f} | {wall:.1f} |", flush=True)
    print(f"\nMachine: {machine()}")


def _no_host_move(export, cache, *args, **kwargs):
    """``export_pages`` with ``demote_lower`` off."""
    kwargs["demote_lower"] = False
    return export(cache, *args, **kwargs)


if __name__ == "__main__":
    main()

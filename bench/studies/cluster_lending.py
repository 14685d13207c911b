"""Lending that pays? Cluster replays of the Mooncake conversation trace (page 16, LRU); one JSON line per run.

    .venv/bin/python bench/studies/cluster_lending.py [--limit N] [--md bench/results/cluster_lending.md] \
        > bench/results/cluster_lending.jsonl

Rows: issue 19's table rerun (4 x 62,500 blocks: round robin without borrowing, with free-block
lending, with free-block lending at cap 0.9 / watermark 0, with value lending; cache-aware with
and without each; one pooled cache of 250,000 blocks), then 8 instances x 31,250 blocks and a
skewed cluster (half the requests to instance 0, the rest round robin over the others), each
without borrowing and with value lending. The ceiling row is what value lending could reach
with round robin at best: one LRU over all 250,000 blocks (a global clock, no lend cap, no
transfer), each request in the namespace of the instance round robin sends it to, so instances
share memory but no pages. Per row: token hit rate, bytes lent, borrowed hit
tokens, their network transfer seconds, TTFT saving, manager time per request, wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from machine_facts import machine  # noqa: E402

from radixkv.cluster import Cluster
from radixkv.workload.traces import TraceReader

TRACE = "../shared/traces/mooncake_conversation.jsonl"
PAGE = 16
TOTAL = 250_000


class SkewedCluster(Cluster):
    """Round robin over the pattern 0, 1, 0, 2, 0, 3, ...: instance 0 gets half the requests."""

    def route(self, tokens, namespace=None) -> int:
        super().route(tokens, namespace)  # validation, as the base does
        n = len(self.instances)
        k, self._k = getattr(self, "_k", 0), getattr(self, "_k", 0) + 1
        return 0 if k % 2 == 0 else 1 + (k // 2) % (n - 1)


ROWS = [
    ("round robin, no borrowing", Cluster, 4, {}),
    ("round robin, free lending", Cluster, 4, {"borrowing": True}),
    ("round robin, free lending, cap 0.9, watermark 0", Cluster, 4,
     {"borrowing": True, "lend_cap": 0.9, "low_watermark": 0.0}),
    ("round robin, value lending", Cluster, 4, {"borrowing": True, "lending": "value"}),
    ("cache-aware, no borrowing", Cluster, 4, {"routing": "cache_aware"}),
    ("cache-aware, free lending", Cluster, 4, {"routing": "cache_aware", "borrowing": True}),
    ("cache-aware, value lending", Cluster, 4, {"routing": "cache_aware", "borrowing": True, "lending": "value"}),
    ("one pooled cache", Cluster, 1, {}),
    ("ceiling of lending: one LRU cache, each instance's pages apart", Cluster, 1, {"apart": 4}),
    ("8 instances, round robin, no borrowing", Cluster, 8, {}),
    ("8 instances, round robin, value lending", Cluster, 8, {"borrowing": True, "lending": "value"}),
    ("skewed routing, no borrowing", SkewedCluster, 4, {}),
    ("skewed routing, value lending", SkewedCluster, 4, {"borrowing": True, "lending": "value"}),
]

COLUMNS = ("token hit rate", "blocks lent", "bytes lent (GB)", "borrowed hit tokens", "borrowed transfer s",
           "TTFT saving s", "manager us/request", "wall s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--md", default=None, help="also write the table as markdown here")
    args = ap.parse_args()
    lines = [f"Mooncake conversation trace{'' if args.limit is None else f', first {args.limit} requests'}, "
             f"page {PAGE}, LRU, {TOTAL:,} blocks in all.", "",
             "| configuration | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name, cls, n, kw in ROWS:
        kw = dict(kw)
        apart = kw.pop("apart", 0)
        cluster = cls(n, TOTAL // n, PAGE, "lru", **kw)
        requests = TraceReader(args.trace, limit=args.limit)
        if apart:  # request k in namespace k mod 4: the pages round robin would put on each instance
            requests = (replace(r, namespace=f"instance-{k % apart}") for k, r in enumerate(requests))
        r = cluster.replay(requests).as_dict()
        r["configuration"] = name
        print(json.dumps(r), flush=True)
        cells = (f"{r['token_hit_rate']:.2%}", f"{r['blocks_lent']:,}", f"{r['bytes_lent'] / 1e9:,.0f}", f"{r['borrowed_hit_tokens']:,}",
                 f"{r['borrowed_transfer_seconds']:.2f}", f"{r['ttft_saving_seconds']:.1f}",
                 f"{r['manager_us_per_request']:,.0f}", f"{r['wall_seconds']:.0f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        print(lines[-1], file=sys.stderr, flush=True)
    m = machine()
    lines += ["", f"Machine: {m['cpu']}, {m['nproc']} CPUs, Python {m['python']}, numpy {m['numpy']}, "
              f"load average {os.getloadavg()[0]:.1f} at the end (CPUs shared: wall and manager times are upper bounds)."]
    if args.md:
        with open(args.md, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""Render bench/results/peers.jsonl as Markdown tables (the ones in README.md).

    python3 bench/peers/table.py [bench/results/peers.jsonl] [--tag full]
"""
from __future__ import annotations

import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def load(path: str) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def speed_table(rows: list[dict]) -> str:
    out = ["| trace | pages | peer | requests | req/s | p50 us | p99 us | hit tokens | token hit rate | peak RSS MiB | load 1m |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        if r.get("tracemalloc"):
            continue
        pr = r["per_request_us"]
        out.append(
            f"| {r['trace'].replace('.jsonl', '')}{' (first %d)' % r['limit'] if r.get('limit') else ''} "
            f"| {r['num_blocks']} | {r['peer']} {_ver(r)} | {r['requests']} | {r['requests_per_second']:,} "
            f"| {pr['p50']:,} | {pr['p99']:,} | {r['hit_tokens']:,} | {100 * r['token_hit_rate']:.2f}% "
            f"| {r['peak_rss_mib']:,} | {r.get('loadavg_1m', '')} |")
    return "\n".join(out)


def heap_table(rows: list[dict]) -> str:
    out = ["| trace | pages | peer | cached pages at end | Python-heap bytes / cached page | tensor bytes / cached page | RSS start -> end MiB |",
           "| --- | ---: | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        if not r.get("tracemalloc"):
            continue
        out.append(
            f"| {r['trace'].replace('.jsonl', '')} | {r['num_blocks']} | {r['peer']} | {r['cached_pages_end']:,} "
            f"| {r.get('heap_bytes_per_cached_page')} | {r.get('tensor_bytes_per_cached_page') or '-'} "
            f"| {r.get('rss_mib_start')} -> {r.get('rss_mib_end')} |")
    return "\n".join(out)


def _ver(r: dict) -> str:
    v = r.get("versions", {})
    return v.get(r["peer"], "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path", nargs="?", default=os.path.join(os.path.dirname(HERE), "results", "peers.jsonl"))
    p.add_argument("--tag", default=None, help="only rows with this tag")
    args = p.parse_args()
    rows = [r for r in load(args.path) if args.tag is None or r.get("tag") == args.tag]
    print(speed_table(rows))
    print()
    print(heap_table(rows))


if __name__ == "__main__":
    main()

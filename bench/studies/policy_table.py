"""The policy table: token hit rate per policy on both Mooncake traces, whole trace and second half.

    python bench/studies/policy_table.py [--policies lru,2q,arc,lirs,wa,density,belady] [--out bench/results/policy_table]

Capacities: 1M / 3M / 9M tokens at page 16, and the same at block level
(page 512: 1,953 / 5,859 / 17,578 blocks). One replay per (trace, page size,
capacity, policy); the second-half figure is the hit rate of the requests
in the trace's second half within that same replay (the cache warmed by the
first half). ``gap`` is ``(policy - lru) / (belady - lru)`` in token hit
rate. Replay hands the policies that ask for them the trace's request fields
(timestamp, output length). Writes ``<out>.jsonl`` (one line per replay) and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from radixkv import PrefixCache
from radixkv.analysis.replay import replay
from radixkv.workload.traces import TraceReader

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(HERE, "..", "..", "..", "shared", "traces")  # the repository sits beside shared/
SETTINGS = [(512, n) for n in (1953, 5859, 17578)] + [(16, n // 16) for n in (999_936, 2_999_808, 8_999_424)]


def run_one(requests: list, page_size: int, num_blocks: int, policy: str) -> dict:
    """Replay ``requests``; token hit rate over the whole trace and over its second half."""
    hits = np.zeros(len(requests), dtype=np.int64)
    count = [0]

    def record(request, hit):
        hits[count[0]] = hit
        count[0] += 1

    t = time.perf_counter()
    replay(requests, PrefixCache(num_blocks=num_blocks, page_size=page_size, policy=policy), on_request=record)
    lengths = np.array([len(r.tokens) for r in requests], dtype=np.int64)
    half = len(requests) // 2
    return {"policy": policy, "page_size": page_size, "num_blocks": num_blocks,
            "num_tokens": page_size * num_blocks, "whole": float(hits.sum() / lengths.sum()),
            "second_half": float(hits[half:].sum() / lengths[half:].sum()),
            "seconds": round(time.perf_counter() - t, 1)}


def table(rows: list, trace: str) -> list:
    by = {(r["policy"], r["page_size"], r["num_blocks"]): r for r in rows if r["trace"] == trace}
    settings = sorted({(r["page_size"], r["num_blocks"]) for r in rows if r["trace"] == trace})
    names = list(dict.fromkeys(r["policy"] for r in rows if r["trace"] == trace))
    head = ["policy"] + [f"{n * p / 1e6:.0f}M tok, page {p}" for p, n in settings]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name in names:
        cells = [name]
        for p, n in settings:
            r, lru, opt = by.get((name, p, n)), by.get(("lru", p, n)), by.get(("belady", p, n))
            if r is None:
                cells.append("")
                continue
            parts = []
            for part in ("whole", "second_half"):
                cell = f"{100 * r[part]:.2f}%"
                if lru and opt and name not in ("lru", "belady") and opt[part] > lru[part]:
                    cell += f" ({100 * (r[part] - lru[part]) / (opt[part] - lru[part]):+.0f}%)"
                parts.append(cell)
            cells.append(" / ".join(parts))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(rows: list, trace: str) -> list:
    """Lines: the gap each online policy closes at 3M tokens, block level, whole trace; where one is
    more than a point of hit rate below LRU."""
    by = {(r["policy"], r["page_size"], r["num_blocks"]): r for r in rows if r["trace"] == trace}
    lines = []
    lru, opt = by.get(("lru", 512, 5859)), by.get(("belady", 512, 5859))
    if lru and opt:
        closed = [f"`{p}` {100 * (r['whole'] - lru['whole']) / (opt['whole'] - lru['whole']):+.1f}%"
                  for (p, ps, n), r in by.items() if (ps, n) == (512, 5859) and p not in ("lru", "belady")]
        lines.append(f"- 3M tokens, block level, whole trace: share of the LRU-Belady gap closed: {', '.join(closed)}.")
    below = [f"`{p}` {100 * (r[part] - by[('lru', ps, n)][part]):+.2f} points ({part.replace('_', ' ')}, "
             f"{ps * n / 1e6:.0f}M tok, page {ps})"
             for (p, ps, n), r in by.items() if p not in ("lru", "belady") and ("lru", ps, n) in by
             for part in ("whole", "second_half") if r[part] < by[("lru", ps, n)][part] - 0.01]
    lines.append("- more than 1 point below LRU: " + ("; ".join(below) if below else "none") + ".")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="conversation,synthetic")
    ap.add_argument("--policies", default="lru,2q,arc,lirs,wa,density,belady")
    ap.add_argument("--settings", default="all", help="'all' or page:blocks,... e.g. 512:5859")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "results", "policy_table"))
    ap.add_argument("--md-only", action="store_true", help="rewrite <out>.md from <out>.jsonl")
    args = ap.parse_args(argv)
    if args.md_only:
        with open(args.out + ".jsonl") as f:
            rows = [json.loads(line) for line in f]
        write_md(rows, list(dict.fromkeys(r["trace"] for r in rows)), args.out + ".md")
        return
    settings = SETTINGS if args.settings == "all" else [
        tuple(int(x) for x in s.split(":")) for s in args.settings.split(",")]
    rows = []
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    traces = args.traces.split(",")
    requests = {trace: list(TraceReader(os.path.join(TRACES, f"mooncake_{trace}.jsonl"))) for trace in traces}
    with open(args.out + ".jsonl", "w") as out:
        for page_size, num_blocks in settings:  # block level first: it is the fast half
            for trace in traces:
                for name in args.policies.split(","):
                    row = dict(trace=trace, **run_one(requests[trace], page_size, num_blocks, name))
                    rows.append(row)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(f"{trace} page {page_size} {num_blocks} {name}: whole {100 * row['whole']:.2f}% "
                          f"second half {100 * row['second_half']:.2f}% ({row['seconds']}s)", file=sys.stderr,
                          flush=True)
                    write_md(rows, traces, args.out + ".md")


def write_md(rows: list, traces: list, path: str) -> None:
    """The markdown tables of ``rows`` (rewritten after every replay, so a partial run leaves its table)."""
    md = ["# Policy table on the Mooncake traces", "",
          "Token hit rate, whole trace / second half (the second half's requests within the same replay); "
          "in parentheses the share of the LRU-to-Belady gap closed. Generated by `python bench/studies/policy_table.py`; "
          "raw rows in `policy_table.jsonl`. Default parameters throughout.", ""]
    for trace in traces:
        md += [f"## {trace}", ""] + table(rows, trace) + [""] + summary(rows, trace) + [""]
    with open(path, "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main()

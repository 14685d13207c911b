"""Hit rate and prefill compute saved, per eviction policy, on the Mooncake traces.

    python bench/studies/policies_sweep.py [--traces conversation,synthetic] [--num-blocks 62496,187488,562464]
                                   [--policies all] [--page-size 16] [--out bench/results/policies]

One replay per (trace, capacity, policy), Belady included as the ceiling.
Writes one JSON line per run to ``<out>.jsonl`` and one markdown table per
trace to ``<out>.md``. ``flops_saved`` is the prefill compute the hits spared
(``prefill_flops(llama-3-8b, 0, hit_tokens)`` summed over requests);
``gap_closed`` is ``(policy - lru) / (belady - lru)`` in token hit rate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from radixkv import PrefixCache, policies
from radixkv.costs import get_model, prefill_flops_array
from radixkv.analysis.replay import replay
from radixkv.workload.traces import TraceReader

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(HERE, "..", "..", "shared", "traces")
FLOPS_MODEL = "llama-3-8b"


def run_one(requests: list, trace: str, num_blocks: int, policy: str, page_size: int) -> dict:
    cache = PrefixCache(num_blocks=num_blocks, page_size=page_size, policy=policy)
    hits = np.zeros(len(requests), dtype=np.int64)
    lengths = np.zeros(len(requests), dtype=np.int64)
    count = [0]

    def record(request, hit):
        hits[count[0]] = hit
        lengths[count[0]] = len(request.tokens)
        count[0] += 1

    result = replay(requests, cache, on_request=record)
    model = get_model(FLOPS_MODEL)
    zeros = np.zeros_like(hits)
    saved = float(prefill_flops_array(model, zeros, hits).sum())
    total = float(prefill_flops_array(model, zeros, lengths).sum())
    row = result.as_dict()
    row.update(trace=trace, num_tokens=num_blocks * page_size, flops_saved=saved,
               flops_saved_share=saved / total if total else 0.0)
    return row


def table(rows: list, trace: str) -> str:
    caps = sorted({r["num_blocks"] for r in rows if r["trace"] == trace})
    by = {(r["policy"], r["num_blocks"]): r for r in rows if r["trace"] == trace}
    names = [p for p in dict.fromkeys(r["policy"] for r in rows if r["trace"] == trace)]
    head = ["policy"] + [f"{c:,} blocks ({c * rows[0]['page_size'] / 1e6:.1f}M tok)" for c in caps]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name in names:
        cells = [name]
        for c in caps:
            r, lru, opt = by.get((name, c)), by.get(("lru", c)), by.get(("belady", c))
            if r is None:
                cells.append("")
                continue
            cell = f"{100 * r['token_hit_rate']:.2f}%"
            if lru and opt and name not in ("lru", "belady"):
                span = opt["token_hit_rate"] - lru["token_hit_rate"]
                gap = (r["token_hit_rate"] - lru["token_hit_rate"]) / span if span else 0.0
                cell += f" ({100 * gap:+.0f}% gap, FLOPs x{r['flops_saved'] / lru['flops_saved']:.3f})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list, trace: str) -> list:
    """Lines: per capacity, the best online policy and the share of the LRU-to-Belady gap it closes."""
    by = {(r["policy"], r["num_blocks"]): r for r in rows if r["trace"] == trace}
    lines = []
    for c in sorted({r["num_blocks"] for r in rows if r["trace"] == trace}):
        lru, opt = by[("lru", c)]["token_hit_rate"], by[("belady", c)]["token_hit_rate"]
        online = {p: r for (p, cap), r in by.items() if cap == c and p != "belady"}
        best = max(online, key=lambda p: online[p]["token_hit_rate"])
        rate = online[best]["token_hit_rate"]
        worst_vs_lru = {p: 100 * (r["token_hit_rate"] - lru) for p, r in online.items()}
        lines.append(f"- {c:,} blocks: LRU {100 * lru:.2f}%, Belady {100 * opt:.2f}%; best online "
                     f"`{best}` {100 * rate:.2f}% closes {100 * (rate - lru) / (opt - lru):.1f}% of the gap; "
                     f"`gdsf` saves {by[('gdsf', c)]['flops_saved'] / by[('lru', c)]['flops_saved']:.3f}x "
                     f"LRU's prefill FLOPs; `adaptive` vs LRU {worst_vs_lru.get('adaptive', float('nan')):+.2f} points.")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="conversation,synthetic")
    ap.add_argument("--num-blocks", default="62496,187488,562464")
    ap.add_argument("--policies", default="all")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "results", "policies"))
    args = ap.parse_args(argv)
    names = policies.available() if args.policies == "all" else args.policies.split(",")
    names = [n for n in names if n not in ("lru", "belady")]
    names = ["lru"] + names + ["belady"]
    rows = []
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".jsonl", "w") as out:
        for trace in args.traces.split(","):
            requests = list(TraceReader(os.path.join(TRACES, f"mooncake_{trace}.jsonl")))
            for num_blocks in [int(x) for x in args.num_blocks.split(",")]:
                for name in names:
                    t = time.perf_counter()
                    row = run_one(requests, trace, num_blocks, name, args.page_size)
                    rows.append(row)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(f"{trace} {num_blocks} {name}: {100 * row['token_hit_rate']:.2f}% "
                          f"flops_saved={row['flops_saved']:.3e} ({time.perf_counter() - t:.1f}s)",
                          file=sys.stderr, flush=True)
            del requests
    md = [f"# Eviction policies on the Mooncake traces (page size {args.page_size})", "",
          "Token hit rate per policy and capacity; in parentheses the share of the LRU-to-Belady gap "
          "closed and prefill FLOPs saved relative to LRU (llama-3-8b). Generated by "
          "`python bench/studies/policies_sweep.py`; raw rows in `policies.jsonl`.", "",
          "`sieve` and `slru` evict only leaves not hit since they were cached, oldest first. On these "
          "traces a continuation extends the leaf it reuses (splitting it) instead of hitting it whole, "
          "so nearly every victim of either is such a leaf, and where the two tie they evict the same "
          "pages (identical hits on the conversation trace). The prefixes they protect are never evicted "
          "while an unhit leaf exists (no cap, as in SGLang's SLRU), which is why both fall below LRU "
          "at 3M and 9M tokens on the conversation trace.", ""]
    for trace in args.traces.split(","):
        md += [f"## {trace}", "", table(rows, trace), ""] + summary(rows, trace) + [""]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()

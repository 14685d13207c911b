"""Render compare.py's JSON lines as Markdown tables.

    python3 bench/peers/compare_table.py bench/results/peers_compare.jsonl > bench/results/peers_compare.md
    python3 bench/peers/compare_table.py --by-page bench/results/page1_unified.jsonl   # rows of the table in
                                                                                      # results/page1_unified.md

``--by-page`` prints one row per JSON line (run tag, page size) with radixkv's
ratio to every other peer over the best and over the median repetition, then one
row per page size over every repetition of every line (medians of all rates).
"""

from __future__ import annotations

import json
import statistics
import sys

NOTE = (
    "Hit tokens: vLLM's equal radixkv's exactly (its free queue evicts in the same (last access, deepest "
    "first) order). SGLang's are 0.1-1.8% lower: it evicts whole nodes (a leaf's entire edge) where radixkv "
    "frees exactly the pages it needs from the tail of the leaf. vLLM spends about half its time hashing "
    "every full block (sha256) of every prompt. Absolute rates move with the shared machine's state (up to "
    "2x between runs a few hours apart); the ratios, measured alternating in one process, are what compares."
)


def render(rows: list) -> str:
    m = rows[0]["machine"]
    out = ["# radixkv vs SGLang RadixCache vs vLLM BlockPool (same process, alternating)", "",
           f"`bench/peers/.venv/bin/python bench/peers/compare.py --repeat {rows[0]['repeat']}`. Machine: {m['cpu']}, "
           f"{m['nproc']} CPUs, Python {m['python']}, torch {m.get('torch')} ({m.get('torch_threads')} thread), "
           f"numpy {m['numpy']}; 1-minute load average {max(r['load_avg_1m'] for r in rows):.2f} at most. LRU replay "
           f"semantics of the README; page 16; requests/s over the time spent in the cache calls, best of "
           f"{rows[0]['repeat']} (all listed in the JSONL); per-request p50/p99 in microseconds.", "",
           "| trace | blocks | radixkv req/s | SGLang req/s | vLLM req/s | x SGLang | x vLLM | radixkv p50 / p99 "
           "| SGLang p50 / p99 | vLLM p50 / p99 | hit tokens radixkv / SGLang / vLLM |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        p = r["peers"]
        lat = {k: f"{v['per_request_us']['p50']:.0f} / {v['per_request_us']['p99']:.0f}" for k, v in p.items()}
        out.append(
            f"| {r['trace'].replace('mooncake_', '')} | {r['num_blocks']:,} | {p['radixkv']['requests_per_second']:,.0f} | "
            f"{p['sglang']['requests_per_second']:,.0f} | {p['vllm']['requests_per_second']:,.0f} | "
            f"{r['speedup']['sglang']:.2f} | {r['speedup']['vllm']:.1f} | {lat['radixkv']} | {lat['sglang']} | "
            f"{lat['vllm']} | {p['radixkv']['hit_tokens']:,} / {p['sglang']['hit_tokens']:,} / {p['vllm']['hit_tokens']:,} |")
    return "\n".join(out + ["", NOTE, ""])


def render_by_page(rows: list) -> str:
    """One row per (run, page) with every peer's best rate and radixkv's best and median ratios to it."""
    others = [p for p in rows[0]["peers"] if p != "radixkv"]
    head = (["run", "page", "blocks", "radixkv req/s"] + [f"{p} req/s" for p in others]
            + [f"x {p} best / median" for p in others] + ["hit tokens " + " / ".join(["radixkv"] + others),
                                                          "1-min load start / end"])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def line(run, page, blocks, rate, ratio, ratio_median, hits, load):
        cells = [run, str(page), f"{blocks:,}", f"{rate['radixkv']:,.0f}"] + [f"{rate[p]:,.0f}" for p in others]
        cells += [f"{ratio[p]:.2f} / {ratio_median[p]:.2f}" for p in others]
        cells += [" / ".join(f"{hits[p]:,}" for p in ["radixkv"] + others), load]
        out.append("| " + " | ".join(cells) + " |")

    for r in rows:
        p = r["peers"]
        line(r.get("tag", ""), r["page_size"], r["num_blocks"], {k: v["requests_per_second"] for k, v in p.items()},
             r["speedup"], r["speedup_median"], {k: v["hit_tokens"] for k, v in p.items()},
             f"{r['load_avg_1m_start']:.2f} / {r['load_avg_1m']:.2f}")
    for page in sorted({r["page_size"] for r in rows}):
        group = [r for r in rows if r["page_size"] == page]
        rates = {k: [x for r in group for x in r["peers"][k]["all_rates"]] for k in group[0]["peers"]}
        best = {k: max(v) for k, v in rates.items()}
        median = {k: statistics.median(v) for k, v in rates.items()}
        line(f"all {len(rates['radixkv'])} repetitions (best; ratios best / median)", page, group[0]["num_blocks"],
             best, {k: best["radixkv"] / best[k] for k in others}, {k: median["radixkv"] / median[k] for k in others},
             {k: group[0]["peers"][k]["hit_tokens"] for k in group[0]["peers"]},
             f"{min(r['load_avg_1m_start'] for r in group):.2f}-{max(r['load_avg_1m'] for r in group):.2f}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    by_page = sys.argv[1] == "--by-page"
    with open(sys.argv[-1]) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    print((render_by_page if by_page else render)(rows), end="")

"""Render compare.py's JSON lines as the Markdown table in results/peers_compare.md.

    python3 bench/peers/compare_table.py bench/results/peers_compare.jsonl > bench/results/peers_compare.md
"""

from __future__ import annotations

import json
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


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        print(render([json.loads(line) for line in fh if line.strip()]), end="")

"""The one-pass LRU curve against per-capacity LRU replays, on the WHOLE Mooncake traces.

    .venv/bin/python bench/checks/curve_vs_replay.py [--page-size 16] [--out bench/results/curve_vs_replay.json]

For each trace: one pass of :func:`radixkv.analysis.sweep.trace_curve` (the ``radixkv
curve`` path, block ids recovered from the expanded tokens), one pass of
:func:`radixkv.analysis.curve.lru_curve_mooncake` (hash ids read directly), and one
full ``replay`` through ``PrefixCache(c, page_size, "lru")`` per capacity.
The three must agree exactly at every capacity; the script exits 1 if not.
Prints a markdown table per trace and writes everything, with the machine,
as one JSON file.
"""

from __future__ import annotations

import os

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from machine_facts import machine  # noqa: E402

from radixkv import PrefixCache
from radixkv.analysis.curve import lru_curve_mooncake
from radixkv.analysis.replay import replay
from radixkv.analysis.sweep import trace_curve
from radixkv.workload.traces import TraceReader

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
CAPACITIES = [1000, 5000, 20000, 62500, 125000, 187488, 375000, 750000, 1500000, 3000000]


def check_trace(path: Path, page_size: int, capacities: list) -> dict:
    requests = list(TraceReader(str(path)))
    t0 = time.perf_counter()
    curve = trace_curve(requests, page_size, capacities, mooncake=True)
    curve_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    direct = lru_curve_mooncake(str(path), page_size, capacities)
    direct_seconds = time.perf_counter() - t0
    rows = []
    for c, hits, direct_hits in zip(capacities, curve.hit_tokens, direct.hit_tokens):
        t0 = time.perf_counter()
        result = replay(requests, PrefixCache(c, page_size), miss_reasons=False)
        rows.append({"num_blocks": c, "capacity_tokens": c * page_size, "curve_hit_tokens": hits,
                     "direct_curve_hit_tokens": direct_hits, "replay_hit_tokens": result.hit_tokens,
                     "token_hit_rate": result.token_hit_rate, "request_hit_rate": result.request_hit_rate,
                     "equal": hits == direct_hits == result.hit_tokens,
                     "replay_seconds": round(time.perf_counter() - t0, 3)})
    return {"trace": path.name, "page_size": page_size, "requests": curve.requests,
            "prompt_tokens": curve.prompt_tokens, "no_eviction_hit_rate": curve.max_hit_tokens / curve.prompt_tokens,
            "curve_seconds": round(curve_seconds, 3), "direct_curve_seconds": round(direct_seconds, 3),
            "all_equal": all(r["equal"] for r in rows), "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "curve_vs_replay.json"))
    args = parser.parse_args()
    report = {"machine": machine(), "capacities": CAPACITIES, "traces": []}
    for name in ("mooncake_conversation", "mooncake_synthetic"):
        entry = check_trace(TRACES / f"{name}.jsonl", args.page_size, CAPACITIES)
        report["traces"].append(entry)
        print(f"\n{name}: {entry['requests']} requests, {entry['prompt_tokens']} prompt tokens, page "
              f"{args.page_size}; curve {entry['curve_seconds']} s (direct {entry['direct_curve_seconds']} s), "
              f"replays {sum(r['replay_seconds'] for r in entry['rows']):.1f} s; all equal: {entry['all_equal']}")
        print("| num_blocks | tokens | token_hit_rate | curve = direct = replay hit tokens |")
        print("|---:|---:|---:|---|")
        for r in entry["rows"]:
            print(f"| {r['num_blocks']} | {r['capacity_tokens']} | {r['token_hit_rate']:.4f} | "
                  f"{r['curve_hit_tokens']} {'==' if r['equal'] else '!='} {r['replay_hit_tokens']} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0 if all(t["all_equal"] for t in report["traces"]) else 1


if __name__ == "__main__":
    sys.exit(main())

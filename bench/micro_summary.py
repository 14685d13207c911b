"""Shrink a pytest-benchmark JSON of bench/test_micro.py to what is worth committing.

    .venv/bin/python bench/micro_summary.py /tmp/micro-raw.json bench/results/micro

Writes ``<out>.json`` (per benchmark: min / median / max / rounds in seconds,
extra_info; the machine) and ``<out>.md`` (the same as tables). The raw
pytest-benchmark file keeps every round's timing and runs to megabytes.
"""

from __future__ import annotations

import json
import os
import sys

from perf_trace import machine


def summarize(raw: dict) -> dict:
    rows = []
    for bench in raw["benchmarks"]:
        stats = bench["stats"]
        rows.append({"name": bench["name"], "group": bench["name"].split("[")[0],
                     "param": bench.get("param"), "min": stats["min"], "median": stats["median"],
                     "max": stats["max"], "rounds": stats["rounds"], **bench.get("extra_info", {})})
    info = raw.get("machine_info", {})
    return {"machine": {**machine(), "load_average_1m": round(os.getloadavg()[0], 2),
                        "node": info.get("node"), "cpu_brand": (info.get("cpu") or {}).get("brand_raw")},
            "datetime": raw.get("datetime"), "benchmarks": rows}


def markdown(summary: dict) -> str:
    m = summary["machine"]
    lines = [f"# Micro-benchmarks ({summary['datetime']})", "",
             f"Machine: {m['cpu']}, {m['nproc']} CPUs, Python {m['python']}, numpy {m['numpy']}, "
             f"1-minute load average {m['load_average_1m']} when summarized (other jobs share the CPUs).", "",
             "## Operations on a full cache (microseconds)", "",
             "| operation | cached blocks | min | median | max | rounds |", "|---|---:|---:|---:|---:|---:|"]
    ops = [b for b in summary["benchmarks"] if b["group"] != "test_replay_throughput"]
    for b in sorted(ops, key=lambda b: (b["group"], b.get("cached_blocks", 0))):
        lines.append(f"| {b['group'][5:]} | {b.get('cached_blocks', b['param'])} | {b['min'] * 1e6:.1f} | "
                     f"{b['median'] * 1e6:.1f} | {b['max'] * 1e6:.1f} | {b['rounds']} |")
    lines += ["", "## Replay throughput, LRU at 187,488 blocks of 16 tokens (best of rounds)", "",
              "| trace | miss reasons | seconds (min / median) | requests/s | prompt tokens/s | token hit rate |",
              "|---|---|---:|---:|---:|---:|"]
    for b in summary["benchmarks"]:
        if b["group"] == "test_replay_throughput":
            reasons = "on" if b["param"].endswith("-reasons") and "no-" not in b["param"] else "off"
            lines.append(f"| {b['trace']} | {reasons} | {b['min']:.3f} / {b['median']:.3f} | "
                         f"{b['requests_per_second']:,} | {b['prompt_tokens_per_second']:,} | {b['token_hit_rate']:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    raw_path, out = sys.argv[1], sys.argv[2]
    with open(raw_path) as f:
        summary = summarize(json.load(f))
    with open(out + ".json", "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    with open(out + ".md", "w") as f:
        f.write(markdown(summary))
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shrink a pytest-benchmark JSON of bench/perf/test_micro.py to what is worth committing.

    .venv/bin/python bench/perf/micro_summary.py out/micro-raw.json bench/results/micro

Writes ``<out>.json`` (per benchmark: min / median / max / rounds in seconds,
extra_info; the machine), ``<out>.md`` (the same as tables, with the growth
from 10^3 to 10^6 blocks) and ``<out>.png`` (time per call against size). The raw
pytest-benchmark file keeps every round's timing and runs to megabytes.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from machine_facts import machine  # noqa: E402


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
    ops = [b for b in summary["benchmarks"] if b["group"] != "test_replay_throughput"]
    pages = sorted({b.get("page_size", 16) for b in ops})  # (summaries before page_size was recorded: 16)
    lines = [f"# Micro-benchmarks ({summary['datetime']})", "",
             f"Machine: {m['cpu']}, {m['nproc']} CPUs, Python {m['python']}, numpy {m['numpy']}, "
             f"1-minute load average {m['load_average_1m']} when summarized (other jobs share the CPUs).", "",
             f"## Operations on a full cache, page {', '.join(map(str, pages))} (microseconds)", "",
             "| operation | cached blocks | min | median | max | rounds |", "|---|---:|---:|---:|---:|---:|"]
    for b in sorted(ops, key=lambda b: (b["group"], b.get("cached_blocks", 0))):
        lines.append(f"| {b['group'][5:]} | {b.get('cached_blocks', b['param'])} | {b['min'] * 1e6:.1f} | "
                     f"{b['median'] * 1e6:.1f} | {b['max'] * 1e6:.1f} | {b['rounds']} |")
    lines += ["", "## Growth from 10^3 to 10^6 cached blocks", "",
              "| operation | min ratio | median ratio |", "|---|---:|---:|"]
    for group, (lo, hi) in sorted(growth(summary).items()):
        lines.append(f"| {group[5:]} | {hi['min'] / lo['min']:.2f}x | {hi['median'] / lo['median']:.2f}x |")
    shapes = sorted((b for b in ops if b["group"] == "test_match" and "nodes_crossed" in b),
                    key=lambda b: b["cached_blocks"])
    if shapes:
        lines += ["", "## What a match walks (means over the matched prompts, all full hits)", "",
                  "| cached blocks | pages matched | nodes crossed |", "|---:|---:|---:|"]
        lines += [f"| {b['cached_blocks']} | {b['pages_matched']} | {b['nodes_crossed']} |" for b in shapes]
    replays = [b for b in summary["benchmarks"] if b["group"] == "test_replay_throughput"]
    if replays:  # (not run with -k 'not replay')
        lines += ["", "## Replay throughput, LRU at 187,488 blocks of 16 tokens (best of rounds)", "",
                  "| trace | miss reasons | seconds (min / median) | requests/s | prompt tokens/s | token hit rate |",
                  "|---|---|---:|---:|---:|---:|"]
    for b in replays:
        reasons = "on" if b["param"].endswith("-reasons") and "no-" not in b["param"] else "off"
        lines.append(f"| {b['trace']} | {reasons} | {b['min']:.3f} / {b['median']:.3f} | "
                     f"{b['requests_per_second']:,} | {b['prompt_tokens_per_second']:,} | {b['token_hit_rate']:.4f} |")
    return "\n".join(lines) + "\n"


def growth(summary: dict) -> dict:
    """Per operation, the rows at 10^3 and 10^6 cached blocks."""
    rows = {}
    for b in summary["benchmarks"]:
        if b["group"] != "test_replay_throughput" and b.get("cached_blocks") in (10**3, 10**6):
            rows.setdefault(b["group"], {})[b["cached_blocks"]] = b
    return {g: (r[10**3], r[10**6]) for g, r in rows.items() if len(r) == 2}


def plot(summary: dict, path: str) -> None:
    """Per-operation median (and min) time against cached blocks, log-log."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    groups = sorted({b["group"] for b in summary["benchmarks"] if b["group"] != "test_replay_throughput"})
    for group in groups:
        rows = sorted((b for b in summary["benchmarks"] if b["group"] == group), key=lambda b: b["cached_blocks"])
        x = [b["cached_blocks"] for b in rows]
        line, = ax.plot(x, [b["median"] * 1e6 for b in rows], marker="o", label=f"{group[5:]} (median)")
        ax.plot(x, [b["min"] * 1e6 for b in rows], linestyle=":", color=line.get_color(), label=f"{group[5:]} (min)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    pages = sorted({b.get("page_size", 16) for b in summary["benchmarks"] if b["group"] != "test_replay_throughput"})
    ax.set_xlabel(f"cached blocks (page {', '.join(map(str, pages))})")
    ax.set_ylabel("microseconds per call")
    ax.set_title("radixkv: cost per operation against cache size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: no line hidden
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    raw_path, out = sys.argv[1], sys.argv[2]
    with open(raw_path) as f:
        summary = summarize(json.load(f))
    with open(out + ".json", "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    with open(out + ".md", "w") as f:
        f.write(markdown(summary))
    plot(summary, out + ".png")
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A fleet of real processes over a shared store, beside the in-process simulator of the same fleet.

    python bench/studies/fleet_processes.py [TRACE] [--processes 4] [--num-blocks 62500] [--store-blocks 250000]
                                            [--only memory,redis,mooncake]

Runs ``radixkv cluster TRACE --json`` three times, each a fresh process as a user would: the
simulator with an in-process store (``--store memory``), then ``--processes N`` over a redis-server
and over a Mooncake master, each started for the run (``--store mooncake``), every hit page's bytes
checked. Prints a markdown table (the processes rows of bench/results/fleet.md): hit rate, store hit
tokens, the store's round trips and wall time per request, backend errors and wrong pages.
Each processes run takes 4-6 minutes on a 2-CPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from machine_facts import machine  # noqa: E402

RUNS = {
    "memory": ("the simulator, an in-process store", ["--store", "memory"]),
    "redis": ("{n} processes, a redis-server of their own", ["--processes", "{n}"]),
    "mooncake": ("{n} processes, a Mooncake master of their own", ["--processes", "{n}", "--store", "mooncake"]),
}


def run(trace: str, flags: list, n: int, blocks: int, store_blocks: int) -> dict:
    """One ``radixkv cluster`` command's JSON (its wall time measured from outside, interpreter start included)."""
    argv = [sys.executable, "-m", "radixkv", "cluster", trace, "--instances", str(n), "--num-blocks", str(blocks),
            "--store-blocks", str(store_blocks), "--json", "--quiet", *flags]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv[2:])} failed: {done.stderr.strip()}")
    out = json.loads(done.stdout)
    out["command_seconds"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default="../shared/traces/mooncake_conversation.jsonl")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--num-blocks", type=int, default=62500)
    parser.add_argument("--store-blocks", type=int, default=250000)
    parser.add_argument("--only", default=",".join(RUNS), help="which runs, comma-separated")
    args = parser.parse_args()
    n = args.processes
    print(f"{args.trace}: {n} x {args.num_blocks:,} blocks, a {args.store_blocks:,}-page store, page 16, LRU, "
          f"round robin\n")
    print("| configuration | token hit rate | store hit tokens | store round trips / request | ms / request "
          "| backend errors | pages checked | wrong pages | command s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.only.split(","):
        label, flags = RUNS[name]
        r = run(args.trace, [f.format(n=n) for f in flags], n, args.num_blocks, args.store_blocks)
        st = r["store_stats"]
        checked = f"{r['verified_pages']:,}" if "verified_pages" in r else "n/a"
        wrong = f"{r['wrong_pages']:,}" if "wrong_pages" in r else "n/a"
        print(f"| {label.format(n=n)} | {r['token_hit_rate']:.2%} | {r['store_hit_tokens']:,} | "
              f"{st['round_trips'] / r['requests']:.2f} | {1000 * r['wall_seconds'] / r['requests']:.1f} | "
              f"{st['backend_errors']:,} | {checked} | {wrong} | {r['command_seconds']:.0f} |", flush=True)
    facts = machine()
    print(f"\nMachine: {facts['cpu']}, {facts['nproc']} CPUs, Python {facts['python']}, numpy {facts['numpy']}, "
          f"load average {os.getloadavg()[0]:.1f} at the end.")


if __name__ == "__main__":
    main()

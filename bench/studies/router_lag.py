"""How far may a KV-event router's view lag before its routing suffers? ``cluster --event-lag`` swept.

    python bench/studies/router_lag.py [TRACE] [--lags 0,1,4,16,64,256,1024] [--instances 4]
                                       [--num-blocks 62500] [--jobs 2]

Runs ``radixkv cluster TRACE --routing kv_events --event-lag N --json`` once per lag (each a fresh
process, ``--jobs`` at a time) and ``--routing cache_aware`` and ``round_robin`` beside them, and
prints a markdown table: hit rate, pages the router predicted and were not served (false hits), pages
served it did not predict (missed), and whether its view ended equal to the instances' HBM. A lag of
N decisions routes request i on the events of the requests before i - N. Hit rates are exact (the
replays are deterministic); each run takes about 2 minutes on a 2-CPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from machine_facts import machine  # noqa: E402


def run(trace: str, instances: int, blocks: int, flags: list) -> dict:
    """One ``radixkv cluster`` command's JSON."""
    argv = [sys.executable, "-m", "radixkv", "cluster", trace, "--instances", str(instances), "--num-blocks",
            str(blocks), "--json", "--quiet", *flags]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv[2:])} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default="../shared/traces/mooncake_conversation.jsonl")
    parser.add_argument("--lags", default="0,1,4,16,64,256,1024", help="decisions of lag, comma-separated")
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--num-blocks", type=int, default=62500)
    parser.add_argument("--jobs", type=int, default=2, help="commands at a time")
    args = parser.parse_args()
    lags = [int(x) for x in args.lags.split(",")]
    runs = {f"kv_events, lag {lag:,}": ["--routing", "kv_events", "--event-lag", str(lag)] for lag in lags}
    runs["cache_aware (reads the trees)"] = ["--routing", "cache_aware"]
    runs["round_robin"] = ["--routing", "round_robin"]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(runs, pool.map(lambda flags: run(args.trace, args.instances, args.num_blocks, flags),
                                          runs.values())))
    print(f"{args.trace}: {args.instances} x {args.num_blocks:,} blocks, page 16, LRU\n")
    print("| routing | token hit rate | hit tokens | false-hit pages | missed pages | divergent at the end |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        routed = r["routing"] == "kv_events"
        cells = [f"{r['router_false_hit_pages']:,}", f"{r['router_missed_pages']:,}",
                 f"{r['router_divergent_pages']:,}"] if routed else ["-", "-", "-"]
        print(f"| {name} | {r['token_hit_rate']:.3%} | {r['hit_tokens']:,} | " + " | ".join(cells) + " |")
    print(f"\nMachine: {machine()}")


if __name__ == "__main__":
    main()

"""Replay cost of many single-use namespaces (per-request salts), with and without miss reasons.

    python bench/perf/namespaces.py [--counts 1000,2000,4000,10000] [--prompt-pages 4] [--repeat 3]
                               [--out bench/results/namespaces.jsonl]
    python bench/perf/namespaces.py --trace ../shared/traces/mooncake_conversation.jsonl --counts 4000
                               [--num-blocks 187488]
    python bench/perf/namespaces.py --counts 10000 --cachegrind   # instructions, not seconds

Each request is a prompt of ``--prompt-pages`` pages (page 16) whose first half
is a system prefix shared with the others, in its own namespace, through a cache large enough to keep
every page (so every namespace's root stays: the worst case for the
``other_namespace`` miss reason, which looks at every namespace that could
hold the request's prefix). Prints and writes one JSON line per count: the
best-of-``repeat`` wall time of the bare replay (``miss_reasons=False``) and
of the replay with miss reasons, their ratio, and the roots left after
evicting everything (0: an unused namespace costs nothing). Work per request
must stay flat as the count grows (it was quadratic: every other namespace's
root was walked per request); most of the ratio is the per-request cost of
miss reasons that a single-namespace replay pays too (``--one-namespace``).
``--trace`` replays the first ``count`` requests of a trace file instead (read
before timing), through ``--num-blocks`` blocks.

``--cachegrind`` counts instead of timing (deterministic, for a loaded machine):
one run under valgrind's cachegrind per mode (no replay, the bare replay, the
replay with miss reasons), and the ratio of the two replays' instructions and
estimated cycles with the no-replay run subtracted (bench/cachegrind.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from machine_facts import machine  # noqa: E402
import cachegrind  # noqa: E402

from radixkv import PrefixCache
from radixkv.analysis.replay import replay
from radixkv.workload.traces import Request, TraceReader

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = 16


def trace(n: int, pages: int, one_namespace: bool = False):
    rng = np.random.default_rng(n)
    half = pages // 2 * PAGE
    system = np.arange(half, dtype=np.uint32)
    return [Request(np.concatenate([system, rng.integers(1000, 50000, pages * PAGE - half).astype(np.uint32)]),
                    namespace=None if one_namespace else f"salt-{i}") for i in range(n)]


def timed(requests, repeat: int, num_blocks=None):
    """Best-of-``repeat`` wall and CPU seconds of the bare replay and of the replay with miss
    reasons, run in turn (bare, reasons, bare, ...) so that a change in the machine's load hits
    both alike. On a loaded machine the CPU seconds are the steadier figure."""
    wall = {False: float("inf"), True: float("inf")}
    cpu = dict(wall)
    pages = sum(len(r.tokens) for r in requests) // PAGE
    for _ in range(repeat):
        for miss_reasons in (False, True):
            cache = PrefixCache(num_blocks=num_blocks or pages + 64, page_size=PAGE)
            start, start_cpu = time.perf_counter(), time.process_time()
            result = replay(requests, cache, miss_reasons=miss_reasons)
            wall[miss_reasons] = min(wall[miss_reasons], time.perf_counter() - start)
            cpu[miss_reasons] = min(cpu[miss_reasons], time.process_time() - start_cpu)
    cache.evict(cache.num_cached_blocks)
    return wall, cpu, result, cache.num_namespaces


def workload(n: int, args) -> tuple:
    """The requests of one count, and their mean prompt pages."""
    if args.trace:
        requests = list(TraceReader(args.trace, limit=n))
        return requests, round(sum(len(r.tokens) for r in requests) / PAGE / max(len(requests), 1), 1)
    return trace(n, args.prompt_pages, args.one_namespace), args.prompt_pages


def counted(n: int, args) -> dict:
    """Instructions and estimated cycles of the bare replay and of the replay with miss reasons,
    each less a run that builds the same requests and replays nothing."""
    base = [sys.executable, os.path.abspath(__file__), "--counts", str(n), "--prompt-pages", str(args.prompt_pages),
            "--num-blocks", str(args.num_blocks), *(["--trace", args.trace] if args.trace else []),
            *(["--one-namespace"] if args.one_namespace else [])]
    none = cachegrind.count([*base, "--only", "none"], functions=False)
    bare = cachegrind.minus(cachegrind.count([*base, "--only", "bare"], functions=False), none)
    reasons = cachegrind.minus(cachegrind.count([*base, "--only", "reasons"], functions=False), none)
    return {"bare_Ir": bare["Ir"], "miss_reasons_Ir": reasons["Ir"], "Ir_ratio": round(reasons["Ir"] / bare["Ir"], 3),
            "bare_est_cycles": bare["est_cycles"], "miss_reasons_est_cycles": reasons["est_cycles"],
            "est_cycles_ratio": round(reasons["est_cycles"] / bare["est_cycles"], 3)}


def only(n: int, mode: str, args) -> None:
    """One replay of one count, in ``mode`` (none, bare or reasons), for :func:`counted`."""
    requests, _ = workload(n, args)
    pages = sum(len(r.tokens) for r in requests) // PAGE
    cache = PrefixCache(num_blocks=args.num_blocks if args.trace else pages + 64, page_size=PAGE)
    if mode != "none":
        replay(requests, cache, miss_reasons=mode == "reasons")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1000,2000,4000,10000")
    parser.add_argument("--prompt-pages", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one-namespace", action="store_true", help="the same requests, all in one namespace")
    parser.add_argument("--trace", help="replay the first COUNT requests of this trace file instead")
    parser.add_argument("--num-blocks", type=int, default=187488, help="cache size with --trace")
    parser.add_argument("--cachegrind", action="store_true", help="count instructions under valgrind instead")
    parser.add_argument("--only", choices=("none", "bare", "reasons"), help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "results", "namespaces.jsonl"))
    args = parser.parse_args()
    lines = []
    for n in (int(c) for c in args.counts.split(",")):
        if args.only:
            only(n, args.only, args)
            continue
        if args.cachegrind:
            line = {"namespaces": n, "bench": "namespaces-cachegrind", "prompt_pages": args.prompt_pages,
                    **({"trace": os.path.basename(args.trace)} if args.trace else {}), **counted(n, args),
                    "machine": machine()}
            print(json.dumps(line), flush=True)
            lines.append(line)
            continue
        requests, prompt_pages = workload(n, args)
        blocks = args.num_blocks if args.trace else None
        wall, cpu, result, roots = timed(requests, args.repeat, blocks)
        bare, reasons = wall[False], wall[True]
        line = {"namespaces": len({r.namespace for r in requests}), "requests": len(requests),
                "prompt_pages": prompt_pages, **({"trace": os.path.basename(args.trace)} if args.trace else {}),
                "bare_seconds": round(bare, 4), "miss_reasons_seconds": round(reasons, 4),
                "ratio": round(reasons / bare, 3), "bare_cpu_seconds": round(cpu[False], 4),
                "miss_reasons_cpu_seconds": round(cpu[True], 4), "cpu_ratio": round(cpu[True] / cpu[False], 3),
                "roots_after_evict": roots,
                "other_namespace_tokens": result.miss_tokens_by_reason["other_namespace"],
                "load_average": os.getloadavg()[0], "machine": machine()}
        print(json.dumps(line), flush=True)
        lines.append(line)
    if args.only:
        return
    with open(args.out, "a" if args.one_namespace or args.trace or args.cachegrind else "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main()

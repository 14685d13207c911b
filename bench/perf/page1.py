"""Page size 1 against page size 16, and one block pool against another, alternating in one process.

    .venv/bin/python bench/perf/page1.py [--old-rev REV] [--repeat 3] [--limit 2000] [--out bench/results/page1.jsonl]
    valgrind --tool=cachegrind --cache-sim=yes .venv/bin/python bench/perf/page1.py --pools new --pages 1 --repeat 1
    .venv/bin/python bench/perf/page1.py --pools new --pages 1 --repeat 1 --profile 25

The first ``--limit`` requests of the Mooncake conversation trace (the prompts
of bench/peers: block ``h`` expands to tokens ``h*512 .. h*512+511``), as
uint32 arrays, through ``PrefixCache(3M tokens / page, page)`` with LRU, one
``admit`` + ``release`` per request: the loop of bench/peers' radixkv driver.
Each repetition replays every (pool, page) pair in turn, rotating who goes
first, so machine load hits them alike; the CPU time (``process_time``) of
the loop is recorded per run, and the minimum is reported.

``new`` is the block pool of this checkout; ``old`` is ``radixkv/pool.py`` as
of ``--old-rev`` (read with ``git show``), put in place of it in
``radixkv.cache`` for its runs (a pool without ``give_back_parts`` gets it as
one ``give_back`` of the concatenated parts, what the cache did before).
``--skip-replay`` loads everything and replays nothing; ``--cachegrind`` runs
this script under ``valgrind --tool=cachegrind`` once per (pool, page) pair and
once with ``--skip-replay``, and records each pair's instructions and
estimated cycles (Ir + 10 x L1 misses + 100 x last-level misses) with the
skip-replay run subtracted: deterministic, unlike the CPU times of a shared
machine. ``--profile N`` prints the N costliest functions of one replay
(cProfile, own time). ``--table FILE...`` prints bench/results/page1.md from
the JSON lines of this script and of bench/peers/compare.py.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import re
import subprocess
import sys
import time
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "peers"))

import machine_facts  # noqa: E402
from _common import TRACES, MooncakeTrace  # noqa: E402

import radixkv  # noqa: E402
import radixkv.cache  # noqa: E402
import radixkv.extents  # noqa: E402
from radixkv import PrefixCache  # noqa: E402

CAPACITY_TOKENS = 187488 * 16  # 3M tokens: bench/peers' default capacity
NEW_POOL = radixkv.cache.BlockPool


def old_pool(rev: str) -> type:
    """``BlockPool`` from ``radixkv/pool.py`` at git revision ``rev``, importable as ``radixkv._pool_<rev>``."""
    source = subprocess.run(["git", "-C", REPO, "show", f"{rev}:radixkv/pool.py"], check=True,
                            capture_output=True, text=True).stdout
    name = f"radixkv._pool_{rev.replace('/', '_').replace('~', '_').replace('^', '_')}"
    module = types.ModuleType(name)
    module.__package__ = "radixkv"
    module.__file__ = f"{rev}:radixkv/pool.py"
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    pool = module.BlockPool
    extra = {}
    if not hasattr(pool, "give_back_parts"):
        def give_back_parts(self, parts):
            parts = [radixkv.extents.to_array((p,)) if p.__class__ is tuple else p for p in parts]
            if parts:
                self.give_back(parts[0] if len(parts) == 1 else np.concatenate(parts))
        extra["give_back_parts"] = give_back_parts
    if not hasattr(pool, "take_parts"):  # the engine keeps extents: an id array is one part
        def take_parts(self, n, state=module.HELD):
            blocks = self.take(n, state)
            return (blocks,) if len(blocks) else ()
        extra["take_parts"] = take_parts
    if extra:
        pool = type("BlockPool", (pool,), {"__slots__": (), **extra})
    return pool


def replay(prompts, page: int, pool: type, check: bool = True) -> dict:
    """One admit + release per prompt through a fresh cache built on ``pool``; CPU and wall time of the loop."""
    radixkv.cache.BlockPool = pool
    try:
        cache = PrefixCache(num_blocks=CAPACITY_TOKENS // page, page_size=page)
    finally:
        radixkv.cache.BlockPool = NEW_POOL
    hit = 0
    gc.collect()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for tokens in prompts:
        adm = cache.admit(tokens)
        adm.release()
        hit += adm.hit_tokens
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if check:
        cache.check()
    return {"cpu_s": cpu, "wall_s": wall, "hit_tokens": hit, "num_blocks": cache.num_blocks,
            "evicted_blocks": cache.evicted_blocks}


def cachegrind(args) -> None:
    """One valgrind run per (pool, page) pair and one without a replay; emit the counts with it subtracted."""
    base = [sys.executable, os.path.abspath(__file__), "--trace", args.trace, "--limit", str(args.limit),
            "--old-rev", args.old_rev, "--repeat", "1", "--no-check"]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")

    def counts(extra) -> dict:
        out = f"/tmp/page1-cachegrind-{os.getpid()}.out"
        subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--cachegrind-out-file={out}",
                        *base, *extra], check=True, env=env, capture_output=True)
        with open(out) as fh:
            lines = fh.read().splitlines()
        names = next(line for line in lines if line.startswith("events:")).split()[1:]
        values = next(line for line in lines if line.startswith("summary:")).split()[1:]
        c = dict(zip(names, map(int, values)))
        annotated = subprocess.run(["cg_annotate", "--show=Ir", "--threshold=0.05", out], check=True,
                                   capture_output=True, text=True).stdout
        functions = {}  # C function (numpy's loops, memcpy, the interpreter) -> instructions
        for line in annotated.splitlines():
            match = re.match(r"^\s*(-?[\d,]+) \(\s*-?[\d.]+%\)\s+(\S.*)$", line)
            if match and "PROGRAM TOTALS" not in match.group(2):
                name = match.group(2).rsplit(":", 1)[-1]
                functions[name] = functions.get(name, 0) + int(match.group(1).replace(",", ""))
        os.unlink(out)
        return {"Ir": c["Ir"], "est_cycles": c["Ir"] + 10 * (c["I1mr"] + c["D1mr"] + c["D1mw"])
                + 100 * (c["ILmr"] + c["DLmr"] + c["DLmw"]), "functions": functions}

    skip = counts(["--skip-replay", "--pools", *args.pools])
    for page in args.pages:
        for name in args.pools:
            c = counts(["--pools", name, "--pages", str(page)])
            row = {"bench": "page1-cachegrind", "pool": name, "pool_rev": "worktree" if name == "new" else args.old_rev,
                   "page_size": page, "requests": args.limit, "capacity_tokens": CAPACITY_TOKENS,
                   "Ir": c["Ir"] - skip["Ir"], "est_cycles": c["est_cycles"] - skip["est_cycles"],
                   "functions_Ir": dict(sorted(((f, v - skip["functions"].get(f, 0)) for f, v in c["functions"].items()),
                                               key=lambda fv: -abs(fv[1]))[:40]),
                   "machine": machine_facts.machine(), "tag": args.tag}
            machine_facts.emit(row, args.out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=os.path.join(TRACES, "mooncake_conversation.jsonl"))
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument("--pages", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--pools", nargs="+", choices=["old", "new"], default=["old", "new"])
    parser.add_argument("--old-rev", default="9ff1979", help="git revision of the old pool (default: before runs)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-replay", action="store_true")
    parser.add_argument("--no-check", action="store_true", help="skip cache.check() after each replay (for cachegrind)")
    parser.add_argument("--profile", type=int, default=0, help="profile one replay, print this many functions")
    parser.add_argument("--out", default=None)
    parser.add_argument("--tag", default=None)
    parser.add_argument("--cachegrind", action="store_true", help="count instructions under valgrind instead")
    parser.add_argument("--table", nargs="+", default=None, help="print the markdown page of these JSONL files")
    args = parser.parse_args()
    if args.table:
        from page1_table import render  # noqa: E402
        print(render(args.table), end="")
        return
    if args.cachegrind:
        cachegrind(args)
        return
    trace = MooncakeTrace(args.trace, args.limit)
    prompts = [p.astype(np.uint32) for p in trace]
    pools = {"new": NEW_POOL}
    if "old" in args.pools:
        pools["old"] = old_pool(args.old_rev)
    if args.skip_replay:
        return
    pairs = [(name, page) for page in args.pages for name in args.pools]
    if args.profile:
        for name, page in pairs:
            prof = cProfile.Profile()
            prof.runcall(replay, prompts, page, pools[name], not args.no_check)
            print(f"== pool {name}, page {page}")
            stats = pstats.Stats(prof).strip_dirs()
            stats.sort_stats("tottime").print_stats(args.profile)
        return
    runs = {pair: [] for pair in pairs}
    for rep in range(args.repeat):
        order = pairs[rep % len(pairs):] + pairs[: rep % len(pairs)]
        for pair in order:
            runs[pair].append(replay(prompts, pair[1], pools[pair[0]], not args.no_check))
    for (name, page), rs in runs.items():
        row = {"bench": "page1", "pool": name, "pool_rev": "worktree" if name == "new" else args.old_rev,
               "page_size": page, "requests": len(prompts), "capacity_tokens": CAPACITY_TOKENS,
               "num_blocks": rs[0]["num_blocks"], "hit_tokens": rs[0]["hit_tokens"],
               "evicted_blocks": rs[0]["evicted_blocks"],
               "cpu_s_min": round(min(r["cpu_s"] for r in rs), 4),
               "cpu_s": [round(r["cpu_s"], 4) for r in rs], "wall_s": [round(r["wall_s"], 4) for r in rs],
               "load_avg_1m": os.getloadavg()[0], "machine": machine_facts.machine(), "tag": args.tag}
        assert len({r["hit_tokens"] for r in rs}) == 1, "a replay's hits changed between repetitions"
        machine_facts.emit(row, args.out)


if __name__ == "__main__":
    main()

"""Page size 1 against page size 16, and one radixkv revision against another, alternating in one process.

    .venv/bin/python bench/perf/page1.py [--old-rev REV] [--repeat 3] [--limit 2000] [--out bench/results/page1.jsonl]
    valgrind --tool=cachegrind --cache-sim=yes .venv/bin/python bench/perf/page1.py --pools new --pages 1 --repeat 1
    .venv/bin/python bench/perf/page1.py --pools new --pages 1 --repeat 1 --profile 25

The first ``--limit`` requests of the Mooncake conversation trace (the prompts
of bench/peers: block ``h`` expands to tokens ``h*512 .. h*512+511``), as
uint32 arrays, through ``PrefixCache(3M tokens / page, page)`` with LRU, one
``admit`` + ``release`` per request: the loop of bench/peers' radixkv driver.
Each repetition replays every (version, page) pair in turn, rotating who goes
first, so machine load hits them alike; the CPU time (``process_time``) of
the loop is recorded per run, and the minimum is reported.

``new`` is radixkv of this checkout; ``old`` is the whole package (with its
policies) as of ``--old-rev`` (``git archive``), imported under another name
(the rows keep the keys ``pool`` / ``pool_rev`` of the first version of this
script, which swapped the pool module alone). ``--skip-replay`` loads
everything and replays nothing; ``--cachegrind`` runs this script under
``valgrind --tool=cachegrind`` once per (version, page) pair and once per
version with ``--skip-replay``, and records each pair's instructions and
estimated cycles (Ir + 10 x L1 misses + 100 x last-level misses) with that
skip-replay run subtracted: deterministic, unlike the CPU times of a shared
machine. ``--profile N`` prints the N costliest functions of one replay
(cProfile, own time). ``--table FILE...`` prints bench/results/page1.md from
the JSON lines of this script and of bench/peers/compare.py.
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import gc
import glob
import importlib
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "peers"))

import machine_facts  # noqa: E402
from cachegrind import count as cachegrind_count, minus as cachegrind_minus  # noqa: E402
from _common import TRACES, MooncakeTrace  # noqa: E402
from drive_sglang import as_array_q  # noqa: E402

from radixkv import PrefixCache  # noqa: E402

CAPACITY_TOKENS = 187488 * 16  # 3M tokens: bench/peers' default capacity
OLD_REV = "bfe6853"  # extents, before the lazy id table and take_after (4f3b99b: nodes holding one id array each)


def old_package(rev: str) -> type:
    """``PrefixCache`` of radixkv as of git revision ``rev`` (its ``policies/`` inside it), imported
    as the package ``radixkv_<rev>`` from a temporary directory, so both versions run in one process."""
    name = "radixkv_" + re.sub(r"\W", "_", rev)
    dest = tempfile.mkdtemp(prefix="page1-old-")
    archive = subprocess.run(["git", "-C", REPO, "archive", rev, "radixkv", "policies"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    os.rename(os.path.join(dest, "radixkv"), os.path.join(dest, name))
    os.rename(os.path.join(dest, "policies"), os.path.join(dest, name, "policies"))
    for path in glob.glob(os.path.join(dest, name, "**", "*.py"), recursive=True):
        with open(path) as fh:
            text = fh.read()
        with open(path, "w") as fh:  # absolute imports of radixkv (the policies') name the old package
            fh.write(re.sub(r"^(\s*(?:from|import)\s+)radixkv\b", r"\g<1>" + name, text, flags=re.M))
    atexit.register(shutil.rmtree, dest, True)
    sys.path.insert(0, dest)
    return importlib.import_module(name).PrefixCache


def replay(prompts, page: int, cache_class: type, check: bool = True) -> dict:
    """One admit + release per prompt through a fresh ``cache_class``; CPU and wall time of the loop."""
    cache = cache_class(num_blocks=CAPACITY_TOKENS // page, page_size=page)
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
    base = [sys.executable, os.path.abspath(__file__), "--trace", args.trace, "--limit", str(args.limit), "--tokens", args.tokens,
            "--old-rev", args.old_rev, "--repeat", "1", "--no-check"]

    def counts(extra) -> dict:
        return cachegrind_count([*base, *extra])

    skips = {name: counts(["--skip-replay", "--pools", name]) for name in args.pools}
    for page in args.pages:
        for name in args.pools:
            skip = skips[name]
            c = cachegrind_minus(counts(["--pools", name, "--pages", str(page)]), skip)
            row = {"bench": "page1-cachegrind", "pool": name, "pool_rev": "worktree" if name == "new" else args.old_rev,
                   "page_size": page, "tokens": args.tokens, "requests": args.limit, "capacity_tokens": CAPACITY_TOKENS,
                   "Ir": c["Ir"], "est_cycles": c["est_cycles"],
                   "functions_Ir": dict(sorted(c["functions"].items(), key=lambda fv: -abs(fv[1]))[:40]),
                   "machine": machine_facts.machine(), "tag": args.tag}
            machine_facts.emit(row, args.out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=os.path.join(TRACES, "mooncake_conversation.jsonl"))
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument("--tokens", choices=["uint32", "array_q"], default="uint32",
                        help="the prompts' form: uint32 arrays, or array('q') as SGLang's Req holds them "
                             "(made before the loop; admit's conversion is timed)")
    parser.add_argument("--pages", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--pools", nargs="+", choices=["old", "new"], default=["old", "new"])
    parser.add_argument("--old-rev", default=OLD_REV, help="git revision of the old radixkv (default: before extents)")
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
    if args.tokens == "array_q":
        prompts = [as_array_q(p) for p in prompts]
    pools = {"new": PrefixCache}
    if "old" in args.pools:
        pools["old"] = old_package(args.old_rev)
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
               "page_size": page, "tokens": args.tokens, "requests": len(prompts), "capacity_tokens": CAPACITY_TOKENS,
               "num_blocks": rs[0]["num_blocks"], "hit_tokens": rs[0]["hit_tokens"],
               "evicted_blocks": rs[0]["evicted_blocks"],
               "cpu_s_min": round(min(r["cpu_s"] for r in rs), 4),
               "cpu_s": [round(r["cpu_s"], 4) for r in rs], "wall_s": [round(r["wall_s"], 4) for r in rs],
               "load_avg_1m": os.getloadavg()[0], "machine": machine_facts.machine(), "tag": args.tag}
        assert len({r["hit_tokens"] for r in rs}) == 1, "a replay's hits changed between repetitions"
        machine_facts.emit(row, args.out)


if __name__ == "__main__":
    main()

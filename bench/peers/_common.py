"""Shared plumbing for the peer drivers: trace loading, the timing loop's statistics,
machine facts, the command line and the JSON line.

Nothing here imports SGLang or vLLM, so a comparison script can load traces once
and hand the same request stream to several replay functions.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
import tracemalloc
from typing import Iterable, Iterator, Sequence

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512
# shared/ sits beside the repository checkout; TRACES overrides
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACES = os.environ.get("TRACES") or os.path.join(os.path.dirname(_REPO), "shared", "traces")


# ---------------------------------------------------------------- traces


class MooncakeTrace:
    """A Mooncake JSONL trace held compactly as (hash_ids, input_length) pairs.

    Iterating yields each prompt's token ids as a 1-D ``int64`` numpy array:
    block ``h`` expands to ``h*512 .. h*512+511`` and the prompt is cut at
    ``input_length`` (the same expansion radixkv's ``TraceReader`` uses). Prompts
    are expanded one at a time, so a full trace never sits in memory as tokens.
    """

    def __init__(self, path: str, limit: int | None = None):
        self.path = path
        self.name = os.path.basename(path)
        self.records: list[tuple[np.ndarray, int]] = []
        with open(path) as fh:
            for line in fh:
                if limit is not None and len(self.records) >= limit:
                    break
                line = line.strip()
                if not line:
                    continue
                obj = json.loads(line)
                self.records.append((np.asarray(obj["hash_ids"], dtype=np.int64), int(obj["input_length"])))
        self._offsets = np.arange(MOONCAKE_BLOCK_TOKENS, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.records)

    def expand(self, i: int) -> np.ndarray:
        ids, n = self.records[i]
        return ((ids * MOONCAKE_BLOCK_TOKENS)[:, None] + self._offsets).ravel()[:n]

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self.records)):
            yield self.expand(i)


def as_tokens(item) -> Sequence[int]:
    """Accept a token array/list, or a record with a ``tokens`` attribute (radixkv's Request)."""
    tokens = getattr(item, "tokens", item)
    return tokens


# ---------------------------------------------------------------- measurement


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> dict:
    """radixkv's bench machine facts (bench/machine_facts.py) plus the torch build and threads."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from machine_facts import machine as bench_machine

    out = {**bench_machine(), "torch": _version("torch")}
    if "torch" in sys.modules:
        out["torch_threads"] = sys.modules["torch"].get_num_threads()
    return out


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:
        return None


class Tally:
    """Per-request counters and timings, in the units radixkv's perf_trace.py reports."""

    def __init__(self, n_hint: int = 0):
        self.ns: list[int] = []
        self.requests = 0
        self.prompt_tokens = 0
        self.hit_tokens = 0
        self.inserted_pages = 0
        self.short_pages = 0  # full pages that found no block even after eviction (not cached)
        self.wall = 0.0

    def summary(self) -> dict:
        us = np.asarray(self.ns, dtype=np.float64) / 1000.0
        total_s = float(us.sum()) / 1e6
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": (self.hit_tokens / self.prompt_tokens) if self.prompt_tokens else 0.0,
            "inserted_pages": self.inserted_pages,
            "uncached_pages": self.short_pages,
            "wall_seconds": round(self.wall, 3),
            "cache_seconds": round(total_s, 3),
            # requests/s over the time spent inside the cache calls (what radixkv's
            # perf_trace.py times); wall-clock rate including the per-request
            # input preparation outside the timed region is given beside it.
            "requests_per_second": round(self.requests / total_s, 1) if total_s else None,
            "requests_per_second_wall": round(self.requests / self.wall, 1) if self.wall else None,
            "per_request_us": {
                "p50": round(float(np.percentile(us, 50)), 1) if len(us) else None,
                "p99": round(float(np.percentile(us, 99)), 1) if len(us) else None,
                "max": round(float(us.max()), 1) if len(us) else None,
                "mean": round(float(us.mean()), 1) if len(us) else None,
            },
        }


class HeapProbe:
    """tracemalloc Python-heap bytes attributed to one package's source files.

    ``start()`` after the cache object exists (its fixed per-block arrays are
    excluded, like radixkv's bench/perf/memory.py excludes its pool arrays);
    ``stop()`` at the end of the replay. Only the innermost frame is recorded, so
    an object is charged to the package whose code allocated it. Memory that
    torch allocates for tensor storage is not on the Python heap and is not
    seen here (drivers report it separately when they know it).
    """

    def __init__(self, package_dirs: Iterable[str]):
        self.dirs = [d.rstrip(os.sep) + os.sep + "*" for d in package_dirs]
        self.before = 0

    def _traced(self) -> int:
        snap = tracemalloc.take_snapshot()
        filters = [tracemalloc.Filter(True, d) for d in self.dirs]
        return sum(s.size for s in snap.filter_traces(filters).statistics("filename"))

    def start(self) -> None:
        gc.collect()
        tracemalloc.start(1)
        self.before = self._traced()

    def stop(self) -> int:
        gc.collect()
        after = self._traced()
        tracemalloc.stop()
        return after - self.before


# ---------------------------------------------------------------- CLI


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--trace", default=f"{TRACES}/mooncake_conversation.jsonl",
                   help="Mooncake JSONL trace (default: the conversation trace)")
    p.add_argument("--page-size", type=int, default=16, help="tokens per page/block (default 16)")
    p.add_argument("--num-blocks", type=int, default=187488,
                   help="HBM capacity in pages, usable by the cache (default 187488 = 3M tokens at 16)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--repeat", type=int, default=1,
                   help="replay R times, each with a fresh cache; the fastest run is reported, all rates are listed")
    p.add_argument("--engine-cap", action="store_true",
                   help="cap a match at prompt_len - 1 tokens as both engines' schedulers do "
                        "(default: match up to the whole prompt, as radixkv's replay does)")
    p.add_argument("--tracemalloc", action="store_true",
                   help="also measure Python-heap bytes per cached page (slow; timings of that run are not comparable)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads (default 1: the caches are single-threaded scheduler code; "
                        "0 leaves torch's default)")
    p.add_argument("--out", default=None, help="append the JSON line to this file")
    p.add_argument("--tag", default=None, help="free-form label stored in the JSON line")
    return p


def run_cli(peer: str, replay, versions: dict, description: str, argv=None) -> dict:
    args = parser(description).parse_args(argv)
    trace = MooncakeTrace(args.trace, limit=args.limit)
    runs = []
    load_before = os.getloadavg()
    for r in range(max(1, args.repeat)):
        res = replay(iter(trace), args.page_size, args.num_blocks, engine_cap=args.engine_cap,
                     measure_heap=args.tracemalloc and r == 0, torch_threads=args.torch_threads or None)
        runs.append(res)
        print(f"# {peer} run {r + 1}/{args.repeat}: {res['requests_per_second']} req/s, "
              f"p50 {res['per_request_us']['p50']} us, hit {res['hit_tokens']}", file=sys.stderr, flush=True)
    timed = [x for x in runs if not x.get("tracemalloc")] or runs
    # best run by requests/s: the machine may be shared, and other load only ever slows a run down
    row = dict(max(timed, key=lambda x: x["requests_per_second"] or 0))
    row.update({
        "peer": peer,
        "trace": trace.name,
        "limit": args.limit,
        "repeat": args.repeat,
        "requests_per_second_all": [x["requests_per_second"] for x in runs],
        "versions": versions,
        "machine": machine(),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        # 1-minute load average before and after: a value above nproc means other work shared the cores
        "loadavg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    })
    heap = [x for x in runs if x.get("tracemalloc")]
    if heap:
        for k in ("heap_bytes", "heap_bytes_per_cached_page", "tensor_bytes_per_cached_page"):
            if k in heap[0]:
                row[k] = heap[0][k]
    emit_row(row, args)
    return row


def emit_row(row: dict, args) -> None:
    """Tag ``row`` with ``args.tag``, print it as one JSON line and append it to ``args.out`` if given."""
    if args.tag:
        row["tag"] = args.tag
    line = json.dumps(row)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(line + "\n")


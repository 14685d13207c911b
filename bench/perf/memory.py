"""Python-heap bytes per cached page (tracemalloc), keys and tree included, payloads excluded.

    python bench/perf/memory.py [--pages 1000000] [--page-size 16]

Two tree shapes at the same page count:

* ``chat``: multi-turn sessions that extend their own history (long shared
  chains; the shape of the Mooncake traces);
* ``fanout``: every request shares a short system prompt, then diverges after
  a few pages (many short leaves: the worst realistic shape);
* ``trace``: the Mooncake conversation trace replayed at ``--trace-blocks``
  (187,488 = 3M tokens), measured at the end of the replay: the figure
  directly comparable with ``bench/peers`` (SGLang and vLLM on the same replay).

Only allocations made by radixkv's own code are counted (the workload's token
arrays are not); the block pool's fixed arrays are allocated before the
baseline and excluded too, as the payload would be.
"""

from __future__ import annotations

import argparse
import os
import sys
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from machine_facts import emit  # noqa: E402
from radixkv import PrefixCache

TRACE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                     "shared", "traces", "mooncake_conversation.jsonl")
ROOTS = [os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), d) for d in ("radixkv", "policies")]


def _traced(snapshot: tracemalloc.Snapshot) -> int:
    filters = [tracemalloc.Filter(True, root + os.sep + "*") for root in ROOTS]
    return sum(stat.size for stat in snapshot.filter_traces(filters).statistics("filename"))


def measure(shape: str, pages: int, page_size: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    tracemalloc.start(1)
    cache = PrefixCache(pages, page_size)
    before = _traced(tracemalloc.take_snapshot())
    target = pages - pages // 1000
    if shape == "chat":
        sessions = [rng.integers(0, 50_000, size=page_size * 8, dtype=np.uint32) for _ in range(4000)]
        while cache.num_cached_blocks < target:
            i = int(rng.integers(len(sessions)))
            turn = rng.integers(0, 50_000, size=page_size * int(rng.integers(4, 40)), dtype=np.uint32)
            sessions[i] = np.concatenate([sessions[i], turn])
            cache.admit(sessions[i]).release()
    elif shape == "fanout":
        system = rng.integers(0, 50_000, size=page_size * 4, dtype=np.uint32)
        while cache.num_cached_blocks < target:
            tail = rng.integers(0, 50_000, size=page_size * int(rng.integers(1, 8)), dtype=np.uint32)
            cache.admit(np.concatenate([system, tail])).release()
    elif shape == "trace":
        tracemalloc.stop()
        from radixkv.workload.traces import TraceReader
        requests = [r.tokens for r in TraceReader(TRACE)]   # read before tracing: not the cache's memory
        tracemalloc.start(1)
        cache = PrefixCache(pages, page_size)
        before = _traced(tracemalloc.take_snapshot())
        for tokens in requests:
            cache.admit(tokens).release()
    else:
        raise ValueError(f"shape must be 'chat', 'fanout' or 'trace', got {shape!r}")
    after = _traced(tracemalloc.take_snapshot())
    tracemalloc.stop()
    nodes = sum(1 for _ in cache.nodes())
    return {"shape": shape, "page_size": page_size, "pages": cache.num_cached_blocks, "nodes": nodes,
            "pages_per_node": round(cache.num_cached_blocks / nodes, 2),
            "bytes_per_page": round((after - before) / cache.num_cached_blocks, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=1_000_000)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--trace-blocks", type=int, default=187_488)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    for shape in ("chat", "fanout", "trace"):
        pages = args.trace_blocks if shape == "trace" else args.pages
        emit(measure(shape, pages, args.page_size), args.out)


if __name__ == "__main__":
    main()

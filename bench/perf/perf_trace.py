"""Full-trace replay speed: wall time, peak RSS, prompt tokens/s, per-request overhead percentiles.

    python bench/perf/perf_trace.py ../shared/traces/mooncake_conversation.jsonl --num-blocks 187488

The trace is read and expanded to tokens before timing starts, so the figures are
the cache's own cost per request (admit + release, as a scheduler would call it).
Prints one JSON line; ``--out FILE`` appends it to a JSONL file.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np

from radixkv import PrefixCache
from radixkv.workload.traces import TraceReader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from machine_facts import emit, machine  # noqa: E402


def run(trace: str, num_blocks: int, page_size: int, policy: str, limit: int | None) -> dict:
    requests = [r.tokens for r in TraceReader(trace, limit=limit)]
    cache = PrefixCache(num_blocks=num_blocks, page_size=page_size, policy=policy)
    if hasattr(cache.policy, "prepare"):
        from radixkv.workload.traces import Request
        cache.policy.prepare([Request(t) for t in requests], page_size)
    per_request = np.empty(len(requests), dtype=np.int64)
    hit = 0
    clock = time.perf_counter_ns
    start = time.perf_counter()
    for i, tokens in enumerate(requests):
        t0 = clock()
        adm = cache.admit(tokens)
        adm.release()
        per_request[i] = clock() - t0
        hit += adm.hit_tokens
    wall = time.perf_counter() - start
    prompt = int(sum(len(t) for t in requests))
    us = per_request / 1000.0
    return {
        "trace": trace.rsplit("/", 1)[-1], "policy": policy, "page_size": page_size, "num_blocks": num_blocks,
        "requests": len(requests), "prompt_tokens": prompt, "hit_tokens": int(hit),
        "token_hit_rate": hit / prompt, "wall_seconds": round(wall, 3),
        "requests_per_second": round(len(requests) / wall, 1),
        "prompt_tokens_per_second": round(prompt / wall),
        "per_request_us": {"p50": round(float(np.percentile(us, 50)), 1),
                           "p99": round(float(np.percentile(us, 99)), 1),
                           "max": round(float(us.max()), 1)},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--num-blocks", type=int, default=187488)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--policy", default="lru")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    emit(run(args.trace, args.num_blocks, args.page_size, args.policy, args.limit), args.out)


if __name__ == "__main__":
    main()

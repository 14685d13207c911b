"""Cost of KV events on the Mooncake conversation trace (page 16, 187,488 blocks); one JSON line per run.

    .venv/bin/python bench/perf/events.py [--limit N] > bench/results/events.jsonl

Replays the trace with events off and on (vLLM's default sha256 page hashes; a consumer
takes the events after every request) and reports CPU seconds, pages stored and
removed, and the extra CPU time per stored page.
"""

from __future__ import annotations

import argparse
import json
import time

from radixkv.cache import PrefixCache
from radixkv.events import BlockRemoved, BlockStored
from radixkv.analysis.replay import replay
from radixkv.workload.traces import TraceReader

TRACE = "../shared/traces/mooncake_conversation.jsonl"


def run(requests, events: bool) -> dict:
    cache = PrefixCache(187_488, page_size=16, enable_events=events)
    counts = {"stored_pages": 0, "removed_pages": 0}

    def take(*_):
        for event in cache.take_events():
            if isinstance(event, BlockStored):
                counts["stored_pages"] += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                counts["removed_pages"] += len(event.block_hashes)

    start = time.process_time()
    result = replay(requests, cache, on_request=take)
    return {"events": events, "cpu_seconds": round(time.process_time() - start, 2),
            "requests": len(requests), "token_hit_rate": result.as_dict()["token_hit_rate"], **counts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args()
    requests = list(TraceReader(TRACE, limit=args.limit))
    off, on = run(requests, False), run(requests, True)
    on["extra_us_per_stored_page"] = round((on["cpu_seconds"] - off["cpu_seconds"]) / max(on["stored_pages"], 1) * 1e6, 2)
    for row in (off, on):
        print(json.dumps(row))


if __name__ == "__main__":
    main()

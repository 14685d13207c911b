"""radixkv vs SGLang's caches (RadixCache, UnifiedRadixCache) vs vLLM's BlockPool, alternating in one process.

    bash bench/peers/setup.sh                  # once: the peers' venv
    bench/peers/.venv/bin/python bench/peers/compare.py [--repeat 3] [--limit N] [--out results/compare.jsonl]

For each trace (both Mooncake traces) and capacity (187488 and 31248 pages of
16 tokens: 3M and 0.5M tokens), each repetition replays the peers in turn
(rotating who goes first) over the same pre-expanded prompts, so machine noise
hits all alike. Peers: ``radixkv``, ``sglang`` (the Python ``RadixCache``),
``sglang-unified`` (SGLang's default cache, ``UnifiedRadixCache`` on its Rust
tree core) and ``vllm``; ``--peers`` picks some, or adds ``radixkv-q``: radixkv
given ``array('q')`` as SGLang is (its conversion inside ``admit`` timed). The rate is taken over the time
spent in the cache calls; the fastest repetition of each is reported, with
every rate listed, and radixkv's ratio to each peer both for the fastest and
for the median repetitions. radixkv runs from this checkout (setup.sh installs
it editable).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common  # noqa: E402
from drive_radixkv import replay_radixkv  # noqa: E402
from drive_sglang import as_array_q, replay_sglang  # noqa: E402
from drive_sglang_unified import replay_sglang_unified  # noqa: E402
from drive_vllm import replay_vllm  # noqa: E402


def replay_radixkv_q(prompts, page_size: int, num_blocks: int) -> dict:
    """radixkv fed the form SGLang's ``Req`` holds, ``array('q')`` (made outside the timed region,
    as for SGLang's drivers): admit's conversion to its uint32 key is timed."""
    return replay_radixkv((as_array_q(p) for p in prompts), page_size, num_blocks)


PEERS = {"radixkv": replay_radixkv, "radixkv-q": replay_radixkv_q, "sglang": replay_sglang,
         "sglang-unified": replay_sglang_unified, "vllm": replay_vllm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", default=["mooncake_conversation", "mooncake_synthetic"])
    parser.add_argument("--capacities", nargs="+", type=int, default=[187488, 31248])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--peers", nargs="+", default=[p for p in PEERS if p != "radixkv-q"], choices=list(PEERS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--tag", default=None, help="free-form label stored in the JSON line")
    args = parser.parse_args()
    for trace_name in args.traces:
        trace = _common.MooncakeTrace(os.path.join(_common.TRACES, trace_name + ".jsonl"), args.limit)
        # radixkv takes uint32 tokens; the peers get the same ids in their own formats.
        prompts = [p.astype(np.uint32) for p in trace]
        for capacity in args.capacities:
            runs = {peer: [] for peer in args.peers}
            load_start = os.getloadavg()[0]
            for rep in range(args.repeat):
                order = args.peers[rep % len(args.peers):] + args.peers[: rep % len(args.peers)]
                for peer in order:
                    gc.collect()
                    runs[peer].append(PEERS[peer](prompts, args.page_size, capacity))
            best = {peer: max(rs, key=lambda r: r["requests_per_second"]) for peer, rs in runs.items()}
            row = {
                "trace": trace_name, "num_blocks": capacity, "page_size": args.page_size,
                "requests": best[args.peers[0]]["requests"], "repeat": args.repeat,
                "load_avg_1m_start": load_start, "load_avg_1m": os.getloadavg()[0], "machine": _common.machine(),
                "peers": {peer: {"requests_per_second": b["requests_per_second"],
                                 "all_rates": [r["requests_per_second"] for r in runs[peer]],
                                 "per_request_us": b["per_request_us"],
                                 "hit_tokens": b["hit_tokens"],
                                 "token_hit_rate": round(b["token_hit_rate"], 5),
                                 **({"tree_core": b["tree_core"]} if "tree_core" in b else {})}
                          for peer, b in best.items()},
            }
            if "radixkv" in best:
                base = best["radixkv"]["requests_per_second"]
                row["speedup"] = {peer: round(base / b["requests_per_second"], 2)
                                  for peer, b in best.items() if peer != "radixkv"}
                base_median = np.median([r["requests_per_second"] for r in runs["radixkv"]])
                row["speedup_median"] = {
                    peer: round(base_median / np.median([r["requests_per_second"] for r in rs]), 2)
                    for peer, rs in runs.items() if peer != "radixkv"}
            _common.emit_row(row, args)


if __name__ == "__main__":
    main()

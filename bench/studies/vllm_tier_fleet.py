"""Four vLLM engines under round robin, sharing pages through RadixKVTier, against one pooled vLLM.

    bench/peers/.venv/bin/python bench/studies/vllm_tier_fleet.py [TRACE] [--requests N] [--out FILE.jsonl]

Needs vLLM 0.33.0 (``bash bench/peers/setup.sh``). Every engine is vLLM's real ``AsyncScheduler`` with
its prefix cache, driven by ``tests/vllm/harness.py`` (a numpy stand-in for the GPU worker: it loads,
"computes" and stores rows; no model runs). The trace's requests are served in trace order, one at a
time, each to completion (and the tier's stores finished) before the next, so every request sees every
page stored before it:

* ``pooled``: one engine whose prefix cache has the fleet's whole HBM (``--instances x --gpu-blocks``)
  and no connector;
* ``fleet``: ``--instances`` engines of ``--gpu-blocks`` each, round robin, each with vLLM's
  ``OffloadingConnector`` + ``TieringOffloadingSpec`` (a CPU primary tier of ``--cpu-rows`` rows) and a
  ``RadixKVTier`` over one in-process store of ``--store-pages`` pages (LRU), the fleet's shared store;
* ``alone``: the same engines without the tier (round robin, each engine its own prefix cache).

The token hit rate is the share of prompt tokens not computed (vLLM computes at least one token of
every prompt, in every configuration). Prints one JSON line per configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", ".."))

from machine_facts import machine  # noqa: E402

from radixkv.store import drop_memory  # noqa: E402
from radixkv.workload.sources import open_trace  # noqa: E402
from tests.vllm.harness import BLOCK_SIZE, Engine, make_request, tier_config, wait_io  # noqa: E402


def serve(engines, prompts, label: str) -> dict:
    start = time.perf_counter()
    prompt_tokens = 0
    for i, tokens in enumerate(prompts):
        engines[i % len(engines)].serve([make_request(tokens)], settle=wait_io)
        prompt_tokens += len(tokens)
        if (i + 1) % 250 == 0:
            computed = sum(e.computed_tokens for e in engines)
            print(f"# {label}: {i + 1} requests, hit rate {1 - computed / prompt_tokens:.4f}, "
                  f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    computed = sum(e.computed_tokens for e in engines)
    row = dict(config=label, requests=len(prompts), prompt_tokens=prompt_tokens, computed_tokens=computed,
               hit_rate=round(1 - computed / prompt_tokens, 5), wall_s=round(time.perf_counter() - start, 1),
               wrong_loads=sum(e.wrong_loads for e in engines), loaded_blocks=sum(e.loaded_blocks for e in engines))
    if engines[0].tier is not None:
        stats = [e.tier.stats() for e in engines]
        row.update(store_hits=sum(s["hits"] for s in stats), loaded_pages=sum(s["loaded_pages"] for s in stats),
                   load_failed_pages=sum(s["load_failed_pages"] for s in stats),
                   stored_pages=sum(s["stored_pages"] for s in stats))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default=os.path.join(HERE, "..", "..", "..", "shared", "traces",
                                                             "mooncake_conversation.jsonl"))
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--gpu-blocks", type=int, default=62500)
    ap.add_argument("--store-pages", type=int, default=250000)
    ap.add_argument("--cpu-rows", type=int, default=16384)
    ap.add_argument("--configs", default="pooled,fleet,alone")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    prompts = [r.tokens.tolist() for r in open_trace(args.trace, limit=args.requests)]
    max_len = max(len(p) for p in prompts) + BLOCK_SIZE
    facts = dict(machine(), load=" ".join(f"{x:.2f}" for x in os.getloadavg()))
    for config in args.configs.split(","):
        if config == "pooled":
            engines = [Engine("pooled", None, num_gpu_blocks=args.instances * args.gpu_blocks, max_model_len=max_len)]
        else:
            url = f"memory://vllm-fleet?capacity={args.store_pages}"
            extra = None
            if config == "fleet":
                extra = tier_config(url, "llama-3-8b")
                extra["cpu_bytes_to_use"] = args.cpu_rows * 4096
            engines = [Engine(f"{config}-{i}", extra, num_gpu_blocks=args.gpu_blocks, max_model_len=max_len)
                       for i in range(args.instances)]
        try:
            row = serve(engines, prompts, config)
        finally:
            for e in engines:
                e.shutdown()
            drop_memory("vllm-fleet")
        row.update(instances=len(engines), gpu_blocks=engines[0].gpu.shape[0], store_pages=args.store_pages,
                   machine=facts)
        line = json.dumps(row)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(line + "\n")


if __name__ == "__main__":
    main()

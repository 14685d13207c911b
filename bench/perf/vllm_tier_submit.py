"""What RadixKVTier costs vLLM's scheduler thread: submit_store / submit_load of 128-page jobs, p50 / p99 / max.

    bench/peers/.venv/bin/python bench/perf/vllm_tier_submit.py --out bench/results/vllm_tier_submit

Needs vLLM 0.33.0 (``bash bench/peers/setup.sh`` builds the venv). The tier is built as vLLM builds it:
``SecondaryTierFactory.create_secondary_tier`` with the issue's config entry (``type`` + ``module_path``),
over a primary tier of ``--rows`` rows of ``--row-bytes`` bytes. The loop plays a scheduler: every
``--step-ms`` it submits one store job of 128 fresh pages and one load job of 128 pages a finished store
job wrote (the memory store's LRU bound may have dropped some: those loads fail, as they must),
polls ``get_finished_jobs`` and looks up a few keys, timing each ``submit_*`` call alone with
``perf_counter_ns``. The pool's threads run the real jobs meanwhile (SHA-256 digests, row copies, the
store's round trips), so the figures include what they cost the scheduler thread (the GIL). Backends:
memory:// (LRU-bounded) and a local redis-server on loopback started here. Writes ``OUT.jsonl`` and
``OUT.md``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from types import SimpleNamespace
from typing import Dict, List

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from machine_facts import emit, machine  # noqa: E402

from radixkv.store import drop_memory  # noqa: E402
from radixkv.testing.localredis import LocalRedis  # noqa: E402

PAGES = 128


def noop(job: object) -> None:
    """Timed beside each submit: what the same call costs when it does nothing (the GIL and the OS's share)."""


def percentiles(ns: List[int]) -> Dict[str, float]:
    a = np.asarray(ns, dtype=np.float64) / 1e3
    return {"p50_us": round(float(np.percentile(a, 50)), 1), "p99_us": round(float(np.percentile(a, 99)), 1),
            "max_us": round(float(a.max()), 1), "calls": len(ns)}


def run(url: str, jobs: int, rows: int, row_bytes: int, step_ms: float, io_threads: int) -> dict:
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    primary = np.zeros((rows, row_bytes), dtype=np.uint8)
    primary[:] = np.random.default_rng(0).integers(0, 256, size=(rows, 1), dtype=np.uint8)
    spec = SimpleNamespace(config=None, tokens_per_block=(16,), blocks_per_chunk=1,
                           kv_events_config=SimpleNamespace(enable_kv_cache_events=False))
    entry = {"type": "RadixKVTier", "module_path": "radixkv.adapters.vllm", "store": url, "namespace": "bench",
             "io_threads": io_threads}
    tier = SecondaryTierFactory.create_secondary_tier(entry, memoryview(primary), spec)
    gc.collect()
    gc.freeze()  # as vLLM's EngineCore does once it is built (freeze_gc_heap): the startup heap is never rescanned
    ctx = ReqContext(req_id="bench")
    store_ns: List[int] = []
    load_ns: List[int] = []
    store_cpu: List[int] = []
    load_cpu: List[int] = []
    noop_ns: List[int] = []
    stored: List[List[bytes]] = []
    pending: Dict[int, List[bytes]] = {}
    job_id = 0
    finished = failed = 0
    chunks = np.arange(PAGES, dtype=np.int32)
    try:
        for i in range(jobs):
            step_end = time.perf_counter() + step_ms / 1e3
            keys = [make_offload_key(i.to_bytes(8, "big") + p.to_bytes(8, "big") + bytes(16), 0) for p in range(PAGES)]
            job = TransferJob(job_id, keys, (chunks + (i % 2) * PAGES) % rows, False, ctx)
            job_id += 1
            c, t = time.thread_time_ns(), time.perf_counter_ns()
            tier.submit_store(job)
            store_ns.append(time.perf_counter_ns() - t)
            store_cpu.append(time.thread_time_ns() - c)
            t = time.perf_counter_ns()
            noop(job)
            noop_ns.append(time.perf_counter_ns() - t)
            pending[job.job_id] = keys
            if stored:  # load pages a finished store job wrote (a real load follows a HIT)
                old = stored[-1 - i % len(stored)]
                job = TransferJob(job_id, old, (chunks + ((i + 1) % 2) * PAGES) % rows, True, ctx)
                job_id += 1
                c, t = time.thread_time_ns(), time.perf_counter_ns()
                tier.submit_load(job)
                load_ns.append(time.perf_counter_ns() - t)
                load_cpu.append(time.thread_time_ns() - c)
            for result in tier.get_finished_jobs():
                finished += 1
                failed += not result.success
                if result.job_id in pending and result.success:
                    stored.append(pending.pop(result.job_id))
            for key in keys[:4]:
                tier.lookup(key, ctx)
            tier.on_schedule_end(SimpleNamespace(new_req_ids=(), preempted_req_ids=()))
            pause = step_end - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        tier.drain_jobs()
        for result in tier.get_finished_jobs():
            finished += 1
            failed += not result.success
    finally:
        tier.shutdown()
        gc.unfreeze()
    return {"store": percentiles(store_ns), "load": percentiles(load_ns), "store_cpu": percentiles(store_cpu),
            "load_cpu": percentiles(load_cpu), "noop": percentiles(noop_ns), "jobs_finished": finished,
            "jobs_failed": failed, "stats": {k: v for k, v in tier.stats().items() if k != "store"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=600)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--row-bytes", type=int, default=65536)
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--io-threads", type=int, default=2, help="the tier's io_threads (its default: 2)")
    ap.add_argument("--out", default=None, help="write OUT.jsonl and OUT.md")
    args = ap.parse_args()
    facts = dict(machine(), load=" ".join(f"{x:.2f}" for x in os.getloadavg()))
    rows_out = []
    if args.out:
        open(args.out + ".jsonl", "w").close()
    capacity = 4 * PAGES * 8
    with LocalRedis() as server:
        for name, url in (("memory", f"memory://vllm-bench?capacity={capacity}"),
                          ("redis", f"redis://127.0.0.1:{server.port}")):
            result = run(url, args.jobs, args.rows, args.row_bytes, args.step_ms, args.io_threads)
            drop_memory("vllm-bench")
            row = dict(backend=name, pages_per_job=PAGES, row_bytes=args.row_bytes, step_ms=args.step_ms,
                       io_threads=args.io_threads,
                       jobs=args.jobs, **result, machine=facts)
            emit(row, args.out + ".jsonl" if args.out else None)
            rows_out.append(row)
    if args.out:
        with open(args.out + ".md", "w") as fh:
            fh.write(f"RadixKVTier on vLLM's scheduler thread: time of one `submit_store` / `submit_load` call with "
                     f"{PAGES}-page jobs of {args.row_bytes:,}-byte rows, one of each every {args.step_ms:g} ms, "
                     f"{args.io_threads} I/O threads, "
                     f"while the pool runs the earlier jobs (`bench/perf/vllm_tier_submit.py`). Machine: "
                     f"{facts.get('cpu', '?')}, {facts.get('nproc', '?')} CPUs (shared), load average "
                     f"{facts['load']}.\n\n")
            fh.write("Wall: `perf_counter` around the call (what the scheduler waits); CPU: the scheduler thread's "
                     "`thread_time` in the call (its own work, without waits for the GIL or a CPU); no-op: the wall "
                     "time of an empty function call timed the same way right after each `submit_store`.\n\n")
            fh.write("| backend | call | calls | wall p50 us | wall p99 us | wall max us | CPU p50 us | CPU p99 us | "
                     "jobs finished | jobs failed |\n")
            fh.write("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
            for row in rows_out:
                for call in ("store", "load"):
                    p, c = row[call], row[call + "_cpu"]
                    fh.write(f"| {row['backend']} | submit_{call} | {p['calls']} | {p['p50_us']} | {p['p99_us']} | "
                             f"{p['max_us']} | {c['p50_us']} | {c['p99_us']} | {row['jobs_finished']} | "
                             f"{row['jobs_failed']} |\n")
                n = row["noop"]
                fh.write(f"| {row['backend']} | no-op | {n['calls']} | {n['p50_us']} | {n['p99_us']} | {n['max_us']} "
                         f"| | | | |\n")


if __name__ == "__main__":
    main()

"""Replay a Mooncake trace through vLLM v1's prefix-caching path: ``BlockPool`` + block hashing.

    bench/peers/.venv/bin/python bench/peers/drive_vllm.py --trace T --num-blocks 187488 [--limit N]

Per request, in trace order, as vLLM's ``KVCacheManager`` does for a new request
that completes at once (get_computed_blocks -> allocate_slots -> free):

1. hash the prompt's full blocks (``get_request_block_hasher`` with the engine's
   default ``sha256`` hash, chained from ``NONE_HASH``) -- this is what
   ``Request.__init__`` does with the engine's block hasher;
2. ``FullAttentionManager.find_longest_cache_hit`` over the hashes (the lookup
   ``KVCacheCoordinator`` runs for a single full-attention group);
3. ``BlockPool.touch`` the hit blocks (ref_cnt 0 -> 1 takes them off the free
   queue, so they cannot be evicted);
4. ``BlockPool.get_new_blocks`` for the remaining full blocks; it pops the free
   queue's head, evicting the cached blocks there (``_maybe_evict_cached_block``).
   If fewer blocks are free than needed, only that many are taken and only the
   first blocks are cached (radixkv's replay rule; vLLM's scheduler would
   instead not admit the request);
5. ``BlockPool.cache_full_blocks`` with the request's block hashes;
6. ``BlockPool.free_blocks(reversed(blocks))``, as ``SingleTypeKVCacheManager.free``
   does: tail blocks are appended to the free queue first, so they go first.

Only the cache calls (1-6) are timed; building the ``Request`` object (token list
copy, sampling params) happens before the clock starts, as radixkv's bench
expands its tokens before timing. Capacity: ``BlockPool`` reserves block 0 as
its null block, so it is built with ``num_blocks + 1`` blocks to give the cache
exactly ``num_blocks`` usable pages.

Import: ``replay_vllm(requests_iter, page_size, num_blocks) -> dict``.
"""
from __future__ import annotations

import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402

_vllm = None


def _load():
    """Import vLLM's cache modules once (slow: ~10 s, pulls in its config stack)."""
    global _vllm
    if _vllm is None:
        import logging

        import torch
        import vllm
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        from vllm.v1.request import Request

        logging.getLogger("vllm").setLevel(logging.WARNING)
        _vllm = dict(torch=torch, vllm=vllm, SamplingParams=SamplingParams, get_hash_fn_by_name=get_hash_fn_by_name,
                     kv_cache_utils=kv_cache_utils, BlockPool=BlockPool, FullAttentionManager=FullAttentionManager,
                     FullAttentionSpec=FullAttentionSpec, Request=Request)
    return _vllm


def versions() -> dict:
    v = _load()
    return {"vllm": v["vllm"].__version__, "torch": v["torch"].__version__}


def replay_vllm(requests_iter, page_size: int = 16, num_blocks: int = 187488, *, engine_cap: bool = False,
                hash_algo: str = "sha256", measure_heap: bool = False, torch_threads: int | None = 1,
                gc_freeze: bool = True) -> dict:
    """Replay token sequences through a fresh vLLM ``BlockPool``; return the counters and timings.

    ``requests_iter`` yields token sequences (numpy arrays, lists, or objects with
    a ``tokens`` attribute). ``num_blocks`` is the usable capacity in pages.
    ``gc_freeze``: vLLM's ``EngineCore.__init__`` calls ``freeze_gc_heap()`` once
    the KV cache is built, so the pool's per-block objects are never scanned by
    the cyclic GC; the driver does the same after building the pool (and undoes
    it when the replay ends).
    """
    v = _load()
    if torch_threads is not None:  # no torch op runs in this loop; set for a like-for-like process
        v["torch"].set_num_threads(torch_threads)
    Request, SamplingParams = v["Request"], v["SamplingParams"]
    kcu = v["kv_cache_utils"]
    hash_fn = v["get_hash_fn_by_name"](hash_algo)
    kcu.init_none_hash(hash_fn)
    hasher = kcu.get_request_block_hasher(page_size, hash_fn)
    pool = v["BlockPool"](num_gpu_blocks=num_blocks + 1, enable_caching=True, hash_block_size=page_size)
    spec = v["FullAttentionSpec"](block_size=page_size, num_kv_heads=1, head_size=1, dtype=v["torch"].float16)
    find_hit = v["FullAttentionManager"].find_longest_cache_hit
    group_ids = [0]
    sampling = SamplingParams(max_tokens=1)
    if gc_freeze:
        gc.collect()
        gc.freeze()

    rss_start = _common.rss_mib()
    probe = None
    if measure_heap:
        probe = _common.HeapProbe([os.path.dirname(v["vllm"].__file__)])
        probe.start()

    tally = _common.Tally()
    hash_ns: list[int] = []
    clock = time.perf_counter_ns
    wall0 = time.perf_counter()
    for i, item in enumerate(requests_iter):
        tokens = _common.as_tokens(item)
        token_list = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
        n = len(token_list)
        req = Request(str(i), token_list, sampling, None)  # no hasher yet: hashing is timed below
        n_full = n // page_size
        max_len = n - 1 if engine_cap else n

        t0 = clock()
        req.block_hashes.extend(hasher(req))
        hash_ns.append(clock() - t0)
        (hit_blocks,), hit_len = find_hit(req.block_hashes, max_len, group_ids, pool, spec, False, page_size)
        pool.touch(hit_blocks)
        need = n_full - len(hit_blocks)
        take = min(need, pool.get_num_free_blocks())
        blocks = hit_blocks + pool.get_new_blocks(take) if take > 0 else hit_blocks
        pool.cache_full_blocks(req, blocks, len(hit_blocks), len(blocks), page_size, 0)
        pool.free_blocks(reversed(blocks))
        tally.ns.append(clock() - t0)

        tally.requests += 1
        tally.prompt_tokens += n
        tally.hit_tokens += hit_len
        tally.inserted_pages += max(take, 0)
        tally.short_pages += need - max(take, 0)
    tally.wall = time.perf_counter() - wall0
    if gc_freeze:
        gc.unfreeze()

    out = tally.summary()
    hus = _common.np.asarray(hash_ns, dtype=float) / 1000.0
    if len(hus):  # step 1 alone: the block hashing that Request.__init__ runs in the engine
        out["hash_us"] = {"p50": round(float(_common.np.percentile(hus, 50)), 1),
                          "p99": round(float(_common.np.percentile(hus, 99)), 1)}
        out["hash_share_of_time"] = round(float(hus.sum()) / (sum(tally.ns) / 1000.0), 3)
    cached_pages = sum(1 for b in pool.blocks if b.block_hash is not None)
    out.update({"page_size": page_size, "num_blocks": num_blocks, "engine_cap": engine_cap,
                "torch_threads": v["torch"].get_num_threads(), "hash_algo": hash_algo,
                "gc_freeze": gc_freeze, "cached_pages_end": cached_pages,
                "rss_mib_start": round(rss_start, 1), "rss_mib_end": round(_common.rss_mib(), 1)})
    if probe is not None:
        heap = probe.stop()
        out.update({"tracemalloc": True, "heap_bytes": heap,
                    "heap_bytes_per_cached_page": round(heap / cached_pages, 1) if cached_pages else None})
    return out


def main(argv=None):
    _common.run_cli("vllm", replay_vllm, versions(), __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()

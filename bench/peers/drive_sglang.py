"""Replay a Mooncake trace through SGLang's ``RadixCache`` with its paged CPU token allocator.

    bench/peers/.venv/bin/python bench/peers/drive_sglang.py --trace T --num-blocks 187488 [--limit N]

The cache is SGLang's own ``RadixCache`` built from ``CacheInitParams`` (the
constructor of current SGLang), over a ``PagedTokenToKVPoolAllocator`` of
``num_blocks`` pages on ``device="cpu"`` with no KV tensors behind it
(``kvcache=None``; the radix cache only moves slot indices). ``need_sort=False``
and ``eviction_policy="lru"`` are what the scheduler uses outside PD disaggregation.

Per request, in trace order, following the scheduler's path for a request that
finishes at once (match in ``schedule_policy`` -> ``inc_lock_ref`` -> allocation in
``alloc_for_extend`` with ``evict_to_free_tokens`` -> ``cache_finished_req``):

1. ``match_prefix(MatchPrefixParams(RadixKey(tokens)))``; the key is page-aligned
   inside, so the hit is whole pages; ``path_device_indices`` of the last node
   gives the prefix's slot indices;
2. ``inc_lock_ref(last_node)`` protects the matched path;
3. if the allocator has fewer free slots than the remaining full pages need,
   ``evict(EvictParams(num_tokens=shortfall))``: SGLang pops whole leaf nodes by
   ``last_access_time`` until at least ``shortfall`` tokens are freed;
4. ``allocator.alloc(n)`` for the remaining full pages (or as many as there are:
   only the first pages that got slots are cached, radixkv's replay rule);
5. ``insert(InsertParams(key, value=prefix_indices ++ new_indices))``; any slots
   the insert found already cached are freed, as ``_insert_cache`` does;
6. ``dec_lock_ref(last_node)``.

Only steps 1-6 are timed; turning the numpy tokens into SGLang's ``array('q')``
happens before the clock starts.

SGLang's import pulls in its model-config package, which imports ``torchvision``
at module level; the PyPI torchvision wheels are CUDA builds that fail next to a
CPU torch, so ``_shims.install_stub_packages(["torchvision"])`` stands in for it
(see ``_shims.py``). No SGLang code is replaced.

Import: ``replay_sglang(requests_iter, page_size, num_blocks) -> dict``.
"""
from __future__ import annotations

import os
import sys
import time
import warnings
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import _shims  # noqa: E402

_sgl = None


def _load():
    """Import SGLang's cache modules once."""
    global _sgl
    if _sgl is None:
        stubbed = _shims.install_stub_packages(["torchvision"])
        import logging

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
            import sglang
            from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
            from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
            from sglang.srt.mem_cache.cache_init_params import CacheInitParams
            from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
        logging.getLogger("sglang").setLevel(logging.WARNING)
        _sgl = dict(torch=torch, sglang=sglang, PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator,
                    EvictParams=EvictParams, InsertParams=InsertParams, MatchPrefixParams=MatchPrefixParams,
                    CacheInitParams=CacheInitParams, RadixCache=RadixCache, RadixKey=RadixKey, stubbed=stubbed)
    return _sgl


def versions() -> dict:
    s = _load()
    return {"sglang": s["sglang"].__version__, "torch": s["torch"].__version__, "stubbed_imports": s["stubbed"]}


def make_cache(page_size: int, num_blocks: int):
    s = _load()
    torch = s["torch"]
    allocator = s["PagedTokenToKVPoolAllocator"](
        size=num_blocks * page_size, page_size=page_size, dtype=torch.float16, device="cpu",
        kvcache=None, need_sort=False)
    params = s["CacheInitParams"](disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator,
                                  page_size=page_size, eviction_policy="lru")
    return s["RadixCache"](params), allocator


def as_array_q(item) -> array:
    """A request's token ids as ``array('q')``, the form SGLang's ``Req`` holds them in.

    Cost: one copy of the prompt (O(n)); the drivers call it outside the timed region.
    """
    tokens = _common.as_tokens(item)
    if hasattr(tokens, "astype"):
        return array("q", tokens.astype("int64", copy=False).tobytes())
    return array("q", tokens)


def match_request(tree, ids, engine_cap: bool, RadixKey, MatchPrefixParams):  # noqa: N803 (SGLang's classes)
    """SGLang's match of a request's tokens ``ids`` in ``tree`` (either cache): ``(tokens hit, deepest
    node)``. ``engine_cap``: leave the last token out, as the scheduler does."""
    key = RadixKey(ids, limit=len(ids) - 1) if engine_cap else RadixKey(ids)
    m = tree.match_prefix(MatchPrefixParams(key=key))
    return m.device_prefix_len, m.last_device_node


def replay_loop(requests_iter, page_size: int, serve) -> _common.Tally:
    """Time ``serve(ids, n_full_tokens) -> (hit, need, take)`` once per request, in trace order.

    The timing loop both SGLang drivers share: turning a request into ``array('q')``
    happens before the clock starts; ``serve`` runs the cache calls of one request
    (match, lock, evict, alloc, insert, unlock) and returns the matched tokens,
    the tokens it wanted to allocate and the tokens it did allocate.
    """
    tally = _common.Tally()
    clock = time.perf_counter_ns
    wall0 = time.perf_counter()
    for item in requests_iter:
        ids = as_array_q(item)
        n = len(ids)
        t0 = clock()
        hit, need, take = serve(ids, n // page_size * page_size)
        tally.ns.append(clock() - t0)
        tally.requests += 1
        tally.prompt_tokens += n
        tally.hit_tokens += hit
        tally.inserted_pages += take // page_size
        tally.short_pages += (need - take) // page_size if need > 0 else 0
    tally.wall = time.perf_counter() - wall0
    return tally


def cache_summary(tally: _common.Tally, tree, page_size: int, num_blocks: int, engine_cap: bool,
                  rss_start: float) -> dict:
    """The JSON fields both SGLang drivers report: the tally, the capacity and what the tree holds at the end."""
    out = tally.summary()
    cached_tokens = tree.evictable_size() + tree.protected_size()
    cached_pages = cached_tokens // page_size
    # every slot is either free or held by the tree once all requests are done: anything else is a leak
    # (or, negative, a slot freed twice) in the driver or the cache
    leaked = num_blocks * page_size - cached_tokens - tree.token_to_kv_pool_allocator.available_size()
    out.update({"page_size": page_size, "num_blocks": num_blocks, "engine_cap": engine_cap,
                "torch_threads": _load()["torch"].get_num_threads(), "cached_pages_end": cached_pages,
                "leaked_slots": leaked,
                "rss_mib_start": round(rss_start, 1), "rss_mib_end": round(_common.rss_mib(), 1)})
    return out


def replay_sglang(requests_iter, page_size: int = 16, num_blocks: int = 187488, *, engine_cap: bool = False,
                  measure_heap: bool = False, torch_threads: int | None = 1) -> dict:
    """Replay token sequences through a fresh SGLang ``RadixCache``; return the counters and timings.

    ``requests_iter`` yields token sequences (numpy arrays, lists, or objects with
    a ``tokens`` attribute). ``num_blocks`` is the capacity in pages.
    ``torch_threads`` sets torch's intra-op thread count for the process (``None``
    leaves it alone): the radix cache's index tensors are copied with torch ops
    (``clone``, ``cat``), and with torch's default pool on a small machine those
    copies are an order of magnitude slower and very noisy (see README).
    """
    s = _load()
    torch = s["torch"]
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    RadixKey, MatchPrefixParams = s["RadixKey"], s["MatchPrefixParams"]
    InsertParams, EvictParams = s["InsertParams"], s["EvictParams"]
    tree, allocator = make_cache(page_size, num_blocks)

    rss_start = _common.rss_mib()
    probe = None
    if measure_heap:
        probe = _common.HeapProbe([os.path.dirname(s["sglang"].__file__)])
        probe.start()

    cat = torch.cat

    def serve(ids, n_full_tokens):
        hit, last = match_request(tree, ids, engine_cap, RadixKey, MatchPrefixParams)
        tree.inc_lock_ref(last)
        need = n_full_tokens - hit
        take = 0
        if need > 0:
            avail = allocator.available_size()
            if avail < need:
                tree.evict(EvictParams(num_tokens=need - avail))
                avail = allocator.available_size()
            take = min(need, avail) // page_size * page_size
        if take > 0:
            new_idx = allocator.alloc(take)
            prefix_idx = tree.path_device_indices(last)
            value = cat((prefix_idx, new_idx)) if hit else new_idx
            res = tree.insert(InsertParams(key=RadixKey(ids, limit=hit + take), value=value))
            if res.prefix_len > hit:  # slots the tree already held: give the duplicates back
                allocator.free(value[hit:res.prefix_len])
        tree.dec_lock_ref(last)
        return hit, need, take

    tally = replay_loop(requests_iter, page_size, serve)
    out = cache_summary(tally, tree, page_size, num_blocks, engine_cap, rss_start)
    cached_pages = out["cached_pages_end"]
    if probe is not None:
        heap = probe.stop()
        nodes, tensor_bytes = _tree_stats(tree)
        out.update({"tracemalloc": True, "heap_bytes": heap, "tree_nodes": nodes,
                    "heap_bytes_per_cached_page": round(heap / cached_pages, 1) if cached_pages else None,
                    # node values are CPU int64 tensors: their storage lives outside the Python heap
                    "tensor_bytes_per_cached_page": round(tensor_bytes / cached_pages, 1) if cached_pages else None})
    return out


def _tree_stats(tree):
    nodes = 0
    tensor_bytes = 0
    stack = list(tree.root_node.children.values())
    while stack:
        node = stack.pop()
        nodes += 1
        if node.value is not None:
            tensor_bytes += node.value.untyped_storage().nbytes()
        stack.extend(node.children.values())
    return nodes, tensor_bytes


def main(argv=None):
    _common.run_cli("sglang", replay_sglang, versions(), __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()

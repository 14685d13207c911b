"""Replay a Mooncake trace through SGLang's default cache: ``UnifiedRadixCache`` on its Rust tree core.

    bench/peers/.venv/bin/python bench/peers/drive_sglang_unified.py --trace T --num-blocks 187488 [--limit N]

SGLang's scheduler builds ``UnifiedRadixCache`` for a plain full-attention model
(``mem_cache/registry.py``: ``default_radix_cache_factory`` ->
``create_unified_radix_cache`` with ``tree_components=(FULL,)``), and the cache
takes its tree core from ``unified_cache/tree_core_registry.py``: "rust" unless
``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` says otherwise. The driver builds it
the same way, from ``CacheInitParams(..., tree_components=(FULL,))``, over the
allocator the scheduler picks (``kv_cache_configurator.py``):
``TokenToKVPoolAllocator`` at page size 1, ``PagedTokenToKVPoolAllocator``
above, on ``device="cpu"`` with no KV tensors behind it (``kvcache=None``).

SGLang falls back to its Python tree core without an error when the Rust one
cannot be used (it logs the reason at INFO level). The driver asks for the
Rust core explicitly and refuses to run on anything else: ``make_cache`` checks
that the cache resolved the backend to "rust" and that its tree core is
``RustUnifiedTreeCore`` over a binding from the compiled ``rust_tree_core``
extension; the JSON line names the class and the extension file
(``tree_core``). ``tree_core="python"`` selects the Python core instead, to
check that both give the same hits.

Per request, the sequence of ``drive_sglang.py`` on this cache's API (the
scheduler's path for a request that finishes at once):

1. ``match_prefix(MatchPrefixParams(RadixKey(tokens)))``; ``device_prefix_len``
   is the hit (whole pages), ``last_device_node`` the node it ends on;
2. ``lock(last)`` (``inc_lock_ref`` with its receipt);
3. ``allocator.evict_to_free_tokens(cache, need)`` when the allocator has fewer
   free slots than the remaining full pages need: the scheduler's call, which
   runs ``evict_for_alloc`` for the shortfall (whole leaf nodes by last access);
4. ``allocator.alloc(n)`` for the remaining full pages (or as many as there are);
5. ``insert(InsertParams(key, value=path_device_indices(last) ++ new,
   prev_prefix_len=hit))``; with ``prev_prefix_len`` set, the insert itself
   frees the slots it found already cached past the hit (as
   ``checkpoint_into_tree`` relies on), so the driver frees nothing;
6. ``unlock(lock)``.

Tokens are ``array('q')``, as SGLang's ``Req`` holds them (the Rust core refuses
anything else); the conversion happens before the clock starts.

Import: ``replay_sglang_unified(requests_iter, page_size, num_blocks) -> dict``.
"""
from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import drive_sglang  # noqa: E402

_urc = None


def _load() -> dict:
    """Import the unified cache's modules once (after drive_sglang's imports and stubs)."""
    global _urc
    if _urc is None:
        drive_sglang._load()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
            from sglang.srt.mem_cache.unified_cache.components import ComponentType
            from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        _urc = dict(TokenToKVPoolAllocator=TokenToKVPoolAllocator, ComponentType=ComponentType,
                    UnifiedRadixCache=UnifiedRadixCache)
    return _urc


def versions() -> dict:
    return drive_sglang.versions()


def tree_core_facts(tree) -> dict:
    """Which tree core ``tree`` runs on: the resolved backend, the core's class and, for Rust, the extension file."""
    core = tree.tree_core
    facts = {"backend": tree._tree_core_backend, "class": type(core).__name__}
    binding = getattr(core, "_binding", None)
    if binding is not None:
        facts["binding"] = type(binding).__name__
        facts["extension"] = sys.modules[type(core)._bindings.__name__].__file__
    return facts


def make_cache(page_size: int, num_blocks: int, tree_core: str = "rust"):
    """A ``UnifiedRadixCache`` (FULL component, LRU) over the allocator SGLang's scheduler picks for ``page_size``.

    Raises ``RuntimeError`` when ``tree_core="rust"`` did not give the Rust core
    (SGLang would have fallen back to Python silently).
    """
    s, u = drive_sglang._load(), _load()
    torch = s["torch"]
    if page_size == 1:
        allocator = u["TokenToKVPoolAllocator"](size=num_blocks, dtype=torch.float16, device="cpu",
                                               kvcache=None, need_sort=False)
    else:
        allocator = s["PagedTokenToKVPoolAllocator"](
            size=num_blocks * page_size, page_size=page_size, dtype=torch.float16, device="cpu",
            kvcache=None, need_sort=False)
    params = s["CacheInitParams"](disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator,
                                  page_size=page_size, eviction_policy="lru",
                                  tree_components=(u["ComponentType"].FULL,), tree_core_backend=tree_core)
    tree = u["UnifiedRadixCache"](params)
    facts = tree_core_facts(tree)
    if tree_core == "rust" and (facts["backend"] != "rust" or facts["class"] != "RustUnifiedTreeCore"
                                or not facts.get("extension", "").endswith(".so")):
        raise RuntimeError(f"asked for SGLang's Rust tree core, got {facts!r}")
    return tree, allocator


def replay_sglang_unified(requests_iter, page_size: int = 16, num_blocks: int = 187488, *,
                          engine_cap: bool = False, measure_heap: bool = False, torch_threads: int | None = 1,
                          tree_core: str = "rust") -> dict:
    """Replay token sequences through a fresh SGLang ``UnifiedRadixCache``; return the counters and timings.

    Arguments as ``drive_sglang.replay_sglang``; ``tree_core`` picks SGLang's tree
    core ("rust", its default, or "python"). ``measure_heap`` is refused: the
    Rust core's tree lives outside the Python heap, where tracemalloc cannot see it.
    """
    if measure_heap:
        raise ValueError("measure_heap: the Rust tree core's memory is not on the Python heap")
    s = drive_sglang._load()
    torch = s["torch"]
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    RadixKey, MatchPrefixParams, InsertParams = s["RadixKey"], s["MatchPrefixParams"], s["InsertParams"]
    tree, allocator = make_cache(page_size, num_blocks, tree_core)
    rss_start = _common.rss_mib()
    cat = torch.cat

    def serve(ids, n_full_tokens):
        hit, last = drive_sglang.match_request(tree, ids, engine_cap, RadixKey, MatchPrefixParams)
        lock = tree.lock(last)
        need = n_full_tokens - hit
        take = 0
        if need > 0:
            if allocator.available_size() < need:
                allocator.evict_to_free_tokens(tree, need)
            take = min(need, allocator.available_size()) // page_size * page_size
        if take > 0:
            new_idx = allocator.alloc(take)
            value = cat((tree.path_device_indices(last), new_idx)) if hit else new_idx
            tree.insert(InsertParams(key=RadixKey(ids, limit=hit + take), value=value, prev_prefix_len=hit))
        tree.unlock(lock)
        return hit, need, take

    tally = drive_sglang.replay_loop(requests_iter, page_size, serve)
    out = drive_sglang.cache_summary(tally, tree, page_size, num_blocks, engine_cap, rss_start)
    out["tree_core"] = tree_core_facts(tree)
    return out


def main(argv=None):
    _common.run_cli("sglang-unified", replay_sglang_unified, versions(), __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()

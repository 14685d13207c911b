"""The SGLang adapter over radixkv's free-block sink: freed pages reach SGLang's allocator directly.

Same fakes and scheduler loop as tests/test_adapters_sglang.py (a double free
or a page both free and cached fails there).
"""

from __future__ import annotations

from .test_adapters_sglang import FakeEngine, _as_row  # first: installs the torchvision stand-in SGLang imports

from radixkv.adapters.sglang import EvictParams, InsertParams, RadixKey  # noqa: E402


def _row(engine: FakeEngine, req, n: int):
    return engine.pool.req_to_token[req.kv.req_pool_idx, :n]


def test_checkpoint_after_an_insert_of_the_same_row_frees_no_cached_page():
    """A caller that inserts a request's row (SGLang 0.5.5's way) and then checkpoints it.

    The insert caches the request's own pages, so at the checkpoint they are
    the tree's, not duplicates: freeing row positions from
    ``cache_protected_len`` to the cached length handed the tree's pages to the
    allocator while they stayed cached (the next request would overwrite KV
    the tree serves). Only true duplicates may be freed.
    """
    for page_size in (1, 2):
        engine = FakeEngine(page_size, 12)
        prompt = list(range(10, 18))
        req = engine.start(prompt + [99])
        engine.tree.insert(InsertParams(key=RadixKey(prompt), value=_row(engine, req, len(prompt))))
        engine.check()
        engine.tree.checkpoint(req, up_to=len(prompt))
        engine.check()
        engine.decode(req, [5, 6])
        engine.finish(req)
        engine.check()
        assert engine.tree.total_size() >= len(prompt)
        other = engine.start(prompt + [7, 7, 7])  # served the cached pages, then computes on fresh ones
        assert other.hit == len(prompt)
        engine.finish(other)
        engine.check()

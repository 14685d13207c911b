"""The page-hash index apart from the event recorder: kept without events, hashes each page once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.adapters.vllm import VLLMBlockView
from radixkv.events import BlockDemoted
from radixkv.events.hashing import BlockHasher, external_block_hash
from radixkv.analysis.stats import PageIndex, PrefixKeys
from radixkv.tiers import HostTier, TieredCache

PACKAGE = Path(__file__).resolve().parents[2] / "radixkv"


def _forbid_hashing(monkeypatch) -> None:
    def boom(*args, **kwargs):
        raise AssertionError("hashed a page the index holds")

    monkeypatch.setattr(BlockHasher, "chain", boom)


def test_vllm_view_works_on_a_cache_without_events():
    cache = PrefixCache(num_blocks=8, page_size=2)
    kept = cache.admit([1, 2, 3, 4, 5, 6], namespace="t")
    kept.release()
    index = cache.attach_page_hashes()  # indexes the pages cached already
    assert cache.page_hashes is index and cache.event_log is None
    view = VLLMBlockView(cache)
    hashes = view.block_hashes([1, 2, 3, 4, 5, 6, 7, 8], cache_salt="t")
    assert view.find_longest_cache_hit(hashes) == kept.blocks.tolist()
    more = cache.admit([1, 2, 3, 4, 5, 6, 7, 8], namespace="t")   # stored after the attach
    more.release()
    assert view.find_longest_cache_hit(hashes) == more.blocks.tolist()
    assert cache.evict(1) == 1 and view.find_longest_cache_hit(hashes) == more.blocks[:3].tolist()
    assert view.find_longest_cache_hit(view.block_hashes([1, 2, 3, 4])) == []   # no salt: another namespace
    assert cache.take_events() == []
    cache.check()
    cache.reset()
    assert len(index) == 0 and view.get_cached_block(hashes[0]) is None
    cache.check()


def test_the_index_is_the_event_logs_and_refuses_another_hash_function():
    cache = PrefixCache(num_blocks=4, page_size=2, enable_events=BlockHasher(hash_seed="0"))
    assert cache.attach_page_hashes() is cache.page_hashes is cache.event_log.index
    assert cache.attach_page_hashes(BlockHasher(hash_seed="0")) is cache.page_hashes
    cache.admit([1, 2, 3, 4]).release()
    with pytest.raises(ValueError, match="already"):
        cache.attach_page_hashes(BlockHasher())
    with pytest.raises(TypeError, match="hasher"):
        PrefixCache(num_blocks=4, page_size=2).attach_page_hashes("sha256")
    [stored] = cache.take_events()   # the refusals changed nothing
    assert stored.block_hashes == [external_block_hash(h) for h in BlockHasher(hash_seed="0").hash_pages([1, 2, 3, 4], 2)]
    cache.check()


@given(ops=st.lists(st.tuples(st.sampled_from(["admit", "evict", "index", "unindex"]),
                              st.lists(st.integers(0, 2), max_size=8), st.sampled_from([None, "a"]),
                              st.integers(0, 3)), max_size=20))
def test_the_hash_index_and_the_page_index_observe_side_by_side(ops):
    """Attaching and detaching replay's page index never disturbs the hash index (one observer seam)."""
    cache = PrefixCache(num_blocks=6, page_size=2)
    index = cache.attach_page_hashes()
    keys = PrefixKeys(2)
    for op, tokens, namespace, n in ops:
        if op == "admit":
            cache.admit(tokens, namespace=namespace).release()
        elif op == "evict":
            cache.evict(n)
        elif op == "index":
            cache.attach_page_index(PageIndex(cache, keys))
        else:
            cache.attach_page_index(None)
        cache.check()   # checks the hash index page by page
        assert len(index) == cache.num_cached_blocks


def test_tier_moves_of_cached_pages_hash_nothing(monkeypatch):
    cache = PrefixCache(num_blocks=8, page_size=2, enable_events=True)
    cache.admit([1, 2, 3, 4, 5, 6]).release()
    [stored] = cache.take_events()
    node = cache.match([1, 2, 3, 4, 5, 6]).node._node
    _forbid_hashing(monkeypatch)
    log = cache.event_log
    log.demoted(node, range(1, 3), medium="CPU")
    log.promoted(node, range(0, 2), source_medium="CPU")
    demoted, promoted = cache.take_events()
    assert demoted.block_hashes == stored.block_hashes[1:] and demoted.parent_block_hash == stored.block_hashes[0]
    assert promoted.block_hashes == stored.block_hashes[:2] and promoted.parent_block_hash is None


def test_a_demotion_is_reported_with_the_hashes_hbm_indexed(monkeypatch):
    cache = TieredCache(num_blocks=4, page_size=2, tiers=[HostTier(8)], write_policy="write_back",
                        load_back="always", enable_events=True)
    first = list(range(8))
    cache.admit(first).release()
    [stored] = cache.take_events()
    chain = BlockHasher.chain
    pages_hashed = []

    def counting(self, page_tokens, *args):
        pages_hashed.append(len(page_tokens))
        return chain(self, page_tokens, *args)

    monkeypatch.setattr(BlockHasher, "chain", counting)
    cache.admit(list(range(100, 108))).release()   # demotes the four pages of `first`, stores four new ones
    events = cache.take_events()
    demoted = [h for e in events if isinstance(e, BlockDemoted) for h in e.block_hashes]
    assert demoted == stored.block_hashes
    assert sum(pages_hashed) == 4   # the new pages, each once; the demoted ones came from the index
    cache.check()


def test_the_recorder_and_the_index_do_not_import_the_engine():
    for name in ("events/log.py", "events/page_hashes.py"):
        tree = ast.parse((PACKAGE / name).read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert not {"cache", "radixkv.cache", "tiers", "adapters"} & imported, f"{name} imports {imported}"


def test_an_index_built_late_equals_one_kept_from_the_start():
    from radixkv.events import PageHashIndex

    hasher = BlockHasher()
    cache = PrefixCache(num_blocks=12, page_size=3, enable_events=hasher)
    for tokens, ns in (([1] * 9, None), ([1] * 6 + [2] * 3, None), ([4] * 12, "x")):
        cache.admit(tokens, namespace=ns).release()
    cache.evict(2)
    late = PageHashIndex(cache.num_blocks, cache.page_size, hasher, cache.nodes())
    early = cache.page_hashes
    assert sorted(late) == sorted(early)
    assert all(late.block_hash(b) == early.block_hash(b) for b in range(cache.num_blocks))
    late.check(cache.nodes())
    assert all(early.lookup(h) == late.lookup(h) for h in late)

"""Block hashes (vLLM-compatible) and KV events emitted by the engine."""

from __future__ import annotations

import hashlib
import pickle
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.adapters.vllm import VLLMBlockView
from radixkv.testing import RadixKVTarget
from radixkv.events import (
    AllBlocksCleared,
    BlockDemoted,
    BlockPromoted,
    BlockRemoved,
    BlockStored,
    EventLog,
    event_field_names,
)
from radixkv.events.hashing import (
    BlockHasher,
    cbor_dumps,
    external_block_hash,
    hash_block_tokens,
    sha256,
    sha256_cbor,
)

# ---------------------------------------------------------------- hashes from the spec
# NONE_HASH for PYTHONHASHSEED="0": sha256 of the CBOR text string "0" (major type 3, length 1).
NONE_HASH_SEED_0 = hashlib.sha256(b"\x61\x30").digest()


def _page_cbor(parent: bytes, tokens_cbor: bytes, extra_cbor: bytes) -> bytes:
    # array(3) [ bytes(32) parent, array(n) tokens, extra keys ]  (RFC 8949, shortest heads)
    return b"\x83" + b"\x58\x20" + parent + tokens_cbor + extra_cbor


def test_first_page_hash_equals_the_hand_encoded_cbor():
    # tokens 1, 2, 300, 70000: array(4) then uint heads of 1, 1, 3 and 5 bytes.
    tokens_cbor = b"\x84\x01\x02\x19\x01\x2c\x1a\x00\x01\x11\x70"
    expected = hashlib.sha256(_page_cbor(NONE_HASH_SEED_0, tokens_cbor, b"\xf6")).digest()
    hasher = BlockHasher("sha256_cbor", hash_seed="0")
    assert hasher.none_hash == NONE_HASH_SEED_0
    assert hasher.hash_block_tokens(None, [1, 2, 300, 70000]) == expected
    assert hash_block_tokens(sha256_cbor, None, [1, 2, 300, 70000], none_hash=NONE_HASH_SEED_0) == expected
    assert hasher.hash_pages([1, 2, 300, 70000, 5], page_size=4) == [expected]


def test_salted_and_chained_pages_equal_the_hand_encoded_cbor():
    # extra keys (("cache_salt", "salt"),): array(1) [ array(2) [ text(10), text(4) ] ]
    salted = b"\x81\x82\x6acache_salt\x64salt"
    first = hashlib.sha256(_page_cbor(NONE_HASH_SEED_0, b"\x82\x07\x08", salted)).digest()
    second = hashlib.sha256(_page_cbor(first, b"\x82\x18\x18\x00", b"\xf6")).digest()  # 24 needs 0x18 24
    hasher = BlockHasher("sha256_cbor", hash_seed="0")
    assert hasher.hash_pages([7, 8, 24, 0], page_size=2, namespace="salt") == [first, second]
    assert external_block_hash(second) == int.from_bytes(second[-8:], "big")


def test_pickle_sha256_is_vllms_formula():
    obj = (b"\x01" * 32, (1, 2, 3), None)
    assert sha256(obj) == hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    hasher = BlockHasher("sha256", hash_seed="42")
    assert hasher.none_hash == sha256("42")
    assert hasher.hash_block_tokens(None, [1, 2, 3]) == sha256((sha256("42"), (1, 2, 3), None))


def test_cbor_matches_cbor2_when_available():
    """OPTIONAL cross-check: runs only where the ``cbor2`` package is importable (skipped otherwise)."""
    cbor2 = pytest.importorskip("cbor2")
    rng = random.Random(0)
    for _ in range(200):
        obj = (bytes(rng.randrange(256) for _ in range(32)),
               tuple(rng.choice([0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1]) for _ in range(rng.randrange(20))),
               rng.choice([None, ("salt",), ("lora", 3), (b"\x00\xff", -5)]))
        assert cbor_dumps(obj) == cbor2.dumps(obj, canonical=True)


@settings(max_examples=150, deadline=None)
@given(pages=st.integers(1, 12), page_size=st.integers(1, 17), first_page=st.integers(0, 1),
       namespace=st.sampled_from([None, "", "salt", "tenant-9"]), parent=st.booleans(),
       values=st.lists(st.sampled_from([0, 1, 23, 24, 255, 256, 65535, 65536, 2**31, 2**32 - 1]), min_size=1))
def test_bulk_encoder_equals_the_generic_formula(pages, page_size, first_page, namespace, parent, values):
    tokens = np.resize(np.array(values, dtype=np.uint32), (pages, page_size))
    parent_hash = hashlib.sha256(b"parent").digest() if parent else None
    hasher = BlockHasher("sha256_cbor")
    fast = hasher.chain(tokens, parent_hash, first_page, namespace)
    slow, prev = [], parent_hash
    for i, row in enumerate(tokens.tolist()):
        extra = (("cache_salt", namespace),) if namespace is not None and first_page + i == 0 else None
        prev = hash_block_tokens(sha256_cbor, prev, row, extra, none_hash=hasher.none_hash)
        slow.append(prev)
    assert fast == slow


def test_hasher_rejects_bad_arguments():
    with pytest.raises(ValueError, match="hash_fn"):
        BlockHasher("md5")
    with pytest.raises(TypeError, match="hash_seed"):
        BlockHasher(hash_seed=0)
    with pytest.raises(ValueError, match="32-byte"):
        BlockHasher(lambda obj: b"short")
    with pytest.raises(TypeError):
        cbor_dumps({1: 2})
    with pytest.raises(TypeError, match="namespace"):
        BlockHasher().hash_pages([1, 2], 2, namespace=1.5)
    with pytest.raises(TypeError, match="enable_events"):
        PrefixCache(4, page_size=2, enable_events="yes")


# ---------------------------------------------------------------- event shapes
def test_event_fields_follow_sglang_and_vllm():
    # SGLang: BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium);
    # vLLM appends lora_name and extra_keys. BlockRemoved(block_hashes, medium).
    assert event_field_names(BlockStored)[:8] == (
        "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
        "lora_name", "extra_keys")
    assert event_field_names(BlockRemoved) == ("block_hashes", "medium")
    assert event_field_names(AllBlocksCleared) == ()
    assert event_field_names(BlockDemoted) == event_field_names(BlockPromoted) == (
        "block_hashes", "parent_block_hash", "token_ids", "block_size", "medium", "source_medium")
    assert BlockRemoved([1]).as_dict() == {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}


# ---------------------------------------------------------------- emission
def test_insert_evict_reset_emit_stored_removed_cleared():
    cache = PrefixCache(num_blocks=4, page_size=2, enable_events=True)
    hasher = cache.event_log.hasher
    cache.admit([1, 2, 3, 4]).release()
    [stored] = cache.take_events()
    expected = [external_block_hash(h) for h in hasher.hash_pages([1, 2, 3, 4], 2)]
    assert stored == BlockStored(expected, None, [1, 2, 3, 4], 2, None, "GPU", None, None)
    assert cache.take_events() == []

    cache.admit([1, 2, 3, 4, 5, 6]).release()   # extends: parent is the hash of page 2
    [stored] = cache.take_events()
    full = [external_block_hash(h) for h in hasher.hash_pages([1, 2, 3, 4, 5, 6], 2)]
    assert stored.parent_block_hash == full[1] and stored.block_hashes == [full[2]]
    assert stored.token_ids == [5, 6]

    assert cache.evict(2) == 2                   # LRU tail first: pages 3 and 2
    removed = cache.take_events()
    assert all(isinstance(e, BlockRemoved) and e.medium == "GPU" for e in removed)
    assert [h for e in removed for h in e.block_hashes] == [full[2], full[1]]  # one event per leaf tail
    cache.reset()
    assert cache.take_events() == [AllBlocksCleared()]
    cache.check()


def test_namespaced_first_page_carries_the_extra_key():
    cache = PrefixCache(num_blocks=8, page_size=2, enable_events=True)
    cache.admit([1, 2, 3, 4], namespace="tenant").release()
    [stored] = cache.take_events()
    assert stored.extra_keys == [("tenant",), None]
    view = VLLMBlockView(cache)
    assert stored.block_hashes == [external_block_hash(h) for h in view.block_hashes([1, 2, 3, 4], cache_salt="tenant")]


def test_disabled_events_cost_no_hashing(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("hashed with events disabled")

    monkeypatch.setattr(BlockHasher, "chain", boom)
    monkeypatch.setattr(EventLog, "removed", boom)
    cache = PrefixCache(num_blocks=4, page_size=2)
    assert cache.event_log is None
    for i in range(6):
        cache.admit([i, i, i, i]).release()
    cache.evict(1)
    cache.reset()
    assert cache.take_events() == []


def test_tier_move_events_and_their_plain_equivalents():
    cache = PrefixCache(num_blocks=8, page_size=2, enable_events=True)
    cache.admit([1, 2, 3, 4, 5, 6]).release()
    cache.take_events()
    node = cache.match([1, 2, 3, 4, 5, 6]).node._node
    log = cache.event_log
    log.demoted(node, range(1, 3), medium="CPU")
    log.promoted(node, range(2, 3), source_medium="CPU")
    demoted, promoted = cache.take_events()
    full = [external_block_hash(h) for h in log.hasher.hash_pages([1, 2, 3, 4, 5, 6], 2)]
    assert demoted == BlockDemoted(full[1:], full[0], [3, 4, 5, 6], 2, "CPU", "GPU")
    assert promoted == BlockPromoted(full[2:], full[1], [5, 6], 2, "GPU", "CPU")
    assert demoted.as_store_remove() == [BlockStored(full[1:], full[0], [3, 4, 5, 6], 2, medium="CPU")]
    assert promoted.as_store_remove() == [BlockRemoved(full[2:], medium="CPU")]
    assert promoted.as_store_remove(exclusive=False) == []
    with pytest.raises(ValueError, match="pages"):
        log.demoted(node, range(0, 9), medium="CPU")
    cache.check()


def test_vllm_view_finds_pages_by_hash():
    cache = PrefixCache(num_blocks=8, page_size=2, enable_events=True)
    a = cache.admit([1, 2, 3, 4, 5, 6])
    a.release()
    view = VLLMBlockView(cache)
    hashes = view.block_hashes([1, 2, 3, 4, 9, 9])
    assert view.find_longest_cache_hit(hashes) == a.blocks[:2].tolist()
    assert hashes[0] in view and view.get_cached_block(hashes[2]) is None
    with pytest.raises(ValueError, match="enable_events"):
        VLLMBlockView(PrefixCache(4, page_size=2))
    with pytest.raises(TypeError):
        view.get_cached_block(123)


# ---------------------------------------------------------------- a router's view
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["admit", "evict", "insert"]),
                              st.lists(st.integers(0, 2), max_size=10),
                              st.sampled_from([None, "a"]), st.integers(0, 3)), max_size=25),
       page_size=st.sampled_from([1, 2, 3]))
def test_a_router_applying_the_events_sees_exactly_the_cached_pages(ops, page_size):
    cache = PrefixCache(num_blocks=7, page_size=page_size, enable_events=True)
    hasher = cache.event_log.hasher
    router = {}  # external hash -> parent hash, as a KV router keeps it
    for op, tokens, namespace, n in ops:
        if op == "admit":
            cache.admit(tokens, namespace=namespace).release()
        elif op == "evict":
            cache.evict(n)
        else:
            m = cache.match(tokens, namespace=namespace)
            cache.lock(m.node)
            need = len(tokens) // page_size - len(m.blocks)
            blocks = cache.allocate(need)
            if blocks is not None:
                cache.insert(tokens, np.concatenate([m.blocks, blocks]), namespace=namespace)
            cache.unlock(m.node)
        for event in cache.take_events():
            if isinstance(event, BlockStored):
                assert event.parent_block_hash is None or event.parent_block_hash in router
                parent = event.parent_block_hash
                for h in event.block_hashes:
                    assert h not in router, "stored twice"
                    router[h] = parent
                    parent = h
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    assert h in router, "removed a page never stored"
                    del router[h]
        cache.check()
    # The router's pages are exactly the cache's, hash for hash.
    expected = set()
    for (namespace, tokens), _ in RadixKVTarget(cache).contents().items():
        expected.add(external_block_hash(hasher.hash_pages(list(tokens), page_size, namespace=namespace)[-1]))
    assert set(router) == expected

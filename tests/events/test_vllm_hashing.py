"""radixkv's block hashes equal vLLM 0.33.0's defaults, pinned byte for byte.

vLLM 0.33.0 (``vllm/v1/core/kv_cache_utils.py``, ``vllm/utils/hashing.py``):
``prefix_caching_hash_algo`` defaults to ``"sha256"``, i.e.
``hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))``;
``NONE_HASH = sha256("vllm-none-hash")`` when ``PYTHONHASHSEED`` is unset; a
page hashes ``(parent or NONE_HASH, tuple(tokens), extra_keys)``; a request's
``cache_salt`` is the tagged key ``("cache_salt", salt)`` of its first page only,
after any ``("lora", name, path)`` and ``("mm", identifier, offset)`` keys. The
pickles below are written out opcode by opcode (protocol 5), so the test does
not depend on radixkv's encoder.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.adapters.vllm import VLLMBlockView
from radixkv.events import BlockRemoved, BlockStored
from radixkv.events.hashing import BlockHasher, external_block_hash, namespace_extra_keys, vllm_extra_keys

from . import vllm_router
from .vllm_router import vllm_hash as _vllm_hash
from .vllm_router import vllm_request_hashes as _vllm_request_hashes


def _pickle5(body: bytes) -> bytes:
    """PROTO 5, one FRAME holding ``body`` (which ends with STOP)."""
    return b"\x80\x05\x95" + struct.pack("<Q", len(body)) + body


def _page(parent: bytes, tokens_ops: bytes, extra_ops: bytes) -> bytes:
    # (parent, tokens, extra): SHORT_BINBYTES 32, MEMOIZE, tokens..., MEMOIZE, extra..., TUPLE3, MEMOIZE, STOP
    return _pickle5(b"C\x20" + parent + b"\x94" + tokens_ops + b"\x94" + extra_ops + b"\x87\x94.")


# sha256 of the pickled str "vllm-none-hash": SHORT_BINUNICODE 14, MEMOIZE, STOP
NONE_HASH = hashlib.sha256(_pickle5(b"\x8c\x0evllm-none-hash\x94.")).digest()
# (("cache_salt", "salt"),): two strs (each memoized), TUPLE2, MEMOIZE, TUPLE1, MEMOIZE
SALT_OPS = b"\x8c\x0acache_salt\x94\x8c\x04salt\x94\x86\x94\x85\x94"


def test_default_seed_and_function_are_vllms():
    hasher = BlockHasher()
    assert (hasher.name, hasher.hash_seed) == ("sha256", "vllm-none-hash")
    assert hasher.none_hash == NONE_HASH == vllm_router.NONE_HASH


def test_first_page_equals_the_hand_built_pickle():
    # four tokens: MARK, BININT1 1, BININT1 2, BININT2 300, BININT 70000, TUPLE; no extra keys: NONE
    tokens_ops = b"(K\x01K\x02M\x2c\x01Jp\x11\x01\x00t"
    expected = hashlib.sha256(_page(NONE_HASH, tokens_ops, b"N")).digest()
    assert BlockHasher().hash_pages([1, 2, 300, 70000, 5], page_size=4) == [expected]
    assert BlockHasher().hash_block_tokens(None, [1, 2, 300, 70000]) == expected


def test_salted_chain_equals_the_hand_built_pickle():
    first = hashlib.sha256(_page(NONE_HASH, b"K\x07K\x08\x86", SALT_OPS)).digest()   # TUPLE2
    second = hashlib.sha256(_page(first, b"K\x18K\x00\x86", b"N")).digest()          # the salt: first page only
    assert BlockHasher().hash_pages([7, 8, 24, 0], page_size=2, namespace="salt") == [first, second]
    assert namespace_extra_keys("salt", 0) == (("cache_salt", "salt"),)
    assert namespace_extra_keys("salt", 1) is None


def test_tokens_past_int32_pickle_as_long1():
    # 2**31 + 5 does not fit BININT: LONG1 with 5 little-endian bytes; three tokens: TUPLE3
    tokens_ops = b"K\x00\x8a\x05" + (2**31 + 5).to_bytes(5, "little") + b"M\xff\xff\x87"
    expected = hashlib.sha256(_page(NONE_HASH, tokens_ops, b"N")).digest()
    assert BlockHasher().hash_pages([0, 2**31 + 5, 65535], page_size=3) == [expected]


def test_extra_keys_follow_vllms_order():
    keys = vllm_extra_keys(0, cache_salt="s", lora=("ad", "/p"), mm=[("img", 3)])
    assert keys == (("lora", "ad", "/p"), ("mm", "img", 3), ("cache_salt", "s"))
    assert vllm_extra_keys(1, cache_salt="s", lora=("ad", "/p")) == (("lora", "ad", "/p"),)
    assert vllm_extra_keys(0, cache_salt="") is None       # vLLM ignores an empty salt
    assert vllm_extra_keys(0) is None
    assert vllm_extra_keys(0, cache_salt="s") == namespace_extra_keys("s", 0)


@settings(max_examples=60, deadline=None)
@given(pages=st.integers(1, 14), page_size=st.integers(1, 20), first_page=st.integers(0, 1),
       namespace=st.sampled_from([None, "", "salt", "cache_salt", ("t", 1), b"\x00"]), parent=st.booleans(),
       values=st.lists(st.sampled_from([0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1]), min_size=1))
def test_bulk_pickle_equals_pickle_dumps(pages, page_size, first_page, namespace, parent, values):
    tokens = np.resize(np.array(values, dtype=np.uint32), (pages, page_size))
    parent_hash = hashlib.sha256(b"parent").digest() if parent else None
    fast = BlockHasher().chain(tokens, parent_hash, first_page, namespace)
    slow, prev = [], parent_hash
    for i, row in enumerate(tokens.tolist()):
        prev = _vllm_hash(prev, row, namespace_extra_keys(namespace, first_page + i))
        slow.append(prev)
    assert fast == slow


def test_a_vllm_router_finds_salted_pages_through_the_view():
    """The defect: a router hashing with vLLM's (("cache_salt", salt),) key found no salted page."""
    cache = PrefixCache(num_blocks=16, page_size=4, enable_events=True)
    tokens = list(range(100, 116))
    admission = cache.admit(tokens, namespace="tenant-a")
    admission.release()
    view = VLLMBlockView(cache)
    router_hashes = _vllm_request_hashes(tokens, 4, cache_salt="tenant-a")
    assert view.block_hashes(tokens, cache_salt="tenant-a") == router_hashes
    assert view.find_longest_cache_hit(router_hashes) == admission.blocks.tolist()
    assert view.find_longest_cache_hit(_vllm_request_hashes(tokens, 4)) == []    # unsalted: not tenant-a's
    [stored] = cache.take_events()
    assert stored.block_hashes == [external_block_hash(h) for h in router_hashes]
    assert stored.extra_keys == [("tenant-a",), None, None, None]                 # untagged, as vLLM publishes
    cache.check()


def test_events_carry_bytes_when_asked():
    cache = PrefixCache(num_blocks=4, page_size=2, enable_events=BlockHasher(use_int_block_hashes=False))
    cache.admit([1, 2, 3, 4]).release()
    [stored] = cache.take_events()
    expected = _vllm_request_hashes([1, 2, 3, 4], 2)
    assert stored == BlockStored(expected, None, [1, 2, 3, 4], 2, None, "GPU", None, None)
    assert cache.evict(2) == 2
    assert [h for e in cache.take_events() if isinstance(e, BlockRemoved) for h in e.block_hashes] == expected
    cache.check()
    with pytest.raises(TypeError, match="use_int_block_hashes"):
        BlockHasher(use_int_block_hashes=1)

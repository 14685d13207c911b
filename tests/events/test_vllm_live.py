"""radixkv against a real vLLM install (the version bench/peers/setup.sh pins: 0.33.0).

Collected only where ``vllm`` is importable (tests/conftest.py): the main suite does
not install vLLM. Run with ``make test-vllm``. vLLM's own functions are the oracle:
its block hasher, extra keys, NONE_HASH seed, hash conversion for events and its
msgspec ``KVEventBatch`` encoder and decoder.
"""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import msgspec
import pytest

from radixkv import PrefixCache
from radixkv.events import AllBlocksCleared, BlockDemoted, BlockRemoved, BlockStored
from radixkv.events.wire import encode_batch, to_vllm_events
from radixkv.events.hashing import BlockHasher, vllm_extra_keys
from radixkv.workload.traces import TraceReader

from ..shared_traces import CONVERSATION
from .test_events_wire import run_prediction


def _vllm():
    """vLLM's modules (this file is collected only where vllm is importable: a failure here is real)."""
    from vllm.distributed import kv_events
    from vllm.utils import hashing
    from vllm.v1.core import kv_cache_utils

    return SimpleNamespace(kcu=kv_cache_utils, hashing=hashing, ev=kv_events)


@pytest.fixture
def vllm(monkeypatch):
    """vLLM's modules with NONE_HASH initialised as a default vLLM does (PYTHONHASHSEED unset, sha256)."""
    v = _vllm()
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    v.kcu.init_none_hash(v.hashing.sha256)
    return v


def _request(tokens, cache_salt=None, lora=None, mm=()):
    """The fields of vllm.v1.request.Request that vLLM's block hasher reads."""
    mm_features = [SimpleNamespace(identifier=ident, mm_position=SimpleNamespace(offset=off, length=length))
                   for ident, off, length in mm]
    lora_request = None if lora is None else SimpleNamespace(lora_name=lora[0], lora_path=lora[1])
    return SimpleNamespace(block_hashes=[], num_tokens=len(tokens), all_token_ids=list(tokens),
                           mm_features=mm_features, lora_request=lora_request, cache_salt=cache_salt,
                           prompt_embeds=None)


def _vllm_hashes(v, tokens, block_size, salt, fn=None):
    hasher = v.kcu.get_request_block_hasher(block_size, fn or v.hashing.sha256)
    return hasher(_request(tokens, salt))


def test_none_hash_and_defaults_are_vllms(vllm):
    assert vllm.kcu.get_none_hash_seed() == BlockHasher().hash_seed
    assert vllm.kcu.NONE_HASH == BlockHasher().none_hash
    assert vllm.hashing.get_hash_fn_by_name(BlockHasher().name) is vllm.hashing.sha256


def test_block_hashes_equal_vllms_for_random_tokens_and_salts(vllm):
    rng = random.Random(14)
    alphabet = "ab-_/ é中\U0001f600"
    for _ in range(200):
        block_size = rng.choice([1, 2, 3, 16, 32])
        tokens = [rng.choice([0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, rng.randrange(2**32)])
                  for _ in range(rng.randrange(0, 6 * block_size + 3))]
        salt = rng.choice([None, "cache_salt", "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 12)))])
        ours = BlockHasher().hash_pages(tokens, block_size, namespace=salt)
        assert ours == _vllm_hashes(vllm, tokens, block_size, salt), (tokens, block_size, salt)


def test_sha256_cbor_with_a_seed_equals_vllms(vllm, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "1234")
    fn = vllm.hashing.sha256_cbor
    vllm.kcu.init_none_hash(fn)
    try:
        tokens = list(range(1000, 1100))
        ours = BlockHasher("sha256_cbor", hash_seed="1234").hash_pages(tokens, 16, namespace="tenant")
        assert ours == _vllm_hashes(vllm, tokens, 16, "tenant", fn)
    finally:
        monkeypatch.delenv("PYTHONHASHSEED")
        vllm.kcu.init_none_hash(vllm.hashing.sha256)


def test_extra_keys_equal_vllms_in_order(vllm):
    request = _request(list(range(64)), cache_salt="s", lora=("ad", "/loras/ad"), mm=[("img", 3, 20), ("aud", 30, 4)])
    for start in (0, 16, 32):
        theirs, _ = vllm.kcu.generate_block_hash_extra_keys(request, start, start + 16, 0)
        mm = [(ident, off - start) for ident, off, length in (("img", 3, 20), ("aud", 30, 4))
              if off < start + 16 and start < off + length]
        assert vllm_extra_keys(start // 16, cache_salt="s", lora=("ad", "/loras/ad"), mm=mm) == theirs
    assert vllm.kcu.generate_block_hash_extra_keys(_request([1, 2], cache_salt=""), 0, 2, 0)[0] is None
    assert vllm_extra_keys(0, cache_salt="") is None


def test_payload_is_byte_identical_to_vllms_encoder(vllm):
    ev = vllm.ev
    h = [bytes([i]) * 32 for i in range(4)]
    ours = [BlockStored([h[0], h[1]], None, [1, 2, 3, 4], 2, None, "GPU", None, [("t",), None]),
            BlockStored([h[2]], h[1], [5, 6], 2, None, "GPU", None, None),
            BlockRemoved([h[2]], "GPU"), BlockDemoted([h[1]], h[0], [3, 4], 2, "CPU", "GPU"),
            BlockRemoved([7], "REMOTE"), AllBlocksCleared()]
    theirs = [ev.BlockStored(block_hashes=[h[0], h[1]], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=2,
                             lora_id=None, medium="GPU", lora_name=None, extra_keys=[("t",), None], group_idx=0),
              ev.BlockStored(block_hashes=[h[2]], parent_block_hash=h[1], token_ids=[5, 6], block_size=2,
                             lora_id=None, medium="GPU", lora_name=None, group_idx=0),
              ev.BlockRemoved(block_hashes=[h[2]], medium="GPU", group_idx=0),
              ev.BlockStored(block_hashes=[h[1]], parent_block_hash=h[0], token_ids=[3, 4], block_size=2,
                             lora_id=None, medium=ev.MEDIUM_CPU, lora_name=None, group_idx=0),
              ev.BlockRemoved(block_hashes=[7], medium=ev.MEDIUM_STORAGE, group_idx=0, locality="REMOTE"),
              ev.AllBlocksCleared()]
    ts = time.time()
    expected = msgspec.msgpack.Encoder().encode(ev.KVEventBatch(ts=ts, events=theirs, data_parallel_rank=0))
    assert encode_batch(ours, ts=ts) == expected
    decoded = msgspec.msgpack.Decoder(type=ev.KVEventBatch).decode(expected)
    assert decoded.events == theirs and len(to_vllm_events(ours)) == len(theirs)


def test_a_router_with_vllms_decoder_and_hasher_predicts_every_hit(vllm):
    """The issue's acceptance test: vLLM's KVEventBatch decoder and block hasher, a Mooncake replay
    with evictions and salts; the router's prediction equals radixkv's hit for every request."""
    decode = msgspec.msgpack.Decoder(type=vllm.ev.KVEventBatch).decode
    convert = vllm.kcu.maybe_convert_block_hash  # vLLM 0.33.0 default: 64-bit ints

    def hashes_of(tokens, block_size, salt):
        return [convert(h) for h in _vllm_hashes(vllm, tokens, block_size, salt)]

    cache = PrefixCache(num_blocks=3000, page_size=32, enable_events=True)
    stats = run_prediction(cache, list(TraceReader(str(CONVERSATION), limit=120)), hashes_of, router_decode=decode)
    assert stats["requests"] == 120
    assert stats["evicted_blocks"] > 3000 and stats["hit_tokens"] > 0 and stats["salted_hit_tokens"] > 0

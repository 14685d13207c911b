"""A KV-aware router written against vLLM 0.33.0's documented formats, for the wire tests.

It hashes requests the way a default vLLM does (``sha256`` over pickle, ``NONE_HASH``
from ``"vllm-none-hash"``, ``("cache_salt", salt)`` on the first block), subscribes
to a ZMQ event stream, fills gaps through the replay socket, keeps the set of hashes
each medium holds, and predicts a request's hit as the longest cached prefix of its
block hashes. The decoder (msgspec structs with vLLM's field names, order and
defaults) is a parameter, so the live test can pass vLLM's own ``KVEventBatch``.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

import msgspec
import zmq

NONE_HASH = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL)).digest()
END_SEQ = -1


def vllm_hash(parent: Optional[bytes], tokens, extra=None) -> bytes:
    """vLLM's hash_block_tokens with its default sha256 (pickle, HIGHEST_PROTOCOL)."""
    obj = (parent or NONE_HASH, tuple(tokens), extra)
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def vllm_request_hashes(tokens, block_size: int, cache_salt: Optional[str] = None) -> List[bytes]:
    """vLLM's request block hasher: full blocks only, the (non-empty) salt on the first block."""
    tokens = list(tokens)
    out: List[bytes] = []
    parent = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        extra = (("cache_salt", cache_salt),) if start == 0 and cache_salt else None
        parent = vllm_hash(parent, tokens[start:start + block_size], extra)
        out.append(parent)
    return out


def int_hash(block_hash: bytes) -> int:
    """vLLM's maybe_convert_block_hash with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1."""
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)


# ---------------------------------------------------------------- vLLM's wire structs, as documented
Hash = Union[bytes, int]


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: List[Hash]
    parent_block_hash: Optional[Hash]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[List[Optional[Tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None
    session_id: Optional[str] = None
    lookahead_token_ids: Optional[List[List[int]]] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: List[Hash]
    medium: Optional[str]
    group_idx: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: List[Union[BlockStored, BlockRemoved, AllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


decode_documented = msgspec.msgpack.Decoder(type=KVEventBatch).decode


class Router:
    """Subscriber + prefix index of one publisher. ``cached[(medium, locality)]`` is a set of hashes."""

    def __init__(self, endpoint: str, replay_endpoint: str, decode: Callable[[bytes], Any] = decode_documented,
                 topic: str = "") -> None:
        ctx = zmq.Context.instance()
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sub.connect(endpoint)
        self.replay = ctx.socket(zmq.DEALER)
        self.replay.connect(replay_endpoint)
        self.decode = decode
        self.next_seq = 0
        self.replays = 0
        self.cached: Dict[Tuple[Optional[str], Optional[str]], Set[Hash]] = {}
        self.batches: List[Any] = []

    def close(self) -> None:
        self.sub.close(linger=0)
        self.replay.close(linger=0)

    def sync(self, upto: int, timeout_ms: int = 10_000) -> None:
        """Apply every batch up to sequence number ``upto``, replaying what the SUB socket missed."""
        waited = 0
        while self.next_seq <= upto:
            if self.sub.poll(100):
                _topic, seq_bytes, payload = self.sub.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big")
                if seq > self.next_seq:
                    self._replay_from(self.next_seq)
                if seq == self.next_seq:
                    self._apply(payload)
                continue
            waited += 100
            assert waited < timeout_ms, f"no batch {self.next_seq} within {timeout_ms} ms"
            self._replay_from(self.next_seq)  # the slow-joiner case: the SUB socket connected late

    def _replay_from(self, start: int) -> None:
        self.replays += 1
        self.replay.send_multipart((b"", start.to_bytes(8, "big")))
        while True:
            assert self.replay.poll(5000), "replay socket did not answer"
            _, _topic, seq_bytes, payload = self.replay.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == END_SEQ:
                return
            if seq == self.next_seq:
                self._apply(payload)

    def _apply(self, payload: bytes) -> None:
        batch = self.decode(payload)
        self.batches.append(batch)
        self.next_seq += 1
        for event in batch.events:
            kind = type(event).__name__
            if kind == "AllBlocksCleared":
                self.cached.clear()
                continue
            where = self.cached.setdefault((event.medium, event.locality), set())
            if kind == "BlockStored":
                if event.medium == "GPU":  # HBM holds whole prefixes: a page's parent is there first
                    assert event.parent_block_hash is None or event.parent_block_hash in where, "orphan page"
                where.update(event.block_hashes)
            else:
                assert kind == "BlockRemoved", kind
                where.difference_update(event.block_hashes)

    def hit_blocks(self, hashes: List[Hash], medium: Tuple[Optional[str], Optional[str]] = ("GPU", None)) -> int:
        """Blocks of the longest prefix of ``hashes`` cached on ``medium``."""
        have = self.cached.get(medium, set())
        n = 0
        for h in hashes:
            if h not in have:
                break
            n += 1
        return n


def msgpack_float(value: float) -> bytes:
    """msgpack float 64 (0xcb, big-endian IEEE 754)."""
    return b"\xcb" + struct.pack(">d", value)

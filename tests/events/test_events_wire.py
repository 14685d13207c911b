"""KV events on the wire: vLLM 0.33.0's ZMQ publisher format, and a router that predicts every hit.

The router (tests/events/vllm_router.py) knows nothing of radixkv: it decodes with msgspec
structs written from vLLM's documented fields and hashes requests with vLLM's
documented formula. tests/events/test_vllm_live.py repeats the prediction with vLLM's own
decoder and hash functions where vLLM is installed.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from radixkv import PrefixCache
from radixkv import events as rk_events
from radixkv.events import AllBlocksCleared, BlockDemoted, BlockPromoted, BlockRemoved, BlockStored
from radixkv.events.wire import ZmqEventPublisher, encode_batch, publish_from, to_vllm_events
from radixkv.events.hashing import BlockHasher
from radixkv.workload.traces import TraceReader

from ..shared_traces import CONVERSATION
from .vllm_router import Router, decode_documented, int_hash, msgpack_float, vllm_request_hashes

SALTS = (None, "tenant-a", "tenant-b")


def _salt_of(tokens: np.ndarray) -> object:
    """A tenant per conversation: Mooncake's second 512-token block names the conversation."""
    return SALTS[int(tokens[512]) // 512 % 3] if len(tokens) > 512 else None


# ---------------------------------------------------------------- the payload, byte by byte
def test_a_batch_is_vllms_array_of_ts_tagged_maps_and_rank():
    events = [AllBlocksCleared(), BlockRemoved([7, 300], "GPU"), BlockStored([11], None, [1, 2], 2)]
    payload = encode_batch(events, ts=1.5, data_parallel_rank=2)
    removed = (b"\x84\xa4type\xacBlockRemoved\xacblock_hashes\x92\x07\xcd\x01\x2c"
               b"\xa6medium\xa3GPU\xa9group_idx\x00")
    # BlockStored: 15 fields + tag could overflow a fixmap, so msgspec (and vLLM) write map16 with the count, 9
    stored = (b"\xde\x00\x09\xa4type\xabBlockStored\xacblock_hashes\x91\x0b\xb1parent_block_hash\xc0"
              b"\xa9token_ids\x92\x01\x02\xaablock_size\x02\xa7lora_id\xc0\xa6medium\xa3GPU"
              b"\xa9lora_name\xc0\xa9group_idx\x00")
    assert payload == (b"\x93" + msgpack_float(1.5) + b"\x93" + b"\x81\xa4type\xb0AllBlocksCleared"
                       + removed + stored + b"\x02")


def test_block_stored_has_vllms_fields_in_order_and_decodes_as_vllms_struct():
    stored = BlockStored([11, 12], None, [1, 2, 3, 4], 2, None, "GPU", None, [("tenant",), None])
    [wire] = to_vllm_events([stored])
    assert list(wire) == ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                          "medium", "lora_name", "extra_keys", "group_idx"]
    batch = decode_documented(encode_batch([stored], ts=3.0))
    assert batch.ts == 3.0 and batch.data_parallel_rank == 0
    [event] = batch.events
    assert type(event).__name__ == "BlockStored"
    assert (event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size) == ([11, 12], None,
                                                                                               [1, 2, 3, 4], 2)
    assert (event.medium, event.extra_keys, event.group_idx, event.locality) == ("GPU", [("tenant",), None], 0, None)
    # no extra keys: the field is left out, as msgspec's omit_defaults does
    assert "extra_keys" not in to_vllm_events([BlockStored([1], 5, [1, 2], 2)])[0]


def test_tier_moves_become_vllms_offloading_events():
    demoted = BlockDemoted([5, 6], 4, [1, 2, 3, 4], 2, "CPU", "GPU")
    promoted = BlockPromoted([6], 5, [3, 4], 2, "GPU", "REMOTE")
    wire = to_vllm_events([demoted, promoted])
    assert [(w["type"], w["medium"], w.get("locality"), w["block_hashes"]) for w in wire] == [
        ("BlockStored", "CPU", None, [5, 6]), ("BlockRemoved", "STORAGE", "REMOTE", [6])]
    assert to_vllm_events([promoted], exclusive_tiers=False) == []
    assert to_vllm_events([BlockRemoved([1], "DISK")])[0]["locality"] == "LOCAL"


def test_hash_forms_and_bad_events():
    full = bytes(range(32))
    assert to_vllm_events([BlockRemoved([full])])[0]["block_hashes"] == [full]
    assert to_vllm_events([BlockRemoved([full])], use_int_block_hashes=True)[0]["block_hashes"] == [int_hash(full)]
    with pytest.raises(ValueError, match="use_int_block_hashes"):
        to_vllm_events([BlockRemoved([3])], use_int_block_hashes=False)
    with pytest.raises(TypeError, match="KV event"):
        to_vllm_events(["BlockStored"])
    with pytest.raises(TypeError, match="hashes"):
        to_vllm_events([BlockRemoved([1.5])])
    with pytest.raises(TypeError, match="medium"):
        to_vllm_events([BlockRemoved([1], 3)])
    # a medium of another name (a tier "nvme" reports "NVME") is sent as itself, no locality
    assert [(w["medium"], w.get("locality")) for w in to_vllm_events([BlockRemoved([1], "NVME")])] == [("NVME", None)]


# ---------------------------------------------------------------- the sockets
def _publisher(**kwargs) -> ZmqEventPublisher:
    return ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", **kwargs)


def test_pub_frames_and_replay_from_a_sequence_number():
    with _publisher(topic="kv", buffer_steps=3) as pub:
        assert rk_events.ZmqEventPublisher is ZmqEventPublisher
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(pub.endpoint)
        time.sleep(0.3)  # let the subscription reach the PUB socket
        assert pub.publish([]) is None                              # an empty step sends nothing
        seqs = [pub.publish([BlockRemoved([i])], ts=float(i)) for i in range(5)]
        assert seqs == [0, 1, 2, 3, 4]
        for i in range(5):
            assert sub.poll(5000)
            topic, seq, payload = sub.recv_multipart()
            assert (topic, seq) == (b"kv", i.to_bytes(8, "big"))
            assert decode_documented(payload).events[0].block_hashes == [i]
        sub.close(linger=0)
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.connect(pub.replay_endpoint)
        dealer.send_multipart((b"", (1).to_bytes(8, "big")))
        got = []
        while True:
            assert dealer.poll(5000)
            _, topic, seq, payload = dealer.recv_multipart()
            if seq == (-1).to_bytes(8, "big", signed=True):
                assert (topic, payload) == (b"", b"")
                break
            got.append((topic, int.from_bytes(seq, "big"), decode_documented(payload).ts))
        assert got == [(b"kv", 2, 2.0), (b"kv", 3, 3.0), (b"kv", 4, 4.0)]  # buffer_steps=3 keeps the last three
        dealer.close(linger=0)
    with pytest.raises(ValueError, match="closed"):
        pub.publish([AllBlocksCleared()])


def test_publisher_rejects_bad_arguments_and_events_before_sending():
    with pytest.raises(TypeError, match="endpoint"):
        ZmqEventPublisher(5557)
    with pytest.raises(ValueError, match="buffer_steps"):
        ZmqEventPublisher("tcp://127.0.0.1:*", buffer_steps=0)
    with _publisher() as pub:
        with pytest.raises(TypeError, match="KV event"):
            pub.publish([object()])
        assert pub.publish([AllBlocksCleared()]) == 0               # the bad batch used no sequence number
    with pytest.raises(ValueError, match="enable_events"):
        publish_from(PrefixCache(4, page_size=2), pub)


# ---------------------------------------------------------------- the router predicts every hit
def run_prediction(cache: PrefixCache, requests, hashes_of, router_decode=decode_documented) -> dict:
    """Replay ``requests`` through ``cache`` publishing after each; a router predicts each hit first.

    ``hashes_of(tokens, block_size, salt)`` are the router's block hashes (in the events' form).
    Returns counts for the caller's assertions.
    """
    page_size = cache.page_size
    stats = {"requests": 0, "hit_tokens": 0, "salted_hit_tokens": 0}
    with _publisher() as pub:
        router = Router(pub.endpoint, pub.replay_endpoint, router_decode)
        try:
            for request in requests:
                salt = _salt_of(request.tokens)
                tokens = request.tokens.tolist()
                predicted = router.hit_blocks(hashes_of(tokens, page_size, salt)) * page_size
                admission = cache.admit(request.tokens, namespace=salt)
                admission.release()
                assert admission.hit_tokens == predicted, f"request {stats['requests']}"
                stats["requests"] += 1
                stats["hit_tokens"] += predicted
                stats["salted_hit_tokens"] += predicted if salt else 0
                seq = publish_from(cache, pub)
                if seq is not None:
                    router.sync(seq)
            cache.check()
            index = cache.page_hashes  # every cached page, by full hash
            as_events = cache.event_log.hasher.event_hashes(list(index))
            assert router.cached[("GPU", None)] == set(as_events)
            stats["replays"] = router.replays
        finally:
            router.close()
    stats["evicted_blocks"] = cache.evicted_blocks
    return stats


@pytest.mark.parametrize("use_int", [True, False])
def test_a_vllm_router_predicts_every_hit_on_a_mooncake_replay(use_int):
    requests = list(TraceReader(str(CONVERSATION), limit=120))
    cache = PrefixCache(num_blocks=3000, page_size=32, enable_events=BlockHasher(use_int_block_hashes=use_int))

    def hashes_of(tokens, block_size, salt):
        hashes = vllm_request_hashes(tokens, block_size, salt)
        return [int_hash(h) for h in hashes] if use_int else hashes

    stats = run_prediction(cache, requests, hashes_of)
    assert stats["requests"] == 120
    assert stats["evicted_blocks"] > 3000 and stats["hit_tokens"] > 0 and stats["salted_hit_tokens"] > 0


# ---------------------------------------------------------------- radixkv replay --kv-events-endpoint
def _cli_batches(monkeypatch, *args):
    """Run ``radixkv replay --json ARGS`` with events on; return (its JSON, one payload or None per request)."""
    import json

    from click.testing import CliRunner

    from radixkv.cli import main

    payloads = []
    original = ZmqEventPublisher.publish

    def recording(self, events, **kwargs):
        events = list(events)
        payloads.append(encode_batch(events, ts=0.0, exclusive_tiers=self.exclusive_tiers) if events else None)
        return original(self, events, **kwargs)

    monkeypatch.setattr(ZmqEventPublisher, "publish", recording)
    result = CliRunner().invoke(main, ["replay", str(CONVERSATION), "--json", "--quiet", "--page-size", "32",
                                       "--kv-events-endpoint", "tcp://127.0.0.1:*",
                                       "--kv-events-replay-endpoint", "tcp://127.0.0.1:*", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1]), payloads


def test_replay_cli_publishes_a_batch_per_request_that_predicts_its_hits(monkeypatch):
    out, payloads = _cli_batches(monkeypatch, "--limit", "60", "--num-blocks", "2000")
    requests = list(TraceReader(str(CONVERSATION), limit=60))
    assert len(payloads) == out["requests"] == 60 and out["evicted_blocks"] > 0
    cached, predicted = set(), 0
    for request, payload in zip(requests, payloads):
        hashes = [int_hash(h) for h in vllm_request_hashes(request.tokens.tolist(), 32)]
        n = 0
        while n < len(hashes) and hashes[n] in cached:
            n += 1
        predicted += n * 32
        for event in decode_documented(payload).events if payload else []:
            if type(event).__name__ == "BlockStored":
                cached.update(event.block_hashes)
            else:
                cached.difference_update(event.block_hashes)
    assert predicted == out["hit_tokens"] > 0


def test_replay_cli_publishes_host_tier_residency_and_refuses_bad_flags(monkeypatch):
    _, payloads = _cli_batches(monkeypatch, "--limit", "40", "--num-blocks", "600", "--host-blocks", "2000")
    media = {(e.medium, type(e).__name__) for p in payloads if p for e in decode_documented(p).events}
    assert {("GPU", "BlockStored"), ("GPU", "BlockRemoved"), ("CPU", "BlockStored")} <= media
    from click.testing import CliRunner

    from radixkv.cli import main

    base = ["replay", str(CONVERSATION), "--num-blocks", "10", "--limit", "1"]
    result = CliRunner().invoke(main, base + ["--kv-events-replay-endpoint", "tcp://127.0.0.1:*"])
    assert result.exit_code == 2 and "--kv-events-endpoint" in result.output
    result = CliRunner().invoke(main, base + ["--kv-events-endpoint", "nonsense"])
    assert result.exit_code == 2 and "ZMQ endpoint" in result.output

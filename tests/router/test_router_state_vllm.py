"""The router's state machine (tests/router/router_machine.py) over vLLM 0.33.0's own ZmqEventPublisher.

Collected only where vLLM is importable (tests/conftest.py); ``make test-vllm`` runs it. The
engine's events are handed to vLLM's publisher as vLLM's own ``KVEventBatch`` (decoded from
radixkv's encoding with vLLM's struct), so every byte on the wire, the numbering and the replay
ring are vLLM's.
"""

from __future__ import annotations

import msgspec
from radixkv.events.wire import encode_batch

from .router_machine import state_machine_test


class VllmPublisher:
    def __init__(self, endpoint: str, replay_endpoint: str) -> None:
        from vllm.distributed import kv_events

        self.decode = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch).decode
        self.pub = kv_events.ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay_endpoint)
        self.next_seq = 0

    def publish(self, cache):
        events = cache.take_events()
        if not events:  # as vLLM's scheduler: an empty step publishes nothing
            return None
        self.pub.publish(self.decode(encode_batch(events)))
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        return seq

    def close(self) -> None:
        self.pub.shutdown()


TestRouterOverVllmsPublisher = state_machine_test(VllmPublisher)

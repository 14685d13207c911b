"""The router's state machine (tests/router/router_machine.py) over radixkv's ZmqEventPublisher."""

from __future__ import annotations

from radixkv.events.wire import ZmqEventPublisher, publish_from

from .router_machine import state_machine_test


class RadixkvPublisher:
    def __init__(self, endpoint: str, replay_endpoint: str) -> None:
        self.pub = ZmqEventPublisher(endpoint, replay_endpoint=replay_endpoint)

    def publish(self, cache):
        return publish_from(cache, self.pub)

    def close(self) -> None:
        self.pub.close()


TestRouterOverRadixkvsPublisher = state_machine_test(RadixkvPublisher)

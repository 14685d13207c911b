"""The router's state machine (tests/router/router_machine.py) over radixkv's ZmqEventPublisher."""

from __future__ import annotations

from hypothesis import settings

from radixkv.events.wire import ZmqEventPublisher, publish_from

from .router_machine import RouterMachine


class RadixkvPublisher:
    def __init__(self, endpoint: str, replay_endpoint: str) -> None:
        self.pub = ZmqEventPublisher(endpoint, replay_endpoint=replay_endpoint)

    def publish(self, cache):
        return publish_from(cache, self.pub)

    def close(self) -> None:
        self.pub.close()


class RadixkvRouterMachine(RouterMachine):
    make_publisher = staticmethod(RadixkvPublisher)


TestRouterOverRadixkvsPublisher = RadixkvRouterMachine.TestCase
TestRouterOverRadixkvsPublisher.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)

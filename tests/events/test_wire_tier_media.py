"""Every medium a tier produces goes out on the wire, and a publish that fails loses no event.

A tier named anything but host, remote or disk (a second host-like tier ``"ssd"``, which a
cost model with a path for it accepts) reports its pages on medium ``"SSD"``. Its events must
encode as vLLM's (whose ``medium`` is an optional str) and decode with vLLM's documented
structs. And :func:`publish_from` must take a step's events from the log only once they are
sent: a publish raising mid-way (a bad event, a failed hand-off to the sender) leaves all of
them, the GPU ones included, for the next publish, which sends them exactly once.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from radixkv.costs import DEFAULT_HARDWARE, DEFAULT_MODEL, CostModel, get_hardware, get_model
from radixkv.events import wire
from radixkv.events.wire import encode_batch, publish_from, to_vllm_events
from radixkv.tiers import HostTier, TieredCache
from radixkv.tiers.tiered import TIER_PATHS

from .test_events_wire import _publisher
from .vllm_router import Router, decode_documented

PS = 2


def ssd_cache() -> TieredCache:
    """HBM of 4 pages over a 2-page host tier over an 8-page host-like tier named ``"ssd"``."""
    cost = CostModel(get_model(DEFAULT_MODEL), get_hardware(DEFAULT_HARDWARE), PS,
                     tier_paths={**TIER_PATHS, "ssd": ("pcie",)})
    return TieredCache(4, PS, tiers=[HostTier(2), HostTier(8, name="ssd")], cost_model=cost,
                       load_back="always", enable_events=True)


def one_step(cache: TieredCache) -> None:
    """Pages demoted to the host, cascaded to the ssd tier, and loaded back from both."""
    first, second = list(range(4 * PS)), list(range(100, 100 + 4 * PS))
    cache.admit(first).release()
    cache.admit(second).release()  # first's 4 pages: 2 stay on the host, 2 cascade to the ssd tier
    cache.admit(first).release()  # loaded back from both (second goes down in turn)
    cache.check()


def test_an_ssd_tiers_events_encode_and_decode_as_vllms():
    cache = ssd_cache()
    one_step(cache)
    events = cache.take_events()
    assert {e.medium for e in events} >= {"GPU", "CPU", "SSD"}
    wire_events = to_vllm_events(events)
    with _publisher() as pub:
        router = Router(pub.endpoint, pub.replay_endpoint)  # decodes with vLLM's documented structs
        try:
            router.sync(pub.publish(events))
        finally:
            router.close()
    [batch] = router.batches
    assert [(type(e).__name__, e.medium, e.locality, e.block_hashes) for e in batch.events] == [
        (w["type"], w["medium"], w.get("locality"), w["block_hashes"]) for w in wire_events]
    kinds = {(type(e).__name__, e.medium, e.locality) for e in batch.events}
    assert {("BlockStored", "SSD", None), ("BlockRemoved", "SSD", None)} <= kinds
    pages = cache.tier_stats().pages_by_tier  # the router's view per medium is the tiers' residency
    held = router.cached
    assert len(held[("SSD", None)]) == pages["ssd"] > 0 and len(held[("CPU", None)]) == pages["host"]
    assert len(held[("GPU", None)]) == len(cache.page_hashes)


def _fail_once(monkeypatch, owner: Any, name: str, exc: BaseException, after: int = 0) -> None:
    """Make ``owner.name`` raise ``exc`` at its call ``after + 1``, once; the other calls go through."""
    real: Callable[..., Any] = getattr(owner, name)
    calls = [0]

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == after + 1:
            raise exc
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, failing)


@pytest.mark.parametrize("failure", ["encoding", "hand-off"])
def test_a_publish_failing_midway_keeps_the_steps_events_for_the_retry(monkeypatch, failure):
    cache, twin = ssd_cache(), ssd_cache()
    one_step(cache)
    one_step(twin)
    expected = twin.take_events()  # the same step on a twin: the events the retry must send
    assert {e.medium for e in expected} >= {"GPU", "SSD"}
    with _publisher() as pub:
        router = Router(pub.endpoint, pub.replay_endpoint)
        try:
            if failure == "encoding":  # the second BlockRemoved of the batch fails to encode
                _fail_once(monkeypatch, wire, "_removed", ValueError("injected"), after=1)
            else:  # the encoded batch cannot be handed to the sender thread
                _fail_once(monkeypatch, pub._queue, "put", OSError("injected"))
            with pytest.raises((ValueError, OSError), match="injected"):
                publish_from(cache, pub)
            assert len(cache.event_log) == len(expected), "a failed publish took events from the log"
            seq = publish_from(cache, pub)
            assert seq == 0  # the failed publish used no sequence number: no gap to replay
            router.sync(seq)
            assert publish_from(cache, pub) is None  # sent once: nothing left
            [batch] = router.batches
            assert batch.events == decode_documented(encode_batch(expected, ts=batch.ts)).events
        finally:
            router.close()

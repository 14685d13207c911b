"""Faults inside the tier stack cost recomputes, never an exception out of the cache or a broken stack.

A tier whose ``read`` / ``write`` raises, and a remote backend whose ``get`` / ``put`` / ``delete``
raise or answer out of contract (``None``, a short list, wrong types, wrong bytes), fail that one
call: its pages are dropped or missed, counted, warned once; ``check()`` passes and every page
served is the page written for its prefix.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from radixkv.tiers import HostTier, RemoteTier, SimulatedHosts, TieredCache

from .test_tiers_payload import KV, PS
from .test_tiers_payload import admit_and_verify as serve  # checks every hit page's bytes


class RaisingHost(HostTier):
    """A host tier whose ``read`` / ``write`` raise while their name is in ``failing``."""

    def __init__(self, num_blocks: int, name: str = "host") -> None:
        super().__init__(num_blocks, name=name)
        self.failing: set = set()

    def write(self, slots, pages):
        if "write" in self.failing:
            raise RuntimeError("tier bug in write")
        return super().write(slots, pages)

    def read(self, slots):
        if "read" in self.failing:
            raise RuntimeError("tier bug in read")
        return super().read(slots)


class Garbage(SimulatedHosts):
    """Simulated hosts whose ``get`` / ``put`` answer ``answers[op]`` instead of the truth."""

    def __init__(self, num_hosts: int) -> None:
        super().__init__(num_hosts)
        self.answers: dict = {}

    def put(self, host, slots, values):
        super().put(host, slots, values)
        return self.answers["put"](slots) if "put" in self.answers else None

    def get(self, host, slots):
        values = super().get(host, slots)
        return self.answers["get"](values) if "get" in self.answers else values


def test_a_tier_write_raising_during_a_cascade_drops_the_pages_and_leaves_the_stack_whole():
    host, lower = HostTier(2), RaisingHost(8, name="remote")
    cache = TieredCache(2, page_size=PS, kv_shape=KV, tiers=[host, lower], load_back="always")
    serve(cache, [1, 1, 2, 2])
    serve(cache, [3, 3, 4, 4])          # [1,1,2,2] demoted to the host
    lower.failing = {"write"}
    with pytest.warns(RuntimeWarning, match="write failed"):
        serve(cache, [5, 5, 6, 6])      # the host cascades [1,1,2,2] down: that write raises
    cache.check()
    stats = cache.tier_stats()
    assert stats.tier_errors == 1 and stats.dropped_pages == 2
    assert stats.pages_by_tier == {"host": 2, "remote": 0}
    lower.failing = set()
    assert serve(cache, [1, 1, 2, 2]) == 0  # dropped: recomputed, not served from anywhere
    assert serve(cache, [3, 3, 4, 4]) == 2 * PS  # the host's pages still serve
    cache.check()


def test_a_tier_read_raising_on_load_is_a_counted_miss():
    host = RaisingHost(4)
    cache = TieredCache(2, page_size=PS, kv_shape=KV, tiers=[host], load_back="always")
    serve(cache, [1, 1, 2, 2])
    serve(cache, [3, 3, 4, 4])
    host.failing = {"read"}
    with pytest.warns(RuntimeWarning, match="read failed"):
        assert serve(cache, [1, 1, 2, 2]) == 0
    cache.check()
    assert cache.tier_stats().tier_errors == 1 and cache.tier_stats().integrity_misses == 2


@pytest.mark.parametrize("op, answer", [
    ("get", lambda values: None),
    ("get", lambda values: values[:-1]),
    ("get", lambda values: [7] * len(values)),
    ("get", lambda values: "not a list"),
    ("put", lambda slots: [True] * (len(slots) - 1)),
    ("put", lambda slots: ["yes"] * len(slots)),
    ("put", lambda slots: 3),
])
def test_a_backend_answering_out_of_contract_is_a_counted_backend_error(op, answer):
    backend = Garbage(1)
    tier = RemoteTier(8, backend=backend)
    cache = TieredCache(2, page_size=PS, kv_shape=KV, tiers=[tier], load_back="always")
    serve(cache, [1, 2, 3, 4])
    backend.answers[op] = answer
    with pytest.warns(RuntimeWarning, match=f"backend {op}"):
        serve(cache, [5, 6, 7, 8])      # demotes [1,2,3,4]: a put
        served = serve(cache, [1, 2, 3, 4])  # loads it back: a get
    cache.check()
    assert served == 0 and tier.backend_errors >= 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # later failures are counted, not warned again
        serve(cache, [9, 9, 9, 9])
        serve(cache, [5, 6, 7, 8])
    cache.check()


def test_a_backend_returning_wrong_bytes_is_an_integrity_miss():
    backend = Garbage(1)
    cache = TieredCache(2, page_size=PS, kv_shape=KV, tiers=[RemoteTier(8, backend=backend)], load_back="always")
    serve(cache, [1, 2, 3, 4])
    serve(cache, [5, 6, 7, 8])
    backend.answers["get"] = lambda values: [None if v is None else bytes(len(v)) for v in values]
    assert serve(cache, [1, 2, 3, 4]) == 0
    assert cache.tier_stats().integrity_misses == 2
    cache.check()

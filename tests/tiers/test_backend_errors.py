"""A remote backend that raises (a bug, a server error) costs misses: no exception out of the cache,
no half-made eviction or release, never wrong KV."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.tiers import RemoteTier, SimulatedHosts, TieredCache

from .test_tiers_payload import KV, PS, page_value
from .test_tiers_payload import admit_and_verify as serve  # checks every hit page's bytes


class Flaky(SimulatedHosts):
    """Simulated hosts whose calls raise while ``failing`` holds the operation's name."""

    def __init__(self, num_hosts: int) -> None:
        super().__init__(num_hosts)
        self.failing: set = set()

    def put(self, host, slots, values):
        if "put" in self.failing:
            raise RuntimeError("backend bug in put")
        return super().put(host, slots, values)

    def get(self, host, slots):
        if "get" in self.failing:
            raise RuntimeError("backend bug in get")
        return super().get(host, slots)

    def delete(self, host, slots):
        if "delete" in self.failing:
            raise RuntimeError("backend bug in delete")
        return super().delete(host, slots)


def test_a_write_that_raises_drops_the_page_and_warns_once():
    backend = Flaky(1)
    tier = RemoteTier(8, backend=backend)
    cache = TieredCache(2, page_size=PS, kv_shape=KV, tiers=[tier], load_back="always")
    serve(cache, [1, 2, 3, 4])
    backend.failing = {"put"}
    with pytest.warns(RuntimeWarning, match="backend put failed"):
        serve(cache, [5, 6, 7, 8])  # evicts [1,2,3,4] from HBM: the demotion's write raises
    cache.check()
    assert tier.backend_errors == 1 and isinstance(tier.last_backend_error, RuntimeError)
    assert cache._stack.dropped_pages == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second failure is counted, not warned again
        serve(cache, [9, 9, 9, 9])
    assert tier.backend_errors == 2
    backend.failing = set()
    assert serve(cache, [1, 2, 3, 4]) == 0  # dropped: recomputed, not served from anywhere
    cache.check()


def test_a_release_whose_copy_down_raises_still_releases():
    backend = Flaky(1)
    cache = TieredCache(8, page_size=PS, kv_shape=KV, tiers=[RemoteTier(8, backend=backend)],
                        write_policy="write_through")
    adm = cache.admit([1, 2, 3, 4])
    cache.write(adm.new_blocks, np.stack([page_value([1, 2, 3, 4], i) for i in range(2)]))
    backend.failing = {"put"}
    with pytest.warns(RuntimeWarning):
        adm.release()
    assert adm.released and cache.protected_blocks == 0
    cache.check()
    adm.release()  # idempotent
    cache.check()


@settings(max_examples=60, deadline=None)
@given(write_policy=st.sampled_from(["write_back", "write_through", "write_through_selective"]),
       load_back=st.sampled_from(["always", "cost"]),
       steps=st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=2, max_size=10),
                                st.sets(st.sampled_from(["put", "get", "delete"]))), min_size=1, max_size=30))
def test_failing_backend_calls_never_raise_or_serve_wrong_kv(write_policy, load_back, steps):
    backend = Flaky(2)
    cache = TieredCache(4, page_size=PS, kv_shape=KV, tiers=[RemoteTier(3, backend=backend)],
                        write_policy=write_policy, write_through_threshold=1, load_back=load_back)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for tokens, failing in steps:
            backend.failing = failing
            serve(cache, tokens)
            cache.check()
            assert cache.protected_blocks == 0 and cache.num_held_blocks == 0

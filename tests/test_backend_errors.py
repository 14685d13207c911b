"""A remote backend that raises (a bug, a server error) costs misses: no exception out of the cache,
no half-made eviction or release, never wrong KV."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.tiers import RemoteTier, SimulatedHosts, TieredCache


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


def kv(tokens, page_size=2):
    """The KV a page of ``tokens`` must hold: a function of its whole prefix."""
    tokens = [int(t) for t in tokens]
    pages = len(tokens) // page_size
    code = [sum((t + 1) * 11 ** i for i, t in enumerate(tokens[: (p + 1) * page_size])) for p in range(pages)]
    return np.array([[float(c)] * page_size for c in code], dtype=np.float64)[..., None]  # exact: distinct


def serve(cache, tokens):
    """Admit, check every hit page's KV, write the new pages' KV, release."""
    adm = cache.admit(tokens)
    want = kv(tokens)
    hit = adm.hit_tokens // cache.page_size
    if hit:
        np.testing.assert_array_equal(cache.read(adm.blocks[:hit]), want[:hit])
    if len(adm.new_blocks):
        cache.write(adm.new_blocks, want[hit: hit + len(adm.new_blocks)])
    adm.release()
    return adm.hit_tokens


def test_a_write_that_raises_drops_the_page_and_warns_once():
    backend = Flaky(1)
    tier = RemoteTier(8, backend=backend)
    cache = TieredCache(2, page_size=2, kv_shape=(1,), dtype="float64", tiers=[tier], load_back="always")
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
    cache = TieredCache(8, page_size=2, kv_shape=(1,), dtype="float64", tiers=[RemoteTier(8, backend=backend)],
                        write_policy="write_through")
    adm = cache.admit([1, 2, 3, 4])
    cache.write(adm.new_blocks, kv([1, 2, 3, 4]))
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
    cache = TieredCache(4, page_size=2, kv_shape=(1,), dtype="float64", tiers=[RemoteTier(3, backend=backend)],
                        write_policy=write_policy, write_through_threshold=1, load_back=load_back)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for tokens, failing in steps:
            backend.failing = failing
            serve(cache, tokens)
            cache.check()
            assert cache.protected_blocks == 0 and cache.num_held_blocks == 0

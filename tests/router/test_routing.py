"""KVRouter: the instance for a request from the index's overlap, weighted by medium, and the router's own load."""

from __future__ import annotations

import pytest

from radixkv import PrefixCache
from radixkv.errors import ArgumentTypeError, ArgumentValueError
from radixkv.events import BlockStored
from radixkv.events.wire import encode_batch
from radixkv.router import KVIndex, KVRouter

TOKENS = list(range(64))


def store(index, instance, seq, hashes, medium="GPU"):
    index.apply(instance, seq, encode_batch([BlockStored(list(hashes), None, [0] * len(hashes), 16, medium=medium)]))


def test_the_router_finds_the_pages_a_cache_published_under_its_salt():
    cache = PrefixCache(num_blocks=64, page_size=16, enable_events=True)
    cache.admit(TOKENS, namespace="tenant").release()
    index = KVIndex()
    index.apply("b", 0, encode_batch(cache.take_events()))
    router = KVRouter(index, ["a", "b"], page_size=16)
    route = router.route(TOKENS + [1, 2], cache_salt="tenant")
    assert (route.instance, route.overlap_pages, route.weighted_overlap, route.num_pages) == ("b", 4, 4.0, 4)
    assert router.route(TOKENS, cache_salt=None).overlap_pages == 0      # another salt: other hashes
    assert router.in_flight == {"a": 1, "b": 1}


def test_an_hbm_prefix_beats_a_longer_host_one_by_weight():
    index = KVIndex()
    router = KVRouter(index, ["a", "b"], page_size=16, medium_weights={"GPU": 1.0, "CPU": 0.25})
    hashes = router.block_hashes(TOKENS)
    store(index, "a", 0, hashes[:3])
    store(index, "b", 0, hashes, "CPU")
    route = router.route(TOKENS)
    assert (route.instance, route.overlap_pages, route.weighted_overlap) == ("a", 3, 3.0)
    router2 = KVRouter(index, ["a", "b"], page_size=16, medium_weights={"GPU": 1.0, "CPU": 0.9})
    assert router2.route(TOKENS).instance == "b"


def test_load_bound_and_in_flight_tie_break():
    index = KVIndex()
    router = KVRouter(index, ["a", "b", "c"], page_size=16, balance=0.0)
    hashes = router.block_hashes(TOKENS)
    store(index, "a", 0, hashes)
    assert router.route(TOKENS).instance == "a"                       # the prefix: a, nothing computed
    assert router.prefill_tokens == {"a": 0, "b": 0, "c": 0}
    other = list(range(1000, 1064))
    assert router.route(other).instance == "b"                        # no overlap: a has one in flight
    assert router.route(other).instance == "c"                        # b is loaded now, c is not
    big = list(range(5000, 5000 + 16 * 100))
    assert router.route(big).instance == "a"
    assert router.route(TOKENS).instance != "a"                       # a is past the bound: its prefix waits
    router.done("a")
    assert router.in_flight["a"] == 1


def test_bad_input_raises_and_changes_nothing():
    index = KVIndex()
    with pytest.raises(ArgumentValueError):
        KVRouter(index, page_size=16).route(TOKENS)
    router = KVRouter(index, ["a"], page_size=16)
    with pytest.raises(ArgumentTypeError):
        router.route(TOKENS, cache_salt=3)
    with pytest.raises((ArgumentTypeError, ArgumentValueError)):
        router.route([-1, 2])
    with pytest.raises(ArgumentValueError):
        router.done("a")
    with pytest.raises(ArgumentValueError):
        KVRouter(index, ["a", "a"])
    with pytest.raises(ArgumentValueError):
        KVRouter(index, ["a"], medium_weights={"GPU": -1})
    with pytest.raises(ArgumentTypeError):
        KVRouter("index")
    assert router.in_flight == {"a": 0} and router.prefill_tokens == {"a": 0}

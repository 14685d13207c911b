"""The in-process store (memory://): leading-run reads, first writer wins, LRU capacity, outages; and the property."""

from __future__ import annotations

import warnings
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixkv.errors import ArgumentValueError
from radixkv.store import COUNTERS, MemoryBackend, PageStore, drop_memory

from .conftest import FP

TOKENS = list(range(1000, 1000 + 4 * 8))  # 8 pages


def pages(n, tag=b"p"):
    return [tag + bytes([i]) * 10 for i in range(n)]


def test_put_then_get_serves_the_bytes_one_round_trip_each(memory_url):
    store = PageStore.open(memory_url, FP)
    chain = store.chain(TOKENS)
    assert store.lookup(chain) == 0 and store.get(chain) == ([], 0)
    assert store.put(chain, pages(5)) == 5
    assert store.lookup(chain) == 5
    got, n = store.get(chain)
    assert n == 5 and [bytes(p) for p in got] == pages(5)
    assert store.put(chain, pages(3, b"q"), start=5) == 3
    got, n = store.get(chain, start=3)
    assert n == 5 and [bytes(p) for p in got] == pages(5)[3:] + pages(3, b"q")
    s = store.stats()
    assert s["round_trips"] == 7 and s["lookups"] == 2 and s["gets"] == 3 and s["puts"] == 2
    assert s["hits"] == 10 and s["misses"] == 11 and s["lookup_pages"] == 5 and s["pages_written"] == 8
    assert s["bytes_written"] == 8 * (77 + 11) and s["bytes_read"] == 10 * (77 + 11)
    assert s["backend"] == "memory" and s["url"] == memory_url and s["pages"] == 8 and s["evictions"] == 0
    assert set(COUNTERS) <= set(s)


def test_first_writer_wins(memory_url):
    a, b = PageStore.open(memory_url, FP), PageStore.open(memory_url, FP)  # two engines, one store
    chain = a.chain(TOKENS)
    assert a.put(chain[:3], pages(3, b"a")) == 3
    assert b.put(chain, pages(8, b"b")) == 5
    assert [bytes(p) for p in b.get(chain)[0]] == pages(3, b"a") + pages(8, b"b")[3:]
    assert b.stats()["pages_existing"] == 3 and b.stats()["pages_written"] == 5


def test_a_page_past_a_gap_is_never_served(memory_url):
    store = PageStore.open(memory_url, FP)
    chain = store.chain(TOKENS)
    store.put(chain, pages(8))
    store.backend.delete([chain[3]])  # evicted on its own, as Redis under maxmemory does
    assert store.lookup(chain) == 3 and store.get(chain)[1] == 3
    assert store.lookup(chain, 4) == 4 and store.get(chain, start=4)[1] == 4  # a caller holding pages 0-3 itself
    assert store.stats()["misses"] == 5


def test_stores_of_one_name_share_pages_and_other_names_do_not(memory_url):
    a = PageStore.open(memory_url, FP)
    a.put(a.chain(TOKENS), pages(8))
    assert PageStore.open(memory_url, FP).lookup(a.chain(TOKENS)) == 8
    other = PageStore.open(memory_url + "-other", FP)
    assert other.lookup(a.chain(TOKENS)) == 0
    drop_memory(memory_url[len("memory://"):] + "-other")


def test_capacity_evicts_the_least_recently_used(memory_url):
    store = PageStore.open(memory_url + "?capacity=6", FP)
    chain = store.chain(TOKENS)
    assert store.put(chain[:4], pages(4)) == 4
    store.get(chain[:1])  # page 0 is the most recent now (a get touches what it finds; a lookup does not)
    store.lookup(chain[:2])
    store.put(chain, pages(8)[4:], start=4)  # 8 pages into 6: pages 3 and 2 go, least recently used first
    assert store.backend.keys() == [chain[1], chain[0], *reversed(chain[4:])]  # each call's last page first
    assert store.stats()["evictions"] == 2 and store.lookup(chain) == 2
    with pytest.raises(ArgumentValueError, match="is open with capacity 6, not 7"):
        PageStore.open(memory_url + "?capacity=7", FP)
    assert PageStore.open(memory_url, FP).backend is store.backend  # no capacity: whatever it has


def test_a_bad_capacity_is_an_argument_error_as_on_redis(memory_url):
    for bad in ("0", "ten", "²", "1&capacity=7"):  # "²" passed str.isdigit() and int() raised a bare ValueError
        with pytest.raises(ArgumentValueError, match="capacity must be one positive number"):
            PageStore.open(memory_url + "?capacity=" + bad, FP)


def test_open_store_refuses_a_url_that_is_not_a_str_with_or_without_a_bound():
    from radixkv.errors import ArgumentTypeError
    from radixkv.tiers.config import open_store

    for url in (123, b"memory://x"):  # with store_blocks: AttributeError / TypeError from str methods
        for blocks in (None, 5):
            with pytest.raises(ArgumentTypeError, match="store URL must be a str"):
                open_store(url, 16, store_blocks=blocks)


def test_a_bad_value_is_an_integrity_miss_and_is_deleted(memory_url):
    store = PageStore.open(memory_url, FP)
    chain = store.chain(TOKENS)
    store.put(chain, pages(8))
    backend: MemoryBackend = store.backend
    backend._data[chain[2]] = backend._data[chain[2]][:-1] + b"!"
    got, n = store.get(chain)
    assert n == 2 and [bytes(p) for p in got] == pages(2) and store.stats()["integrity_misses"] == 1 and store.last_integrity_miss == "digest mismatch"
    assert chain[2] not in backend.keys() and store.lookup(chain) == 2
    assert store.stats()["round_trips"] == 4  # put, get, the delete, lookup


def test_numpy_pages_round_trip_without_copies(memory_url):
    store = PageStore.open(memory_url, FP)
    chain = store.chain(TOKENS)
    kv = np.random.default_rng(0).standard_normal((8, 4, 2, 8, 128)).astype(np.float16)
    store.put(chain, list(kv))
    got, n = store.get(chain)
    assert n == 8 and all(np.array_equal(np.frombuffer(p, np.float16).reshape(kv.shape[1:]), kv[i])
                          for i, p in enumerate(got))


def test_an_outage_is_misses_and_counted_never_an_exception(memory_url):
    store = PageStore.open(memory_url, FP)
    chain = store.chain(TOKENS)
    store.put(chain, pages(8))
    store.backend.available = False
    with pytest.warns(RuntimeWarning, match="backend call failed") as caught:
        with warnings.catch_warnings():
            assert store.lookup(chain) == 0 and store.get(chain) == ([], 0) and store.put(chain, pages(8)) == 0
    assert len([w for w in caught if "page store" in str(w.message)]) == 1  # once per store
    s = store.stats()
    assert s["backend_errors"] == 3 and s["misses"] == 8 and s["pages_failed"] == 8 and s["hits"] == 0
    assert isinstance(store.last_error, ConnectionError)
    store.backend.available = True
    assert store.get(chain)[1] == 8


# --------------------------------------------------------------------- the property
ops = st.lists(st.tuples(st.sampled_from(["put", "put", "get", "get", "lookup", "evict", "corrupt"]),
                          st.integers(0, 4), st.sampled_from([0, 0, 0, 1, 2, 3, 4, 5, 6]), st.integers(0, 6)),
               min_size=8, max_size=40)


@given(prompts=st.lists(st.lists(st.integers(0, 1), min_size=4, max_size=4 * 6), min_size=1, max_size=5),
       capacity=st.one_of(st.none(), st.integers(1, 10)), script=ops)
def test_get_serves_exactly_the_longest_valid_prefix_and_its_first_written_bytes(prompts, capacity, script):
    """A model of the store (an LRU-ordered dict of first-written payloads, and the corrupted keys) predicts every
    answer and the exact content and recency order of the backend after every call."""
    name = "property"
    drop_memory(name)
    store = PageStore.open(f"memory://{name}" + (f"?capacity={capacity}" if capacity else ""), FP)
    backend: MemoryBackend = store.backend

    def corrupt(key: bytes) -> None:
        backend._data[key] = b"RKVP" + bytes(80)  # in place: recency unchanged

    run_model(store, prompts, capacity, script, backend.keys, corrupt)
    drop_memory(name)


def run_model(store, prompts, capacity, script, held, corrupt_in_place):
    """Run ``script`` on ``store`` beside a model that predicts every answer, and check after each call that
    the backend holds exactly the model's pages in the model's recency order (``held()``: the backend's keys,
    least recently used first). Shared by every backend that promises exact LRU under a capacity."""
    backend = store.backend
    chains = [store.chain(p) for p in prompts]
    model: "OrderedDict[bytes, bytes]" = OrderedDict()
    corrupt = set()
    for step, (op, c, start, *rest) in enumerate(script):
        chain = chains[c % len(chains)]
        start = min(start, len(chain))
        keys = chain[start:]
        if op == "put":
            payloads = [b"%d/%d" % (step, j) for j in range(min(rest[0], len(keys)))]
            added = [key for key in keys[:len(payloads)] if key not in model]
            for key in reversed(added):  # newest first, the chain's root last: it ends up the most recent
                model[key] = payloads[keys.index(key)]
            while capacity and len(model) > capacity:
                corrupt.discard(model.popitem(last=False)[0])
            assert store.put(chain, payloads, start) == len(added)
        elif op in ("get", "lookup"):
            lead = 0
            while lead < len(keys) and keys[lead] in model and (op == "lookup" or keys[lead] not in corrupt):
                lead += 1
            if op == "lookup":
                assert store.lookup(chain, start) == lead
                continue
            for key in reversed(keys):  # a get makes every page it finds the most recent, the last first
                if key in model:
                    model.move_to_end(key)
            got, n = store.get(chain, start)
            assert n == lead and [bytes(p) for p in got] == [model[k] for k in keys[:lead]]
            if lead < len(keys) and keys[lead] in corrupt:  # refused, counted, deleted
                del model[keys[lead]]
                corrupt.discard(keys[lead])
        elif keys and op == "evict":
            backend.delete(keys[:1])
            model.pop(keys[0], None)
            corrupt.discard(keys[0])
        elif keys and op == "corrupt" and keys[0] in model:
            corrupt_in_place(keys[0])
            corrupt.add(keys[0])
        assert held() == list(model)
    s = store.stats()
    assert s["backend_errors"] == 0 and s["hits"] + s["misses"] == sum(
        len(chains[c % len(chains)]) - min(start, len(chains[c % len(chains)]))
        for op, c, start, *_ in script if op == "get")

"""The store on a real redis-server: round trips, bad values, a killed server, maxmemory eviction, refused writes.

Every server is started by the test (free loopback port, temporary directory) and stopped after it.
"""

from __future__ import annotations

import dataclasses
import random
import socket
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixkv.errors import ArgumentValueError
from radixkv.store import KeyChain, PageStore, codec, redis_lru
from radixkv.testing.localredis import LocalRedis, free_port

from ..tiers.test_redis import _require_redis
from .conftest import FP, FINGERPRINTS_AND_NAMESPACES
from .test_store_memory import ops, run_model

PS = FP.page_size


def raw(server):
    import redis

    return redis.Redis.from_url(server.url)


def tokens(i: int, pages: int):
    return [i, *range(1, pages * PS)]  # distinct first token: distinct chains


def payload(key: bytes, size: int = 64) -> bytes:
    return (key[4:] * (size // 32 + 1))[:size]


def test_one_round_trip_per_call_and_first_writer_wins(redis_server):
    store = PageStore.open(redis_server.url, FP)
    assert store.backend.kind == "redis" and store.stats()["round_trips"] == 1  # INFO cluster at open
    chain = store.chain(tokens(0, 64))
    for call in (lambda: store.lookup(chain), lambda: store.get(chain), lambda: store.put(chain, [b"a"] * 64),
                 lambda: store.lookup(chain), lambda: store.get(chain), lambda: store.put(chain, [b"b"] * 64)):
        before = store.stats()["round_trips"]
        call()
        assert store.stats()["round_trips"] == before + 1
    got, n = store.get(chain)
    assert n == 64 and {bytes(p) for p in got} == {b"a"}
    s = store.stats()
    assert s["pages_written"] == 64 and s["pages_existing"] == 64 and s["lookup_pages"] == 64
    assert s["lookup"] == "script"
    keys = raw(redis_server).keys("*")
    assert sorted(keys) == sorted(chain)  # existence is the page key itself: nothing else is written
    assert all(len(k) == 36 for k in keys)
    other = PageStore.open(redis_server.url, FP)  # another engine process, same server
    assert other.get(chain)[1] == 64


def test_engines_racing_to_write_a_chain_all_read_one_winner_per_page(redis_server):
    stores = [PageStore.open(redis_server.url, FP) for _ in range(4)]  # four engines, one connection pool each
    chains = [stores[0].chain(tokens(i, 16)) for i in range(20)]
    barrier = threading.Barrier(len(stores))

    def engine(e: int) -> None:
        barrier.wait()
        for chain in chains:
            stores[e].put(chain, [b"engine %d page %d" % (e, j) for j in range(len(chain))])

    threads = [threading.Thread(target=engine, args=(e,)) for e in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(s.stats()["pages_written"] for s in stores) == 20 * 16  # each page stored exactly once
    for chain in chains:
        seen = {tuple(bytes(p) for p in s.get(chain)[0]) for s in stores}
        assert len(seen) == 1 and len(next(iter(seen))) == 16  # every engine reads the same winners


def test_lookup_uses_pipelines_on_a_server_that_refuses_scripts():
    _require_redis()
    with LocalRedis(args=["--rename-command", "EVALSHA", "", "--rename-command", "EVAL", ""]) as server:
        store = PageStore.open(server.url, FP)
        chain = store.chain(tokens(0, 8))
        store.put(chain, [b"x"] * 8)
        raw(server).delete(chain[5])
        before = store.stats()["round_trips"]
        assert store.lookup(chain) == 5  # the script is refused once, then EXISTS pipelines
        assert store.stats()["round_trips"] == before + 2 and store.stats()["lookup"] == "pipeline"
        assert store.lookup(chain, 6) == 2 and store.stats()["round_trips"] == before + 3
        assert store.stats()["backend_errors"] == 0


def test_the_script_survives_a_flushed_script_cache(redis_server):
    store = PageStore.open(redis_server.url, FP)
    chain = store.chain(tokens(0, 4))
    store.put(chain, [b"x"] * 4)
    raw(redis_server).script_flush()
    assert store.lookup(chain) == 4 and store.stats()["lookup"] == "script" and store.stats()["round_trips"] == 3


def test_no_two_fingerprints_or_namespaces_hit_on_one_server(redis_server):
    written = 0
    for fp, ns in FINGERPRINTS_AND_NAMESPACES:
        store = PageStore.open(redis_server.url, fp)
        chain = store.chain(tokens(0, 8), ns)  # 32 tokens: 8 pages of 4, or 4 of 8
        assert store.lookup(chain) == 0 and store.get(chain) == ([], 0)
        assert store.put(chain, [b"%d" % written] * len(chain)) == len(chain)
        written += len(chain)
        assert store.get(chain)[1] == len(chain) and store.stats()["integrity_misses"] == 0
    assert raw(redis_server).dbsize() == written


def bad_values(chains, store, rng):
    """One corrupted, truncated or foreign value for the last page of each chain (cycling through the kinds)."""
    other = KeyChain(dataclasses.replace(FP, model="other"))
    fp, cut = store.keys.fingerprint_digest, 4
    for i, chain in enumerate(chains):
        key = chain[-1]
        good = codec.encode(fp, key[cut:], memoryview(payload(key)))
        kind = i % 10
        if kind == 0:
            value = good[: rng.randrange(len(good))]  # truncated anywhere, header included
        elif kind == 1:
            flipped = bytearray(good)
            flipped[rng.randrange(len(good))] ^= 1 << rng.randrange(8)  # one flipped bit anywhere
            value = bytes(flipped)
        elif kind == 2:
            value = codec.encode(fp, chains[i - 1][-1][cut:], memoryview(payload(key)))  # another page's value
        elif kind == 3:
            value = codec.encode(other.fingerprint_digest, key[cut:], memoryview(payload(key)))  # another model
        elif kind == 4:
            value = good + b"\0"  # padded
        elif kind == 5:
            value = good[:4] + b"\x02" + good[5:]  # a future format version
        elif kind == 6:
            value = rng.randbytes(rng.randrange(200))  # garbage
        elif kind == 7:
            value = b""
        elif kind == 8:
            value = good[:-8] + rng.randbytes(8)  # the payload's tail rewritten
        else:
            value = good[:53] + (len(good) - 77 - 1).to_bytes(8, "little") + good[61:]  # a lying length
        assert codec.decode(value, fp, key[cut:])[0] is None
        yield key, value


def test_10000_bad_values_under_valid_keys_are_never_served_and_are_deleted(redis_server):
    store = PageStore.open(redis_server.url, FP)
    rng = random.Random(5)
    chains = [store.chain(tokens(i, 1 + i % 3)) for i in range(10_000)]  # the bad page is page 0, 1 or 2
    client = raw(redis_server)
    pipe = client.pipeline(transaction=False)
    fp = store.keys.fingerprint_digest
    for chain in chains:  # the pages before the bad one are good
        for key in chain[:-1]:
            pipe.set(key, codec.encode(fp, key[4:], memoryview(payload(key))))
    for key, value in bad_values(chains, store, rng):
        pipe.set(key, value)
    pipe.execute()
    good_pages = sum(len(c) - 1 for c in chains)
    assert client.dbsize() == good_pages + 10_000
    served = 0
    for chain in chains:
        got, n = store.get(chain)
        assert n == len(chain) - 1 and [bytes(p) for p in got] == [payload(k) for k in chain[:-1]]
        served += n
    s = store.stats()
    assert s["integrity_misses"] == 10_000 and s["hits"] == served == good_pages and s["backend_errors"] == 0
    pipe = client.pipeline(transaction=False)
    for chain in chains:
        pipe.exists(chain[-1])
    assert not any(pipe.execute()) and client.dbsize() == good_pages  # every bad key deleted, nothing else
    assert store.put(chains[0], [payload(chains[0][0])]) == 1 and store.get(chains[0])[1] == 1  # stored anew


def test_a_killed_server_is_misses_without_exceptions_and_serves_again_within_a_second(redis_server):
    store = PageStore.open(redis_server.url, FP)
    chain = store.chain(tokens(0, 16))
    assert store.put(chain, [b"x"] * 16) == 16
    redis_server.kill()
    started = time.monotonic()
    for _ in range(200):  # a dead server costs a refused connect, then nothing while it cools off
        assert store.lookup(chain) == 0
        assert store.get(chain) == ([], 0)
        assert store.put(chain, [b"y"] * 16) == 0
    assert time.monotonic() - started < 2.0
    s = store.stats()
    assert s["backend_errors"] >= 1 and s["backend_errors"] + s["backend_skips"] == 600 and s["hits"] == 0
    assert s["pages_failed"] == 200 * 16 and isinstance(store.last_error, store.backend.transport)
    redis_server.restart()  # same port, empty
    up = time.monotonic()
    while store.put(chain, [b"z"] * 16) == 0:
        assert time.monotonic() - up < 1.0, "not serving a second after the restart"
        time.sleep(0.01)
    assert store.get(chain)[1] == 16 and store.lookup(chain) == 16


def test_a_server_down_at_open_is_found_once_it_answers():
    _require_redis()
    port = free_port()
    store = PageStore.open(f"redis://127.0.0.1:{port}/0", FP)  # nobody listens: no error, misses
    chain = store.chain(tokens(0, 4))
    assert store.backend.kind == "redis?" and store.put(chain, [b"x"] * 4) == 0 and store.lookup(chain) == 0
    with LocalRedis(port=port) as server:
        up = time.monotonic()
        while store.put(chain, [b"x"] * 4) == 0:
            assert time.monotonic() - up < 1.0
            time.sleep(0.01)
        assert store.backend.kind == "redis" and store.get(chain)[1] == 4
        assert raw(server).dbsize() == 4
    store.close()


def test_a_server_that_never_answers_costs_one_timeout_per_cool_off():
    _require_redis()
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        started = time.monotonic()
        store = PageStore.open(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", FP, timeout=0.2)
        assert 0.19 < time.monotonic() - started < 0.6 and store.backend.kind == "redis?"
        chain = store.chain(tokens(0, 4))
        started = time.monotonic()
        while time.monotonic() - started < 1.0:
            assert store.lookup(chain) == 0 and store.get(chain) == ([], 0)
        s = store.stats()
        assert s["backend_skips"] > 100 and 1 <= s["backend_errors"] <= 4  # cool-offs of 0.1, 0.2, 0.4 s
        assert isinstance(store.last_error, store.backend.transport)


def test_a_password_in_the_url_never_shows():
    _require_redis()
    port = free_port()
    store = PageStore.open(f"redis://fleet:s3cret@127.0.0.1:{port}/0", FP)
    store.lookup(store.chain(tokens(0, 1)))
    assert store.stats()["url"] == f"redis://fleet:***@127.0.0.1:{port}/0"
    assert "s3cret" not in repr(store) and "s3cret" not in repr(store.backend)


def test_maxmemory_eviction_serves_each_chain_only_up_to_its_first_gap():
    _require_redis()
    with LocalRedis(args=["--maxmemory-policy", "allkeys-lru"]) as server:
        client = raw(server)
        client.config_set("maxmemory", client.info("memory")["used_memory"] + 1024 * 1024)
        store = PageStore.open(server.url, FP)
        chains = [store.chain(tokens(i, 8)) for i in range(300)]  # 300 x 8 pages of 1 KiB: 2.4 MB into 1 MB
        for chain in chains:
            store.put(chain, [payload(k, 1024) for k in chain])
        assert client.info("stats")["evicted_keys"] > 0
        client.config_set("maxmemory", 0)  # Redis evicts before any command, reads too: freeze what it left
        present = [[bool(client.exists(k)) for k in chain] for chain in chains]
        gapped = 0
        for chain, here in zip(chains, present):
            lead = here.index(False) if False in here else len(here)
            gapped += any(here[lead:])  # a page past the gap is still there, and must not be served
            assert store.lookup(chain) == lead
            got, n = store.get(chain)
            assert n == lead and [bytes(p) for p in got] == [payload(k, 1024) for k in chain[:lead]]
        assert gapped >= 20, "Redis evicted too few middle pages to test anything"
        assert store.stats()["integrity_misses"] == 0 and store.stats()["backend_errors"] == 0


@pytest.mark.parametrize("bound", ["", "?capacity=100000"])
def test_writes_refused_at_maxmemory_fail_only_those_pages(redis_server, bound):
    """Reads go on at OOM, with a capacity too (its read script's stamps were refused with OOM and failed
    every read once the server was full)."""
    client = raw(redis_server)
    store = PageStore.open(redis_server.url + bound, FP)
    kept = store.chain(tokens(0, 4))
    store.put(kept, [b"k"] * 4)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 256 * 1024)
    stored = 0
    for i in range(1, 100):
        chain = store.chain(tokens(i, 4))
        stored += store.put(chain, [payload(k, 8192) for k in chain])
    s = store.stats()
    assert 0 < stored < 99 * 4 and s["pages_failed"] == 99 * 4 - stored and s["backend_errors"] > 0
    assert "maxmemory" in str(store.last_error)
    for _ in range(3):  # each read stamps (or tries to)
        assert store.get(kept)[1] == 4 and store.lookup(kept) == 4  # reads go on at OOM, the script too
        assert store.get(kept, start=2, touch=True)[1] == 2
    assert store.stats()["lookup"] == "script"


def test_a_get_touches_the_pages_its_reader_holds_in_the_same_round_trip(redis_server, memory_url):
    """``get(chain, start, touch=True)``: the pages before ``start`` become recently used (TOUCH), so an
    LRU-bounded store keeps what the fleet uses from its own HBM too; still one round trip."""
    for url in (redis_server.url, memory_url):
        store = PageStore.open(url, FP)
        chain = store.chain(list(range(64)))  # 16 pages at page size 4
        store.put(chain, [b"p"] * 4)
        if url == redis_server.url:
            client = raw(redis_server)
            time.sleep(1.1)  # OBJECT IDLETIME counts whole seconds
            before = client.object("idletime", chain[0])
        trips = store.stats()["round_trips"]
        pages, n = store.get(chain, 2, touch=True)
        assert n == 2 and store.stats()["round_trips"] == trips + 1
        if url == redis_server.url:
            assert before >= 1 and client.object("idletime", chain[0]) == 0
        else:
            assert store.backend.keys() == chain[3::-1]  # the pages read, then the ones touched: the root newest


# --------------------------------------------------------------------- ?capacity=: exact LRU on the server
@pytest.fixture(scope="module")
def shared_server():
    _require_redis()
    with LocalRedis() as server:
        yield server


@given(prompts=st.lists(st.lists(st.integers(0, 1), min_size=4, max_size=4 * 6), min_size=1, max_size=5),
       capacity=st.integers(1, 10), script=ops)
def test_a_capacity_is_exactly_the_in_process_stores_lru(shared_server, prompts, capacity, script):
    """The in-process store's model predicts every answer of a server opened with ``?capacity=`` and its
    exact recency order after every call; the server holds exactly the pages of that order."""
    client = raw(shared_server)
    client.flushall()
    store = PageStore.open(shared_server.url + f"?capacity={capacity}", FP)

    def held():
        order = redis_lru.held_pages(client)
        assert sorted(client.keys("rkv:*")) == sorted(order)  # an evicted page's key is gone with it
        return order

    def corrupt(key: bytes) -> None:
        client.set(key, b"RKVP" + bytes(80))  # in place: its place in the order unchanged

    run_model(store, prompts, capacity, script, held, corrupt)
    store.close()


def test_a_capacity_evicts_a_chain_from_its_end_in_one_round_trip(redis_server):
    store = PageStore.open(redis_server.url + "?capacity=6", FP)
    chain = store.chain(tokens(0, 8))
    trips = store.stats()["round_trips"]
    assert store.put(chain, [b"x"] * 8) == 8 and store.stats()["round_trips"] == trips + 1
    assert store.lookup(chain) == 6 and store.stats()["evictions"] == 2  # pages 6 and 7 went, not the root
    other = store.chain(tokens(1, 3))
    store.put(other, [b"y"] * 3)
    assert store.lookup(chain) == 3 and store.lookup(other) == 3  # the old chain shortened from its end
    assert len(raw(redis_server).keys("rkv:*")) == 6
    assert store.stats()["url"].endswith("?capacity=6")


def test_a_bad_capacity_is_refused_at_open_and_a_cluster_cannot_take_one(redis_server, cluster):
    for bad in ("0", "-3", "ten", "²", "1&capacity=2"):
        with pytest.raises(ArgumentValueError, match="capacity must be one positive number"):
            PageStore.open(redis_server.url + "?capacity=" + bad, FP)
    with pytest.raises(ArgumentValueError, match="a capacity needs a single server"):
        PageStore.open(cluster.url + "?capacity=5", FP)


def test_a_capacity_keeps_no_key_but_its_order_and_survives_losing_a_clock(redis_server):
    """The order's stamps continue from its highest score: nothing else to lose. (A separate clock key, deleted
    by an operator or evicted by a ``maxmemory`` policy on top, restarted at 0: every new page came in older
    than the pages held and was evicted by the very write that stored it.)"""
    client = raw(redis_server)
    store = PageStore.open(redis_server.url + "?capacity=10", FP)
    old = store.chain(tokens(0, 10))
    assert store.put(old, [b"o"] * 10) == 10
    assert client.dbsize() == 11  # the pages and the order: no other key
    client.delete(b"radixkv:lru-clock")  # harmless now; the clock's loss was the failure
    new = store.chain(tokens(1, 5))
    assert store.put(new, [b"n"] * 5) == 5
    assert store.get(new)[1] == 5  # the newest write stays
    assert store.lookup(old) == 5  # the least recently used went: the old chain's end
    assert redis_lru.held_pages(client)[-5:] == new[::-1]


def test_a_capacity_reads_a_value_of_another_type_as_missing_not_as_a_failed_chain(redis_server):
    """As ``MGET`` does without a capacity: a foreign key of another type (a hash) under a page's key ends the
    chain there; the pages before it are served and the call is no backend error."""
    client = raw(redis_server)
    store = PageStore.open(redis_server.url + "?capacity=100", FP)
    chain = store.chain(tokens(0, 4))
    store.put(chain, [b"c"] * 4)
    client.delete(chain[3])
    client.hset(chain[3], "f", "v")
    assert store.get(chain)[1] == 3
    assert store.stats()["backend_errors"] == 0


def test_a_capacity_on_a_unix_socket_url(tmp_path):
    """``unix:///PATH?capacity=N`` (documented beside redis://): the parameter is cut out of the text; rebuilt by
    urlunsplit the URL became ``unix:/PATH``, which redis-py refused ("bad Redis URL")."""
    _require_redis()
    sock = tmp_path / "r.sock"
    with LocalRedis(args=["--unixsocket", str(sock), "--unixsocketperm", "700"]):
        for query in ("?capacity=3", "?db=2&capacity=3"):
            store = PageStore.open(f"unix://{sock}{query}", FP)
            chain = store.chain(tokens(0, 5))
            assert store.put(chain, [b"u"] * 5) == 5 and store.lookup(chain) == 3
            assert store.stats()["capacity"] == 3 and store.backend.kind == "redis"
            store.close()


def test_a_write_far_over_a_smaller_capacity_evicts_at_most_1000_more_than_it_adds(redis_server):
    """A store reopened with a smaller bound comes down over several writes: one write evicting a whole store
    (250,000 pages) blocked the server past every client's timeout, its own too."""
    client = raw(redis_server)
    big = PageStore.open(redis_server.url + "?capacity=3000", FP)
    for i in range(30):
        big.put(big.chain(tokens(i, 100)), [b"b"] * 100)
    assert client.zcard(redis_lru.ORDER_KEY) == 3000
    small = PageStore.open(redis_server.url + "?capacity=10", FP)
    for n, left in ((1, 2000), (1, 1000), (1, 10), (2, 10)):
        fresh = small.chain(tokens(1000 + left + n, n))
        assert small.put(fresh, [b"s"] * n) == n and small.lookup(fresh) == n
        assert client.zcard(redis_lru.ORDER_KEY) == left and client.dbsize() == left + 1

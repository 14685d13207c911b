"""The store on a real Mooncake Store: round trips, first writer wins, bad values, a killed master, eviction at the
watermark, isolation, and the embedded master of ``open_store("mooncake")``.

Every master is started by the test (:class:`radixkv.testing.localmooncake.LocalMooncakeMaster`: free loopback
ports, a temporary directory, a ``mooncake_client`` storage node lending the segment). Without Mooncake Store
(``pip install 'radixkv[mooncake]'`` and Debian's libibverbs1, librdmacm1, libnuma1) these tests fail under
``CI=true`` and skip elsewhere. A Mooncake client's ``close`` takes about a second (it joins its heartbeat),
so the tests share clients: many PageStores over one backend.
"""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest

from radixkv.errors import ArgumentValueError
from radixkv.store import PageStore, codec
from radixkv.store.mooncake_backend import mooncake_key, parse_size
from radixkv.testing.localmooncake import LocalMooncakeMaster

from .conftest import FINGERPRINTS_AND_NAMESPACES, FP

PS = FP.page_size


def _require_mooncake() -> None:
    from radixkv.errors import MissingExtraError
    from radixkv.store.mooncake_backend import load_mooncake

    try:
        load_mooncake()
    except MissingExtraError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def tokens(i: int, pages: int):
    return [i, *range(1, pages * PS)]  # distinct first token: distinct chains


@pytest.fixture(scope="module")
def master():
    _require_mooncake()
    with LocalMooncakeMaster() as m:
        yield m


@pytest.fixture(scope="module")
def store(master):
    s = PageStore.open(master.url, FP)
    yield s
    s.close()


def on(store: PageStore, fp=FP) -> PageStore:
    """Another engine's store over the same Mooncake client (a client costs ~1 s to close)."""
    return PageStore(store.backend, fp)


def test_urls_sizes_and_keys():
    _require_mooncake()
    with pytest.raises(ArgumentValueError):
        PageStore.open("mooncake://127.0.0.1", FP)  # no port
    with pytest.raises(ArgumentValueError):
        PageStore.open("mooncake://127.0.0.1:1?segments=1", FP)
    with pytest.raises(ArgumentValueError):
        PageStore.open("mooncake://127.0.0.1:1?segment=1M", FP)  # below Mooncake's 16 MiB
    with pytest.raises(ArgumentValueError):
        PageStore.open("mooncake://127.0.0.1:1?metadata=etcd://x:1", FP)
    assert parse_size("64M", "x") == parse_size("64MiB", "x") == 64 << 20 and parse_size("4096", "x") == 4096
    key = PageStore.open("memory://mooncake-keys", FP).chain(range(PS))[0]
    assert mooncake_key(key) == "rkv:" + key[4:].hex()
    assert mooncake_key(b"\x00abc:" + bytes(32)) == (b"\x00abc:" + bytes(32)).hex()  # no printable head: all hex
    assert mooncake_key(b"a b:x") == b"a b:x".hex()  # a space is no head either


def test_a_dead_master_at_open_misses_fast_and_never_raises():
    _require_mooncake()
    dead = PageStore.open("mooncake://127.0.0.1:9?metadata=http://127.0.0.1:9/metadata", FP)  # nothing listens on 9
    assert dead.backend.kind == "mooncake" and dead.backend.info()["client_setups"] == 0
    chain = dead.chain(tokens(0, 4))
    start = time.monotonic()
    for _ in range(20):
        assert dead.lookup(chain) == 0 and dead.get(chain, touch=True) == ([], 0) and dead.put(chain, [b"x"] * 4) == 0
    assert time.monotonic() - start < 2  # no setup against it: Mooncake's would take 90 s
    time.sleep(dead.backend.cooloff.cap)
    assert dead.lookup(chain) == 0  # tried again after its cool-off: one more refused connect
    s = dead.stats()
    assert s["backend_errors"] >= 1 and s["backend_skips"] >= 1 and s["misses"] == 80 and s["pages_failed"] == 80
    dead.close()


def test_round_trips_first_writer_wins_and_leading_runs(master, store):
    chain = store.chain(tokens(1, 16))
    for call, trips in ((lambda: store.lookup(chain), 1), (lambda: store.get(chain), 1),  # nothing present: no fetch
                        (lambda: store.put(chain, [b"a%d" % i for i in range(16)]), 2),  # exists, then put
                        (lambda: store.put(chain, [b"b"] * 16), 1),  # all there: nothing sent
                        (lambda: store.lookup(chain), 1), (lambda: store.get(chain, 4, touch=True), 2)):
        before = store.stats()["round_trips"]
        call()
        assert store.stats()["round_trips"] == before + trips
    other = on(store)  # another engine: the first writer's pages, whatever it writes
    assert other.put(chain, [b"late"] * 16) == 0 and other.stats()["pages_existing"] == 16
    got, n = other.get(chain)
    assert n == 16 and [bytes(p) for p in got] == [b"a%d" % i for i in range(16)]
    # a gap: nothing past it is served, or fetched
    store.backend.delete([chain[5]])
    before = store.stats()
    assert store.lookup(chain) == 5 and store.get(chain)[1] == 5
    after = store.stats()
    assert after["misses"] - before["misses"] == 11 and after["backend_errors"] == before["backend_errors"]
    assert after["bytes_read"] - before["bytes_read"] == sum(codec.HEADER_BYTES + len(b"a%d" % i) for i in range(5))
    assert store.put(chain, [b"c"] * 16) == 1  # only the missing page is written
    assert [bytes(p) for p in store.get(chain)[0]][4:7] == [b"a4", b"c", b"a6"]


def test_long_chains_move_in_calls_of_at_most_512_pages(store):
    chain = store.chain(tokens(6, 1200))  # one call of 2,000 stalls 60 s in Mooncake's TCP transport
    before = store.stats()["round_trips"]
    assert store.put(chain, [b"p%d" % i for i in range(1200)]) == 1200
    assert store.stats()["round_trips"] == before + 1 + 3  # an existence check, then 512 + 512 + 176
    got, n = store.get(chain)
    assert n == 1200 and bytes(got[-1]) == b"p1199" and store.stats()["round_trips"] == before + 4 + 1 + 3


def test_a_get_larger_than_the_transfer_buffer_moves_in_calls_that_fit(master):
    reader = PageStore.open(master.url + "&buffer=4M", FP)  # 2 MiB a call: two pages of 1 MiB
    chain = reader.chain(tokens(8, 9))
    assert on(reader).put(chain, [bytes([i]) * (1 << 20) for i in range(9)]) == 9  # five puts of two pages (one of one)
    reader.backend._largest = 0  # a reader that has seen no value yet asks for all nine at once
    got, n = reader.get(chain)
    assert n == 9 and [bytes(p)[:1] for p in got] == [bytes([i]) for i in range(9)]
    assert reader.stats()["backend_errors"] == 0
    reader.close()


def test_engines_racing_to_write_read_one_winner_per_page(master, store):
    second = PageStore.open(master.url, FP)  # two real clients
    stores = [store, second, on(store), on(second)]
    chains = [store.chain(tokens(100 + i, 8)) for i in range(10)]
    barrier = threading.Barrier(len(stores))

    def engine(e: int) -> None:
        barrier.wait()
        for chain in chains:
            stores[e].put(chain, [b"engine %d page %d" % (e, j) for j in range(8)])

    threads = [threading.Thread(target=engine, args=(e,)) for e in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the count may claim a page twice (both saw it absent); the store keeps one value per page
    assert sum(s.stats()["pages_written"] for s in stores) >= 80
    for chain in chains:
        seen = {tuple(bytes(p) for p in s.get(chain)[0]) for s in stores}
        assert len(seen) == 1 and len(next(iter(seen))) == 8
    second.close()


def test_corrupted_and_foreign_values_are_never_served(store):
    chain = store.chain(tokens(2, 8))
    payload = b"kv" * 40
    assert store.put(chain, [payload] * 8) == 8
    good = store.backend.get(chain).values
    foreign = PageStore(store.backend, FINGERPRINTS_AND_NAMESPACES[-1][0])  # another fingerprint, same Mooncake
    value = bytearray(good[0])
    value[-1] ^= 1
    bad = {
        "truncated header": good[0][:40],
        "bad magic": b"XXXX" + good[0][4:],
        "format version 9": good[0][:4] + b"\x09" + good[0][5:],
        "another fingerprint": codec.encode(foreign.keys.fingerprint_digest, chain[0][4:], memoryview(payload)),
        "another page's value": good[1],
        "length mismatch": good[0] + b"pad",
        "digest mismatch": bytes(value),
    }
    for why, value in [*bad.items(), ("truncated header", b"hello, mooncake")]:
        store.backend.delete([chain[0]])
        assert store.backend.set_nx([chain[0]], [value]).values == [True]  # written straight into Mooncake
        before = store.stats()
        assert store.get(chain) == ([], 0), why
        after = store.stats()
        assert after["integrity_misses"] - before["integrity_misses"] == 1 and store.last_integrity_miss == why
        assert after["hits"] == before["hits"] and after["misses"] - before["misses"] == 8
        assert store.lookup(chain) == 0  # the refused value was deleted
    assert store.put(chain[:1], [payload]) == 1 and store.get(chain)[1] == 8


def test_fingerprints_and_partitions_never_share_a_page(store):
    seen = set()
    for i, (fp, ns) in enumerate(FINGERPRINTS_AND_NAMESPACES):
        s = on(store, fp)
        chain = s.chain(range(3, 3 + 2 * fp.page_size), ns)  # 2 pages of each page size
        assert not seen & set(chain)
        seen |= set(chain)
        assert s.lookup(chain) == 0 and s.get(chain)[1] == 0  # none of the others' pages
        assert s.put(chain, [b"%d/%d" % (i, j) for j in range(2)]) == 2
    for i, (fp, ns) in enumerate(FINGERPRINTS_AND_NAMESPACES):
        s = on(store, fp)
        got, n = s.get(s.chain(range(3, 3 + 2 * fp.page_size), ns))
        assert n == 2 and [bytes(p) for p in got] == [b"%d/%d" % (i, j) for j in range(2)]


def test_a_killed_master_misses_without_raising_then_serves_again():
    _require_mooncake()
    with LocalMooncakeMaster() as m:
        store = PageStore.open(m.url, FP)
        chain = store.chain(tokens(4, 8))
        assert store.put(chain, [b"before"] * 8) == 8
        m.kill()
        late = PageStore.open(m.url, FP)  # opened while the master is down: set up when it is back
        start = time.monotonic()
        for i in range(100):
            assert store.lookup(chain) == 0 and store.get(chain, 2, touch=True) == ([], 0)
            assert store.put(store.chain(tokens(5 + i, 2)), [b"x", b"y"]) == 0 and late.lookup(chain) == 0
        assert time.monotonic() - start < 3  # each call fails fast: no call reaches Mooncake's 4 s retries
        s = store.stats()
        assert s["backend_errors"] >= 1 and s["backend_skips"] >= 1 and s["misses"] >= 600 and s["pages_failed"] == 200
        assert store.backend.info()["master_failing"]
        m.restart()  # empty: a restarted master has forgotten every key
        deadline = time.monotonic() + 10
        while store.put(chain, [b"after"] * 8) < 8:
            assert time.monotonic() < deadline, store.stats()
            time.sleep(0.05)
        got, n = late.get(chain)
        assert n == 8 and {bytes(p) for p in got} == {b"after"} and late.backend.info()["client_setups"] == 1
        assert not store.backend.info()["master_failing"]
        late.close()
        store.close()


def test_a_master_that_accepts_and_never_answers_costs_one_timeout_per_cool_off(master, store):
    chain = store.chain(tokens(7, 4))
    assert store.put(chain, [b"z"] * 4) == 4
    master.pause()
    try:
        slowest, start, calls = 0.0, time.monotonic(), 0
        while time.monotonic() - start < 1.5:
            t = time.monotonic()
            assert store.lookup(chain) == 0 and store.get(chain) == ([], 0)
            slowest, calls = max(slowest, time.monotonic() - t), calls + 1
        assert slowest < 0.25 + 0.25  # the request timeout (Mooncake's own is 30 s), and a connect that succeeds
        assert calls > 10  # most calls are skipped while it cools off
    finally:
        master.pause(False)
    deadline = time.monotonic() + 5
    while store.lookup(chain) < 4:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_eviction_at_the_watermark_serves_only_leading_runs():
    _require_mooncake()
    with LocalMooncakeMaster(16 << 20) as m:  # Mooncake's smallest segment: about 1,000 pages of 16 KiB
        store = PageStore.open(m.url, FP)
        payload = os.urandom(16 << 10)
        chains = [store.chain(tokens(i, 32)) for i in range(64)]  # 2,048 pages: twice what fits
        for chain in chains:
            store.put(chain, [payload] * 32)
            store.lookup(chains[0])  # the first chain is read all along: recently used, it stays
        time.sleep(0.2)
        holes = 0
        for chain in chains:
            present = [v is True for v in store.backend.exists(chain).values]
            got, n = store.get(chain)
            lead = present.index(False) if False in present else len(present)
            assert n == lead and all(bytes(p) == payload for p in got)  # never a page past a missing one
            holes += any(present[lead:])
        s = store.stats()
        assert s["integrity_misses"] == 0
        assert s["pages_written"] + s["pages_failed"] == 64 * 32 and sum(store.lookup(c) > 0 for c in chains) < 64
        assert store.lookup(chains[0]) == 32  # used all along: not evicted
        assert holes or s["pages_failed"], "nothing was evicted"
        store.close()


def test_open_store_mooncake_starts_its_own_master_and_stops_it():
    _require_mooncake()
    from radixkv.tiers.config import open_store

    store = open_store("mooncake", PS, kv_shape=(2, 4), dtype="float16")
    master = store.backend._client.master
    assert master.running and master.segments()
    chain = store.chain(range(3 * PS))
    assert store.put(chain, [bytes(2 * 4 * 2 * PS)] * 3) == 3 and store.get(chain)[1] == 3
    store.close()
    assert not master.running and not os.path.exists(master.dir)
    store = open_store("mooncake", PS)
    master = store.backend._client.master
    assert master.running
    del store
    gc.collect()
    assert not master.running and not os.path.exists(master.dir)


def test_a_cluster_over_its_own_mooncake_shares_one_master():
    """Cluster(store="mooncake"): the first instance's store starts a master, the others join it, so a
    page one instance wrote is served to another."""
    _require_mooncake()
    from radixkv.cluster import Cluster

    cluster = Cluster(2, num_blocks=8, page_size=2, store="mooncake")
    assert len({inst.cache.store.backend.url for inst in cluster.instances}) == 1
    cluster.admit([1, 2, 3, 4])[1].release()
    i, adm = cluster.admit([1, 2, 3, 4, 5, 6])
    adm.release()
    assert i == 1 and adm.hit_tokens == 4 and cluster.instances[1].cache.hit_tokens_by_tier["store"] == 4
    cluster.check()


def test_a_page_bound_becomes_a_whole_segment_and_a_watermark_that_hold_about_that_many_pages():
    """``segment_for_pages``: the segment in whole 16 MiB steps (other sizes abort the storage node), the
    watermark lowered so the rounding adds no pages; a bound under the smallest segment is refused."""
    from radixkv.store.mooncake_backend import (DEFAULT_WATERMARK, RESIDENT_BYTES_PER_VALUE_BYTE, SEGMENT_STEP,
                                                MooncakeMaster, segment_for_pages)

    for pages, value in ((250_000, 109), (136_300, 109), (1_000_000, 589), (10_000, 65_613)):
        segment, watermark = segment_for_pages(pages, value)
        assert segment % SEGMENT_STEP == 0 and 0 < watermark <= DEFAULT_WATERMARK
        held = segment * watermark / DEFAULT_WATERMARK / (value * RESIDENT_BYTES_PER_VALUE_BYTE)
        assert held == pytest.approx(pages, rel=1e-3)
    with pytest.raises(ArgumentValueError, match="below its smallest segment"):
        segment_for_pages(1000, 109)
    for bad in (24 << 20, -SEGMENT_STEP):
        with pytest.raises(ArgumentValueError, match="multiple of"):
            MooncakeMaster(bad)
    with pytest.raises(ArgumentValueError, match="watermark"):
        MooncakeMaster(SEGMENT_STEP, watermark=0)

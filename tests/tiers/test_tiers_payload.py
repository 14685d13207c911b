"""Payload integrity through demote / promote / cascade, checksums, and remote host faults."""

from __future__ import annotations

import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.tiers import HostTier, RemoteTier, SimulatedHosts, TieredCache

PS = 2
KV = (3,)


def page_value(tokens, i: int) -> np.ndarray:
    """The payload of page ``i`` of ``tokens``: a function of the whole prefix through it."""
    prefix = np.asarray(tokens[: (i + 1) * PS], dtype=np.uint32).tobytes()
    seed = zlib.crc32(prefix)
    return (np.arange(PS * KV[0], dtype=np.float32).reshape(PS, *KV) + seed % 9973).astype(np.float16)


def admit_and_verify(cache: TieredCache, tokens) -> int:
    """Admit ``tokens``, assert every hit page reads back its own bytes, write the new pages."""
    a = cache.admit(tokens)
    hit_pages = a.hit_tokens // PS
    got = cache.read(a.blocks[:hit_pages]) if hit_pages else []
    for i in range(hit_pages):
        assert np.array_equal(got[i], page_value(tokens, i)), f"page {i} of {tokens} read wrong bytes"
    if len(a.new_blocks):
        cache.write(a.new_blocks, np.stack([page_value(tokens, hit_pages + j) for j in range(len(a.new_blocks))]))
    a.release()
    return a.hit_tokens


requests = st.lists(st.lists(st.integers(0, 2), max_size=8), min_size=1, max_size=25)


@settings(max_examples=80)
@given(requests, st.integers(1, 4), st.integers(1, 4), st.integers(1, 3),
       st.sampled_from(["write_back", "write_through", "write_through_selective"]))
def test_bytes_read_for_a_hit_are_the_bytes_written(trace, a, b, c, policy):
    cache = TieredCache(max(a, 4), PS, kv_shape=KV, tiers=[HostTier(b), RemoteTier(blocks_per_host=c, num_hosts=2)],
                        write_policy=policy, load_back="always", write_through_threshold=1)
    for tokens in trace:
        admit_and_verify(cache, tokens)
        cache.check()
    assert cache.tier_stats().integrity_misses == 0


def test_corrupt_host_page_is_a_counted_miss():
    cache = TieredCache(2, PS, kv_shape=KV, tiers=[HostTier(4)], load_back="always")
    admit_and_verify(cache, [1, 1, 2, 2])
    admit_and_verify(cache, [3, 3, 4, 4])  # [1,1,2,2] now in the host tier
    host = cache.tiers[0]
    host.data[:] = 0.5  # overwrite every stored payload
    assert admit_and_verify(cache, [1, 1, 2, 2]) == 0
    stats = cache.tier_stats()
    assert stats.integrity_misses == 2  # both pages failed their checksums
    assert stats.hit_tokens_by_tier["host"] == 0
    cache.check()


def test_corrupt_second_page_keeps_the_first():
    cache = TieredCache(2, PS, kv_shape=KV, tiers=[HostTier(4)], load_back="always")
    admit_and_verify(cache, [1, 1, 2, 2])
    admit_and_verify(cache, [3, 3, 4, 4])
    node = next(n for n in cache._stack.tree.nodes() if n.ext is not None and n.num_pages == 2)
    cache.tiers[0].data[node.ext.slots[1]] = 0.5
    assert admit_and_verify(cache, [1, 1, 2, 2]) == PS
    assert cache.tier_stats().integrity_misses == 1
    cache.check()


def test_missing_remote_payload_is_a_miss():
    backend = SimulatedHosts(1)
    cache = TieredCache(2, PS, kv_shape=KV, tiers=[RemoteTier(blocks_per_host=4, backend=backend)],
                        load_back="always")
    admit_and_verify(cache, [1, 1, 2, 2])
    admit_and_verify(cache, [3, 3, 4, 4])
    backend.stores[0].clear()  # the server lost its data (restart without persistence)
    assert admit_and_verify(cache, [1, 1, 2, 2]) == 0
    assert cache.tier_stats().integrity_misses == 2
    cache.check()


def test_truncated_remote_value_is_a_miss():
    backend = SimulatedHosts(1)
    cache = TieredCache(2, PS, kv_shape=KV, tiers=[RemoteTier(blocks_per_host=4, backend=backend)],
                        load_back="always")
    admit_and_verify(cache, [1, 1, 2, 2])
    admit_and_verify(cache, [3, 3, 4, 4])
    for slot in backend.stores[0]:
        backend.stores[0][slot] = backend.stores[0][slot][:-1]
    assert admit_and_verify(cache, [1, 1, 2, 2]) == 0
    cache.check()


@settings(max_examples=40)
@given(requests, st.integers(0, 24), st.integers(0, 2))
def test_killing_a_remote_host_mid_replay_loses_only_its_copies(trace, kill_at, victim):
    backend = SimulatedHosts(3)
    cache = TieredCache(4, PS, kv_shape=KV, tiers=[RemoteTier(blocks_per_host=2, backend=backend)],
                        load_back="always")
    for i, tokens in enumerate(trace):
        if i == kill_at:
            backend.kill(victim)
        admit_and_verify(cache, tokens)  # never raises, never reads wrong bytes
        cache.check()
    tier = cache.tiers[0]
    if tier.lost_hosts:
        assert tier.lost_hosts == [victim] and tier.capacity == 4
        assert all(not np.any(n.ext.slots // 2 == victim)
                   for n in cache._stack.tree.nodes() if n.ext is not None)


def test_dead_host_pages_are_forgotten_and_counted():
    backend = SimulatedHosts(2)
    cache = TieredCache(2, PS, tiers=[RemoteTier(blocks_per_host=4, backend=backend)], load_back="always")
    for tokens in ([1, 1, 2, 2], [3, 3, 4, 4], [5, 5, 6, 6]):
        cache.admit(tokens).release()
    tier = cache.tiers[0]
    assert tier.used == 4  # [1,1,2,2] on host 0 (most free), [3,3,4,4] on host 1
    backend.kill(0)
    hits = []
    for tokens in ([3, 3, 4, 4], [1, 1, 2, 2]):
        a = cache.admit(tokens)
        a.release()
        hits.append(a.hit_tokens)
    assert hits == [2 * PS, 0]  # host 1 still serves; host 0's pages are gone
    stats = cache.tier_stats()
    assert stats.lost_pages == 2 and stats.integrity_misses == 0 and tier.lost_hosts == [0]
    assert tier.capacity == 4
    cache.check()


class RefusingHosts(SimulatedHosts):
    """Simulated hosts that refuse writes beyond ``room`` stored pages each (a server at maxmemory)."""

    def __init__(self, num_hosts: int, room: int) -> None:
        super().__init__(num_hosts)
        self.room = room
        self.refused = 0

    def put(self, host, slots, values):
        store = self._store(host)
        stored = []
        for slot, value in zip(slots, values):
            fits = len(store) < self.room or int(slot) in store
            if fits:
                store[int(slot)] = value
            stored.append(fits)
        self.refused += stored.count(False)
        return stored


def test_refused_remote_writes_drop_only_those_pages():
    backend = RefusingHosts(1, room=3)
    cache = TieredCache(2, PS, kv_shape=KV, tiers=[RemoteTier(blocks_per_host=8, backend=backend)],
                        load_back="always")
    for tokens in ([1, 1, 2, 2], [3, 3, 4, 4], [5, 5, 6, 6], [7, 7, 8, 8]):
        admit_and_verify(cache, tokens)  # 6 pages demoted: [1, 1, 2, 2] whole, the first of [3, 3, 4, 4]
        cache.check()
    tier = cache.tiers[0]
    stats = cache.tier_stats()
    assert backend.refused == 3 and stats.dropped_pages == 3 and tier.used == 3
    assert tier.lost_hosts == [] and stats.lost_pages == 0
    assert admit_and_verify(cache, [1, 1, 2, 2]) == 2 * PS  # stored before the server filled up
    assert admit_and_verify(cache, [3, 3, 4, 4]) == PS  # its second page was refused: a miss
    assert admit_and_verify(cache, [5, 5, 6, 6]) == 0
    assert cache.tier_stats().integrity_misses == 0
    cache.check()


def test_selective_copy_of_an_open_admission_waits_for_its_release():
    # Threshold 1: B's hit on A's pages makes them due while A's KV is still unwritten.
    cache = TieredCache(2, PS, kv_shape=KV, tiers=[HostTier(8)], write_policy="write_through_selective",
                        write_through_threshold=1, load_back="always")
    tokens = [1, 1, 2, 2]
    a = cache.admit(tokens)
    b = cache.admit(tokens)
    assert b.hit_tokens == 2 * PS and cache.tiers[0].used == 0  # nothing copied yet
    cache.write(a.new_blocks, np.stack([page_value(tokens, i) for i in range(2)]))
    a.release()
    assert cache.tiers[0].used == 2  # copied at A's release, with A's KV
    b.release()
    cache.admit([9, 9, 8, 8]).release()  # HBM drops A's pages; the host copy stays
    assert admit_and_verify(cache, tokens) == 2 * PS  # loaded back: A's bytes, not the stale ones
    assert cache.tier_stats().hit_tokens_by_tier["host"] == 2 * PS
    assert cache.tier_stats().integrity_misses == 0
    cache.check()


batches = st.lists(st.lists(st.lists(st.integers(0, 2), max_size=8), min_size=1, max_size=4),
                   min_size=1, max_size=12)


@settings(max_examples=100)
@given(batches, st.integers(2, 6), st.integers(1, 4),
       st.sampled_from(["write_back", "write_through", "write_through_selective"]), st.integers(1, 2),
       st.randoms(use_true_random=False))
def test_admissions_open_together_never_leave_unwritten_bytes_below_hbm(trace, a, b, policy, threshold, rnd):
    """Requests admitted in batches (all open at once, sharing prefixes), KV written after the whole batch
    is admitted, released in any order: every hit, from HBM or loaded back, reads its own bytes."""
    cache = TieredCache(a, PS, kv_shape=KV, tiers=[HostTier(b), RemoteTier(blocks_per_host=2, num_hosts=2)],
                        write_policy=policy, write_through_threshold=threshold, load_back="always")
    for batch in trace:
        opened = []
        for tokens in batch:
            adm = cache.admit(tokens)
            opened.append((tokens, adm))
            if rnd.random() < 0.3:
                cache.match(tokens)  # a second look at the same prefix counts a selective hit too
        for tokens, adm in opened:  # the prefill of the whole batch
            start = adm.hit_tokens // PS
            if len(adm.new_blocks):
                cache.write(adm.new_blocks, np.stack([page_value(tokens, start + j)
                                                      for j in range(len(adm.new_blocks))]))
        for tokens, adm in opened:
            got = cache.read(adm.blocks)
            for i in range(len(adm.blocks)):
                assert np.array_equal(got[i], page_value(tokens, i)), f"page {i} of {tokens} holds wrong bytes"
        rnd.shuffle(opened)
        for _, adm in opened:
            adm.release()
        cache.check()
        assert cache._open_writes == 0 and not cache._unwritten.any()
    assert cache.tier_stats().integrity_misses == 0

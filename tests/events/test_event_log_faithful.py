"""Events are a faithful log: a consumer applying every event holds exactly what every tier holds.

The consumer model keeps, per medium, the set of page hashes the events say are there, and refuses
an event that contradicts it (a page stored twice on one medium, or removed from a medium it is not
on). After every step it must equal the residency recomputed from the HBM tree and the spill tree,
page by page, with hashes computed independently of the event log.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from typing import Dict, Iterable, Set

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.events import (
    MEDIUM_GPU, TIER_MEDIUM, AllBlocksCleared, BlockDemoted, BlockPromoted, BlockRemoved, BlockStored, KVCacheEvent,
)
from radixkv.events.hashing import BlockHasher, external_block_hash
from radixkv.keys import TOKEN_DTYPE
from radixkv.tiers import HostTier, RemoteTier, SimulatedHosts, TieredCache
from radixkv.tiers.base import Copy

from ..tiers.test_tiers_payload import KV, PS
from ..tiers.test_tiers_payload import admit_and_verify as serve


class Consumer:
    """A router's view of the cache, built from events alone: medium -> page hashes there."""

    def __init__(self) -> None:
        self.media: Dict[str, Set[int]] = defaultdict(set)

    def _add(self, medium: str, hashes: Iterable[int], event: KVCacheEvent) -> None:
        held = self.media[medium]
        for h in hashes:
            assert h not in held, f"{event}: page {h} is already on {medium}"
            held.add(h)

    def _remove(self, medium: str, hashes: Iterable[int], event: KVCacheEvent) -> None:
        held = self.media[medium]
        for h in hashes:
            assert h in held, f"{event}: page {h} is not on {medium}"
            held.remove(h)

    def apply(self, events: Iterable[KVCacheEvent]) -> None:
        for e in events:
            if isinstance(e, (BlockStored, BlockDemoted)):
                self._add(e.medium, e.block_hashes, e)
            elif isinstance(e, BlockRemoved):
                self._remove(e.medium, e.block_hashes, e)
            elif isinstance(e, BlockPromoted):
                self._remove(e.source_medium, e.block_hashes, e)
            elif isinstance(e, AllBlocksCleared):
                self.media.clear()
            else:
                raise AssertionError(f"unknown event {e!r}")

    def view(self) -> Dict[str, Set[int]]:
        return {m: set(h) for m, h in self.media.items() if h}


def medium_of(tier_name: str) -> str:
    return TIER_MEDIUM.get(tier_name, tier_name.upper())


def nodes_below(root, page_bytes: int):
    """Every node under ``root`` (of either tree), with the tokens of its sequence from the first page through it."""
    todo = [(child, b"") for child in (root.children or {}).values()]
    while todo:
        node, prefix = todo.pop()
        data = prefix + node.key[: node.num_pages * page_bytes]
        yield node, np.frombuffer(data, dtype=TOKEN_DTYPE).tolist()
        todo.extend((child, data) for child in (node.children or {}).values())


def residency(cache: TieredCache) -> Dict[str, Set[int]]:
    """medium -> hashes of the pages each tier holds now, from the trees (not from the event log)."""
    hasher = BlockHasher()  # the cache's default, recomputed from each page's whole prefix
    namespace = {id(root): ns for ns, root in cache._tree.roots()}
    pb = cache._tree.page_bytes
    out: Dict[str, Set[int]] = defaultdict(set)

    def hashes(node, tokens, ns) -> list:
        return [external_block_hash(h) for h in hasher.hash_pages(tokens, cache.page_size, namespace=ns)[node.start:]]

    for ns, root in cache._tree.roots():
        for node, tokens in nodes_below(root, pb):
            out[MEDIUM_GPU].update(hashes(node, tokens, ns))
    for key, root in cache._stack.tree.roots():
        ns = namespace[id(key)]
        for node, tokens in nodes_below(root, pb):
            if isinstance(node.ext, Copy):
                out[medium_of(node.ext.tier.name)].update(hashes(node, tokens, ns))
    return {m: h for m, h in out.items() if h}


def assert_faithful(cache: TieredCache, consumer: Consumer) -> None:
    consumer.apply(cache.take_events())
    assert consumer.view() == residency(cache)


def _cache(**kwargs) -> TieredCache:
    return TieredCache(kwargs.pop("num_blocks", 2), page_size=PS, kv_shape=KV, enable_events=True, **kwargs)


def test_a_cascade_to_the_next_tier_is_reported_on_both_media():
    cache = _cache(tiers=[HostTier(2), RemoteTier(8)], load_back="always")
    consumer = Consumer()
    serve(cache, [1, 1, 2, 2])
    serve(cache, [3, 3, 4, 4])                  # [1,1,2,2] demoted to the host
    assert_faithful(cache, consumer)
    serve(cache, [5, 5, 6, 6])                  # the host cascades it to the remote tier
    events = cache.take_events()
    removed = [e for e in events if isinstance(e, BlockRemoved) and e.medium == "CPU"]
    moved = [e for e in events if isinstance(e, BlockDemoted) and e.medium == "REMOTE"]
    assert removed and moved and moved[0].source_medium == "CPU"
    assert removed[0].block_hashes == moved[0].block_hashes
    consumer.apply(events)
    assert consumer.view() == residency(cache)


def test_pages_placed_in_the_second_tier_carry_its_medium():
    cache = _cache(num_blocks=4, tiers=[HostTier(1), RemoteTier(8)])
    consumer = Consumer()
    serve(cache, [1, 1, 2, 2, 3, 3, 4, 4])
    serve(cache, [5, 5, 6, 6, 7, 7, 8, 8])      # 4 pages leave HBM: 1 fits the host, 3 go remote
    events = cache.take_events()
    media = sorted(m for e in events if isinstance(e, BlockDemoted) for m in [e.medium] * len(e.block_hashes))
    assert media == ["CPU", "REMOTE", "REMOTE", "REMOTE"]
    consumer.apply(events)
    assert consumer.view() == residency(cache)


def test_pages_dropped_from_the_last_tier_are_removed_from_it():
    cache = _cache(tiers=[HostTier(2)])
    consumer = Consumer()
    for tokens in ([1, 1, 2, 2], [3, 3, 4, 4], [5, 5, 6, 6]):   # the third evicts the host's pages
        serve(cache, tokens)
        assert_faithful(cache, consumer)
    assert "CPU" in consumer.view() and len(consumer.view()["CPU"]) == 2


class Refusing(SimulatedHosts):
    def put(self, host, slots, values):
        return [False] * len(slots)             # a server out of memory: nothing stored


def test_a_refused_write_is_never_reported_as_stored():
    cache = _cache(tiers=[RemoteTier(8, backend=Refusing(1))])
    consumer = Consumer()
    serve(cache, [1, 1, 2, 2])
    serve(cache, [3, 3, 4, 4])
    events = cache.take_events()
    assert not [e for e in events if isinstance(e, BlockDemoted)]
    consumer.apply(events)
    assert consumer.view() == residency(cache)


def test_write_through_copies_are_reported_and_a_load_keeps_them():
    cache = _cache(tiers=[HostTier(8)], write_policy="write_through", load_back="always")
    consumer = Consumer()
    serve(cache, [1, 1, 2, 2])                  # copied to the host at release
    events = cache.take_events()
    assert [e.medium for e in events if isinstance(e, BlockDemoted)] == ["CPU"]
    consumer.apply(events)
    serve(cache, [3, 3, 4, 4])                  # HBM drops [1,1,2,2]; the host keeps its copy
    serve(cache, [1, 1, 2, 2])                  # loaded back: the host copy stays
    events = cache.take_events()
    assert not [e for e in events if isinstance(e, BlockPromoted)]
    consumer.apply(events)
    assert consumer.view() == residency(cache)
    assert len(consumer.view()["CPU"]) == 4


@settings(max_examples=60, deadline=None)
@given(write_policy=st.sampled_from(["write_back", "write_through", "write_through_selective"]),
       load_back=st.sampled_from(["always", "cost", "never"]),
       sizes=st.tuples(st.integers(2, 4), st.integers(1, 3), st.integers(1, 3)),
       trace=st.lists(st.tuples(st.lists(st.integers(0, 2), max_size=8), st.sampled_from([None, "t"]),
                                st.sampled_from(["admit", "evict", "reset", "kill"])), min_size=1, max_size=25))
def test_the_event_log_matches_every_tier_after_every_step(write_policy, load_back, sizes, trace):
    hbm, host, remote = sizes
    backend = SimulatedHosts(2)
    cache = _cache(num_blocks=hbm, tiers=[HostTier(host), RemoteTier(remote, backend=backend)],
                   write_policy=write_policy, load_back=load_back, write_through_threshold=1)
    consumer = Consumer()
    for tokens, namespace, op in trace:
        if op == "admit":
            a = cache.admit(tokens, namespace=namespace)
            if len(a.new_blocks):
                cache.write(a.new_blocks, np.ones((len(a.new_blocks), PS, *KV), dtype=np.float16))
            a.release()
        elif op == "evict":
            cache.evict(len(tokens) // PS)
        elif op == "reset":
            cache.reset()
        elif not backend.dead:
            backend.kill(0)                     # a remote host dies: its copies are forgotten on the next call
        cache.check()
        assert_faithful(cache, consumer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_faithful(cache, consumer)

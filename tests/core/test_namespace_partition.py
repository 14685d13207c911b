"""Namespaces are a partition: no page, hash, tier copy, event or policy history is shared.

The property: what one namespace sees (hits, residency, eviction order, the
policy's state of its pages, the events naming its pages) does not depend on
what the other namespaces' tokens are. Each schedule runs twice, once with
every namespace using the same token pool (the adversarial case) and once
with each namespace's tokens moved to a range of its own; both runs must
observe exactly the same, page for page. Namespaces are generated to look
alike: prefixes of each other, JSON and tuple encodings of each other,
``None`` next to ``""``.
"""

from __future__ import annotations

import json
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.adapters.vllm import VLLMBlockView
from radixkv.events import BlockRemoved, BlockStored
from radixkv.events.hashing import BlockHasher, external_block_hashes, namespace_extra_keys
from radixkv.policies import AdaptiveRetention, HitDensity, S3FIFO, TwoQ, WorkloadAware, available, create
from radixkv.tiers import HostTier, RemoteTier, TieredCache
from radixkv.workload.traces import Request

from ..strategies import cached_pages
from .test_namespaces import _run_tiered

PAGE_SIZE = 1
SPREAD = 1000  # namespace i's tokens move to [i * SPREAD, (i + 1) * SPREAD) in the apart run

namespace_texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=6)


@st.composite
def lookalike_namespaces(draw) -> List[Optional[str]]:
    """2 to 4 distinct namespaces, most of them derived from one base string to look alike."""
    base = draw(namespace_texts)
    other = draw(namespace_texts)
    derived = [
        None, "", base, base + other, other + base, base + "\x00", json.dumps(base), json.dumps([base]),
        json.dumps([base, None]), json.dumps([None, base]), json.dumps([base, other]), repr((base,)),
        repr((base, other)), str(None), "null",
    ]
    pick = st.sampled_from(derived) | namespace_texts | st.none()
    return draw(st.lists(pick, min_size=2, max_size=4, unique=True))


# A small token pool with shared prefixes; a schedule step is (namespace index, tokens).
prompts = st.lists(st.integers(0, 3), min_size=1, max_size=6)
schedules = st.lists(st.tuples(st.integers(0, 3), prompts), min_size=1, max_size=16)
short_schedules = st.lists(st.tuples(st.integers(0, 3), prompts), min_size=1, max_size=12)


def _policy(name: str):
    """Policy ``name``, set to learn within a short schedule (2Q and adaptive solve every tick)."""
    if name in ("2q", "adaptive"):
        return create(name, solve_every=1)
    return create(name)


class _Observer:
    """Runs a schedule on one cache and records what each namespace observes, in pool tokens."""

    def __init__(self, cache: PrefixCache, namespaces: Sequence[Optional[str]], shifts: Sequence[int]) -> None:
        self.cache = cache
        self.namespaces = list(namespaces)
        self.shifts = list(shifts)
        self.index = {ns: i for i, ns in enumerate(namespaces)}
        self.owner: Dict[int, Tuple[int, tuple]] = {}  # external hash -> (namespace index, pool prefix)
        self.log: List[object] = []

    def tokens(self, i: int, prompt: Sequence[int]) -> List[int]:
        return [t + self.shifts[i] for t in prompt]

    def page_key(self, ns: Optional[str], prefix: tuple) -> Tuple[int, tuple]:
        i = self.index[ns]
        return i, tuple(t - self.shifts[i] for t in prefix)

    def residency(self) -> Dict[Tuple[int, tuple], object]:
        """Every cached page with its node's policy state (the policy's decision about it)."""
        state = {}
        for node in self.cache._tree.nodes():
            state.update(dict.fromkeys(node.blocks.tolist(), node.policy_state))
        return {self.page_key(ns, prefix): state[block] for (ns, prefix), block in cached_pages(self.cache).items()}

    def learn_hashes(self, i: int, tokens: List[int]) -> None:
        """Record the hash of every page of ``tokens`` in namespace ``i``; no two pages may share one."""
        ns = self.namespaces[i]
        hashes = external_block_hashes(self.cache.event_log.hasher.hash_pages(tokens, PAGE_SIZE, namespace=ns))
        for j, h in enumerate(hashes):
            key = self.page_key(ns, tuple(tokens[: (j + 1) * PAGE_SIZE]))
            assert self.owner.setdefault(h, key) == key, f"{key} and {self.owner[h]} share hash {h}"

    def events(self) -> List[tuple]:
        """The events since the last call, each page named by (namespace index, pool prefix)."""
        out = []
        for event in self.cache.take_events():
            keys = [self.owner[h] for h in event.block_hashes]  # KeyError: a hash no page of ours has
            if isinstance(event, BlockStored):
                if event.parent_block_hash is None:
                    first = event.extra_keys[0] if event.extra_keys else None
                    namespace = self.namespaces[keys[0][0]]
                    # published untagged, as vLLM publishes them (hashed as namespace_extra_keys)
                    assert first == (None if namespace is None else (namespace,)), (
                        f"{keys[0]} stored with extra keys {first!r}")
                    assert namespace_extra_keys(namespace, 0) == (
                        None if namespace is None else (("cache_salt", namespace),))
                out.append(("stored", event.medium, keys))
            elif isinstance(event, BlockRemoved):
                out.append(("removed", event.medium, keys))
            else:
                out.append((type(event).__name__, getattr(event, "medium", None), keys))
        return out

    def step(self, i: int, prompt: Sequence[int]) -> None:
        cache, ns = self.cache, self.namespaces[i]
        tokens = self.tokens(i, prompt)
        if cache.event_log is not None:
            self.learn_hashes(i, tokens)
        peek = cache.peek(tokens, namespace=ns) if hasattr(cache, "peek") else None
        with cache.admit(tokens, namespace=ns) as admission:
            pass
        cache.check()
        self.log.append((i, peek, admission.hit_tokens, len(admission.new_blocks), self.residency()))
        if cache.event_log is not None:
            self.log.append(self.events())

    def drain(self) -> None:
        """Evict one page at a time: the order is the policy's ranking of every page left."""
        before = self.residency()
        while before:
            assert self.cache.evict(1) == 1
            self.cache.check()
            after = self.residency()
            self.log.append(sorted(set(before) - set(after)))
            before = after
        if self.cache.event_log is not None:
            self.log.append(self.events())


def observe(make_cache: Callable[[], PrefixCache], namespaces, schedule, apart: bool) -> List[object]:
    """What every namespace observes running ``schedule``; ``apart`` gives each namespace its own tokens."""
    shifts = [i * SPREAD if apart else 0 for i in range(len(namespaces))]
    steps = [(i % len(namespaces), prompt) for i, prompt in schedule]
    cache = make_cache()
    observer = _Observer(cache, namespaces, shifts)
    if cache.policy.offline:
        cache.policy.prepare([Request(np.array(observer.tokens(i, prompt), dtype=np.uint32), namespace=namespaces[i])
                              for i, prompt in steps], PAGE_SIZE, cache.clock + 1)
    for i, prompt in steps:
        observer.step(i, prompt)
    observer.drain()
    return observer.log


def assert_partition(make_cache, namespaces, schedule) -> None:
    together = observe(make_cache, namespaces, schedule, apart=False)
    apart = observe(make_cache, namespaces, schedule, apart=True)
    for step, (a, b) in enumerate(zip(together, apart)):
        assert a == b, f"observation {step} differs when the namespaces share tokens:\n{a}\n{b}"
    assert len(together) == len(apart)


# ---------------------------------------------------------------------------- policy history (11.10)
def _ghost_policies():
    two_q = TwoQ(solve_every=10**6)
    two_q.window = 100  # protected pages outrank first uses for 100 ticks
    adaptive = AdaptiveRetention(solve_every=10**6)
    adaptive.windows = np.array([0.0] * 4 + [100.0] * 8)  # reused classes (use level >= 1) stay 100 ticks
    learned = {}
    for cls in (WorkloadAware, HitDensity):  # reused pages (use level >= 2) stay 100 ticks
        policy = learned[cls.name] = cls(refit_every=10**6)
        policy.windows = [100.0 if c >= policy.class_of(2, 0, 0) else 0.0 for c in range(policy.num_classes)]
    return {"s3fifo": S3FIFO(), "2q": two_q, "adaptive": adaptive, **learned}


@pytest.mark.parametrize("name", ["s3fifo", "2q", "adaptive", "wa", "density"])
def test_one_namespaces_evictions_do_not_rank_anothers_identical_pages(name):
    # Tenant a caches [1, 2] and loses it to its own later prompts (its ghost/history remembers
    # it); then tenant b caches the same tokens [1, 2] for the first time, and more prompts of
    # its own. b's pages must be ranked as first uses, exactly as if a had used other tokens.
    schedule = [(0, [1, 2]), (0, [3, 4]), (0, [5, 6]), (0, [7, 8]), (0, [9, 10]),
                (1, [1, 2]), (1, [11, 12]), (1, [13, 14]), (1, [15, 16])]

    def make():
        return PrefixCache(num_blocks=8, page_size=PAGE_SIZE, policy=_ghost_policies()[name])

    assert_partition(make, ["tenant-a", "tenant-b"], schedule)


# ---------------------------------------------------------------------------- the class
@given(namespaces=lookalike_namespaces(), schedule=schedules, capacity=st.integers(2, 6))
@pytest.mark.parametrize("policy", available())
def test_namespaces_are_a_partition_for_every_policy(policy, namespaces, schedule, capacity):
    assert_partition(
        lambda: PrefixCache(num_blocks=capacity, page_size=PAGE_SIZE, policy=_policy(policy), enable_events=True),
        namespaces, schedule)


@given(namespaces=lookalike_namespaces(), schedule=short_schedules, capacity=st.integers(2, 4),
       write_policy=st.sampled_from(["write_back", "write_through"]))
@pytest.mark.parametrize("policy", ["lru", "s3fifo", "2q", "adaptive"])
def test_namespaces_are_a_partition_through_the_tiers(policy, namespaces, schedule, capacity, write_policy):
    def make():
        return TieredCache(capacity, PAGE_SIZE, policy=_policy(policy), write_policy=write_policy,
                           tiers=[HostTier(3, policy=_policy(policy)),
                                  RemoteTier(blocks_per_host=2, num_hosts=2, policy=_policy(policy))],
                           load_back="always", enable_events=True)

    assert_partition(make, namespaces, schedule)


@given(namespaces=lookalike_namespaces(), ops=st.lists(
    st.tuples(st.sampled_from(["admit", "admit", "evict"]), prompts, st.integers(0, 3), st.integers(0, 3)),
    min_size=1, max_size=20))
def test_lookalike_namespaces_never_read_each_others_kv(namespaces, ops):
    _run_tiered([(op, tokens, namespaces[i % len(namespaces)], n) for op, tokens, i, n in ops])


@given(namespaces=lookalike_namespaces(), tokens=st.lists(st.integers(0, 3), min_size=1, max_size=8),
       page_size=st.sampled_from([1, 2]))
def test_lookalike_namespaces_never_share_a_hash(namespaces, tokens, page_size):
    hasher = BlockHasher()
    owner: Dict[bytes, Optional[str]] = {}
    for ns in namespaces:
        for h in hasher.hash_pages(tokens, page_size, namespace=ns):
            assert owner.setdefault(h, ns) == ns, f"{ns!r} and {owner[h]!r} share a page hash"
    external = [set(external_block_hashes(hasher.hash_pages(tokens, page_size, namespace=ns))) for ns in namespaces]
    assert sum(map(len, external)) == len(set().union(*external))
    # A vLLM router asking with one cache_salt finds that namespace's blocks and no other's.
    cache = PrefixCache(num_blocks=len(namespaces) * len(tokens), page_size=page_size, enable_events=True)
    blocks = {}
    for ns in namespaces:
        with cache.admit(tokens, namespace=ns) as admission:
            blocks[ns] = admission.blocks.tolist()
    view = VLLMBlockView(cache)
    for ns in namespaces:
        assert view.find_longest_cache_hit(view.block_hashes(tokens, cache_salt=ns)) == blocks[ns]

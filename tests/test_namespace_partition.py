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

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.events import BlockRemoved, BlockStored
from radixkv.hashing import external_block_hashes, namespace_extra_keys
from radixkv.policies import AdaptiveRetention, S3FIFO, TwoQ
from radixkv.traces import Request

from .strategies import cached_pages

PAGE_SIZE = 1
SPREAD = 1000  # namespace i's tokens move to [i * SPREAD, (i + 1) * SPREAD) in the apart run


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
                    assert first == namespace_extra_keys(self.namespaces[keys[0][0]], 0), (
                        f"{keys[0]} stored with extra keys {first!r}")
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
    return {"s3fifo": S3FIFO(), "2q": two_q, "adaptive": adaptive}


@pytest.mark.parametrize("name", ["s3fifo", "2q", "adaptive"])
def test_one_namespaces_evictions_do_not_rank_anothers_identical_pages(name):
    # Tenant a caches [1, 2] and loses it to its own later prompts (its ghost/history remembers
    # it); then tenant b caches the same tokens [1, 2] for the first time, and more prompts of
    # its own. b's pages must be ranked as first uses, exactly as if a had used other tokens.
    schedule = [(0, [1, 2]), (0, [3, 4]), (0, [5, 6]), (0, [7, 8]), (0, [9, 10]),
                (1, [1, 2]), (1, [11, 12]), (1, [13, 14]), (1, [15, 16])]

    def make():
        return PrefixCache(num_blocks=8, page_size=PAGE_SIZE, policy=_ghost_policies()[name])

    assert_partition(make, ["tenant-a", "tenant-b"], schedule)

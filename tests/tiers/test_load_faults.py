"""A tier policy's ``on_evict`` raising at any point of a load from below strands no copy.

A load-back (write-back) releases the host copies it reads, then HBM makes room for them,
which demotes HBM pages to the host, which may evict its own. The fault is injected at
each ``on_evict`` call of that operation in turn (first, second, ...): after the error
propagates, ``check()`` passes (no lower copy left where no lookup reaches it, every slot
held by a page) and every page later served reads back the bytes written for it.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import pytest

from radixkv.policies import LRU
from radixkv.tiers import HostTier, RemoteTier, Tier, TieredCache
from radixkv.tiers.tiered import stranded_copies

from ..review.test_review_r17 import HookError, RaisingLRU
from .test_tiers_payload import KV, PS, admit_and_verify


class NthEvictLRU(RaisingLRU):
    """:class:`RaisingLRU` whose ``on_evict`` raises at its ``raise_at``-th call once armed, once."""

    name = "nth-evict-lru"

    def __init__(self) -> None:
        super().__init__()
        self.raise_at = 0  # 0: never
        self.calls = 0

    def arm(self, raise_at: int) -> None:
        self.raise_at, self.calls = raise_at, 0

    def on_evict(self, node, pages, rank):
        if self.raise_at:
            self.calls += 1
            if self.calls == self.raise_at:
                self.raise_at = 0
                raise HookError("on_evict")
        super().on_evict(node, pages, rank)


def pages(*ids: int) -> List[int]:
    """Tokens of pages ``ids`` (page ``k`` is ``[k] * PS``)."""
    return [k for k in ids for _ in range(PS)]


# The host holds [1 2] with two branches [3] and [4] below it (and whatever else the setup left).
BRANCHES = [pages(1, 2, 3), pages(1, 2, 4), pages(5, 6, 7, 8)]

SCENARIOS = {
    # releases [1 2] then [3]: raising at [3] left [1 2] a placeholder above the copy of [4]
    "load": (4, lambda p: [HostTier(8, policy=p)], BRANCHES, pages(1, 2, 3)),
    # the load's room demotes [5 6 7 8] to a full host, which evicts (drops) its own pages
    "load, host evicts": (4, lambda p: [HostTier(4, policy=p)], BRANCHES, pages(1, 2, 3, 9)),
    # as above, the host's victims cascading to a remote tier
    "load, host demotes": (4, lambda p: [HostTier(4, policy=p), RemoteTier(blocks_per_host=8)],
                           BRANCHES + [pages(10, 11)], pages(1, 2, 3, 9)),
}


def _build(hbm: int, tiers: Callable[[LRU], Sequence[Tier]], setup: List[List[int]]):
    policy = NthEvictLRU()
    cache = TieredCache(hbm, PS, policy=LRU(), kv_shape=KV, tiers=tiers(policy), load_back="always")
    for tokens in setup:
        admit_and_verify(cache, tokens)
    cache.check()
    return cache, policy


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_tier_on_evict_raising_at_any_call_of_a_load_strands_no_copy(scenario):
    hbm, tiers, setup, op = SCENARIOS[scenario]
    raised = 0
    for raise_at in range(1, 100):
        cache, policy = _build(hbm, tiers, setup)
        policy.arm(raise_at)
        try:
            admit_and_verify(cache, op)
        except HookError:
            raised += 1
        else:
            break  # the operation made fewer than raise_at on_evict calls: every one was tried
        finally:
            policy.arm(0)
        cache.check()
        assert stranded_copies(cache) == [], f"raising at on_evict call {raise_at}"
        for tokens in setup + [op] + setup:  # whatever is served reads back its own bytes
            admit_and_verify(cache, tokens)
            cache.check()
    assert raised >= 2, f"{scenario}: the operation made {raised} on_evict calls"

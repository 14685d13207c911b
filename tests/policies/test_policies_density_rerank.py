"""density without class lanes re-ranks a victim by the current windows: exact orders when a refit lengthened or shortened them."""

from __future__ import annotations

from radixkv import PrefixCache
from radixkv.policies import RequestHints
from radixkv.policies.density import HitDensity

from ..strategies import cached_pages

LONG = RequestHints(output_length=200)  # output bucket 2 of the edges (32, 128)
SHORT = RequestHints(output_length=5)  # output bucket 0


def _set(policy: HitDensity, long_window: float) -> None:
    """Window ``long_window`` for every class of the long-output category, 0 for the others."""
    assert policy.category(1, LONG) == 2 and policy.category(1, SHORT) == 0
    policy.windows = [long_window if c == 2 else 0.0
                      for u in range(1, 5) for q in range(4) for c in range(policy.categories)]


def _order(cache: PrefixCache) -> list:
    before = {k[1] for k in cached_pages(cache)}
    order = []
    while before:
        assert cache.evict(1) == 1
        cache.check()
        after = {k[1] for k in cached_pages(cache)}
        (gone,) = before - after
        order.append(gone)
        before = after
    return order


def _spares(policy: HitDensity) -> list:
    """Count the victims ``policy`` spares (the engine reads ``on_victim`` from the policy at each eviction)."""
    spared = []
    on_victim = policy.on_victim

    def counting(node):
        run = on_victim(node)
        if run == 0:
            spared.append(node.end)
        return run
    policy.on_victim = counting
    return spared


def test_a_window_lengthened_since_the_last_use_raises_the_victims_rank():
    policy = HitDensity(output_edges=(32, 128), refit_every=10**6, class_lanes=False)
    _set(policy, 0.0)
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    cache.admit([1], hints=LONG).release()  # t1: deadline 1 under the windows of t1
    cache.admit([5], hints=SHORT).release()  # t2: deadline 2
    cache.admit([7], hints=SHORT).release()  # t3: deadline 3
    _set(policy, 100.0)  # a refit: long-output pages are now worth 100 ticks
    spared = _spares(policy)
    # [1] surfaces first, is spared at 1 + 100 = 101, and goes last
    assert _order(cache) == [(5,), (7,), (1,)]
    assert spared == [1]  # one spare: the second time it surfaces its deadline is current


def test_a_window_shortened_since_the_last_use_keeps_the_older_rank():
    policy = HitDensity(output_edges=(32, 128), refit_every=10**6, class_lanes=False)
    _set(policy, 100.0)
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    cache.admit([1], hints=LONG).release()  # t1: deadline 101
    cache.admit([5], hints=SHORT).release()  # t2: deadline 2
    cache.admit([7], hints=SHORT).release()  # t3: deadline 3
    cache.admit([9], hints=LONG).release()  # t4: deadline 104
    _set(policy, 0.0)  # ranks may only rise: [1] and [9] keep 101 and 104
    spared = _spares(policy)
    assert _order(cache) == [(5,), (7,), (1,), (9,)]
    assert spared == []


def test_without_rerank_the_deadline_of_the_last_use_stands():
    policy = HitDensity(output_edges=(32, 128), refit_every=10**6, class_lanes=False)
    policy.rerank = False
    _set(policy, 0.0)
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    cache.admit([1], hints=LONG).release()
    cache.admit([5], hints=SHORT).release()
    cache.admit([7], hints=SHORT).release()
    _set(policy, 100.0)
    assert _order(cache) == [(1,), (5,), (7,)]

"""Eviction policies: exact eviction orders, Belady as the ceiling, retention priorities and pins,
and bad input. (The conformance state machine runs per policy in test_cache_state.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from radixkv import LockError, PrefixCache, UnknownPolicyError
from radixkv.workload import generators
from radixkv.cli import main
from radixkv.costs import CostModel, get_hardware, get_model
from radixkv.policies import available, create
from radixkv.policies.adaptive import AdaptiveRetention, solve_windows
from radixkv.policies.base import history_key
from radixkv.policies.belady import NEVER, Belady, next_uses
from radixkv.policies.gdsf import GDSF
from radixkv.policies.twoq import TwoQ
from radixkv.analysis.replay import replay
from radixkv.workload.traces import Request

from ..strategies import cached_pages, snapshot


# ---------------------------------------------------------------------------- exact orders
A, B, C, D = [1, 2, 3], [1, 2, 4], [5, 6], [7]
SCRIPT = [A, B, C, C, C, D, B]  # clock 1..7
PAGES = {(1,), (1, 2), (1, 2, 3), (1, 2, 4), (5,), (5, 6), (7,)}


def eviction_order(policy, future=()):
    """Admit SCRIPT (page size 1, no pressure), then evict one page at a time; the pages in order."""
    cache = PrefixCache(num_blocks=16, page_size=1, policy=policy)
    if isinstance(cache.policy, Belady):
        cache.policy.prepare([Request(np.array(r, dtype=np.uint32)) for r in SCRIPT + list(future)], 1)
    for tokens in SCRIPT:
        cache.admit(tokens).release()
    before = set(k[1] for k in cached_pages(cache))
    assert before == PAGES
    order = []
    while before:
        assert cache.evict(1) == 1
        cache.check()
        after = set(k[1] for k in cached_pages(cache))
        (gone,) = before - after
        order.append(gone)
        before = after
    return [list(p) for p in order]


EXPECTED_ORDERS = {
    # last use: [1,2,3] t1, [5,6] t5, [7] t6, [1,2,4] t7; deepest first on ties
    "lru": [[1, 2, 3], [5, 6], [5], [7], [1, 2, 4], [1, 2], [1]],
    # insertion: [1,2,3] (and its upper part [1,2]) t1, [4] t2, [5,6] t3, [7] t6
    "fifo": [[1, 2, 3], [1, 2, 4], [1, 2], [1], [5, 6], [5], [7]],
    # values L+freq: [3] 1, [7] 1 (newer), [4] 2, [5,6] 3 (t5), [1,2] 3 (t7)
    "lfu": [[1, 2, 3], [7], [1, 2, 4], [5, 6], [5], [1, 2], [1]],
    # probationary (used once) [3], [7] first, then protected by last use
    "slru": [[1, 2, 3], [7], [5, 6], [5], [1, 2, 4], [1, 2], [1]],
    # hand: [3] unvisited -> out; [4], [5,6] visited -> spared; [7] out; [4] out; [1,2] spared; [5,6] out
    "sieve": [[1, 2, 3], [7], [1, 2, 4], [5, 6], [5], [1, 2], [1]],
    # S due 1; [4], [5,6] used in S -> main; [7] out; main ties go deepest first, then queue order
    "s3fifo": [[1, 2, 3], [7], [1, 2, 4], [5, 6], [1, 2], [5], [1]],
    # value = freq * recompute cost of the tail page (a + b*depth): [7] a, [3] a+2b, [4] 2(a+2b),
    # [5,6] 3(a+b) = [1,2] 3(a+b) -> older first
    "gdsf": [[7], [1, 2, 3], [1, 2, 4], [5, 6], [5], [1, 2], [1]],
    # windows all 0 before the first solve: LRU
    "adaptive": [[1, 2, 3], [5, 6], [5], [7], [1, 2, 4], [1, 2], [1]],
    # window 0 until a protected page is used again: LRU
    "2q": [[1, 2, 3], [5, 6], [5], [7], [1, 2, 4], [1, 2], [1]],
    # T1 (used once): [3] t1, [7] t6; T2: [5,6] t5, [4] and [1,2] t7; target p = 0: T1 first, LRU in each
    "arc": [[1, 2, 3], [7], [5, 6], [5], [1, 2, 4], [1, 2], [1]],
    # no reuse interval ([3], [7]) first, oldest first; then max(interval, age) at t7:
    # [4] max(5, 0), [1,2] max(5, 0), [5,6] max(1, 2)
    "lirs": [[1, 2, 3], [7], [1, 2, 4], [1, 2], [1], [5, 6], [5]],
    # windows all 0 until enough history: LRU (learned orders: test_policies_density.py)
    "wa": [[1, 2, 3], [5, 6], [5], [7], [1, 2, 4], [1, 2], [1]],
    "density": [[1, 2, 3], [5, 6], [5], [7], [1, 2, 4], [1, 2], [1]],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_ORDERS))
def test_exact_eviction_order(name):
    assert eviction_order(name) == EXPECTED_ORDERS[name]


def test_every_registered_policy_has_a_pinned_order():
    assert set(available()) == set(EXPECTED_ORDERS) | {"belady"}


def test_belady_order_follows_next_use():
    # future: [7] at t8, [1,2,3] at t9, [5] at t10; [1,2,4] and [5,6] are never used again
    order = eviction_order("belady", future=[[7], [1, 2, 3], [5]])
    assert order == [[1, 2, 4], [5, 6], [5], [1, 2, 3], [1, 2], [1], [7]]


def test_adaptive_order_follows_learned_windows():
    policy = AdaptiveRetention(solve_every=1000)
    # class = use level * 4 + size class; these requests are all in size class 0
    policy.windows = np.array([0.0, 0, 0, 0, 10, 0, 0, 0, 10, 0, 0, 0])
    # deadlines: [3] 1, [7] 6, [5,6] 5+10, [4] 7+10, [1,2] 7+10
    assert eviction_order(policy) == [[1, 2, 3], [7], [5, 6], [5], [1, 2, 4], [1, 2], [1]]


def test_2q_order_protects_reused_pages_for_the_window():
    policy = TwoQ(solve_every=1000)
    policy.window = 10
    # probationary (used once) [3] t1, [7] t6; protected [5,6] 5+10, [4] and [1,2] 7+10
    assert eviction_order(policy) == [[1, 2, 3], [7], [5, 6], [5], [1, 2, 4], [1, 2], [1]]


def test_2q_ghost_promotes_an_evicted_run_that_comes_back():
    def survivors(policy):
        cache = PrefixCache(num_blocks=4, page_size=1, policy=policy)
        if isinstance(cache.policy, TwoQ):
            cache.policy.window = 100
        # [1,2] t1 and [3,4] t2 fill the cache; [5,6] t3 evicts [1,2]; it comes back at t4
        # (evicting [3,4]); [7,8] t5 and [9,10] t6 then need room
        for tokens in ([1, 2], [3, 4], [5, 6], [1, 2], [7, 8], [9, 10]):
            cache.admit(tokens).release()
            cache.check()
        return sorted(k[1] for k in cached_pages(cache) if len(k[1]) == 2)

    # LRU keeps the two newest runs; 2q keeps the run the ghost saw return (deadline 4 + 100)
    assert survivors("lru") == [(7, 8), (9, 10)]
    assert survivors(TwoQ(solve_every=1000)) == [(1, 2), (9, 10)]


def test_2q_protects_only_the_pages_the_ghost_recognizes():
    policy = TwoQ(solve_every=1000)
    cache = PrefixCache(num_blocks=6, page_size=1, policy=policy)
    policy.window = 100
    # t1-t3 fill the cache; t4 evicts [1,2] into the ghost; t5 brings [1,2] back (protected,
    # deadline 105) with fresh pages [9,10] (probationary, deadline 5), evicting [3,4] and [5,6]
    for tokens in ([1, 2], [3, 4], [5, 6], [7, 8], [1, 2, 9, 10]):
        cache.admit(tokens).release()
    # t6 evicts [7,8] (deadline 4); t7 only the fresh tail [9,10] (deadline 5), not [1,2];
    # t8 then [11,12] (deadline 6), before the protected [1,2]
    for tokens in ([11, 12], [13, 14], [15, 16]):
        cache.admit(tokens).release()
        cache.check()
    assert sorted(k[1] for k in cached_pages(cache)) == [(1,), (1, 2), (13,), (13, 14), (15,), (15, 16)]


def test_2q_uses_an_admission_check_only_for_that_admissions_pages():
    policy = TwoQ(solve_every=1000)
    cache = PrefixCache(num_blocks=8, page_size=1, policy=policy)
    policy.window = 100
    cache.admit([1, 2]).release()
    leaf = cache.match([1, 2]).node._node
    key = history_key(None, 0, np.array([1], dtype=np.uint32).tobytes())
    policy.history.remember(leaf, 0, 2, (1, 0))  # a protected run came back
    policy.admit(leaf.parent, 2, 5, memoryview(np.array([1, 2], dtype=np.uint32).tobytes()))
    assert key not in policy.history  # the admission recognized the run
    # that admission cached nothing (no room); a later insert under the same parent (a tier
    # load-back) must not inherit its ghost boundary: probationary, deadline = its last use
    policy.on_insert(leaf, 6)
    assert policy.priority(leaf) == 6


def test_2q_window_is_the_quantile_of_protected_reuse_gaps():
    policy = TwoQ(solve_every=1)
    cache = PrefixCache(num_blocks=64, page_size=1, policy=policy)
    cache.admit([1, 2]).release()  # t1: probationary
    cache.admit([1, 2]).release()  # t2: protected, no gap observed yet
    assert policy.window == 0
    for i in range(9):  # t3..t11
        cache.admit([100 + i]).release()
    cache.admit([1, 2]).release()  # t12: protected reuse after 10 ticks (2 pages)
    cache.admit([200]).release()  # t13: the next solve
    # gap 10 falls in bin 1 + int(2 * log2(10)) = 7, whose upper edge is int(2 ** 3.5) = 11
    assert policy.window == 11
    with pytest.raises(ValueError, match="quantile"):
        TwoQ(quantile=0)
    with pytest.raises(ValueError, match="history_size"):
        TwoQ(history_size=0)


# ---------------------------------------------------------------------------- Belady
def _trace(kind, seed, n):
    params = {"multi_turn": {}, "system_prompt": {}, "mix": {}}[kind]
    return list(generators.generate(kind, seed, n, **params))


@pytest.mark.parametrize("kind,seed,num_blocks", [
    ("multi_turn", 1, 64), ("multi_turn", 2, 256), ("mix", 3, 128), ("mix", 4, 512),
    ("system_prompt", 5, 48),
])
def test_belady_is_the_ceiling(kind, seed, num_blocks):
    requests = _trace(kind, seed, 150)
    hits = {}
    for name in available():
        cache = PrefixCache(num_blocks=num_blocks, page_size=16, policy=name)
        hits[name] = replay(requests, cache).hit_tokens
        cache.check()
    online = {k: v for k, v in hits.items() if k != "belady"}
    assert hits["belady"] >= max(online.values()), hits
    assert hits["belady"] > hits["lru"] or hits["lru"] == sum(len(r.tokens) for r in requests)


def test_next_uses_matches_a_naive_scan():
    rng = np.random.default_rng(7)
    requests = []
    for _ in range(60):
        base = [rng.integers(0, 3, size=int(rng.integers(0, 12))).astype(np.uint32)]
        requests.append(Request(np.concatenate(base), namespace=str(rng.integers(0, 2)) if rng.random() < 0.3 else None))
    nxt, offsets = next_uses(requests, 2)
    keys = [[(r.namespace, tuple(r.tokens[: 2 * (d + 1)].tolist())) for d in range(len(r.tokens) // 2)]
            for r in requests]
    for i, row in enumerate(keys):
        for d, key in enumerate(row):
            later = [j for j in range(i + 1, len(keys)) if key in keys[j]]
            assert nxt[offsets[i] + d] == (later[0] if later else NEVER), (i, d)


def test_belady_declines_pages_never_used_again():
    cache = PrefixCache(num_blocks=8, page_size=2, policy="belady")
    requests = [Request(np.array(t, dtype=np.uint32)) for t in ([1, 1, 2, 2], [1, 1, 3, 3], [1, 1, 2, 2])]
    result = replay(requests, cache)
    # [1,1] and [1,1,2,2] are used again; the second page of [1,1,3,3] never is
    assert result.hit_tokens == 2 + 4
    assert result.declined_blocks == 1


def test_replay_cli_runs_the_belady_prepass(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [[1, 2, 3, 4], [1, 2, 5, 6], [1, 2, 3, 4], [9, 9, 9, 9], [1, 2, 3, 4]]
    path.write_text("".join(json.dumps({"tokens": r}) + "\n" for r in rows))
    out = {}
    for name in ("lru", "belady", "cost"):
        res = CliRunner().invoke(main, ["replay", str(path), "--policy", name, "--page-size", "2",
                                        "--num-blocks", "2", "--json", "--quiet"])
        assert res.exit_code == 0, res.output
        out[name] = json.loads(res.output.strip().splitlines()[-1])
    assert out["cost"]["policy"] == "gdsf"
    assert out["belady"]["hit_tokens"] > out["lru"]["hit_tokens"]


# ---------------------------------------------------------------------------- retention and pins
def _filled(priorities=(0, 0), expires=(None, None)):
    cache = PrefixCache(num_blocks=4, page_size=1)
    cache.admit([1, 1], priority=priorities[0], expires_at=expires[0]).release()   # clock 1, older
    cache.admit([2, 2], priority=priorities[1], expires_at=expires[1]).release()   # clock 2
    return cache


def test_higher_priority_is_evicted_later():
    cache = _filled(priorities=(3, 0))
    cache.evict(2)
    assert cache.match([1, 1]).num_tokens == 2 and cache.match([2, 2]).num_tokens == 0
    cache.check()


def test_priority_expires_back_to_class_zero():
    cache = _filled(priorities=(3, 0), expires=(4, None))
    cache.match([9])  # clock 3: still class 3
    cache.evict(1)
    assert cache.match([2, 2]).num_tokens == 1  # clock 4; the class-0 [2,2] lost its tail
    cache.match([9])  # clock 5: past expiry
    cache.evict(2)  # [1,1] (last use 1) now goes before [2] (last use 4)
    assert cache.match([1, 1]).num_tokens == 0 and cache.match([2]).num_tokens == 1
    cache.check()


def test_pin_survives_eviction_and_unlock_until_unpinned():
    cache = PrefixCache(num_blocks=4, page_size=2)
    cache.admit([1, 1, 2, 2]).release()
    assert cache.pin([1, 1, 2, 2, 3]) == 4
    assert cache.evict(4) == 0
    handle = cache.match([1, 1, 2, 2]).node
    with pytest.raises(LockError):
        cache.unlock(handle)  # the pin's lock is not the caller's to release
    assert cache.unpin([1, 1, 2, 2]) == 4
    assert cache.evict(4) == 2
    cache.check()


def test_pin_of_nothing_cached_records_nothing():
    cache = PrefixCache(num_blocks=4, page_size=2)
    assert cache.pin([5, 5, 6, 6]) == 0
    with pytest.raises(LockError):
        cache.unpin([5, 5, 6, 6])


# ---------------------------------------------------------------------------- bad input
def test_unknown_policy_lists_the_available_ones():
    with pytest.raises(UnknownPolicyError) as err:
        PrefixCache(num_blocks=4, policy="mru")
    for name in available():
        assert name in str(err.value)
    assert "cost" in str(err.value)


@pytest.mark.parametrize("kwargs,exc,word", [
    ({"priority": -1}, ValueError, "priority"), ({"priority": 1.5}, TypeError, "priority"),
    ({"priority": True}, TypeError, "priority"), ({"priority": 1, "expires_at": -3}, ValueError, "expires_at"),
    ({"priority": 1, "expires_at": "soon"}, TypeError, "expires_at"),
])
def test_bad_retention_arguments_leave_the_cache_unchanged(kwargs, exc, word):
    cache = _filled()
    before, clock = snapshot(cache), cache.clock
    with pytest.raises(exc, match=word):
        cache.admit([1, 1, 7], **kwargs)
    assert snapshot(cache) == before and cache.clock == clock
    cache.check()


def test_unpin_of_something_not_pinned_leaves_the_cache_unchanged():
    cache = _filled()
    cache.pin([1, 1])
    before = snapshot(cache)
    with pytest.raises(LockError, match="no pin"):
        cache.unpin([2, 2])
    assert snapshot(cache) == before


def test_policy_options_are_checked():
    with pytest.raises(ValueError, match="protected_threshold"):
        create("slru", protected_threshold=0)
    with pytest.raises(ValueError, match="small_fraction"):
        create("s3fifo", small_fraction=1.5)
    with pytest.raises(TypeError, match="cost_model"):
        GDSF(cost_model="llama")
    with pytest.raises(ValueError, match="page_size"):
        PrefixCache(num_blocks=4, page_size=16,
                    policy=GDSF(CostModel(get_model("llama-3-8b"), get_hardware("h100"), 32)))


# ---------------------------------------------------------------------------- cost and learning
def test_gdsf_defaults_to_llama_on_h100_at_the_cache_page_size():
    cache = PrefixCache(num_blocks=4, page_size=8, policy="gdsf")
    model = cache.policy.cost_model
    assert (model.model.name, model.hardware.name, model.page_size) == ("llama-3-8b", "h100", 8)


def test_gdsf_restore_cost_takes_the_cheapest_copy():
    policy = GDSF(copies=lambda node: ("host",))
    PrefixCache(num_blocks=4, page_size=16, policy=policy)
    cost = policy.cost_model
    deep = 10_000
    assert policy.restore_seconds(None, deep) == min(cost.page_recompute_seconds(deep),
                                                     cost.page_transfer_seconds("host"))


def test_solve_windows_keeps_the_class_that_is_reused():
    uses = np.array([100.0, 100.0])
    gaps = np.zeros((2, 34))
    gaps[0, 1 + int(2 * np.log2(10))] = 90.0  # class 0: reused after 10 ticks
    windows = solve_windows(uses, gaps, budget=100 * 12.0)
    assert windows[0] >= 10 and windows[1] == 0


def test_policies_are_deterministic():
    requests = _trace("mix", 11, 80)
    for name in available():
        runs = [replay(requests, PrefixCache(num_blocks=96, page_size=16, policy=name)).hit_tokens
                for _ in range(2)]
        assert runs[0] == runs[1], name

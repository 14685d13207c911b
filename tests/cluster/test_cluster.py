"""Cluster: borrowing, refusals, recalls, the debt ledger, routing, payload integrity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.cluster import Cluster
from radixkv.errors import ArgumentTypeError
from radixkv.tiers import TierConfigError

from ..strategies import bad_namespaces_typed, bad_tokens_typed
from ..tiers.test_tiers_payload import KV, PS, page_value

requests = st.lists(st.lists(st.integers(0, 2), max_size=10), min_size=1, max_size=30)


def serve(cluster: Cluster, tokens, payload: bool = False) -> int:
    i, a = cluster.admit(tokens)
    cache = cluster.instances[i].cache
    hit_pages = a.hit_tokens // PS
    if payload:
        got = cache.read(a.blocks[:hit_pages]) if hit_pages else []
        for p in range(hit_pages):
            assert np.array_equal(got[p], page_value(tokens, p)), f"page {p} of {tokens} read wrong bytes"
        if len(a.new_blocks):
            cache.write(a.new_blocks, np.stack([page_value(tokens, hit_pages + j) for j in range(len(a.new_blocks))]))
    a.release()
    return a.hit_tokens


@settings(max_examples=60)
@given(requests, st.sampled_from(["round_robin", "least_loaded", "cache_aware"]), st.integers(0, 3),
       st.lists(st.tuples(st.sampled_from(["recall", "down", "up"]), st.integers(0, 2), st.integers(1, 3)),
                max_size=8))
def test_ledger_and_bytes_hold_through_borrow_recall_and_faults(trace, routing, host_blocks, events):
    cluster = Cluster(3, num_blocks=5, page_size=PS, routing=routing, borrowing=True, host_blocks=host_blocks,
                      lend_cap=0.8, low_watermark=0.0, kv_shape=KV)
    for step, tokens in enumerate(trace):
        if step < len(events):
            what, i, n = events[step]
            if what == "recall":
                cluster.manager.recall(i, n)
            else:
                cluster.instances[i].available = what == "up"
        serve(cluster, tokens, payload=True)
        cluster.check()
    for inst in cluster.instances:
        assert inst.cache.tier_stats().integrity_misses == 0


def small_cluster(**kw):
    kw.setdefault("low_watermark", 0.0)
    kw.setdefault("lend_cap", 1.0)
    return Cluster(2, num_blocks=4, page_size=PS, borrowing=True, routing="round_robin", **kw)


def test_a_short_instance_borrows_and_hits_in_borrowed_memory():
    cluster = small_cluster()
    m = cluster.manager
    serve(cluster, [1, 1, 2, 2, 3, 3, 4, 4])  # instance 0 full
    serve(cluster, [0] * 2)  # instance 1 uses 1 block, has 3 free
    serve(cluster, [5, 5, 6, 6, 7, 7, 8, 8])  # instance 0 evicts 4 pages; 3 fit in instance 1's memory
    assert m.debt[0, 1] == 3 and m.blocks_lent == 3 and cluster.instances[1].cache.num_free_blocks == 0
    cluster.check()
    serve(cluster, [0] * 2)  # instance 1: hit, nothing to recall
    assert serve(cluster, [1, 1, 2, 2, 3, 3, 4, 4]) == 3 * PS  # three pages come back from instance 1
    assert cluster.instances[0].cache.hit_tokens_by_tier["borrowed"] == 3 * PS
    cluster.check()


def test_recall_moves_to_another_creditor_or_demotes():
    cluster = Cluster(3, num_blocks=4, page_size=PS, borrowing=True, host_blocks=4, low_watermark=0.0, lend_cap=1.0)
    m = cluster.manager
    cluster.instances[0].cache.admit([1] * 8).release()
    cluster.manager.heartbeat(0)
    cluster.instances[0].cache.admit([2] * 8).release()  # 4 pages lent: 4 to instance 1 (most free: tie -> 1)
    assert m.owed(0) == 4
    lent_by = {c: int(m.debt[0, c]) for c in (1, 2)}
    creditor = max(lent_by, key=lent_by.get)
    other = 3 - creditor
    freed = m.recall(creditor, 4)
    assert freed == 4 and m.debt[0, creditor] == 0
    assert m.moved + m.demoted == 4 and m.debt[0, other] == m.moved + lent_by[other]
    cluster.check()


def test_recall_with_no_room_elsewhere_demotes_to_host():
    cluster = small_cluster(host_blocks=8)
    m = cluster.manager
    cluster.instances[0].cache.admit([1] * 8).release()
    cluster.instances[0].cache.admit([2] * 8).release()
    assert m.debt[0, 1] == 4
    assert m.recall(1, 2) >= 2 and m.demoted >= 2 and m.moved == 0
    assert cluster.instances[0].cache.tiers[1].used == m.demoted  # the host tier caught them
    cluster.check()


def test_creditor_refuses_below_its_watermark_or_over_its_cap():
    cluster = small_cluster(low_watermark=0.5)
    cluster.instances[0].cache.admit([1] * 8).release()
    cluster.instances[0].cache.admit([2] * 8).release()
    assert cluster.manager.debt[0, 1] == 2  # keeps 2 of 4 blocks free
    capped = small_cluster(lend_cap=0.25)
    capped.instances[0].cache.admit([1] * 8).release()
    capped.instances[0].cache.admit([2] * 8).release()
    assert capped.manager.debt[0, 1] == 1
    assert len(capped.manager.borrow(0, 1)) == 0 and capped.manager.refusals == 1


def test_an_unavailable_creditor_never_blocks_a_request():
    cluster = small_cluster()
    cluster.instances[1].available = False
    serve(cluster, [1] * 8)
    serve(cluster, [9] * 2)
    assert serve(cluster, [2] * 8) == 0
    assert cluster.manager.owed(0) == 0 and cluster.manager.refusals > 0
    cluster.check()


def test_no_chains_a_creditor_does_not_borrow_and_a_debtor_does_not_lend():
    cluster = Cluster(3, num_blocks=4, page_size=PS, borrowing=True, low_watermark=0.0, lend_cap=1.0)
    m = cluster.manager
    c0 = cluster.instances[0].cache
    c0.admit([1] * 8).release()
    c0.admit([2] * 8).release()  # 0 borrows
    assert m.owed(0) > 0
    creditor = next(c for c in (1, 2) if m.lent(c))
    assert len(m.borrow(creditor, 1)) == 0  # a creditor does not borrow
    assert 0 not in [c for group in m.creditors(1) for c in group]
    cluster.check()


def test_round_robin_and_least_loaded_spread_requests():
    rr = Cluster(3, num_blocks=8, page_size=PS, routing="round_robin")
    for t in range(6):
        serve(rr, [t, t])
    assert [i.requests for i in rr.instances] == [2, 2, 2]
    ll = Cluster(2, num_blocks=8, page_size=PS, routing="least_loaded")
    serve(ll, [1] * 8)
    assert ll.route([2, 2]) == 1


def test_cache_aware_routes_to_the_longest_prefix_then_least_loaded():
    cluster = Cluster(2, num_blocks=8, page_size=PS, routing="cache_aware", balance=10.0)
    serve(cluster, [1, 1, 2, 2])  # -> 0
    serve(cluster, [3, 3, 4, 4, 5, 5])  # -> 1, the idle one
    assert cluster.route([3, 3, 4, 4, 9, 9]) == 1
    assert serve(cluster, [3, 3, 4, 4, 9, 9]) == 4
    assert cluster.route([7, 7]) == 0  # no prefix anywhere: the less loaded instance


def test_cache_aware_does_not_send_everything_to_one_instance():
    cluster = Cluster(2, num_blocks=64, page_size=PS, routing="cache_aware", balance=0.0)
    for t in range(20):
        serve(cluster, [9, 9, 9, 9, t, t, t, t])  # every request shares the first two pages
    assert min(i.requests for i in cluster.instances) >= 8


def test_replay_reports_totals():
    from radixkv.workload.traces import Request
    reqs = [Request(np.array(t, dtype=np.uint32), None, 0, None) for t in ([1, 1, 2, 2], [1, 1, 2, 2], [3, 3])]
    result = Cluster(2, num_blocks=4, page_size=PS, routing="cache_aware").replay(reqs)
    assert result.requests == 3 and result.hit_tokens == 4 and result.prompt_tokens == 10
    assert result.hit_tokens_by_tier["hbm"] == 4 and sum(result.requests_by_instance) == 3


def _warm_trace():
    from radixkv.workload.generators import generate
    return list(generate("mix", 0, 400))


@pytest.mark.parametrize("kwargs", [dict(), dict(borrowing=True, host_blocks=20), dict(store="memory", store_blocks=80),
                                    dict(global_index=True, host_blocks=20), dict(routing="cache_aware")])
def test_a_warm_up_counts_only_the_requests_after_it(kwargs):
    """``replay(warmup=N)``: the requests after the first N are served as in a replay without a warm-up,
    and the result counts them alone: its records (trace-order index) and its every total."""
    trace = _warm_trace()
    full: list = []
    Cluster(2, 60, 16, **kwargs).replay(trace, on_record=lambda r, i: full.append((r, i)))
    warm: list = []
    seen: list = []
    result = Cluster(2, 60, 16, **kwargs).replay(trace, warmup=150, on_record=lambda r, i: warm.append((r, i)),
                                                 on_request=lambda r, h: seen.append(h))
    assert warm == full[150:] and len(seen) == len(trace)  # progress covers the warm-up too
    assert result.warmup_requests == 150 and result.requests == len(trace) - 150
    assert result.hit_tokens == sum(r.hit_tokens for r, _ in warm) > 0
    assert result.prompt_tokens == sum(r.prompt_tokens for r, _ in warm)
    assert sum(result.hit_tokens_by_tier.values()) == result.hit_tokens
    assert result.requests_by_instance == [sum(1 for _, i in warm if i == k) for k in range(2)]
    if "store" in kwargs:
        assert result.store_stats["gets"] <= result.requests and result.store_hit_tokens >= 0
    with pytest.raises(ValueError, match="warmup"):
        Cluster(2, 60, 16, **kwargs).replay(trace, warmup=-1)


def test_a_warm_one_instance_cluster_classifies_misses_as_a_warm_replay():
    """The warm-up runs through the counted stats (zeroed after it): a page first seen in the warm-up is
    no first sight after it, as in ``replay(warmup=...)``."""
    from radixkv import PrefixCache
    from radixkv.analysis.replay import replay

    trace = _warm_trace()
    alone = replay(trace, PrefixCache(60, 16), miss_reasons=True, warmup=150)
    cluster = Cluster(1, 60, 16).replay(trace, miss_reasons=True, warmup=150)
    assert cluster.miss_tokens_by_reason == alone.miss_tokens_by_reason and cluster.hit_tokens == alone.hit_tokens
    assert cluster.miss_tokens_by_reason["evicted"] > 0


def test_each_replay_of_a_cluster_reports_its_own_counts():
    """Replayed twice, a cluster reports each replay's own counts (the lending, tier, link and store counters
    are kept since the cluster was made; a result is what its replay added)."""
    trace = _warm_trace()
    cluster = Cluster(2, 60, 16, borrowing=True, host_blocks=20, store="memory")
    first = cluster.replay(trace[:200])
    second = cluster.replay(trace[200:])
    once = Cluster(2, 60, 16, borrowing=True, host_blocks=20, store="memory").replay(trace)
    assert first.hit_tokens + second.hit_tokens == once.hit_tokens
    for r in (first, second):
        assert sum(r.hit_tokens_by_tier.values()) == r.hit_tokens and sum(r.requests_by_instance) == r.requests
    assert first.blocks_lent + second.blocks_lent == once.blocks_lent > 0
    assert first.store_stats["gets"] + second.store_stats["gets"] == once.store_stats["gets"]


@pytest.mark.parametrize("kwargs, error", [
    (dict(num_instances=0), ValueError),
    (dict(num_blocks=-1), ValueError),
    (dict(host_blocks=-2), ValueError),
    (dict(routing="random"), TierConfigError),
    (dict(lend_cap=1.5), TierConfigError),
    (dict(low_watermark=-0.1), TierConfigError),
    (dict(candidates=0), ValueError),
    (dict(balance=-1), TierConfigError),
    (dict(balance="0.1"), ArgumentTypeError),
    (dict(lend_cap=True), ArgumentTypeError),
    (dict(low_watermark=None), ArgumentTypeError),
    (dict(lend_margin="2"), ArgumentTypeError),
    (dict(lend_margin=0.5), TierConfigError),
])
def test_bad_cluster_arguments(kwargs, error):
    args = dict(num_instances=2, num_blocks=4, page_size=PS)
    args.update(kwargs)
    with pytest.raises(error) as info:
        Cluster(**args)
    assert repr(next(iter(kwargs.values()))) in str(info.value)


def _cluster_state(cluster: Cluster):
    from ..strategies import snapshot
    return (cluster._next, [snapshot(inst.cache) for inst in cluster.instances],
            [(inst.requests, inst.prefill_tokens) for inst in cluster.instances])


@pytest.mark.parametrize("routing", ["round_robin", "least_loaded", "cache_aware"])
@settings(max_examples=30)
@given(bad=st.one_of(bad_tokens_typed.map(lambda p: ("tokens", p)),
                     bad_namespaces_typed.map(lambda p: ("namespace", p))),
       entry=st.sampled_from(["route", "admit"]))
def test_bad_input_moves_no_cursor_and_changes_no_instance(routing, bad, entry):
    cluster = Cluster(3, num_blocks=8, page_size=2, routing=routing, borrowing=True, host_blocks=4)
    for tokens in ([1, 1, 2, 2], [3, 3], [1, 1, 2, 2, 5, 5]):
        cluster.admit(tokens)[1].release()
    what, (value, error) = bad
    args = (value, None) if what == "tokens" else ([1, 1, 2, 2], value)
    before = _cluster_state(cluster)
    call = cluster.route if entry == "route" else (lambda t, ns: cluster.admit(t, namespace=ns))
    with pytest.raises(error, match=what) as info:
        call(*args)
    assert not (error is TypeError and isinstance(info.value, ValueError))
    cluster.check()
    assert _cluster_state(cluster) == before

"""The cluster-wide page index: a page computed on one instance is served on another.

The state machine (test_cluster_state.py) runs the index through evictions, demotions, aborts,
recalls, crashes and resets with check() after every step; these tests pin the contract.
"""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.cluster import Cluster
from radixkv.errors import ArgumentTypeError, ArgumentValueError
from radixkv.global_index import GlobalPageIndex
from radixkv.workload.traces import Request

PS = 2
KV = (3,)


def payload(tokens, start: int, n: int) -> np.ndarray:
    """Pages ``start..start+n`` of ``tokens``: a function of the whole prefix through each."""
    return np.stack([np.full((PS, *KV), float(sum(tokens[: (p + 1) * PS]) * 100 + p), dtype=np.float32)
                     for p in range(start, start + n)])


def serve(cluster: Cluster, tokens, namespace=None, release=True):
    """Admit ``tokens``; the pages not hit or pulled are computed (written); return (instance, admission)."""
    i, adm = cluster.admit(tokens, namespace=namespace)
    start = adm.hit_tokens // PS + cluster.last_pull.pages
    rest = adm.new_blocks[cluster.last_pull.pages:]
    if len(rest) and cluster.instances[i].cache.payload is not None:
        cluster.instances[i].cache.write(rest, payload(tokens, start, len(rest)))
    if release:
        adm.release()
    cluster.check()
    return i, adm


def test_a_request_pulls_the_pages_another_instance_computed():
    cluster = Cluster(2, num_blocks=16, page_size=PS, global_index=True, kv_shape=KV, dtype="float32")
    first = [1, 1, 2, 2, 3, 3]
    assert serve(cluster, first)[0] == 0
    i, adm = serve(cluster, first + [4, 4])  # round robin: instance 1, which holds nothing
    assert i == 1 and adm.hit_tokens == 0
    assert cluster.last_pull.pages == 3 and cluster.last_pull.source == 0
    np.testing.assert_array_equal(cluster.instances[1].cache.read(adm.new_blocks[:3]), payload(first, 0, 3))
    assert len(cluster.index) == 4  # three pages on both, one on instance 1
    assert cluster.index.pages_by_instance() == [3, 4]


def test_an_unreleased_admissions_pages_are_never_pulled():
    """Their KV is not written yet: the index knows them, the pull stops before them."""
    cluster = Cluster(2, num_blocks=16, page_size=PS, global_index=True, kv_shape=KV, dtype="float32")
    serve(cluster, [1, 1])
    _, open_adm = serve(cluster, [1, 1, 2, 2, 3, 3], release=False)  # instance 1: pulls page 0, computes 2
    assert cluster.last_pull.pages == 1
    serve(cluster, [1, 1, 2, 2, 3, 3])  # instance 0 holds page 0 itself; pages 1-2 are not written on 1
    assert cluster.last_pull.pages == 0
    open_adm.release()
    cluster._next = 0
    i, adm = serve(cluster, [1, 1, 2, 2, 3, 3, 4, 4])
    assert i == 0 and adm.hit_tokens == 6  # instance 0 computed pages 1-2 itself meanwhile


def test_namespaces_never_share_a_page_through_the_index():
    cluster = Cluster(2, num_blocks=16, page_size=PS, global_index=True)
    serve(cluster, [1, 1, 2, 2], namespace="a")
    serve(cluster, [1, 1, 2, 2], namespace="b")
    assert cluster.last_pull.pages == 0
    serve(cluster, [1, 1, 2, 2, 3, 3], namespace="a")
    assert cluster.last_pull.pages == 0  # instance 0 holds it itself
    serve(cluster, [1, 1, 2, 2, 3, 3], namespace="a")
    assert cluster.last_pull.pages == 3 and cluster.last_pull.source == 0


def test_the_index_follows_evictions_aborts_crashes_and_resets():
    cluster = Cluster(3, num_blocks=4, page_size=PS, global_index=True)
    for k in range(6):
        serve(cluster, [k, k, k + 1, k + 1, 9, 9])
    i, adm = cluster.admit([7, 7, 8, 8])
    adm.abort()
    cluster.check()
    cluster.instances[1].cache.evict(2)
    cluster.check()
    cluster.crash(2)
    cluster.check()
    assert cluster.index.pages_by_instance()[2] == 0
    cluster.instances[0].cache.reset()
    cluster.check()
    assert len(cluster.index) == cluster.instances[1].cache.num_cached_blocks


def _conversations(turns: int, sessions: int):
    """Each session's turn t extends its turn t-1 by 8 tokens (as a chat's history grows)."""
    out = []
    for t in range(turns):
        for s in range(sessions):
            out.append(Request(tokens=[1000 * s + j for j in range(8 * (t + 1))]))
    return out


def test_replay_reports_pulled_hits_each_charged_a_transfer():
    trace = _conversations(turns=6, sessions=5)  # round robin over 2 instances: turns alternate
    plain = Cluster(2, num_blocks=64, page_size=4).replay(trace)
    result = Cluster(2, num_blocks=64, page_size=4, global_index=True).replay(trace)
    assert result.global_index and not plain.global_index
    assert result.pages_pulled > 0 and result.peer_hit_tokens == result.pages_pulled * 4
    assert result.hit_tokens_by_tier["peer"] == result.peer_hit_tokens
    assert result.hit_tokens == plain.hit_tokens + result.peer_hit_tokens
    assert result.peer_transfer_seconds > 0 and result.index_pages > 0
    # the same hits served locally would save more: every pulled page paid its transfer
    pooled = Cluster(1, num_blocks=128, page_size=4).replay(trace)
    assert result.hit_tokens == pooled.hit_tokens
    assert result.ttft_saving_seconds < pooled.ttft_saving_seconds


def test_page_observers_are_checked():
    cache = PrefixCache(4, page_size=PS)
    with pytest.raises(ArgumentTypeError, match="stored, removed and cleared"):
        cache.add_page_observer(object())
    index = GlobalPageIndex(PS)
    index.join(cache)
    member = cache._extra_observers[0]
    with pytest.raises(ArgumentValueError, match="already"):
        cache.add_page_observer(member)
    index.leave_all()
    with pytest.raises(ArgumentValueError, match="does not observe"):
        cache.remove_page_observer(member)
    cache.admit([1, 1]).release()
    assert len(index) == 0


def test_a_pull_moves_the_page_under_lru_and_copies_it_otherwise():
    """duplicates="move": the source's copy of the pulled pages becomes its next victim, so the
    fleet does not spend its capacity twice; "copy" leaves it ranked as it was."""
    for duplicates, policy, first_victim_is_pulled in (("move", "lru", True), ("copy", "lru", False),
                                                       ("move", "lfu", False)):
        cluster = Cluster(2, num_blocks=8, page_size=PS, policy=policy, global_index=True, duplicates=duplicates)
        for i, tokens in ((0, [6, 6]), (0, [1, 1, 2, 2]), (1, [1, 1, 2, 2, 3, 3])):
            cluster._next = i  # instance 0: an old page, then pages 0-1; instance 1 pulls those
            serve(cluster, tokens)
        assert cluster.last_pull.pages == 2
        source = cluster.instances[0].cache
        assert source.evict(1) == 1
        assert (source.cached_pages([6, 6]) == 1) == first_victim_is_pulled, duplicates
        assert (source.cached_pages([1, 1, 2, 2]) == 1) == first_victim_is_pulled, duplicates
        cluster.check()
    with pytest.raises(Exception, match="duplicates"):
        Cluster(2, num_blocks=8, page_size=PS, duplicates="keep")


def test_demote_counts_what_it_demoted_and_checks_its_arguments():
    cache = PrefixCache(8, page_size=PS)
    cache.admit([1, 1, 2, 2, 3, 3]).release()
    cache.admit([9, 9]).release()
    assert cache.demote([1, 1, 2, 2], start=1) == 3  # the node holding pages 0-2 is touched: demoted whole
    assert cache.peek_victim()[1] == 0  # its rank: older than every use
    assert cache.evict(1) == 1 and cache.cached_pages([1, 1, 2, 2, 3, 3]) == 2 and cache.cached_pages([9, 9]) == 1
    assert cache.demote([4, 4]) == 0 and PrefixCache(4, page_size=PS, policy="lfu").demote([1, 1]) == 0
    with pytest.raises(ArgumentTypeError):
        cache.demote([1, 1], start="0")
    cache.check()

"""The cluster-wide page index: a page computed on one instance is served on another.

The state machine (test_cluster_state.py) runs the index through evictions, demotions, aborts,
recalls, crashes and resets with check() after every step; these tests pin the contract.
"""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.cluster import Cluster, Pull
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


# ---------------------------------------------------------------------- host tiers in the index
def host_cluster(n: int = 2, num_blocks: int = 4, host_blocks: int = 8, **kw) -> Cluster:
    return Cluster(n, num_blocks=num_blocks, page_size=PS, host_blocks=host_blocks, global_index=True,
                   kv_shape=KV, dtype="float32", **kw)


def spill(cluster: Cluster, i: int, pages: int) -> None:
    """Instance ``i`` evicts ``pages`` pages from HBM (write-back: to its host tier)."""
    assert cluster.instances[i].cache.evict(pages) == pages
    cluster.check()


def test_a_page_only_in_a_peers_host_tier_is_pulled_with_its_bytes():
    cluster = host_cluster()
    first = [1, 1, 2, 2, 3, 3]
    assert serve(cluster, first)[0] == 0
    spill(cluster, 0, 3)  # instance 0 holds the three pages in its host tier only
    a = cluster.instances[0].cache
    assert a.num_cached_blocks == 0 and a.tier_stats().pages_by_tier["host"] == 3
    assert len(cluster.index) == 0 and cluster.index.lower_pages == 3
    assert cluster.index.lower_pages_by_instance() == [3, 0]
    i, adm = serve(cluster, first + [4, 4])  # instance 1
    assert i == 1 and adm.hit_tokens == 0
    assert cluster.last_pull == Pull(3, 0, 3)  # 3 pages, from 0, all from its host
    np.testing.assert_array_equal(cluster.instances[1].cache.read(adm.new_blocks[:3]), payload(first, 0, 3))
    assert a.tier_stats().pages_by_tier["host"] == 3  # a pull copies: the source keeps its copies (ranked last)
    assert cluster.index.pages_by_instance() == [0, 4] and cluster.index.lower_pages_by_instance() == [3, 0]


def test_a_pull_reads_the_peers_hbm_first_then_its_host_copies():
    cluster = host_cluster()
    first = [1, 1, 2, 2, 3, 3]
    serve(cluster, first)
    spill(cluster, 0, 2)  # page 0 stays in HBM, pages 1-2 go to the host
    i, adm = serve(cluster, first)
    assert i == 1 and cluster.last_pull == Pull(3, 0, 2)
    np.testing.assert_array_equal(cluster.instances[1].cache.read(adm.new_blocks[:3]), payload(first, 0, 3))


def test_a_corrupt_host_copy_is_never_pulled():
    """The peer's host copy failed its checksum: the pull stops before it (the page is computed)."""
    cluster = host_cluster()
    first = [1, 1, 2, 2, 3, 3]
    serve(cluster, first)
    spill(cluster, 0, 3)
    host = cluster.instances[0].cache.tiers[0]
    copies = [n for n in cluster.instances[0].cache._stack.tree.nodes() if n.ext is not None]
    deepest = max(copies, key=lambda n: n.end)
    host.data[deepest.ext.slots[-1]] += 1.0  # page 2's bytes change under its checksum
    i, adm = serve(cluster, first + [4, 4])
    assert cluster.last_pull.pages == 2 and cluster.last_pull.host_pages == 2
    np.testing.assert_array_equal(cluster.instances[1].cache.read(adm.new_blocks[:2]), payload(first, 0, 2))


def test_hbm_is_preferred_over_a_host_copy():
    cluster = host_cluster(3)
    first = [1, 1, 2, 2]
    serve(cluster, first)  # instance 0
    spill(cluster, 0, 2)
    serve(cluster, first)  # instance 1 pulls from 0's host: it holds them in HBM now
    assert cluster.last_pull == Pull(2, 0, 2)
    serve(cluster, first)  # instance 2: 0 holds them in host, 1 in HBM
    assert cluster.last_pull == Pull(2, 1, 0)


def test_host_pages_never_cross_namespaces():
    cluster = host_cluster(3)
    serve(cluster, [1, 1, 2, 2], namespace="a")  # instance 0
    spill(cluster, 0, 2)
    serve(cluster, [1, 1, 2, 2], namespace="b")  # instance 1: another namespace's pages are no hit
    assert cluster.last_pull.pages == 0
    serve(cluster, [1, 1, 2, 2, 3, 3], namespace="a")  # instance 2
    assert cluster.last_pull == Pull(2, 0, 2)


def test_the_host_index_follows_load_backs_host_evictions_crashes_and_resets():
    cluster = host_cluster(2, num_blocks=4, host_blocks=4)
    serve(cluster, [1, 1, 2, 2, 3, 3])  # instance 0
    spill(cluster, 0, 3)
    cluster._next = 0
    serve(cluster, [1, 1, 2, 2, 3, 3])  # instance 0 loads its host copies back: promoted to HBM
    assert cluster.last_pull.pages == 0 and cluster.index.lower_pages == 0 and len(cluster.index) == 3
    spill(cluster, 0, 3)
    cluster._next = 0
    serve(cluster, [5, 5, 6, 6, 7, 7])
    spill(cluster, 0, 3)  # the host (4 pages) drops the older chain's deepest pages to take these
    assert cluster.index.lower_pages == 4
    assert cluster.index.lower_pages_by_instance() == [4, 0]
    cluster.crash(0)
    cluster.check()
    assert cluster.index.lower_pages == 0 and len(cluster.index) == 0
    serve(cluster, [1, 1, 2, 2])  # instance 1
    spill(cluster, 1, 2)
    cluster.instances[1].cache.reset()
    cluster.check()
    assert cluster.index.lower_pages == 0


def test_replay_charges_a_host_pull_the_peers_pcie_read_and_the_network_hop():
    first = Request(tokens=list(range(12)))
    cluster = Cluster(2, num_blocks=8, page_size=4, host_blocks=8, global_index=True)
    cluster.replay([first])  # instance 0
    assert cluster.instances[0].cache.evict(3) == 3
    result = cluster.replay([Request(tokens=list(range(16)))])  # instance 1 pulls 0's host copies
    cost = cluster.instances[1].cache.cost_model
    assert cost.tier_paths["peer_host"] == ("pcie", "network")
    assert result.pages_pulled == 3 and result.peer_hit_tokens == 12 == result.peer_host_hit_tokens
    assert result.hit_tokens_by_tier["peer"] == 12 and result.hit_tokens == 12
    charged = cost.transfer_seconds("peer_host", 3 * cost.page_bytes)
    assert result.peer_transfer_seconds == pytest.approx(charged)
    assert charged > cost.transfer_seconds("peer", 3 * cost.page_bytes)  # the PCIe read is charged too
    assert result.ttft_saving_seconds == pytest.approx(cost.recompute_seconds(0, 12) - charged)
    assert result.index_host_pages == 3


def test_a_move_from_a_host_tier_ranks_the_source_copy_next_to_go():
    """duplicates="move" with a host-tier source: the host copies pulled become its next victims there;
    "copy" leaves them ranked as they were (the older chain goes first)."""
    for duplicates, pulled_goes_first in (("move", True), ("copy", False)):
        cluster = host_cluster(2, num_blocks=4, host_blocks=4, duplicates=duplicates)
        old, new = [6, 6, 7, 7], [1, 1, 2, 2]
        for tokens in (old, new):
            cluster._next = 0
            serve(cluster, tokens)
            spill(cluster, 0, 2)  # instance 0's host: old, then new
        cluster._next = 1
        serve(cluster, new + [3, 3])  # instance 1 pulls new from 0's host
        assert cluster.last_pull == Pull(2, 0, 2)
        cluster._next = 0
        serve(cluster, [8, 8, 9, 9])
        spill(cluster, 0, 2)  # the host makes room for two pages
        host_keys = cluster.index._lower
        keys_new = cluster.index.request_keys(new).tolist()
        keys_old = cluster.index.request_keys(old).tolist()
        assert all(k not in host_keys for k in (keys_new if pulled_goes_first else keys_old)), duplicates
        assert all(k in host_keys for k in (keys_old if pulled_goes_first else keys_new)), duplicates


def test_residency_observers_are_checked_and_leave_with_the_index():
    cluster = host_cluster()
    stack = cluster.instances[0].cache._stack
    with pytest.raises(ArgumentTypeError, match="lower_stored and lower_removed"):
        stack.add_observer(object())
    (observer,) = stack.observers
    with pytest.raises(ArgumentValueError, match="already"):
        stack.add_observer(observer)
    serve(cluster, [1, 1, 2, 2])
    spill(cluster, 0, 2)
    assert cluster.index.lower_pages == 2 and cluster.index.nbytes() > 0
    cluster.index.leave_all()
    assert stack.observers == () and cluster.index.lower_pages == 0
    cluster.instances[0].cache.admit([1, 1, 2, 2]).release()  # a load-back: nobody is told any more
    assert cluster.index.lower_pages == 0 and len(cluster.index) == 0


def test_the_bytes_by_link_of_an_indexed_replay_sum_every_instance():
    """``bytes_by_link`` sums every instance's transfer ledger (it read only the last instance's)."""
    trace = _conversations(turns=6, sessions=5)
    cluster = Cluster(2, num_blocks=16, page_size=4, host_blocks=32, global_index=True)
    result = cluster.replay(trace)
    ledgers = [inst.cache.transfers.bytes_by_link for inst in cluster.instances]
    assert all(sum(ledger.values()) > 0 for ledger in ledgers)  # both instances moved pages over their links
    assert result.bytes_by_link == {link: sum(ledger.get(link, 0) for ledger in ledgers)
                                    for link in set().union(*ledgers)}

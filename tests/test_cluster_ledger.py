"""Cluster ledger: recall never strands a lent copy, and check() finds one that is stranded."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv.cluster import Cluster, stranded_copies

from .test_cluster import serve
from .test_tiers_payload import KV, PS


def chain_lent_at_two_creditors(**kw) -> Cluster:
    """Instance 0's chain ``[1] * 8`` evicted in two steps: pages 2..3 lent by 1, then pages 0..1 by 2."""
    cluster = Cluster(3, num_blocks=4, page_size=PS, borrowing=True, lend_cap=0.5, low_watermark=0.0, **kw)
    c0 = cluster.instances[0].cache
    serve(cluster, [1] * 8, payload=kw.get("kv_shape") is not None)  # instance 0 (round robin)
    c0.admit([2] * 4).release()  # the chain's tail (pages 2..3) goes to instance 1
    c0.admit([3] * 4).release()  # its head (pages 0..1) to instance 2: instance 1 lent its cap
    assert cluster.manager.debt[0].tolist() == [0, 2, 2]
    cluster.check()
    return cluster


def test_recall_that_cannot_move_a_page_takes_the_deeper_lent_pages_with_it():
    # Failed before the fix: instance 2 recalled the chain's head, nobody had room for it, so it
    # was dropped while its tail stayed lent by instance 1, holding 2 of its blocks for nothing.
    cluster = chain_lent_at_two_creditors()
    m = cluster.manager
    assert m.recall(2, 1) == 2
    assert not stranded_copies(cluster.instances[0].cache)
    cluster.check()
    assert m.debt.sum() == 0 and cluster.instances[1].cache.num_free_blocks == 4  # the tail was repaid too
    assert m.demoted == 4


def test_recall_with_a_host_demotes_the_whole_suffix_and_it_still_hits():
    cluster = chain_lent_at_two_creditors(host_blocks=8, kv_shape=KV)
    m = cluster.manager
    assert m.recall(2, 1) == 2
    cluster.check()
    host = cluster.instances[0].cache.tiers[1]
    assert m.debt.sum() == 0 and host.used == 4
    cluster._next = 0
    assert serve(cluster, [1] * 8, payload=True) == 8  # every page back from the host, bytes verified
    cluster.check()


def test_check_finds_a_copy_below_a_page_that_is_nowhere():
    cluster = chain_lent_at_two_creditors()
    c0 = cluster.instances[0].cache
    stack = c0._stack
    head = next(n for n in stack.tree.nodes() if n.start == 0)
    stack.demote(0, head)  # drop the head alone (borrowed is the last tier): its tail is stranded
    assert [(n.start, n.end) for n in stranded_copies(c0)] == [(2, 4)]
    with pytest.raises(AssertionError, match="no lookup can reach"):
        cluster.check()


def test_a_copy_below_a_page_in_hbm_is_not_stranded():
    cluster = Cluster(2, num_blocks=4, page_size=PS, borrowing=True, lend_cap=1.0, low_watermark=0.0)
    c0 = cluster.instances[0].cache
    c0.admit([1] * 8).release()
    c0.admit([1] * 4 + [2] * 4).release()  # the tail of [1] * 8 is lent; its head is shared and stays in HBM
    assert cluster.manager.owed(0) == 2 and c0.peek([1] * 8) == (2, 2)
    assert not stranded_copies(c0)
    cluster.check()
    assert np.array_equal(cluster.manager.debt[0], [0, 2])

"""Cluster ledger: recall never strands a lent copy, and check() finds one that is stranded."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv.cluster import Cluster
from radixkv.tiers.tiered import stranded_copies

from .test_cluster import serve
from ..tiers.test_tiers_payload import KV, PS


def at_instance_0(cluster: Cluster, tokens, payload: bool) -> int:
    """Serve ``tokens`` on instance 0 (round robin from 0), writing and verifying payloads if any."""
    cluster._next = 0
    return serve(cluster, tokens, payload=payload)


def chain_lent_at_two_creditors(**kw) -> Cluster:
    """Instance 0's chain ``[1] * 8`` evicted in two steps: pages 2..3 lent by 1, then pages 0..1 by 2."""
    cluster = Cluster(3, num_blocks=4, page_size=PS, borrowing=True, lend_cap=0.5, low_watermark=0.0, **kw)
    payload = kw.get("kv_shape") is not None
    at_instance_0(cluster, [1] * 8, payload)
    at_instance_0(cluster, [2] * 4, payload)  # the chain's tail (pages 2..3) goes to instance 1
    at_instance_0(cluster, [3] * 4, payload)  # its head (pages 0..1) to instance 2: instance 1 lent its cap
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
    assert at_instance_0(cluster, [1] * 8, True) == 8  # every page back from the host, bytes verified
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



def test_a_crashed_creditor_takes_its_pages_and_the_lent_pages_below_them():
    cluster = chain_lent_at_two_creditors(kv_shape=KV)
    assert cluster.crash(2) == 4  # the head it held, and the tail lent by instance 1 (unreachable now)
    assert cluster.manager.debt.sum() == 0 and cluster.instances[1].cache.num_free_blocks == 4
    assert cluster.instances[0].cache.tier_stats().lost_pages == 4
    cluster.check()
    assert at_instance_0(cluster, [1] * 8, True) == 0  # recomputed, never read from memory that is gone
    cluster.check()


def test_a_crashed_creditor_takes_the_host_pages_below_its_own():
    cluster = chain_lent_at_two_creditors(kv_shape=KV, host_blocks=8)
    c0 = cluster.instances[0].cache
    at_instance_0(cluster, [4] * 4, True)  # [2] * 4 is lent by 1 in place of the chain's tail, which goes to the host
    assert cluster.manager.debt[0].tolist() == [0, 2, 2] and c0.tiers[1].used == 2
    assert cluster.crash(2) == 4
    assert cluster.manager.debt[0].tolist() == [0, 2, 0] and c0.tiers[1].used == 0
    cluster.check()
    assert at_instance_0(cluster, [2] * 4, True) == 4  # the pages at instance 1 are still good
    cluster.check()


def test_crash_with_an_open_admission_changes_nothing():
    from radixkv import LockError

    from ..strategies import snapshot
    cluster = chain_lent_at_two_creditors()
    admission = cluster.instances[2].cache.admit([7] * 4)
    before = [snapshot(inst.cache) for inst in cluster.instances], cluster.manager.debt.tolist()
    with pytest.raises(LockError):
        cluster.crash(2)
    assert ([snapshot(inst.cache) for inst in cluster.instances], cluster.manager.debt.tolist()) == before
    admission.release()
    cluster.check()


def test_a_crashed_debtor_repays_what_it_borrowed():
    cluster = chain_lent_at_two_creditors()
    assert cluster.crash(0) == 0
    assert cluster.manager.debt.sum() == 0 and cluster.instances[0].cache.num_free_blocks == 4
    assert all(inst.cache.num_held_blocks == 0 for inst in cluster.instances)
    cluster.check()


@pytest.mark.parametrize("index, error", [(3, ValueError), (-1, ValueError), (True, TypeError), (1.0, TypeError)])
def test_crash_of_no_such_instance_raises_and_changes_nothing(index, error):
    cluster = chain_lent_at_two_creditors()
    before = cluster.manager.debt.tolist()
    with pytest.raises(error, match="index"):
        cluster.crash(index)
    assert cluster.manager.debt.tolist() == before
    cluster.check()

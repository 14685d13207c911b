"""Value lending: a full creditor lends the slots of pages colder than the debtor's; borrowed hits are charged."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from radixkv.cluster import ROUTING, Cluster
from radixkv.analysis.stats import ReplayStats
from radixkv.tiers import TierConfigError
from radixkv.workload.traces import Request

from .test_cluster_state import KV, PS, ClusterMachine

A, B, C, D = ([k * 100 + t for t in range(4 * PS)] for k in range(1, 5))  # 4 pages each


def admit_at(cluster: Cluster, i: int, tokens) -> int:
    """Serve ``tokens`` at instance ``i`` (round robin from ``i``), release, check; return the hit tokens."""
    cluster._next = i
    got, admission = cluster.admit(tokens)
    assert got == i
    admission.release()
    cluster.check()
    return admission.hit_tokens


def scenario(lending: str) -> Cluster:
    """Both instances full; instance 1's pages (B) are older than the page instance 0 evicts next (C)."""
    cluster = Cluster(2, num_blocks=4, page_size=PS, borrowing=True, lend_cap=1.0, low_watermark=0.0,
                      lending=lending)
    admit_at(cluster, 0, A)
    admit_at(cluster, 1, B)
    admit_at(cluster, 0, C)  # evicts A (older than B): nothing lent
    assert cluster.manager.blocks_lent == 0
    admit_at(cluster, 0, D)  # evicts C, which is newer than B
    return cluster


def test_a_full_creditor_lends_the_slots_of_its_colder_pages_and_they_hit():
    cluster = scenario("value")
    m = cluster.manager
    assert m.blocks_lent == 4 and m.evicted_to_lend == 4 and m.debt[0, 1] == 4
    assert cluster.instances[1].cache.peek(B) == (0, 0), "a page lent out is not served by its creditor"
    assert admit_at(cluster, 0, C) == 4 * PS
    assert cluster.instances[0].cache.hit_tokens_by_tier["borrowed"] == 4 * PS


def test_free_block_lending_lends_nothing_between_full_caches():
    cluster = scenario("free")
    assert cluster.manager.blocks_lent == 0
    assert admit_at(cluster, 0, C) == 0


def test_a_creditor_short_of_memory_recalls_its_loans():
    cluster = scenario("value")
    m = cluster.manager
    admit_at(cluster, 1, B)  # instance 1 needs 4 blocks and holds only loans: they go
    assert m.recalled == 4 and m.lent(1) == 0
    assert cluster.instances[1].cache.peek(B) == (4, 0)


def test_recall_below_a_rank_takes_only_the_colder_loans():
    cluster = scenario("value")
    m = cluster.manager
    value = next(iter(m.values[1].values()))  # C's rank when it was lent
    assert m.recall(1, 4, below=value) == 0 and m.lent(1) == 4
    cluster.check()
    assert m.recall(1, 4, below=(value[0], value[1] + 1)) == 4 and m.lent(1) == 0
    cluster.check()


def test_replay_counts_borrowed_hits_and_charges_their_transfer():
    cluster = Cluster(2, num_blocks=4, page_size=PS, borrowing=True, lend_cap=1.0, low_watermark=0.0,
                      lending="value")
    small = [7] * PS  # instance 1 keeps 3 blocks free: they are lent to instance 0
    trace = [Request(t) for t in (A, small, C, small, A)]
    result = cluster.replay(trace)
    cluster.check()
    pages = 3  # of A's 4 pages, the 3 shallowest fit in the 3 blocks lent
    assert result.borrowed_hit_tokens == result.hit_tokens_by_tier["borrowed"] == pages * PS
    costs = ReplayStats(PS, miss_reasons=False, tier_costs=cluster.instances[0].cache.cost_model).costs
    assert result.borrowed_transfer_seconds == pytest.approx(
        costs.transfer_seconds("borrowed", pages * costs.page_bytes)) and result.borrowed_transfer_seconds > 0
    expected = costs.ttft_saving_seconds(PS, PS) + costs.ttft_saving_seconds(pages * PS, 4 * PS, {"borrowed": pages})
    assert result.ttft_saving_seconds == pytest.approx(expected)
    assert result.ttft_saving_seconds < costs.ttft_saving_seconds(PS, PS) + costs.ttft_saving_seconds(pages * PS, 4 * PS)
    assert result.lending == "value" and result.manager_seconds > 0


@pytest.mark.parametrize("kw", [{"lending": "pooled"}, {"lending": "value", "policy": "lfu"}])
def test_bad_lending_is_refused(kw):
    with pytest.raises(TierConfigError):
        Cluster(2, 4, PS, borrowing=True, **kw)


class ValueLendingMachine(ClusterMachine):
    """The cluster state machine (borrow, recall, creditor failure, payload bytes) with value lending."""

    @initialize(routing=st.sampled_from(ROUTING), host_blocks=st.sampled_from([0, 0, 0, 4]),
                num_blocks=st.sampled_from([3, 4, 6]), lend_cap=st.sampled_from([0.5, 0.5, 1.0]),
                low_watermark=st.sampled_from([0.0, 0.2]))
    def setup(self, routing, host_blocks, num_blocks, lend_cap, low_watermark):
        self.cluster = Cluster(3, num_blocks, PS, routing=routing, borrowing=True, host_blocks=host_blocks,
                               lend_cap=lend_cap, low_watermark=low_watermark, kv_shape=KV, dtype="float32",
                               lending="value")
        self.open = []
        self.written = set()


TestValueLendingMachine = ValueLendingMachine.TestCase
TestValueLendingMachine.settings = ClusterMachine.TestCase.settings

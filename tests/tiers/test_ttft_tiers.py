"""TTFT saving of hits served from lower tiers: their load time is subtracted (issue 11.12)."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.costs import CostModel, HardwareSpec, get_hardware, get_model
from radixkv.analysis.replay import replay
from radixkv.tiers import HostTier, RemoteTier, TieredCache
from radixkv.workload.traces import Request

PS = 2
# 4 pages fill an HBM of 4 blocks; the second prompt demotes 2 of them to the host; the third
# prompt hits all 4 pages: 2 from HBM, 2 loaded from the host.
PROMPTS = ([1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 8, 8], [1, 2, 3, 4, 5, 6, 7, 8])


def requests():
    return [Request(np.array(p, dtype=np.uint32)) for p in PROMPTS]


def tiered(**kw):
    return TieredCache(4, PS, tiers=[HostTier(8)], load_back="always", **kw)


def test_host_hits_save_less_than_the_same_hbm_hits_by_their_load_time():
    records_hbm, records_host = [], []
    hbm = replay(requests(), PrefixCache(6, PS), on_record=records_hbm.append)
    cache = tiered()
    host = replay(requests(), cache, on_record=records_host.append)
    assert hbm.hit_tokens == host.hit_tokens == 8
    assert cache.hit_tokens_by_tier == {"hbm": 4, "host": 4}
    cm = CostModel(get_model("llama-3-8b"), get_hardware("h100"), PS)
    recompute = cm.recompute_seconds(0, 8)
    load = cm.transfer_seconds("host", 2 * cm.page_bytes)  # 2 pages over PCIe, one transfer
    assert hbm.ttft_saving_seconds == pytest.approx(recompute, rel=1e-12)
    assert host.ttft_saving_seconds == pytest.approx(recompute - load, rel=1e-12)
    assert 0 < host.ttft_saving_seconds < hbm.ttft_saving_seconds
    assert [r.ttft_saving_seconds for r in records_host] == [0.0, 0.0, pytest.approx(recompute - load, rel=1e-12)]
    assert host.prefill_flops_saved == hbm.prefill_flops_saved  # the compute is saved all the same


def test_saving_follows_the_replay_model_and_hardware_and_never_goes_below_zero():
    cm = CostModel(get_model("llama-3-70b"), get_hardware("a100"), PS)
    result = replay(requests(), tiered(), model="llama-3-70b", hardware="a100")
    expected = cm.recompute_seconds(0, 8) - cm.transfer_seconds("host", 2 * cm.page_bytes)
    assert result.ttft_saving_seconds == pytest.approx(expected, rel=1e-12)
    # PCIe at 1 kB/s: loading 2 pages takes far longer than recomputing 8 tokens; saving 0, not negative.
    slow = HardwareSpec("slow-pcie", 1e14, 1e12, 1e3, 1e3)
    records = []
    result = replay(requests(), tiered(), hardware=slow, on_record=records.append)
    assert result.hit_tokens == 8 and result.ttft_saving_seconds == 0.0
    assert [r.ttft_saving_seconds for r in records] == [0.0, 0.0, 0.0]


def test_remote_hits_pay_both_hops():
    cache = TieredCache(4, PS, tiers=[RemoteTier(blocks_per_host=8)], load_back="always")
    result = replay(requests(), cache)
    assert cache.hit_tokens_by_tier == {"hbm": 4, "remote": 4}
    cm = CostModel(get_model("llama-3-8b"), get_hardware("h100"), PS)
    both = cm.transfer_seconds("network", 2 * cm.page_bytes) + cm.transfer_seconds("pcie", 2 * cm.page_bytes)
    assert result.ttft_saving_seconds == pytest.approx(cm.recompute_seconds(0, 8) - both, rel=1e-12)


def test_cost_model_ttft_saving_with_loaded_pages():
    cm = CostModel(get_model("llama-3-8b"), get_hardware("h100"), 16)
    assert cm.ttft_saving_seconds(64, 100, {}) == cm.ttft_saving_seconds(64, 100) == cm.recompute_seconds(0, 64)
    saving = cm.ttft_saving_seconds(64, 100, {"host": 1, "remote": 2})
    assert saving == pytest.approx(cm.recompute_seconds(0, 64) - cm.page_transfer_seconds("host")
                                   - cm.transfer_seconds("remote", 2 * cm.page_bytes), rel=1e-12)
    with pytest.raises(ValueError, match="loaded_pages must hold at most hit_tokens=64"):
        cm.ttft_saving_seconds(64, 100, {"host": 5})
    with pytest.raises(ValueError, match="unknown tier"):
        cm.ttft_saving_seconds(64, 100, {"nvme": 1})
    with pytest.raises(TypeError, match=r"loaded_pages\['host'\] must be an int"):
        cm.ttft_saving_seconds(64, 100, {"host": 1.5})

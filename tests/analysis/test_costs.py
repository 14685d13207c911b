"""Tests for radixkv.costs: KV sizes, closed-form prefill FLOPs, transfer and restore costs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.costs import (
    DEFAULT_MFU,
    DEFAULT_TIER_PATHS,
    HARDWARE,
    MODELS,
    CostArgumentError,
    CostModel,
    CostTypeError,
    Link,
    ModelSpec,
    get_hardware,
    get_model,
    kv_bytes_per_page,
    kv_bytes_per_token,
    prefill_flops,
    prefill_flops_array,
    transfer_seconds,
)
from radixkv.errors import RadixKVError

model_names = st.sampled_from(sorted(MODELS))


def brute_force_flops(model: ModelSpec, start: int, end: int) -> int:
    """Per-token sum straight from the definition: 2N per token + per-layer QK^T and AV over p+1 keys."""
    v_dim = model.v_head_dim or model.head_dim
    total = 0
    for p in range(start, end):
        total += 2 * model.num_params
        for _ in range(model.num_layers):
            qk = 2 * model.num_attention_heads * model.head_dim * (p + 1)
            av = 2 * model.num_attention_heads * v_dim * (p + 1)
            total += qk + av
    return total


def make_cost(model: str = "llama-3-8b", page_size: int = 16, **hw_changes: float) -> CostModel:
    hw = dataclasses.replace(get_hardware("h100"), **hw_changes) if hw_changes else get_hardware("h100")
    return CostModel(get_model(model), hw, page_size)


# --- presets and KV sizes ------------------------------------------------------------------------

def test_kv_bytes_llama_3_8b() -> None:
    assert kv_bytes_per_token(get_model("llama-3-8b")) == 131072 == 2 * 32 * 8 * 128 * 2


def test_kv_bytes_deepseek_v3_mla() -> None:
    assert kv_bytes_per_token(get_model("deepseek-v3")) == 61 * 576 * 2


def test_kv_bytes_per_page() -> None:
    assert kv_bytes_per_page(get_model("qwen2.5-7b"), 16) == 16 * 2 * 28 * 4 * 128 * 2
    with pytest.raises(CostArgumentError, match="page_size.*got 0"):
        kv_bytes_per_page(get_model("qwen2.5-7b"), 0)


@pytest.mark.parametrize(
    "name, layers, hidden, heads, kv_heads, params",
    [
        ("llama-3-8b", 32, 4096, 32, 8, 8.03e9),
        ("llama-3-70b", 80, 8192, 64, 8, 70.6e9),
        ("qwen2.5-7b", 28, 3584, 28, 4, 7.62e9),
        ("deepseek-v3", 61, 7168, 128, 128, 37e9),
    ],
)
def test_presets_match_published_configs(name, layers, hidden, heads, kv_heads, params) -> None:
    m = get_model(name)
    assert (m.name, m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads) == (
        name, layers, hidden, heads, kv_heads)
    assert m.num_params == params and m.dtype_bytes == 2


def test_unknown_presets_list_available_names() -> None:
    with pytest.raises(CostArgumentError, match=r"'gpt-5'.*llama-3-8b"):
        get_model("gpt-5")
    with pytest.raises(CostArgumentError, match=r"'tpu'.*h100"):
        get_hardware("tpu")
    with pytest.raises(ValueError):  # catchable as the built-in and as the radixkv base
        get_model("nope")
    with pytest.raises(RadixKVError):
        get_hardware("nope")


def test_model_spec_validation_names_field_and_value() -> None:
    good = dict(name="m", num_layers=2, hidden_size=8, num_attention_heads=4, num_kv_heads=2,
                head_dim=2, num_params=100)
    ModelSpec(**good)
    with pytest.raises(CostArgumentError, match=r"num_layers.*got 0"):
        ModelSpec(**{**good, "num_layers": 0})
    with pytest.raises(CostArgumentError, match=r"head_dim.*got -1"):
        ModelSpec(**{**good, "head_dim": -1})
    with pytest.raises(CostArgumentError, match=r"kv_latent_dim.*got 0"):
        ModelSpec(**{**good, "kv_latent_dim": 0})
    with pytest.raises(CostArgumentError, match=r"num_attention_heads.*got 5"):
        ModelSpec(**{**good, "num_attention_heads": 5})
    with pytest.raises(CostTypeError, match=r"num_params.*got 100.0"):
        ModelSpec(**{**good, "num_params": 100.0})
    with pytest.raises(TypeError):
        ModelSpec(**{**good, "num_layers": True})


def test_specs_are_frozen_and_slotted() -> None:
    m = get_model("llama-3-8b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.num_layers = 1  # type: ignore[misc]
    assert not hasattr(m, "__dict__") and not hasattr(get_hardware("h100"), "__dict__")


# --- prefill FLOPs -------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(model_names, st.integers(0, 200), st.integers(0, 60))
def test_prefill_flops_matches_brute_force(name: str, start: int, length: int) -> None:
    m = get_model(name)
    assert prefill_flops(m, start, start + length) == brute_force_flops(m, start, start + length)


@given(model_names, st.lists(st.integers(0, 10**7), min_size=3, max_size=3))
def test_prefill_flops_is_additive(name: str, points: list[int]) -> None:
    a, b, c = sorted(points)
    m = get_model(name)
    assert prefill_flops(m, a, b) + prefill_flops(m, b, c) == prefill_flops(m, a, c)


def test_prefill_flops_known_values() -> None:
    m = get_model("llama-3-8b")
    assert prefill_flops(m, 5, 5) == 0
    # One token at position 0 attends over 1 key: 2N + 32 layers * 4 * 32 heads * 128.
    assert prefill_flops(m, 0, 1) == 2 * 8_030_000_000 + 32 * 4 * 32 * 128
    big = prefill_flops(m, 0, 1_000_000)
    assert isinstance(big, int)
    assert big == 2 * 8_030_000_000 * 10**6 + 32 * 4 * 32 * 128 * (10**6 * (10**6 + 1) // 2)


def test_mla_attention_uses_qk_and_v_dims() -> None:
    m = get_model("deepseek-v3")
    assert m.attention_flops_per_key == 2 * 61 * 128 * (192 + 128)


@given(model_names, st.lists(st.tuples(st.integers(0, 2 * 10**6), st.integers(0, 2 * 10**6)),
                             min_size=1, max_size=20))
def test_prefill_flops_array_matches_scalar(name: str, pairs: list[tuple[int, int]]) -> None:
    m = get_model(name)
    starts = np.array([min(p) for p in pairs])
    ends = np.array([max(p) for p in pairs])
    got = prefill_flops_array(m, starts, ends)
    want = [prefill_flops(m, int(s), int(e)) for s, e in zip(starts, ends)]
    assert got.dtype == np.float64 and got.shape == starts.shape
    assert all(math.isclose(g, w, rel_tol=1e-12) for g, w in zip(got, want))


def test_prefill_flops_array_broadcasts_and_validates() -> None:
    m = get_model("llama-3-8b")
    got = prefill_flops_array(m, np.array(0), np.array([1, 2, 3]))
    assert got.tolist() == [float(prefill_flops(m, 0, e)) for e in (1, 2, 3)]
    assert prefill_flops_array(m, np.array([], dtype=np.int64), np.array([], dtype=np.int64)).size == 0
    with pytest.raises(CostArgumentError, match=r"got start 5, end 3"):
        prefill_flops_array(m, np.array([0, 5]), np.array([1, 3]))
    with pytest.raises(CostArgumentError, match=r"got start -1"):
        prefill_flops_array(m, np.array([-1]), np.array([3]))
    with pytest.raises(CostTypeError, match="float64"):
        prefill_flops_array(m, np.array([0.5]), np.array([3]))


@pytest.mark.parametrize(
    "start, end, pattern",
    [(-1, 3, r"start.*got -1"), (0, -2, r"end.*got -2"), (5, 3, r"end must be >= start=5, got 3")],
)
def test_prefill_flops_rejects_bad_ranges(start: int, end: int, pattern: str) -> None:
    with pytest.raises(CostArgumentError, match=pattern):
        prefill_flops(get_model("llama-3-8b"), start, end)


def test_prefill_flops_rejects_non_integers() -> None:
    with pytest.raises(CostTypeError, match=r"start.*got 1.5"):
        prefill_flops(get_model("llama-3-8b"), 1.5, 3)  # type: ignore[arg-type]
    assert prefill_flops(get_model("llama-3-8b"), np.int64(1), np.int64(3)) > 0


# --- hardware and links --------------------------------------------------------------------------

def test_hardware_presets_and_mfu() -> None:
    h100 = get_hardware("h100")
    assert h100.flops == pytest.approx(989e12 * DEFAULT_MFU)
    assert get_hardware("h100", mfu=0.25).flops == pytest.approx(989e12 * 0.25)
    assert get_hardware("a100", mfu=1.0).flops == pytest.approx(312e12)
    assert set(HARDWARE) >= {"h100", "a100"}
    with pytest.raises(CostArgumentError, match=r"mfu.*got 1.5"):
        get_hardware("h100", mfu=1.5)
    with pytest.raises(CostArgumentError, match=r"mfu.*got 0"):
        get_hardware("h100", mfu=0)


@pytest.mark.parametrize("field", ["flops", "pcie_bandwidth", "network_bandwidth", "hbm_bandwidth"])
def test_zero_bandwidth_or_flops_rejected(field: str) -> None:
    with pytest.raises(CostArgumentError, match=rf"{field}.*got 0"):
        dataclasses.replace(get_hardware("h100"), **{field: 0})


def test_transfer_seconds_function() -> None:
    assert transfer_seconds(1000, 1e6, 1e-3) == pytest.approx(2e-3)
    assert transfer_seconds(0, 1e6, 1e-3) == 0.0
    with pytest.raises(CostArgumentError, match=r"bandwidth.*got 0"):
        transfer_seconds(10, 0)
    with pytest.raises(CostArgumentError, match=r"num_bytes.*got -1"):
        transfer_seconds(-1, 1e9)
    with pytest.raises(CostArgumentError, match=r"latency.*got -1"):
        transfer_seconds(1, 1e9, -1)
    with pytest.raises(CostArgumentError, match=r"bandwidth.*got nan"):
        Link("x", float("nan"))


# --- CostModel -----------------------------------------------------------------------------------

def test_transfer_paths_host_and_remote() -> None:
    cm = make_cost()
    hw = cm.hardware
    n = 3 * cm.page_bytes
    pcie = transfer_seconds(n, hw.pcie_bandwidth, hw.pcie_latency)
    net = transfer_seconds(n, hw.network_bandwidth, hw.network_latency)
    assert cm.transfer_seconds("pcie", n) == pytest.approx(pcie)
    assert cm.transfer_seconds("host", n) == pytest.approx(pcie)
    assert cm.transfer_seconds("network", n) == pytest.approx(net)
    assert cm.transfer_seconds("remote", n) == pytest.approx(net + pcie)  # staged via host DRAM
    assert cm.page_transfer_seconds("remote") == pytest.approx(cm.transfer_seconds("remote", cm.page_bytes))
    with pytest.raises(CostArgumentError, match=r"'nvme'"):
        cm.transfer_seconds("nvme", n)
    with pytest.raises(CostArgumentError, match=r"'nvme'"):
        cm.page_transfer_seconds("nvme")


def test_more_tiers_plug_in() -> None:
    cm = CostModel(get_model("llama-3-8b"), get_hardware("h100"), 16,
                   tier_paths={**DEFAULT_TIER_PATHS, "nvme": ("ssd", "pcie"), "rdma": ("network",)},
                   extra_links={"ssd": Link("ssd", 7e9, 80e-6)})
    n = cm.page_bytes
    assert cm.transfer_seconds("nvme", n) == pytest.approx(
        transfer_seconds(n, 7e9, 80e-6) + cm.transfer_seconds("pcie", n))
    assert cm.transfer_seconds("rdma", n) == pytest.approx(cm.transfer_seconds("network", n))
    assert cm.restore_cost(0, 1, ["nvme", "host"]) == pytest.approx(cm.page_transfer_seconds("host"))
    with pytest.raises(CostArgumentError, match=r"tier_paths\['bad'\].*got \('warp',\)"):
        CostModel(get_model("llama-3-8b"), get_hardware("h100"), 16, tier_paths={"bad": ("warp",)})


def test_recompute_seconds() -> None:
    cm = make_cost()
    assert cm.recompute_seconds(32, 64) == pytest.approx(
        prefill_flops(cm.model, 32, 96) / cm.hardware.flops)
    assert cm.recompute_seconds(7, 0) == 0.0
    with pytest.raises(CostArgumentError, match=r"num_tokens.*got -4"):
        cm.recompute_seconds(0, -4)
    with pytest.raises(CostArgumentError, match=r"start_token.*got -1"):
        cm.recompute_seconds(-1, 4)


@given(st.integers(0, 10**5), st.integers(0, 64), st.sampled_from(sorted(MODELS)))
def test_restore_cost_is_min_of_options(start: int, num_pages: int, name: str) -> None:
    cm = make_cost(name)
    recompute = cm.recompute_seconds(start, num_pages * cm.page_size)
    host = cm.transfer_seconds("host", num_pages * cm.page_bytes)
    remote = cm.transfer_seconds("remote", num_pages * cm.page_bytes)
    assert cm.restore_cost(start, num_pages) == recompute
    assert cm.restore_cost(start, num_pages, ["remote"]) == min(recompute, remote)
    assert cm.restore_cost(start, num_pages, ("host", "remote")) == min(recompute, host, remote)
    assert cm.restore_cost(start, num_pages, iter(["host"])) == min(recompute, host)


def test_restore_cost_rejects_bad_inputs() -> None:
    cm = make_cost()
    with pytest.raises(CostArgumentError, match=r"'hbm'"):
        cm.restore_cost(0, 1, ["hbm"])
    with pytest.raises(CostArgumentError, match=r"num_pages.*got -1"):
        cm.restore_cost(0, -1)
    with pytest.raises(CostArgumentError, match=r"'pcie'"):  # links are not tiers
        cm.restore_cost(0, 1, ["pcie"])


def test_should_load_flips_with_bandwidth() -> None:
    fast = make_cost(pcie_bandwidth=1e12, pcie_latency=0.0)
    slow = make_cost(pcie_bandwidth=1e6)
    assert fast.should_load(0, 4, "host")
    assert not slow.should_load(0, 4, "host")
    # Sweep: the decision is monotone in bandwidth and flips exactly once.
    decisions = [make_cost(pcie_bandwidth=10.0 ** k).should_load(0, 4, "host") for k in range(6, 14)]
    assert decisions == sorted(decisions) and decisions[0] is False and decisions[-1] is True
    # Later pages cost more to recompute (attention grows), so loading gets more attractive.
    mid = make_cost(pcie_bandwidth=1e9)
    flips = [mid.should_load(page * 16, 1, "host") for page in (0, 10**3, 10**5)]
    assert flips == sorted(flips)
    with pytest.raises(CostArgumentError, match=r"'disk'"):
        mid.should_load(0, 1, "disk")


def test_should_load_matches_restore_cost() -> None:
    cm = make_cost()
    for start in (0, 4096, 131072):
        for tier in ("host", "remote"):
            load = cm.should_load(start, 2, tier)
            assert load == (cm.restore_cost(start, 2, [tier]) < cm.recompute_seconds(start, 32))


@given(st.integers(0, 10**6), st.sampled_from(sorted(MODELS)), st.sampled_from([1, 16, 64, 512]))
def test_page_recompute_seconds_is_closed_form(page_index: int, name: str, page_size: int) -> None:
    cm = make_cost(name, page_size=page_size)
    want = cm.recompute_seconds(page_index * page_size, page_size)
    assert cm.page_recompute_seconds(page_index) == pytest.approx(want, rel=1e-12)


def test_page_recompute_seconds_is_linear_and_validates() -> None:
    cm = make_cost()
    a = cm.page_recompute_seconds(0)
    b = cm.page_recompute_seconds(1) - a
    assert b > 0
    assert cm.page_recompute_seconds(1000) == pytest.approx(a + 1000 * b, rel=1e-12)
    with pytest.raises(CostArgumentError, match=r"page_index.*got -1"):
        cm.page_recompute_seconds(-1)


def test_ttft_saving_seconds() -> None:
    cm = make_cost()
    assert cm.ttft_saving_seconds(0, 100) == 0.0
    assert cm.ttft_saving_seconds(64, 100) == cm.recompute_seconds(0, 64)
    # The saving plus the remaining suffix prefill is the full-prompt prefill.
    assert cm.ttft_saving_seconds(64, 100) + cm.recompute_seconds(64, 36) == pytest.approx(
        cm.recompute_seconds(0, 100))
    with pytest.raises(CostArgumentError, match=r"hit_tokens must be <= prompt_tokens=10, got 11"):
        cm.ttft_saving_seconds(11, 10)
    with pytest.raises(CostArgumentError, match=r"hit_tokens.*got -1"):
        cm.ttft_saving_seconds(-1, 10)


def test_cost_model_validates_page_size() -> None:
    with pytest.raises(CostArgumentError, match=r"page_size.*got 0"):
        CostModel(get_model("llama-3-8b"), get_hardware("h100"), 0)
    assert "page_size=16" in repr(make_cost())


def test_sanity_orders_of_magnitude() -> None:
    """A 16-token llama-3-8b page: ~2 MiB, loads from host in tens of microseconds, recomputes in ~0.5 ms."""
    cm = make_cost()
    assert cm.page_bytes == 16 * 131072
    assert 1e-5 < cm.page_transfer_seconds("host") < 1e-4
    assert 1e-4 < cm.page_recompute_seconds(0) < 1e-3
    assert cm.should_load(0, 1, "host") and cm.should_load(0, 1, "remote")

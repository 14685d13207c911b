"""Prefill and transfer cost model: what a KV page costs to recompute or to move.

Used by cost-aware eviction (GDSF), by the spill layer (Mooncake's rule: load
back when transfer time < recompute time) and by replay metrics (FLOPs and
TTFT saved). Prefill FLOPs for tokens ``[start, end)`` with ``[0, start)`` cached::

    2 * num_params * (end - start) + attention_flops_per_key * sum(p + 1 for p in [start, end))

since the token at position ``p`` attends over ``p + 1`` keys. The sum has a
closed form, so a page's recompute time is linear in its index: ``a + b * i``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Optional

import numpy as np

from .errors import RadixKVError
from .keys import check_int


class CostArgumentError(RadixKVError, ValueError):
    """A cost-model argument is out of range (negative tokens, zero bandwidth, unknown name)."""


class CostTypeError(RadixKVError, TypeError):
    """A cost-model argument has the wrong type (a float where a count is expected)."""


def _lookup(kind: str, table: Mapping[str, Any], name: object) -> Any:
    """``table[name]``, or :class:`CostArgumentError` naming ``name`` and the available keys."""
    try:
        return table[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise CostArgumentError(f"unknown {kind} {name!r}; available: {', '.join(table)}") from None


def _count(name: str, value: object, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum`` (:func:`radixkv.keys.check_int`), with the cost model's errors."""
    return check_int(value, name, minimum=minimum, type_error=CostTypeError, value_error=CostArgumentError)


def _real(name: str, value: object, *, positive: bool) -> float:
    """``value`` as a finite float, > 0 when ``positive`` else >= 0."""
    if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
        raise CostTypeError(f"{name} must be a number, got {value!r}")
    x = float(value)  # type: ignore[arg-type]
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise CostArgumentError(f"{name} must be {'> 0' if positive else '>= 0'} and finite, got {value!r}")
    return x


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of a decoder-only model, as far as KV size and prefill FLOPs need it.

    Attributes:
        name: preset key or free label.
        num_layers: transformer layers.
        hidden_size: residual width (informational; FLOPs come from ``num_params``).
        num_attention_heads: query heads.
        num_kv_heads: key/value heads (GQA); ignored for KV size when ``kv_latent_dim`` is set.
        head_dim: per-head width of Q and K (for MLA, ``qk_nope + qk_rope``).
        num_params: parameters touched per token; for MoE the *activated* count.
        dtype_bytes: bytes per KV element (2 for BF16/FP16).
        kv_latent_dim: MLA only: cached elements per token per layer (one copy, not K and V).
        v_head_dim: per-head width of V when it differs from ``head_dim`` (MLA).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: int
    dtype_bytes: int = 2
    kv_latent_dim: Optional[int] = None
    v_head_dim: Optional[int] = None

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                  "head_dim", "num_params", "dtype_bytes"):
            _count(f, getattr(self, f), minimum=1)
        for f in ("kv_latent_dim", "v_head_dim"):
            if getattr(self, f) is not None:
                _count(f, getattr(self, f), minimum=1)
        if self.num_attention_heads % self.num_kv_heads:
            raise CostArgumentError(
                f"num_attention_heads must be a multiple of num_kv_heads={self.num_kv_heads}, "
                f"got {self.num_attention_heads!r}")

    @property
    def attention_flops_per_key(self) -> int:
        """FLOPs one new token spends per attended key, summed over layers (QK^T + AV)."""
        v_dim = self.head_dim if self.v_head_dim is None else self.v_head_dim
        return 2 * self.num_layers * self.num_attention_heads * (self.head_dim + v_dim)


# Each preset is copied from the model's config.json on its public model card.
MODELS: dict[str, ModelSpec] = {
    # huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json; 8.03B params per the card.
    "llama-3-8b": ModelSpec("llama-3-8b", 32, 4096, 32, 8, 128, 8_030_000_000),
    # huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json; 70.6B params.
    "llama-3-70b": ModelSpec("llama-3-70b", 80, 8192, 64, 8, 128, 70_600_000_000),
    # huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json; 7.62B params (safetensors count).
    "qwen2.5-7b": ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 128, 7_620_000_000),
    # huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json. MoE: 671B total, 37B
    # activated per token; FLOPs use the activated count. MLA caches kv_lora_rank 512 +
    # qk_rope_head_dim 64 = 576 elements; prefill attention runs per head with
    # qk dim 128 + 64 = 192 and v_head_dim 128.
    "deepseek-v3": ModelSpec("deepseek-v3", 61, 7168, 128, 128, 192, 37_000_000_000,
                             kv_latent_dim=576, v_head_dim=128),
}


def get_model(name: str) -> ModelSpec:
    """The preset :class:`ModelSpec` called ``name``; raises :class:`CostArgumentError` if unknown."""
    return _lookup("model", MODELS, name)


def kv_bytes_per_token(model: ModelSpec) -> int:
    """Bytes of KV cache one token occupies across all layers.

    ``2 * layers * kv_heads * head_dim * dtype_bytes`` (K and V), or for MLA
    ``layers * kv_latent_dim * dtype_bytes`` (one compressed latent).
    """
    if model.kv_latent_dim is not None:
        return model.num_layers * model.kv_latent_dim * model.dtype_bytes
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes


def kv_bytes_per_page(model: ModelSpec, page_size: int) -> int:
    """Bytes of KV cache one page of ``page_size`` tokens occupies."""
    return kv_bytes_per_token(model) * _count("page_size", page_size, minimum=1)


def prefill_flops(model: ModelSpec, start: int, end: int) -> int:
    """FLOPs to compute tokens ``[start, end)`` when tokens ``[0, start)`` are cached.

    Exact integer arithmetic in closed form; O(1) for any ``end``.
    Additive: ``prefill_flops(m, a, b) + prefill_flops(m, b, c) == prefill_flops(m, a, c)``.
    """
    start = _count("start", start)
    end = _count("end", end)
    if end < start:
        raise CostArgumentError(f"end must be >= start={start}, got {end!r}")
    # sum_{p=start}^{end-1} (p + 1); the product of (n) and (n + 2*start + 1) is always even.
    keys = (end - start) * (end + start + 1) // 2
    return 2 * model.num_params * (end - start) + model.attention_flops_per_key * keys


def prefill_flops_array(model: ModelSpec, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Vectorized :func:`prefill_flops` over broadcastable integer arrays; float64 FLOPs.

    O(n). Float64 keeps ~16 significant digits, so results match the exact
    integer form to relative error ~1e-16.
    """
    s, e = np.broadcast_arrays(np.asarray(starts), np.asarray(ends))
    if s.size and not (np.issubdtype(s.dtype, np.integer) and np.issubdtype(e.dtype, np.integer)):
        raise CostTypeError(f"starts and ends must hold integers, got {s.dtype!r} and {e.dtype!r}")
    bad = np.flatnonzero(((s < 0) | (e < s)).ravel())
    if bad.size:
        i = bad[0]
        raise CostArgumentError(f"need 0 <= start <= end, got start {int(s.ravel()[i])!r}, "
                                f"end {int(e.ravel()[i])!r}")
    s, e = s.astype(np.float64), e.astype(np.float64)
    n = e - s
    return 2.0 * model.num_params * n + float(model.attention_flops_per_key) * (n * (e + s + 1) / 2)


@dataclass(frozen=True, slots=True)
class Link:
    """One data path: ``seconds = latency + num_bytes / bandwidth`` (bytes/s, seconds)."""

    name: str
    bandwidth: float
    latency: float = 0.0

    def __post_init__(self) -> None:
        _real("bandwidth", self.bandwidth, positive=True)
        _real("latency", self.latency, positive=False)


def transfer_seconds(num_bytes: int, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds to move ``num_bytes`` over a link of ``bandwidth`` B/s and ``latency`` s; 0 for 0 bytes."""
    num_bytes = _count("num_bytes", num_bytes)
    bandwidth = _real("bandwidth", bandwidth, positive=True)
    latency = _real("latency", latency, positive=False)
    return 0.0 if num_bytes == 0 else latency + num_bytes / bandwidth


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator and its links. Rates in FLOP/s and bytes/s, latencies in seconds.

    Attributes:
        flops: *effective* dense FLOP/s for prefill, i.e. peak * MFU.
        hbm_bandwidth: device memory bandwidth.
        pcie_bandwidth / pcie_latency: host DRAM <-> HBM, one direction.
        network_bandwidth / network_latency: remote host <-> local host DRAM.
    """

    name: str
    flops: float
    hbm_bandwidth: float
    pcie_bandwidth: float
    network_bandwidth: float
    pcie_latency: float = 10e-6
    network_latency: float = 20e-6

    def __post_init__(self) -> None:
        for f in ("flops", "hbm_bandwidth", "pcie_bandwidth", "network_bandwidth"):
            _real(f, getattr(self, f), positive=True)
        for f in ("pcie_latency", "network_latency"):
            _real(f, getattr(self, f), positive=False)

    def links(self) -> dict[str, Link]:
        """The named links ``"pcie"`` and ``"network"``."""
        return {"pcie": Link("pcie", self.pcie_bandwidth, self.pcie_latency),
                "network": Link("network", self.network_bandwidth, self.network_latency)}


DEFAULT_MFU = 0.5  # prefill reaches roughly half of dense peak on long prompts; an assumption.

# Latencies (10 us PCIe: copy launch + DMA setup; 20 us network: RDMA read + completion) are
# order-of-magnitude assumptions, not measurements.
HARDWARE: dict[str, HardwareSpec] = {
    # H100 SXM datasheet: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3. PCIe Gen5 x16 is 64 GB/s raw
    # per direction, ~55 GB/s effective pinned copies. Network: 200 Gb/s RDMA NIC = 25 GB/s.
    "h100": HardwareSpec("h100", 989e12 * DEFAULT_MFU, 3.35e12, 55e9, 25e9),
    # A100 SXM 80GB datasheet: 312 TFLOP/s dense BF16, 2.039 TB/s HBM2e. PCIe Gen4 x16 is 32 GB/s
    # raw, ~25 GB/s effective. Network: 200 Gb/s HDR InfiniBand = 25 GB/s.
    "a100": HardwareSpec("a100", 312e12 * DEFAULT_MFU, 2.039e12, 25e9, 25e9),
}


DEFAULT_MODEL = "llama-3-8b"
"""The model preset every cost, capacity and replay default reads when the caller names none."""
DEFAULT_HARDWARE = "h100"
"""The accelerator preset that goes with :data:`DEFAULT_MODEL`."""


def get_hardware(name: str, mfu: float = DEFAULT_MFU) -> HardwareSpec:
    """The preset :class:`HardwareSpec` called ``name``, its ``flops`` rescaled to ``peak * mfu``."""
    spec: HardwareSpec = _lookup("hardware", HARDWARE, name)
    mfu = _real("mfu", mfu, positive=True)
    if mfu > 1:
        raise CostArgumentError(f"mfu must be in (0, 1], got {mfu!r}")
    return spec if mfu == DEFAULT_MFU else replace(spec, flops=spec.flops / DEFAULT_MFU * mfu)


# Tier -> links crossed to reach HBM. A remote copy is staged through host DRAM and the two hops
# are not overlapped, so remote -> HBM costs network + pcie (conservative; a direct GPU RDMA
# path can be modelled as a tier whose path is a single link).
DEFAULT_TIER_PATHS: dict[str, tuple[str, ...]] = {"host": ("pcie",), "remote": ("network", "pcie")}


class CostModel:
    """Seconds to recompute or to load KV pages, for one model on one accelerator.

    Per-page costs are precomputed, so :meth:`page_recompute_seconds` and
    :meth:`page_transfer_seconds` are O(1) arithmetic, cheap enough per eviction.

    Args:
        model, hardware: the specs; page_size: tokens per KV page.
        tier_paths: tier name -> link names crossed to reach HBM (default :data:`DEFAULT_TIER_PATHS`).
        extra_links: links beyond the hardware's ``"pcie"``/``"network"`` (e.g. an NVMe link).
    """

    __slots__ = ("model", "hardware", "page_size", "page_bytes", "links", "tier_paths",
                 "_tier_cost", "_path_cost", "_page_a", "_page_b", "_page_transfer")

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, page_size: int, *,
                 tier_paths: Optional[Mapping[str, Iterable[str]]] = None,
                 extra_links: Optional[Mapping[str, Link]] = None) -> None:
        self.model = model
        self.hardware = hardware
        self.page_size = _count("page_size", page_size, minimum=1)
        self.page_bytes = kv_bytes_per_page(model, self.page_size)
        self.links: dict[str, Link] = {**hardware.links(), **dict(extra_links or {})}
        paths = DEFAULT_TIER_PATHS if tier_paths is None else tier_paths
        self.tier_paths: dict[str, tuple[str, ...]] = {t: tuple(p) for t, p in paths.items()}
        for tier, path in self.tier_paths.items():
            if not path or any(ln not in self.links for ln in path):
                raise CostArgumentError(
                    f"tier_paths[{tier!r}] must name links among {sorted(self.links)}, got {path!r}")
        # name -> (total latency s, seconds per byte); a tier name shadows a link name.
        self._tier_cost = {t: (sum(self.links[ln].latency for ln in path),
                               sum(1.0 / self.links[ln].bandwidth for ln in path))
                           for t, path in self.tier_paths.items()}
        self._path_cost = {**{n: (ln.latency, 1.0 / ln.bandwidth) for n, ln in self.links.items()},
                           **self._tier_cost}
        p, f, c = self.page_size, hardware.flops, model.attention_flops_per_key
        # Page i covers [i*P, (i+1)*P): sum of (pos + 1) = P*(P+1)/2 + P*P*i.
        self._page_a = (2 * model.num_params * p + c * p * (p + 1) // 2) / f
        self._page_b = c * p * p / f
        self._page_transfer = {t: self.transfer_seconds(t, self.page_bytes) for t in self.tier_paths}

    def __repr__(self) -> str:
        return f"CostModel({self.model.name!r}, {self.hardware.name!r}, page_size={self.page_size})"

    def recompute_seconds(self, start_token: int, num_tokens: int) -> float:
        """Seconds to prefill ``num_tokens`` tokens from ``start_token``, the prefix cached. O(1)."""
        start = _count("start_token", start_token)
        return prefill_flops(self.model, start, start + _count("num_tokens", num_tokens)) / self.hardware.flops

    def transfer_seconds(self, tier_or_link: str, num_bytes: int) -> float:
        """Seconds to move ``num_bytes`` from a tier to HBM (summed over its links) or over one link. O(1)."""
        latency, per_byte = _lookup("tier or link", self._path_cost, tier_or_link)
        n = _count("num_bytes", num_bytes)
        return 0.0 if n == 0 else latency + n * per_byte

    def _tier_seconds(self, tier: str, num_pages: int) -> float:
        latency, per_byte = _lookup("tier", self._tier_cost, tier)
        return 0.0 if num_pages == 0 else latency + num_pages * self.page_bytes * per_byte

    def restore_cost(self, start_token: int, num_pages: int, copies: Iterable[str] = ()) -> float:
        """Seconds to bring back ``num_pages`` pages from ``start_token``: the cheaper of
        recomputing them and loading them from the fastest tier in ``copies``. O(len(copies)).
        """
        n = _count("num_pages", num_pages)
        best = self.recompute_seconds(start_token, n * self.page_size)
        for tier in copies:
            best = min(best, self._tier_seconds(tier, n))
        return best

    def should_load(self, start_token: int, num_pages: int, tier: str) -> bool:
        """Mooncake's rule: load from ``tier`` iff its transfer time < recompute time. O(1)."""
        n = _count("num_pages", num_pages)
        return self._tier_seconds(tier, n) < self.recompute_seconds(start_token, n * self.page_size)

    def ttft_saving_seconds(self, hit_tokens: int, prompt_tokens: int,
                            loaded_pages: Optional[Mapping[str, int]] = None) -> float:
        """Prefill seconds saved by a cached prefix of ``hit_tokens`` of a ``prompt_tokens`` prompt,
        ``loaded_pages[tier]`` of whose pages were loaded from lower tier ``tier`` into HBM.

        The prefix's recompute time (the suffix attends over the prefix keys
        either way) minus the load time of its lower-tier pages, each tier's
        pages as one transfer over that tier's path (:meth:`transfer_seconds`);
        never below zero. No overlap of transfer with compute is assumed: the
        pages are loaded before the prefill of the missed suffix starts (the
        engine matches, loads, then computes), so the whole load time is on the
        request's critical path. An engine that overlaps layer-wise loads with
        compute saves more; this is the conservative figure. O(tiers loaded from).
        """
        prompt = _count("prompt_tokens", prompt_tokens)
        hit = _count("hit_tokens", hit_tokens)
        if hit > prompt:
            raise CostArgumentError(f"hit_tokens must be <= prompt_tokens={prompt}, got {hit!r}")
        saving = self.recompute_seconds(0, hit)
        if loaded_pages:
            pages = {tier: _count(f"loaded_pages[{tier!r}]", n) for tier, n in loaded_pages.items()}
            if sum(pages.values()) * self.page_size > hit:
                raise CostArgumentError(f"loaded_pages must hold at most hit_tokens={hit} tokens "
                                        f"({self.page_size} per page), got {loaded_pages!r}")
            saving -= sum(self._tier_seconds(tier, n) for tier, n in pages.items())
        return max(saving, 0.0)

    def with_specs(self, model: ModelSpec, hardware: HardwareSpec) -> "CostModel":
        """The same page size, tier paths and extra links for another model on another accelerator
        (whose ``"pcie"`` and ``"network"`` links replace this one's)."""
        extra = {name: link for name, link in self.links.items() if name not in self.hardware.links()}
        return CostModel(model, hardware, self.page_size, tier_paths=self.tier_paths, extra_links=extra)

    def page_recompute_seconds(self, page_index: int) -> float:
        """Seconds to recompute page ``page_index`` (tokens ``[i*P, (i+1)*P)``): ``a + b*i``. O(1)."""
        if page_index < 0:
            raise CostArgumentError(f"page_index must be >= 0, got {page_index!r}")
        return self._page_a + self._page_b * page_index

    def page_transfer_seconds(self, tier: str) -> float:
        """Seconds to load one page from ``tier`` into HBM (precomputed). O(1)."""
        return _lookup("tier", self._page_transfer, tier)

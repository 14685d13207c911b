"""One default model/hardware pair: costs defines it, every default reads it."""

from __future__ import annotations

import inspect

from radixkv import api, capacity, costs
from radixkv.analysis import replay, stats, sweep
from radixkv.cache import PrefixCache
from radixkv.policies.gdsf import GDSF
from radixkv.tiers import default_cost_model


def test_every_default_model_and_hardware_is_the_cost_models():
    model, hardware = costs.get_model(costs.DEFAULT_MODEL), costs.get_hardware(costs.DEFAULT_HARDWARE)
    tiered = default_cost_model(16)
    assert (tiered.model, tiered.hardware) == (model, hardware)
    policy = GDSF()
    PrefixCache(8, 4, policy)
    assert (policy.cost_model.model, policy.cost_model.hardware) == (model, hardware)
    assert (stats.DEFAULT_MODEL, stats.DEFAULT_HARDWARE) == (costs.DEFAULT_MODEL, costs.DEFAULT_HARDWARE)
    for fn in (capacity.resolve_blocks, capacity.parse_capacity, api.replay, api.sweep, api.curve, replay.replay):
        assert inspect.signature(fn).parameters["model"].default == costs.DEFAULT_MODEL, fn
    for fn in (api.replay, api.sweep, replay.replay):
        assert inspect.signature(fn).parameters["hardware"].default == costs.DEFAULT_HARDWARE, fn
    job = sweep.SweepJob.__dataclass_fields__
    assert (job["model"].default, job["hardware"].default) == (costs.DEFAULT_MODEL, costs.DEFAULT_HARDWARE)

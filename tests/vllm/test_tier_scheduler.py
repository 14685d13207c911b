"""RadixKVTier inside vLLM 0.33.0: built from the config string, shared by two engines, through the real scheduler.

Every engine is a real ``AsyncScheduler`` or ``Scheduler`` with vLLM's
``OffloadingConnector`` (scheduler role), ``TieringOffloadingSpec``,
``TieringOffloadingManager`` and its CPU primary tier (:mod:`.harness`).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from vllm.distributed.kv_events import MEDIUM_STORAGE, BlockStored
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
from vllm.v1.kv_offload.base import Medium
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

from radixkv.adapters.vllm import RadixKVTier
from radixkv.errors import ArgumentTypeError, ArgumentValueError

from .harness import (BLOCK_SIZE, Engine, block_bytes, make_request, offload_keys, probe, prompt_hashes,
                      tier_config, wait_io)

ISSUE_CONFIG = """{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
  "kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":4194304,
    "secondary_tiers":[{"type":"RadixKVTier","module_path":"radixkv.adapters.vllm",
                        "store":"STORE","namespace":"llama-3-8b"}]}}"""


def prompts(n: int = 100, seed: int = 0):
    """``n`` prompts of 2-12 pages plus 0-15 tokens; about a third start with one shared 4-page system prompt."""
    rng = random.Random(seed)
    system = [rng.randrange(32000) for _ in range(4 * BLOCK_SIZE)]
    out = []
    for _ in range(n):
        body = [rng.randrange(32000) for _ in range(rng.randrange(2, 13) * BLOCK_SIZE + rng.randrange(16))]
        out.append(system + body[: max(len(body) - 4 * BLOCK_SIZE, BLOCK_SIZE + 1)] if rng.random() < 0.35 else body)
    return out


@pytest.fixture
def engines(request):
    made = []

    def make(*args, **kwargs):
        made.append(Engine(*args, **kwargs))
        return made[-1]

    yield make
    for engine in made:
        engine.shutdown()


def test_vllm_builds_the_tier_from_the_config_string_alone(memory_url, engines):
    config = json.loads(ISSUE_CONFIG.replace("STORE", memory_url))
    assert "RadixKVTier" not in SecondaryTierFactory._registry  # no registration call anywhere
    tier_entry = config["kv_connector_extra_config"]["secondary_tiers"][0]
    assert SecondaryTierFactory.get_tier_class(tier_entry) is RadixKVTier
    engine = engines("cfg", config["kv_connector_extra_config"])
    assert type(engine.tier) is RadixKVTier and engine.tier.medium is Medium.STORAGE
    assert engine.tier.core.store.backend.url == memory_url and engine.tier.core.namespace == "llama-3-8b"
    assert engine.tier.block_size_bytes == engine.row_bytes


@pytest.mark.parametrize("entry, error", [({"namespce": "m"}, ArgumentTypeError), ({"namespace": ""}, ArgumentTypeError),
                                          ({"store": "ftp://x"}, ArgumentValueError),
                                          ({"locality": "moon"}, ArgumentValueError)])
def test_a_bad_tier_config_is_a_typed_error(memory_url, entry, error):
    extra = tier_config(memory_url, "m")
    extra["secondary_tiers"][0].update(entry)
    with pytest.raises(error, match="|".join(entry)):
        Engine("bad", extra)


@pytest.mark.parametrize("asynchronous", [True, False], ids=["AsyncScheduler", "Scheduler"])
def test_two_engines_share_one_store(store_url, asynchronous, engines):
    """100 prompts computed only by engine 1: engine 2 finds every page within 2 schedule ends, byte-equal; an
    engine serving them recomputes only what must be computed (the last partial or full page)."""
    config = tier_config(store_url, "llama-3-8b")
    one = engines("one", config, asynchronous=asynchronous)
    texts = prompts()
    requests = [make_request(t) for t in texts]
    one.serve(requests, settle=wait_io)
    wait_io(one)
    assert one.tier.stats()["store_failed_pages"] == 0

    two = engines("two", config, asynchronous=asynchronous)
    ends_taken = []
    for req in requests:
        keys = offload_keys(req)
        ends, rows = probe(two, keys)
        ends_taken.append(ends)
        expected = np.stack([block_bytes(h, two.row_bytes) for h in prompt_hashes(req)])
        assert np.array_equal(rows, expected)
    assert max(ends_taken) <= 2, ends_taken
    assert two.tier.stats()["load_failed_pages"] == 0

    three = engines("three", config, asynchronous=asynchronous)
    again = [make_request(t) for t in texts]
    three.serve(again, settle=wait_io)
    assert three.wrong_loads == 0 and three.loaded_blocks > 0
    must_compute = sum(len(t) - min(len(t) // BLOCK_SIZE * BLOCK_SIZE, len(t) - 1) for t in texts)  # >= 1 token
    assert three.computed_tokens == must_compute
    assert three.scheduler.get_num_unfinished_requests() == 0 and not three.scheduler.has_requests()


def test_get_num_new_matched_tokens_through_schedule(store_url, engines):
    config = tier_config(store_url, "llama-3-8b")
    one = engines("one", config)
    rng = random.Random(1)
    prefix_pages = 9
    prefix = [rng.randrange(32000) for _ in range(prefix_pages * BLOCK_SIZE)]
    one.serve([make_request(prefix + [7, 8, 9])], settle=wait_io)

    two = engines("two", config)
    answers = []
    real = two.connector.get_num_new_matched_tokens

    def spy(request, num_computed_tokens):
        answer = real(request, num_computed_tokens)
        answers.append(answer[0])
        return answer

    two.connector.get_num_new_matched_tokens = spy
    request = make_request(prefix + [1, 2, 3, 4, 5])
    two.add(request)
    two.run(settle=wait_io)
    matched = max(a for a in answers if a is not None)
    assert matched >= (prefix_pages - 1) * BLOCK_SIZE
    assert matched == prefix_pages * BLOCK_SIZE  # every prefix page: the 5 tokens after it are computed
    assert two.computed_tokens == len(request.prompt_token_ids) - matched
    assert two.wrong_loads == 0 and two.loaded_blocks == matched // BLOCK_SIZE
    assert request.is_finished()
    assert two.scheduler.get_num_unfinished_requests() == 0 and not two.scheduler.has_requests()
    assert not two.connector.has_pending_push_work()
    pool = two.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1  # every block back (block 0 is the null block)


def test_namespaces_and_cache_salts_never_hit_each_other(memory_url, engines):
    rng = random.Random(2)
    text = [rng.randrange(32000) for _ in range(6 * BLOCK_SIZE + 3)]
    one = engines("one", tier_config(memory_url, "model-a"))
    one.serve([make_request(text, cache_salt="tenant-1")], settle=wait_io)
    wait_io(one)
    assert one.tier.stats()["stored_pages"] == 6

    cases = [("model-b", "tenant-1"), ("model-a", None), ("model-a", "tenant-2")]
    for i, (namespace, salt) in enumerate(cases):
        other = engines(f"other{i}", tier_config(memory_url, namespace))
        other.serve([make_request(text, cache_salt=salt)], settle=wait_io)
        stats = other.tier.stats()
        assert stats["hits"] == 0 and stats["loaded_pages"] == 0 and other.loaded_blocks == 0, (namespace, salt)
        assert other.computed_tokens == len(text)
    same = engines("same", tier_config(memory_url, "model-a"))
    same.serve([make_request(text, cache_salt="tenant-1")], settle=wait_io)
    assert same.loaded_blocks == 6 and same.wrong_loads == 0


def test_events_and_stats_carry_the_tier(memory_url, engines):
    rng = random.Random(3)
    text = [rng.randrange(32000) for _ in range(5 * BLOCK_SIZE + 1)]
    one = engines("one", tier_config(memory_url, "m"), enable_events=True)
    request = make_request(text)
    one.serve([request], settle=wait_io)
    wait_io(one)
    one.step()  # the finished store jobs are collected at a step
    stored = [e for e in one.published if isinstance(e, BlockStored) and e.medium == MEDIUM_STORAGE]
    assert sorted(h for e in stored for h in e.block_hashes) == sorted(
        maybe_convert_block_hash(h) for h in prompt_hashes(request))
    assert all(e.locality == "LOCAL" for e in stored)  # a memory:// store is in-process
    infos = one.manager.config_info()
    assert {"radixkv_store": memory_url, "radixkv_namespace": "m"}.items() <= infos[1].items()
    one.step()
    assert one.metrics["vllm:kv_offload_radixkv_stored_pages"] == 5  # reported once, through the scheduler's stats
    assert one.metrics["vllm:kv_offload_radixkv_written_bytes"] == 5 * one.row_bytes

    two = engines("two", tier_config(memory_url, "m"), enable_events=True)
    two.serve([make_request(text)], settle=wait_io)
    assert two.metrics["vllm:kv_offload_radixkv_loaded_pages"] == 5
    assert two.metrics["vllm:kv_offload_radixkv_read_bytes"] == 5 * two.row_bytes
    assert two.metrics["vllm:kv_offload_radixkv_lookup_hits"] >= 5
    assert two.metrics.get("vllm:kv_offload_radixkv_load_failed_pages", 0) == 0

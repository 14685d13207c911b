"""A CPU harness for vLLM 0.33.0's real scheduler with radixkv's tier: engines that schedule, "compute" and offload.

An :class:`Engine` is a real ``Scheduler`` or ``AsyncScheduler`` whose
``OffloadingConnector`` (scheduler role) runs ``TieringOffloadingSpec``:
vLLM's ``TieringOffloadingManager`` with its CPU primary tier, and a
``RadixKVTier`` that ``SecondaryTierFactory`` builds from the config string
alone (``module_path`` + ``type``). What a GPU worker would do, the engine
does on numpy arrays: it owns a fake GPU KV array (one row per block), and
each :meth:`Engine.step`

1. runs ``schedule()``;
2. performs the step's load jobs (primary rows -> GPU rows), checking every
   loaded GPU row against the bytes the block must hold;
3. "computes" the scheduled full blocks: writes :func:`block_bytes` of each
   block's hash into its GPU row;
4. performs the store jobs (GPU rows -> primary rows);
5. reports every job done through ``KVConnectorOutput`` and
   ``update_from_output()``, sampling one token for a finished prefill.

A block's bytes are a function of its block hash (:func:`block_bytes`), so
any engine can check any row. What vLLM needs to run on CPU: a fake
``ModelConfig`` (no HF hub), set after ``VllmConfig`` is built; the shared
memory region of the primary tier is released by :meth:`Engine.shutdown`.
"""

from __future__ import annotations

import hashlib
import itertools
from types import SimpleNamespace
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import torch
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK_SIZE = 16
"""Tokens per block (and per offloaded chunk: blocks_per_chunk is 1)."""

init_none_hash(sha256)
_hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
_ids = itertools.count()


def tier_config(store: str, namespace: str, **extra: object) -> dict:
    """The ``kv_connector_extra_config`` of the issue's config string, for this store and namespace."""
    tier = {"type": "RadixKVTier", "module_path": "radixkv.adapters.vllm", "store": store, "namespace": namespace}
    tier.update(extra)
    return {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 4 << 20, "secondary_tiers": [tier]}


def block_bytes(block_hash: bytes, row_bytes: int) -> np.ndarray:
    """The KV bytes of the block with this hash: SHA-256 of the hash, repeated to the row size."""
    seed = hashlib.sha256(b"kv:" + bytes(block_hash)).digest()
    return np.frombuffer((seed * (row_bytes // len(seed) + 1))[:row_bytes], dtype=np.uint8)


def make_request(tokens: Sequence[int], cache_salt: Optional[str] = None, max_tokens: int = 1) -> Request:
    """A vLLM ``Request`` hashed by vLLM's own request block hasher (sha256, as a default vLLM)."""
    return Request(request_id=f"req-{next(_ids)}", prompt_token_ids=list(tokens),
                   sampling_params=SamplingParams(max_tokens=max_tokens), pooling_params=None,
                   cache_salt=cache_salt, block_hasher=_hasher)


def prompt_hashes(request: Request) -> List[bytes]:
    """The block hashes of a request's full prompt blocks (what vLLM offloads by default: offload_prompt_only)."""
    return [bytes(h) for h in request.block_hashes[: request.num_prompt_tokens // BLOCK_SIZE]]


def offload_keys(request: Request) -> List[bytes]:
    """The offload keys of a request's full prompt blocks (group 0), as the connector forms them."""
    return [make_offload_key(h, 0) for h in prompt_hashes(request)]


def _model_config(max_model_len: int) -> SimpleNamespace:
    return SimpleNamespace(
        uses_mrope=False, is_encoder_decoder=False, max_model_len=max_model_len, runner_type="generate",
        is_diffusion=False, supports_multimodal_inputs=False, return_sampling_mask=False, model="radixkv-test",
        dtype=torch.float32, skip_tokenizer_init=True, use_mla=False, get_total_num_kv_heads=lambda: 1,
        is_hybrid=False, multimodal_config=None)


class Engine:
    """One vLLM scheduler with an offloading connector and radixkv's tier, and a fake GPU worker.

    Args:
        engine_id: vLLM's engine id (names the primary tier's shared-memory region).
        extra_config: ``kv_connector_extra_config`` (:func:`tier_config`); ``None``: no connector (vLLM's
            prefix cache alone).
        asynchronous: ``AsyncScheduler`` (default) or ``Scheduler``.
        num_gpu_blocks: blocks of the fake GPU KV cache.
        enable_events: vLLM's ``enable_kv_cache_events`` (the tier keeps events only then).
    """

    def __init__(self, engine_id: str, extra_config: Optional[dict], *, asynchronous: bool = True, num_gpu_blocks: int = 2048,
                 max_model_len: int = 8192, enable_events: bool = False) -> None:
        scheduler_config = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=max_model_len,
                                           max_model_len=max_model_len, is_encoder_decoder=False)
        cache_config = CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9, cache_dtype="auto",
                                   enable_prefix_caching=True)
        cache_config.num_gpu_blocks = num_gpu_blocks
        transfer = None if extra_config is None else KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both", engine_id=engine_id,
            kv_connector_extra_config=extra_config)
        kwargs = {}
        if enable_events:
            from vllm.config import KVEventsConfig
            kwargs["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
        config = VllmConfig(scheduler_config=scheduler_config, cache_config=cache_config,
                            kv_transfer_config=transfer, device_config=DeviceConfig("cpu"), **kwargs)
        config.model_config = _model_config(max_model_len)
        kv_cache_config = KVCacheConfig(num_blocks=num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1,
                                                          dtype=torch.float32))])
        cls = AsyncScheduler if asynchronous else Scheduler
        self.scheduler = cls(vllm_config=config, kv_cache_config=kv_cache_config,
                             structured_output_manager=StructuredOutputManager(config), block_size=BLOCK_SIZE,
                             log_stats=True)
        self.connector = self.scheduler.connector
        if self.connector is not None:
            self.manager = self.connector.connector_scheduler.manager
            (self.tier,) = self.manager.secondary_tiers
            self.primary = np.asarray(self.manager.primary_tier.get_kv_memoryview()).view(np.uint8)
        else:
            self.manager = self.tier = None
            self.primary = np.zeros((0, 64), dtype=np.uint8)
        self.row_bytes = self.primary.shape[1]
        self.gpu = np.zeros((num_gpu_blocks, self.row_bytes), dtype=np.uint8)
        self.requests: Dict[str, Request] = {}
        self.loaded_blocks = 0
        self.computed_tokens = 0
        self.metrics: Dict[str, float] = {}  # the connector's stats the scheduler reported, summed over steps
        self.published: list = []  # the KV events the scheduler publishes (its publisher is replaced)
        self.scheduler.kv_event_publisher.publish = lambda batch: self.published.extend(batch.events)
        self.wrong_loads = 0
        self.steps = 0

    # ------------------------------------------------------------------ driving
    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.scheduler.add_request(request)

    def step(self):
        """One engine step (see the module docstring); returns the ``SchedulerOutput``."""
        out = self.scheduler.schedule()
        self.steps += 1
        meta = out.kv_connector_metadata
        done = OffloadingWorkerMetadata()
        received = set()
        for job_id, job in (meta.load_jobs if meta else {}).items():
            src, dst = np.asarray(job.src_spec.block_ids), np.asarray(job.dst_spec.block_ids)
            self.gpu[dst] = self.primary[src]
            req = self.requests[job.req_id]
            blocks = self._block_ids(job.req_id)
            for b in dst:
                h = req.block_hashes[blocks.index(int(b))]
                self.loaded_blocks += 1
                self.wrong_loads += int(not np.array_equal(self.gpu[b], block_bytes(h, self.row_bytes)))
            done.mark_completed(job_id)
            if not job.sync:  # an asynchronous load: its request waits for this report to resume
                received.add(job.req_id)
        for req_id, n in out.num_scheduled_tokens.items():
            req = self.requests[req_id]
            self.computed_tokens += n
            start = self._computed_before(out, req_id)
            blocks = self._block_ids(req_id)
            for i in range(start // BLOCK_SIZE, min((start + n) // BLOCK_SIZE, len(req.block_hashes))):
                self.gpu[blocks[i]] = block_bytes(req.block_hashes[i], self.row_bytes)
        for job_id, job in (meta.store_jobs if meta else {}).items():
            src, dst = np.asarray(job.src_spec.block_ids), np.asarray(job.dst_spec.block_ids)
            self.primary[dst] = self.gpu[src]
            done.mark_completed(job_id)
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            req = self.requests[req_id]
            end = self._computed_before(out, req_id) + out.num_scheduled_tokens[req_id]
            sampled.append([1] if end >= req.num_prompt_tokens else [])
        output = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                   sampled_token_ids=sampled,
                                   kv_connector_output=KVConnectorOutput(finished_recving=received,
                                                                         kv_connector_worker_meta=done))
        for core_outputs in self.scheduler.update_from_output(out, output).values():
            stats = core_outputs.scheduler_stats
            if stats is not None and stats.kv_connector_stats:
                payload = OffloadingConnectorStats(data=stats.kv_connector_stats)
                for name, value in payload.reduce().items():
                    self.metrics[name] = self.metrics.get(name, 0) + value
        return out

    def _block_ids(self, req_id: str) -> List[int]:
        return list(self.scheduler.kv_cache_manager.get_block_ids(req_id)[0])

    @staticmethod
    def _computed_before(out, req_id: str) -> int:
        for req in out.scheduled_new_reqs:
            if req.req_id == req_id:
                return req.num_computed_tokens
        cached = out.scheduled_cached_reqs
        return cached.num_computed_tokens[cached.req_ids.index(req_id)]

    def run(self, max_steps: int = 1000, settle=None) -> int:
        """Step until no request is left and the connector has no pending work; returns the steps taken.

        ``settle`` (a callable) runs between steps: tests pass one that waits for the tier's I/O, the time a
        real engine spends on the forward pass.
        """
        for n in range(max_steps):
            if not self.scheduler.has_requests() and not (self.connector and self.connector.has_pending_push_work()):
                return n
            self.step()
            if settle is not None:
                settle(self)
        raise AssertionError(f"the engine did not finish in {max_steps} steps")

    def serve(self, requests: Iterable[Request], settle=None) -> int:
        for r in requests:
            self.add(r)
        return self.run(settle=settle)

    def shutdown(self) -> None:
        """Shut the connector down (the tier, then the primary's shared-memory file)."""
        self.primary = np.empty((0, self.row_bytes), dtype=np.uint8)  # release the exported buffer
        if self.connector is not None:
            self.connector.shutdown()


def wait_io(engine: Engine) -> None:
    """Wait until the engine's radixkv tier has no lookup queued and no job in flight."""
    if engine.tier is not None:
        assert engine.tier.core.drain(timeout=60), "the tier's jobs did not finish in 60 s"


def probe(engine: Engine, keys: Sequence[bytes], max_ends: int = 6):
    """Look ``keys`` up through the engine's ``TieringOffloadingManager`` as the connector does, ending a
    schedule step (and waiting for the tier's I/O) between rounds, until every key is a HIT in the primary tier.

    Returns ``(schedule ends taken, the primary rows of the keys)``; the rows are read between vLLM's
    ``prepare_load`` and ``complete_load``, as the worker would. Raises if ``max_ends`` do not suffice.
    """
    manager = engine.manager
    ctx = ReqContext(req_id=f"probe-{next(_ids)}")
    with manager.lock:
        manager.on_new_request(ctx)
    try:
        for ends in range(max_ends + 1):
            with manager.lock:
                results = [manager.lookup(k, ctx) for k in keys]
            if all(r is LookupResult.HIT for r in results):
                with manager.lock:
                    spec = manager.prepare_load(keys, ctx)
                    rows = engine.primary[np.asarray(spec.block_ids)].copy()
                    manager.complete_load(keys, ctx)
                return ends, rows
            with manager.lock:
                manager.on_schedule_end(ScheduleEndContext((), ()))
            wait_io(engine)
        raise AssertionError(f"not every key was a HIT after {max_ends} schedule ends: {results}")
    finally:
        with manager.lock:
            manager.on_request_finished(ctx)
            manager.on_schedule_end(ScheduleEndContext((), ()))

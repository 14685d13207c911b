"""RadixKVTier: radixkv's shared page store as a secondary tier of vLLM 0.33.0's ``OffloadingConnector``.

Imported by vLLM (``SecondaryTierFactory`` imports ``module_path`` and reads
``type`` off it) or through :mod:`radixkv.adapters.vllm`'s lazy attribute;
this module imports vLLM, nothing else in radixkv does. Config::

    --kv-transfer-config '{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
      "kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":<bytes>,
        "secondary_tiers":[{"type":"RadixKVTier","module_path":"radixkv.adapters.vllm",
                            "store":"redis://127.0.0.1:6379","namespace":"llama-3-8b"}]}}'

vLLM keeps the GPU <-> CPU copies, the primary CPU tier, promotion of hits,
cascading of every completed CPU store to this tier, ref-counting and
back-pressure. This class translates its calls to
:class:`~radixkv.adapters.vllm.store_tier.StoreTierCore`, which does the work
off the scheduler thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, Collection, Dict, Iterable, List, Optional

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import (
    ConfigInfoMapping,
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from ...errors import ArgumentTypeError, ArgumentValueError
from ...store import Fingerprint, PageStore
from .store_tier import HIT, MISS, StoreTierCore

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

logger = logging.getLogger(__name__)

METRICS = {
    "hits": "vllm:kv_offload_radixkv_lookup_hits",
    "misses": "vllm:kv_offload_radixkv_lookup_misses",
    "loaded_pages": "vllm:kv_offload_radixkv_loaded_pages",
    "load_failed_pages": "vllm:kv_offload_radixkv_load_failed_pages",
    "stored_pages": "vllm:kv_offload_radixkv_stored_pages",
    "store_failed_pages": "vllm:kv_offload_radixkv_store_failed_pages",
    "read_bytes": "vllm:kv_offload_radixkv_read_bytes",
    "written_bytes": "vllm:kv_offload_radixkv_written_bytes",
}
"""The tier's counters (:meth:`StoreTierCore.stats` names) -> the vLLM metric each is reported as."""

_HELP = {
    "hits": "Chunk lookups the radixkv tier answered present in the shared store.",
    "misses": "Chunk lookups the radixkv tier answered absent (or failed) in the shared store.",
    "loaded_pages": "Pages the radixkv tier loaded, verified, into the CPU tier.",
    "load_failed_pages": "Pages a radixkv load did not deliver (absent, torn, or store down): recomputed.",
    "stored_pages": "Pages the radixkv tier found in the shared store after a store job.",
    "store_failed_pages": "Pages of radixkv store jobs that failed (store down).",
    "read_bytes": "Row bytes the radixkv tier loaded from the shared store.",
    "written_bytes": "Row bytes of store jobs the radixkv tier completed.",
}


def _fingerprint(spec: Any, namespace: str, row_bytes: int) -> Fingerprint:
    """What a primary row's bytes mean: the namespace, KV dtype, row size, tokens per row and parallel layout."""
    config = getattr(spec, "config", None)
    dtype = str(getattr(getattr(config, "model", None), "dtype", "") or "unknown")
    per_block = tuple(getattr(spec, "tokens_per_block", ()) or (0,))
    page_tokens = max(1, int(per_block[0]) * int(getattr(spec, "blocks_per_chunk", 1) or 1))
    par = getattr(config, "parallel", None)
    layout = ";".join(f"{name}={getattr(par, name, '')}" for name in ("tp_size", "pp_size", "pcp_size", "dcp_size"))
    extra = (f"vllm-offload-row;{layout};tokens_per_block={list(per_block)};"
             f"kv_cache_layout={getattr(config, 'kv_cache_layout', None)};"
             f"canonical={getattr(config, 'canonical_layout', False)}")
    return Fingerprint(model=namespace, dtype=dtype, kv_shape=(row_bytes,), page_size=page_tokens, extra=extra)


def _rows(view: memoryview) -> np.ndarray:
    """The primary tier's rows as a writable ``(num_rows, row_bytes)`` uint8 array over ``view`` (no copy)."""
    arr = np.asarray(view)
    if arr.ndim == 0 or not arr.flags.c_contiguous:
        raise ArgumentValueError(f"primary_kv_view must be a C-contiguous buffer of rows, got shape {arr.shape}")
    rows = arr.reshape(arr.shape[0], -1).view(np.uint8)
    if not rows.flags.writeable:
        raise ArgumentValueError("primary_kv_view must be writable (loads write its rows)")
    return rows


class RadixKVTier(SecondaryTierManager):
    """vLLM secondary tier over a radixkv :class:`~radixkv.store.PageStore` shared by engines.

    Args (vLLM passes the first four; the rest come from the tier's config entry):
        offloading_spec: vLLM's ``TieringOffloadingSpec``.
        primary_kv_view: the CPU tier's rows (``strides[0]`` bytes each).
        tier_type: ``"RadixKVTier"``.
        backpressure_detector: vLLM's, if configured.
        store: the store URL: ``memory://NAME`` (in-process, shared by name),
            ``redis://HOST:PORT[/DB]``, ``mooncake://...`` (:meth:`PageStore.open`).
        namespace: the model's identity (``"llama-3-8b"``); engines share pages only
            under equal namespaces and equal row layouts. vLLM's ``cache_salt`` is
            already inside its block hashes.
        io_threads: pool threads doing round trips and row copies (default 2: each one competes with the
            scheduler thread for the GIL while it runs Python).
        answer_ttl: seconds a lookup's answer is reused, and a failed page counted a miss (default 1).
        timeout: seconds one store operation may block a pool thread (default 0.25).
        locality: ``"LOCAL"`` or ``"REMOTE"`` (default: LOCAL for ``memory://``, else REMOTE).
        enable_kv_events: keep :meth:`take_events` events (only if vLLM publishes KV events).

    Cost on the scheduler thread: ``lookup`` O(1) (a dict probe), ``submit_*``
    a job hand-off to the pool (no copy, no round trip), ``get_finished_jobs``
    O(finished jobs).
    """

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec: "OffloadingSpec", primary_kv_view: memoryview, tier_type: str,
                 store: Optional[str] = None, namespace: Optional[str] = None, io_threads: int = 2,
                 answer_ttl: float = 1.0, timeout: float = 0.25, locality: Optional[str] = None,
                 enable_kv_events: bool = True,
                 backpressure_detector: Optional["BackpressureDetector"] = None, **unknown: Any) -> None:
        if unknown:  # a misspelt key in the tier's config entry: say which, before anything is opened
            raise ArgumentTypeError(f"RadixKVTier got unknown config keys {sorted(unknown)}; it takes store, "
                                    "namespace, io_threads, answer_ttl, timeout, locality, enable_kv_events")
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view, tier_type=tier_type,
                         backpressure_detector=backpressure_detector)
        if not isinstance(store, str) or not store:
            raise ArgumentTypeError(f"RadixKVTier needs 'store', a store URL (memory://NAME, redis://HOST:PORT), "
                                    f"got {store!r}")
        if not isinstance(namespace, str) or not namespace:
            raise ArgumentTypeError(f"RadixKVTier needs 'namespace', a non-empty str (the model), got {namespace!r}")
        if locality is None:
            self.locality = Locality.LOCAL if store.startswith("memory:") else Locality.REMOTE
        else:
            try:
                self.locality = Locality[str(locality).upper()]
            except KeyError:
                raise ArgumentValueError(f"locality must be 'LOCAL' or 'REMOTE', got {locality!r}") from None
        rows = _rows(primary_kv_view)
        fingerprint = _fingerprint(offloading_spec, namespace, rows.shape[1])
        self.core = StoreTierCore(PageStore.open(store, fingerprint, timeout=timeout), namespace, rows,
                                  io_threads=io_threads, answer_ttl=answer_ttl)
        kv_events = getattr(offloading_spec, "kv_events_config", None)
        publish = bool(getattr(kv_events, "enable_kv_cache_events", False))
        self._events: Optional[List[OffloadingEvent]] = [] if enable_kv_events and publish else None
        self._reported: Dict[str, int] = dict.fromkeys(METRICS, 0)
        logger.info("RadixKVTier on %s, namespace %r, rows of %d bytes", self.core.store.backend.url, namespace,
                    rows.shape[1])

    # ------------------------------------------------------------------ contract
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT / MISS from a fresh answer, else RETRY (the store is asked at the step's end). O(1)."""
        answer = self.core.lookup(key, req_context.req_id)
        if answer == HIT:
            return LookupResult.HIT
        return LookupResult.MISS if answer == MISS else LookupResult.RETRY

    def submit_store(self, job_metadata: TransferJob) -> None:
        """Hand primary rows ``chunk_ids`` to the pool for the store; returns at once."""
        self.core.submit_store(job_metadata.job_id, job_metadata.keys, job_metadata.chunk_ids)

    def submit_load(self, job_metadata: TransferJob) -> None:
        """Hand the load of ``keys`` into rows ``chunk_ids`` to the pool; returns at once."""
        self.core.submit_load(job_metadata.job_id, job_metadata.keys, job_metadata.chunk_ids)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        """Jobs finished since the last call; a partial load lists its loaded keys. O(jobs)."""
        out = []
        for job in self.core.finished_jobs():
            out.append(JobResult(job_id=job.job_id, success=job.success,
                                 successful_keys=None if job.successful_keys is None else list(job.successful_keys),
                                 transfer_time=job.seconds, transfer_bytes=job.num_bytes))
            if self._events is not None and job.stored_keys:
                self._events.append(OffloadingEvent(keys=list(job.stored_keys), medium=self.medium,
                                                    removed=job.is_load, locality=self.locality))
        return out

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Chunk level: only newly computed chunks are stored (vLLM's default)."""
        return RequestOffloadingContext()

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """Send this step's queued lookups (one batched existence check per request)."""
        self.core.flush_lookups()

    def has_pending_work(self) -> bool:
        """Lookups queued or jobs in flight: vLLM keeps stepping until they report."""
        return self.core.busy

    def drain_jobs(self) -> None:
        """Block until no job touches the primary rows (vLLM's reset)."""
        self.core.drain()

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Stored / removed events with this tier's medium (STORAGE): pages stored, pages a load found gone."""
        if self._events:
            events, self._events = self._events, []
            yield from events

    def get_stats(self) -> Optional[OffloadingConnectorStats]:
        """The counters' increase since the last call, as vLLM metrics (:data:`METRICS`); None if nothing changed."""
        counts = self.core.stats()
        stats = OffloadingConnectorStats()
        for name, metric in METRICS.items():
            delta = counts[name] - self._reported[name]
            if delta:
                stats.increase_counter(metric, delta)
                self._reported[name] = counts[name]
        return None if stats.is_empty() else stats

    @classmethod
    def build_metric_definitions(cls, extra_config: Dict[str, Any]) -> Dict[str, OffloadingMetricMetadata]:
        """Prometheus definitions of :data:`METRICS`."""
        return {metric: OffloadingCounterMetadata(documentation=_HELP[name]) for name, metric in METRICS.items()}

    @classmethod
    def config_info_keys(cls, tier_config: Dict[str, Any]) -> tuple:
        return ("radixkv_store", "radixkv_namespace")

    def config_info(self) -> ConfigInfoMapping:
        return {"radixkv_store": self.core.store.backend.url, "radixkv_namespace": self.core.namespace}

    def stats(self) -> Dict[str, Any]:
        """radixkv's own counters (monotonic, with the store's): :meth:`StoreTierCore.stats`."""
        return self.core.stats()

    def shutdown(self) -> None:
        """Finish in-flight jobs, stop the pool, close the store's connections."""
        self.core.close()


__all__ = ["METRICS", "RadixKVTier"]

"""The engine-free half of :class:`~radixkv.adapters.vllm.RadixKVTier`: vLLM offload keys over a PageStore, off-thread.

vLLM's ``TieringOffloadingManager`` calls a secondary tier on its scheduler
thread, under its lock, and every call must return at once. This module does
the work those calls start, with no vLLM import (so it is tested in the main
suite too):

* **keys.** :meth:`StoreTierCore.store_key` maps a vLLM offload key (block
  hash + 4-byte group index; ``cache_salt`` is already inside the hash) to a
  store key ``prefix + SHA-256(root + offload key)``. The root hashes the
  store's fingerprint digest and the tier's namespace, so every path (lookup,
  load, store, events' bookkeeping) goes through one function and no key
  exists outside a namespace.
* **lookup.** :meth:`StoreTierCore.lookup` answers from what it knows: ``HIT``
  or ``MISS`` while a recent answer is fresh (``answer_ttl`` seconds),
  otherwise ``RETRY``, queueing the key. :meth:`flush_lookups` (called at the
  end of each scheduler step) sends the queued keys, one batched existence
  check per request (the store answers a request's leading run), on the pool.
* **store and load.** :meth:`submit_store` / :meth:`submit_load` hand a job to
  a small pool of threads through a lock-free queue and return (a few
  microseconds of work: the job's keys and chunk ids are checked and listed). The pool reads or writes
  the primary rows and the store; finished jobs wait in a queue for
  :meth:`finished_jobs`.
* **faults.** A load serves only values the store verified (fingerprint, key,
  length, SHA-256 digest; :mod:`radixkv.store.codec`) and exactly one primary
  row long; it stops at the first page that is absent, torn, or on a store that
  does not answer. Pages before that are loaded; that page is remembered as a
  miss for ``answer_ttl`` seconds (no retry storm), the pages after it are
  forgotten and asked again if looked up. A row is written only after its page
  was verified, so no row is ever promoted with wrong bytes.

Thread model: the scheduler thread calls every public method; pool threads
run the jobs and touch shared state only under one lock, held for dict and
deque updates, never across I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import ArgumentTypeError, ArgumentValueError
from ...events.hashing import cbor_dumps
from ...keys import check_int
from ...store import PageStore

_log = logging.getLogger(__name__)

HIT = "hit"
MISS = "miss"
RETRY = "retry"

KEY_SCHEME = "radixkv-vllm-offload/1"
"""Hashed into every store key's root; changes if the key scheme does."""

STAT_NAMES = ("lookups", "hits", "misses", "retries", "lookup_batches", "loads", "loaded_pages", "load_failed_pages",
              "read_bytes", "stores", "stored_pages", "store_failed_pages", "written_bytes", "evicted_answers")
"""The counters :meth:`StoreTierCore.stats` reports (see there)."""


@dataclasses.dataclass(frozen=True)
class FinishedJob:
    """One job the pool finished.

    Attributes:
        job_id: vLLM's job id.
        is_load: a load (store -> primary rows) or a store (primary rows -> store).
        success: every key of the job succeeded.
        successful_keys: on a partial load, the offload keys that were loaded (in job order); ``None``
            when all keys share ``success``.
        num_bytes: payload bytes moved.
        seconds: wall time of the transfer on the pool thread.
        stored_keys: for a store, the offload keys present in the store afterwards; for a load,
            the page it could not read (absent, refused, or on a store that did not answer).
    """

    job_id: int
    is_load: bool
    success: bool
    successful_keys: Optional[Tuple[bytes, ...]]
    num_bytes: int
    seconds: float
    stored_keys: Tuple[bytes, ...] = ()


class StoreTierCore:
    """Asynchronous lookup, store and load of vLLM offload keys against one :class:`~radixkv.store.PageStore`.

    Args:
        store: the shared page store (its fingerprint says what a row's bytes mean).
        namespace: hashed into every key's root; tiers of different namespaces never share a page.
        primary: the primary tier's rows, a 2-D ``uint8`` array (one row per chunk id), written in place.
        io_threads: pool threads doing the store's round trips and the row copies.
        answer_ttl: seconds a lookup's answer (present / absent / failed) is reused before asking again.
        max_answers: most remembered answers (least recently set dropped first).
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, store: PageStore, namespace: str, primary: np.ndarray, *, io_threads: int = 2,
                 answer_ttl: float = 1.0, max_answers: int = 1 << 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(store, PageStore):
            raise ArgumentTypeError(f"store must be a PageStore, got {store!r}")
        if not isinstance(namespace, str) or not namespace:
            raise ArgumentValueError(f"namespace must be a non-empty str, got {namespace!r}")
        if not isinstance(primary, np.ndarray) or primary.dtype != np.uint8 or primary.ndim != 2:
            raise ArgumentTypeError(f"primary must be a 2-D uint8 array of rows, got {primary!r:.80}")
        io_threads = check_int(io_threads, "io_threads", minimum=1, maximum=64)
        if isinstance(answer_ttl, bool) or not isinstance(answer_ttl, (int, float)) or not answer_ttl >= 0:
            raise ArgumentValueError(f"answer_ttl must be seconds >= 0, got {answer_ttl!r}")
        self.store = store
        self.namespace = namespace
        self.primary = primary
        self.row_bytes = int(primary.shape[1])
        self.answer_ttl = float(answer_ttl)
        self.max_answers = check_int(max_answers, "max_answers", minimum=1)
        self._clock = clock
        root = cbor_dumps([KEY_SCHEME, store.keys.fingerprint_digest, namespace])
        self._root = hashlib.sha256(root).digest()
        self._prefix = store.keys.prefix
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._answers: "OrderedDict[bytes, Tuple[str, float]]" = OrderedDict()
        self._asked: Dict[bytes, None] = {}
        self._queued: Dict[str, List[bytes]] = {}
        self._finished: Deque[FinishedJob] = deque()
        self._tickets = itertools.count(1)
        self._submitted = 0  # jobs handed to the pool (set by the scheduler thread only)
        self._completed = 0  # jobs the pool finished (under the lock)
        self._counts: Dict[str, int] = dict.fromkeys(STAT_NAMES, 0)
        # A lock-free hand-off: SimpleQueue.put never blocks and takes no lock the workers hold for long, so a
        # submit never waits for a pool thread (a ThreadPoolExecutor's submit takes locks its workers share).
        self._jobs: "queue.SimpleQueue[Optional[Tuple[Callable[..., None], Tuple[Any, ...]]]]" = queue.SimpleQueue()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"radixkv-tier-{i}", daemon=True)
                         for i in range(io_threads)]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ keys
    def store_key(self, offload_key: bytes) -> bytes:
        """The store key of a vLLM offload key in this tier's namespace. About 1 us (one SHA-256)."""
        if offload_key.__class__ is not bytes:
            raise ArgumentTypeError(f"offload key must be bytes, got {offload_key!r:.60}")
        return self._prefix + hashlib.sha256(self._root + offload_key).digest()

    # ------------------------------------------------------------------ lookup
    def lookup(self, offload_key: bytes, req_id: str) -> str:
        """:data:`HIT`, :data:`MISS` (a fresh answer) or :data:`RETRY` (queued for :meth:`flush_lookups`). O(1).

        Not verified: a HIT's value may still be refused by the load, which then
        fails that page (never a row with wrong bytes).
        """
        now = self._clock()
        with self._lock:
            self._counts["lookups"] += 1
            answer = self._answers.get(offload_key)
            if answer is not None and answer[1] > now:
                self._counts["hits" if answer[0] == HIT else "misses"] += 1
                return answer[0]
            self._counts["retries"] += 1
            if offload_key not in self._asked:
                self._asked[offload_key] = None
                self._queued.setdefault(req_id, []).append(offload_key)
            return RETRY

    def flush_lookups(self) -> int:
        """Send the queued lookups: one pool task (one batched existence check) per request. Returns the tasks.

        Keys are checked in the order the request looked them up (its prefix
        order); the store answers the leading run present, so the first absent
        key is a MISS and the keys after it are asked again when looked up.
        """
        with self._lock:
            batches, self._queued = self._queued, {}
        for keys in batches.values():
            self._spawn(self._check_present, keys)
        return len(batches)

    def _check_present(self, keys: List[bytes]) -> None:
        n = -1
        try:
            n = self.store.lookup([self.store_key(k) for k in keys])
        finally:
            with self._lock:
                self._counts["lookup_batches"] += 1
                if n >= 0:
                    self._remember(keys[:n], HIT)
                    self._remember(keys[n:n + 1], MISS)
                for key in keys:
                    self._asked.pop(key, None)

    def _remember(self, keys: Sequence[bytes], answer: str) -> None:
        """Caller holds the lock."""
        expiry = self._clock() + self.answer_ttl
        answers = self._answers
        for key in keys:
            answers[key] = (answer, expiry)
            answers.move_to_end(key)
        while len(answers) > self.max_answers:
            answers.popitem(last=False)
            self._counts["evicted_answers"] += 1

    # ------------------------------------------------------------------ jobs
    def _check_job(self, keys: Sequence[bytes], chunk_ids: Any) -> Tuple[List[bytes], List[int]]:
        keys = list(keys)
        rows = chunk_ids.tolist() if isinstance(chunk_ids, np.ndarray) else [int(r) for r in chunk_ids]
        if len(keys) != len(rows):
            raise ArgumentValueError(f"a job needs one chunk id per key: {len(keys)} keys, {len(rows)} chunk ids")
        if rows and (min(rows) < 0 or max(rows) >= len(self.primary)):
            raise ArgumentValueError(f"chunk ids must be rows of the primary tier (0..{len(self.primary) - 1}), "
                                     f"got {min(rows)}..{max(rows)}")
        return keys, rows

    def submit_store(self, job_id: int, keys: Sequence[bytes], chunk_ids: Any) -> None:
        """Copy primary rows ``chunk_ids`` to the store under ``keys``, on the pool. Returns at once.

        First writer wins: a page another engine stored first is kept. The job
        succeeds when every page is in the store afterwards.
        """
        keys, rows = self._check_job(keys, chunk_ids)
        self._spawn(self._store, job_id, keys, rows)

    def submit_load(self, job_id: int, keys: Sequence[bytes], chunk_ids: Any) -> None:
        """Copy the store's verified pages of ``keys`` into primary rows ``chunk_ids``, on the pool. Returns at once."""
        keys, rows = self._check_job(keys, chunk_ids)
        self._spawn(self._load, job_id, keys, rows)

    def _spawn(self, fn: Callable[..., None], *args: Any) -> None:
        """Hand ``fn(*args)`` to the pool. Called on the scheduler thread only; takes no lock."""
        if self._closed:
            raise ArgumentValueError("the tier is shut down")
        self._submitted = next(self._tickets)
        self._jobs.put((fn, args))

    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except Exception:  # the job has reported itself failed (its finally); keep the thread serving
                _log.exception("radixkv tier job %s failed", getattr(fn, "__name__", fn))
            finally:
                with self._lock:
                    self._completed += 1
                    self._idle.notify_all()

    def _store(self, job_id: int, keys: List[bytes], rows: List[int]) -> None:
        start = time.perf_counter()
        ok = False
        try:
            skeys = [self.store_key(k) for k in keys]
            new = self.store.put(skeys, [self.primary[r] for r in rows])
            # Pages that were not new were there already (another engine's) or failed: ask which.
            present = len(keys) if new == len(keys) else self.store.lookup(skeys)
            ok = present == len(keys)
        finally:
            present_keys = tuple(keys) if ok else ()
            result = FinishedJob(job_id, False, ok, None, len(keys) * self.row_bytes if ok else 0,
                                 time.perf_counter() - start, present_keys)
            with self._lock:
                self._counts["stores"] += 1
                if ok:
                    self._counts["stored_pages"] += len(keys)
                    self._counts["written_bytes"] += result.num_bytes
                    self._remember(keys, HIT)
                else:
                    self._counts["store_failed_pages"] += len(keys)
                self._finished.append(result)

    def _load(self, job_id: int, keys: List[bytes], rows: List[int]) -> None:
        start = time.perf_counter()
        n = 0
        try:
            pages, served = self.store.get([self.store_key(k) for k in keys])
            for page in pages[:served]:
                if page.nbytes != self.row_bytes:  # a verified page of another row size: refuse it
                    break
                self.primary[rows[n]] = np.frombuffer(page, dtype=np.uint8)
                n += 1
        finally:
            ok = n == len(keys)
            loaded = tuple(keys[:n])
            gone = tuple(keys[n:n + 1])
            result = FinishedJob(job_id, True, ok, None if ok or not n else loaded, n * self.row_bytes,
                                 time.perf_counter() - start, gone)
            with self._lock:
                self._counts["loads"] += 1
                self._counts["loaded_pages"] += n
                self._counts["load_failed_pages"] += len(keys) - n
                self._counts["read_bytes"] += result.num_bytes
                self._remember(loaded, HIT)
                self._remember(gone, MISS)
                for key in keys[n + 1:]:
                    self._answers.pop(key, None)
                self._finished.append(result)

    def finished_jobs(self) -> List[FinishedJob]:
        """Every job finished since the last call, in finishing order. O(jobs)."""
        out: List[FinishedJob] = []
        with self._lock:
            while self._finished:
                out.append(self._finished.popleft())
        return out

    @property
    def busy(self) -> bool:
        """Lookups queued or jobs in flight."""
        with self._lock:
            return bool(self._completed < self._submitted or self._queued)

    def drain(self, timeout: Optional[float] = None) -> bool:
        """Wait until no job is in flight (their results stay queued for :meth:`finished_jobs`); False on timeout."""
        with self._lock:
            submitted = self._submitted
            return self._idle.wait_for(lambda: self._completed >= submitted, timeout)

    # ------------------------------------------------------------------ stats
    def stats(self) -> Dict[str, Any]:
        """The tier's counters (monotonic) plus the store's :meth:`~radixkv.store.PageStore.stats` under ``store``.

        ``lookups``: calls; ``hits`` / ``misses``: answered from a fresh answer;
        ``retries``: answered RETRY; ``lookup_batches``: existence checks sent.
        ``loads`` / ``stores``: jobs; ``loaded_pages`` / ``load_failed_pages``,
        ``stored_pages`` / ``store_failed_pages``: their pages;
        ``read_bytes`` / ``written_bytes``: row bytes moved; ``evicted_answers``:
        answers dropped at ``max_answers``.
        """
        with self._lock:
            out: Dict[str, Any] = dict(self._counts)
        out["store"] = self.store.stats()
        return out

    def close(self) -> None:
        """Let queued jobs finish, stop the pool and close the store's connections. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for _ in self._threads:
            self._jobs.put(None)  # after every job already queued
        for thread in self._threads:
            thread.join()
        self.store.close()
        # Release the rows: they export the primary tier's buffer, which vLLM unmaps after its tiers shut down.
        self.primary = np.empty((0, self.row_bytes), dtype=np.uint8)


__all__ = ["FinishedJob", "HIT", "KEY_SCHEME", "MISS", "RETRY", "STAT_NAMES", "StoreTierCore"]

"""Transfer worker threads for a single-owner cache.

Threading model. A :class:`~radixkv.PrefixCache` (and everything built on it)
has one owner: the scheduler thread that created it, as in SGLang's and
vLLM's schedulers. It is not locked and must not be called from two threads.
What may run elsewhere is the slow part of a tier transfer, the byte copy.
:class:`TransferWorker` runs copies on worker threads and hands their
results back to the owner, which applies them to the cache:

* workers move bytes, the owner moves ownership. A copy callable touches
  only buffers handed to it (a staging array, a host or remote store); the
  cache is changed only in the ``on_done`` callback, which runs on the owner
  thread inside :meth:`TransferWorker.poll`;
* a page is never served while in flight: a load fills blocks the owner
  ``allocate``\\ d (held, so neither matchable nor evictable) and inserts them
  only in ``on_done``, after their payload is complete; a store reads pages
  the owner ``lock``\\ ed and unlocks them in ``on_done``, so they cannot be
  evicted and reused under the copy.

>>> import numpy as np
>>> from radixkv import PrefixCache
>>> cache = PrefixCache(num_blocks=8, page_size=2, kv_shape=(1,), dtype="float32")
>>> blocks = cache.allocate(1)                                  # held: invisible until inserted
>>> def fetch():                                                 # worker: fill a staging buffer
...     return np.full((1, 2, 1), 7, dtype=np.float32)
>>> def done(staged):                                            # owner: write, then insert
...     cache.write(blocks, staged)
...     cache.insert([4, 5], blocks)
>>> with TransferWorker(num_threads=2) as worker:
...     _ = worker.submit(fetch, done)
...     _ = worker.drain()
>>> cache.match([4, 5]).num_tokens
2
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from ..errors import ArgumentTypeError
from ..keys import check_positive_int


class Transfer:
    """A submitted copy. ``done`` turns true on the owner thread, when its callback has run.

    Attributes:
        id: submission number (0, 1, ...).
        done: whether :meth:`TransferWorker.poll` has applied it.
        result: what the copy returned (after ``done``).
        error: the exception the copy raised, or ``None``.
    """

    __slots__ = ("id", "done", "result", "error", "_on_done", "_on_error")

    def __init__(self, id: int, on_done: Optional[Callable[[Any], None]],
                 on_error: Optional[Callable[[BaseException], None]]) -> None:
        self.id = id
        self.done = False
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self._on_done = on_done
        self._on_error = on_error

    def settle(self) -> None:
        """Mark it done and run its callback (``on_error`` for a failed copy, re-raising the error
        when there is none; else ``on_done``). Called on the owner thread by :meth:`TransferWorker.poll`."""
        self.done = True
        if self.error is not None:
            if self._on_error is None:
                raise self.error
            self._on_error(self.error)
        elif self._on_done is not None:
            self._on_done(self.result)

    def __repr__(self) -> str:
        state = "failed" if self.error is not None else "done" if self.done else "in flight"
        return f"Transfer({self.id}, {state})"


class TransferWorker:
    """A pool of copy threads whose completions are applied on the owner thread.

    The owner is the thread that creates the worker; :meth:`submit`,
    :meth:`poll` and :meth:`drain` raise ``RuntimeError`` from any other
    thread. Completions are applied in the order the copies finished.

    Args:
        num_threads: copy threads (transfers in flight at once).
    """

    def __init__(self, num_threads: int = 2) -> None:
        num_threads = check_positive_int(num_threads, "num_threads")
        self._owner = threading.get_ident()
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="radixkv-transfer")
        self._finished: "queue.SimpleQueue[Transfer]" = queue.SimpleQueue()
        self._in_flight = 0
        self.submitted = 0
        """Transfers submitted (monotonic)."""
        self.applied = 0
        """Transfers whose completion was applied on the owner thread (monotonic)."""
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Transfers submitted and not yet applied. O(1)."""
        return self._in_flight

    def _require_owner(self, action: str) -> None:
        if threading.get_ident() != self._owner:
            raise RuntimeError(f"TransferWorker.{action} must be called from the owner thread "
                               "(the one that created it): the cache is single-owner")

    def submit(self, copy: Callable[[], Any], on_done: Optional[Callable[[Any], None]] = None,
               on_error: Optional[Callable[[BaseException], None]] = None) -> Transfer:
        """Run ``copy()`` on a worker thread; later, on the owner thread, ``on_done(result)``.

        If ``copy`` raises, ``on_error(exc)`` runs instead; without ``on_error``
        the exception is re-raised from :meth:`poll`. ``copy`` must not touch
        the cache. O(1).
        """
        self._require_owner("submit")
        if self._closed:
            raise RuntimeError("TransferWorker is closed")
        if not callable(copy):
            raise ArgumentTypeError(f"copy must be callable, got {copy!r}")
        transfer = Transfer(self.submitted, on_done, on_error)
        self.submitted += 1
        self._in_flight += 1
        finished = self._finished

        def run() -> None:
            try:
                transfer.result = copy()
            except BaseException as exc:  # noqa: BLE001 - handed to the owner
                transfer.error = exc
            finished.put(transfer)

        self._pool.submit(run)
        return transfer

    def poll(self, *, block: bool = False, timeout: Optional[float] = None) -> int:
        """Apply every finished transfer's callback on this (the owner) thread; return how many.

        With ``block``, wait up to ``timeout`` seconds for at least one. A
        copy's exception with no ``on_error`` is re-raised here, after the
        transfers finished before it were applied.
        """
        self._require_owner("poll")
        applied = 0
        while self._in_flight:
            try:
                transfer = self._finished.get(block=block and applied == 0, timeout=timeout)
            except queue.Empty:
                break
            self._in_flight -= 1
            self.applied += 1
            applied += 1
            transfer.settle()
        return applied

    def drain(self, timeout: Optional[float] = None) -> int:
        """Wait for every transfer in flight and apply them all; return how many were applied.

        Raises ``TimeoutError`` if one does not finish within ``timeout`` seconds.
        """
        total = 0
        while self._in_flight:
            n = self.poll(block=True, timeout=timeout)
            if n == 0:
                raise TimeoutError(f"{self._in_flight} transfers still in flight after {timeout} s")
            total += n
        return total

    def close(self) -> None:
        """Drain, then stop the threads. Idempotent."""
        if not self._closed:
            self.drain()
            self._closed = True
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "TransferWorker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TransferWorker(in_flight={self._in_flight}, applied={self.applied})"


__all__ = ["Transfer", "TransferWorker"]

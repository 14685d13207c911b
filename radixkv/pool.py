"""The paged block pool: a fixed set of KV blocks, who owns each, and payloads.

A block is in exactly one of three states:

* ``FREE``: on the free list, owned by nobody;
* ``HELD``: handed to a caller by :meth:`BlockPool.take` and not yet cached;
* ``CACHED``: owned by the prefix tree.

The pool never decides what to evict; the engine does and hands blocks back.

Blocks move in runs. The free list is a stack of runs of consecutive ids
(``first .. last``, ascending or descending), so handing out or taking back
``n`` blocks that form ``r`` runs costs O(r) Python operations plus O(n)
sequential C work (a slice fill of the state array, a slice copy), not a
fancy-indexed scatter of ``n`` ids into the state array (~5-10 ns each, a
cache miss apiece). At page size 1 a request moves ~10^4 ids in a handful of
runs. Small moves (under ``_MIN_RUN_IDS`` ids, page size 16's usual) and ids
that come back in many short runs are kept as one array segment and scattered
once, as a plain free list would, so the Python cost of a call is bounded by
its number of runs or one segment, whichever is cheaper.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from .errors import ArgumentValueError, InvalidBlocksError
from .keys import int_array

FREE, HELD, CACHED = 0, 1, 2
STATE_NAMES = {FREE: "free", HELD: "held", CACHED: "cached"}
BLOCK_DTYPE = np.dtype(np.int32)
_ID_BYTES = BLOCK_DTYPE.itemsize

# Below _MIN_RUN_IDS ids a fancy-indexed scatter (a few ns per id) costs less than looking for
# runs; above it, an array is moved as runs while it has at most one run per _IDS_PER_RUN ids
# (a run costs a few numpy calls, ~1 us), else as one array segment.
_MIN_RUN_IDS = 512
_SPLIT_MIN_IDS = 1024
_IDS_PER_RUN = 128

_EMPTY = np.empty(0, dtype=BLOCK_DTYPE)


class BlockPool:
    """``num_blocks`` blocks of ``page_size`` tokens, with an optional payload array.

    The free list is a stack (LIFO: recently freed blocks are reused first, and
    a fresh pool hands out 0, 1, 2, ...). Each entry is a run ``(first, last)``
    of consecutive ids pushed in that order, or an ``int32`` array for ids that
    came back fragmented; adjacent runs that continue each other are merged, so
    the stack stays short. ``_state`` holds one byte per block; it is changed
    by slice fills per run, and :meth:`check` recounts it against the stack.
    """

    __slots__ = ("num_blocks", "page_size", "data", "_id_bytes", "_ids", "_stack", "_num_free", "_state")

    def __init__(
        self,
        num_blocks: int,
        page_size: int,
        kv_shape: Optional[Sequence[int]] = None,
        dtype: object = "float16",
    ) -> None:
        self.num_blocks = num_blocks
        self.page_size = page_size
        # Every id once, as bytes and a read-only array view of them: handed-out arrays are
        # copies of slices, and a run test is one bytes comparison (no arange per call).
        self._id_bytes = np.arange(num_blocks, dtype=BLOCK_DTYPE).tobytes()
        self._ids = np.frombuffer(self._id_bytes, dtype=BLOCK_DTYPE)
        # One descending run with 0 on top, so the first blocks handed out are 0, 1, 2, ...
        self._stack: list = [(num_blocks - 1, 0)] if num_blocks else []
        self._num_free = num_blocks
        self._state = np.zeros(num_blocks, dtype=np.uint8)
        self.data: Optional[np.ndarray] = None
        if kv_shape is not None:
            self.data = np.zeros((num_blocks, page_size, *kv_shape), dtype=np.dtype(dtype))

    @property
    def num_free(self) -> int:
        """Blocks on the free list. O(1)."""
        return self._num_free

    @property
    def num_free_runs(self) -> int:
        """Entries on the free stack (runs, or fragmented segments). O(1)."""
        return len(self._stack)

    def take(self, n: int, state: int = HELD) -> np.ndarray:
        """Move ``n`` free blocks to ``state`` (``HELD``, or ``CACHED`` when the tree takes them at
        once) and return their ids, most recently freed first (a new ``int32`` array).

        The caller checked ``n <= num_free``; more raises :class:`ValueError`.
        Cost: O(stack entries consumed) Python, O(n) C.
        """
        if n > self._num_free:
            raise ArgumentValueError(f"take({n}) with only {self._num_free} blocks free")
        if n <= 0:
            return _EMPTY.copy()
        stack, ids, st = self._stack, self._ids, self._state
        parts = []
        left = n
        while left:
            entry = stack[-1]
            if entry.__class__ is tuple:
                first, last = entry
                if last >= first:  # ascending run: hand out last, last - 1, ...
                    k = min(left, last - first + 1)
                    lo = last - k + 1
                    st[lo : last + 1] = state
                    parts.append(ids[lo : last + 1][::-1])
                    if lo == first:
                        stack.pop()
                    else:
                        stack[-1] = (first, lo - 1)
                else:  # descending run: hand out last, last + 1, ...
                    k = min(left, first - last + 1)
                    hi = last + k
                    st[last:hi] = state
                    parts.append(ids[last:hi])
                    if hi > first:
                        stack.pop()
                    else:
                        stack[-1] = (first, hi)
            else:
                size = len(entry)
                k = min(left, size)
                part = entry[size - k :][::-1]
                st[part] = state
                parts.append(part)
                if k == size:
                    stack.pop()
                else:
                    stack[-1] = entry[: size - k]
            left -= k
        self._num_free -= n
        return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)

    def give_back(self, blocks: np.ndarray) -> None:
        """Return ``HELD`` or ``CACHED`` blocks (distinct, in range) to the free list.

        No checks: engine-internal (a caller's blocks are checked by
        :meth:`~radixkv.cache.PrefixCache.free`; :meth:`check` recounts).
        Cost: O(runs) Python and O(len(blocks)) sequential C when the blocks
        form long runs; one fancy-indexed scatter otherwise.
        """
        if len(blocks):
            runs = self._runs(blocks)
            if runs is None:
                self._push_array(blocks)
            else:
                self._push_runs(runs)
            self._num_free += len(blocks)

    def give_back_parts(self, parts: Sequence[np.ndarray]) -> None:
        """:meth:`give_back` of each array in ``parts``, in order (e.g. the tails of several evicted
        leaves). A part that is one run (or a few long ones) is pushed as runs; the other parts
        between two runs are joined and scattered once. O(parts + runs) Python, O(total ids) C."""
        pending = []
        for blocks in parts:
            n = len(blocks)
            if n == 0:
                continue
            self._num_free += n
            runs = self._runs(blocks) if n >= _MIN_RUN_IDS else None
            if runs is None:
                pending.append(blocks)
                continue
            if pending:
                self._push_pending(pending)
                pending = []
            self._push_runs(runs)
        if pending:
            self._push_pending(pending)

    def set_state(self, blocks: np.ndarray, state: int) -> None:
        """Mark ``blocks`` as ``HELD`` or ``CACHED`` (ownership moves between caller and tree).

        O(runs) Python, O(len(blocks)) C.
        """
        if len(blocks) == 0:
            return
        runs = self._runs(blocks)
        st = self._state
        if runs is None:
            st[blocks] = state
            return
        for first, last in runs:
            if first <= last:
                st[first : last + 1] = state
            else:
                st[last : first + 1] = state

    def states(self, blocks: np.ndarray) -> np.ndarray:
        """Ownership state of each block in ``blocks`` (a new array). O(len(blocks)) C; a slice copy for a run."""
        run = self._run(blocks) if len(blocks) >= _MIN_RUN_IDS else None
        if run is None:
            return self._state[blocks]
        first, last = run
        if first <= last:
            return self._state[first : last + 1].copy()
        return self._state[last : first + 1][::-1].copy()

    def count(self, state: int) -> int:
        """Number of blocks in ``state``. O(num_blocks)."""
        return int(np.count_nonzero(self._state == state))

    def validate_ids(self, blocks: object, name: str = "blocks") -> np.ndarray:
        """Return ``blocks`` as a 1-D int32 array of in-range, distinct ids, or raise.

        :class:`TypeError` when ``blocks`` is not a sequence or integer array
        (``None``, a scalar, ``str``, ``dict``, ``set``) or holds non-integers;
        :class:`~radixkv.errors.InvalidBlocksError` for a wrong shape, an id out
        of range or a duplicate. O(len(blocks)) for a run of consecutive ids,
        else O(len(blocks) log len(blocks)).
        """
        arr = int_array(blocks, name, InvalidBlocksError)
        if arr.ndim != 1:
            raise InvalidBlocksError(f"{name} must be 1-D, got shape {arr.shape}")
        if arr.size == 0:
            return np.empty(0, dtype=BLOCK_DTYPE)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.num_blocks:
            bad = lo if lo < 0 else hi
            raise InvalidBlocksError(f"{name} must be in [0, {self.num_blocks}), got {bad!r}")
        arr = arr.astype(BLOCK_DTYPE, copy=False)
        if hi - lo + 1 == len(arr) and self._run(arr) is not None:
            return arr  # consecutive ids are distinct
        if len(np.unique(arr)) != len(arr):
            raise InvalidBlocksError(f"{name} has duplicate block ids: {_duplicates(arr)!r}")
        return arr

    def check(self) -> None:
        """O(num_blocks) check of the free stack against block states; raises AssertionError.

        Every listed id is in range and listed once, the listed ids are exactly
        the blocks in state free, and their number is ``num_free``.
        """
        assert 0 <= self._num_free <= self.num_blocks, f"free count {self._num_free} out of range"
        listed = np.zeros(self.num_blocks, dtype=np.int32)
        total = 0
        for entry in self._stack:
            if entry.__class__ is tuple:
                first, last = entry
                lo, hi = min(first, last), max(first, last)
                assert 0 <= lo and hi < self.num_blocks, f"free run {entry} out of range"
                listed[lo : hi + 1] += 1
                total += hi - lo + 1
            else:
                assert entry.dtype == BLOCK_DTYPE and entry.ndim == 1 and len(entry), f"bad free segment {entry!r}"
                assert 0 <= int(entry.min()) and int(entry.max()) < self.num_blocks, "free segment out of range"
                np.add.at(listed, entry, 1)
                total += len(entry)
        assert total == self._num_free, f"free stack holds {total} blocks, free count is {self._num_free}"
        twice = np.flatnonzero(listed > 1)
        assert not len(twice), f"free list holds duplicates: {twice[:10].tolist()}"
        free = self._state == FREE
        assert np.array_equal(listed == 1, free), (
            "free list and block states disagree: listed but not free "
            f"{np.flatnonzero((listed == 1) & ~free)[:10].tolist()}, free but not listed "
            f"{np.flatnonzero(free & (listed == 0))[:10].tolist()}")

    # ------------------------------------------------------------------ runs
    def _push_array(self, blocks: np.ndarray, owned: bool = False) -> None:
        """Push fragmented ids as one stack entry (a copy, unless ``owned``); one fancy-indexed scatter."""
        arr = blocks if owned and blocks.dtype == BLOCK_DTYPE else np.array(blocks, dtype=BLOCK_DTYPE)
        self._state[arr] = FREE
        self._stack.append(arr)

    def _push_pending(self, parts: List[np.ndarray]) -> None:
        if len(parts) == 1:
            self._push_array(parts[0])
        else:
            self._push_array(np.concatenate(parts), owned=True)

    def _push_runs(self, runs: List[Tuple[int, int]]) -> None:
        """Push runs in order, each joining the top run when it continues it. O(len(runs)) Python."""
        st, stack = self._state, self._stack
        for first, last in runs:
            if first <= last:
                st[first : last + 1] = FREE
            else:
                st[last : first + 1] = FREE
            if stack:
                top = stack[-1]
                if top.__class__ is tuple:
                    step = first - top[1]
                    # merge when this run continues the top run in the same direction
                    if (step == 1 or step == -1) and (top[1] - top[0]) * step >= 0 and (last - first) * step >= 0:
                        stack[-1] = (top[0], last)
                        continue
            stack.append((first, last))

    def _run(self, blocks: np.ndarray) -> Optional[Tuple[int, int]]:
        """``(first, last)`` if ``blocks`` (in-range ids, 2 or more) is one run of consecutive ids
        in either direction, else ``None``. O(1) to reject most non-runs, O(n) C to confirm."""
        n = len(blocks)
        first, last = int(blocks[0]), int(blocks[-1])
        if last - first == n - 1:
            if n <= 2 or self._id_bytes.startswith(blocks.astype(BLOCK_DTYPE, copy=False).tobytes(), _ID_BYTES * first):
                return first, last
        elif first - last == n - 1:
            if n <= 2 or self._id_bytes.startswith(blocks[::-1].astype(BLOCK_DTYPE, copy=False).tobytes(), _ID_BYTES * last):
                return first, last
        return None

    def _runs(self, blocks: np.ndarray) -> Optional[List[Tuple[int, int]]]:
        """``blocks`` (in-range, distinct, non-empty) cut into maximal runs ``(first, last)`` in order,
        or ``None`` when a fancy-indexed scatter is cheaper: fewer than ``_MIN_RUN_IDS`` ids that
        are not one run, or more than one run per ``_IDS_PER_RUN`` ids."""
        n = len(blocks)
        if n < _MIN_RUN_IDS:
            return None
        run = self._run(blocks)
        if run is not None:
            return [run]
        if n < _SPLIT_MIN_IDS:
            return None
        step = blocks[1:] - blocks[:-1]
        np.abs(step, out=step)
        cuts = (step != 1).nonzero()[0]  # run i ends at position cuts[i] (nonzero of bools is fast)
        if len(cuts) * _IDS_PER_RUN >= n:
            return None
        ends = cuts.tolist()
        ends.append(n - 1)
        firsts = [int(blocks[0])] + blocks[cuts + 1].tolist()
        lasts = blocks[cuts].tolist()
        lasts.append(int(blocks[-1]))
        runs = []
        start = 0
        for first, last, end in zip(firsts, lasts, ends):
            if abs(last - first) != end - start:
                return None  # steps of +-1 that turn back: a repeated id, not a run
            runs.append((first, last))
            start = end + 1
        return runs


def _duplicates(arr: np.ndarray) -> list:
    values, counts = np.unique(arr, return_counts=True)
    return values[counts > 1].tolist()[:10]

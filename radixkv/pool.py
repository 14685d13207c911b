"""The paged block pool: a fixed set of KV blocks, who owns each, and payloads.

A block is in exactly one of three states:

* ``FREE``: on the free list, owned by nobody;
* ``HELD``: handed to a caller by :meth:`BlockPool.take` and not yet cached, or
  freed by the cache to its caller's allocator (``PrefixCache.on_free``);
* ``CACHED``: owned by the prefix tree.

The pool never decides what to evict; the engine does and hands blocks back.

Blocks move in runs. The free list is a stack of runs of consecutive ids
(``first .. last``, ascending or descending), so handing out or taking back
``n`` blocks that form ``r`` runs costs O(r) Python operations plus O(n)
sequential C work (a slice fill of the state array, an ``arange``), not a
fancy-indexed scatter of ``n`` ids into the state array (~5-10 ns each, a
cache miss apiece). At page size 1 a request moves ~10^4 ids in a handful of
runs. The engine moves blocks as extents (:mod:`radixkv.extents`): runs
come out of :meth:`BlockPool.take_parts` as ``(first, last)`` pairs and go
back through :meth:`BlockPool.give_back_parts` as such, so no id array is made
and no run is searched for; an admission that evicts takes the freed runs
straight back (:meth:`BlockPool.take_after`: the ids the free stack would hand
out, without the stack). Id arrays (a caller's :meth:`give_back`, small
moves under ``_MIN_RUN_IDS`` ids, ids that come back in many short runs) are
kept as one array segment and scattered once, as a plain free list would, so
the Python cost of a call is bounded by its number of runs or one segment,
whichever is cheaper.

The pool grows lazily: ids never handed out (``[_fresh, num_blocks)``, above
the high-water mark) are one implicit run below the stack and cost no memory,
and the per-block state bytes grow with the high-water mark (doubling). The
table of ids that recognises a caller's array as a run grows only when such a
test reaches past it: blocks moved as extents never build it. A pool far
larger than a workload needs costs what the workload touches, not 5 bytes per
block up front, and the first fill of a large pool costs no id table
(at page size 1, 3M blocks, building it took a fifth of a 2000-request replay).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from . import extents
from .errors import ArgumentValueError, InvalidBlocksError
from .keys import uint32_array

FREE, HELD, CACHED = 0, 1, 2
STATE_NAMES = {FREE: "free", HELD: "held", CACHED: "cached"}
BLOCK_DTYPE = np.dtype(np.int32)
MAX_BLOCKS = int(np.iinfo(BLOCK_DTYPE).max)
"""The largest pool: block ids are int32."""
_ID_BYTES = BLOCK_DTYPE.itemsize

# Below _MIN_RUN_IDS ids a fancy-indexed scatter (a few ns per id) costs less than looking for
# runs; above it, an array is moved as runs while it has at most one run per _IDS_PER_RUN ids
# (a run costs a few numpy calls, ~1 us), else as one array segment. At page size 16 a request's
# pages (~700 blocks on the Mooncake traces) stay below it, so page 16 pays no run detection.
_MIN_RUN_IDS = 2048
_SPLIT_MIN_IDS = 2048
_IDS_PER_RUN = 128
_FIRST_TABLE = 1024  # state bytes a new pool starts with (at most num_blocks), the id table's least size
_MAX_PARTS = 16  # a take spanning more stack entries than this, short ones, comes back as one array


class BlockPool:
    """``num_blocks`` blocks of ``page_size`` tokens, with an optional payload array.

    The free list is a stack (LIFO: recently freed blocks are reused first).
    Each entry is a run ``(first, last)`` of consecutive ids pushed in that
    order, or an ``int32`` array for ids that came back fragmented; adjacent
    runs that continue each other are merged, so the stack stays short. Below
    the stack lie the ids never handed out, ``_fresh, _fresh + 1, ...``, which
    come out in that order once the stack is empty.

    ``_state`` holds one byte per block below its length (the high-water mark
    rounded up by doubling; ids above it are free); it is changed by slice
    fills per run, and :meth:`check` recounts it against the stack. Without
    ``kv_shape`` no array is ever ``num_blocks`` long.
    """

    __slots__ = ("num_blocks", "page_size", "data", "_id_bytes", "_stack", "_num_free", "_state", "_fresh")

    def __init__(
        self,
        num_blocks: int,
        page_size: int,
        kv_shape: Optional[Sequence[int]] = None,
        dtype: object = "float16",
    ) -> None:
        if num_blocks > MAX_BLOCKS:
            raise ArgumentValueError(f"num_blocks must be at most {MAX_BLOCKS:,} (int32 block ids), got {num_blocks:,}")
        self.num_blocks = num_blocks
        self.page_size = page_size
        self._stack: list = []  # returned blocks: runs (first, last) and int32 segments, top last
        self._num_free = num_blocks  # stack + fresh
        self._fresh = 0  # ids >= _fresh were never handed out; they come out in order 0, 1, 2, ...
        self._state = np.zeros(min(num_blocks, _FIRST_TABLE), dtype=np.uint8)
        # Ids 0, 1, 2, ... as bytes: a run test is one bytes comparison (no arange per call). It
        # grows (doubling) only when a run test reaches past it: moves by extents never test runs.
        self._id_bytes = b""
        self.data: Optional[np.ndarray] = None
        if kv_shape is not None:
            self.data = np.zeros((num_blocks, page_size, *kv_shape), dtype=np.dtype(dtype))

    @property
    def num_free(self) -> int:
        """Blocks on the free list. O(1)."""
        return self._num_free

    @property
    def num_free_runs(self) -> int:
        """Entries on the free stack (runs, or fragmented segments), fresh ids not counted. O(1)."""
        return len(self._stack)

    @property
    def high_water(self) -> int:
        """Blocks ever handed out: ids at or above this one never were and cost no memory. O(1)."""
        return self._fresh

    def take(self, n: int, state: int = HELD) -> np.ndarray:
        """Move ``n`` free blocks to ``state`` (``HELD``, or ``CACHED`` when the tree takes them at
        once) and return their ids, most recently freed first, then fresh ones in ascending
        order (a new ``int32`` array).

        The caller checked ``n <= num_free``; more raises :class:`ValueError`.
        Cost: O(stack entries consumed) Python, O(n) C.
        """
        parts = self.take_parts(n, state)
        if len(parts) == 1 and parts[0].__class__ is not tuple:
            return parts[0]  # a fresh array already
        return extents.to_array(parts)

    def take_parts(self, n: int, state: int = HELD) -> extents.Parts:
        """:meth:`take` as extents (:mod:`radixkv.extents`): the same ids in the same order, runs
        left as ``(first, last)`` pairs, so a run costs a slice fill of the state bytes and no id array.

        Array parts are new arrays (never views of the free list). More than ``_MAX_PARTS``
        parts come back as one array. Cost: O(stack entries consumed) Python; O(n) C for the
        state bytes, plus O(ids) for ids that came back fragmented.
        """
        if n > self._num_free:
            raise ArgumentValueError(f"take({n}) with only {self._num_free} blocks free")
        if n <= 0:
            return extents.NONE
        stack, st = self._stack, self._state
        parts = []
        left = n
        while left:
            if not stack:  # the stack is empty: the rest are fresh ids
                lo = self._fresh
                hi = lo + left
                if hi > len(st):
                    self._grow(hi)
                    st = self._state
                st[lo:hi] = state
                parts.append((lo, hi - 1))
                self._fresh = hi
                break
            entry = stack[-1]
            if entry.__class__ is tuple:
                first, last = entry
                if last >= first:  # ascending run: hand out last, last - 1, ...
                    k = min(left, last - first + 1)
                    lo = last - k + 1
                    st[lo : last + 1] = state
                    parts.append((last, lo))
                    if lo == first:
                        stack.pop()
                    else:
                        stack[-1] = (first, lo - 1)
                else:  # descending run: hand out last, last + 1, ...
                    k = min(left, first - last + 1)
                    hi = last + k
                    st[last:hi] = state
                    parts.append((last, hi - 1))
                    if hi > first:
                        stack.pop()
                    else:
                        stack[-1] = (first, hi)
            else:
                size = len(entry)
                k = min(left, size)
                part = entry[size - k :][::-1].copy()  # not a view: it would keep the whole entry alive
                st[part] = state
                parts.append(part)
                if k == size:
                    stack.pop()
                else:
                    stack[-1] = entry[: size - k]
            left -= k
        self._num_free -= n
        if len(parts) > _MAX_PARTS and len(parts) * _IDS_PER_RUN > n:  # short runs: one array is leaner
            return (extents.to_array(parts),)
        return tuple(parts)

    def take_after(self, returned: Sequence[extents.Part], n: int, state: int = CACHED) -> extents.Parts:
        """:meth:`give_back_parts` of ``returned`` then :meth:`take_parts` of ``n``, without the
        round trip: the same ids in the same order (parts may be cut differently where a
        returned run meets the free list's top), and the same free list afterwards.

        ``returned`` are ``CACHED`` blocks the tree just let go (an eviction's tails) and ``n`` at
        least their number: they are all taken back, the last returned first, each run turned
        round (the free stack is LIFO), so they need no stack entry and, for ``state`` ``CACHED``,
        no state change; the rest come from the free list. At page size 1 an admission that
        evicts moves a few runs this way for a few stack operations each. With nothing returned
        it is :meth:`take_parts`; it falls back to the two calls when ``returned`` holds an id
        array or ``n`` is smaller, and acts like them when ``n`` is more than there are:
        ``returned`` go onto the free list, then it raises. O(parts) Python.
        """
        if not returned:
            return self.take_parts(n, state)
        total = 0
        for part in returned:
            if part.__class__ is not tuple:
                total = -1
                break
            first, last = part
            total += last - first + 1 if last >= first else first - last + 1
        if total < 0 or n < total or n - total > self._num_free:  # (the last raises, as take_parts would)
            self.give_back_parts(returned)
            return self.take_parts(n, state)
        parts: List[extents.Part] = []
        st = self._state
        for first, last in reversed(returned):
            if state != CACHED:
                st[min(first, last) : max(first, last) + 1] = state
            if parts:  # joined, as _push_runs joins a run that continues the top one
                top_first, top_last = parts[-1]
                step = last - top_last
                if (step == 1 or step == -1) and (top_last - top_first) * step >= 0 and (first - last) * step >= 0:
                    parts[-1] = (top_first, first)
                    continue
            parts.append((last, first))
        if n > total:
            parts.extend(self.take_parts(n - total, state))
        if len(parts) > _MAX_PARTS and len(parts) * _IDS_PER_RUN > n:  # as take_parts: short runs as one array
            return (extents.to_array(tuple(parts)),)
        return tuple(parts)

    def give_back(self, blocks: np.ndarray) -> None:
        """Return ``HELD`` or ``CACHED`` blocks (distinct, handed out) to the free list.

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

    def give_back_parts(self, parts: Sequence[extents.Part]) -> None:
        """:meth:`give_back` of each part in ``parts`` (id arrays or extents), in order (e.g. the
        tails of several evicted leaves). A run part is pushed as a run (joining the top run when
        it continues it) without looking at its ids, however short: it came from one node, whose
        eviction already cost more Python than a stack entry does. An array that is one run (or a
        few long ones) is pushed as runs too; the other arrays between two runs are joined and
        scattered once. O(parts + runs) Python, O(ids of arrays) C plus a slice fill of the state
        bytes per run."""
        pending: List[np.ndarray] = []  # arrays to scatter together
        runs: List[Tuple[int, int]] = []  # runs to push together (one of the two lists is empty)
        freed = 0
        for blocks in parts:
            if blocks.__class__ is tuple:
                if pending:
                    self._push_pending(pending)
                    pending = []
                runs.append(blocks)
                continue
            n = len(blocks)
            if n == 0:
                continue
            cut = self._runs(blocks) if n >= _MIN_RUN_IDS else None
            if cut is None:
                if runs:
                    freed += self._push_runs(runs)
                    runs = []
                freed += n
                pending.append(blocks)
                continue
            if pending:
                self._push_pending(pending)
                pending = []
            runs.extend(cut)
        if pending:
            self._push_pending(pending)
        if runs:
            freed += self._push_runs(runs)
        self._num_free += freed

    def set_state(self, blocks: np.ndarray, state: int) -> None:
        """Mark ``blocks`` (handed out) as ``HELD`` or ``CACHED`` (ownership moves between caller
        and tree). O(runs) Python, O(len(blocks)) C.
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
        """Ownership state of each block in ``blocks`` (valid ids; never handed out: ``FREE``), a
        new array. O(len(blocks)) C; a slice copy for a run."""
        st = self._state
        run = self._run(blocks) if len(blocks) >= _MIN_RUN_IDS else None
        if run is not None:  # (a run reaches no further than the id table, which the state bytes cover)
            first, last = run
            if first <= last:
                return st[first : last + 1].copy()
            return st[last : first + 1][::-1].copy()
        if len(blocks) and int(np.max(blocks)) >= len(st):
            return np.where(blocks < len(st), st[np.minimum(blocks, len(st) - 1)], FREE).astype(np.uint8)
        return st[blocks]

    def count(self, state: int) -> int:
        """Number of blocks in ``state``. O(blocks ever handed out)."""
        touched = int(np.count_nonzero(self._state[: self._fresh] == state))
        return touched + (self.num_blocks - self._fresh if state == FREE else 0)

    def validate_ids(self, blocks: object, name: str = "blocks") -> np.ndarray:
        """Return ``blocks`` as a 1-D int32 array of in-range, distinct ids, or raise.

        :class:`TypeError` when ``blocks`` is not a sequence or integer array
        (``None``, a scalar, ``str``, ``dict``, ``set``) or holds non-integers
        (``bool``, ``float``); :class:`~radixkv.errors.InvalidBlocksError` for a
        wrong shape, an id out of range or a duplicate. Tokens follow the same
        rule (:func:`~radixkv.keys.uint32_array`). O(len(blocks)) for a run of
        consecutive ids (below the high-water mark), else
        O(len(blocks) log len(blocks)).
        """
        arr = uint32_array(blocks, name, InvalidBlocksError, self.num_blocks).astype(BLOCK_DTYPE)
        if len(arr) > 2 and self._run(arr) is not None:
            return arr  # consecutive ids are distinct
        if len(np.unique(arr)) != len(arr):
            raise InvalidBlocksError(f"{name} has duplicate block ids: {_duplicates(arr)!r}")
        return arr

    def check(self) -> None:
        """O(blocks ever handed out) check of the free stack against block states; raises AssertionError.

        Every listed id was handed out and is listed once, the listed ids are
        exactly the handed-out blocks in state free, no id above the
        high-water mark has a state, and the listed ids plus the fresh ones
        number ``num_free``.
        """
        fresh = self._fresh
        assert 0 <= fresh <= min(self.num_blocks, len(self._state)), f"fresh mark {fresh} out of range"
        assert self._id_bytes == np.arange(len(self._id_bytes) // _ID_BYTES, dtype=BLOCK_DTYPE).tobytes(), (
            "the id table is not the ids in order")
        assert 0 <= self._num_free <= self.num_blocks, f"free count {self._num_free} out of range"
        assert not np.any(self._state[fresh:]), "a block never handed out has a state"
        listed = np.zeros(fresh, dtype=np.int32)
        total = 0
        for entry in self._stack:
            if entry.__class__ is tuple:
                first, last = entry
                lo, hi = min(first, last), max(first, last)
                assert 0 <= lo and hi < fresh, f"free run {entry} holds a block never handed out (mark {fresh})"
                listed[lo : hi + 1] += 1
                total += hi - lo + 1
            else:
                assert entry.dtype == BLOCK_DTYPE and entry.ndim == 1 and len(entry), f"bad free segment {entry!r}"
                assert 0 <= int(entry.min()) and int(entry.max()) < fresh, (
                    f"free segment holds a block never handed out (mark {fresh})")
                np.add.at(listed, entry, 1)
                total += len(entry)
        assert total + self.num_blocks - fresh == self._num_free, (
            f"free stack holds {total} blocks and {self.num_blocks - fresh} fresh, free count is {self._num_free}")
        twice = np.flatnonzero(listed > 1)
        assert not len(twice), f"free list holds duplicates: {twice[:10].tolist()}"
        free = self._state[:fresh] == FREE
        assert np.array_equal(listed == 1, free), (
            "free list and block states disagree: listed but not free "
            f"{np.flatnonzero((listed == 1) & ~free)[:10].tolist()}, free but not listed "
            f"{np.flatnonzero(free & (listed == 0))[:10].tolist()}")

    def _grow(self, needed: int) -> None:
        """Lengthen the state bytes to at least ``needed`` (doubling, at most ``num_blocks``):
        amortized O(1) per block handed out."""
        size = min(max(needed, 2 * len(self._state)), self.num_blocks)
        state = np.zeros(size, dtype=np.uint8)
        state[: len(self._state)] = self._state
        self._state = state

    def _id_table(self, end: int) -> bytes:
        """The ids ``0 .. end - 1`` as int32 bytes, or fewer: the table grows by doubling, at most
        to the state bytes' length (ids above the high-water mark are then never a run, and a
        refused call naming ids near ``num_blocks`` costs no table of them). Amortized O(1)
        per id handed out."""
        table = self._id_bytes
        if len(table) < _ID_BYTES * end and len(table) < _ID_BYTES * len(self._state):
            size = min(max(end, 2 * len(table) // _ID_BYTES, _FIRST_TABLE), len(self._state))
            table = self._id_bytes = np.arange(size, dtype=BLOCK_DTYPE).tobytes()
        return table

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

    def _push_runs(self, runs: List[Tuple[int, int]]) -> int:
        """Push runs in order, each joining the top run when it continues it; return their ids.
        O(len(runs)) Python."""
        st, stack = self._state, self._stack
        ids = 0
        for first, last in runs:
            if first <= last:
                st[first : last + 1] = FREE
                ids += last - first + 1
            else:
                st[last : first + 1] = FREE
                ids += first - last + 1
            if stack:
                top = stack[-1]
                if top.__class__ is tuple:
                    step = first - top[1]
                    # merge when this run continues the top run in the same direction
                    if (step == 1 or step == -1) and (top[1] - top[0]) * step >= 0 and (last - first) * step >= 0:
                        stack[-1] = (top[0], last)
                        continue
            stack.append((first, last))
        return ids

    def _run(self, blocks: np.ndarray) -> Optional[Tuple[int, int]]:
        """``(first, last)`` if ``blocks`` (in-range ids, 2 or more) is one run of consecutive ids
        in either direction, else ``None``. O(1) to reject most non-runs, O(n) C to confirm."""
        n = len(blocks)
        first, last = int(blocks[0]), int(blocks[-1])
        if last - first == n - 1:
            # a contiguous int32 array is compared in place (bytes.startswith takes its buffer)
            if n <= 2 or self._id_table(last + 1).startswith(
                    np.ascontiguousarray(blocks, BLOCK_DTYPE), _ID_BYTES * first):
                return first, last
        elif first - last == n - 1:
            if n <= 2 or self._id_table(first + 1).startswith(
                    np.ascontiguousarray(blocks[::-1], BLOCK_DTYPE), _ID_BYTES * last):
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

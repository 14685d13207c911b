"""The paged block pool: a fixed set of KV blocks, who owns each, and payloads.

A block is in exactly one of three states:

* ``FREE``: on the free list, owned by nobody;
* ``HELD``: handed to a caller by :meth:`BlockPool.take` and not yet cached;
* ``CACHED``: owned by the prefix tree.

The pool never decides what to evict; the engine does and hands blocks back.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .errors import InvalidBlocksError
from .keys import uint32_array

FREE, HELD, CACHED = 0, 1, 2
STATE_NAMES = {FREE: "free", HELD: "held", CACHED: "cached"}
BLOCK_DTYPE = np.dtype(np.int32)


class BlockPool:
    """``num_blocks`` blocks of ``page_size`` tokens, with an optional payload array.

    The free list is a numpy stack rather than a deque: taking or returning
    ``n`` blocks is one slice assignment (O(1) Python operations, O(n) in C),
    where a deque would pop ``n`` times in Python. It is LIFO, so recently
    freed blocks are reused first.
    """

    __slots__ = ("num_blocks", "page_size", "data", "_free", "_num_free", "_state")

    def __init__(
        self,
        num_blocks: int,
        page_size: int,
        kv_shape: Optional[Sequence[int]] = None,
        dtype: object = "float16",
    ) -> None:
        self.num_blocks = num_blocks
        self.page_size = page_size
        # Reversed so the first blocks handed out are 0, 1, 2, ...
        self._free = np.arange(num_blocks - 1, -1, -1, dtype=BLOCK_DTYPE)
        self._num_free = num_blocks
        self._state = np.zeros(num_blocks, dtype=np.uint8)
        self.data: Optional[np.ndarray] = None
        if kv_shape is not None:
            self.data = np.zeros((num_blocks, page_size, *kv_shape), dtype=np.dtype(dtype))

    @property
    def num_free(self) -> int:
        """Blocks on the free list. O(1)."""
        return self._num_free

    def take(self, n: int, state: int = HELD) -> np.ndarray:
        """Move ``n`` free blocks to ``state`` (``HELD``, or ``CACHED`` when the tree takes them at
        once) and return their ids; the caller checked ``n <= num_free``."""
        top = self._num_free
        blocks = self._free[top - n : top][::-1].copy()
        self._num_free = top - n
        self._state[blocks] = state
        return blocks

    def give_back(self, blocks: np.ndarray) -> None:
        """Return ``HELD`` or ``CACHED`` blocks to the free list (no checks: engine-internal)."""
        n = len(blocks)
        if n == 0:
            return
        top = self._num_free
        self._free[top : top + n] = blocks
        self._num_free = top + n
        self._state[blocks] = FREE

    def set_state(self, blocks: np.ndarray, state: int) -> None:
        """Mark ``blocks`` as ``HELD`` or ``CACHED`` (ownership moves between caller and tree)."""
        self._state[blocks] = state

    def states(self, blocks: np.ndarray) -> np.ndarray:
        """Ownership state of each block in ``blocks``."""
        return self._state[blocks]

    def count(self, state: int) -> int:
        """Number of blocks in ``state``. O(num_blocks)."""
        return int(np.count_nonzero(self._state == state))

    def validate_ids(self, blocks: object, name: str = "blocks") -> np.ndarray:
        """Return ``blocks`` as a 1-D int32 array of in-range, distinct ids, or raise.

        :class:`TypeError` when ``blocks`` is not a sequence or integer array
        (``None``, a scalar, ``str``, ``dict``, ``set``) or holds non-integers
        (``bool``, ``float``); :class:`~radixkv.errors.InvalidBlocksError` for a
        wrong shape, an id out of range or a duplicate. Tokens follow the same
        rule (:func:`~radixkv.keys.uint32_array`). O(len(blocks) log len(blocks)).
        """
        arr = uint32_array(blocks, name, InvalidBlocksError, self.num_blocks).astype(BLOCK_DTYPE)
        if len(np.unique(arr)) != len(arr):
            raise InvalidBlocksError(f"{name} has duplicate block ids: {_duplicates(arr)!r}")
        return arr

    def check(self) -> None:
        """O(num_blocks) check of the free list against block states; raises AssertionError."""
        free = self._free[: self._num_free]
        assert 0 <= self._num_free <= self.num_blocks, f"free count {self._num_free} out of range"
        assert len(np.unique(free)) == len(free), f"free list holds duplicates: {_duplicates(free)}"
        assert np.all(self._state[free] == FREE), "a block on the free list is not in state free"
        assert self.count(FREE) == self._num_free, (
            f"{self.count(FREE)} blocks in state free but {self._num_free} on the free list"
        )


def _duplicates(arr: np.ndarray) -> list:
    values, counts = np.unique(arr, return_counts=True)
    return values[counts > 1].tolist()[:10]

"""Host DRAM tier: a block pool of its own, with its own numpy payload array."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from .. import policies as _policies
from ..pool import BlockPool
from .base import SLOT_DTYPE, Tier, check_capacity


class HostTier(Tier):
    """``num_blocks`` pages of pinned host memory (SGLang HiCache's host pool, LMCache's local CPU backend).

    Slots are block ids of a private :class:`~radixkv.pool.BlockPool`; with a
    payload the pool's array holds the bytes, so a demotion is one numpy copy.

    >>> tier = HostTier(num_blocks=1024)
    >>> tier.capacity
    1024
    """

    def __init__(self, num_blocks: int, policy: Union[str, "_policies.EvictionPolicy"] = "lru",
                 name: str = "host") -> None:
        super().__init__(name, policy)
        self.num_blocks = check_capacity(num_blocks, "host num_blocks")
        self._pool = BlockPool(self.num_blocks, 1)

    def attach(self, page_size: int, kv_shape: Optional[Sequence[int]], dtype: Any) -> None:
        super().attach(page_size, kv_shape, dtype)
        self._pool = BlockPool(self.num_blocks, page_size, kv_shape, dtype)

    @property
    def capacity(self) -> int:
        return self.num_blocks

    @property
    def data(self) -> Optional[np.ndarray]:
        """The payload array ``[num_blocks, page_size, *kv_shape]`` (``None`` without payload)."""
        return self._pool.data

    def take(self, n: int) -> np.ndarray:
        n = min(n, self._pool.num_free)
        self.used += n
        return self._pool.take(n).astype(SLOT_DTYPE)

    def give(self, slots: np.ndarray) -> None:
        self.used -= len(slots)
        self._pool.give_back(slots.astype(np.int32))

    def write(self, slots: np.ndarray, pages: Optional[np.ndarray]) -> np.ndarray:
        if pages is not None and self._pool.data is not None:
            self._pool.data[slots] = pages
        return np.ones(len(slots), dtype=bool)

    def read(self, slots: np.ndarray) -> Tuple[Optional[np.ndarray], np.ndarray]:
        data = None if self._pool.data is None else self._pool.data[slots]
        return data, np.ones(len(slots), dtype=bool)

    def check(self) -> None:
        self._pool.check()
        assert self._pool.num_free + self.used == self.num_blocks, (
            f"{self.name}: free {self._pool.num_free} + used {self.used} != {self.num_blocks}")

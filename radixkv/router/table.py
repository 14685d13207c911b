"""MaskTable: a numpy open-addressing mirror of a ``{64-bit hash: 64-bit mask}`` dict, for batch lookups.

Why: a request's pages are looked up all at once. In a dict of millions of entries each lookup
is a chain of dependent cache misses (index slot, entry, key object) that the interpreter issues
one after the other; numpy gathers the whole batch's slots in one pass, so the misses overlap.
The dict stays the truth (:class:`~radixkv.router.index.KVIndex` updates it first); this table
follows it batch by batch (:meth:`MaskTable.upsert`) and answers :meth:`MaskTable.lookup`.

Linear probing over a power-of-two table, key 0 meaning an empty slot. A key whose mask falls to
0 keeps its slot (a tombstone that reads as absent, as 0 means "held by nobody"); when live keys
and tombstones pass half the slots the table is rebuilt from the dict, at a quarter full.
"""

from __future__ import annotations

from itertools import repeat
from typing import Mapping, Optional, Tuple

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class MaskTable:
    """Keys and masks in two uint64 arrays; see the module docstring. Writers must be serialized."""

    __slots__ = ("keys", "masks", "bits", "used")

    MAX_SLOTS = 8
    """Instances a 64-bit mask has room for (8 bits each)."""

    def __init__(self, items: Mapping[int, int]) -> None:
        n = len(items)
        bits = max(10, (4 * n).bit_length())
        self.bits = bits
        self.keys = np.zeros(1 << bits, dtype=np.uint64)
        self.masks = np.zeros(1 << bits, dtype=np.uint64)
        self.used = 0
        if n:
            self._insert(np.fromiter(items.keys(), np.uint64, n), np.fromiter(items.values(), np.uint64, n))

    def _home(self, q: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return ((q * _GOLDEN) >> np.uint64(64 - self.bits)).astype(np.int64)

    def find(self, q: np.ndarray, rounds: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """``(slots, unresolved)``: the slot of each key of ``q`` (uint64; -1 where absent) and the
        positions still probing after ``rounds`` steps (``None``: until every key is resolved).
        O(len(q)) expected."""
        keys, wrap = self.keys, len(self.keys) - 1
        slot = self._home(q)
        out = np.full(len(q), -1, dtype=np.int64)
        pending = np.arange(len(q))
        while pending.size and rounds != 0:
            at = slot[pending]
            k = keys[at]
            hit = k == q[pending]
            out[pending[hit]] = at[hit]
            pending = pending[~(hit | (k == 0))]
            slot[pending] = (slot[pending] + 1) & wrap
            rounds = None if rounds is None else rounds - 1
        return out, pending

    def lookup(self, q: np.ndarray, truth: Mapping[int, int]) -> np.ndarray:
        """The mask of each key of ``q`` (0 where absent), as uint64. The few keys still probing after
        four steps (the long clusters of linear probing, each a round of numpy calls) are read from
        ``truth``, the dict. O(len(q)) expected."""
        at, late = self.find(q, rounds=4)
        out = self.masks[at]
        out[at < 0] = 0
        if late.size:
            out[late] = np.fromiter(map(truth.get, q[late].tolist(), repeat(0)), np.uint64, late.size)
        return out

    def upsert(self, keys: np.ndarray, masks: np.ndarray, truth: Mapping[int, int]) -> Optional["MaskTable"]:
        """Set the masks of distinct ``keys``; returns a rebuilt table (from ``truth``, the dict) when this
        one would pass half full, else ``None`` (updated in place). O(len(keys)) expected."""
        at, _ = self.find(keys)
        found = at >= 0
        self.masks[at[found]] = masks[found]
        new = ~found & (masks != 0)
        count = int(new.sum())
        if count and 2 * (self.used + count) > len(self.keys):
            return MaskTable(truth)
        if count:
            self._insert(keys[new], masks[new])
        return None

    def _insert(self, q: np.ndarray, m: np.ndarray) -> None:
        """Place keys known to be absent (and distinct) in free slots; a slot two of them reach at once
        goes to one, the others probe on."""
        keys, wrap = self.keys, len(self.keys) - 1
        slot = self._home(q)
        pending = np.arange(len(q))
        while pending.size:
            at = slot[pending]
            free = keys[at] == 0
            cand = pending[free]
            _, first = np.unique(slot[cand], return_index=True)
            win = cand[first]
            keys[slot[win]] = q[win]
            self.masks[slot[win]] = m[win]
            placed = np.zeros(len(q), dtype=bool)
            placed[win] = True
            busy = pending[~free]
            slot[busy] = (slot[busy] + 1) & wrap
            pending = pending[~placed[pending]]
        self.used += len(q)

    def check(self, truth: Mapping[int, int]) -> None:
        """O(slots): the live entries are exactly ``truth``'s."""
        live = self.masks != 0
        got = dict(zip(self.keys[live].tolist(), self.masks[live].tolist()))
        assert got == dict(truth), "the lookup table differs from the index"
        assert int((self.keys != 0).sum()) == self.used, "the table's count of used slots is wrong"


__all__ = ["MaskTable"]

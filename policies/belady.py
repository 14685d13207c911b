"""Belady's offline optimum: evict the page whose next use is farthest in the future.

For measurement only: it must be given the request sequence in advance
(:meth:`Belady.prepare`; ``radixkv replay --policy belady`` and
:func:`radixkv.analysis.replay.replay` do this pre-pass automatically). It is the
ceiling online policies are measured against. Source: Belady, "A study of
replacement algorithms for a virtual-storage computer" (1966); with bypass,
the page-level optimum for unit-size pages.

**Rule.** Evict the unprotected page whose next use is farthest, pages never
used again first, deepest first on ties; a new page never used again is not
cached at all (bypass, through :meth:`admit`).

**Per page, on a tree of runs.** A node's pages share their last use ``t``
(a request that uses part of a node splits it), but their next uses differ:
page ``d`` of request ``t`` is next used by the first later request that
holds the same page identity (the same token prefix through page ``d``). A
request holding page ``d`` holds every page above it, so next use never
decreases with depth: the farthest page of a leaf is its tail, and the
farthest page of the whole tree is a leaf tail. So a leaf is ranked by its
tail page's next use, :meth:`on_victim` lets only the tail run that shares
that next use go, and the engine re-ranks the leaf by its new tail.

The pre-pass identifies pages by 128-bit keys of their token prefixes and
namespace (two independent lanes of :class:`radixkv.page_keys.PrefixKeys`,
vectorized in numpy over batches of requests), then finds each reference's
next reference with one stable sort. O(total pages log).
"""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from radixkv.errors import ArgumentValueError
from radixkv.keys import TOKEN_DTYPE
from radixkv.page_keys import PrefixKeys
from radixkv.tree import Node

from .base import EvictionPolicy, Offline

if TYPE_CHECKING:  # pragma: no cover
    from radixkv.workload.traces import Request  # a policy sees requests, it does not read them
    from radixkv.cache import PrefixCache

NEVER = 1 << 62
"""Next-use value of a page no later request uses."""

_LANE_SEEDS = (0x5EED_0001, 0x5EED_0002)
"""Seeds of the two 64-bit key lanes that make a page's 128-bit identity."""
_BATCH = 256


def _identities(requests: Iterable[Request], page_size: int) -> Tuple[np.ndarray, np.ndarray, List[int]]:
    """Two independent 64-bit keys of every full page of every request, namespace salted
    (:class:`radixkv.page_keys.PrefixKeys`, one per lane), and each request's page count.
    Keyed :data:`_BATCH` requests at a time. O(tokens) numpy work."""
    lanes = [PrefixKeys(page_size, seed) for seed in _LANE_SEEDS]
    parts: Tuple[List[np.ndarray], List[np.ndarray]] = ([], [])
    counts: List[int] = []
    it = iter(requests)
    while True:
        batch = list(islice(it, _BATCH))
        if not batch:
            break
        arrays = [np.asarray(r.tokens, dtype=TOKEN_DTYPE) for r in batch]
        for lane, out in zip(lanes, parts):
            keys, offsets = lane.many(arrays)
            sizes = np.diff(offsets)
            keys ^= np.repeat(np.array([lane.salt(r.namespace) for r in batch], dtype=np.uint64), sizes)
            out.append(keys)
        counts.extend(sizes.tolist())
    empty = np.zeros(0, dtype=np.uint64)
    return (np.concatenate(parts[0]) if parts[0] else empty, np.concatenate(parts[1]) if parts[1] else empty,
            counts)


def next_uses(requests: Iterable[Request], page_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """For every full page of every request, the index of the next request using the same page.

    Returns ``(nxt, offsets)``: page ``d`` of request ``r`` is ``nxt[offsets[r] + d]``,
    :data:`NEVER` when no later request uses it. Pages are the same when their
    namespace and whole token prefix through that page are. O(pages log pages).
    """
    a, b, counts = _identities(requests, page_size)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    nxt = np.full(total, NEVER, dtype=np.int64)
    if total:
        owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        order = np.lexsort((b, a))  # stable: equal pages stay in request order
        sa, sb = a[order], b[order]
        same = (sa[1:] == sa[:-1]) & (sb[1:] == sb[:-1])
        nxt[order[:-1][same]] = owner[order[1:][same]]
    return nxt, offsets


class Belady(Offline, EvictionPolicy):
    """Offline optimum with bypass; ``policy_state`` is the node's last use (a clock value).

    Valid only for a cache that sees exactly the prepared requests through
    ``admit``, one clock tick each, as replay does. A node last used at a
    clock value outside the prepared range counts as never used again.
    """

    name = "belady"

    def __init__(self) -> None:
        self._next = np.full(0, NEVER, dtype=np.int64)
        self._offsets = np.zeros(1, dtype=np.int64)
        self._first = 1
        self._page_size: Optional[int] = None

    def attach(self, cache: "PrefixCache") -> None:
        self._page_size = cache.page_size

    def prepare(self, requests: Sequence[Request], page_size: int, first_clock: int = 1) -> None:
        """Learn the future: ``requests`` will be admitted at clock values ``first_clock, first_clock+1, ...``."""
        if self._page_size is not None and page_size != self._page_size:
            raise ArgumentValueError(f"page_size must be the cache's {self._page_size}, got {page_size!r}")
        nxt, self._offsets = next_uses(requests, page_size)
        self._first = first_clock
        # request index -> clock value; NEVER stays NEVER
        self._next = np.where(nxt == NEVER, NEVER, nxt + first_clock)

    def _row(self, now: int) -> Optional[np.ndarray]:
        i = now - self._first
        if 0 <= i < len(self._offsets) - 1:
            return self._next[self._offsets[i] : self._offsets[i + 1]]
        return None

    def next_use(self, node: Node, depth: int) -> int:
        """Clock value of the next use of page ``depth`` (from the root) of ``node``; :data:`NEVER` if none."""
        row = self._row(node.policy_state)
        return int(row[depth]) if row is not None and depth < len(row) else NEVER

    def admit(self, node_parent: Node, num_pages: int, now: int, pages: memoryview) -> int:
        row = self._row(now)
        if row is None:
            return num_pages
        start = node_parent.end
        return int(np.count_nonzero(row[start : start + num_pages] < NEVER))

    def on_victim(self, node: Node) -> int:
        row = self._row(node.policy_state)
        if row is None or node.end > len(row):
            return node.num_pages
        run = row[node.start : node.end]
        return len(run) - int(np.searchsorted(run, run[-1], side="left"))

    def priority(self, node: Node) -> int:
        return -self.next_use(node, node.end - 1)

"""LRU hit-rate curve: hit tokens at every capacity from one pass over a trace.

Block-level LRU under the replay semantics of :mod:`radixkv.testing.reference`
(match, protect, evict by ``(last access, -depth)``, insert what fits) is a
*stack algorithm*, so one pass gives its hits at every capacity at once:

* Give every page of every request, cached or not, the key
  ``(request index, -depth)`` of its latest reference. A request references
  one page per depth, so this is a total order over every page ever
  referenced, and it does not depend on the capacity.
* At capacity ``C`` the cache after each request is exactly the top ``C``
  pages of that order (by induction over requests: the request's own pages
  go to the top, shallowest first; eviction removes the lowest unprotected
  pages; a request longer than ``C`` keeps its first ``C`` pages; the
  protected set is at most ``C`` because it was cached).
* A page's *rank* is the number of pages above it. A page ranks above all its
  descendants, so along a request's prefix the ranks of already-referenced
  pages strictly increase and a never-referenced page is followed only by
  never-referenced ones. The request hits ``#{leading pages with rank < C}``
  pages at capacity ``C``.

So the pass records each request's leading ranks in a histogram over rank,
and hits at any ``C`` are a prefix sum of it. Ranks come from a Fenwick tree
over reference sequence numbers (live = the latest reference of some page),
updated and queried with vectorized numpy, one request at a time.

Cost: O(R log R) numpy work for R page references; the Mooncake conversation
trace at page size 16 (9M references) takes 5-7 s from hash ids.
Memory: O(R) for the tree plus O(distinct pages).

Example::

    >>> import numpy as np
    >>> r = lru_curve([np.arange(8), np.arange(8)], page_size=4, capacities=[0, 1, 2])
    >>> r.hit_tokens, r.prompt_tokens
    ([0, 4, 8], 16)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ..errors import ArgumentValueError, TraceFormatError
from ..keys import as_tokens, check_int
from ..page_keys import PageInterner
from ..workload.traces import MAX_MOONCAKE_HASH_ID, MOONCAKE_BLOCK_TOKENS, MooncakeBlocks, expand_mooncake, json_lines

__all__ = ["AUTO_POINTS", "CurveResult", "LruStackDistances", "PageInterner", "log_grid", "lru_curve",
           "lru_curve_mooncake", "mooncake_page_ids"]

_NO_RANKS = np.empty(0, dtype=np.int64)
AUTO_POINTS = 50
"""Capacities of an automatic curve grid (:func:`log_grid`)."""


def log_grid(top: int, points: int = AUTO_POINTS) -> list[int]:
    """``min(points, top)`` log-spaced whole capacities from 1 to ``top`` blocks, both ends included,
    strictly increasing (where rounding would repeat a small capacity the next whole one is taken,
    so the low end is dense rather than short of points). For a one-pass curve, where every
    capacity costs nothing once the pass is done, ``top`` is the trace's distinct pages: the curve
    is flat beyond it. Cost: O(points).

    Example:
        >>> log_grid(1000, 4)
        [1, 10, 100, 1000]
    """
    top = max(check_int(top, "top", minimum=0), 1)
    points = check_int(points, "points", minimum=2)
    grid: list[int] = []
    for c in np.geomspace(1, top, min(points, top)):
        grid.append(max(int(round(c)), grid[-1] + 1 if grid else 1))
    return grid



@dataclass(frozen=True, slots=True)
class CurveResult:
    """LRU hits of one trace at every capacity.

    Attributes:
        capacities: the capacities asked for, in blocks (one block = one page).
        hit_tokens: hit tokens at each of ``capacities``, same order.
        prompt_tokens: sum of prompt lengths, partial trailing pages included.
        requests: number of requests in the trace.
        page_size: tokens per page.
        hits_below: ``hits_below[c]`` = hit pages over the trace at capacity
            ``c``; constant past its end (a cache that never evicts).
    """

    capacities: list[int]
    hit_tokens: list[int]
    prompt_tokens: int
    requests: int
    page_size: int
    hits_below: np.ndarray = field(repr=False, compare=False)

    def hit_tokens_at(self, num_blocks: int) -> int:
        """Hit tokens at a capacity of ``num_blocks`` blocks, any value. Cost: O(1)."""
        num_blocks = check_int(num_blocks, "num_blocks", minimum=0)
        return int(self.hits_below[min(num_blocks, len(self.hits_below) - 1)]) * self.page_size

    def token_hit_rate_at(self, num_blocks: int) -> float:
        """``hit_tokens_at(num_blocks) / prompt_tokens`` (0.0 for an empty trace)."""
        hits = self.hit_tokens_at(num_blocks)
        return hits / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def token_hit_rates(self) -> list[float]:
        """Token hit rate at each of ``capacities``."""
        return [h / self.prompt_tokens if self.prompt_tokens else 0.0 for h in self.hit_tokens]

    @property
    def max_hit_tokens(self) -> int:
        """Hit tokens of a cache that never evicts (the curve's plateau)."""
        return int(self.hits_below[-1]) * self.page_size


class LruStackDistances:
    """One-pass LRU stack distances over page identities.

    Feed requests in trace order with :meth:`add` (page identities: equal
    identity means equal token prefix, e.g. from :meth:`PageInterner.ids` or
    :func:`mooncake_page_ids`); :meth:`result` then answers any capacity.

    State: ``seq_of[page]`` is the sequence number of the page's latest
    reference (-1 if never referenced); ``live[seq]`` marks latest references;
    a Fenwick tree over ``live`` counts them by prefix. A request of ``n``
    pages takes the next ``n`` sequence numbers, deepest page lowest, so
    sequence numbers follow the eviction order: lower is evicted first, and a
    page's rank is the number of live marks above its sequence number.

    Cost: :meth:`add` is O(n log R) numpy work (R references so far), in a
    constant number of numpy calls plus O(log R) small ones.
    """

    def __init__(self, page_size: int) -> None:
        self.page_size = check_int(page_size, "page_size", minimum=1)
        self.requests = 0
        self.prompt_tokens = 0
        self.num_live = 0  # distinct pages referenced so far
        self._next_seq = 0
        self._seq_of = np.full(1024, -1, dtype=np.int64)
        self._live = np.zeros(1024, dtype=bool)
        self._tree = np.zeros(1025, dtype=np.int32)  # 1-based Fenwick over _live
        self._rank_counts = np.zeros(1024, dtype=np.int64)

    def add(self, page_ids: np.ndarray, num_tokens: int) -> np.ndarray:
        """Record one request of ``num_tokens`` prompt tokens whose full pages are ``page_ids``;
        return the ranks of its leading pages referenced before (strictly increasing), so its hit
        pages at capacity ``C`` are ``np.searchsorted(ranks, C)``.

        ``page_ids`` are the request's pages in order, distinct and >= 0; on a
        ValueError nothing is recorded. Cost: O(n log R) for n pages.
        """
        ids = np.asarray(page_ids, dtype=np.int64)
        if ids.ndim != 1:
            raise ArgumentValueError(f"page_ids must be 1-D, got shape {ids.shape}")
        n = len(ids)
        if num_tokens < n * self.page_size:
            raise ArgumentValueError(f"num_tokens must cover {n} pages of {self.page_size}, got {num_tokens!r}")
        if n and ids.min() < 0:
            raise ArgumentValueError(f"page_ids must be >= 0, got {int(ids.min())!r}")
        repeats = n - len(np.unique(ids)) if n > 1 else 0
        if repeats:  # one page per depth, or the eviction order is not total
            raise ArgumentValueError(f"page_ids must be distinct, got {repeats} repeats")
        self.requests += 1
        self.prompt_tokens += int(num_tokens)
        ranks = _NO_RANKS
        if n == 0:
            return ranks
        self._grow_pages(int(ids.max()) + 1)
        old = self._seq_of[ids]
        seen = old >= 0
        lead = n if seen.all() else int(np.argmin(seen))
        # Only a prefix can have been referenced: referencing a page references its ancestors.
        assert not seen[lead:].any(), "a page was referenced before its parent"
        if lead:
            ranks = self.num_live - self._count_at_or_below(old[:lead])
            assert lead == 1 or bool(np.all(np.diff(ranks) > 0)), "ranks not increasing along a prefix"
            self._grow_ranks(int(ranks[-1]) + 1)
            self._rank_counts[ranks] += 1  # ranks are distinct, so no add.at needed
            self._fenwick_add(old[:lead], -1)
            self._live[old[:lead]] = False
        seqs = self._next_seq + (n - 1) - np.arange(n, dtype=np.int64)
        self._grow_seqs(self._next_seq + n)
        self._next_seq += n
        self._live[seqs] = True
        self._fenwick_add(seqs, 1)
        self._seq_of[ids] = seqs
        self.num_live += n - lead
        return ranks

    def reset_counts(self) -> None:
        """Forget the hits and prompt tokens counted so far, keeping the stack (the end of a warm-up:
        the pages referenced stay cached at every capacity). O(pages referenced)."""
        self.requests = self.prompt_tokens = 0
        self._rank_counts[:] = 0

    def result(self, capacities: Sequence[int]) -> CurveResult:
        """Hits at each of ``capacities`` (blocks), plus the histogram for any other. Cost: O(pages)."""
        caps = [check_int(c, f"capacities[{i}]", minimum=0) for i, c in enumerate(capacities)]
        used = int(np.flatnonzero(self._rank_counts).max()) + 1 if self._rank_counts.any() else 0
        hits_below = np.zeros(used + 1, dtype=np.int64)
        np.cumsum(self._rank_counts[:used], out=hits_below[1:])
        top = len(hits_below) - 1
        return CurveResult(
            capacities=caps,
            hit_tokens=[int(hits_below[min(c, top)]) * self.page_size for c in caps],
            prompt_tokens=self.prompt_tokens,
            requests=self.requests,
            page_size=self.page_size,
            hits_below=hits_below,
        )

    def check(self) -> None:
        """Assert the Fenwick tree, live marks and page map agree. Cost: O(R)."""
        live = self._live[: self._next_seq]
        assert int(live.sum()) == self.num_live, f"{int(live.sum())} live references, expected {self.num_live}"
        assert not self._live[self._next_seq:].any(), "a sequence number past the end is live"
        seqs = self._seq_of[self._seq_of >= 0]
        assert len(seqs) == self.num_live, f"{len(seqs)} pages mapped, {self.num_live} live"
        assert len(np.unique(seqs)) == len(seqs), "two pages share a sequence number"
        assert bool(self._live[seqs].all()), "a page's latest reference is not marked live"
        expected = _build_fenwick(self._live)
        bad = np.flatnonzero(expected != self._tree)
        assert not len(bad), f"Fenwick node {int(bad[0]) if len(bad) else -1} is stale"

    def _count_at_or_below(self, seqs: np.ndarray) -> np.ndarray:
        """Live references with sequence number <= each of ``seqs`` (vectorized Fenwick prefix sums)."""
        idx = seqs + 1
        total = np.zeros(len(idx), dtype=np.int64)
        while idx.any():
            total += self._tree[idx]  # tree[0] is 0, so finished lanes add nothing
            idx &= idx - 1
        return total

    def _fenwick_add(self, seqs: np.ndarray, delta: int) -> None:
        """Add ``delta`` at each of the distinct ``seqs``, as one batch.

        Point by point (or ``np.add.at`` over every lane's path) costs
        O(n log R) element updates; a batch touches only the positions
        themselves plus the path above the last position of each contiguous
        run (any node above a run position and past the run covers the run's
        end). Each touched node gains the batch's count inside its range. A
        request's pages hold one or a few runs of sequence numbers, so this is
        O(n + runs * log R) plus a sort.
        """
        pos = np.sort(seqs) + 1
        size = len(self._tree) - 1
        ends = pos[np.append(np.diff(pos) != 1, True)]
        paths = [pos]
        idx = ends + (ends & -ends)
        idx = idx[idx <= size]
        while len(idx):
            paths.append(idx)
            idx = idx + (idx & -idx)
            idx = idx[idx <= size]
        nodes = np.unique(np.concatenate(paths))
        inside = np.searchsorted(pos, nodes, "right") - np.searchsorted(pos, nodes - (nodes & -nodes), "right")
        self._tree[nodes] += (delta * inside).astype(self._tree.dtype)

    def _grow_pages(self, needed: int) -> None:
        if needed > len(self._seq_of):
            grown = np.full(max(needed, 2 * len(self._seq_of)), -1, dtype=np.int64)
            grown[: len(self._seq_of)] = self._seq_of
            self._seq_of = grown

    def _grow_seqs(self, needed: int) -> None:
        size = len(self._live)  # always a power of two
        if needed > size:
            new_size = size
            while new_size < needed:
                new_size *= 2
            live = np.zeros(new_size, dtype=bool)
            live[:size] = self._live
            tree = np.zeros(new_size + 1, dtype=self._tree.dtype)
            tree[: size + 1] = self._tree
            # Every live mark is below `size`, so a new node covers none of them
            # unless its range starts at 0: those are the powers of two, which
            # cover everything, like node `size` already does. No rebuild.
            node = 2 * size
            while node <= new_size:
                tree[node] = self._tree[size]
                node *= 2
            self._live, self._tree = live, tree

    def _grow_ranks(self, needed: int) -> None:
        if needed > len(self._rank_counts):
            grown = np.zeros(max(needed, 2 * len(self._rank_counts)), dtype=np.int64)
            grown[: len(self._rank_counts)] = self._rank_counts
            self._rank_counts = grown


def lru_curve(requests: Iterable[np.ndarray], page_size: int, capacities: Sequence[int]) -> CurveResult:
    """LRU hit tokens at each of ``capacities`` for a trace of token arrays, in one pass.

    Equal, capacity by capacity, to :func:`radixkv.testing.reference.reference_lru_replay`.
    Cost: O(tokens) to key the pages plus O(R log R) for R page references.
    """
    page_size = check_int(page_size, "page_size", minimum=1)
    caps = [check_int(c, f"capacities[{i}]", minimum=0) for i, c in enumerate(capacities)]
    interner = PageInterner(page_size)
    stack = LruStackDistances(page_size)
    for tokens in requests:
        tokens = as_tokens(tokens)
        stack.add(interner.ids(tokens), len(tokens))
    return stack.result(caps)


def mooncake_page_ids(block_ids: np.ndarray, num_tokens: int, page_size: int) -> np.ndarray:
    """Page identities from dense Mooncake block-prefix ids, without expanding tokens.

    ``block_ids[k]`` must identify the hash-id prefix ``hash_ids[:k+1]``
    (see :func:`lru_curve_mooncake`); page ``i`` lies in block ``i // s``
    at offset ``i % s`` with ``s = 512 // page_size``, and its identity is
    ``block_ids[i // s] * s + i % s``. Only full pages within ``num_tokens``.
    """
    per_block = MOONCAKE_BLOCK_TOKENS // page_size
    n = num_tokens // page_size
    pages = np.arange(n, dtype=np.int64)
    return np.asarray(block_ids, dtype=np.int64)[pages // per_block] * per_block + pages % per_block


def lru_curve_mooncake(path: str, page_size: int, capacities: Sequence[int]) -> CurveResult:
    """LRU hit tokens at each of ``capacities`` for a Mooncake JSONL trace.

    When ``page_size`` divides 512, works from hash ids: the prefix
    ``hash_ids[:k+1]`` is interned to a dense block id (no reliance on the ids
    being chained), and a page is (block id, offset in block). That is exact,
    the same as expanding with :func:`radixkv.workload.traces.expand_mooncake`,
    because distinct hash ids expand to disjoint token ranges. Otherwise it
    expands tokens. Cost: O(blocks) Python work plus the stack pass.
    """
    page_size = check_int(page_size, "page_size", minimum=1)
    caps = [check_int(c, f"capacities[{i}]", minimum=0) for i, c in enumerate(capacities)]
    direct = MOONCAKE_BLOCK_TOKENS % page_size == 0
    stack = LruStackDistances(page_size)
    interner = None if direct else PageInterner(page_size)
    blocks = MooncakeBlocks()
    for line_no, hash_ids, input_length in _read_mooncake(path):
        if not direct:
            tokens = expand_mooncake(hash_ids, input_length)
            stack.add(interner.ids(tokens), len(tokens))
            continue
        num_tokens = min(input_length, MOONCAKE_BLOCK_TOKENS * len(hash_ids))
        used = -(-num_tokens // MOONCAKE_BLOCK_TOKENS)
        stack.add(mooncake_page_ids(blocks.ids(hash_ids[:used]), num_tokens, page_size), num_tokens)
    return stack.result(caps)


def _read_mooncake(path: str):
    """Yield ``(line number, hash_ids, input_length)`` per non-blank line, validating types and ranges."""
    for line_no, record in json_lines(path):
        hash_ids = record.get("hash_ids") if isinstance(record, dict) else None
        input_length = record.get("input_length") if isinstance(record, dict) else None
        if not isinstance(hash_ids, list) or not all(type(h) is int for h in hash_ids):
            raise TraceFormatError(path, line_no, f"hash_ids must be a list of ints, got {hash_ids!r:.80}")
        bad = [h for h in hash_ids if not 0 <= h <= MAX_MOONCAKE_HASH_ID]
        if bad:
            raise TraceFormatError(path, line_no,
                                   f"hash_ids must be in [0, {MAX_MOONCAKE_HASH_ID}], got {bad[0]!r:.60}")
        if type(input_length) is not int or input_length < 0:
            raise TraceFormatError(path, line_no, f"input_length must be an int >= 0, got {input_length!r:.60}")
        yield line_no, hash_ids, input_length


def _build_fenwick(live: np.ndarray) -> np.ndarray:
    """Fenwick tree of ``live`` in O(n): node i sums ``live[i - lowbit(i) : i]``."""
    prefix = np.zeros(len(live) + 1, dtype=np.int64)
    np.cumsum(live, out=prefix[1:])
    idx = np.arange(len(live) + 1, dtype=np.int64)
    tree = (prefix - prefix[idx - (idx & -idx)]).astype(np.int32)
    tree[0] = 0
    return tree

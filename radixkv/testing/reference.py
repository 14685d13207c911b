"""A deliberately plain block-level LRU replay, kept as the test oracle.

The engine and :mod:`radixkv.analysis.curve` are fast and clever; this module is slow
and obvious, so tests can compare them against it. It shares no code with
either: pages are a dict from page identity to ``(last access, depth)`` and
victims come off a sorted list.

Replay semantics (one request at a time, clock ``t`` = 1, 2, ...):

1. **Match.** The longest run of cached pages from the start of the request
   hits. Page ``i`` is identified by the whole token prefix up to the end of
   page ``i``; only full pages of ``page_size`` tokens count (a trailing
   partial page is never cached but does count in prompt tokens). Matched
   pages get last access ``t`` and are protected until the request ends.
2. **Allocate.** The request's remaining full pages need one block each.
   While short of free blocks, evict the unprotected cached page with the
   smallest ``(last access, -depth)`` (least recent first, deepest first on
   ties). If nothing unprotected is left, stop: only the first pages that got
   a block are cached.
3. **Insert** those pages with last access ``t``; protection ends.

Example::

    >>> import numpy as np
    >>> r = reference_lru_replay([np.arange(8), np.arange(8)], page_size=4, num_blocks=2)
    >>> r.hit_tokens, r.prompt_tokens
    (8, 16)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
from sortedcontainers import SortedList

from ..keys import as_tokens, check_int

__all__ = ["ReferenceLru", "ReferenceResult", "reference_lru_replay"]

_ROOT = -1  # identity of the empty prefix, parent of every first page


@dataclass(frozen=True, slots=True)
class ReferenceResult:
    """Totals of one reference replay.

    Attributes:
        requests: number of requests replayed.
        prompt_tokens: sum of prompt lengths, partial trailing pages included.
        hit_tokens: sum over requests of matched pages times ``page_size``.
        evicted_blocks: pages evicted to make room, over the whole replay.
        per_request_hits: hit tokens of each request, in trace order.
    """

    requests: int
    prompt_tokens: int
    hit_tokens: int
    evicted_blocks: int
    per_request_hits: tuple[int, ...]

    @property
    def token_hit_rate(self) -> float:
        """``hit_tokens / prompt_tokens`` (0.0 for an empty trace)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class ReferenceLru:
    """Block-level LRU over token pages, one request at a time.

    Cost: ``step`` is O(n log N) for a request of ``n`` pages in a cache of
    ``N`` blocks, plus O(n * page_size) to key the pages. Memory grows with
    every distinct page ever seen (the identity table is never pruned, so
    identities are stable and exact).
    """

    def __init__(self, page_size: int, num_blocks: int) -> None:
        self.page_size = check_int(page_size, "page_size", minimum=1)
        self.num_blocks = check_int(num_blocks, "num_blocks", minimum=0)
        self.clock = 0
        self.evicted_blocks = 0
        # (parent identity, page bytes) -> identity; exact, so no hash collisions.
        self._ids: dict[tuple[int, bytes], int] = {}
        self._parent: list[int] = []
        # Cached pages: identity -> (last access, depth), and the same pages
        # sorted by eviction order so the victim is always element 0.
        self._cache: dict[int, tuple[int, int]] = {}
        self._order: SortedList = SortedList()

    def page_ids(self, tokens: np.ndarray) -> list[int]:
        """Identities of the full pages of ``tokens``, interning new ones. Cost: O(len(tokens))."""
        tokens = as_tokens(tokens)
        ids, parent = [], _ROOT
        for start in range(0, len(tokens) - self.page_size + 1, self.page_size):
            key = (parent, tokens[start:start + self.page_size].tobytes())
            parent = self._ids.setdefault(key, len(self._ids))
            if parent == len(self._parent):
                self._parent.append(key[0])
            ids.append(parent)
        return ids

    def step(self, tokens: np.ndarray) -> int:
        """Replay one request; return its hit tokens. Cost: O(n log N)."""
        self.clock += 1
        t = self.clock
        pages = self.page_ids(tokens)

        matched = 0
        while matched < len(pages) and pages[matched] in self._cache:
            matched += 1
        protected = set(pages[:matched])
        for depth, page in enumerate(pages[:matched]):
            self._set(page, t, depth)

        wanted = len(pages) - matched
        while self.num_blocks - len(self._cache) < wanted:
            victim = next((k for k in self._order if k[2] not in protected), None)
            if victim is None:  # everything left is protected by this request
                break
            self._order.remove(victim)
            del self._cache[victim[2]]
            self.evicted_blocks += 1

        granted = min(wanted, self.num_blocks - len(self._cache))
        for depth in range(matched, matched + granted):
            self._set(pages[depth], t, depth)
        return matched * self.page_size

    def _set(self, page: int, last_access: int, depth: int) -> None:
        old = self._cache.get(page)
        if old is not None:
            self._order.remove((old[0], -old[1], page))
        self._cache[page] = (last_access, depth)
        self._order.add((last_access, -depth, page))

    def cached_pages(self) -> dict[int, tuple[int, int]]:
        """A copy of the cache: page identity -> (last access, depth)."""
        return dict(self._cache)

    def check(self) -> None:
        """Assert every invariant of the model. Cost: O(N).

        The cache fits, the sorted order mirrors the dict, every cached page's
        parent is cached (prefix-closed) and no parent is older than its child.
        """
        assert len(self._cache) <= self.num_blocks, f"{len(self._cache)} pages cached in {self.num_blocks} blocks"
        assert len(self._order) == len(self._cache), "sorted order and cache dict differ in size"
        for last, neg_depth, page in self._order:
            assert self._cache.get(page) == (last, -neg_depth), f"page {page} order entry is stale"
        for page, (last, depth) in self._cache.items():
            parent = self._parent[page]
            if parent == _ROOT:
                assert depth == 0, f"root page {page} has depth {depth}"
                continue
            assert parent in self._cache, f"page {page} is cached but its parent {parent} is not"
            p_last, p_depth = self._cache[parent]
            assert p_depth == depth - 1, f"page {page} at depth {depth} under parent at depth {p_depth}"
            assert p_last >= last, f"parent {parent} (last access {p_last}) older than child {page} ({last})"


def reference_lru_replay(requests_tokens: Iterable[np.ndarray], page_size: int, num_blocks: int) -> ReferenceResult:
    """Replay ``requests_tokens`` through :class:`ReferenceLru` and total the hits.

    Cost: O(total pages * log num_blocks) plus the page keying; about a second
    for 2,000 requests of 100 pages.
    """
    model = ReferenceLru(page_size, num_blocks)
    prompt_tokens = 0
    hits = []
    for tokens in requests_tokens:
        tokens = as_tokens(tokens)
        prompt_tokens += len(tokens)
        hits.append(model.step(tokens))
    return ReferenceResult(
        requests=len(hits),
        prompt_tokens=prompt_tokens,
        hit_tokens=sum(hits),
        evicted_blocks=model.evicted_blocks,
        per_request_hits=tuple(hits),
    )

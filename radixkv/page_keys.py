"""Page identities: one identity per full page, equal when the token prefix through that page is.

A *page* is the whole token prefix through it (and, where it matters, its
namespace), so two requests share page ``d`` exactly when their first
``d + 1`` pages of tokens are equal. Every analysis that needs to know which
pages are the same takes its identities from here:

* :class:`PrefixKeys`: 64-bit keys, a random linear hash of the token prefix
  (XOR a salt of the namespace), computed for a whole request, or a whole batch
  of requests, in a fixed number of vectorized numpy calls. Two different
  prefixes share a key with probability about ``2**-64`` per pair. The miss
  reasons (:mod:`radixkv.analysis.stats`) use one lane; Belady's pre-pass
  (:mod:`policies.belady`) two lanes of different seeds, a 128-bit identity.
* :class:`PageInterner`: exact, dense ids (0, 1, 2, ...) from chained
  ``(parent id, page bytes)`` lookups, for the LRU curve's stack
  (:mod:`radixkv.analysis.curve`), whose arrays are indexed by page id. No collisions, at
  one dict lookup and ``page_size * 4`` bytes per distinct page.
"""

from __future__ import annotations

import hashlib
from itertools import accumulate
from typing import List, Optional, Sequence, Tuple

from cachetools import LRUCache
import numpy as np

from .keys import TOKEN_DTYPE, as_tokens, check_positive_int

__all__ = ["PageInterner", "PrefixKeys"]

_U64 = np.uint64
_SALT_MEMO = 4096

BATCH_TOKENS = 1 << 20
"""Tokens :meth:`PrefixKeys.many` hashes per group of arrays (bounds its temporary copy to 4 MiB)."""


class PrefixKeys:
    """64-bit keys of the page prefixes of token arrays, vectorized.

    ``key[d] = salt ^ sum_{j<=d} (page_hash[j] + b) * r[j]  (mod 2**64)``, where
    ``page_hash[j] = sum_i token[j, i] * a[i]`` and ``a``, ``b``, ``r`` are fixed
    random odd 64-bit numbers drawn from ``seed``. Equal prefixes (and namespaces)
    give equal keys. Cost: O(tokens) numpy work, a handful of calls per request
    (:meth:`keys`) or per batch of requests (:meth:`many`).
    """

    def __init__(self, page_size: int, seed: int = 0x52AD1C) -> None:
        self.page_size = page_size
        self._salt_key = (seed % (1 << 64)).to_bytes(8, "little")  # lanes of other seeds salt independently
        self._rng = np.random.default_rng(seed)
        self._coef = self._odd(page_size)
        self._offset = self._odd(1)[0]
        self._depth = self._odd(1024)
        # The recent namespaces' salts: a bounded LRU map, so single-use namespaces (per-request
        # salts) neither grow memory nor evict the busy tenants' salts wholesale.
        self._salts: LRUCache = LRUCache(maxsize=_SALT_MEMO)

    def _odd(self, n: int) -> np.ndarray:
        return self._rng.integers(0, 1 << 63, size=n, dtype=np.uint64) * _U64(2) + _U64(1)

    def _grow(self, depth: int) -> None:
        """Have a depth coefficient for every page depth below ``depth``."""
        while len(self._depth) < depth:
            self._depth = np.concatenate([self._depth, self._odd(len(self._depth))])

    def _page_hashes(self, tokens: np.ndarray, num_pages: int) -> np.ndarray:
        """``page_hash + b`` of the first ``num_pages`` pages of ``tokens`` (a new uint64 array)."""
        pages = tokens[: num_pages * self.page_size].reshape(num_pages, self.page_size)
        # einsum sums the products without a (pages, page_size) uint64 temporary: 2x faster
        h = np.einsum("ij,j->i", pages, self._coef, dtype=np.uint64, casting="unsafe")
        h += self._offset
        return h

    def keys(self, tokens: np.ndarray, num_pages: int, namespace: Optional[str] = None) -> np.ndarray:
        """Keys of the first ``num_pages`` full pages of ``tokens`` (uint64)."""
        h = self.extend(np.asarray(tokens, dtype=TOKEN_DTYPE), 0, num_pages, _U64(0))
        salt = self.salt(namespace)
        if salt:
            h ^= salt
        return h

    def extend(self, tokens: np.ndarray, start: int, num_pages: int, prev: np.uint64) -> np.ndarray:
        """Namespace-free keys of pages ``start .. start + num_pages - 1`` of a prefix whose page
        ``start - 1`` has namespace-free key ``prev`` (0 at ``start == 0``); ``tokens`` holds those
        pages' tokens. ``keys(t, n, None)`` is ``extend(t, 0, n, 0)``."""
        end = start + num_pages
        self._grow(end)
        h = self._page_hashes(tokens, num_pages)
        h *= self._depth[start:end]
        if prev:
            h[:1] += prev
        np.cumsum(h, out=h)
        return h

    def many(self, token_arrays: Sequence[np.ndarray]) -> Tuple[np.ndarray, List[int]]:
        """Namespace-free keys of the full pages of every array in ``token_arrays`` (1-D uint32), in one pass.

        Returns ``(keys, offsets)``: array ``i``'s keys are ``keys[offsets[i]:offsets[i + 1]]``,
        each equal to ``keys(token_arrays[i], its full pages)``. Cost: O(tokens) numpy work in
        about ten calls per :data:`BATCH_TOKENS` tokens however many arrays, so short prompts do
        not each pay numpy's per-call overhead (about a microsecond a call: more than the hashing
        of a 4-page prompt). Memory: the keys, plus a copy of at most :data:`BATCH_TOKENS` tokens
        (or of one longer array).
        """
        p = self.page_size
        counts = [n // p for n in map(len, token_arrays)]
        offsets = list(accumulate(counts, initial=0))
        out = np.empty(offsets[-1], dtype=np.uint64)
        if offsets[-1]:
            self._grow(max(counts))
        if offsets[-1] * p <= BATCH_TOKENS:  # the usual case: one group
            self._many_into(out, token_arrays, counts, 0)
            return out, offsets
        first = 0  # the arrays first..i-1 not keyed yet
        for i, c in enumerate(counts, 1):
            if i == len(counts) or (offsets[i + 1] - offsets[first]) * p > BATCH_TOKENS:
                self._many_into(out, token_arrays[first:i], counts[first:i], offsets[first])
                first = i
        return out, offsets

    def _many_into(self, out: np.ndarray, token_arrays: Sequence[np.ndarray], counts: List[int], at: int) -> None:
        """:meth:`many` of ``token_arrays`` (with ``counts`` full pages each), written to ``out[at:]``."""
        p = self.page_size
        parts = [t[: c * p] for t, c in zip(token_arrays, counts) if c]
        if not parts:
            return
        total = sum(counts)
        h = self._page_hashes(np.concatenate(parts) if len(parts) > 1 else parts[0], total)
        sizes = np.asarray(counts, dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        h *= self._depth[np.arange(total, dtype=np.int64) - np.repeat(starts, sizes)]
        np.cumsum(h, out=h)
        # Each array's keys restart: less the running sum before its first page (wrapping uint64).
        before = np.zeros(len(counts), dtype=np.uint64)
        later = starts > 0
        before[later] = h[starts[later] - 1]
        h -= np.repeat(before, sizes)
        out[at : at + total] = h

    def node_keys(self, node, parent_key: Optional[int], namespace: Optional[str]) -> np.ndarray:
        """Salted keys (``uint64``) of a tree ``node``'s pages in ``namespace``, chained on
        ``parent_key``, the salted key of the page before its first (``None``: it starts its
        namespace). What an index of cached pages computes for a node it was not told the keys
        of. O(pages) numpy."""
        salt = self.salt(namespace)
        free = _U64(0) if parent_key is None else _U64(parent_key) ^ salt
        tokens = np.frombuffer(node.key, dtype=TOKEN_DTYPE, count=node.num_pages * self.page_size)
        return self.extend(tokens, node.start, node.num_pages, free) ^ salt

    def salt(self, namespace: Optional[str]) -> np.uint64:
        """The 64-bit salt XORed into ``namespace``'s keys (0 for ``None``): a keyed blake2b of its
        text, keyed by the seed. Memoized, boundedly: single-use namespaces must not grow memory
        without bound."""
        if namespace is None:
            return _U64(0)
        salt = self._salts.get(namespace)
        if salt is None:
            digest = hashlib.blake2b(str(namespace).encode("utf-8", "surrogatepass"), digest_size=8,
                                     key=self._salt_key).digest()
            salt = self._salts[namespace] = _U64(int.from_bytes(digest, "little"))
        return salt


class PageInterner:
    """Exact page identities for token sequences: chained ``(parent id, page bytes) -> id``.

    Equal identity if and only if equal token prefix up to the end of the
    page; no hashing shortcuts, so no collisions. Cost: O(len(tokens)) per
    call, one dict lookup per page; memory O(distinct pages * page_size).
    """

    def __init__(self, page_size: int) -> None:
        self.page_size = check_positive_int(page_size, "page_size")
        self._table: dict[tuple[int, bytes], int] = {}

    def ids(self, tokens: np.ndarray) -> np.ndarray:
        """Identities of the full pages of ``tokens`` (int64), interning new ones."""
        tokens = as_tokens(tokens)
        n = len(tokens) // self.page_size
        pages = tokens[: n * self.page_size].view(np.dtype((np.void, self.page_size * tokens.itemsize))).tolist()
        table, out, parent = self._table, [], -1
        for page in pages:
            parent = table.setdefault((parent, page), len(table))
            out.append(parent)
        return np.asarray(out, dtype=np.int64)

"""The contract a prefix cache must meet to be checked by :mod:`radixkv.testing`.

Any cache with the eight members of :class:`PrefixCacheUnderTest` can be run
through the conformance state machine; radixkv's own
:class:`~radixkv.PrefixCache` meets it through :class:`RadixKVTarget`, which
only adds :meth:`~PrefixCacheUnderTest.contents`. Caches whose semantics differ
where engines differ (whole-node eviction, a hit cap, lazy eviction, ...) say
so through the machine's options (:func:`~radixkv.testing.make_state_machine`);
:class:`EventContents` rebuilds ``contents()`` from KV events for caches that
cannot walk their pages.
"""

from __future__ import annotations

from typing import (Any, Dict, Hashable, List, Mapping, NamedTuple, Optional, Protocol, Sequence, Tuple,
                    runtime_checkable)

import numpy as np

from ..cache import PrefixCache
from ..keys import TOKEN_DTYPE

PageKey = Tuple[Optional[Hashable], Tuple[int, ...]]
"""A cached page, named by ``(namespace, every token from the start through that page)``."""


def longest_cached(pages: Mapping[PageKey, int], tokens: Sequence[int], page_size: int,
                   namespace: Optional[Hashable] = None) -> List[int]:
    """Blocks of the longest run of whole pages of ``tokens`` that ``pages`` holds: what a match
    must return according to a page-set model. O(len(tokens)) page lookups."""
    blocks = []
    tokens = tuple(int(t) for t in tokens)
    for end in range(page_size, len(tokens) + 1, page_size):
        block = pages.get((namespace, tokens[:end]))
        if block is None:
            break
        blocks.append(block)
    return blocks


def page_map(cache: PrefixCache, *, with_locks: bool = False) -> Dict[PageKey, Any]:
    """Every page in ``cache``'s HBM tree as ``(namespace, token prefix through the page) -> block``.

    With ``with_locks`` the value is ``(block, lock count of its node)``, which does not
    depend on how the pages happen to be split into nodes. Read through
    :meth:`~radixkv.PrefixCache.namespace_roots`; touches nothing. O(cached tokens).
    """
    p = cache.page_size
    out: Dict[PageKey, Any] = {}
    for namespace, root in cache.namespace_roots():
        stack = [(root, ())]
        while stack:
            node, prefix = stack.pop()
            for child in (node.children or {}).values():
                tokens = np.frombuffer(child.key, dtype=TOKEN_DTYPE, count=child.num_pages * p).tolist()
                path = prefix
                for i in range(child.num_pages):
                    path = path + tuple(tokens[i * p : (i + 1) * p])
                    block = int(child.blocks[i])
                    out[(namespace, path)] = (block, child.lock_ref) if with_locks else block
                stack.append((child, path))
    return out


class Match(NamedTuple):
    """What ``match`` returns (radixkv's :class:`~radixkv.MatchResult` has the same fields)."""

    num_tokens: int
    blocks: Sequence[int]
    node: Any


@runtime_checkable
class PrefixCacheUnderTest(Protocol):
    """A paged prefix cache, as the conformance kit drives it.

    Pages are whole runs of ``page_size`` tokens; a page is identified by its
    namespace and every token before and in it. ``num_blocks`` is the number
    of usable blocks. What the machine relies on (the option that relaxes a
    requirement, for caches that differ there, is in brackets):

    * ``match(tokens, namespace=)``: the longest cached whole-page prefix of
      ``tokens`` in ``namespace`` [cut to ``max_hit(len(tokens))`` tokens]:
      ``num_tokens`` (a multiple of ``page_size``), its ``blocks`` in order,
      and a ``node`` handle for ``lock``/``unlock``. May count as a use; never
      adds or drops a page [``loads_on_match``: may add pages loaded back].
      Handles of equal prefixes in one namespace may be one object [``shared_root``:
      the empty prefix's handle is shared by all namespaces].
    * ``allocate(n)``: ``n`` distinct block ids in ``range(num_blocks)``
      [``reserved_blocks``: never those, ids then run to ``num_blocks + len(reserved)``],
      neither cached nor held, now held by the caller, evicting unprotected
      pages as needed (never more than ``n`` [``over_eviction``]); ``None``,
      with nothing changed, only when fewer than ``n`` blocks can be had
      (``n > num_blocks - held - protected pages``). Held blocks stay the
      caller's across any other calls until inserted or freed.
    * ``insert(tokens, blocks, namespace=)``: ``blocks`` holds one block per
      full page of ``tokens``: the blocks of a matched (locked) prefix, then
      held ids. Pages already cached keep their blocks (a different passed
      block is released); new pages take their passed blocks (an admission
      policy may keep only a leading run of them and release the rest
      [``admits_everything`` requires all]). Returns the number of pages
      already cached. Never drops a page.
    * ``lock(handle)``: protects every page from the start through the
      handle's until a matching ``unlock``; locks nest. ``unlock`` of a
      handle that holds no lock raises ``ValueError`` [``unlock_raises``].
    * ``evict(n)``: drops exactly ``min(n, unprotected cached pages)`` pages
      [``over_eviction``: at least that many; ``exact_eviction=False``: at
      most; ``lazy_eviction``: never called], never a protected one, and
      returns how many; what stays is prefix-closed (a page's predecessor is
      cached too).
    * ``check()``: raises ``AssertionError`` if the cache's own invariants
      break (called after every step: the cheapest place to catch a broken
      reference count or a leaked block).
    * ``contents()``: every cached page as ``{(namespace, tokens): block}``;
      read-only.
    * optional ``free(blocks)``: gives back held blocks that were never
      inserted (an aborted request); when present the machine aborts requests.

    Namespaces never share a page: a page cached in one is invisible to
    ``match`` in another.
    """

    page_size: int
    num_blocks: int

    def match(self, tokens: Sequence[int], *, namespace: Optional[Hashable] = None) -> Any: ...

    def allocate(self, n: int) -> Optional[Sequence[int]]: ...

    def insert(self, tokens: Sequence[int], blocks: Sequence[int], *,
               namespace: Optional[Hashable] = None) -> int: ...

    def lock(self, handle: Any) -> None: ...

    def unlock(self, handle: Any) -> None: ...

    def evict(self, n: int) -> int: ...

    def check(self) -> None: ...

    def contents(self) -> Mapping[PageKey, int]: ...


class RadixKVTarget:
    """A :class:`~radixkv.PrefixCache` as a :class:`PrefixCacheUnderTest`.

    Delegates everything and adds :meth:`contents`, read from the tree.
    """

    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache
        self.page_size = cache.page_size
        self.num_blocks = cache.num_blocks

    def match(self, tokens, *, namespace=None):
        return self.cache.match(tokens, namespace=namespace)

    def allocate(self, n):
        return self.cache.allocate(n)

    def insert(self, tokens, blocks, *, namespace=None):
        return self.cache.insert(tokens, blocks, namespace=namespace)

    def lock(self, handle):
        self.cache.lock(handle)

    def unlock(self, handle):
        self.cache.unlock(handle)

    def evict(self, n):
        return self.cache.evict(n)

    def free(self, blocks):
        self.cache.free(blocks)

    def check(self):
        self.cache.check()

    def contents(self) -> Dict[PageKey, int]:
        """Every cached page, from the tree (:func:`page_map`). O(cached tokens)."""
        return page_map(self.cache)

    def __repr__(self) -> str:
        return f"RadixKVTarget({self.cache.policy.name}, page_size={self.page_size}, num_blocks={self.num_blocks})"


class EventContents:
    """``contents()`` rebuilt from a cache's KV events, for caches that cannot walk their pages.

    Feed it what the cache reports: :meth:`stored` for each stored run (its
    page hashes, the hash of the page before it or ``None`` at the start, its
    tokens, the namespace and the blocks the pages took) and :meth:`removed`
    for each removed hash. A page's tokens are its parent's plus its own, so a
    hash need not be invertible (vLLM's are not). O(1) per page.
    """

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._keys: Dict[Any, PageKey] = {}
        self.pages: Dict[PageKey, int] = {}

    def stored(self, hashes: Sequence[Any], parent: Any, tokens: Sequence[int], namespace: Optional[Hashable],
               blocks: Sequence[int]) -> None:
        """Record pages stored as one run: ``hashes[i]`` holds ``tokens[i*p:(i+1)*p]`` in ``blocks[i]``."""
        p = self.page_size
        prefix = self._keys[parent][1] if parent is not None else ()
        for i, h in enumerate(hashes):
            prefix = prefix + tuple(int(t) for t in tokens[i * p : (i + 1) * p])
            key = (namespace, prefix)
            self._keys[h] = key
            self.pages[key] = int(blocks[i])

    def tokens_of(self, page_hash: Any) -> Tuple[int, ...]:
        """Every token from the start through the page with this hash."""
        return self._keys[page_hash][1]

    def removed(self, hashes: Sequence[Any]) -> None:
        """Forget the pages with these hashes."""
        for h in hashes:
            self.pages.pop(self._keys.pop(h), None)

    def cleared(self) -> None:
        """Every page is gone."""
        self._keys.clear()
        self.pages.clear()

    def contents(self) -> Dict[PageKey, int]:
        return dict(self.pages)

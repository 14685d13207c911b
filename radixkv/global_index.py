"""A cluster-wide page index: which instances hold each page in HBM, so any of them can pull it.

Instances of a cluster (:class:`radixkv.cluster.Cluster`) compute pages that another instance
needs next: a conversation's next turn lands elsewhere. A :class:`GlobalPageIndex` makes every
page cached in any instance's HBM findable by any instance, under a key derived from its tokens,
as Mooncake's global KV pool, SGLang HiCache's L3 and the Dynamo and llm-d indexes do:

* a page's key is the 64-bit key of its token prefix salted by its namespace
  (:class:`~radixkv.page_keys.PrefixKeys`), so two namespaces never share a page;
* the index keeps ``key -> bitmask of the instances holding it``; each instance's cache tells it,
  as a page observer (:meth:`radixkv.cache.PrefixCache.add_page_observer`), of every page that
  enters or leaves its HBM, evictions, aborts, crashes and resets included;
* an instance's pages are prefix-closed (a page is cached only below cached pages), so the
  instances holding page ``d`` of a request hold pages ``0..d`` too: :meth:`longest` finds how far
  other instances hold a request past what the serving instance has, and one instance that holds
  all of it, in one dict lookup per page.

Cost: one dict update per page stored or removed; a request's keys once (a few numpy calls);
:meth:`longest` one dict lookup per page it passes. Memory: one dict entry per distinct page
cached anywhere (about 100 bytes: the int key, the int mask, the slot) plus 8 bytes per block of
each instance (its block -> key array and held mask). Two different prefixes share a key with probability about
``2**-64`` per pair; :meth:`check` recounts the index from the instances' trees.
"""

from __future__ import annotations

from collections import deque
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import extents
from .keys import as_tokens
from .page_keys import PrefixKeys
from .tree import namespace_of

__all__ = ["GlobalPageIndex"]

class _Residency:
    """One instance's side of the index: a page observer of its cache (see the module doc).

    ``block -> key`` is a numpy array beside a ``held`` mask, so a node's pages are recorded and
    forgotten in a few C-speed calls; only the shared dict is touched page by page.
    """

    def __init__(self, index: "GlobalPageIndex", bit: int, num_blocks: int) -> None:
        self._index = index
        self._bit = bit
        self._block_key = np.zeros(num_blocks, dtype=np.uint64)
        self._held = np.zeros(num_blocks, dtype=bool)
        self._expected: Optional[np.ndarray] = None
        self.pages = 0
        """Pages of this instance in the index now."""

    def expect(self, keys: Optional[np.ndarray]) -> None:
        """Until the next call, pages stored are pages of the request with these (salted) keys:
        :meth:`stored` takes their keys instead of hashing the pages again. ``None`` ends it."""
        self._expected = keys

    def stored(self, leaf) -> None:
        """``leaf``'s pages entered HBM (the cache calls this). O(pages)."""
        end = leaf.start + leaf.num_pages
        expected = self._expected
        if expected is not None and end <= len(expected):
            keys = expected[leaf.start:end]
        else:
            keys = self._index.node_keys(leaf, self._parent_key(leaf))
        blocks = extents.to_array(leaf.parts)
        self._block_key[blocks] = keys
        self._held[blocks] = True
        holders, bit = self._index._holders, self._bit
        ints = keys.tolist()
        get = holders.get
        holders.update(zip(ints, [get(k, 0) | bit for k in ints]))
        self.pages += len(ints)

    def _parent_key(self, leaf) -> Optional[int]:
        parent = leaf.parent
        return int(self._block_key[parent.last_block]) if parent.parent is not None else None

    def removed(self, blocks: np.ndarray) -> None:
        """Cached ``blocks`` leave HBM (the cache calls this before they go). O(len(blocks))."""
        held = self._held[blocks]
        if not held.all():
            blocks = blocks[held]
        ints = self._block_key[blocks].tolist()
        self._held[blocks] = False
        self.pages -= len(ints)
        holders, mask = self._index._holders, ~self._bit
        left = [holders[k] & mask for k in ints]
        if any(left):
            holders.update((k, m) for k, m in zip(ints, left) if m)
            deque(map(holders.__delitem__, [k for k, m in zip(ints, left) if not m]), maxlen=0)
        else:
            deque(map(holders.__delitem__, ints), maxlen=0)

    def cleared(self) -> None:
        """Every page left HBM (a reset, a crash). O(blocks)."""
        self.removed(np.flatnonzero(self._held).astype(np.int32))


class GlobalPageIndex:
    """``page key -> instances holding it in HBM`` for the caches of one cluster.

    >>> from radixkv import PrefixCache
    >>> caches = [PrefixCache(8, page_size=2) for _ in range(2)]
    >>> index = GlobalPageIndex(page_size=2)
    >>> for cache in caches:
    ...     index.join(cache)
    >>> caches[0].admit([1, 2, 3, 4]).release()
    >>> keys = index.request_keys([1, 2, 3, 4, 5, 6])
    >>> index.longest(keys, start=0, exclude=1)    # instance 0 holds 2 pages
    (2, 0)
    """

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.keys = PrefixKeys(page_size)
        self._holders: Dict[int, int] = {}
        self._members: List[Tuple[object, _Residency]] = []

    def join(self, cache) -> int:
        """Index ``cache``'s HBM from now on (its pages cached now included) as the next instance;
        return its instance number. O(cached pages)."""
        number = len(self._members)
        member = _Residency(self, 1 << number, cache.num_blocks)
        for node in cache.nodes():  # parents before children
            member.stored(node)
        cache.add_page_observer(member)
        self._members.append((cache, member))
        return number

    def leave_all(self) -> None:
        """Stop indexing every cache (their observers go). O(instances)."""
        for cache, member in self._members:
            cache.remove_page_observer(member)
        self._members.clear()
        self._holders.clear()

    # ------------------------------------------------------------------ keys
    def request_keys(self, tokens, namespace: Optional[str] = None) -> np.ndarray:
        """The keys of every full page of ``tokens`` in ``namespace`` (``uint64``). O(tokens) numpy."""
        arr = as_tokens(tokens)
        return self.keys.keys(arr, len(arr) // self.page_size, namespace)

    def node_keys(self, node, parent_key: Optional[int]) -> np.ndarray:
        """The keys of ``node``'s pages (``uint64``), chained on its parent's last page key (``None``:
        it starts its namespace). O(pages) numpy."""
        return self.keys.node_keys(node, parent_key, namespace_of(node))

    def expect(self, instance: int, keys: Optional[np.ndarray]) -> None:
        """The pages ``instance`` stores until the next call are the request's with ``keys``
        (it then hashes nothing again); ``None`` ends it. O(1)."""
        self._members[instance][1].expect(keys)

    # ------------------------------------------------------------------ queries
    def longest(self, keys: np.ndarray, start: int, exclude: int) -> Tuple[int, Optional[int]]:
        """``(pages, source)``: how many leading pages of the request with ``keys`` other instances than
        ``exclude`` hold, counting on from page ``start`` (the pages the serving instance has),
        and the lowest-numbered instance that holds them all (``None`` when no page past
        ``start`` is held elsewhere: ``pages`` is then ``start``). O(pages passed) dict lookups.
        """
        holders = self._holders
        others = ~(1 << exclude)
        mask = 0
        d = start
        for key in keys[start:].tolist():
            held = holders.get(key, 0) & others
            if d > start:
                held &= mask  # prefix-closed: a holder of page d held every page before it
            if not held:
                break
            mask = held
            d += 1
        if d == start:
            return start, None
        return d, (mask & -mask).bit_length() - 1

    def __len__(self) -> int:
        """Distinct pages held in some instance's HBM."""
        return len(self._holders)

    def pages_by_instance(self) -> List[int]:
        """Pages each instance has in the index now."""
        return [member.pages for _, member in self._members]

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Recount the index from every instance's tree: it must equal the union of their HBM
        residency, key by key (each key hashed again from the tokens). O(cached pages)."""
        expected: Dict[int, int] = {}
        for number, (cache, member) in enumerate(self._members):
            last: Dict[object, int] = {}
            count = 0
            for node in cache.nodes():  # parents before children
                parent = node.parent
                keys = self.node_keys(node, last.get(parent) if parent.parent is not None else None).tolist()
                if keys:
                    last[node] = keys[-1]
                for block, key in zip(extents.id_list(node.parts), keys):
                    assert member._held[block] and int(member._block_key[block]) == key, (
                        f"instance {number}: block {block} indexed as {member._block_key[block]}, holds page {key}")
                    expected[key] = expected.get(key, 0) | (1 << number)
                    count += 1
            assert member.pages == count, f"instance {number}: {member.pages} pages indexed, {count} cached"
            assert int(member._held.sum()) == count, f"instance {number}: stale block keys"
        assert self._holders == expected, (
            f"index of {len(self._holders)} pages differs from the instances' {len(expected)}")

"""A cluster-wide page index: which instances hold each page in HBM or in their host tier, so any of them can pull it.

Instances of a cluster (:class:`radixkv.cluster.Cluster`) compute pages that another instance
needs next: a conversation's next turn lands elsewhere. A :class:`GlobalPageIndex` makes every
page cached in any instance's HBM, or in its host tier, findable by any instance, under a key
derived from its tokens, as Mooncake's global KV pool, SGLang HiCache's L3 and the Dynamo and
llm-d indexes do:

* a page's key is the 64-bit key of its token prefix salted by its namespace
  (:class:`~radixkv.page_keys.PrefixKeys`), so two namespaces never share a page;
* the index keeps, per medium, ``key -> bitmask of the instances holding it``: one dict for HBM,
  one for the lower tiers it indexes (``lower_tiers``, the host tier by default). Each instance's
  cache tells it, as a page observer (:meth:`radixkv.cache.PrefixCache.add_page_observer`), of
  every page that enters or leaves its HBM, evictions, aborts, crashes and resets included; its
  tier stack tells it, as a residency observer (:meth:`radixkv.tiers.stack.TierStack.add_observer`),
  of every copy made or lost below HBM (demoted, cascaded, dropped, loaded back, forgotten);
* :meth:`longest` finds how far other instances hold a request past what the serving instance
  has, in HBM or host, and one instance that holds all of it (one that holds it all in HBM when
  there is one: the cheaper pull), in one or two dict lookups per page.

Cost: one dict update per page stored or removed in HBM or host; a request's keys once (a few
numpy calls); a host copy's keys chained on its parent copy's (O(its pages)), or, below a page
that has no host copy (in HBM), on the keys of the path up to the nearest host copy (O(those
pages), one numpy pass); :meth:`longest` one or two dict lookups per page it passes. Memory: one
dict entry per distinct page cached anywhere per medium (about 100 bytes: the int key, the int
mask, the slot) plus 9 bytes per block of each instance's HBM and host (its slot -> key array
and held mask). Two different prefixes share a key with probability about ``2**-64`` per pair;
:meth:`check` recounts the index from the instances' trees.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import extents
from .keys import TOKEN_DTYPE, as_tokens
from .page_keys import PrefixKeys
from .tiers.base import Copy, Tier
from .tree import namespace_of

__all__ = ["GlobalPageIndex"]

def _add(holders: Dict[int, int], ints: List[int], bit: int) -> None:
    """Set ``bit`` in the masks of keys ``ints``. O(len(ints)) dict updates."""
    get = holders.get
    holders.update(zip(ints, [get(k, 0) | bit for k in ints]))


def _drop(holders: Dict[int, int], ints: List[int], bit: int) -> None:
    """Clear ``bit`` in the masks of keys ``ints`` (held), deleting the keys left with none. O(len(ints))."""
    mask = ~bit
    left = [holders[k] & mask for k in ints]
    if any(left):
        holders.update((k, m) for k, m in zip(ints, left) if m)
        deque(map(holders.__delitem__, [k for k, m in zip(ints, left) if not m]), maxlen=0)
    else:
        deque(map(holders.__delitem__, ints), maxlen=0)


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
        ints = keys.tolist()
        _add(self._index._holders, ints, self._bit)
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
        _drop(self._index._holders, ints, self._bit)

    def cleared(self) -> None:
        """Every page left HBM (a reset, a crash). O(blocks)."""
        self.removed(np.flatnonzero(self._held).astype(np.int32))


class _LowerResidency:
    """One instance's lower tiers in the index (those named in the index's ``lower_tiers``): a residency
    observer of its tier stack (:meth:`~radixkv.tiers.stack.TierStack.add_observer`).

    As :class:`_Residency` with slots for blocks: per indexed tier a ``slot -> key`` array beside a
    ``held`` mask (a host tier's slots are its pool's block ids, below its capacity).
    """

    def __init__(self, index: "GlobalPageIndex", bit: int, tiers: Sequence[Tier]) -> None:
        self._index = index
        self._bit = bit
        self._slots: Dict[int, Tuple[np.ndarray, np.ndarray]] = {
            id(t): (np.zeros(t.capacity, dtype=np.uint64), np.zeros(t.capacity, dtype=bool)) for t in tiers}
        self.tiers = list(tiers)
        self.pages = 0
        """Pages of this instance's indexed lower tiers in the index now."""

    def lower_stored(self, node) -> None:
        """``node`` became a copy (the stack calls this): index it if its tier is indexed. O(its pages),
        or O(pages up to the nearest indexed copy above it) when its parent is none."""
        copy = node.ext
        arrays = self._slots.get(id(copy.tier))
        if arrays is None:
            return
        slot_key, held = arrays
        keys = self._index.node_keys(node, self._parent_key(node))
        slot_key[copy.slots] = keys
        held[copy.slots] = True
        ints = keys.tolist()
        _add(self._index._lower, ints, self._bit)
        self.pages += len(ints)

    def lower_removed(self, node) -> None:
        """``node``'s copy leaves its tier (the stack calls this before it goes). O(its pages)."""
        copy = node.ext
        arrays = self._slots.get(id(copy.tier))
        if arrays is None:
            return
        slot_key, held = arrays
        slots = copy.slots
        ints = slot_key[slots].tolist()
        held[slots] = False
        self.pages -= len(ints)
        _drop(self._index._lower, ints, self._bit)

    def _parent_key(self, node) -> Optional[int]:
        """The salted key of the page before ``node``'s first (``None``: it starts its namespace): read off the
        nearest indexed copy above it, then chained down the nodes between in one numpy pass."""
        above = []
        n = node.parent
        key: Optional[int] = None
        while n.parent is not None:
            ext = n.ext
            if isinstance(ext, Copy):
                arrays = self._slots.get(id(ext.tier))
                if arrays is not None and arrays[1][ext.slots[-1]]:
                    key = int(arrays[0][ext.slots[-1]])
                    break
            above.append(n)
            n = n.parent
        if not above:
            return key
        keys = self._index.keys
        salt = keys.salt(namespace_of(node))
        pb = keys.page_size * TOKEN_DTYPE.itemsize
        parts = []
        for a in reversed(above):  # each node's first page, then the rest of its own pages
            parts.append(a.first)
            rest = a.rest
            m = (a.num_pages - 1) * pb
            parts.append(rest if len(rest) == m else rest[:m])
        data = b"".join(parts)
        tokens = np.frombuffer(data, dtype=TOKEN_DTYPE)
        free = np.uint64(0) if key is None else np.uint64(key) ^ salt
        top = above[-1].start
        return int(keys.extend(tokens, top, len(tokens) // keys.page_size, free)[-1] ^ salt)


class GlobalPageIndex:
    """``page key -> instances holding it`` in HBM and in their host tiers, for the caches of one cluster.

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

    def __init__(self, page_size: int, lower_tiers: Sequence[str] = ("host",)) -> None:
        self.page_size = page_size
        self.keys = PrefixKeys(page_size)
        self.lower_tiers = tuple(lower_tiers)
        """Names of the lower tiers indexed beside HBM (a :class:`~radixkv.tiers.TieredCache`'s)."""
        self._holders: Dict[int, int] = {}
        self._lower: Dict[int, int] = {}
        self._members: List[Tuple[object, _Residency, Optional[_LowerResidency]]] = []

    def join(self, cache) -> int:
        """Index ``cache``'s HBM, and the lower tiers named in :attr:`lower_tiers` when it has them, from
        now on (the pages cached now included) as the next instance; return its instance number.
        O(cached pages)."""
        number = len(self._members)
        member = _Residency(self, 1 << number, cache.num_blocks)
        stack = _stack_of(cache)
        tiers = [t for t in stack.tiers if t.name in self.lower_tiers] if stack is not None else []
        lower = _LowerResidency(self, 1 << number, tiers) if tiers else None
        for node in cache.nodes():  # parents before children
            member.stored(node)
        cache.add_page_observer(member)
        if lower is not None:
            for node in stack.tree.nodes():  # parents before children
                if isinstance(node.ext, Copy):
                    lower.lower_stored(node)
            stack.add_observer(lower)
        self._members.append((cache, member, lower))
        return number

    def leave_all(self) -> None:
        """Stop indexing every cache (their observers go). O(instances)."""
        for cache, member, lower in self._members:
            cache.remove_page_observer(member)
            if lower is not None:
                _stack_of(cache).remove_observer(lower)
        self._members.clear()
        self._holders.clear()
        self._lower.clear()

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
        ``exclude`` hold, in HBM or an indexed lower tier, counting on from page ``start`` (the pages
        the serving instance has), and an instance that holds them all (``None`` when no page past
        ``start`` is held elsewhere: ``pages`` is then ``start``): the lowest-numbered one holding
        them all in HBM if any does, else the lowest-numbered one. O(pages passed) dict lookups,
        two per page while any lower tier holds pages.
        """
        holders, lower = self._holders, self._lower
        others = ~(1 << exclude)
        mask = hmask = 0
        d = start
        for key in keys[start:].tolist():
            hbm = holders.get(key, 0) & others
            held = (hbm | lower.get(key, 0)) & others if lower else hbm
            if d > start:
                held &= mask  # the instances holding every page from start through d
                hbm &= hmask
            if not held:
                break
            mask, hmask = held, hbm
            d += 1
        if d == start:
            return start, None
        pick = hmask or mask
        return d, (pick & -pick).bit_length() - 1

    def __len__(self) -> int:
        """Distinct pages held in some instance's HBM."""
        return len(self._holders)

    @property
    def lower_pages(self) -> int:
        """Distinct pages held in some instance's indexed lower tiers. O(1)."""
        return len(self._lower)

    def nbytes(self) -> int:
        """Bytes the index holds: its two dicts (slots, int keys and masks) and each instance's block and
        slot -> key arrays with their held masks. For the memory per indexed page. O(entries)."""
        total = 0
        for holders in (self._holders, self._lower):
            total += sys.getsizeof(holders)
            total += sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in holders.items())
        for _, member, lower in self._members:
            total += member._block_key.nbytes + member._held.nbytes
            if lower is not None:
                total += sum(keys.nbytes + held.nbytes for keys, held in lower._slots.values())
        return total

    def pages_by_instance(self) -> List[int]:
        """HBM pages each instance has in the index now."""
        return [member.pages for _, member, _ in self._members]

    def lower_pages_by_instance(self) -> List[int]:
        """Lower-tier pages each instance has in the index now."""
        return [0 if lower is None else lower.pages for _, _, lower in self._members]

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Recount the index from every instance's trees: it must equal the union of their HBM
        residency and of their indexed lower tiers', key by key (each key hashed again from the
        tokens). O(cached pages)."""
        expected: Dict[int, int] = {}
        expected_lower: Dict[int, int] = {}
        for number, (cache, member, lower) in enumerate(self._members):
            self._check_lower(number, cache, lower, expected_lower)
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
        assert self._lower == expected_lower, (
            f"index of {len(self._lower)} lower-tier pages differs from the instances' {len(expected_lower)}")

    def _check_lower(self, number: int, cache, lower: Optional[_LowerResidency], expected: Dict[int, int]) -> None:
        """Recount instance ``number``'s indexed lower-tier copies into ``expected`` and check its arrays."""
        stack = _stack_of(cache)
        tiers = [t for t in stack.tiers if t.name in self.lower_tiers] if stack is not None else []
        if lower is None:
            assert not tiers, f"instance {number}: lower tiers {[t.name for t in tiers]} not indexed"
            return
        assert [id(t) for t in tiers] == [id(t) for t in lower.tiers], f"instance {number}: indexed tiers changed"
        last: Dict[object, int] = {}
        count = 0
        seen = {id(t): np.zeros(t.capacity, dtype=bool) for t in tiers}
        for node in stack.tree.nodes():  # parents before children (placeholders too: they chain the keys)
            parent = node.parent
            keys = self.node_keys(node, last.get(parent) if parent.parent is not None else None).tolist()
            if keys:
                last[node] = keys[-1]
            ext = node.ext
            if not isinstance(ext, Copy) or id(ext.tier) not in lower._slots:
                continue
            slot_key, held = lower._slots[id(ext.tier)]
            for slot, key in zip(ext.slots.tolist(), keys):
                assert held[slot] and int(slot_key[slot]) == key, (
                    f"instance {number}: {ext.tier.name} slot {slot} indexed as {slot_key[slot]}, holds page {key}")
                seen[id(ext.tier)][slot] = True
                expected[key] = expected.get(key, 0) | (1 << number)
                count += 1
        assert lower.pages == count, f"instance {number}: {lower.pages} lower pages indexed, {count} held"
        for t in tiers:
            assert np.array_equal(lower._slots[id(t)][1], seen[id(t)]), f"instance {number}: stale {t.name} slot keys"


def _stack_of(cache):
    """The tier stack below ``cache``'s HBM (a :class:`~radixkv.tiers.TieredCache`'s), or ``None``."""
    layer = getattr(cache, "lower", None)
    return getattr(layer, "stack", None)

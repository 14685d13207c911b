"""Which tenants' partitions of one cache hold each page: where a copy can come from.

Under a sharing rule that shares by copy (:attr:`radixkv.tenancy.Sharing.copies`) every tenant
keeps its pages in a partition of its own (a tree root keyed ``(namespace, tenant)``), so the same
page may be cached once per tenant. A :class:`CopyIndex` is a page observer of the cache that
keeps, for each page identity (the 64-bit key of its token prefix, salted by its namespace but
not its tenant: :class:`~radixkv.page_keys.PrefixKeys`), the partitions holding it in HBM, in the
order they cached it. :meth:`holders` then finds how far other partitions hold a request past
its own, and which one holds all of it, in one dict lookup per page: a partition's pages are
prefix-closed, so a holder of page ``d`` holds every page before it.

Cost: one dict update per page entering or leaving HBM, a request's keys once (a few numpy
calls). Memory: one dict entry per distinct page plus one per extra copy, and 17 bytes per block.
Two different prefixes share a key with probability about ``2**-64`` per pair: a copy is then
refused or made of the wrong prefix's pages, which is why :meth:`holders` only proposes, and the
engine copies only pages it finds under the request's own tokens in the source partition.
"""

from __future__ import annotations

from collections import deque
from typing import Dict, Hashable, List, Optional, Tuple

import numpy as np

from . import extents
from .keys import TOKEN_DTYPE
from .page_keys import PrefixKeys
from .tree import Node, namespace_of

__all__ = ["CopyIndex"]


def namespace_part(partition: Hashable) -> Optional[str]:
    """The namespace of a partition key: ``(namespace, tenant)``, or a namespace itself."""
    return partition[0] if isinstance(partition, tuple) else partition


class CopyIndex:
    """``page key -> partitions holding it`` for one cache (see the module doc)."""

    def __init__(self, num_blocks: int, page_size: int) -> None:
        self.page_size = page_size
        self.keys = PrefixKeys(page_size)
        self._holders: Dict[int, Dict[Hashable, None]] = {}
        self._block_key = np.zeros(num_blocks, dtype=np.uint64)
        self._held = np.zeros(num_blocks, dtype=bool)
        self._block_partition: List[Hashable] = [None] * num_blocks
        self._expected: Optional[np.ndarray] = None

    def request_keys(self, data: bytes, num_pages: int, namespace: Optional[str]) -> np.ndarray:
        """Keys (``uint64``) of the first ``num_pages`` pages of the key bytes ``data`` in ``namespace``. O(tokens)."""
        return self.keys.keys(np.frombuffer(data, dtype=TOKEN_DTYPE, count=num_pages * self.page_size),
                              num_pages, namespace)

    def expect(self, keys: Optional[np.ndarray]) -> None:
        """Pages stored until the next call are the request's with ``keys`` (none hashed again). O(1)."""
        self._expected = keys

    # ------------------------------------------------------------------ the observer's calls
    def stored(self, leaf: Node) -> None:
        """``leaf``'s pages entered HBM. O(pages)."""
        partition = namespace_of(leaf)
        end = leaf.start + leaf.num_pages
        expected = self._expected
        if expected is not None and end <= len(expected):
            keys = expected[leaf.start:end]
        else:
            keys = self.node_keys(leaf, partition)
        blocks = extents.to_array(leaf.parts)
        self._block_key[blocks] = keys
        self._held[blocks] = True
        block_partition = self._block_partition
        for block in blocks.tolist():
            block_partition[block] = partition
        holders = self._holders
        for key in keys.tolist():
            held = holders.get(key)
            if held is None:
                holders[key] = {partition: None}
            else:
                held[partition] = None

    def node_keys(self, node: Node, partition: Hashable) -> np.ndarray:
        """Keys of ``node``'s pages, chained on its parent's last page. O(pages) numpy."""
        parent = node.parent
        parent_key = None if parent.parent is None else int(self._block_key[parent.last_block])
        return self.keys.node_keys(node, parent_key, namespace_part(partition))

    def removed(self, blocks: np.ndarray) -> None:
        """Cached ``blocks`` leave HBM. O(len(blocks))."""
        held = self._held[blocks]
        if not held.all():
            blocks = blocks[held]
        if not len(blocks):
            return
        keys = self._block_key[blocks].tolist()
        self._held[blocks] = False
        block_partition = self._block_partition
        holders = self._holders
        gone = []
        for block, key in zip(blocks.tolist(), keys):
            partition, block_partition[block] = block_partition[block], None
            held = holders[key]
            del held[partition]
            if not held:
                gone.append(key)
        deque(map(holders.__delitem__, gone), maxlen=0)

    def cleared(self) -> None:
        """Every page left HBM. O(blocks)."""
        self._holders.clear()
        self._held[:] = False
        self._block_partition = [None] * len(self._block_partition)

    # ------------------------------------------------------------------ queries
    def holders(self, keys: np.ndarray, start: int, exclude: Hashable) -> Tuple[int, Optional[Hashable]]:
        """``(end, partition)``: other partitions than ``exclude`` hold pages ``start..end`` of the
        request with ``keys``, and ``partition`` (the first to cache them) holds all of them;
        ``(start, None)`` when none holds page ``start``. O(pages passed) dict lookups."""
        holders = self._holders
        candidates: Optional[List[Hashable]] = None
        end = start
        for key in keys[start:].tolist():
            held = holders.get(key)
            if held is None:
                break
            found = [p for p in (held if candidates is None else candidates) if p in held and p != exclude]
            if not found:
                break
            candidates = found
            end += 1
        return (end, candidates[0]) if candidates else (start, None)

    def check(self, nodes_by_partition) -> None:
        """Recount from the tree: ``nodes_by_partition`` yields ``(partition, node)`` for every cached
        node, parents before children. O(cached pages)."""
        expected: Dict[int, Dict[Hashable, None]] = {}
        count = 0
        last: Dict[Node, int] = {}
        for partition, node in nodes_by_partition:
            parent = node.parent
            keys = self.keys.node_keys(node, None if parent.parent is None else last[parent],
                                       namespace_part(partition))
            last[node] = int(keys[-1])
            for block, key in zip(extents.id_list(node.parts), keys.tolist()):
                assert self._held[block] and int(self._block_key[block]) == key, (
                    f"copy index: block {block} of {partition!r} indexed as {self._block_key[block]}, holds {key}")
                assert self._block_partition[block] == partition, f"copy index: block {block}'s partition"
                expected.setdefault(key, {})[partition] = None
                count += 1
        assert int(self._held.sum()) == count, "copy index: blocks indexed that are not cached"
        assert {k: set(v) for k, v in self._holders.items()} == {k: set(v) for k, v in expected.items()}, (
            "copy index: holders differ from the tree")

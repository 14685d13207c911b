"""The evictable-leaf queue: a binary heap with lazy invalidation.

Each evictable leaf has at most one live entry. Re-ranking a leaf pushes a
new entry and orphans the old one (the node's ``heap_id`` no longer matches),
so every operation is O(log n) with no search; orphaned entries are skipped
when they surface and the heap is rebuilt once they outnumber live ones.

Entries are flat tuples ``(*key, entry_id, node)`` rather than
``(key, entry_id, node)``: at a million leaves heap operations are bound by
memory latency, and one less object to dereference per comparison makes
eviction about 1.5x faster there.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterator, List, Optional, Tuple

from .tree import Node

Entry = Tuple[Any, ...]  # (*key, entry_id, node)


class VictimQueue:
    """Min-queue of evictable leaves ordered by an engine-supplied key."""

    __slots__ = ("_heap", "_live", "_next_id")

    def __init__(self) -> None:
        self._heap: List[Entry] = []
        self._live = 0
        self._next_id = 1

    def __len__(self) -> int:
        """Live entries (evictable leaves). O(1)."""
        return self._live

    def push(self, node: Node, key: Tuple[Any, ...]) -> None:
        """Enter ``node`` with ``key`` (a tuple), replacing any entry it had. O(log n)."""
        if node.heap_id == 0:
            self._live += 1
        entry_id = self._next_id
        self._next_id = entry_id + 1
        node.heap_id = entry_id
        heapq.heappush(self._heap, key + (entry_id, node))
        if len(self._heap) > 64 and len(self._heap) > 3 * self._live:
            self._compact()

    def discard(self, node: Node) -> None:
        """Drop ``node``'s entry if it has one. O(1)."""
        if node.heap_id:
            node.heap_id = 0
            self._live -= 1

    def peek(self) -> Optional[Node]:
        """The leaf with the smallest key, without removing it. Amortized O(log n)."""
        heap = self._heap
        while heap:
            entry = heap[0]
            node = entry[-1]
            if node.heap_id == entry[-2]:
                return node
            heapq.heappop(heap)
        return None

    def peek_key(self) -> Any:
        """Key of :meth:`peek`'s leaf (``None`` when empty)."""
        return self._heap[0][:-2] if self.peek() is not None else None

    def entries(self) -> Iterator[Tuple[Any, Node]]:
        """Live ``(key, node)`` pairs in no particular order (for checks)."""
        for entry in self._heap:
            if entry[-1].heap_id == entry[-2]:
                yield entry[:-2], entry[-1]

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if e[-1].heap_id == e[-2]]
        heapq.heapify(self._heap)

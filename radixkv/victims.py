"""The evictable-leaf queue: a binary heap with lazy invalidation.

Each evictable leaf has at most one live entry. Re-ranking a leaf pushes a
new entry and orphans the old one (the node's ``heap_id`` no longer matches),
so every operation is O(log n) with no search; orphaned entries are skipped
when they surface and the heap is rebuilt once they outnumber live ones.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterator, List, Optional, Tuple

from .tree import Node

Entry = Tuple[Any, int, Node]


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

    def push(self, node: Node, key: Any) -> None:
        """Enter ``node`` with ``key``, replacing any entry it had. O(log n)."""
        if node.heap_id == 0:
            self._live += 1
        entry_id = self._next_id
        self._next_id = entry_id + 1
        node.heap_id = entry_id
        heapq.heappush(self._heap, (key, entry_id, node))
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
            _, entry_id, node = heap[0]
            if node.heap_id == entry_id:
                return node
            heapq.heappop(heap)
        return None

    def peek_key(self) -> Any:
        """Key of :meth:`peek`'s leaf (``None`` when empty)."""
        return self._heap[0][0] if self.peek() is not None else None

    def entries(self) -> Iterator[Tuple[Any, Node]]:
        """Live ``(key, node)`` pairs in no particular order (for checks)."""
        for key, entry_id, node in self._heap:
            if node.heap_id == entry_id:
                yield key, node

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if e[2].heap_id == e[1]]
        heapq.heapify(self._heap)

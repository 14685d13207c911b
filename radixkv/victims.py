"""The evictable-leaf queue (a sorted run plus a binary heap, with lazy invalidation), its key, and the victim loop.

Each evictable leaf has at most one live entry, which its ``heap_id`` slot
points to. Re-ranking a leaf pushes a new entry and orphans the old one (the
node no longer points to it), so no operation searches; orphans are skipped
when they surface and both parts are rebuilt once orphans outnumber live
entries. Re-ranking a leaf at the key it already has changes nothing: its
entry stands, with its place among equal keys (a split leaves the lower part's
rank as it was, and re-queueing it would cost a heap push at a stale key).

Most pushes carry the largest key so far: recency and FIFO-like policies rank
a leaf by the clock at its last use, and the clock only grows. Such a push is
appended to a sorted *run* (a deque, in order by construction) in O(1). A
push smaller than the run's live head (a leaf re-ranked as it is evicted, a
parent left childless) is prepended to it, also O(1); only a push that falls
inside the run goes to the heap. The smallest entry is the smaller of the
run's head and the heap's top. At a million leaves every heap level is a
cache miss, so a leaf that passes through the run costs a few memory
accesses where a heap pop costs ~20 levels of them. The order of entries,
and so the eviction order, is exactly that of a single heap.

Entries are flat tuples ``(*key, entry_id, node)`` rather than
``(key, entry_id, node)``: one less object to dereference per comparison.
Ids grow with every push, so two entries never compare equal and ties on the
key go to the older entry.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Callable, Deque, Iterator, List, Optional, Tuple

from .errors import ArgumentTypeError, ArgumentValueError
from .tree import Node

Entry = Tuple[Any, ...]  # (*key, entry_id, node)


class VictimQueue:
    """Min-queue of evictable leaves ordered by an engine-supplied key."""

    __slots__ = ("_run", "_heap", "_live", "_next_id")

    def __init__(self) -> None:
        self._run: Deque[Entry] = deque()  # ascending: pushed at either end only in order
        self._heap: List[Entry] = []  # the pushes that fell inside the run's range
        self._live = 0
        self._next_id = 1

    def __len__(self) -> int:
        """Live entries (evictable leaves). O(1)."""
        return self._live

    def push(self, node: Node, key: Tuple[Any, ...]) -> None:
        """Enter ``node`` with ``key`` (a tuple), replacing any entry it had.

        O(1) when ``key`` is above every key in the run or below its live head, else O(log n).
        """
        current = node.heap_id
        if current:
            if current[:-2] == key:  # already queued at this rank
                return
        else:
            self._live += 1
        entry_id = self._next_id
        self._next_id = entry_id + 1
        entry = key + (entry_id, node)
        node.heap_id = entry
        run, heap = self._run, self._heap
        if not run or run[-1] < entry:
            run.append(entry)
        else:
            while run and run[0][-1].heap_id is not run[0]:  # orphans at the head: peek drops them anyway
                run.popleft()
            if not run or entry < run[0]:
                run.appendleft(entry)
            elif heap and heap[0][-1].heap_id is not heap[0]:  # an orphan on top: one sift, not two
                heapq.heapreplace(heap, entry)
            else:
                heapq.heappush(heap, entry)
        if len(run) + len(heap) > 3 * self._live + 64:
            self._compact()

    def discard(self, node: Node) -> None:
        """Drop ``node``'s entry if it has one. O(1)."""
        if node.heap_id:
            node.heap_id = 0
            self._live -= 1

    def head(self) -> Optional[Entry]:
        """The live entry ``(*key, entry_id, node)`` with the smallest key, without removing it
        (``None`` when empty). Amortized O(log n).

        Orphans that surfaced at the run's head or the heap's top are dropped first.
        """
        run, heap = self._run, self._heap
        while run and run[0][-1].heap_id is not run[0]:
            run.popleft()
        while heap and heap[0][-1].heap_id is not heap[0]:
            heapq.heappop(heap)
        if heap and (not run or heap[0] < run[0]):
            return heap[0]
        return run[0] if run else None

    def peek(self) -> Optional[Node]:
        """The leaf with the smallest key, without removing it. Amortized O(log n)."""
        entry = self.head()
        return None if entry is None else entry[-1]

    def peek_key(self) -> Any:
        """Key of :meth:`peek`'s leaf (``None`` when empty)."""
        entry = self.head()
        return None if entry is None else entry[:-2]

    def entries(self) -> Iterator[Tuple[Any, Node]]:
        """Live ``(key, node)`` pairs in no particular order (for checks)."""
        for part in (self._run, self._heap):
            for entry in part:
                if entry[-1].heap_id is entry:
                    yield entry[:-2], entry[-1]

    def _compact(self) -> None:
        self._run = deque(e for e in self._run if e[-1].heap_id is e)
        self._heap = [e for e in self._heap if e[-1].heap_id is e]
        heapq.heapify(self._heap)


class LaneQueue:
    """A victim queue split into lanes, for a policy that chooses its victim among the lanes' heads.

    The policy (``lanes >= 1``, see :class:`~radixkv.policies.EvictionPolicy`)
    puts each leaf in a lane (``policy.lane(node)``, read whenever the leaf is
    ranked, like its priority); every lane is a queue of its own (``make``:
    :class:`VictimQueue` or a tier's subclass), ordered by the usual key. The
    head is the head of one lane: among the lanes' heads of the lowest retention
    class, the one ``policy.choose(nodes)`` picks. This lets a policy compare
    its classes' oldest pages by a score that moves with their age (hit
    density now), which one static key cannot.

    Entries are ``(*key, lane, entry_id, node)``: the lane sits after the key,
    so it orders nothing within a lane and names the lane to leave on a
    discard or a move. Cost: a lane's push and discard as
    :class:`VictimQueue`'s; :meth:`head` O(lanes + log n) amortized.
    """

    __slots__ = ("_lanes", "_lane", "_choose", "_sizes", "_busy")

    def __init__(self, policy: Any, make: Callable[[], VictimQueue] = VictimQueue) -> None:
        self._lanes = [make() for _ in range(policy.lanes)]
        self._lane = policy.lane
        self._choose = policy.choose
        self._sizes = [0] * policy.lanes
        self._busy: dict = {}  # lanes holding a live entry (insertion-ordered: head() visits only these)

    def __len__(self) -> int:
        """Live entries (evictable leaves). O(lanes)."""
        return sum(self._sizes)

    def _gain(self, lane: int) -> None:
        self._sizes[lane] += 1
        if self._sizes[lane] == 1:
            self._busy[lane] = None

    def _lose(self, lane: int) -> None:
        self._sizes[lane] -= 1
        if not self._sizes[lane]:
            del self._busy[lane]

    def push(self, node: Node, key: Tuple[Any, ...]) -> None:
        """Enter ``node`` with ``key`` in the lane the policy gives it, leaving its old lane. As :meth:`VictimQueue.push`."""
        lane = self._lane(node)
        current = node.heap_id
        if not current:
            self._gain(lane)
        elif current[-3] != lane:
            self._lanes[current[-3]].discard(node)
            self._lose(current[-3])
            self._gain(lane)
        self._lanes[lane].push(node, key + (lane,))

    def discard(self, node: Node) -> None:
        """Drop ``node``'s entry if it has one. O(1)."""
        current = node.heap_id
        if current:
            self._lanes[current[-3]].discard(node)
            self._lose(current[-3])

    def head(self) -> Optional[Entry]:
        """The entry of the leaf the policy chooses among the heads of the lanes that hold one, of the
        lowest retention class (``None`` when empty). O(busy lanes + log n) amortized, plus ``choose``."""
        lanes = self._lanes
        heads = [lanes[i].head() for i in self._busy]
        if len(heads) > 1:
            lowest = min(e[0] for e in heads)
            heads = [e for e in heads if e[0] == lowest]
            if len(heads) > 1:
                return heads[self._choose([e[-1] for e in heads])]
        return heads[0] if heads else None

    peek = VictimQueue.peek  # the leaf head() chooses, without removing it

    def peek_key(self) -> Any:
        """Key of :meth:`peek`'s leaf (``None`` when empty)."""
        entry = self.head()
        return None if entry is None else entry[:-3]

    def entries(self) -> Iterator[Tuple[Any, Node]]:
        """Live ``(key, node)`` pairs in no particular order (for checks); a leaf found in a lane other
        than the one the policy gives it raises ``AssertionError``."""
        for lane, q in enumerate(self._lanes):
            for key, node in q.entries():
                assert key[-1] == lane == self._lane(node), f"{node} queued in lane {lane}, not its own"
                yield key[:-1], node


def make_queue(policy: Any, make: Callable[[], VictimQueue] = VictimQueue) -> Any:
    """The victim queue for ``policy``: ``make()`` (one queue, the usual case, at no extra cost), or a
    :class:`LaneQueue` of them when the policy has lanes (``policy.lanes >= 1``). O(lanes)."""
    lanes = getattr(policy, "lanes", 0)
    if lanes.__class__ is not int:
        raise ArgumentTypeError(f"{type(policy).__name__}.lanes must be an int, got {lanes!r}")
    if lanes < 0:
        raise ArgumentValueError(f"{type(policy).__name__}.lanes must be >= 0, got {lanes}")
    return LaneQueue(policy, make) if lanes else make()


DEPTH_BASE = 256
"""See :func:`rank_key`: the depth term is ``DEPTH_BASE - end`` rather than ``-end``."""


def rank_key(priority: Callable[[Node], Any], node: Node) -> Tuple[Any, ...]:
    """``node``'s key in a victim queue ranked by the policy method ``priority``: retention class,
    then priority, then deepest page first.

    Every queue (HBM's and each lower tier's) uses this key, so a policy ranks
    the same way wherever it runs. Depth enters as ``DEPTH_BASE - end``: the
    order of ``-end``, but for the usual depths the value is one of CPython's
    preallocated small ints, which saves an int object per queued node. O(priority).
    """
    return (node.retention, priority(node), DEPTH_BASE - node.start - node.num_pages)


def rank(queue: Any, node: Node, priority: Callable[[Node], Any], waiting: dict) -> None:
    """Queue ``node`` at its :func:`rank_key` (HBM's and every tier's ranking).

    If the policy raises (``priority``, or a lane queue's ``lane``, both before the queue
    changes), the node's entry goes (it is at a rank no longer its own), the node waits in
    ``waiting`` for its owner to rank it again before the next eviction, and the error
    propagates: no evictable node is lost track of. O(log n).
    """
    try:
        queue.push(node, rank_key(priority, node))
    except BaseException:
        queue.discard(node)
        waiting[node] = None
        raise
    if waiting:
        waiting.pop(node, None)


def rank_waiting(waiting: dict, rank: Callable[[Node], None], queueable: Callable[[Node], bool]) -> None:
    """Rank again the nodes :func:`rank` left in ``waiting`` (their policy raised), those still
    ``queueable``, before an eviction; raises again for one whose policy still raises (it and
    the rest keep waiting). O(waiting) rankings."""
    for node in list(waiting):
        del waiting[node]
        if queueable(node):
            rank(node)


def evict(queue: VictimQueue, policy: Any, n: int, requeue: Callable[[Node], None],
          take: Callable[[Node, int, Any], None]) -> int:
    """The victim loop: take ``n`` pages (fewer if the queue runs dry) from the lowest-ranked nodes of ``queue``.

    The one loop HBM and every lower tier evict with. Per victim: the policy's
    optional ``on_victim(node)`` says how many tail pages may go at the node's
    rank (``0`` spares it: the policy raised its rank, ``requeue(node)``
    re-queues it and the loop looks again; ``None`` on the policy: every
    page may go); then ``take(node, k, rank)`` must remove the node's last
    ``k`` pages and re-queue or discard what is left of it, ``rank`` being
    the policy priority the node was queued with (for the policy's
    :meth:`~radixkv.policies.EvictionPolicy.on_evict`). Returns the pages
    taken. Cost: O(log n) per victim and per spare, amortized, plus ``take``.
    """
    on_victim = policy.on_victim
    head = queue.head
    taken = 0
    while taken < n:
        entry = head()
        if entry is None:
            break
        node = entry[-1]
        k = node.num_pages
        if on_victim is not None:
            run = on_victim(node)
            if run <= 0:
                requeue(node)
                continue
            if run < k:
                k = run
        if k > n - taken:
            k = n - taken
        take(node, k, entry[1])
        taken += k
    return taken

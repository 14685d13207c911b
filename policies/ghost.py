"""A bounded history of evicted runs, keyed per namespace: the one ghost of every policy that has one.

An eviction cuts a chain at one page, and a later request that shares the
chain misses exactly there; so one entry per evicted *run* (a leaf's tail
pages evicted together) is keyed by :func:`~.base.history_key` of the run's
first page (namespace, depth, token bytes) and holds the policy's record of
the run plus its length. :meth:`RunHistory.recall` follows a new chain through
the runs evicted one after another from deeper in it.

Bound: at most ``max_pages`` remembered pages (the sum of the runs'
lengths) and at most ``max_runs`` runs, oldest run forgotten first. An
entry is an int key (a ``(namespace, int)`` tuple outside the default
namespace), a 2-tuple value and one ``OrderedDict`` link: about 200 bytes of
Python objects, whatever the run's length. Cost: O(1) per remembered run,
O(runs recalled) per admission (plus the hash of one page per run).

An ``OrderedDict`` rather than ``cachetools.FIFOCache``: the same bounded
FIFO map, but cachetools keeps three dicts per entry (value, size, order)
where this keeps one, and remembering a run costs about twice as long
through it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable, List, Optional, Tuple

from radixkv.errors import ArgumentValueError
from radixkv.keys import TOKEN_BYTES
from radixkv.tree import Node, namespace_of

from .base import EvictionPolicy, history_key


_UNBOUNDED = 1 << 62


class RunHistory:
    """Evicted runs: ``history_key`` of the first page -> (record, pages), oldest first.

    Remembering a key again replaces its run (the old one is forgotten) and
    makes it the newest.

    Args:
        max_pages: bound on the pages of the runs remembered (>= 1), or ``None``.
        on_forget: called with ``(record, pages)`` when a run is dropped to stay within a bound.
        max_runs: bound on the runs remembered (>= 1), or ``None``.
    """

    def __init__(self, max_pages: Optional[int], on_forget: Optional[Callable[[Any, int], None]] = None,
                 max_runs: Optional[int] = None) -> None:
        for what, bound in (("history size", max_pages), ("history runs", max_runs)):
            if bound is not None and (bound.__class__ is not int or bound < 1):
                raise ArgumentValueError(f"{what} must be an int >= 1, got {bound!r}")
        self.max_pages = max_pages
        self.max_runs = max_runs
        self._bounds = (_UNBOUNDED if max_pages is None else max_pages, _UNBOUNDED if max_runs is None else max_runs)
        self.pages = 0
        self._runs: "OrderedDict[Hashable, Tuple[Any, int]]" = OrderedDict()
        self._on_forget = on_forget

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._runs

    def remember(self, node: Node, depth: int, run_end: int, record: Any) -> None:
        """Remember the run of ``node``'s pages ``depth .. run_end`` (at least one page) with ``record``.

        The oldest runs past a bound are dropped. O(1) amortized: one dict operation when the
        key is new and no bound is passed, plus the key (a walk to the root, one page hash).
        """
        key = history_key(namespace_of(node), depth, node.page(depth - node.start))
        pages = run_end - depth if run_end > depth else 1
        runs = self._runs
        entry = (record, pages)
        old = runs.setdefault(key, entry)
        if old is not entry:  # remembered again: the old run is forgotten, the new one is the newest
            self._drop(old)
            runs[key] = entry
            runs.move_to_end(key)
        self.pages += pages
        max_pages, max_runs = self._bounds
        while self.pages > max_pages or len(runs) > max_runs:
            self._drop(runs.popitem(last=False)[1])

    def pop(self, key: Hashable) -> Optional[Tuple[Any, int]]:
        """Take the run remembered under ``key`` (``(record, pages)``; ``None`` if none), not as forgotten."""
        entry = self._runs.pop(key, None)
        if entry is not None:
            self.pages -= entry[1]
        return entry

    def _drop(self, entry: Tuple[Any, int]) -> None:
        self.pages -= entry[1]
        if self._on_forget is not None:
            self._on_forget(*entry)

    def recall(self, node_parent: Node, num_pages: int, pages: memoryview,
               page_bytes: int) -> List[Tuple[Any, int, int]]:
        """Pop the runs that the ``num_pages`` new pages below ``node_parent`` start with, in chain order.

        ``pages`` holds the new pages' token bytes (``page_bytes`` each). Each
        run is returned as ``(record, pages it covers among the new ones, pages it was remembered with)``.
        """
        start = end = node_parent.end
        namespace = namespace_of(node_parent)
        found = []
        runs = self._runs
        while end < start + num_pages:
            offset = (end - start) * page_bytes
            entry = runs.pop(history_key(namespace, end, bytes(pages[offset : offset + page_bytes])), None)
            if entry is None:
                break
            self.pages -= entry[1]
            covered = min(entry[1], start + num_pages - end)
            found.append((entry[0], covered, entry[1]))
            end += covered
        return found


class GhostPolicy(EvictionPolicy):
    """Plumbing of a policy whose leaves hold two parts: pages a ghost recognized (the head) and fresh ones.

    ``admit`` recalls the runs the new pages start with and holds (:meth:`hold`),
    for the ``on_insert`` of the same admission (same parent, same clock), the
    depth where the recognized pages end (the *boundary*) and the recalled
    records; a node inserted otherwise (a tier's load-back, or after an
    admission that cached nothing) finds nothing held and is all fresh.
    Subclasses implement :meth:`recalled`, :meth:`forget_run` and ``on_evict``.

    Args:
        history_size: pages of evicted runs the ghost remembers; ``None``:
            ``history_factor`` times the cache's capacity.
    """

    history_factor = 4

    def __init__(self, history_size: Optional[int] = None) -> None:
        if history_size is not None and (history_size.__class__ is not int or history_size < 1):
            raise ArgumentValueError(f"history_size must be None or an int >= 1, got {history_size!r}")
        self.history_size = history_size
        self.history = self.new_history(1 << 16)  # replaced at attach, sized by the cache
        self._page_bytes = TOKEN_BYTES
        self._capacity = 1
        self._pending: Tuple[Optional[Node], int, Any] = (None, -1, None)
        self._now = 0
        self._cache: Any = None

    def new_history(self, capacity: int) -> RunHistory:
        """The ghost for a cache of ``capacity`` pages: ``history_size`` pages, or ``history_factor x capacity``."""
        return RunHistory(self.history_size or self.history_factor * capacity, self.forget_run)

    def now(self) -> int:
        """The cache's clock (a lower tier's: the time of the last hook). O(1)."""
        return self._now if self._cache is None else max(self._now, self._cache.clock)

    def attach(self, cache: Any) -> None:
        self._page_bytes = cache.page_size * TOKEN_BYTES
        self._capacity = cache.num_blocks
        self._cache = cache if hasattr(type(cache), "clock") else None  # a tier's scope has no clock
        self.history = self.new_history(cache.num_blocks)

    def admit(self, node_parent: Node, num_pages: int, now: int, pages: memoryview) -> int:
        self._now = now
        runs = self.history.recall(node_parent, num_pages, pages, self._page_bytes)
        boundary = node_parent.end
        for run in runs:
            boundary += run[1]
        self.hold(node_parent, now, (boundary, runs))
        if runs:
            self.recalled(runs, now)
        return num_pages

    def recalled(self, runs: List[Tuple[Any, int, int]], now: int) -> None:
        """The ghost recognized ``runs`` (as :meth:`RunHistory.recall` returns them, chain order) at ``now`` (nothing to do by default)."""

    def hold(self, node_parent: Node, now: int, note: Any) -> None:
        """Keep ``note`` for the ``on_insert`` of the node this admission (below ``node_parent`` at ``now``) caches."""
        self._pending = (node_parent, now, note)

    def take_pending(self, node: Node, now: int) -> Any:
        """The note held by the admission that cached ``node`` (``None`` if none did); it is used up. O(1)."""
        parent, when, note = self._pending
        self._pending = (None, -1, None)
        return note if parent is node.parent and when == now else None

    def forget_run(self, record: Any, pages: int) -> None:
        """A remembered run was dropped to keep the ghost bounded."""

"""A bounded history of evicted runs, keyed per namespace: the ghost that ARC, LIRS and hit density share.

An eviction cuts a chain at one page, and a later request that shares the
chain misses exactly there; so one entry per evicted *run* (a leaf's tail
pages evicted together) is keyed by :func:`~.base.history_key` of the run's
first page (namespace, depth, token bytes) and holds the policy's record of
the run plus its length. :meth:`RunHistory.recall` follows a new chain through
the runs evicted one after another from deeper in it.

Bound: at most ``max_pages`` remembered pages (the sum of the runs'
lengths), oldest run forgotten first, so at most ``max_pages`` entries. An
entry is an int key (a ``(namespace, int)`` tuple outside the default
namespace), a 2-tuple value and one ``OrderedDict`` link: about 200 bytes of
Python objects, whatever the run's length. Cost: O(1) per remembered run,
O(runs recalled) per admission (plus the hash of one page per run).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable, List, Optional, Tuple

from radixkv.errors import ArgumentValueError
from radixkv.keys import TOKEN_BYTES
from radixkv.tree import Node, namespace_of

from .base import EvictionPolicy, history_key


class RunHistory:
    """Evicted runs: ``history_key`` of the first page -> (record, pages).

    Args:
        max_pages: bound on the pages of the runs remembered (>= 1).
        on_forget: called with ``(record, pages)`` when a run is dropped to stay within the bound.
    """

    def __init__(self, max_pages: int, on_forget: Optional[Callable[[Any, int], None]] = None) -> None:
        if max_pages.__class__ is not int or max_pages < 1:
            raise ArgumentValueError(f"history size must be an int >= 1, got {max_pages!r}")
        self.max_pages = max_pages
        self.pages = 0
        self._runs: "OrderedDict[Hashable, Tuple[Any, int]]" = OrderedDict()
        self._on_forget = on_forget

    def __len__(self) -> int:
        return len(self._runs)

    def remember(self, node: Node, depth: int, run_end: int, record: Any) -> None:
        """Remember the run of ``node``'s pages ``depth .. run_end`` (at least one page) with ``record``."""
        pages = max(1, run_end - depth)
        key = history_key(namespace_of(node), depth, node.page(depth - node.start))
        runs = self._runs
        old = runs.pop(key, None)
        if old is not None:
            self._drop(old)
        runs[key] = (record, pages)
        self.pages += pages
        while self.pages > self.max_pages:
            self._drop(runs.popitem(last=False)[1])

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

    ``admit`` recalls the runs the new pages start with and keeps, for the
    ``on_insert`` of the same admission, the depth where the recognized pages
    end (the *boundary*) and the recalled records; a node inserted otherwise
    (a tier's load-back) is all fresh. ``on_evict`` notes where the evicted
    run ends, so ``on_truncate``/``on_remove`` know which pages went.
    Subclasses implement :meth:`recalled` and :meth:`forget_run`.

    Args:
        history_size: pages of evicted runs the ghost remembers; ``None``:
            ``history_factor`` times the cache's capacity.
    """

    history_factor = 4

    def __init__(self, history_size: Optional[int] = None) -> None:
        if history_size is not None and (history_size.__class__ is not int or history_size < 1):
            raise ArgumentValueError(f"history_size must be None or an int >= 1, got {history_size!r}")
        self.history_size = history_size
        self.history = RunHistory(history_size or 1 << 16, self.forget_run)
        self._page_bytes = TOKEN_BYTES
        self._capacity = 1
        self._pending: Tuple[Optional[Node], int, int, list] = (None, 0, -1, [])
        self._evicting_end = 0
        self._now = 0
        self._cache: Any = None

    def now(self) -> int:
        """The cache's clock (a lower tier's: the time of the last hook). O(1)."""
        return self._now if self._cache is None else max(self._now, self._cache.clock)

    def attach(self, cache: Any) -> None:
        self._page_bytes = cache.page_size * TOKEN_BYTES
        self._capacity = cache.num_blocks
        self._cache = cache if hasattr(type(cache), "clock") else None  # a tier's scope has no clock
        self.history = RunHistory(self.history_size or self.history_factor * cache.num_blocks, self.forget_run)

    def admit(self, node_parent: Node, num_pages: int, now: int, pages: memoryview) -> int:
        self._now = now
        runs = self.history.recall(node_parent, num_pages, pages, self._page_bytes)
        boundary = node_parent.end + sum(run[1] for run in runs)
        self._pending = (node_parent, boundary, now, runs)
        self.recalled(runs, now)
        return num_pages

    def recalled(self, runs: List[Tuple[Any, int, int]], now: int) -> None:
        """The ghost recognized ``runs`` (as :meth:`RunHistory.recall` returns them, chain order) at ``now`` (nothing to do by default)."""

    def take_pending(self, node: Node, now: int) -> Tuple[int, list]:
        """``(boundary, runs)`` of the admission that cached ``node``; ``(node.start, [])`` if none did."""
        parent, boundary, when, runs = self._pending
        self._pending = (None, 0, -1, [])
        if parent is not node.parent or when != now:
            return node.start, []
        return boundary, runs

    def on_evict(self, node: Node, priority: object) -> None:
        self._evicting_end = node.end

    def gone_run(self, node: Node, truncated: bool) -> Tuple[int, int]:
        """Depths ``(first, end)`` of the pages ``node`` just lost: in ``on_truncate`` an evicted tail run,
        in ``on_remove`` the last run evicted (or all its pages if it was dropped otherwise, e.g. reset)."""
        if truncated:
            return node.end, self._evicting_end
        return node.start, node.end if node.num_pages else self._evicting_end

    def forget_run(self, record: Any, pages: int) -> None:
        """A remembered run was dropped to keep the ghost bounded."""

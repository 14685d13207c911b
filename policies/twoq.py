"""2Q with a ghost history: pages that proved reusable outrank first uses for a learned window.

**Rule.** A page is *probationary* until it is used again, then *protected*.
A leaf is ranked by a deadline: probationary ``last use``, protected
``last use + W``; the earliest deadline is evicted first (ties: deepest
page). So first uses go before any protected page used within the last
``W`` ticks, and among themselves both segments are LRU.

**Ghost.** Most reuse gaps on prefix-cache traces are longer than the time
an LRU cache keeps a page, so a page's second use usually comes after it
was evicted. The policy remembers the last ``history_size`` evicted runs,
keyed by the namespace, depth and tokens of each run's first page (an
eviction cuts a chain at exactly that page, and a later request that shares
the chain misses exactly there; another namespace's identical chain is
another chain). New pages that the ghost recognizes (the evicted
run, and the runs evicted before it from deeper in the same chain) enter
protected; the pages past them are first uses and stay probationary, so a
leaf can hold both: it is ranked by its tail's segment, and ``on_victim``
lets only the probationary tail go at that rank. (Protecting the whole new
leaf, the fresh turn of a conversation with it, hits 0.7 points fewer
tokens on the Mooncake conversation trace at 3M tokens: a fresh turn is
used again about as rarely as a new conversation.)

**Learning W.** ``W`` is the ``quantile`` of the gaps between consecutive
uses of protected pages (in the cache or through the ghost), page-weighted,
in half-power-of-two bins of clock ticks, recomputed every ``solve_every``
ticks. Until a protected page is used again ``W`` is 0 and the policy is
LRU.

**Why.** On the Mooncake traces a page used once is used again with
probability about 0.26 (conversation) or 0.45 (synthetic), one used twice
with 0.45 or 0.84, and an upper bound on any policy that keeps each use
class for its own best window puts first uses at a window of about 0:
keep what came back, long enough to cover nearly all of its reuse gaps
(the default ``quantile`` 0.99; at 0.9 the window falls short of the
synthetic trace's long gaps and its hit rate at 3M tokens drops 2 points).

Cost: O(1) per hook (one dict lookup at admission) plus a walk to the root
at admission and eviction (for the namespace; two nodes on average on the
Mooncake conversation trace), O(bins) every ``solve_every`` ticks; the
ghost is a :class:`~.ghost.RunHistory` of at most ``history_size`` runs.

Source: Johnson & Shasha, "2Q: A low overhead high performance buffer
management replacement algorithm" (VLDB'94): probationary A1in, ghost
A1out, protected Am; here on one deadline timeline over the tree instead of
separate queues, with the protected window learned instead of a fixed size.
"""

from __future__ import annotations

from typing import Any, List, Tuple

from radixkv.errors import ArgumentValueError
from radixkv.tree import Node

from .base import gap_bin, tail_past
from .ghost import GhostPolicy, RunHistory

_BINS = 48  # gap_bin's bins
_PROBATION, _PROTECTED = 0, 1


class TwoQ(GhostPolicy):
    """Probationary / protected deadlines with a ghost of evicted runs.

    ``policy_state`` is ``(head deadline, tail deadline, boundary, head
    segment, tail segment, last use)``: pages above depth ``boundary`` are
    the head, the rest the tail (the pages past a run the ghost recognized).

    Args:
        quantile: share of protected reuse gaps the window ``W`` covers, in (0, 1].
        solve_every: ticks between two recomputations of ``W``.
        history_size: evicted runs remembered by the ghost.
    """

    name = "2q"

    def __init__(self, quantile: float = 0.99, solve_every: int = 64, history_size: int = 1 << 16) -> None:
        if not (isinstance(quantile, (int, float)) and 0.0 < quantile <= 1.0):
            raise ArgumentValueError(f"quantile must be in (0, 1], got {quantile!r}")
        for arg, value in (("solve_every", solve_every), ("history_size", history_size)):
            if value.__class__ is not int or value < 1:
                raise ArgumentValueError(f"{arg} must be an int >= 1, got {value!r}")
        self.quantile = float(quantile)
        self.solve_every = solve_every
        self.window = 0
        """``W``: ticks a protected page outranks a probationary one used at the same time."""
        self._gaps: List[float] = [0.0] * _BINS  # page-weighted protected reuse gaps
        self._solved_at = 0
        super().__init__(history_size)

    def new_history(self, capacity: int) -> RunHistory:
        """The ghost: the last ``history_size`` evicted runs, whatever the capacity."""
        return RunHistory(None, max_runs=self.history_size)

    # ------------------------------------------------------------ learning W
    def _observe(self, gap: int, pages: int) -> None:
        self._gaps[gap_bin(gap, _BINS)] += pages

    def _tick(self, now: int) -> None:
        if now - self._solved_at < self.solve_every:
            return
        self._solved_at = now
        total = sum(self._gaps)
        if total <= 0:
            return
        goal, seen = self.quantile * total, 0.0
        for j, weight in enumerate(self._gaps):
            seen += weight
            if seen >= goal:
                self.window = 0 if j == 0 else int(2.0 ** (j / 2))
                return

    # ------------------------------------------------------------ hooks
    def admit(self, node_parent: Node, num_pages: int, now: int, pages: memoryview) -> int:
        self._tick(now)
        return super().admit(node_parent, num_pages, now, pages)

    def recalled(self, runs: List[Tuple[Any, int, int]], now: int) -> None:
        for (segment, last), covered, _ in runs:
            if segment == _PROTECTED:
                self._observe(now - last, covered)

    def on_insert(self, node: Node, now: int) -> None:
        boundary, _ = self.take_pending(node, now) or (node.start, None)
        protected = now + self.window
        node.policy_state = (protected, now, boundary, _PROTECTED, _PROBATION, now)

    def on_access(self, node: Node, now: int) -> None:
        _, _, boundary, head, tail, last = node.policy_state
        split = min(max(boundary, node.start), node.end)
        if head == _PROTECTED and split > node.start:
            self._observe(now - last, split - node.start)
        if tail == _PROTECTED and node.end > split:
            self._observe(now - last, node.end - split)
        deadline = now + self.window
        node.policy_state = (deadline, deadline, boundary, _PROTECTED, _PROTECTED, now)

    def priority(self, node: Node) -> int:
        state = node.policy_state
        return state[1] if node.end > state[2] else state[0]

    def on_victim(self, node: Node) -> int:
        return tail_past(node, node.policy_state[2])  # the probationary tail goes at its own rank

    def on_evict(self, node: Node, pages: int, rank: Any) -> None:
        _, _, boundary, head, tail, last = node.policy_state
        depth = node.end - pages
        self.history.remember(node, depth, node.end, (tail if depth >= boundary else head, last))

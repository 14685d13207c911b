"""The spill index: which lower tier holds each page, and the moves between tiers.

Pages below HBM live in a second :class:`~radixkv.tree.RadixTree` (the
*spill tree*), separate from the engine's HBM tree, so the engine's counters,
locks and victim queue keep meaning "HBM" exactly. A spill-tree node's
``ext`` is its residency: a :class:`~radixkv.tiers.base.Copy` (every page of
the node in one tier; nodes are split where residency changes, as the engine
splits at match boundaries) or ``None`` for a *placeholder*, a page kept only
as the path to deeper spilled pages (it is in HBM or nowhere). Placeholder
leaves are removed at once, so the tree holds the prefix closure of the
spilled pages and nothing else.

Moves: :meth:`TierStack.put` stores pages leaving HBM in the first tier;
making room in tier ``i`` evicts its lowest-ranked pages, which cascade to
tier ``i + 1`` keeping their rank, or are dropped from the last tier.
:meth:`TierStack.lookup` and :meth:`TierStack.fetch` find and read the pages
that continue a match below HBM, verifying each page's checksum.

Victims, under write-back (``leaves_first``), are as in HBM the nodes whose
leaving strands nothing: a node is in its tier's victim queue only while
every child is a copy in a *later* tier (``Copy.blockers`` counts the
others), so the last tier evicts only leaves and a tier demotes a node only
after its descendants in that tier went first. There a page is in HBM or
below, so a lower-tier hit, which needs the whole prefix, goes through the
ancestor's copy: evicting it before its deeper copies (gdsf ranks shallow
pages cheap; FIFO-like policies rank by arrival) would leave them resident
and unreachable. Under write-through the lower tiers back HBM up and an
ancestor's copy is usually redundant with its HBM page, so every copy stays
a victim (with LRU, the ancestor's copy goes first and its deeper copies,
which HBM evicted first, are what the tier serves). A tier evicts
with HBM's victim loop (:func:`radixkv.victims.evict`) and key
(:func:`radixkv.victims.rank_key`): ``on_victim`` (0 spares the node:
re-rank and look again; ``k`` lets only ``k`` tail pages go), then the
evicted tail is split off (``on_split``) and leaves the tier
(``on_evict`` with the rank it was queued at).

Faults: every call into a tier goes through a guard that turns an exception,
or an answer out of the :class:`~radixkv.tiers.base.Tier` contract, into the
call's refusal (a write stores nothing, a read finds nothing, a take hands out
no slot), counted in :attr:`TierStack.tier_errors` and warned once. So a
broken tier costs dropped pages and misses; the spill tree is never left with
a node in flight or a slot held by no page. A tier's eviction *policy* is not
behind that guard: a policy hook that raises while a tier makes room fails the
operation, after the pages it left in flight are dropped (a recompute; a load's
pages released before the error too, with every copy below them), the slots it
took go back and a node it could not rank waits for the tier's next eviction.

Residency journal: when :attr:`TierStack.journal` is a list (a cache with
events sets it), every change of a page's residency below HBM is appended to
it as it happens, in order: the tier layer turns it into events. A residency
observer (:meth:`TierStack.add_observer`: a cluster-wide page index) is told
of the same changes at the same points, with the node itself, so it keys the
pages without joining their path's bytes.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Callable, Dict, Hashable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .. import victims as _victims
from ..errors import ArgumentTypeError, ArgumentValueError
from ..tree import Node, RadixTree
from ..victims import rank_key
from .base import IN_FLIGHT, NO_SLOTS, SLOT_DTYPE, Copy, InFlight, Tier, checksums
from .transfers import HBM, TransferLedger

ORPHANED = InFlight()
"""Residency of an in-flight node whose path was lost while it waited for a slot (a page above it
was dropped with every copy below it): whoever is placing it drops it instead of storing it."""

Change = Tuple[str, Hashable, bytes, int, str, str]
"""A journal entry ``(kind, key, data, start, tier, source)``: pages ``start..`` of ``data`` (the
whole pages of the sequence from its first page, under spill root ``key``) were ``"stored"`` in
``tier`` (copied from tier ``source``, or from ``"hbm"``), ``"removed"`` from it, or ``"promoted"``
from it to HBM (the copy left the tier)."""


def _zeros(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.int32)


def path_data(node: Node, page_bytes: int) -> Tuple[Node, bytes]:
    """The root above ``node`` and the bytes of every page from the root through ``node``. O(depth)."""
    parts = []
    while node.parent is not None:
        rest = node.rest
        n = (node.num_pages - 1) * page_bytes
        parts.append(rest if len(rest) == n else rest[:n])
        parts.append(node.first)
        node = node.parent
    parts.reverse()
    return node, b"".join(parts)


def _resident(node: Node) -> bool:
    """``node`` is in the spill tree and holds a copy (a tier's victim queue may hold it)."""
    return node.gen >= 0 and isinstance(node.ext, Copy)


def _good_prefix(data: Optional[np.ndarray], ok: np.ndarray, sums: Optional[np.ndarray]) -> int:
    """How many pages from the start of a copy just read are good: read (``ok``) and, when the copy has
    checksums and a payload was read, matching them (``ok`` is narrowed in place to that). O(pages)."""
    if data is not None and sums is not None and ok.any():
        ok &= checksums(data) == sums
    return len(ok) if ok.all() else int(np.argmin(ok))


class TierStack:
    """Lower tiers in order (fastest first) over one spill tree.

    Args:
        tiers: the tiers, fastest first; each page lives in at most one of them.
        page_size: tokens per page.
        has_payload: pages carry payload bytes (checksummed).
        ledger: where transfers are charged.
        page_bytes: bytes charged per page moved.
        leaves_first: only nodes with no blocking child are victims (write-back; see the module doc).
    """

    def __init__(self, tiers: Sequence[Tier], page_size: int, has_payload: bool,
                 ledger: TransferLedger, page_bytes: int, leaves_first: bool = True) -> None:
        self.tiers: List[Tier] = list(tiers)
        for tier in self.tiers:
            tier.stack = self
        self.leaves_first = leaves_first
        self._index = {id(t): i for i, t in enumerate(self.tiers)}
        self.tree = RadixTree(page_size)
        self.has_payload = has_payload
        self.ledger = ledger
        self.page_bytes = page_bytes
        self.tick = 0
        self.dropped_pages = 0
        """Pages that left the last tier, found no room below, or whose write a tier refused (monotonic)."""
        self.integrity_misses = 0
        """Pages whose payload was missing or failed its checksum on load (monotonic)."""
        self.lost_pages = 0
        """Copies forgotten because their remote host died (monotonic)."""
        self.tier_errors = 0
        """Calls into a tier that raised or answered out of contract, each failed as a refusal (monotonic)."""
        self.last_tier_error: Optional[BaseException] = None
        """The latest of those errors, for diagnosis."""
        self.journal: Optional[List[Change]] = None
        """Residency changes below HBM not yet taken (see the module doc); ``None``: not recorded."""
        self.observers: Tuple[object, ...] = ()
        """Told of every residency change below HBM as it happens (:meth:`add_observer`)."""
        self._warned = False
        self._unranked: Dict[Node, None] = {}  # resident nodes whose tier policy raised ranking them
        self._deferred: Optional[List[BaseException]] = None  # see completing

    @property
    def num_pages(self) -> int:
        """Pages held below HBM. O(tiers)."""
        return sum(t.used for t in self.tiers)

    # ------------------------------------------------------------------ guarded tier calls
    def _fault(self, tier: Tier, op: str, exc: BaseException) -> None:
        """Count a failed call into ``tier`` (the first one warns): the caller treats it as a refusal."""
        self.tier_errors += 1
        self.last_tier_error = exc
        if not self._warned:  # once per stack, however often the counters are zeroed
            self._warned = True
            warnings.warn(f"tier {tier.name!r}: {op} failed ({exc!r}); its pages are dropped or missed "
                          "(TierStack.tier_errors counts these)", RuntimeWarning, stacklevel=4)

    def _guard(self, tier: Tier, op: str, call: Callable[[], object], check: Callable[[object], object],
               failed: object):
        """``check(call())``, or ``failed`` when either raises (counted by :meth:`_fault`)."""
        try:
            return check(call())
        except Exception as exc:  # a tier bug or an out-of-contract answer: this call fails, the stack goes on
            self._fault(tier, op, exc)
            return failed

    @staticmethod
    def _mask(answer: object, n: int, op: str) -> np.ndarray:
        ok = np.asarray(answer)
        if ok.shape != (n,) or ok.dtype != bool:
            raise TypeError(f"{op} must answer one bool per slot ({n}), got {answer!r}")
        return ok.copy()

    def _take(self, tier: Tier, n: int) -> np.ndarray:
        def check(slots: object) -> np.ndarray:
            if not isinstance(slots, np.ndarray) or slots.ndim != 1 or len(slots) > n or slots.dtype.kind not in "iu":
                raise TypeError(f"take({n}) must answer at most {n} int slots, got {slots!r}")
            return slots.astype(SLOT_DTYPE, copy=False)
        return self._guard(tier, "take", lambda: tier.take(n), check, NO_SLOTS)

    def _give(self, tier: Tier, slots: np.ndarray) -> None:
        if len(slots):
            self._guard(tier, "give", lambda: tier.give(slots), lambda _: None, None)

    def _write(self, tier: Tier, slots: np.ndarray, pages: Optional[np.ndarray]) -> np.ndarray:
        """Per-slot ok mask of ``tier.write``; all False when it raises or answers garbage."""
        n = len(slots)
        return self._guard(tier, "write", lambda: tier.write(slots, pages), lambda ok: self._mask(ok, n, "write"),
                           np.zeros(n, dtype=bool))

    def _read(self, tier: Tier, slots: np.ndarray) -> Tuple[Optional[np.ndarray], np.ndarray]:
        """``tier.read(slots)`` checked against the contract; nothing found when it raises or answers garbage."""
        n = len(slots)
        shape = (n, *tier.page_shape) if self.has_payload and tier.page_shape is not None else None

        def check(answer: object) -> Tuple[Optional[np.ndarray], np.ndarray]:
            data, ok = answer  # type: ignore[misc]
            ok = self._mask(ok, n, "read")
            if shape is None:
                return None, ok
            if not isinstance(data, np.ndarray) or data.shape != shape or data.dtype != tier.dtype:
                raise TypeError(f"read must answer pages of shape {shape} and dtype {tier.dtype}, got {data!r}")
            return data, ok
        return self._guard(tier, "read", lambda: tier.read(slots), check, (None, np.zeros(n, dtype=bool)))

    def _lost(self, tier: Tier, slots: np.ndarray) -> np.ndarray:
        n = len(slots)
        return self._guard(tier, "lost_slots", lambda: tier.lost_slots(slots),
                           lambda lost: self._mask(lost, n, "lost_slots"), np.zeros(n, dtype=bool))

    # ------------------------------------------------------------------ journal
    def add_observer(self, observer: object) -> None:
        """Tell ``observer`` of every residency change below HBM from now on: ``observer.lower_stored(node)``
        once ``node`` became a copy (``node.ext``, a :class:`Copy`, names its tier and slots) and
        ``observer.lower_removed(node)`` just before its copy leaves (cascaded, dropped, promoted to
        HBM, lost, forgotten at a reset), its slots still in ``node.ext``. A split is no change: the
        two parts keep their pages' slots. Raises ArgumentTypeError for an object without those
        methods, ArgumentValueError for one added already. O(observers)."""
        if not all(callable(getattr(observer, name, None)) for name in ("lower_stored", "lower_removed")):
            raise ArgumentTypeError(f"a residency observer needs lower_stored and lower_removed methods, got {observer!r}")
        if any(o is observer for o in self.observers):
            raise ArgumentValueError(f"{observer!r} observes this stack already")
        self.observers += (observer,)

    def remove_observer(self, observer: object) -> None:
        """Stop telling ``observer`` (see :meth:`add_observer`); nothing if it was not told. O(observers)."""
        self.observers = tuple(o for o in self.observers if o is not observer)

    def _note(self, kind: str, node: Node, tier: Tier, source: str = HBM) -> None:
        """Tell the observers of a residency change of every page of ``node`` (O(1) each), and journal
        it when recording (O(depth))."""
        for observer in self.observers:  # ``node.ext`` is the copy, made or leaving
            if kind == "stored":
                observer.lower_stored(node)
            else:
                observer.lower_removed(node)
        if self.journal is not None:
            root, data = path_data(node, self.tree.page_bytes)
            self.journal.append((kind, root.namespace, data, node.start, tier.name, source))

    # ------------------------------------------------------------------ tree surgery
    def _rank(self, node: Node) -> None:
        """(Re-)queue resident ``node`` in its tier if nothing blocks it, else take it out."""
        copy = node.ext
        tier = copy.tier
        if copy.blockers and self.leaves_first:
            tier.victims.discard(node)
        else:  # (a policy that raises leaves the node waiting for the tier's next eviction)
            _victims.rank(tier.victims, node, tier.policy.priority, self._unranked)

    def _blocks(self, child: Node, level: int) -> bool:
        """Whether ``child`` keeps its parent, a copy in tier ``level``, from leaving it."""
        ext = child.ext
        return not (isinstance(ext, Copy) and self._index[id(ext.tier)] > level)

    def _set_ext(self, node: Node, ext) -> None:
        """Change ``node``'s residency, updating its parent's blockers (and queue entry). O(1)."""
        parent = node.parent
        up = parent.ext
        if not isinstance(up, Copy):
            node.ext = ext
            return
        level = self._index[id(up.tier)]
        was = self._blocks(node, level)
        node.ext = ext
        now = self._blocks(node, level)
        if was != now:
            up.blockers += 1 if now else -1
            self._rank(parent)

    def _assign(self, node: Node, tier: Tier, slots: np.ndarray, sums: Optional[np.ndarray], stamp: int,
                src: str) -> None:
        """Make ``node`` a copy in ``tier`` at ``slots``, its pages copied from tier ``src``."""
        copy = Copy(tier, slots, sums, stamp)
        if node.children:
            level = self._index[id(tier)]
            copy.blockers = sum(self._blocks(c, level) for c in node.children.values())
        self._set_ext(node, copy)
        try:
            tier.policy.on_insert(node, stamp)
        except BaseException:  # the copy is not made: in flight again (the operation drops it), slots back
            self._set_ext(node, IN_FLIGHT)
            self._give(tier, slots)
            raise
        self._rank(node)
        tier.on_assign(node)
        self._note("stored", node, tier, src)

    def _release(self, node: Node, kind: str = "removed", rank: object = None) -> Copy:
        """Take ``node``'s copy away (slots still held by the caller); node becomes in flight.

        ``kind`` is journaled: ``"removed"``, or ``"promoted"`` when the pages move up to HBM.
        ``rank``: the priority ``node`` was evicted at (``None``: it was not a victim).
        If the policy's ``on_evict`` raises, the copy leaves all the same (in flight, its slots
        back to the tier, for the operation to drop) and the error propagates.
        """
        copy = node.ext
        tier = copy.tier
        self._note(kind, node, tier)
        tier.on_release(node)
        tier.victims.discard(node)
        try:
            tier.policy.on_evict(node, node.num_pages, rank)
        except BaseException as exc:
            if self._deferred is None:
                self._set_ext(node, IN_FLIGHT)
                self._give(tier, copy.slots)
                raise
            self._deferred.append(exc)  # a forgetting operation: it goes on, then raises (completing)
        self._set_ext(node, IN_FLIGHT)
        return copy

    @contextmanager
    def completing(self) -> Iterator[None]:
        """Run an operation that forgets copies (:meth:`reset`, :meth:`discard`, a lender's crash) to its end
        even if a tier policy's ``on_evict`` raises in it: every copy it meant to forget still
        goes, then the first such error is raised. Nested uses defer to the outermost."""
        if self._deferred is not None:
            yield
            return
        errors: List[BaseException] = []
        self._deferred = errors
        try:
            yield
        finally:
            self._deferred = None
        if errors:
            raise errors[0]

    def _split(self, node: Node, pages: int) -> Node:
        """Cut ``node`` after ``pages`` pages; return the new upper node (``node`` keeps the tail)."""
        copy = node.ext
        upper = self.tree.split(node, pages)
        if isinstance(copy, Copy):
            upper.ext, node.ext = copy.split(pages)
            upper.ext.blockers = 1  # its one child, ``node``, is in the same tier
            node.ext.blockers = copy.blockers
            error = None  # a policy that raises: both parts are still queued (or wait in _unranked) and indexed
            try:
                copy.tier.policy.on_split(upper, node)
            except BaseException as exc:
                error = exc
            for part in (upper, node):
                try:
                    self._rank(part)
                except BaseException as exc:
                    error = error or exc
            copy.tier.on_assign(upper)
            copy.tier.on_assign(node)
            if error is not None:
                raise error
        else:
            upper.ext = copy
        return upper

    def _add_leaf(self, parent: Node, key: bytes, num_pages: int) -> Node:
        """A new placeholder child of ``parent`` (it blocks ``parent`` if that is a copy)."""
        leaf = self.tree.add_leaf(parent, key, _zeros(num_pages))
        up = parent.ext
        if isinstance(up, Copy):
            up.blockers += 1
            self._rank(parent)
        return leaf

    def _gc(self, node: Node) -> None:
        """Remove ``node`` and its ancestors while they are childless placeholders."""
        tree = self.tree
        while node.parent is not None and node.ext is None and node.children is None:
            parent = node.parent
            tree.truncate(node, node.num_pages)
            up = parent.ext
            if isinstance(up, Copy):  # a placeholder blocked it
                up.blockers -= 1
                self._rank(parent)
            node = parent

    def split_copy(self, node: Node, pages: int) -> Node:
        """Cut resident ``node`` after ``pages`` pages; return the new upper node (``node`` keeps the tail).

        For a tier that moves single pages of a node (a recalled loan). O(pages of node).
        """
        return self._split(node, pages)

    def forget_copy(self, node: Node) -> None:
        """Forget resident ``node``'s copy: its slots go back to its tier, the node leaves the spill
        tree (with placeholders above it that held nothing else). For storage that is gone (a crashed
        lender); the caller forgets the copies below first. O(depth)."""
        with self.completing():
            node.ext.tier.give(self._release(node).slots)
            self._drop(node)

    def _drop(self, node: Node) -> None:
        self._set_ext(node, None)
        self._gc(node)

    def _lose(self, node: Node) -> None:
        """Drop ``node``, a page lost below HBM (a refused write, a bad checksum, a lost host), with
        every lower copy below it: a hit needs the whole prefix, so they could not be served until
        the lost pages were cached again, and would hold their slots meanwhile. Pages still in
        flight below it (placed by a caller up the stack) are left to it, :data:`ORPHANED`: it
        drops them rather than store them where no lookup reaches. O(nodes below)."""
        self.dropped_pages += self._drop_copies(node)
        if node.gen >= 0:
            self._drop(node)

    def _drop_copies(self, top: Node) -> int:
        """Drop every lower copy in ``top``'s subtree (``top`` too), each after the copies below it,
        so a placeholder goes with its last copy; return the pages dropped. Pages in flight there
        become :data:`ORPHANED`: their placer drops them (:meth:`_place`). O(subtree)."""
        nodes = [top]
        for n in nodes:  # grows while iterated: parents before children
            if n.children:
                nodes.extend(n.children.values())
        dropped = 0
        for n in reversed(nodes):
            if n.gen < 0:
                continue
            if isinstance(n.ext, Copy):
                dropped += n.num_pages
                tier = n.ext.tier
                self._give(tier, self._release(n).slots)
                self._drop(n)
            elif n.ext is IN_FLIGHT:  # being placed up the stack: stored now, it would hang below a lost page
                self._set_ext(n, ORPHANED)
        return dropped

    # ------------------------------------------------------------------ reads
    def _path(self, node: Node) -> List[Node]:
        path = []
        while node.parent is not None:
            path.append(node)
            node = node.parent
        path.reverse()
        return path

    def lookup(self, key: Hashable, data: bytes, pos: int, num_pages: int, touch: bool = True) -> List[Node]:
        """Nodes holding pages ``pos, pos+1, ...`` of ``data`` below HBM, consecutive, in order.

        With ``touch`` (a request's lookup; a pin passes False) it touches
        (``on_access``) every copy on the path up to the end of the run, so
        lower tiers rank by use like HBM does. Splits nodes so the run starts
        exactly at ``pos``. Cost: O(path nodes) plus a C-speed key comparison.
        """
        root = self.tree.find_root(key)
        if root is None:
            return []
        self.tick += 1
        node, lpos, child, common = self.tree.walk(root, data, num_pages)
        if child is not None and lpos + common > pos:
            node = self._split(child, common)
            lpos += common
        path = self._path(node)
        run: List[Node] = []
        end = pos
        if lpos > pos:
            i = 0
            while path[i].end <= pos:
                i += 1
            if path[i].start < pos:
                self._split(path[i], pos - path[i].start)
            for n in path[i:]:
                if not isinstance(n.ext, Copy):
                    break
                run.append(n)
                end = n.end
        if not touch:
            return run
        tick = self.tick
        for n in path:
            if n.start >= end:
                break
            if isinstance(n.ext, Copy):
                n.ext.tier.policy.on_access(n, tick)
                self._rank(n)
        return run

    def fetch(self, run: List[Node], max_pages: int, exclusive: bool) -> Tuple[int, Optional[np.ndarray], List[Tuple[str, int]]]:
        """Read up to ``max_pages`` leading pages of ``run`` for HBM, verifying checksums.

        Stops at the first page whose payload is missing or corrupt (counted in
        :attr:`integrity_misses`; that copy and the rest of its node are
        forgotten). With ``exclusive`` the pages read leave their tier.
        Returns ``(pages read, payload or None, [(tier name, pages), ...])``.
        """
        got = 0
        parts: List[np.ndarray] = []
        by_tier: List[Tuple[str, int]] = []
        released: List[Node] = []
        lost: List[Node] = []
        try:
            for node in run:
                if got >= max_pages:
                    break
                want = min(node.num_pages, max_pages - got)
                use = self._split(node, want) if want < node.num_pages else node
                copy: Copy = use.ext
                tier = copy.tier
                data, ok = self._read(tier, copy.slots)
                good = _good_prefix(data, ok, copy.sums)
                if good < len(ok):
                    gone = self._lost(tier, copy.slots)
                    self.lost_pages += int(np.count_nonzero(~ok & gone))
                    self.integrity_misses += int(np.count_nonzero(~ok & ~gone))
                    upper = self._split(use, good) if good else None  # ``use`` keeps the bad tail
                    self._give(tier, self._release(use).slots)
                    self._set_ext(use, None)
                    lost.append(use)
                    if upper is None:
                        break
                    use = upper
                    data = None if data is None else data[:good]
                if data is not None:
                    parts.append(data[:good])
                by_tier.append((tier.name, good))
                self.ledger.record(tier.name, HBM, good * self.page_bytes)
                got += good
                if exclusive:
                    self._give(tier, self._release(use, "promoted").slots)
                    self._set_ext(use, None)
                    released.append(use)
                if good < want:
                    break
        except BaseException:  # a tier policy raised releasing a copy: what it left in flight is dropped,
            self._drop_in_flight()  # and the pages released before it reach no HBM (the load fails)
            self._tidy_fetch(lost, released, failed=True)
            raise
        self._tidy_fetch(lost, released)
        payload = (np.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else None
        return got, payload, by_tier

    def read_run(self, run: List[Node], max_pages: int, tiers: Sequence[str],
                 demote: bool = False) -> Tuple[List[Tuple[str, int]], Optional[np.ndarray]]:
        """Copy out up to ``max_pages`` leading pages of ``run`` for a peer, changing no residency.

        Reads page by page in order while each copy is in a tier named in ``tiers`` and its
        payload is there and matches its checksum; stops at the first that is not (the owner's
        own next load counts and drops a bad page: a peer's read leaves it be). Splits the last
        node read where ``max_pages`` ends (as a lookup does). With ``demote`` each copy read is
        ranked next to go in its tier, as if last used before every other copy (the peer took it:
        a move, as :meth:`radixkv.cache.PrefixCache.demote`), under a policy whose rank is a
        last-use time (``lru``; other copies keep their rank). Returns ``([(tier name, pages), ...],
        payload or None)``. No transfer is charged here: the reader is charged its own path. Cost:
        O(nodes read) plus the payload bytes and their checksums.
        """
        got = 0
        parts: List[np.ndarray] = []
        by_tier: List[Tuple[str, int]] = []
        for node in run:
            if got >= max_pages or node.gen < 0 or not isinstance(node.ext, Copy) or node.ext.tier.name not in tiers:
                break
            want = min(node.num_pages, max_pages - got)
            if want < node.num_pages:
                node = self._split(node, want)
            copy: Copy = node.ext
            data, ok = self._read(copy.tier, copy.slots)
            good = _good_prefix(data, ok, copy.sums)
            if good:
                if data is not None:
                    parts.append(data[:good])
                by_tier.append((copy.tier.name, good))
                got += good
                if demote and copy.tier.policy.name == "lru":
                    node.policy_state = 0
                    self._rank(node)
            if good < len(ok):
                break
        payload = (np.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else None
        return by_tier, payload

    def _tidy_fetch(self, lost: List[Node], released: List[Node], failed: bool = False) -> None:
        """After :meth:`fetch`: the copies below a bad page go with it (see :meth:`_lose`), and
        the placeholders the pages read left behind are removed. ``failed``: the fetch raised, so
        the pages it released never reach HBM: they are lost like a bad page, with every copy
        below them (a sibling branch too), which no lookup could reach. O(nodes below)."""
        with self.completing():
            for node in lost + released if failed else lost:
                if node.gen >= 0:
                    self._lose(node)
            for node in reversed(released):
                if node.gen >= 0:
                    self._gc(node)
            self._sweep_lost()

    def peek(self, key: Hashable, data: bytes, pos: int, num_pages: int) -> int:
        """Pages ``pos, ...`` of ``data`` held below HBM, consecutive; changes nothing. O(path)."""
        root = self.tree.find_root(key)
        if root is None:
            return 0
        node, lpos, child, common = self.tree.walk(root, data, num_pages)
        path = self._path(node)
        if child is not None:
            path.append(child)
        end = pos
        for n in path:
            if n.end <= pos:
                continue
            if not isinstance(n.ext, Copy):
                break
            if n is child:
                if lpos + common <= pos:
                    break
                end = lpos + common
                break
            end = n.end
        return end - pos

    # ------------------------------------------------------------------ writes
    def _carve(self, key: Hashable, data: bytes, start: int, end: int, top: Optional[Node] = None) -> List[Node]:
        """Spill-tree nodes covering exactly pages ``[start, end)`` of ``data``, created as placeholders if new.

        ``data`` holds the pages from ``top``'s end on (``top``: the root of ``key`` if ``None``).
        """
        tree = self.tree
        pb = tree.page_bytes
        if top is None:
            top = tree.root(key)
        base = top.end
        node, pos, child, common = tree.walk(top, data, end - base)
        pos += base
        if child is not None:
            node = self._split(child, common)
            pos += common
        existing = []
        n = node
        while n.parent is not None and n.end > start:
            existing.append(n)
            n = n.parent
        existing.reverse()
        if existing and existing[0].start < start:
            self._split(existing[0], start - existing[0].start)
        if pos < end:
            if pos < start:
                node = self._add_leaf(node, data[(pos - base) * pb: (start - base) * pb], start - pos)
                pos = start
            existing.append(self._add_leaf(node, data[(pos - base) * pb: (end - base) * pb], end - pos))
        return existing

    def put(self, key: Hashable, data: bytes, start: int, end: int, pages: Optional[np.ndarray],
            src: str = HBM, top: Optional[Node] = None) -> Optional[Node]:
        """Store pages ``[start, end)`` of ``data`` (payload ``pages``) below HBM.

        ``data`` holds the pages from the root of ``key`` on, or, given ``top``
        (a live spill-tree node on the same path, ending at or before
        ``start``: an *anchor*), from ``top``'s end on, so a caller that knows
        where the path's upper part sits passes only the bytes below it.
        Pages that already have a lower copy are skipped. The first tier makes
        room by evicting (cascading) its lowest-ranked pages; pages it cannot
        hold at all go to the next tier, deepest first, as if demoted one at a
        time; what no tier can hold is dropped. Returns the spill-tree node
        that ends at page ``start`` (an anchor for the next put below it; it
        may have left the tree by then: check ``gen``), ``None`` when nothing
        was stored. Cost: one walk from the anchor plus the evictions it needs.
        """
        if not self.tiers or end <= start:
            return None
        self.tick += 1
        carved = self._carve(key, data, start, end, top)
        anchor = carved[0].parent
        nodes = [n for n in carved if n.ext is None]
        for n in nodes:
            self._set_ext(n, IN_FLIGHT)
        sums = checksums(pages) if pages is not None and self.has_payload else None
        try:
            self._place(0, nodes, pages, sums, start, self.tick, src)
        except BaseException:  # a tier policy raised while making room: what is still in flight is dropped
            self._drop_in_flight()
            raise
        self._sweep_lost()
        return anchor

    def _drop_in_flight(self) -> None:
        """Lose every spill-tree node left in flight by an operation a tier policy's exception cut
        short, with every copy below it (a hit needs the whole prefix: :meth:`_lose`). Their pages
        are gone below HBM: a recompute, never a wrong answer. O(spill tree)."""
        with self.completing():
            for node in sorted(self.tree.nodes(), key=lambda n: -n.end):
                if node.gen >= 0 and isinstance(node.ext, InFlight):
                    self.dropped_pages += node.num_pages
                    self._lose(node)

    def _place(self, i: int, nodes: List[Node], pages: Optional[np.ndarray], sums: Optional[np.ndarray],
               start: int, stamp: int, src: str) -> None:
        """Give in-flight ``nodes`` (shallowest first; payload rows from page ``start``) slots in tier ``i``."""
        tier = self.tiers[i]
        slots = self.reserve(i, sum(n.num_pages for n in nodes))
        # Making room may have lost a page above some of them (a demotion whose read failed).
        failed: List[Node] = [n for n in nodes if n.ext is ORPHANED]
        if failed:
            nodes = [n for n in nodes if n.ext is not ORPHANED]
        off = stored = 0
        leftover: List[Node] = []
        refused: List[Node] = []
        try:
            for n in nodes:
                avail = len(slots) - off
                if avail <= 0:
                    leftover.append(n)
                    continue
                if avail < n.num_pages:
                    leftover.append(n)  # keeps the tail, still in flight
                    n = self._split(n, avail)
                k = n.num_pages
                s = slots[off: off + k]
                off += k
                rows = slice(n.start - start, n.end - start)
                ok = self._write(tier, s, None if pages is None else pages[rows])
                good = k if ok.all() else int(np.argmin(ok))
                if good < k:  # the tier refused a write: keep the pages before it, lose the rest
                    self._give(tier, s[good:])
                    refused.append(n)
                    if not good:
                        continue
                    n = self._split(n, good)  # the upper part, stored; ``n`` above keeps the tail
                    s = s[:good]
                    rows = slice(rows.start, rows.start + good)
                self._assign(n, tier, s, None if sums is None else sums[rows], stamp, src)
                stored += good
        except BaseException:  # a tier policy raised placing one: the slots not handed out yet go back
            if off < len(slots):
                self._give(tier, slots[off:])
            raise
        if off < len(slots):
            self._give(tier, slots[off:])
        self.ledger.record(src, tier.name, stored * self.page_bytes)
        if leftover and i + 1 < len(self.tiers):
            self._place(i + 1, leftover, pages, sums, start, stamp, src)
        else:
            failed += leftover
        for n in sorted(failed, key=lambda x: -x.end):
            self.dropped_pages += n.num_pages
            self._drop(n)
        for n in sorted(refused, key=lambda x: -x.end):
            if n.gen >= 0:
                self.dropped_pages += n.num_pages
                self._lose(n)

    def reserve(self, i: int, n: int) -> np.ndarray:
        """Up to ``n`` slots of tier ``i``, evicting (cascading) its lowest-ranked pages for room."""
        tier = self.tiers[i]
        parts = []
        have = 0
        while have < n:
            more = self._take(tier, n - have)
            if len(more):
                parts.append(more)
                have += len(more)
            try:
                if have >= n or self.evict(i, n - have) == 0:
                    break
            except BaseException:  # the tier's policy raised while making room: the slots taken go back
                for part in parts:
                    self._give(tier, part)
                raise
        if not parts:
            return NO_SLOTS
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def evict(self, i: int, n: int) -> int:
        """Move the ``n`` lowest-ranked pages of tier ``i`` down a tier (or drop them); return pages moved.

        HBM's victim loop (:func:`radixkv.victims.evict`) over the tier's queue and policy: a
        victim's evicted tail is split off (``on_split``) and demoted, and the policy's
        ``on_evict`` gets the rank it was queued at. Cost: O(log n) per victim, amortized.
        """
        def take(node: Node, k: int, rank: object) -> None:
            if k < node.num_pages:
                self._split(node, node.num_pages - k)
            self.demote(i, node, rank)

        tier = self.tiers[i]
        if self._unranked:
            _victims.rank_waiting(self._unranked, self._rank, _resident)
        return _victims.evict(tier.victims, tier.policy, n, self._rank, take)

    def demote(self, i: int, node: Node, rank: object = None) -> None:
        """Move every page of ``node`` (held in tier ``i``) to the tiers below, or drop it from the last.

        ``rank``: the priority ``node`` was chosen as a victim at (``None``: it was not chosen).
        """
        tier = self.tiers[i]
        copy = self._release(node, rank=rank)
        if i + 1 >= len(self.tiers):
            self._give(tier, copy.slots)
            self.dropped_pages += node.num_pages
            self._drop(node)
            return
        data, ok = self._read(tier, copy.slots) if self.has_payload else (None, ~self._lost(tier, copy.slots))
        self._give(tier, copy.slots)
        good = _good_prefix(data, ok, copy.sums)
        if good < len(ok):
            self.integrity_misses += len(ok) - good
            upper = self._split(node, good) if good else None
            self.dropped_pages += node.num_pages
            self._lose(node)
            if upper is None:
                return
            node = upper
        try:
            self._place(i + 1, [node], data, copy.sums, node.start, copy.stamp, tier.name)
        except BaseException:  # a tier policy raised while the tier below made room
            self._drop_in_flight()
            raise

    def discard(self, key: Hashable, data: bytes, start: int) -> int:
        """Forget every lower copy of page ``start`` of ``data`` and of every page below it; return pages forgotten.

        For pages whose KV is not (or no longer) trusted: an aborted admission's
        pages and what was computed over them. Cost: one walk plus O(nodes forgotten).
        """
        root = self.tree.find_root(key)
        if root is None:
            return 0
        node, pos, child, common = self.tree.walk(root, data, start + 1)
        if pos <= start:  # page ``start`` has no spill node: nothing below it either
            if child is None or pos + common <= start:
                return 0
            node = child
        path = self._path(node)
        top = next(n for n in path if n.end > start)
        if top.start < start:
            self._split(top, start - top.start)
        with self.completing():
            return self._drop_copies(top)

    # ------------------------------------------------------------------ faults
    def _sweep_lost(self) -> None:
        for tier in self.tiers:
            if self._guard(tier, "take_lost", tier.take_lost, bool, False):
                self.forget_lost(tier)

    def forget_lost(self, tier: Tier) -> int:
        """Forget every copy in ``tier`` whose storage is gone (and the rest of its node). O(spill nodes)."""
        forgotten = 0
        with self.completing():
            for node in list(self.tree.nodes()):
                if node.gen < 0 or not isinstance(node.ext, Copy) or node.ext.tier is not tier:
                    continue
                lost = self._lost(tier, node.ext.slots)
                if not lost.any():
                    continue
                first = int(np.argmax(lost))
                if first:
                    self._split(node, first)
                forgotten += node.num_pages
                self._give(tier, self._release(node).slots)
                self._lose(node)
            self.lost_pages += forgotten
        return forgotten

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """O(n): spill-tree shape, residency, slot accounting and victim queues of every tier."""
        self.tree.check()
        resident: Dict[int, List[Node]] = {id(t): [] for t in self.tiers}
        for node in self.tree.nodes():
            ext = node.ext
            assert not isinstance(ext, InFlight), f"{node} left in flight"
            if ext is None:
                assert node.children, f"placeholder leaf {node} was not collected"
                continue
            assert isinstance(ext, Copy), f"{node} has residency {ext!r}"
            assert id(ext.tier) in resident, f"{node} resident in a tier not in the stack: {ext.tier!r}"
            level = self._index[id(ext.tier)]
            blockers = sum(self._blocks(c, level) for c in node.children.values()) if node.children else 0
            assert ext.blockers == blockers, f"{node} counts {ext.blockers} blocking children, has {blockers}"
            assert len(ext.slots) == node.num_pages, f"{node} has {len(ext.slots)} slots"
            if self.has_payload:
                assert ext.sums is not None and len(ext.sums) == node.num_pages, f"{node} lacks checksums"
            resident[id(ext.tier)].append(node)
        for tier in self.tiers:
            nodes = resident[id(tier)]
            slots = np.concatenate([n.ext.slots for n in nodes]) if nodes else np.empty(0, dtype=np.int64)
            assert len(np.unique(slots)) == len(slots), f"{tier.name}: a slot holds two pages"
            assert len(slots) == tier.used, f"{tier.name}: {tier.used} slots used, tree holds {len(slots)} pages"
            live = {id(n): (k, n) for k, n in tier.victims.entries()}
            assert len(live) == len(tier.victims), f"{tier.name}: victim queue count drifted"
            eligible = {id(n) for n in nodes if not (n.ext.blockers and self.leaves_first)}
            waiting = {id(n) for n in self._unranked}  # their policy raised: ranked by the next eviction
            assert set(live) | (eligible & waiting) == eligible and not set(live) & waiting, (
                f"{tier.name}: victim queue differs from its victim-eligible resident nodes")
            for k, n in live.values():
                assert k == rank_key(tier.policy.priority, n), f"{tier.name}: {n} queued at {k}"
            tier.check()

    def reset(self) -> None:
        """Forget every lower copy (slots back to their tiers)."""
        journal, self.journal = self.journal, None  # the cache reports the reset as a whole
        with self.completing():
            for node in list(self.tree.nodes()):
                if isinstance(node.ext, Copy):
                    tier = node.ext.tier
                    self._give(tier, self._release(node).slots)
                node.ext = None
                node.gen = -1  # gone: an anchor to it is stale
            self.tree = RadixTree(self.tree.page_size)
            self._unranked.clear()
            self.journal = None if journal is None else []

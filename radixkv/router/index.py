"""KVIndex: which pages every instance holds, on which medium, known only from its KV event batches.

An instance publishes numbered batches (vLLM's ZMQ protocol, :mod:`radixkv.events.wire`): the
8-byte sequence number counts batches from 0, the payload is a msgpack ``KVEventBatch``.
:meth:`KVIndex.apply` takes one such message, as radixkv or vLLM encoded it, and keeps the
view exact when the transport is not:

* a batch past the next expected one is held back, the instance is marked stale and
  :meth:`KVIndex.replay_from` says where the publisher's replay must start (a few batches
  before the gap, so the answer also proves the stream is the same one); held batches are
  applied in order once the gap is filled;
* a batch already applied (same number, same bytes) is a duplicate, applied once;
* a batch numbered below the next expected one with other bytes, or numbered 0 after
  others, is a publisher restart: the instance's view is emptied and rebuilt from 0;
* ``AllBlocksCleared`` empties the instance's view where it sits in its batch;
* a payload that does not decode, or an event of a type or medium it does not know, is
  counted and skipped, never raised; a batch the replay no longer holds is declared lost by
  the caller (:meth:`KVIndex.lost`), counted, and the view goes on, marked inexact.

The view is one dict from block hash (the 64-bit int vLLM publishes by default, or the hash
bytes) to an int mask: instance slot ``j`` owns bits ``8j .. 8j+7``, bit ``8j`` set when the
instance holds the page on any medium and bit ``8j+1+m`` when it holds it on medium ``m``
(``(medium, locality)`` pairs as the events name them, at most :data:`MAX_MEDIA`). Masks are
interned, so a page costs one dict entry and its key (about 100 bytes, measured in
``bench/results/router.md``). The longest held prefix of a request is then a running AND of
the masks of its pages, done at C speed (:meth:`KVIndex.overlap`).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from itertools import islice, repeat
from typing import Any, Callable, Dict, Hashable, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError, MissingExtraError
from ..keys import check_int
from .table import MaskTable

BlockKey = Union[int, bytes]
"""A block hash as events carry it: vLLM's 64-bit int form, or the full hash bytes."""

Medium = Tuple[Optional[str], Optional[str]]
"""``(medium, locality)`` as an event names where its pages are: ``("GPU", None)``, ``("STORAGE", "REMOTE")``."""

GROUP_BITS = 8
MAX_MEDIA = GROUP_BITS - 1
"""Distinct ``(medium, locality)`` pairs one index tracks; an event on another is counted and skipped."""
_GROUP = (1 << GROUP_BITS) - 1
_MEDIA = _GROUP & ~1
_MISSING = object()
_FEW_MASKS = 16


def _decoders() -> Tuple[Any, Any, Dict[str, Any]]:
    """(typed batch decoder, msgspec module, event structs by type name), built on first use."""
    try:
        import msgspec
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise MissingExtraError(f"KVIndex decodes msgpack with msgspec: pip install 'radixkv[events]' ({exc})") from exc
    if not _DECODERS:
        Hash = Union[int, bytes]
        base = msgspec.defstruct("KVCacheEvent", [], tag=True, gc=False)
        stored = msgspec.defstruct("BlockStored", [
            ("block_hashes", List[Hash]), ("medium", Optional[str], None), ("locality", Optional[str], None),
            ("group_idx", Optional[int], None)], bases=(base,))
        removed = msgspec.defstruct("BlockRemoved", [
            ("block_hashes", List[Hash]), ("medium", Optional[str], None), ("locality", Optional[str], None),
            ("group_idx", Optional[int], None)], bases=(base,))
        cleared = msgspec.defstruct("AllBlocksCleared", [], bases=(base,))
        # only the fields an index reads: msgspec skips the others (token ids, parents, extra keys) unbuilt
        batch = msgspec.defstruct("KVEventBatch", [
            ("ts", float), ("events", List[Union[stored, removed, cleared]]), ("data_parallel_rank", Optional[int], None)],
            array_like=True, gc=False)
        _DECODERS.update(decode=msgspec.msgpack.Decoder(type=batch).decode, msgspec=msgspec,
                         types={"BlockStored": stored, "BlockRemoved": removed, "AllBlocksCleared": cleared})
    return _DECODERS["decode"], _DECODERS["msgspec"], _DECODERS["types"]


_DECODERS: Dict[str, Any] = {}


@dataclass(frozen=True, slots=True)
class StreamStatus:
    """What an index knows of one instance's event stream.

    Attributes:
        next_seq: the sequence number it expects next (0 before any batch).
        stale: batches after a gap are held back, waiting for the replay.
        replay_from: where the replay it needs starts (``None`` when not stale).
        exact: no batch was ever lost or malformed since the last reset: the view is the
            instance's residency as of ``next_seq``.
        held: batches held back.
        applied, duplicates, gaps, restarts, clears, lost, malformed, unknown_events,
        other_groups: batches applied; duplicate batches skipped; gaps seen; publisher
            restarts; ``AllBlocksCleared`` applied; batches declared lost; payloads that did
            not decode; events of an unknown type or medium skipped; events of a KV cache
            group other than 0 skipped (a hybrid model's other groups).
        blocks: pages held on any medium.
    """

    next_seq: int
    stale: bool
    replay_from: Optional[int]
    exact: bool
    held: int
    applied: int
    duplicates: int
    gaps: int
    restarts: int
    clears: int
    lost: int
    malformed: int
    unknown_events: int
    other_groups: int
    blocks: int


class _Stream:
    """One instance's sequence state and counters (owned by :class:`KVIndex`)."""

    __slots__ = ("slot", "next_seq", "held", "digests", "exact", "applied", "duplicates", "gaps", "restarts",
                 "clears", "lost", "malformed", "unknown_events", "other_groups", "blocks")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.next_seq = 0
        self.held: Dict[int, bytes] = {}
        self.digests: Dict[int, Optional[int]] = {}  # seq -> hash of the payload applied (None: lost)
        self.exact = True
        self.applied = self.duplicates = self.gaps = self.restarts = self.clears = 0
        self.lost = self.malformed = self.unknown_events = self.other_groups = self.blocks = 0


APPLIED, DUPLICATE, HELD, RESTARTED, LATE = "applied", "duplicate", "held", "restarted", "late"
"""What :meth:`KVIndex.apply` did with a batch (``restarted``: the view was reset, then the batch taken)."""


class KVIndex:
    """Per instance, the block hashes it holds and on which medium, built only from event batches.

    >>> from radixkv.events import BlockStored
    >>> from radixkv.events.wire import encode_batch
    >>> index = KVIndex()
    >>> index.apply("a", 0, encode_batch([BlockStored([11, 12], None, [1, 2, 3, 4], 2)]))
    'applied'
    >>> index.overlap([11, 12, 13])
    {'a': 2}

    Args:
        window: sequence numbers whose payload digests are kept per instance, to tell a
            duplicate from a restarted publisher's batch of the same number (vLLM's replay
            ring holds 10,000 batches; a batch more than ``window`` behind is a restart).
        max_held: batches held back per instance while a gap waits for its replay; past it
            the oldest gap is declared lost.
        replay_overlap: batches already applied that a replay asks for again, before the first
            one missing, to check them against what was applied: a restarted publisher whose
            first batches were lost and whose numbering went on exactly where the index stood
            shows only there (vLLM's protocol carries no publisher epoch), so it is found while
            the index has applied fewer than ``replay_overlap`` of its batches.

    Thread-safe: writers (:meth:`apply`, :meth:`lost`, :meth:`restart`) take one lock; readers
    (:meth:`overlap`) take none and see each page's mask as one atomic read.
    """

    def __init__(self, *, window: int = 10_000, max_held: int = 10_000, replay_overlap: int = 4) -> None:
        self.window = check_int(window, "window", minimum=1)
        self.max_held = check_int(max_held, "max_held", minimum=1)
        self.replay_overlap = check_int(replay_overlap, "replay_overlap", minimum=1, maximum=self.window)
        _decoders()
        self._where: Dict[BlockKey, int] = {}
        self._intern: Dict[int, int] = {}
        self._streams: Dict[Hashable, _Stream] = {}
        self._by_slot: List[Hashable] = []
        self._media: Dict[Medium, int] = {}
        self._lock = threading.RLock()
        self._table: Optional[MaskTable] = MaskTable({})
        """The dict's numpy mirror for batch lookups (:mod:`radixkv.router.table`), ``None`` once the
        index holds what it cannot mirror (more than 8 instances, or hashes that are not 64-bit ints)."""

    # ------------------------------------------------------------ reading
    def __len__(self) -> int:
        """Distinct block hashes held by any instance. O(1)."""
        return len(self._where)

    @property
    def instances(self) -> List[Hashable]:
        """Every instance a batch was applied for (or :meth:`add` named), in order of first sight."""
        return list(self._by_slot)

    @property
    def media(self) -> List[Medium]:
        """The ``(medium, locality)`` pairs seen, in bit order."""
        return list(self._media)

    def slot(self, instance: Hashable) -> Optional[int]:
        """The bit group of ``instance`` (``None`` if unknown). O(1)."""
        st = self._streams.get(instance)
        return None if st is None else st.slot

    def overlap(self, block_hashes: Sequence[BlockKey]) -> Dict[Hashable, int]:
        """Per known instance, how many leading ``block_hashes`` it holds, on any medium.

        Cost: one dict lookup per page up to the end of the longest held prefix, all at C speed
        (a running AND of the pages' masks), plus O(instances x log pages).
        """
        runs = self.runs(block_hashes)
        return {inst: runs[0].get(st.slot, 0) for inst, st in self._streams.items()}

    def runs(self, block_hashes: Union[Sequence[BlockKey], np.ndarray],
             weights: Optional[Sequence[float]] = None) -> Tuple[Dict[int, int], Dict[int, float]]:
        """``({slot: leading pages held}, {slot: their weight})`` for the instances that hold any.

        ``block_hashes`` may be a uint64 array (64-bit int hashes, as :class:`KVRouter` makes them).
        ``weights[m]`` is the worth of a page on medium ``m`` (:attr:`media` order); a page held
        on several media counts its best. Without ``weights`` the second dict is empty. Cost:
        as :meth:`overlap`, and when a held run is not all on the best medium one more lookup
        per page of it.
        """
        raw = self._masks_of(block_hashes)
        if isinstance(raw, np.ndarray):
            zeros = np.flatnonzero(raw == 0)  # the first page no instance holds ends every run
            total = int(zeros[0]) if zeros.size else len(raw)
            uniq, first = np.unique(raw[:total], return_index=True)
            firsts = dict(zip(uniq.tolist(), first.tolist()))
        else:
            try:
                total = raw.index(0)
            except ValueError:
                total = len(raw)
            firsts = self._firsts(raw, total)
        if not total:
            return {}, {}
        held = 0
        for mask in firsts:
            held |= mask
        pages: Dict[int, int] = {}
        common: Dict[int, int] = {}  # per instance: the media every page of its run is on
        varied: Dict[int, bool] = {}  # and whether some page of it is on others too
        while held:
            bit = (held & -held).bit_length() - 1
            slot = bit // GROUP_BITS  # a group's lowest bit is its any-medium bit
            shift = slot * GROUP_BITS
            held &= ~(_GROUP << shift)
            anyb = 1 << shift
            n = min((first for mask, first in firsts.items() if not mask & anyb), default=total)
            if n:
                pages[slot] = n
                both, either = -1, 0
                for mask, first in firsts.items():
                    if first < n:
                        both &= mask
                        either |= mask
                common[slot] = (both >> shift & _MEDIA) >> 1
                varied[slot] = (either >> shift & _MEDIA) >> 1 != common[slot]
        if weights is None:
            return pages, {}
        worth: Dict[int, float] = {}
        for slot, n in pages.items():
            if not varied[slot]:  # every page of the run on the same media
                media = common[slot]
                worth[slot] = n * max((weights[m] for m in range(len(weights)) if media >> m & 1), default=0.0)
                continue
            shift, w = slot * GROUP_BITS, 0.0
            if isinstance(raw, np.ndarray):
                masks, counts = np.unique(raw[:n], return_counts=True)
                counted = zip(masks.tolist(), counts.tolist())
            else:
                counted = Counter(islice(raw, n)).items()
            for mask, count in counted:
                media = (mask >> shift & _MEDIA) >> 1
                w += count * max((weights[m] for m in range(len(weights)) if media >> m & 1), default=0.0)
            worth[slot] = w
        return pages, worth

    def _masks_of(self, block_hashes: Union[Sequence[BlockKey], np.ndarray]) -> Union[np.ndarray, List[int]]:
        """The mask of each hash (0: nobody holds it): through the numpy table when it mirrors the dict and
        the hashes are 64-bit ints, else one dict lookup each."""
        table = self._table
        if isinstance(block_hashes, np.ndarray):  # uint64, as KVRouter hashes a request
            if table is not None:
                return table.lookup(block_hashes, self._where)
            block_hashes = block_hashes.tolist()
        elif table is not None and len(block_hashes) > 8 and block_hashes[0].__class__ is int:
            try:
                q = np.fromiter(block_hashes, np.uint64, len(block_hashes))
            except (OverflowError, TypeError, ValueError):  # not all 64-bit ints: the dict knows
                pass
            else:
                return table.lookup(q, self._where)
        return list(map(self._where.get, block_hashes, repeat(0)))

    @staticmethod
    def _firsts(raw: List[int], total: int) -> Dict[int, int]:
        """``{mask: the first page it is on}`` over ``raw[:total]``: with a handful of distinct masks (the
        usual case) each found by a C-speed scan, else in one pass."""
        distinct = set(islice(raw, total))
        if len(distinct) <= _FEW_MASKS:
            return {mask: raw.index(mask, 0, total) for mask in distinct}
        firsts: Dict[int, int] = {}
        for page, mask in enumerate(islice(raw, total)):
            firsts.setdefault(mask, page)
        return firsts

    def block_hashes(self, instance: Hashable, medium: Optional[Medium] = None) -> Set[BlockKey]:
        """The hashes ``instance`` holds (on ``medium`` only, when given). O(index)."""
        st = self._streams.get(instance)
        if st is None:
            return set()
        shift = st.slot * GROUP_BITS
        if medium is None:
            bit = 1 << shift
        elif medium in self._media:
            bit = 1 << (shift + 1 + self._media[medium])
        else:
            return set()
        with self._lock:
            return {h for h, mask in self._where.items() if mask & bit}

    def status(self, instance: Hashable) -> StreamStatus:
        """What the index knows of ``instance``'s stream (zeros for an unknown instance). O(1)."""
        st = self._streams.get(instance) or _Stream(-1)
        return StreamStatus(st.next_seq, bool(st.held), self._replay_start(st), st.exact, len(st.held), st.applied,
                            st.duplicates, st.gaps, st.restarts, st.clears, st.lost, st.malformed,
                            st.unknown_events, st.other_groups, st.blocks)

    def replay_from(self, instance: Hashable) -> Optional[int]:
        """The first sequence number a replay for ``instance`` should send, ``None`` when nothing is missing.

        ``replay_overlap`` before the missing batch: the replayed copies of batches already applied
        must equal them, or the publisher restarted. O(1).
        """
        st = self._streams.get(instance)
        return None if st is None else self._replay_start(st)

    def probe_from(self, instance: Hashable) -> int:
        """Where a replay that checks the tail of ``instance``'s stream starts (nothing missing known):
        ``replay_overlap`` batches back. O(1)."""
        st = self._streams.get(instance)
        return 0 if st is None else max(0, st.next_seq - self.replay_overlap)

    def _replay_start(self, st: _Stream) -> Optional[int]:
        if not st.held:
            return None
        return max(0, st.next_seq - self.replay_overlap)

    # ------------------------------------------------------------ writing
    def add(self, instance: Hashable) -> int:
        """Register ``instance`` (no-op if known); return its slot. O(1)."""
        try:
            hash(instance)
        except TypeError:
            raise ArgumentTypeError(f"instance must be hashable, got {instance!r}") from None
        with self._lock:
            st = self._streams.get(instance)
            if st is None:
                st = self._streams[instance] = _Stream(len(self._by_slot))
                self._by_slot.append(instance)
                if len(self._by_slot) > MaskTable.MAX_SLOTS:
                    self._table = None
            return st.slot

    def apply(self, instance: Hashable, seq: int, payload: Union[bytes, bytearray, memoryview]) -> str:
        """Take one message of ``instance``'s stream: its sequence number and msgpack ``KVEventBatch``.

        Returns what was done: ``"applied"`` (with any held batches it unblocked),
        ``"duplicate"`` (already applied: skipped), ``"held"`` (past a gap: kept until the
        replay fills it; see :meth:`replay_from`), ``"restarted"`` (the publisher restarted: the
        view was reset and the batch taken as the new stream's) or ``"late"`` (a batch declared
        lost arrived after all: skipped). A payload that does not decode is counted and skipped
        (its number is used up). Raises only on a bad argument (``seq`` not an int in
        [0, 2**64), ``payload`` not bytes), changing nothing. Cost: O(pages in the batch),
        plus O(index) for each reset.
        """
        seq = check_int(seq, "seq", minimum=0, maximum=2**64 - 1)
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise ArgumentTypeError(f"payload must be bytes, got {type(payload).__name__}")
        payload = bytes(payload)
        self.add(instance)
        with self._lock:
            st = self._streams[instance]
            outcome = APPLIED
            if seq < st.next_seq:
                digest = st.digests.get(seq, _MISSING)
                if digest is None:
                    st.duplicates += 1
                    return LATE
                if digest == hash(payload):
                    st.duplicates += 1
                    return DUPLICATE
                self._restart(st)  # same number, other bytes (or older than the window): a new stream
                outcome = RESTARTED
            if seq > st.next_seq:
                if seq in st.held:
                    st.duplicates += 1
                    return DUPLICATE
                if not st.held:
                    st.gaps += 1
                st.held[seq] = payload
                if len(st.held) > self.max_held:
                    self._skip(st)
                    self._drain(st)
                return HELD if outcome == APPLIED else outcome
            self._take(st, seq, payload)
            self._drain(st)
            return outcome

    def lost(self, instance: Hashable) -> int:
        """Declare the batches ``instance``'s view waits for unrecoverable (the replay no longer holds
        them): skip to the first held batch and go on, the view marked inexact. Returns the batches
        skipped (0 when none was missing). O(held batches)."""
        with self._lock:
            st = self._streams.get(instance)
            if st is None or not st.held:
                return 0
            before = st.lost
            self._skip(st)
            self._drain(st)
            return st.lost - before

    def restart(self, instance: Hashable) -> None:
        """``instance``'s publisher restarted (known otherwise than from a batch): forget everything it
        held and its stream, and expect batch 0. O(index)."""
        with self._lock:
            st = self._streams.get(instance)
            if st is not None:
                self._restart(st)

    # ------------------------------------------------------------ internals (lock held)
    def _restart(self, st: _Stream) -> None:
        self._clear(st)
        st.restarts += 1
        st.next_seq = 0
        st.held.clear()
        st.digests.clear()
        st.exact = True

    def _skip(self, st: _Stream) -> None:
        first = min(st.held)
        for s in range(max(st.next_seq, first - self.window), first):  # older ones fall out of the window anyway
            st.digests[s] = None
        for s in [s for s in st.digests if s < first - self.window]:
            del st.digests[s]
        st.lost += first - st.next_seq
        st.next_seq = first
        st.exact = False

    def _drain(self, st: _Stream) -> None:
        while st.next_seq in st.held:
            seq = st.next_seq
            self._take(st, seq, st.held.pop(seq))

    def _take(self, st: _Stream, seq: int, payload: bytes) -> None:
        st.next_seq = seq + 1
        st.digests[seq] = hash(payload)
        st.digests.pop(seq - self.window - 1, None)
        self._apply_events(st, payload)

    def _apply_events(self, st: _Stream, payload: bytes) -> None:
        decode, msgspec, types = _decoders()
        try:
            events = decode(payload).events
        except msgspec.ValidationError:  # (a DecodeError too) an event this index does not know: one by one
            events = self._lenient(st, payload, msgspec, types)
            if events is None:
                return
        except msgspec.DecodeError:
            st.malformed += 1
            st.exact = False
            return
        st.applied += 1
        touched: List[BlockKey] = []
        for event in events:
            kind = type(event).__name__
            if kind == "AllBlocksCleared":
                self._clear(st)
                st.clears += 1
                touched.clear()
                continue
            if event.group_idx not in (None, 0):
                st.other_groups += 1
                continue
            m = self._medium(event.medium, event.locality)
            if m is None:
                st.unknown_events += 1
                continue
            touched += event.block_hashes
            if kind == "BlockStored":
                self._store(st, event.block_hashes, m)
            else:
                self._remove(st, event.block_hashes, m)
        if touched and self._table is not None:
            self._mirror(touched)

    def _mirror(self, touched: List[BlockKey]) -> None:
        """Bring the numpy table up to date with the dict for ``touched`` keys (or give it up)."""
        keys = list(dict.fromkeys(touched))
        try:
            q = np.array(keys, dtype=np.uint64)
        except (OverflowError, TypeError, ValueError):
            q = None
        if q is None or not q.all():  # bytes hashes, or a hash 0 (the table's empty slot)
            self._table = None
            return
        masks = np.fromiter(map(self._where.get, keys, repeat(0)), np.uint64, len(keys))
        rebuilt = self._table.upsert(q, masks, self._where)
        if rebuilt is not None:
            self._table = rebuilt

    def _lenient(self, st: _Stream, payload: bytes, msgspec: Any, types: Mapping[str, Any]) -> Optional[List[Any]]:
        try:
            raw = msgspec.msgpack.decode(payload)
            if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
                raise ValueError("not a KVEventBatch")
        except (msgspec.DecodeError, ValueError):
            st.malformed += 1
            st.exact = False
            return None
        out = []
        for item in raw[1]:
            cls = types.get(item.get("type")) if isinstance(item, dict) else None
            try:
                if cls is None:
                    raise ValueError(item)
                out.append(msgspec.convert(item, cls))
            except (msgspec.ValidationError, ValueError):
                st.unknown_events += 1
        return out

    def _medium(self, medium: Optional[str], locality: Optional[str]) -> Optional[int]:
        key = (medium, locality)
        m = self._media.get(key)
        if m is None and len(self._media) < MAX_MEDIA:
            m = self._media[key] = len(self._media)
        return m

    def _store(self, st: _Stream, hashes: Iterable[BlockKey], m: int) -> None:
        shift = st.slot * GROUP_BITS
        bit = 1 << (shift + 1 + m)
        add = bit | (1 << shift)
        where, intern = self._where, self._intern
        new = 0
        for h in hashes:
            v = where.get(h, 0)
            if not v & bit:
                new += not v >> shift & 1
                v |= add
                where[h] = intern.setdefault(v, v)
        st.blocks += new

    def _remove(self, st: _Stream, hashes: Iterable[BlockKey], m: int) -> None:
        shift = st.slot * GROUP_BITS
        bit = 1 << (shift + 1 + m)
        media, anyb = _MEDIA << shift, 1 << shift
        where, intern = self._where, self._intern
        gone = 0
        for h in hashes:
            v = where.get(h, 0)
            if not v & bit:
                continue  # not held there: a removal after a reset, or of a page never reported
            v &= ~bit
            if not v & media:
                v &= ~anyb
                gone += 1
            if v:
                where[h] = intern.setdefault(v, v)
            else:
                del where[h]
        st.blocks -= gone

    def _clear(self, st: _Stream) -> None:
        keep = ~(_GROUP << (st.slot * GROUP_BITS))
        intern = self._intern
        where = {}
        for h, v in self._where.items():
            v &= keep
            if v:
                where[h] = intern.setdefault(v, v)
        self._where = where
        st.blocks = 0
        if self._table is not None:
            self._table = MaskTable(where)

    # ------------------------------------------------------------ checks
    def check(self) -> None:
        """O(index) check: every mask is interned, non-zero, its any-medium bits exactly the instances
        with a medium bit, and each instance's page count equals its any-medium bits."""
        with self._lock:
            counts = [0] * len(self._by_slot)
            for h, v in self._where.items():
                assert v, f"block {h!r} held by no instance is still indexed"
                assert self._intern.get(v) is v, f"mask {v:#x} of block {h!r} is not interned"
                for slot in range(len(self._by_slot)):
                    group = v >> (slot * GROUP_BITS) & _GROUP
                    assert bool(group & 1) == bool(group & _MEDIA), f"block {h!r}: instance slot {slot} any-bit wrong"
                    counts[slot] += group & 1
                assert v >> (len(self._by_slot) * GROUP_BITS) == 0, f"block {h!r}: bits of no instance"
            if self._table is not None:
                self._table.check(self._where)
            for inst, st in self._streams.items():
                assert counts[st.slot] == st.blocks, f"instance {inst!r}: counted {st.blocks}, holds {counts[st.slot]}"
                assert all(s > st.next_seq for s in st.held), f"instance {inst!r}: held a batch it has passed"

    def __repr__(self) -> str:
        return f"KVIndex(instances={len(self._by_slot)}, blocks={len(self._where)}, media={list(self._media)})"


def fill_gaps(index: KVIndex, instance: Hashable, ask: Callable[[int], Tuple[bool, Optional[int]]], *,
              probe: bool = False) -> None:
    """Fill what ``index`` misses of ``instance``'s stream through ``ask(start)``: a replay request that
    applies every batch the publisher sends from ``start`` and returns ``(complete, first)``, whether
    its end marker came and the first sequence number it carried (``None``: none).

    With ``probe`` it asks even with no gap, from :meth:`KVIndex.probe_from` (``replay_overlap``
    batches back: a lost last batch leaves no gap). The answer is read as evidence: a publisher that no longer has the last batch applied
    and nothing after it restarted (the view is reset and the replay asked again from 0; a live
    publisher's ring always holds its latest batch); a complete answer that leaves the gap open
    means the ring moved past the missing batches: they are declared lost (:meth:`KVIndex.lost`).
    At most three requests. Cost: the replays'.
    """
    for _ in range(3):
        start = index.replay_from(instance)
        if start is None:
            if not probe:
                return
            start = index.probe_from(instance)
        status = index.status(instance)
        done, first = ask(start)
        if not done:
            return
        if first is None and status.next_seq > start and index.status(instance).restarts == status.restarts:
            index.restart(instance)  # it lacks the batch we applied last, and has nothing newer
            probe = False
            continue
        if index.replay_from(instance) is None:
            return
        if index.status(instance).restarts == status.restarts:
            index.lost(instance)
            return
        probe = False


__all__ = ["APPLIED", "BlockKey", "DUPLICATE", "HELD", "KVIndex", "LATE", "MAX_MEDIA", "Medium", "RESTARTED",
           "StreamStatus", "fill_gaps"]

"""KV cache events: what a KV-aware router needs to know about cached pages.

Field names and order follow SGLang's ``sglang/srt/disaggregation/kv_events.py``
(``BlockStored(block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium)``, ``BlockRemoved(block_hashes, medium)``,
``AllBlocksCleared()``) and vLLM's ``vllm/distributed/kv_events.py``, which
adds ``lora_name`` and ``extra_keys`` to ``BlockStored``; so a consumer written
for either (Dynamo's KV router, say) reads radixkv's events unchanged.
Hashes are the 64-bit integer form of radixkv's vLLM-compatible chained page
hashes (:func:`radixkv.hashing.external_block_hash`), or the full hash bytes
with ``BlockHasher(use_int_block_hashes=False)``.

Residency on the device is reported by the engine itself: ``BlockStored``
(``medium="GPU"``) when pages enter HBM (inserted, or loaded back from a lower
tier) and ``BlockRemoved`` (``medium="GPU"``) when they leave it (evicted,
whether dropped or demoted). A consumer that tracks only HBM can therefore
read radixkv exactly as it reads SGLang or vLLM. Tier moves have no
counterpart in either engine; radixkv adds :class:`BlockDemoted` (pages now
also on a lower tier ``medium``, copied from ``source_medium``) and
:class:`BlockPromoted` (pages moved from ``source_medium`` into ``medium``),
emitted by the tier layer through :meth:`EventLog.lower_tier`. Each converts
to the plain events that carry the same lower-tier residency
(:meth:`BlockDemoted.as_store_remove`), the form SGLang's hierarchical cache
reports a host copy in.

Per medium the events are a faithful log: applying them in order (stored and
demoted add pages to their ``medium``, removed and promoted take them off
``medium`` / ``source_medium``, cleared empties every medium) gives the pages
each tier holds. A lower tier reports its own losses too: a page cascaded to
the next tier (``BlockRemoved`` on its medium, then ``BlockDemoted`` on the
next), dropped from the last tier, refused by a tier's write (never reported
as stored), failed its checksum, or lost with its remote host.

:class:`EventLog` is the engine-side recorder. A :class:`~radixkv.PrefixCache`
created with ``enable_events=True`` owns one and calls it at every point where
pages enter or leave the cache; created without, it holds ``None`` and pays a
single ``is not None`` test at those points.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import numpy as np

from .errors import ArgumentTypeError, ArgumentValueError
from .hashing import BlockHash, BlockHasher
from .keys import TOKEN_DTYPE
from .tree import namespace_of

if TYPE_CHECKING:  # pragma: no cover
    from .cache import PrefixCache
    from .tree import Node

ExternalBlockHash = Union[int, bytes]

MEDIUM_GPU = "GPU"
"""Device memory (HBM): where :class:`~radixkv.PrefixCache`'s own blocks live."""
MEDIUM_CPU = "CPU"
"""Host memory."""
MEDIUM_DISK = "DISK"
"""Local disk."""
MEDIUM_REMOTE = "REMOTE"
"""A remote or shared store."""

TIER_MEDIUM: Dict[str, str] = {"device": MEDIUM_GPU, "host": MEDIUM_CPU, "disk": MEDIUM_DISK, "remote": MEDIUM_REMOTE}
"""The ``medium`` string of each radixkv tier name."""


class KVCacheEvent:
    """Base class of every event (a tagged union, tagged by class name as msgspec does)."""

    __slots__ = ()

    def as_dict(self) -> Dict[str, Any]:
        """The event as a plain dict with a ``"type"`` tag (the class name)."""
        out: Dict[str, Any] = {"type": type(self).__name__}
        out.update(asdict(self))  # type: ignore[call-overload]
        return out


@dataclass(frozen=True, slots=True)
class BlockStored(KVCacheEvent):
    """Pages became cached on ``medium``.

    Attributes:
        block_hashes: one hash per page, in order; each chains on the previous.
        parent_block_hash: hash of the page before the first one, ``None`` at a sequence start.
        token_ids: the tokens of all these pages, concatenated.
        block_size: tokens per page.
        lora_id: always ``None`` (radixkv keys adapters by namespace; see ``extra_keys``).
        medium: where the pages are, e.g. ``"GPU"``.
        lora_name: always ``None`` (as above).
        extra_keys: each page's extra keys untagged, as vLLM publishes them
            (``(namespace,)`` on a namespaced sequence's first page, hashed as
            ``(("cache_salt", namespace),)``; else ``None``); ``None`` when all are.
    """

    block_hashes: List[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int] = None
    medium: Optional[str] = MEDIUM_GPU
    lora_name: Optional[str] = None
    extra_keys: Optional[List[Optional[Tuple[Any, ...]]]] = None


@dataclass(frozen=True, slots=True)
class BlockRemoved(KVCacheEvent):
    """Pages left ``medium`` (evicted, or their copy there was dropped)."""

    block_hashes: List[ExternalBlockHash]
    medium: Optional[str] = MEDIUM_GPU


@dataclass(frozen=True, slots=True)
class AllBlocksCleared(KVCacheEvent):
    """Every page of the cache was dropped (``reset``)."""


@dataclass(frozen=True, slots=True)
class _TierMove(KVCacheEvent):
    block_hashes: List[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: List[int]
    block_size: int
    medium: str
    source_medium: str


@dataclass(frozen=True, slots=True)
class BlockDemoted(_TierMove):
    """Pages copied down a tier: a copy is now on ``medium`` (e.g. ``"CPU"``), from ``source_medium``.

    Same fields as :class:`BlockStored` minus the LoRA ones, plus ``source_medium``.
    It changes nothing on ``source_medium``: the device side
    (``BlockRemoved(medium="GPU")``) is reported by the engine when HBM drops the
    pages (write-back), never under write-through (HBM keeps them); a cascade
    between lower tiers is preceded by ``BlockRemoved`` on ``source_medium``.
    """

    def as_store_remove(self) -> List[KVCacheEvent]:
        """The plain events with the same meaning for the lower tier: ``BlockStored`` on ``medium``."""
        return [BlockStored(list(self.block_hashes), self.parent_block_hash, list(self.token_ids),
                            self.block_size, medium=self.medium)]


@dataclass(frozen=True, slots=True)
class BlockPromoted(_TierMove):
    """Pages moved from ``source_medium`` (e.g. ``"CPU"``) into ``medium`` (e.g. ``"GPU"``).

    The arrival in HBM is reported by the engine (``BlockStored(medium="GPU")``);
    this event says where the pages came from and that their copy left
    ``source_medium``. Only an exclusive (write-back) tier gives its copy up; a
    write-through tier keeps it, so a load from it is reported by the engine's
    ``BlockStored`` alone.
    """

    def as_store_remove(self, *, exclusive: bool = True) -> List[KVCacheEvent]:
        """The plain events with the same meaning for the lower tier: ``BlockRemoved`` on
        ``source_medium`` if the tier is exclusive (its copy moved up), else nothing."""
        return [BlockRemoved(list(self.block_hashes), medium=self.source_medium)] if exclusive else []


EVENT_TYPES = (BlockStored, BlockRemoved, AllBlocksCleared, BlockDemoted, BlockPromoted)


def event_field_names(cls: type) -> Tuple[str, ...]:
    """Field names of an event class, in wire order."""
    return tuple(f.name for f in fields(cls))


# ------------------------------------------------------------------ recorder
class EventLog:
    """Engine-side event recorder and page-hash index of one :class:`~radixkv.PrefixCache`.

    Keeps the chained hash of every cached block (``block -> hash``) and the
    reverse index (``hash -> block``), so eviction reports hashes in O(1) per
    page and :class:`radixkv.adapters.vllm.VLLMBlockView` can look pages up by
    hash. Only the engine mutates it, from the owner thread.

    Cost: one SHA-256 per stored page (about 3 us a page, pages encoded in
    bulk), a few C-speed operations per removed page; memory
    33 bytes per block plus one dict entry per cached page.
    """

    __slots__ = ("_cache", "hasher", "_events", "_hashes", "_has", "_index")

    def __init__(self, cache: "PrefixCache", hasher: Optional[BlockHasher] = None) -> None:
        self._cache = cache
        self.hasher = hasher if hasher is not None else BlockHasher()
        self._events: List[KVCacheEvent] = []
        self._hashes = np.zeros((cache.num_blocks, 32), dtype=np.uint8)  # block -> its page's hash
        self._has = np.zeros(cache.num_blocks, dtype=bool)
        self._index: Dict[BlockHash, int] = {}  # hash -> block

    # ------------------------------------------------------------ queries
    def __len__(self) -> int:
        """Events waiting to be taken."""
        return len(self._events)

    def take(self) -> List[KVCacheEvent]:
        """Every event recorded since the last call, oldest first; clears the log. O(1)."""
        events, self._events = self._events, []
        return events

    def lookup(self, block_hash: BlockHash) -> Optional[int]:
        """The cached block holding the page with full hash ``block_hash``, or ``None``. O(1)."""
        return self._index.get(block_hash)

    def block_hash(self, block: int) -> Optional[BlockHash]:
        """Full hash of the page cached in ``block``, or ``None`` if the block holds no cached page."""
        if not 0 <= block < len(self._has) or not self._has[block]:
            return None
        return self._hashes[block].tobytes()

    def page_hashes(self, node: "Node") -> List[BlockHash]:
        """Full hashes of every page of ``node``, in order. Cost: O(pages of node), or O(depth) on a miss.

        Uses the parent's indexed last-page hash when there is one, else
        recomputes the chain from the root's tokens (pages on another tier).
        """
        parent_hash, first = self._parent_hash(node)
        return self.hasher.chain(self._tokens(node), parent_hash, node.start, namespace_of(node) if first else None)

    # ------------------------------------------------------------ engine hooks
    def stored(self, leaf: "Node") -> None:
        """``leaf`` was just added holding newly cached pages: index them, emit ``BlockStored``."""
        parent_hash, first = self._parent_hash(leaf)
        namespace = namespace_of(leaf) if first else None
        tokens = self._tokens(leaf)
        hashes = self.hasher.chain(tokens, parent_hash, leaf.start, namespace)
        blocks = leaf.blocks
        joined = b"".join(hashes)
        self._hashes[blocks] = np.frombuffer(joined, dtype=np.uint8).reshape(-1, 32)
        self._has[blocks] = True
        self._index.update(zip(hashes, blocks.tolist()))
        extra = None
        if namespace is not None:
            extra = [(namespace,)] + [None] * (len(hashes) - 1)
        self._events.append(BlockStored(
            self.hasher.event_hashes(hashes),
            self.hasher.event_hash(parent_hash) if parent_hash is not None else None,
            tokens.ravel().tolist(), self._cache.page_size, None, MEDIUM_GPU, None, extra))

    def removed(self, blocks: np.ndarray) -> None:
        """Cached ``blocks`` are about to go back to the pool: unindex them, emit ``BlockRemoved``."""
        blocks = blocks[self._has[blocks]]  # skip any not indexed
        if not len(blocks):
            return
        raw = self._hashes[blocks].tobytes()
        self._has[blocks] = False
        hashes = [raw[i : i + 32] for i in range(0, len(raw), 32)]
        deque(map(self._index.__delitem__, hashes), maxlen=0)
        self._events.append(BlockRemoved(self.hasher.event_hashes(hashes), MEDIUM_GPU))

    def cleared(self) -> None:
        """Every page was dropped: clear the index, emit ``AllBlocksCleared``."""
        self._has[:] = False
        self._index.clear()
        self._events.append(AllBlocksCleared())

    # ------------------------------------------------------------ tier hooks
    def demoted(self, node: "Node", pages: range, *, medium: str, source_medium: str = MEDIUM_GPU) -> None:
        """Pages ``pages`` (indices within ``node``) were copied down to ``medium``: emit :class:`BlockDemoted`.

        Call while ``node`` still holds those pages (a tier layer's spill hook
        runs before the engine truncates). The HBM index is the engine's
        business and is not touched here. Cost: O(pages of node) hashes.
        """
        self._move(BlockDemoted, node, pages, medium, source_medium)

    def promoted(self, node: "Node", pages: range, *, source_medium: str, medium: str = MEDIUM_GPU) -> None:
        """Pages ``pages`` of ``node`` were loaded from ``source_medium``: emit :class:`BlockPromoted`."""
        self._move(BlockPromoted, node, pages, medium, source_medium)

    def _move(self, cls: type, node: "Node", pages: range, medium: str, source_medium: str) -> None:
        if not isinstance(pages, range) or pages.step != 1 or not 0 <= pages.start <= pages.stop <= node.num_pages:
            raise ArgumentValueError(f"pages must be a range within the node's {node.num_pages} pages, got {pages!r}")
        if not len(pages):
            return
        hashes = self.page_hashes(node)
        start, stop = pages.start, pages.stop
        parent = hashes[start - 1] if start > 0 else self._parent_hash(node)[0]
        tokens = self._tokens(node)[start:stop]
        self._events.append(cls(
            self.hasher.event_hashes(hashes[start:stop]),
            self.hasher.event_hash(parent) if parent is not None else None,
            tokens.ravel().tolist(), self._cache.page_size, medium, source_medium))

    def lower_tier(self, kind: str, root: "Node", data: bytes, start: int, *, medium: str,
                   source_medium: str = MEDIUM_GPU) -> None:
        """Pages ``start..`` of ``data`` changed residency on lower tier ``medium``.

        ``data`` is the whole pages of the sequence from its first one, under
        the engine's namespace root ``root``. ``kind`` ``"stored"`` emits
        :class:`BlockDemoted` (copied from ``source_medium``), ``"removed"``
        :class:`BlockRemoved` and ``"promoted"`` :class:`BlockPromoted` (the
        pages moved up to the GPU). The chain continues from the indexed hash
        of page ``start - 1`` when HBM holds it (a C-speed walk), else it is
        hashed from the sequence's first page. Cost: O(pages changed) hashes,
        O(pages of data) when the page before them is not in HBM.
        """
        size = self._cache.page_size
        tokens = np.frombuffer(data, dtype=TOKEN_DTYPE).reshape(-1, size)
        namespace = namespace_of(root)
        parent = self._hbm_page_hash(root, data, start) if start else None
        if parent is None and start:
            hashes = self.hasher.chain(tokens, None, 0, namespace)
            parent, hashes = hashes[start - 1], hashes[start:]
        else:
            hashes = self.hasher.chain(tokens[start:], parent, start, namespace)
        ints = self.hasher.event_hashes(hashes)
        if kind == "removed":
            self._events.append(BlockRemoved(ints, medium))
            return
        parent_int = self.hasher.event_hash(parent) if parent is not None else None
        pages = tokens[start:].ravel().tolist()
        if kind == "stored":
            self._events.append(BlockDemoted(ints, parent_int, pages, size, medium, source_medium))
        elif kind == "promoted":
            self._events.append(BlockPromoted(ints, parent_int, pages, size, MEDIUM_GPU, medium))
        else:
            raise ArgumentValueError(f"kind must be 'stored', 'removed' or 'promoted', got {kind!r}")

    def _hbm_page_hash(self, root: "Node", data: bytes, pos: int) -> Optional[BlockHash]:
        """The indexed hash of page ``pos - 1`` of ``data`` under ``root`` if HBM holds it, else ``None``."""
        node, end, child, common = self._cache._tree.walk(root, data, pos)
        holder = node if end == pos else child if end + common == pos else None
        if holder is None or holder.parent is None:
            return None
        return self.block_hash(int(holder.blocks[pos - 1 - holder.start]))

    # ------------------------------------------------------------ checks
    def check(self) -> None:
        """O(cached pages) check: every cached block is indexed under its recomputed chain hash."""
        cache = self._cache
        expected: Dict[int, BlockHash] = {}
        for node in cache.nodes():
            parent = node.parent
            parent_hash = None if parent.parent is None else expected.get(int(parent.blocks[-1]))
            if parent.parent is not None and parent_hash is None:
                parent_hash = self.page_hashes(parent)[-1]
            first = parent.parent is None
            hashes = self.hasher.chain(self._tokens(node), parent_hash, node.start,
                                       namespace_of(node) if first else None)
            for block, h in zip(node.blocks.tolist(), hashes):
                expected[block] = h
        for block, h in expected.items():
            assert self.block_hash(block) == h, (
                f"block {block}: indexed hash {self.block_hash(block)!r} != chain hash {h!r}")
            assert self._index.get(h) == block, f"hash of block {block} not indexed to it"
        stray = [b for b in np.flatnonzero(self._has).tolist() if b not in expected]
        assert not stray, f"blocks {stray[:10]} are indexed but not cached"
        assert len(self._index) == len(expected), (
            f"index holds {len(self._index)} hashes for {len(expected)} cached pages")

    # ------------------------------------------------------------ internals
    def _tokens(self, node: "Node") -> np.ndarray:
        n = node.num_pages
        return np.frombuffer(node.key, dtype=TOKEN_DTYPE, count=n * self._cache.page_size).reshape(n, -1)

    def _parent_hash(self, node: "Node") -> Tuple[Optional[BlockHash], bool]:
        """(hash of the page before ``node``'s first, whether ``node`` starts its sequence)."""
        parent = node.parent
        if parent.parent is None:
            return None, True
        h = self.block_hash(int(parent.blocks[-1])) if parent.num_pages else None
        if h is None:
            h = self.page_hashes(parent)[-1]
        return h, False


def make_event_log(cache: "PrefixCache", enable_events: Union[bool, BlockHasher]) -> Optional[EventLog]:
    """The :class:`EventLog` for ``PrefixCache(enable_events=...)``: ``None`` when disabled.

    ``enable_events`` is a bool, or a :class:`~radixkv.hashing.BlockHasher`
    to choose the hash function and seed (enables events).
    """
    if isinstance(enable_events, BlockHasher):
        return EventLog(cache, enable_events)
    if not isinstance(enable_events, bool):
        raise ArgumentTypeError(f"enable_events must be a bool or a BlockHasher, got {enable_events!r}")
    return EventLog(cache) if enable_events else None


def __getattr__(name: str) -> Any:
    """``ZmqEventPublisher`` and ``publish_from`` live in :mod:`radixkv.events_wire` (it needs pyzmq)."""
    if name in ("ZmqEventPublisher", "publish_from"):
        from . import events_wire

        return getattr(events_wire, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AllBlocksCleared", "BlockDemoted", "BlockPromoted", "BlockRemoved", "BlockStored",
    "EVENT_TYPES", "EventLog", "ExternalBlockHash", "KVCacheEvent", "MEDIUM_CPU", "MEDIUM_DISK",
    "MEDIUM_GPU", "MEDIUM_REMOTE", "TIER_MEDIUM", "event_field_names", "make_event_log",
]

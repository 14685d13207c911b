"""KV cache events: what a KV-aware router needs to know about cached pages.

Field names and order follow SGLang's ``sglang/srt/disaggregation/kv_events.py``
(``BlockStored(block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium)``, ``BlockRemoved(block_hashes, medium)``,
``AllBlocksCleared()``) and vLLM's ``vllm/distributed/kv_events.py``, which
adds ``lora_name`` and ``extra_keys`` to ``BlockStored``; so a consumer written
for either (Dynamo's KV router, say) reads radixkv's events unchanged.
Hashes are the 64-bit integer form of radixkv's vLLM-compatible chained page
hashes (:func:`radixkv.events.hashing.external_block_hash`), or the full hash bytes
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
created with ``enable_events=True`` owns one and tells it (one of its page
observers, :class:`~radixkv.events.page_hashes.PageObserver`) of every point where
pages enter or leave the cache; created without, it holds ``None`` and pays
nothing for it. The recorder takes every hash from the cache's page-hash index
(:mod:`radixkv.events.page_hashes`), which a cache can also keep without events.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Protocol, Tuple, Union

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError
from .hashing import BlockHash, BlockHasher
from ..keys import TOKEN_DTYPE
from .page_hashes import PageHashIndex, PageObserver, node_tokens
from ..tree import namespace_of

if TYPE_CHECKING:  # pragma: no cover
    from ..tree import Node

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
class RecordedCache(Protocol):
    """What :class:`EventLog` reads of the cache it records (a :class:`~radixkv.PrefixCache`'s public
    surface; this module does not import the engine)."""

    num_blocks: int
    page_size: int

    def nodes(self) -> Iterator["Node"]: ...

    def peek_match(self, tokens: Any, *, namespace: Optional[str] = None) -> Any: ...


class EventLog:
    """Engine-side event recorder of one :class:`~radixkv.PrefixCache`.

    It composes the cache's :class:`~radixkv.events.page_hashes.PageHashIndex`: as the
    cache's page observer it hands each change to the index, which hashes new
    pages once and gives back the hashes of pages leaving, and records the
    event with those hashes. A tier layer reports lower-tier residency through
    :meth:`lower_tier` (or :meth:`demoted` / :meth:`promoted`), which read the
    hashes of pages HBM holds from the index and hash only the others. Only the
    engine and its tier layer call it, from the owner thread.

    Cost: the index's (one hash per page entering HBM, a few C-speed operations
    per page leaving) plus one event per change.
    """

    __slots__ = ("_cache", "index", "_events")

    def __init__(self, cache: RecordedCache, hasher: Optional[BlockHasher] = None) -> None:
        self._cache = cache
        self.index = PageHashIndex(cache.num_blocks, cache.page_size, hasher, cache.nodes())
        """The page-hash index the events take their hashes from."""
        self._events: List[KVCacheEvent] = []

    # ------------------------------------------------------------ queries
    def __len__(self) -> int:
        """Events waiting to be taken."""
        return len(self._events)

    @property
    def hasher(self) -> BlockHasher:
        """The hash function and seed of the events' hashes."""
        return self.index.hasher

    def resident_hashes(self) -> List[Union[int, bytes]]:
        """The event hashes of every page in the cache's HBM: what a router's view of it should hold. O(pages)."""
        return self.hasher.event_hashes(list(self.index))

    def take(self) -> List[KVCacheEvent]:
        """Every event recorded since the last call, oldest first; clears the log. O(1)."""
        events, self._events = self._events, []
        return events

    def restore(self, events: List[KVCacheEvent]) -> None:
        """Put back ``events``, taken by :meth:`take` but not delivered (a publish failed), ahead
        of any recorded since, so the next :meth:`take` returns them all in order. O(events)."""
        self._events[:0] = events

    def lookup(self, block_hash: BlockHash) -> Optional[int]:
        """As :meth:`PageHashIndex.lookup <radixkv.events.page_hashes.PageHashIndex.lookup>`. O(1)."""
        return self.index.lookup(block_hash)

    def block_hash(self, block: int) -> Optional[BlockHash]:
        """As :meth:`PageHashIndex.block_hash <radixkv.events.page_hashes.PageHashIndex.block_hash>`. O(1)."""
        return self.index.block_hash(block)

    def page_hashes(self, node: "Node") -> List[BlockHash]:
        """As :meth:`PageHashIndex.page_hashes <radixkv.events.page_hashes.PageHashIndex.page_hashes>`. O(pages of node)."""
        return self.index.page_hashes(node)

    # ------------------------------------------------------------ engine hooks (a page observer)
    def stored(self, leaf: "Node") -> None:
        """``leaf`` was just added holding newly cached pages: index them, emit ``BlockStored``.

        All or nothing: if making the event raises (a hash function), the pages are unindexed
        again before the error propagates, so the undo of the insert (which tells every
        observer :meth:`removed`) emits no ``BlockRemoved`` for pages no consumer was told of.
        """
        parent_hash, hashes, namespace = self.index.stored(leaf)
        try:
            extra = None
            if namespace is not None:
                extra = [(namespace,)] + [None] * (len(hashes) - 1)
            hasher = self.index.hasher
            event = BlockStored(
                hasher.event_hashes(hashes), hasher.event_hash(parent_hash) if parent_hash is not None else None,
                node_tokens(leaf, self.index.page_size).ravel().tolist(), self.index.page_size,
                None, MEDIUM_GPU, None, extra)
        except BaseException:
            self.index.removed(leaf.blocks)
            raise
        self._events.append(event)

    def removed(self, blocks: np.ndarray) -> None:
        """Cached ``blocks`` are about to go back to the pool: unindex them, emit ``BlockRemoved``."""
        hashes = self.index.removed(blocks)
        if hashes:
            self._events.append(BlockRemoved(self.index.hasher.event_hashes(hashes), MEDIUM_GPU))

    def cleared(self) -> None:
        """Every page was dropped: clear the index, emit ``AllBlocksCleared``."""
        self.index.cleared()
        self._events.append(AllBlocksCleared())

    # ------------------------------------------------------------ tier hooks
    def demoted(self, node: "Node", pages: range, *, medium: str, source_medium: str = MEDIUM_GPU) -> None:
        """Pages ``pages`` (indices within ``node``) were copied down to ``medium``: emit :class:`BlockDemoted`.

        Call while ``node`` still holds those pages (a tier layer's spill hook
        runs before the engine truncates). The HBM index is the engine's
        business and is not touched here. Cost: O(pages of node), the hashes
        read from the index.
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
        index = self.index
        hashes = index.page_hashes(node)
        start, stop = pages.start, pages.stop
        parent = hashes[start - 1] if start > 0 else index.parent_hash(node)[0]
        self._record_move(cls, hashes[start:stop], parent, node_tokens(node, index.page_size)[start:stop],
                          medium, source_medium)

    def _record_move(self, cls: type, hashes: List[BlockHash], parent: Optional[BlockHash], tokens: np.ndarray,
                     medium: str, source_medium: str) -> None:
        hasher = self.index.hasher
        self._events.append(cls(
            hasher.event_hashes(hashes), hasher.event_hash(parent) if parent is not None else None,
            tokens.ravel().tolist(), self.index.page_size, medium, source_medium))

    def lower_tier(self, kind: str, root: "Node", data: bytes, start: int, *, medium: str,
                   source_medium: str = MEDIUM_GPU) -> None:
        """Pages ``start..`` of ``data`` changed residency on lower tier ``medium``.

        ``data`` is the whole pages of the sequence from its first one, under
        the engine's namespace root ``root``. ``kind`` ``"stored"`` emits
        :class:`BlockDemoted` (copied from ``source_medium``), ``"removed"``
        :class:`BlockRemoved` and ``"promoted"`` :class:`BlockPromoted` (the
        pages moved up to the GPU). The hashes of the leading pages HBM holds
        are read from the index (:meth:`~radixkv.PrefixCache.peek_match`, which
        touches nothing); only the pages after them are hashed. Cost: a C-speed
        walk of ``data`` plus one hash per page from the deepest page HBM holds
        (none when HBM holds them all).
        """
        if kind not in ("stored", "removed", "promoted"):
            raise ArgumentValueError(f"kind must be 'stored', 'removed' or 'promoted', got {kind!r}")
        index = self.index
        tokens = np.frombuffer(data, dtype=TOKEN_DTYPE).reshape(-1, index.page_size)
        namespace = namespace_of(root)
        held = self._cache.peek_match(tokens.ravel(), namespace=namespace).blocks
        parent, hashes = index.path_hashes(tokens, namespace, start, held)
        if kind == "removed":
            self._events.append(BlockRemoved(index.hasher.event_hashes(hashes), medium))
        elif kind == "stored":
            self._record_move(BlockDemoted, hashes, parent, tokens[start:], medium, source_medium)
        else:
            self._record_move(BlockPromoted, hashes, parent, tokens[start:], MEDIUM_GPU, medium)

    # ------------------------------------------------------------ checks
    def check(self) -> None:
        """O(cached pages) check of the index: every cached block is indexed under its recomputed chain hash."""
        self.index.check(self._cache.nodes())


def make_event_log(cache: RecordedCache, enable_events: Union[bool, BlockHasher]) -> Optional[EventLog]:
    """The :class:`EventLog` for ``PrefixCache(enable_events=...)``: ``None`` when disabled.

    ``enable_events`` is a bool, or a :class:`~radixkv.events.hashing.BlockHasher`
    to choose the hash function and seed (enables events).
    """
    if isinstance(enable_events, BlockHasher):
        return EventLog(cache, enable_events)
    if not isinstance(enable_events, bool):
        raise ArgumentTypeError(f"enable_events must be a bool or a BlockHasher, got {enable_events!r}")
    return EventLog(cache) if enable_events else None


__all__ = [
    "AllBlocksCleared", "BlockDemoted", "BlockPromoted", "BlockRemoved", "BlockStored",
    "EVENT_TYPES", "EventLog", "ExternalBlockHash", "KVCacheEvent", "MEDIUM_CPU", "MEDIUM_DISK",
    "MEDIUM_GPU", "MEDIUM_REMOTE", "PageHashIndex", "PageObserver", "RecordedCache", "TIER_MEDIUM", "event_field_names",
    "make_event_log",
]

"""The page-hash index: the chained hash of every page cached in HBM, both ways.

radixkv finds pages by token prefix; vLLM, its routers and its KV connectors
find them by chained block hash (:mod:`radixkv.events.hashing`). A
:class:`PageHashIndex` keeps ``block -> hash`` and ``hash -> block`` for every
cached block, so the event recorder (:class:`radixkv.events.EventLog`) reports
a page's hash without hashing it again and
:class:`radixkv.adapters.vllm.VLLMBlockView` looks pages up by hash. A
:class:`~radixkv.PrefixCache` keeps one when created with ``enable_events``
(the recorder's) or after :meth:`~radixkv.PrefixCache.attach_page_hashes`.

It is a page observer (:class:`PageObserver`): the engine tells it of every
node of newly cached pages, of blocks about to leave and of a reset, and it
hashes each page once, when the page enters HBM. It reads nodes and knows
nothing of the engine: this module imports neither the cache nor the events.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Dict, Hashable, Iterable, Iterator, List, Optional, Protocol, Tuple

import numpy as np

from ..errors import ArgumentTypeError
from .hashing import BlockHash, BlockHasher
from ..keys import TOKEN_DTYPE
from ..tree import namespace_of

if TYPE_CHECKING:  # pragma: no cover
    from ..tree import Node


class PageObserver(Protocol):
    """What a :class:`~radixkv.PrefixCache` tells an observer of its cached pages.

    Calls come from the engine's owner thread, at the moment pages change:
    :meth:`stored` after a node of newly cached pages is added (parents before
    children), :meth:`removed` before cached blocks go back to the pool, and
    :meth:`cleared` on reset. The page-hash index (:class:`PageHashIndex`, or the
    event recorder that composes it) and the replay's
    :class:`radixkv.analysis.stats.PageIndex` are observers.
    """

    def stored(self, leaf: "Node") -> object: ...

    def removed(self, blocks: np.ndarray) -> object: ...

    def cleared(self) -> None: ...


def node_tokens(node: "Node", page_size: int) -> np.ndarray:
    """The tokens of ``node``'s pages as a ``(pages, page_size)`` view of its key (no copy). O(1)."""
    n = node.num_pages
    return np.frombuffer(node.key, dtype=TOKEN_DTYPE, count=n * page_size).reshape(n, page_size)


class PageHashIndex:
    """``block -> chain hash`` and ``hash -> block`` of every page cached in HBM.

    >>> from radixkv import PrefixCache
    >>> cache = PrefixCache(num_blocks=8, page_size=2)
    >>> index = cache.attach_page_hashes()
    >>> blocks = cache.admit([1, 2, 3, 4]).blocks
    >>> [index.lookup(h) for h in index.hasher.hash_pages([1, 2, 3, 4], 2)] == blocks.tolist()
    True

    Cost: one hash per page when it enters HBM (:meth:`BlockHasher.chain`:
    about 1-3 us a page with the default ``sha256``), a few C-speed operations
    per page that leaves; memory one reference per block plus one dict entry
    (and one 32-byte hash) per cached page.

    Args:
        num_blocks: blocks in the cache's pool.
        page_size: tokens per page.
        hasher: the hash function and seed (default :class:`BlockHasher`'s, vLLM's).
        nodes: nodes already cached, parents before children (``cache.nodes()``), to index now.
    """

    __slots__ = ("hasher", "page_size", "_by_block", "_blocks")

    def __init__(self, num_blocks: int, page_size: int, hasher: Optional[BlockHasher] = None,
                 nodes: Iterable["Node"] = ()) -> None:
        if hasher is not None and not isinstance(hasher, BlockHasher):
            raise ArgumentTypeError(f"hasher must be a BlockHasher, got {hasher!r}")
        self.hasher = hasher if hasher is not None else BlockHasher()
        self.page_size = page_size
        # block -> its page's hash (the same bytes object the dict keys), None when not cached
        self._by_block = np.full(num_blocks, None, dtype=object)
        self._blocks: Dict[BlockHash, int] = {}  # hash -> block
        for node in nodes:
            self.stored(node)

    # ------------------------------------------------------------ queries
    def __len__(self) -> int:
        """Pages indexed (cached in HBM)."""
        return len(self._blocks)

    def __iter__(self) -> Iterator[BlockHash]:
        """The full hash of every indexed page, in no particular order."""
        return iter(self._blocks)

    def lookup(self, block_hash: BlockHash) -> Optional[int]:
        """The cached block holding the page with full hash ``block_hash``, or ``None``. O(1)."""
        return self._blocks.get(block_hash)

    def block_hash(self, block: int) -> Optional[BlockHash]:
        """Full hash of the page cached in ``block``, or ``None`` if the block holds no cached page. O(1)."""
        if not 0 <= block < len(self._by_block):
            return None
        return self._by_block[block]

    def page_hashes(self, node: "Node") -> List[BlockHash]:
        """Full hashes of every page of ``node``, a node of the cache's tree, in order.

        Read from the index (O(pages)); pages not indexed are hashed from the
        parent's hash, itself indexed or computed the same way (O(depth) hashes
        at worst). A lower tier's node holds no blocks: hash its pages with
        :meth:`path_hashes`.
        """
        hashes = self._by_block[node.blocks].tolist()
        if None not in hashes:
            return hashes
        parent_hash, first = self.parent_hash(node)
        return self.hasher.chain(node_tokens(node, self.page_size), parent_hash, node.start,
                                 namespace_of(node) if first else None)

    def parent_hash(self, node: "Node") -> Tuple[Optional[BlockHash], bool]:
        """(hash of the page before ``node``'s first, whether ``node`` starts its sequence), for a
        node of the cache's tree. O(1) when the parent's last page is indexed."""
        parent = node.parent
        if parent.parent is None:
            return None, True
        h = self._by_block[parent.last_block] if parent.num_pages else None
        if h is None:
            h = self.page_hashes(parent)[-1]
        return h, False

    def path_hashes(self, tokens: np.ndarray, namespace: Hashable, start: int,
                    held: np.ndarray) -> Tuple[Optional[BlockHash], List[BlockHash]]:
        """(hash of page ``start - 1``, hashes of pages ``start..``) of a sequence's whole pages.

        ``tokens`` is the sequence's pages from its first, shape ``(pages,
        page_size)``; ``held`` the blocks caching its leading pages in HBM
        (:meth:`~radixkv.PrefixCache.peek_match`'s). Pages HBM holds are read
        from the index; only the pages after them are hashed, chained on the
        last one held. Cost: O(pages) reads plus one hash per page not in HBM.
        """
        held_pages = min(len(held), len(tokens))
        low = max(start - 1, 0)  # the first page whose hash is asked for
        base = min(low, held_pages)
        known = self._by_block[held[base:held_pages]].tolist()
        chained = self.hasher.chain(tokens[held_pages:], self._by_block[held[held_pages - 1]] if held_pages else None,
                                    held_pages, namespace if held_pages == 0 else None)
        hashes = known + chained  # pages base..
        return (hashes[start - 1 - base] if start else None), hashes[start - base:]

    # ------------------------------------------------------------ the engine's observer calls
    def stored(self, leaf: "Node") -> Tuple[Optional[BlockHash], List[BlockHash], Optional[Hashable]]:
        """``leaf`` was just added holding newly cached pages: hash and index them. O(pages) hashes.

        Returns what a recorder reports: (the parent page's hash, the pages'
        hashes, the namespace when ``leaf`` starts its sequence else ``None``).
        """
        parent_hash, first = self.parent_hash(leaf)
        namespace = namespace_of(leaf) if first else None
        hashes = self.hasher.chain(node_tokens(leaf, self.page_size), parent_hash, leaf.start, namespace)
        blocks = leaf.blocks
        self._by_block[blocks] = hashes
        self._blocks.update(zip(hashes, blocks.tolist()))
        return parent_hash, hashes, namespace

    def removed(self, blocks: np.ndarray) -> List[BlockHash]:
        """Cached ``blocks`` are about to go back to the pool: unindex them; return their hashes
        (of those indexed, in order). O(len(blocks)) at C speed."""
        hashes = self._by_block[blocks].tolist()
        if None in hashes:  # skip any not indexed
            hashes = [h for h in hashes if h is not None]
        self._by_block[blocks] = None
        deque(map(self._blocks.__delitem__, hashes), maxlen=0)
        return hashes

    def cleared(self) -> None:
        """Every page was dropped: empty the index. O(blocks)."""
        self._by_block[:] = None
        self._blocks.clear()

    # ------------------------------------------------------------ checks
    def check(self, nodes: Iterable["Node"]) -> None:
        """Assert that exactly the pages of ``nodes`` (every cached node, parents before children)
        are indexed, each under its recomputed chain hash. O(cached pages) hashes."""
        expected: Dict[int, BlockHash] = {}
        for node in nodes:
            parent = node.parent
            first = parent.parent is None
            parent_hash = None if first else expected.get(parent.last_block)
            if not first and parent_hash is None:
                parent_hash = self.page_hashes(parent)[-1]
            hashes = self.hasher.chain(node_tokens(node, self.page_size), parent_hash, node.start,
                                       namespace_of(node) if first else None)
            expected.update(zip(node.blocks.tolist(), hashes))
        for block, h in expected.items():
            assert self.block_hash(block) == h, (
                f"block {block}: indexed hash {self.block_hash(block)!r} != chain hash {h!r}")
            assert self._blocks.get(h) == block, f"hash of block {block} not indexed to it"
        stray = [b for b in np.flatnonzero(self._by_block != None).tolist() if b not in expected]  # noqa: E711
        assert not stray, f"blocks {stray[:10]} are indexed but not cached"
        assert len(self._blocks) == len(expected), (
            f"index holds {len(self._blocks)} hashes for {len(expected)} cached pages")

    def __repr__(self) -> str:
        return f"PageHashIndex(pages={len(self)}, hasher={self.hasher!r})"


__all__ = ["PageHashIndex", "PageObserver", "node_tokens"]

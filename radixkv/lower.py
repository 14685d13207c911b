"""The seam below HBM: what :class:`~radixkv.cache.PrefixCache` tells a layer that keeps pages lower down.

The engine owns HBM (tree, pool, counters, locks, victim queue); a *lower
layer* (:class:`radixkv.tiers.tiered.TierLayer`: host, remote, borrowed
tiers) owns whatever lives below it. The engine takes one by composition
(``PrefixCache(..., lower=layer)``) and calls it at named points, much as
vLLM's offloading connector calls its ``OffloadingManager`` (lookup,
prepare_load / complete_load, prepare_store):

* **store**: :meth:`LowerLayer.evicting` before HBM evicts a leaf's tail
  (write-back demotes it), :meth:`LowerLayer.admitted` / :meth:`written` /
  :meth:`unwritten` around an admission whose new pages' KV is being
  written, :meth:`inserted` after an insert of written pages;
* **load**: :meth:`lookup` continues a match below HBM, :meth:`prepare_load`
  reads the pages to load into blocks the engine allocates itself, and
  :meth:`complete_load` follows once they are cached;
* **tree**: :meth:`split` (an HBM node was cut), :meth:`keeps_root` /
  :meth:`root_released` (a namespace's HBM root emptied), :meth:`aborted`
  (an abort uncaches pages: their lower copies are untrusted too);
* **life**: :meth:`bind`, :meth:`check`, :meth:`reset`, :meth:`close`.

The layer talks back to the engine only through its public methods. Nodes
it is handed are the engine's (read-only to the layer, except the ``ext``
slot of an HBM node, which is the layer's). Every hook of this base class
does nothing, so a layer overrides what it needs; without a layer the engine
pays one ``is None`` test at each point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from .tree import Node, Root

if TYPE_CHECKING:  # the engine imports this module
    from .cache import PrefixCache


@dataclass(frozen=True, slots=True)
class Load:
    """Pages :meth:`LowerLayer.prepare_load` read for the engine to cache.

    Attributes:
        pages: how many pages (from the match's end on) to cache; 0 loads nothing.
        payload: their payload rows (``pages`` rows), or ``None`` without payload.
        receipt: the layer's own record, handed back to :meth:`LowerLayer.complete_load`.
    """

    pages: int
    payload: Optional[np.ndarray]
    receipt: Any = None


class LowerLayer:
    """Base class (and protocol) of what keeps pages below a :class:`~radixkv.cache.PrefixCache`'s HBM."""

    def bind(self, cache: "PrefixCache") -> None:
        """Called once, at the end of the engine's constructor: the cache this layer serves."""

    def hbm_hit(self, node: Node, key: bytes, pages: int) -> None:
        """A request was served ``pages`` more pages of ``key`` from HBM, ending at ``node``, that no
        :meth:`lookup` counted: copies of another tenant's pages (a sharing rule that shares by
        copy). A layer counts the hit. Default: nothing."""

    def unbind(self, cache: "PrefixCache") -> None:
        """Undo :meth:`bind`: ``cache``'s construction was refused after it (a sharing rule that
        serves another cache), so nothing was ever cached through this layer, and it and what it
        holds (tiers, their policies) must be free for the corrected call. Default: nothing."""

    # ------------------------------------------------------------------ store
    def evicting(self, node: Node, k: int) -> None:
        """HBM is about to evict the last ``k`` pages of leaf ``node`` (its blocks still hold them).

        ``node.blocks[-k:]`` are the blocks (read their payload through
        :attr:`PrefixCache.payload <radixkv.cache.PrefixCache.payload>`). An
        exception here ends the eviction; the pages already cut go back to
        the pool."""

    def admitted(self, root: Root, key: bytes, start: int, new_blocks: np.ndarray) -> Optional[Any]:
        """An admission cached pages ``start..`` of ``key`` (under ``root``) in ``new_blocks``, whose KV
        the caller is writing now. Return a record to get :meth:`written` or :meth:`unwritten`
        with when the admission ends, or ``None`` to hear nothing more of it."""
        return None

    def written(self, record: Any, node: Node) -> None:
        """The admission of ``record`` is being released: its new pages hold KV now (``node`` is its
        deepest page, still locked)."""

    def unwritten(self, record: Any) -> None:
        """The admission of ``record`` ended without KV: aborted, or its pages were uncached by
        another admission's abort meanwhile. Nothing of it may be copied anywhere."""

    def inserted(self, root: Optional[Root], key: bytes, start: int, blocks: np.ndarray) -> None:
        """:meth:`PrefixCache.insert` was given written pages ``start..`` of ``key`` in ``blocks``
        (``root``: the namespace's registered root after the insert, ``None`` if it holds nothing)."""

    # ------------------------------------------------------------------ load
    def lookup(self, root: Root, key: bytes, node: Node, pos: int, num_pages: int, use: bool) -> Optional[Any]:
        """A match of ``num_pages`` pages of ``key`` reached HBM's deepest page ``pos`` (node ``node``).

        Return what continues below (handed to :meth:`prepare_load`), or ``None``
        when nothing is to be loaded. ``use`` is False for a pin (a transfer, not
        a use: count no hit, touch no rank)."""
        return None

    def prepare_load(self, found: Any, pos: int, room: int, use: bool) -> Load:
        """Read at most ``room`` pages of ``found`` (pages ``pos..``) for the engine to cache. The
        engine has locked the matched path, and makes the room by evicting once this returns."""
        return Load(0, None)

    def complete_load(self, load: Load, use: bool) -> None:
        """The pages of ``load`` are cached in HBM now."""

    def cancel_load(self, load: Load, root: Root, data: bytes, pos: int) -> None:
        """The engine could not cache the pages of ``load`` (pages ``pos..`` of ``data`` under HBM
        ``root``): making room for them raised. A layer that gave its copies up in
        :meth:`prepare_load` must forget what only they led to, so that nothing it keeps hangs
        below a page no tier holds. Costs a recompute of those pages, never a wrong answer."""

    # ------------------------------------------------------------------ tree
    def split(self, upper: Node, lower: Node) -> None:
        """HBM node ``lower`` was cut: ``upper`` is its new first part (see :meth:`RadixTree.split`)."""

    def keeps_root(self, root: Root) -> bool:
        """Whether empty, unlocked HBM ``root`` must stay registered (the layer keys pages by it)."""
        return False

    def root_released(self, root: Root, registered: bool) -> None:
        """The engine considered dropping HBM ``root``; ``registered``: it is still its namespace's root."""

    def aborted(self, top: Node) -> None:
        """An abort uncaches ``top`` and everything below it: forget every copy from its first page down."""

    # ------------------------------------------------------------------ life
    def check(self) -> None:
        """Assert the layer's invariants (after the engine checked its own)."""

    def reset(self) -> None:
        """Drop everything held below HBM (the engine is about to drop everything in HBM)."""

    def close(self) -> None:
        """Release external resources (connections)."""

"""The tiered engine: :class:`TieredCache`, a :class:`~radixkv.cache.PrefixCache` whose evictions spill.

HBM is the engine's own tree and pool, unchanged; lower tiers (host DRAM,
remote hosts) sit behind the engine's seam (:mod:`radixkv.lower`) as a
:class:`TierLayer`, which :class:`TieredCache` builds and hands to
:class:`PrefixCache` by composition. The engine calls it before it drops a
leaf's tail (``evicting``: write-back demotes the pages) and when a match
continues below HBM (``lookup`` / ``prepare_load`` / ``complete_load``:
pages are loaded back when the cost model says loading beats recomputing,
Mooncake's rule, and there is room; the engine takes the blocks itself).
The layer reaches the engine only through its public methods. A plain
:class:`PrefixCache` runs none of this code.

Write policies, as SGLang HiCache names them:

* ``write_back`` (exclusive): pages move down only when HBM evicts them and
  leave the lower tier when loaded back. With LRU everywhere, HBM of ``a``
  blocks over a host of ``b`` blocks hits exactly like one LRU of ``a + b``
  blocks (for requests that fit in ``a``): the host holds the pages ranked
  just below HBM's, in the same (last access, depth) order.
* ``write_through`` (inclusive): every page cached in HBM is copied down when
  its request is released (its KV is written by then); HBM evicts by
  dropping, so HBM behaves exactly like a plain cache of ``a`` blocks.
* ``write_through_selective``: a page is copied down once it was hit
  ``write_through_threshold`` times (at its admission's release if it gets
  there earlier).

The engine's contract, which every copy below HBM relies on: the KV of an
admission's ``new_blocks`` is written before :meth:`Admission.release`, and
:meth:`TieredCache.insert` is given blocks whose KV is written. Until its
admission is released a page is never copied down, since its bytes are not
its KV yet (a copy taken then would carry a valid checksum over wrong bytes):
write-through and selective hits copy it at the release, and no demotion can
take it, since the admission keeps it locked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import policies as _policies
from ..cache import PrefixCache
from ..costs import DEFAULT_HARDWARE, DEFAULT_MODEL, DEFAULT_TIER_PATHS, CostModel, get_hardware, get_model
from ..errors import ArgumentTypeError
from ..events import MEDIUM_GPU, TIER_MEDIUM, KVCacheEvent
from ..keys import TokensLike, as_tokens, is_int
from ..lower import Load, LowerLayer
from ..tree import Node
from .base import Copy, Tier, TierConfigError
from .stack import TierStack, path_data
from .transfers import HBM, TransferLedger, TransferTotals

WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
LOAD_BACK = ("cost", "always", "never")

#: Tier paths of the default cost model: costs' defaults plus ``borrowed`` (a peer's HBM, one network hop),
#: ``peer`` (a page pulled from a peer's HBM, one network hop) and ``peer_host`` (pulled from a peer's
#: host tier: the peer's PCIe read into its NIC, then the network hop; the cost model sums a path's
#: links, so the two are charged one after the other, as ``remote`` is).
TIER_PATHS = {**DEFAULT_TIER_PATHS, "borrowed": ("network",), "peer": ("network",), "peer_host": ("pcie", "network"),
              "store": ("network", "pcie")}


def default_cost_model(page_size: int) -> CostModel:
    """Llama-3-8B on an H100 (see :mod:`radixkv.costs` for the figures and their sources)."""
    return CostModel(get_model(DEFAULT_MODEL), get_hardware(DEFAULT_HARDWARE), page_size, tier_paths=TIER_PATHS)


@dataclass(frozen=True, slots=True)
class TierStats:
    """What the tiers did since the cache was created (or :meth:`TieredCache.reset`).

    Attributes:
        hit_tokens_by_tier: tokens served per tier (``"hbm"`` first) by every :meth:`~TieredCache.match`
            and :meth:`~TieredCache.admit`: each call counts the pages it returns, by the tier that
            held them, so they sum to the admissions' ``hit_tokens`` plus the matches'
            ``num_tokens``. A request looked up twice (``match`` then ``admit``) is counted twice;
            with ``admit`` alone (replay, cluster) the sum is the admissions' hits. ``pin`` and
            ``peek`` count nothing.
        bytes_by_link / seconds_by_link: bytes moved and simulated seconds per link.
        bytes_by_route: bytes per ``"src->dst"`` tier pair.
        transfer_seconds: simulated seconds of all transfers (no overlap assumed).
        recomputed_tokens: tokens found below HBM but recomputed (cost rule, or no room in HBM).
        integrity_misses: pages whose payload was missing or failed its checksum on load.
        dropped_pages: pages that fell out of the last tier, found no room below, or whose write a
            tier refused (a Redis server out of memory).
        lost_pages: copies forgotten because their remote host died.
        pages_by_tier: pages each lower tier holds now.
        tier_errors: calls into a tier that raised or answered out of contract (each failed like a
            refused write or a missed read; a remote backend's own errors are in
            :attr:`RemoteTier.backend_errors <radixkv.tiers.RemoteTier.backend_errors>`).
    """

    hit_tokens_by_tier: Dict[str, int]
    bytes_by_link: Dict[str, int]
    seconds_by_link: Dict[str, float]
    bytes_by_route: Dict[str, int]
    transfer_seconds: float
    recomputed_tokens: int
    integrity_misses: int
    dropped_pages: int
    lost_pages: int
    pages_by_tier: Dict[str, int]
    tier_errors: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Export:
    """Pages a cache hands a peer that copies them (:meth:`TieredCache.export_pages`).

    Attributes:
        hbm_pages: leading pages read from HBM (written ones only).
        lower: the pages after them read from lower tiers, ``[(tier name, pages), ...]`` in order.
        payload: their payload rows, HBM's first (``None`` without payload, or when none).
    """

    hbm_pages: int
    lower: List[Tuple[str, int]]
    payload: Optional[np.ndarray]

    @property
    def pages(self) -> int:
        """Pages handed in all."""
        return self.hbm_pages + sum(n for _, n in self.lower)


class _Write:
    """An open admission's new pages (see :meth:`TierLayer.admitted`): where they go once written."""

    __slots__ = ("root", "key", "start", "blocks")

    def __init__(self, root: Node, key: bytes, start: int, blocks: np.ndarray) -> None:
        self.root = root
        self.key = key
        self.start = start
        self.blocks = blocks


class TierLayer(LowerLayer):
    """The lower tiers of one cache behind the engine's seam: a :class:`TierStack` and the write policy.

    Built by :class:`TieredCache` (which validates the arguments) and bound to
    it by the engine; it reaches the engine only through public methods.

    Args: as :class:`TieredCache`'s of the same names (``tiers`` validated).
    """

    def __init__(self, tiers: List[Tier], write_policy: str, write_through_threshold: int, load_back: str,
                 cost_model: Optional[CostModel], kv_shape: Optional[Sequence[int]], dtype: Any) -> None:
        self._tiers = tiers
        self.write_policy = write_policy
        self.write_through_threshold = int(write_through_threshold)
        self.load_back = load_back
        self.cost_model = cost_model
        self._kv = (kv_shape, dtype)
        self.exclusive = write_policy == "write_back"
        self.anchored = True  # evicting walks the spill tree from anchors (False: from the root, for tests)
        self.selective = write_policy == "write_through_selective"
        self.cache: Optional[PrefixCache] = None
        self.stack: Optional[TierStack] = None

    def bind(self, cache: PrefixCache) -> None:
        """Check the cost model against ``cache``, attach the tiers, build the stack. Raises
        :class:`TierConfigError` / ``TypeError`` on a cost model that does not fit, or when the
        layer serves a cache already."""
        if self.cache is not None:
            raise TierConfigError("a TierLayer serves one cache; build one per cache")
        page_size = cache.page_size
        cost_model = self.cost_model
        if cost_model is None:
            cost_model = default_cost_model(page_size)
        elif not isinstance(cost_model, CostModel):
            raise ArgumentTypeError(f"cost_model must be a CostModel, got {cost_model!r}")
        elif cost_model.page_size != page_size:
            raise TierConfigError(f"cost_model.page_size must equal page_size={page_size}, "
                                  f"got {cost_model.page_size!r}")
        tiers = self._tiers
        for tier in tiers:
            if tier.name not in cost_model.tier_paths:
                raise TierConfigError(f"tier {tier.name!r} has no path in the cost model; "
                                      f"known: {', '.join(cost_model.tier_paths)}")
        claimed = []
        try:  # a tier refused (its policy serves another cache already, its pool cannot be allocated):
            for tier in tiers:  # the others' policies are free again
                tier.attach_policy(page_size, cost_model)
                claimed.append(tier)
            for tier in tiers:
                tier.attach(page_size, *self._kv)
        except BaseException:
            for tier in claimed:
                tier.policy.unclaim()
            raise
        self._given_cost_model = self.cost_model
        self.cost_model = cost_model
        self.cache = cache
        payload = cache.payload
        page_bytes = payload[0].nbytes if payload is not None else cost_model.page_bytes
        self.page_size = page_size
        self.page_bytes = page_bytes
        # Blocks of open admissions' new pages: their KV is not written yet, so no copy leaves HBM.
        self.pending = np.zeros(cache.num_blocks, dtype=bool)
        self.open_writes = 0  # open admissions with new pages (0: skip every pending lookup)
        self.stack = TierStack(tiers, page_size, payload is not None,
                               TransferLedger(cost_model.links, cost_model.tier_paths), page_bytes,
                               leaves_first=self.exclusive)
        self.events = cache.event_log
        self._new_spill_tree()
        if self.events is not None:
            self.stack.journal = []  # residency changes below HBM, reported by report
        self.zero_stats()

    def unbind(self, cache: PrefixCache) -> None:
        """Undo :meth:`bind` for a cache whose construction was refused after it: the tiers leave
        the stack and give their policies back, so the corrected call may use them. O(tiers)."""
        if self.cache is not cache:
            return
        for tier in self._tiers:
            tier.stack = None
            tier.policy.unclaim()
        self.cost_model = self._given_cost_model
        self.cache = self.stack = None
    def _new_spill_tree(self) -> None:
        self.stack.tree.on_root_emptied = self._spill_root_emptied

    def zero_stats(self) -> None:
        """Zero hits per tier, recomputes and the stack's counters. O(tiers)."""
        self.hit_pages: Dict[str, int] = {HBM: 0, **{t.name: 0 for t in self.stack.tiers}}
        self.recomputed_pages = 0
        stack = self.stack
        stack.ledger.reset()
        stack.dropped_pages = stack.integrity_misses = stack.lost_pages = 0
        stack.tier_errors = 0

    # ------------------------------------------------------------------ seam: store
    def evicting(self, node: Node, k: int) -> None:
        """HBM evicts the last ``k`` pages of leaf ``node``: write-back demotes them.

        The spill tree is walked from an *anchor*, not from the root: under
        write-back an HBM node's ``ext`` remembers the spill-tree node at its
        end (set by the previous demotion below it), so only the bytes of the
        HBM nodes below the nearest anchored ancestor are joined, usually the
        evicted node's own. An anchor is trusted while it is alive and ends
        where its HBM node ends (both trees only cut nodes or drop them, so a
        node's path never changes). Cost: O(nodes up to the anchor) plus the put.
        """
        if not self.exclusive or not self.stack.tiers:
            return
        stack = self.stack
        pb = stack.tree.page_bytes
        parts = []
        n, top = node, None
        while True:
            rest = n.rest
            m = (n.num_pages - 1) * pb
            parts.append(rest if len(rest) == m else rest[:m])
            parts.append(n.first)
            up = n.parent
            if up.parent is None:
                break
            anchor = up.ext
            if anchor is not None and self.anchored and anchor.gen >= 0 and anchor.end == up.end:
                top = anchor
                break
            n = up
        parts.reverse()
        payload = self.cache.payload
        pages = payload[node.blocks[node.num_pages - k:]] if payload is not None else None
        start = node.end - k
        anchor = stack.put(up, b"".join(parts), start, node.end, pages, top=top)
        if anchor is not None:
            if k < node.num_pages:
                node.ext = anchor  # node keeps pages ..start
            elif node.parent.parent is not None:
                node.parent.ext = anchor
        self.report()

    def admitted(self, root: Node, key: bytes, start: int, new_blocks: np.ndarray) -> Optional[_Write]:
        """The new pages are copied below HBM no earlier than the release (write-through, selective)."""
        # Write-back copies only at eviction, and an open admission's pages are locked: nothing to track.
        if self.exclusive or not self.stack.tiers:
            return None
        self.pending[new_blocks] = True
        self.open_writes += 1
        return _Write(root, key, start, new_blocks)

    def unwritten(self, record: _Write) -> None:  # type: ignore[override]
        """The admission ends without KV (aborted, or uncached by another's abort): nothing is copied."""
        self._closed(record)

    def _closed(self, record: _Write) -> None:
        self.pending[record.blocks] = False
        self.open_writes -= 1

    def written(self, record: _Write, node: Node) -> None:
        """The admission is being released: its new pages hold KV now; copy down what is due."""
        self._closed(record)
        root, data, start = record.root, record.key, record.start
        if not self.selective:
            self._copy_down(root, data, start, record.blocks)
            return
        # Pages hit often enough while their KV was being written: the nodes (split or not)
        # from the admission's deepest page up to its first one.
        due = []
        while node.parent is not None and node.end > start:
            if (node.ext or 0) >= self.write_through_threshold:
                due.append(node)
            node = node.parent
        for node in reversed(due):
            self._copy_down(root, data, node.start, node.blocks)

    def inserted(self, root: Optional[Node], key: bytes, start: int, blocks: np.ndarray) -> None:
        """Under write-through the inserted pages are copied down at once."""
        if self.exclusive or self.selective or not self.stack.tiers:
            return
        self._copy_down(root, key, start, blocks.astype(np.int32))

    # ------------------------------------------------------------------ seam: load
    def lookup(self, root: Node, key: bytes, node: Node, pos: int, num_pages: int, use: bool):
        """Count the HBM hit (and selective hit counts); find the pages continuing below HBM."""
        stack = self.stack
        if use:
            self.hbm_hit(node, key, pos)
        if not stack.num_pages or (pos >= num_pages and self.exclusive):
            return None
        run = stack.lookup(root, key, pos, num_pages, touch=use)
        if not run or self.load_back == "never":
            return None
        return run

    def prepare_load(self, found: List[Node], pos: int, room: int, use: bool) -> Load:
        """Read the pages of ``found`` worth loading (:meth:`plan`) that fit in ``room``."""
        plan = self.plan(found, pos, room, use)
        if not plan:
            return Load(0, None)
        got, payload, by_tier = self.stack.fetch(found, plan, self.exclusive)
        self.report()
        return Load(got, payload, by_tier)

    def hbm_hit(self, node: Node, key: bytes, pages: int) -> None:
        """Count ``pages`` HBM hits (and, under selective write-through, a hit on each node from
        ``node`` up). O(1), or O(depth) selective."""
        self.hit_pages[HBM] += pages
        if self.selective and pages:
            self._count_hits(node, key)

    def complete_load(self, load: Load, use: bool) -> None:
        if use:
            for name, pages in load.receipt:
                self.hit_pages[name] += pages

    def cancel_load(self, load: Load, root: Node, data: bytes, pos: int) -> None:
        """Under write-back the fetch gave the lower copies up: forget every copy from page ``pos``
        down, which only those pages led to (write-through kept its copies: nothing to do)."""
        if self.exclusive:
            self.stack.discard(root, data, pos)
            self.report()

    def plan(self, run: List[Node], pos: int, room: int, use: bool = True) -> int:
        """Pages of ``run`` to load: whole same-tier segments while loading beats recomputing.

        Counts the rest as recomputed when ``use`` (a request's lookup, not a pin)."""
        total = i = 0
        always = self.load_back == "always"
        found = sum(n.num_pages for n in run)
        while i < len(run) and total < room:
            tier = run[i].ext.tier
            seg = 0
            while i < len(run) and run[i].ext.tier is tier:
                seg += run[i].num_pages
                i += 1
            if not always and not self.cost_model.should_load((pos + total) * self.page_size, seg, tier.name):
                break
            take = min(seg, room - total)
            total += take
            if take < seg:
                break
        if use:
            self.recomputed_pages += found - total
        return total

    # ------------------------------------------------------------------ seam: tree
    def split(self, upper: Node, lower: Node) -> None:
        upper.ext = lower.ext  # hit count (selective write-through)

    def keeps_root(self, root: Node) -> bool:
        """An HBM root stays while the spill tree holds pages under it (the tiers key pages by it)."""
        spill_root = self.stack.tree.find_root(root)
        return spill_root is not None and spill_root.children is not None

    def root_released(self, root: Node, registered: bool) -> None:
        tree = self.stack.tree
        spill_root = tree.find_root(root)
        if spill_root is not None and spill_root.children is None and not registered:
            tree.discard_root(spill_root)  # its key, the HBM root, is gone for good

    def _spill_root_emptied(self, spill_root: Node) -> None:
        """The lower tiers dropped the last page of a namespace: drop its roots if HBM holds none either."""
        self.cache.release_root(spill_root.namespace)  # the spill tree is keyed by HBM roots

    def aborted(self, top: Node) -> None:
        """An abort uncaches ``top`` and its subtree: forget every lower copy from its first page down."""
        if self.stack.num_pages:
            root, data = path_data(top, self.stack.tree.page_bytes)
            self.stack.discard(root, data[: (top.start + 1) * self.stack.tree.page_bytes], top.start)

    # ------------------------------------------------------------------ seam: life
    def check(self) -> None:
        """The stack (spill tree, residency, slots, queues); under write-back also that every lower
        copy is reachable (:meth:`stranded`)."""
        self.stack.check()
        if self.exclusive:
            stranded = self.stranded()
            assert not stranded, f"lower copies no lookup can reach: {stranded[:3]}"

    def reset(self) -> None:
        """Report what is pending, forget every lower copy and zero the counters."""
        self.report()
        try:  # (a tier policy that raises in it: every copy is forgotten all the same, then the error)
            self.stack.reset()
        finally:
            self._new_spill_tree()
            self.zero_stats()

    def close(self) -> None:
        for tier in self.stack.tiers:
            tier.close()

    # ------------------------------------------------------------------ internals
    def report(self) -> None:
        """Turn the stack's journal of lower-tier residency changes into events, in order.

        Per medium, the events are then a faithful log: a page stored on a
        lower tier is reported (``BlockDemoted``, on the tier that took it,
        from the medium it came from), and so is every page leaving one
        (``BlockRemoved`` when it was cascaded down, dropped, refused a later
        home, failed its checksum or was lost with its host; ``BlockPromoted``
        when it moved up to HBM). Cost: O(depth) hashes per change.
        """
        stack = self.stack
        journal = stack.journal
        if not journal:
            return
        stack.journal = []
        medium = {t.name: TIER_MEDIUM.get(t.name, t.name.upper()) for t in stack.tiers}
        medium[HBM] = MEDIUM_GPU
        for kind, root, data, start, tier, source in journal:
            self.events.lower_tier(kind, root, data, start, medium=medium[tier], source_medium=medium[source])

    def _copy_down(self, root: Optional[Node], data: bytes, start: int, blocks: np.ndarray) -> None:
        """Copy pages ``start..`` (in HBM ``blocks``) to the first lower tier (write-through)."""
        if root is None or not len(blocks):
            return
        payload = self.cache.payload
        pages = payload[blocks] if payload is not None else None
        self.stack.put(root, data, start, start + len(blocks), pages)
        self.report()

    def _count_hits(self, node: Node, data: bytes) -> None:
        """Selective write-through: count a hit on every matched node; copy down at the threshold.

        A node of an open admission reaches the threshold before its KV is written: it is
        copied at that admission's release instead (:meth:`written`).
        """
        threshold = self.write_through_threshold
        path = []
        n = node
        while n.parent is not None:
            n.ext = (n.ext or 0) + 1
            if n.ext == threshold:
                path.append(n)
            n = n.parent
        pending = self.pending if self.open_writes else None
        for n in reversed(path):
            if pending is not None and pending[n.blocks].any():
                continue
            self._copy_down(n_root(n), data, n.start, n.blocks)

    def stranded(self) -> List[Node]:
        """Lower-tier copies (write-back) that no lookup can reach: the ones to free.

        A lower-tier hit needs the whole prefix, so a copy is reachable only while
        every page above it is in HBM or has a lower copy itself. A copy below a
        placeholder (a spill-tree page with no copy) whose page is not in HBM
        holds its slot (for a borrowed page, a creditor's HBM block) and can
        never be served. By HBM's prefix closure only a placeholder parent of a
        copy needs looking up. Cost: O(spill nodes) plus one O(depth) HBM walk per
        placeholder parent of a copy.
        """
        out: List[Node] = []
        page_bytes = self.stack.tree.page_bytes
        for hbm_root, root in self.stack.tree.roots():
            todo = [(child, True) for child in (root.children or {}).values()]
            while todo:
                node, reachable = todo.pop()
                if isinstance(node.ext, Copy):
                    if not reachable:
                        out.append(node)
                elif reachable and any(isinstance(c.ext, Copy) for c in node.children.values()):
                    # a placeholder above copies: its pages must be in HBM (a deeper one answers for it)
                    _, data = path_data(node, page_bytes)
                    reachable = self.cache.prefix_pages(hbm_root, data, node.end) >= node.end
                todo.extend((child, reachable) for child in (node.children or {}).values())
        return out


class TieredCache(PrefixCache):
    """A prefix cache with lower tiers: HBM, then ``tiers`` in order (e.g. host, then remote).

    >>> from radixkv.tiers import HostTier
    >>> cache = TieredCache(num_blocks=4, page_size=2, tiers=[HostTier(8)], load_back="always")
    >>> cache.admit([1, 2, 3, 4, 5, 6, 7, 8]).release()    # 4 pages fill HBM
    >>> cache.admit([9, 9, 8, 8]).release()                # 2 pages demoted to the host
    >>> cache.admit([1, 2, 3, 4, 5, 6, 7, 8]).hit_tokens   # 2 pages from HBM, 2 loaded back
    8
    >>> cache.tier_stats().hit_tokens_by_tier
    {'hbm': 4, 'host': 4}

    :meth:`admit` and :meth:`insert` are :class:`PrefixCache`'s: an admission
    may load pages back from lower tiers (counted as hits); its new pages are
    copied below HBM no earlier than :meth:`Admission.release`, by which time
    the caller has written their KV (write-through copies them there,
    selective write-through those already hit ``write_through_threshold``
    times). Under write-through, :meth:`insert` copies the new pages down at
    once: its ``blocks`` must hold written KV (an engine inserts after the
    prefill that filled them). :meth:`check` adds every lower tier (spill
    tree, residency, slots, queues; under write-back also that every lower
    copy is reachable: :func:`stranded_copies`); :meth:`reset` drops every
    cached page in every tier and zeroes the tier counters; :meth:`close`
    closes the tiers' external connections (Redis).

    Args:
        num_blocks, page_size, policy, kv_shape, dtype: as :class:`PrefixCache` (HBM).
        tiers: lower tiers, fastest first; each belongs to one cache.
        write_policy: ``"write_back"``, ``"write_through"`` or ``"write_through_selective"``.
        write_through_threshold: hits before a page is copied down (selective policy).
        load_back: ``"cost"`` (load iff transfer beats recompute, per run of pages in one
            tier: Mooncake's rule), ``"always"``, or ``"never"`` (lower copies only counted).
        cost_model: recompute and link costs; default :func:`default_cost_model`. Its
            ``page_bytes`` is charged per page moved unless ``kv_shape`` gives real payloads.
        **kwargs: passed to :class:`PrefixCache` (e.g. ``enable_events``).
    """

    def __init__(
        self,
        num_blocks: int,
        page_size: int = 16,
        policy: Union[str, "_policies.EvictionPolicy"] = "lru",
        kv_shape: Optional[Sequence[int]] = None,
        dtype: Any = "float16",
        *,
        tiers: Sequence[Tier] = (),
        write_policy: str = "write_back",
        write_through_threshold: int = 2,
        load_back: str = "cost",
        cost_model: Optional[CostModel] = None,
        **kwargs: Any,
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise TierConfigError(f"write_policy must be one of {', '.join(WRITE_POLICIES)}, got {write_policy!r}")
        if load_back not in LOAD_BACK:
            raise TierConfigError(f"load_back must be one of {', '.join(LOAD_BACK)}, got {load_back!r}")
        if not is_int(write_through_threshold):
            raise ArgumentTypeError(f"write_through_threshold must be an int, got {write_through_threshold!r}")
        if write_through_threshold < 1:
            raise TierConfigError(f"write_through_threshold must be >= 1, got {write_through_threshold!r}")
        tiers = list(tiers)
        names = set()
        for tier in tiers:
            if not isinstance(tier, Tier):
                raise ArgumentTypeError(f"tiers must hold Tier instances (HostTier, RemoteTier, ...), got {tier!r}")
            if tier.name in names:
                raise TierConfigError(f"two tiers are named {tier.name!r}")
            if tier.stack is not None:
                raise TierConfigError(f"tier {tier!r} already belongs to another cache")
            names.add(tier.name)
        layer = TierLayer(tiers, write_policy, write_through_threshold, load_back, cost_model, kv_shape, dtype)
        super().__init__(num_blocks, page_size, policy, kv_shape, dtype, lower=layer, **kwargs)
        self._layer = layer
        self.cost_model = layer.cost_model
        self.write_policy = write_policy
        self.write_through_threshold = layer.write_through_threshold
        self.load_back = load_back

    # ------------------------------------------------------------------ public
    @property
    def tiers(self) -> List[Tier]:
        """The lower tiers, fastest first."""
        return list(self._layer.stack.tiers)

    @property
    def page_bytes(self) -> int:
        """Bytes charged per page moved between tiers (the payload's, or the cost model's). O(1)."""
        return self._layer.page_bytes

    @property
    def hit_tokens_by_tier(self) -> Dict[str, int]:
        """Tokens served per tier since creation, by every match and admission (see :class:`TierStats`). O(tiers)."""
        by_tier = {name: pages * self.page_size for name, pages in self._layer.hit_pages.items()}
        if self.store is not None:
            by_tier["store"] = self.store_hit_blocks * self.page_size
        return by_tier

    def _hits_by_tier(self) -> Dict[str, int]:
        """:attr:`stats` by tier: :attr:`hit_tokens_by_tier`, taken at each reading. O(tiers)."""
        return self.hit_tokens_by_tier

    @property
    def transfers(self) -> TransferTotals:
        """Bytes and simulated seconds per link so far."""
        return self._layer.stack.ledger.totals()

    def tier_stats(self) -> TierStats:
        """Counters of hits per tier, transfers, recomputes and integrity misses. O(tiers)."""
        s = self._layer.stack
        t = s.ledger.totals()
        return TierStats(self.hit_tokens_by_tier, t.bytes_by_link, t.seconds_by_link, t.bytes_by_route,
                         t.seconds, self._layer.recomputed_pages * self.page_size, s.integrity_misses,
                         s.dropped_pages, s.lost_pages, {tier.name: tier.used for tier in s.tiers},
                         s.tier_errors)

    def peek(self, tokens: TokensLike, *, namespace: Optional[str] = None) -> Tuple[int, int]:
        """``(HBM pages, lower-tier pages)`` of the longest cached prefix of ``tokens``; changes nothing.

        For routers (cache-aware request routing). Tenant-blind: it counts every tenant's
        pages whatever the sharing rule, so it must not face a tenant. Cost: two read-only walks.
        """
        root, data, num_pages = self.locate(tokens, namespace=namespace)
        if root is None:
            return 0, 0
        pos = self.prefix_pages(root, data, num_pages)
        stack = self._layer.stack
        lower = stack.peek(root, data, pos, num_pages) if stack.num_pages else 0
        return pos, lower

    def export_pages(self, tokens: TokensLike, *, namespace: Optional[str] = None, start: int = 0,
                     max_pages: Optional[int] = None, tiers: Sequence[str] = ("host",),
                     demote_lower: bool = False) -> Export:
        """Pages ``start..`` of ``tokens`` (at most ``max_pages``) for a peer to copy: the written ones in
        HBM, then the copies continuing them in the lower tiers named in ``tiers``; no hit is counted,
        no residency changes.

        A page an open admission is still writing is never handed (nor anything past it in HBM);
        a lower copy is written by construction (copied down only once released) and is handed only
        while its payload is there and matches its checksum: the bytes a peer gets are the ones
        this cache holds for exactly that prefix. ``demote_lower``: the lower copies handed become
        the next to go in their tiers (LRU: a move, see :meth:`TierStack.read_run`); HBM pages are
        the caller's to demote (:meth:`demote`). Tenant-blind, as :meth:`cached_pages`. Cost: two
        read-only walks, plus the payload bytes copied and checksummed.
        """
        root, data, num_pages = self.locate(tokens, namespace=namespace)
        start = int(start)
        end = num_pages if max_pages is None else min(num_pages, start + int(max_pages))
        if root is None or start >= end:
            return Export(0, [], None)
        arr = as_tokens(tokens)[: end * self.page_size]
        settled = self.settled_pages(arr, namespace=namespace)
        hbm = max(0, settled - start)
        parts = []
        if hbm and self.payload is not None:
            held = self.cached_blocks(arr[: settled * self.page_size], namespace=namespace)
            parts.append(self.read(held[start:settled]))
        lower: List[Tuple[str, int]] = []
        pos = start + hbm
        stack = self._layer.stack
        if pos < end and stack.num_pages:
            run = stack.lookup(root, data, pos, end, touch=False)
            lower, payload = stack.read_run(run, end - pos, tiers, demote=demote_lower)
            if payload is not None:
                parts.append(payload)
        payload = (np.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else None
        return Export(hbm, lower, payload)

    def take_events(self) -> List[KVCacheEvent]:
        """As :meth:`PrefixCache.take_events`, with every lower tier's residency changes (see
        :meth:`TierLayer.report`)."""
        self._layer.report()
        return super().take_events()

    # ------------------------------------------------------------------ for tests and tools
    @property
    def _stack(self) -> TierStack:
        return self._layer.stack

    @property
    def _unwritten(self) -> np.ndarray:
        return self._layer.pending

    @property
    def _open_writes(self) -> int:
        return self._layer.open_writes

    def _path_data(self, node: Node) -> Tuple[Node, bytes]:
        """The root above ``node`` (of either tree) and the bytes of its pages from the root. O(depth)."""
        return path_data(node, self._layer.stack.tree.page_bytes)


def n_root(node: Node) -> Node:
    """The root above ``node``. O(depth)."""
    while node.parent is not None:
        node = node.parent
    return node


def stranded_copies(cache: TieredCache) -> List[Node]:
    """Lower-tier copies of a write-back ``cache`` that no lookup can reach (see :meth:`TierLayer.stranded`)."""
    return cache.lower.stranded()

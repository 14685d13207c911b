"""The engine: :class:`PrefixCache` ties tree, pool and eviction policy together.

Layering: keys -> tree -> pool -> engine. The engine is the one owner of
every counter (cached, protected, evictable, free) and of the admission loop
(match -> protect -> evict until enough blocks are free -> insert); policies
only rank and the tree only stores. :meth:`PrefixCache.check` recounts all of
it from scratch.

Every public method validates its arguments completely before it changes
anything, so an error leaves the cache exactly as it was.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional, Sequence, Tuple, Union, overload

import numpy as np

from . import policies as _policies
from .errors import (
    ArgumentTypeError, ArgumentValueError, InvalidBlocksError, LockError, RadixKVError, StaleHandleError)
from .events import EventLog, KVCacheEvent, make_event_log
from .events.hashing import BlockHasher
from .keys import TOKEN_DTYPE, TokensLike, check_int, check_namespace, check_positive_int, is_int, page_key
from .lower import LowerLayer
from .events.page_hashes import PageHashIndex
from . import extents
from .extents import Parts
from .pool import BLOCK_DTYPE, CACHED, FREE, HELD, STATE_NAMES, BlockPool
from .tree import Node, RadixTree, Root, namespace_of
from . import tenancy as _tenancy
from .copies import CopyIndex
from . import victims as _victims
from .victims import make_queue, rank_key

_NO_BLOCKS = np.empty(0, dtype=BLOCK_DTYPE)
_NO_KEYS = np.empty(0, dtype=np.uint64)
_ALIVE = attrgetter("alive")  # a pending leaf is ranked only while it is in the tree


def _check_retention(priority: object, expires_at: object):
    """Validate ``admit``'s retention arguments (TypeError/ValueError naming the value).

    Python and numpy integers pass (returned as Python ints); bools and floats do not.
    """
    if not is_int(priority):
        raise ArgumentTypeError(f"priority must be an int, got {priority!r}")
    if priority < 0:
        raise ArgumentValueError(f"priority must be >= 0 (higher is evicted later), got {priority!r}")
    if expires_at is not None:
        if not is_int(expires_at):
            raise ArgumentTypeError(f"expires_at must be an int clock value or None, got {expires_at!r}")
        if expires_at < 0:
            raise ArgumentValueError(f"expires_at must be >= 0, got {expires_at!r}")
        expires_at = int(expires_at)
    return int(priority), expires_at


class NodeHandle:
    """An opaque reference to a matched prefix, valid while its node keeps its extent.

    Splits keep it valid (the node keeps its last page); eviction of any of its
    pages makes it stale, and using a stale handle raises
    :class:`~radixkv.errors.StaleHandleError` rather than pointing elsewhere.
    """

    __slots__ = ("_node", "_gen")

    def __init__(self, node: Node, gen: int) -> None:
        self._node = node
        self._gen = gen

    @property
    def num_pages(self) -> int:
        """Pages from the root through this handle's node."""
        return self._node.end

    def __repr__(self) -> str:
        return f"NodeHandle(pages={self._node.end}, gen={self._gen})"


@dataclass(frozen=True, slots=True)
class MatchResult:
    """The longest cached prefix of a token sequence.

    Attributes:
        num_tokens: tokens matched, a multiple of ``page_size``.
        blocks: block ids of the matched pages, in order (``int32``).
        node: handle to pass to :meth:`PrefixCache.lock` / :meth:`PrefixCache.unlock`.
    """

    num_tokens: int
    blocks: np.ndarray
    node: NodeHandle


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A cache's hit counters since it was made or since :meth:`PrefixCache.reset_stats`, the numbers
    vLLM's ``PrefixCacheStats`` gives a scheduler's metrics.

    Every :meth:`PrefixCache.match` and :meth:`PrefixCache.admit` is one query; inspection
    (``peek_match``, ``cached_pages``) is none. Counting costs three integer additions a query.

    Attributes:
        queries: ``match`` and ``admit`` calls.
        query_tokens: their tokens, trailing partial pages included.
        hit_tokens: tokens they were served from the cache (a tiered cache's lower-tier
            hits included), ``hit_pages * page_size``.
        hit_pages: pages they were served.
        evicted_pages: pages evicted from HBM (moved down a tier or dropped).
        hit_tokens_by_tier: for a :class:`~radixkv.tiers.TieredCache`, ``hit_tokens`` by the tier
            that served them (``"hbm"`` first); empty for a plain cache.
    """

    queries: int
    query_tokens: int
    hit_tokens: int
    hit_pages: int
    evicted_pages: int
    hit_tokens_by_tier: Dict[str, int] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / query_tokens`` (0.0 before any query)."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class Admission:
    """A request admitted by :meth:`PrefixCache.admit`; its pages stay protected until :meth:`release`.

    The admission's lock belongs to the admission: only :meth:`release` or
    :meth:`abort` (or leaving a ``with`` block) gives it up. :meth:`PrefixCache.unlock` of
    ``node`` undoes only explicit :meth:`PrefixCache.lock` calls and raises
    :class:`~radixkv.errors.LockError` when the admission's lock is all the
    node holds, so no order of ``release`` and ``unlock`` can unlock twice.

    **Abort.** If the model raises before the new pages' KV is written, call
    :meth:`abort` (leaving a ``with`` block by an exception does it): the new
    pages are uncached, so no later request is served their unwritten bytes,
    and the matched pages stay cached. Whichever of :meth:`release` and
    :meth:`abort` comes first ends the admission; later calls of either do
    nothing (after a release the pages are cached for good: their KV was
    declared written, may have been served and copied to a lower tier).

    Attributes:
        hit_tokens: tokens served from the cache (a multiple of ``page_size``).
        blocks: block ids of every page of the request now cached, matched ones first.
        new_blocks: the blocks allocated for this request (the tail of ``blocks``); the
            caller writes their KV before :meth:`release` (a tiered cache copies them below
            HBM at the release, never earlier).
        copied_pages: how many of the hit pages were copied from another tenant's partition
            (under a sharing rule that shares by copy, :mod:`radixkv.tenancy`; else 0).
        uncached_pages: full pages of the prompt that got no block and are not cached: the
            pool had no more unprotected pages to evict, or the policy declined them. They
            follow :attr:`blocks`; the engine computes their KV without a cache block (or
            waits and retries: ``admit(..., all_or_nothing=True)`` never admits in part).
        node: handle of the deepest cached page of the request.
    """

    __slots__ = ("hit_tokens", "node", "copied_pages", "uncached_pages", "_path", "_new", "_blocks",
                 "_new_blocks", "_finish", "_released", "_aborted")

    def __init__(self, hit_tokens: int, path: List[Parts], new: Parts, node: NodeHandle,
                 finish: Callable[[bool], None], new_blocks: Optional[np.ndarray] = None,
                 copied_pages: int = 0, uncached_pages: int = 0) -> None:
        self.hit_tokens = hit_tokens
        self.copied_pages = copied_pages
        self.uncached_pages = uncached_pages
        # The block ids as extents (the matched nodes' root first, then the new pages'): the
        # arrays are made on first use, so a caller that reads neither pays no per-block work.
        self._path = path
        self._new = new
        self._blocks: Optional[np.ndarray] = None
        self._new_blocks = new_blocks
        self.node = node
        self._finish = finish  # the engine's end of this admission: finish(aborted)
        self._released = False
        self._aborted = False

    @property
    def blocks(self) -> np.ndarray:
        """Block ids of every page of the request now cached, matched ones first (``int32``; made on
        first use, then the same array). O(pages) C once."""
        if self._blocks is None:
            self._blocks = extents.to_array(extents.join((*self._path, self._new)))
        return self._blocks

    @property
    def new_blocks(self) -> np.ndarray:
        """The blocks allocated for this request, the tail of :attr:`blocks` (read-only ``int32``;
        made on first use, then the same array). O(new pages) C once."""
        if self._new_blocks is None:
            blocks = extents.to_array(self._new)
            blocks.flags.writeable = False
            self._new_blocks = blocks
        return self._new_blocks

    @property
    def num_new_pages(self) -> int:
        """``len(new_blocks)``, counted from the extents without making the array. O(runs)."""
        return extents.size(self._new) if self._new_blocks is None else len(self._new_blocks)

    @property
    def released(self) -> bool:
        """Whether the admission is over (released or aborted)."""
        return self._released

    @property
    def aborted(self) -> bool:
        """Whether the admission ended by :meth:`abort`."""
        return self._aborted

    def release(self) -> None:
        """Unprotect this request's pages. Idempotent: a second call (or one after :meth:`abort`) does
        nothing. O(depth)."""
        if not self._released:
            self._released = True
            self._finish(False)

    def abort(self) -> None:
        """End the admission without its KV: uncache its new pages, keep the matched ones.

        For a request whose prefill failed or was cancelled before the KV of
        :attr:`new_blocks` was written. The new pages leave the cache together
        with every page cached below them since (a batch mate that matched them
        computed its own KV over their unwritten bytes), and are reported
        removed; their blocks go back to the pool, except those another holder
        still protects (another admission, a :meth:`PrefixCache.lock`), which
        stay out of the pool (counted as held) until it lets go with its usual
        call. A pin on them ends here (a later ``unpin`` of those tokens raises
        :class:`~radixkv.errors.LockError`, as for tokens never pinned). Nothing
        of them is ever copied to a lower tier, and lower-tier copies of pages
        below them are forgotten. No-op after :meth:`release` or a first
        :meth:`abort`. Cost: O(depth + pages removed).
        """
        if not self._released:
            self._released = self._aborted = True
            self._finish(True)

    def __enter__(self) -> "Admission":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.release()
        else:
            self.abort()

    def __repr__(self) -> str:
        uncached = f", uncached={self.uncached_pages}" if self.uncached_pages else ""
        return (f"Admission(hit_tokens={self.hit_tokens}, pages={len(self.blocks)}, new={len(self.new_blocks)}"
                f"{uncached})")


STORE_POLICIES = ("write_through", "write_back")
"""When a cache with a shared store writes its pages there: at each release, or when HBM evicts them."""


def _check_store(store: object, page_size: int, payload: Optional[np.ndarray]) -> Any:
    """``store`` if it may be the cache's shared page store (:class:`radixkv.store.PageStore`, or
    ``None``): it cuts pages of ``page_size`` tokens, and with a payload its fingerprint's KV shape
    and dtype are the payload's. Raises ArgumentTypeError / ArgumentValueError, naming the field."""
    if store is None:
        return None
    if not all(callable(getattr(store, name, None)) for name in ("chain", "get", "put")):
        raise ArgumentTypeError(f"store must be a PageStore (chain, get, put), got {store!r}")
    fingerprint = getattr(store, "fingerprint", None)
    if fingerprint is not None:
        if fingerprint.page_size != page_size:
            raise ArgumentValueError(f"the store's fingerprint has page_size {fingerprint.page_size}, "
                                     f"the cache {page_size}")
        if payload is not None and (tuple(fingerprint.kv_shape) != payload.shape[2:]
                                    or np.dtype(fingerprint.dtype) != payload.dtype):
            raise ArgumentValueError(f"the store's fingerprint holds {fingerprint.dtype} KV of shape "
                                     f"{tuple(fingerprint.kv_shape)} a token, the cache's payload "
                                     f"{payload.dtype} of {payload.shape[2:]}")
    return store


def _check_sink(sink: object) -> Any:
    """``sink`` if it may be a free-block sink (a callable or ``None``), else raise ArgumentTypeError."""
    if sink is not None and not callable(sink):
        raise ArgumentTypeError(f"on_free must be a callable taking an array of block ids, or None, got {sink!r}")
    return sink


class PrefixCache:
    """A prefix cache of paged KV blocks, shaped for a serving engine's scheduler.

    >>> cache = PrefixCache(num_blocks=64, page_size=4)
    >>> a = cache.admit([1, 2, 3, 4, 5, 6, 7, 8, 9])     # 2 full pages cached
    >>> a.hit_tokens, len(a.new_blocks)
    (0, 2)
    >>> a.release()
    >>> cache.match([1, 2, 3, 4, 5, 6, 7, 8]).num_tokens
    8

    Only full pages are cached; a trailing partial page is ignored. The cache
    is single-owner: one thread (the scheduler) calls it.

    Args:
        num_blocks: blocks in the pool (HBM capacity in pages).
        page_size: tokens per block.
        policy: eviction policy name (see :func:`radixkv.policies.available`) or instance.
        kv_shape: per-token payload shape, e.g. ``(layers, 2, kv_heads, head_dim)``;
            ``None`` keeps no payload (pure simulation).
        dtype: payload dtype.
        enable_events: record KV events (:mod:`radixkv.events`) for :meth:`take_events`;
            a :class:`~radixkv.events.hashing.BlockHasher` also picks the hash function and seed.
            Off by default, and then free.
        on_free: the free-block sink (see :attr:`on_free`); ``None`` keeps freed blocks on
            the pool's free list.
        lower: what keeps pages below HBM (a :class:`~radixkv.lower.LowerLayer`, which
            :class:`radixkv.tiers.TieredCache` builds), called at the seam's named points;
            ``None`` (the default) costs one ``is None`` test at each.
        sharing: which cached pages a request's ``tenant`` is served (see :mod:`radixkv.tenancy`):
            ``"shared"`` (the default, free), ``"isolated"``, ``"k-anonymous"``, ``"adaptive"``
            or a :class:`~radixkv.tenancy.Sharing` (``KAnonymous(k=5)``).

    Raises:
        ArgumentTypeError: an argument of the wrong type (a float ``num_blocks``, a bool ``page_size``).
        ArgumentValueError: ``num_blocks`` or ``page_size`` not positive or over the int32 block ids,
            a bad ``kv_shape``, ``dtype``, ``sharing`` or ``store``.
        UnknownPolicyError: ``policy`` names no registered policy (a ``KeyError``; the message lists them).

    Every method raises only the :class:`~radixkv.errors.RadixKVError` family on bad input, each
    subclassing ``ValueError``, ``TypeError`` or ``KeyError``, and leaves the cache as it was. Tokens
    anywhere are checked as :func:`radixkv.keys.as_tokens` does: :class:`~radixkv.errors.InvalidTokensError`
    for a value out of ``[0, 2**32)`` or a shape that is not 1-D, :class:`~radixkv.errors.ArgumentTypeError`
    for a bool or float; a ``namespace`` or ``tenant`` that is not a str (or is not valid Unicode) is an
    ``ArgumentTypeError`` / ``ArgumentValueError``.
    """

    def __init__(
        self,
        num_blocks: int,
        page_size: int = 16,
        policy: Union[str, "_policies.EvictionPolicy"] = "lru",
        kv_shape: Optional[Sequence[int]] = None,
        dtype: Any = "float16",
        enable_events: Union[bool, BlockHasher] = False,
        *,
        on_free: Optional[Callable[[np.ndarray], None]] = None,
        lower: Optional[LowerLayer] = None,
        sharing: Union[str, "_tenancy.Sharing", None] = None,
        store: Optional[Any] = None,
        store_policy: str = "write_through",
    ) -> None:
        num_blocks = check_positive_int(num_blocks, "num_blocks")
        self._sharing = _tenancy.create(sharing)
        # consulted on the hit path only by rules that share pages between tenants by copy
        self._copying = self._sharing if self._sharing.copies else None
        _check_sink(on_free)
        if lower is not None and not isinstance(lower, LowerLayer):
            raise ArgumentTypeError(f"lower must be a LowerLayer, got {lower!r}")
        page_size = check_positive_int(page_size, "page_size")
        if kv_shape is not None:
            kv_shape = tuple(kv_shape)
            for dim in kv_shape:
                check_positive_int(dim, "kv_shape dimension")
        self._policy = _policies.create(policy)
        self.page_size = page_size
        self._pool = BlockPool(num_blocks, page_size, kv_shape, dtype)
        self._tree = RadixTree(page_size)
        self._store = _check_store(store, page_size, self._pool.data)
        if store_policy not in STORE_POLICIES:
            raise ArgumentValueError(f"store_policy must be one of {', '.join(STORE_POLICIES)}, got {store_policy!r}")
        # write-back: each cached page's store key, so an eviction can write it without hashing its path again
        self._store_keys: Optional[List[Optional[bytes]]] = (
            [None] * num_blocks if store is not None and store_policy == "write_back" else None)
        self.store_hit_blocks = 0
        """Pages served from the shared page store (``store``) since creation (monotonic)."""
        self._store_chain: Tuple[Optional[bytes], List[bytes], Any] = (None, [], None)  # last request's store keys
        # where a tenant's copy of another tenant's page can come from (rules that share by copy)
        self._copies: Optional[CopyIndex] = CopyIndex(num_blocks, page_size) if self._copying is not None else None
        self._victims = make_queue(self._policy)
        self._clock = 0
        self._cached = 0
        self._protected = 0
        self.evicted_blocks = 0
        """Blocks evicted since creation (monotonic)."""
        self.declined_blocks = 0
        """New pages the policy declined to cache (admission control; monotonic)."""
        self._queries = self._query_tokens = self._hit_pages = 0  # :attr:`stats`, since _stats_base
        self._stats_base: Tuple[int, Dict[str, int]] = (0, {})  # evicted_blocks, hits by tier at reset_stats
        self.copied_blocks = 0
        """Pages copied from another tenant's partition (a sharing rule that shares by copy; monotonic)."""
        self._copied = 0  # pages the last descent copied
        self._identities: Tuple[Optional[bytes], Any, np.ndarray] = (None, None, _NO_KEYS)  # see _page_identities
        self._pins: dict = {}  # pinned node -> pin count; each pin holds one lock on the path
        self._locks: dict = {}  # node -> locks taken by lock() and not yet undone by unlock()
        self._admitted: dict = {}  # node -> unreleased admissions holding it; each holds one lock
        self._expiry: dict = {}  # node -> clock value after which its retention falls to 0
        self._expiry_heap: list = []  # (expires_at, seq, node); entries not in _expiry are stale
        self._expiry_seq = itertools.count()
        self._detached: dict = {}  # aborted node -> None while another holder still protects it
        self._unranked: dict = {}  # leaf -> None whose priority raised: ranked before the next eviction
        self._detached_blocks = 0
        self._page_index = None  # optional page-identity index (radixkv.analysis.stats.PageIndex)
        self._extra_observers: tuple = ()  # add_page_observer's (a cluster-wide page index)
        self._unwritten_nodes: dict = {}  # node -> None: an unreleased admission's new pages (KV not written yet)
        self._on_free = on_free  # the free-block sink, or None: freed blocks go to the pool's free list
        self._policy.claim()  # one cache per policy: its history is about this cache's pages
        bound = None  # the lower layer, once it bound to this cache
        try:  # refused from here on (events, the lower layer, the sharing rule): the policy is free again
            self._policy.attach(self)
            # Hooks the policy leaves at the base class's no-op are not called at all.
            base, cls = _policies.EvictionPolicy, type(self._policy)
            self._on_evict = self._policy.on_evict if cls.on_evict is not base.on_evict else None
            self._admit_hook = self._policy.admit  # None: every new page is cached
            # Likewise the base on_access (a timestamp in policy_state) is inlined on the match path.
            self._on_access = self._policy.on_access if cls.on_access is not base.on_access else None
            self._events: Optional[EventLog] = make_event_log(self, enable_events)
            self._lower = lower
            if lower is None:
                self._spill = None  # _evict skips the call
            else:
                lower.bind(self)
                bound = lower
            # block <-> chain hash of every cached page: the recorder's, or attach_page_hashes's
            self._page_hashes: Optional[PageHashIndex] = self._events.index if self._events is not None else None
            self._observe()
            self._sharing.bind()  # last: a rule that keeps records serves one cache
        except BaseException:
            self._policy.unclaim()
            if bound is not None:  # its tiers (and their policies) are free again too
                bound.unbind(self)
            raise

    # ------------------------------------------------------------------ counters
    @property
    def num_blocks(self) -> int:
        """Capacity in blocks."""
        return self._pool.num_blocks

    @property
    def policy(self) -> "_policies.EvictionPolicy":
        return self._policy

    @property
    def store(self) -> Optional[Any]:
        """The shared page store (the ``store`` argument: a :class:`radixkv.store.PageStore`), or ``None``.

        A match or admission whose pages run past HBM (and the lower tiers) asks
        the store for the rest of its chain in one round trip, and caches the
        verified pages it gets as hits. Pages go to the store first writer wins,
        at each release (``store_policy="write_through"``, the default) or when
        HBM evicts them (``"write_back"``: one round trip an eviction, and no
        hashing then: each page's key is noted when it is cached), and only pages
        whose whole prefix holds KV. Engines that share the store share their
        pages. O(1).
        """
        return self._store

    @property
    def sharing(self) -> "_tenancy.Sharing":
        """The sharing rule between tenants (the ``sharing`` argument). O(1)."""
        return self._sharing

    @property
    def clock(self) -> int:
        """Logical time: +1 per match/insert/admit call (``admit``'s ``expires_at`` is in these units)."""
        return self._clock

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list. O(1)."""
        return self._pool.num_free

    @property
    def num_cached_blocks(self) -> int:
        """Blocks held by the tree (cached pages). O(1)."""
        return self._cached

    @property
    def protected_blocks(self) -> int:
        """Cached blocks that cannot be evicted now (locked, or under an unreleased admission). O(1)."""
        return self._protected

    @property
    def evictable_blocks(self) -> int:
        """Cached blocks that eviction may free now. O(1)."""
        return self._cached - self._protected

    @property
    def num_held_blocks(self) -> int:
        """Blocks allocated to callers and not yet inserted or freed. O(1).

        Includes the blocks of aborted pages that another holder still protects
        (see :meth:`Admission.abort`): out of the cache, not yet back in the pool;
        and the blocks given to the free-block sink (:attr:`on_free`), which are its owner's.
        """
        return self._pool.num_blocks - self._pool.num_free - self._cached

    @property
    def num_namespaces(self) -> int:
        """Namespaces holding pages (in HBM, or in a lower tier of a TieredCache) or locks now; an
        unused namespace costs nothing. O(1)."""
        return self._tree.num_roots

    # ------------------------------------------------------------------ lookups
    @property
    def stats(self) -> CacheStats:
        """Queries, their tokens, hit tokens and pages, and evicted pages since the cache was made or
        since :meth:`reset_stats` (:class:`CacheStats`). O(1) (O(tiers) for a tiered cache)."""
        evicted, base_by_tier = self._stats_base
        by_tier = self._hits_by_tier()
        return CacheStats(self._queries, self._query_tokens, self._hit_pages * self.page_size, self._hit_pages,
                          self.evicted_blocks - evicted,
                          {tier: tokens - base_by_tier.get(tier, 0) for tier, tokens in by_tier.items()})

    def reset_stats(self) -> CacheStats:
        """Start :attr:`stats` again from zero (a metrics scrape, the end of a warm-up); return what
        they were. Changes nothing else: the monotonic counters (``evicted_blocks``, a tiered
        cache's ``hit_tokens_by_tier``) keep counting. O(1) (O(tiers) for a tiered cache)."""
        before = self.stats
        self._queries = self._query_tokens = self._hit_pages = 0
        self._stats_base = (self.evicted_blocks, self._hits_by_tier())
        return before

    def _hits_by_tier(self) -> Dict[str, int]:
        """Hit tokens by tier since creation: none for a cache without tiers (a tiered cache says)."""
        return {}

    def _count_query(self, tokens: TokensLike, hit_pages: int) -> None:
        """One query of ``tokens`` (checked already) that was served ``hit_pages`` pages. O(1)."""
        self._queries += 1
        self._query_tokens += len(tokens)
        self._hit_pages += hit_pages

    def match(self, tokens: TokensLike, *, namespace: Optional[str] = None,
              tenant: Optional[str] = None) -> MatchResult:
        """Longest cached prefix of ``tokens``, in whole pages; marks those pages used.

        A match that ends inside a node splits it so the returned handle covers
        exactly the matched pages. Cost: O(depth in nodes + matched tokens) at
        C speed for the comparisons.

        With a ``tenant``, the prefix is what the sharing rule serves it (see
        :meth:`admit`), copies of other tenants' pages included. A match is a
        probe: unlike a released admission it does not count the tenant among
        the pages' askers.

        Raises:
            InvalidTokensError / ArgumentTypeError: bad ``tokens``; ArgumentTypeError /
                ArgumentValueError: a bad ``namespace`` or ``tenant``.
        """
        data, num_pages = self._pages(tokens)
        key = self._partition(namespace, tenant)
        root = self._tree.find_root(key)
        self._clock += 1
        if root is None:  # nothing cached in it: no root is made for a lookup, unless it may copy into it
            if self._copying is None:
                root = self._tree.empty_root(key)
                self._count_query(tokens, 0)
                return MatchResult(0, _NO_BLOCKS, NodeHandle(root, root.gen))
            root = self._tree.root(key)
        node, _ = self._descend(root, data, num_pages, tenant=tenant, namespace=namespace)
        if root.children is None:  # copied nothing either
            self._drop_root_if_unused(root)
        blocks = extents.to_array(extents.join(self._touch_path(node, self._clock)))
        self._count_query(tokens, len(blocks))
        return MatchResult(len(blocks) * self.page_size, blocks, NodeHandle(node, node.gen))

    # ------------------------------------------------------------------ inspection (read-only)
    def cached_pages(self, tokens: TokensLike, *, namespace: Optional[str] = None,
                     tenant: Optional[str] = None) -> int:
        """Leading whole pages of ``tokens`` cached in HBM under ``namespace``, touching nothing.

        Unlike :meth:`match` it marks no use, advances no clock and splits no
        node, so asking does not change what is evicted next. ``tenant`` names
        the partition to look in under a rule that keeps one per tenant
        (``isolated``, ``k-anonymous``, ``adaptive``); this and the other
        inspection calls are an operator's view, so they must not face a tenant
        (nor serve one: no copy is made). O(depth in nodes + matched tokens) at C speed.
        """
        data, num_pages = self._pages(tokens)
        root = self._existing_root(namespace, tenant)
        return 0 if root is None else self.prefix_pages(root, data, num_pages)

    def cached_blocks(self, tokens: TokensLike, *, namespace: Optional[str] = None,
                      tenant: Optional[str] = None) -> np.ndarray:
        """The blocks of :meth:`cached_pages`' pages, in order (a new ``int32`` array), touching
        nothing: for a peer that copies them out (:class:`radixkv.cluster.Cluster`'s pulls).
        Tenant-blind, as :meth:`cached_pages`. O(depth + matched pages)."""
        data, num_pages = self._pages(tokens)
        root = self._existing_root(namespace, tenant)
        if root is None:
            return _NO_BLOCKS.copy()
        node, _, child, common = self._tree.walk(root, data, num_pages)
        parts = self._tree.path_parts(node)
        if common:
            parts += extents.cut(child.parts, common)[0]
        return extents.to_array(parts)

    def settled_pages(self, tokens: TokensLike, *, namespace: Optional[str] = None,
                      tenant: Optional[str] = None) -> int:
        """Leading pages of ``tokens`` cached in HBM whose KV is written, touching nothing: the pages
        before the first new page of an admission not released yet, for a peer to copy. Tenant-blind,
        as :meth:`cached_pages`. O(depth + matched pages).
        """
        data, num_pages = self._pages(tokens)
        root = self._existing_root(namespace, tenant)
        return 0 if root is None else self._settled(root, data, num_pages)

    def _settled(self, root: Root, data: bytes, num_pages: int) -> int:
        """:meth:`settled_pages` of the key bytes ``data`` under ``root``. O(depth + matched pages)."""
        node, pos, child, common = self._tree.walk(root, data, num_pages)
        unwritten = self._unwritten_nodes
        if not unwritten:
            return pos + common
        if child is not None and child not in unwritten:
            pos += common
        n = node
        while n.parent is not None:  # the shallowest unwritten node on the path ends what is settled
            if n in unwritten:
                pos = n.start
            n = n.parent
        return pos

    def demote(self, tokens: TokensLike, *, namespace: Optional[str] = None, tenant: Optional[str] = None,
               start: int = 0) -> int:
        """Make the cached pages of ``tokens`` from page ``start`` on the next to go, as if last used
        before every other page; return the pages demoted.

        For a cache whose copy of those pages was just taken by a peer (a cluster's pull): the
        copy is *moved*, the source keeping its pages only while they cost nothing. Only a
        policy whose rank is a last-use time can say "older than all" (``lru``); under any other
        it demotes nothing and returns 0. A node the range touches is demoted whole: its pages
        outside the range are the head or tail of the run the peer took, and splitting it would
        cost a node for an order LRU's leaf-first eviction keeps anyway. Measured on the
        conversation trace (4 instances, round robin, the cluster-wide index): 17.49% of tokens
        hit when pulled pages are copies, 18.00% when they are moved (one cache of the same
        memory: 18.12%). Tenant-blind, as :meth:`cached_pages`. O(depth).
        """
        data, num_pages = self._pages(tokens)
        start = check_int(start, "start")
        root = self._existing_root(namespace, tenant)
        if root is None or self._policy.name != "lru" or self._on_access is not None:
            return 0
        node, pos, child, common = self._tree.walk(root, data, num_pages)
        touched = [child] if common and pos + common > start else []
        while node.parent is not None and node.end > start:
            touched.append(node)
            node = node.parent
        for node in touched:
            node.policy_state = 0
            if node.heap_id:
                self._rank(node)
        return sum(node.num_pages for node in touched)

    def locate(self, tokens: TokensLike, *, namespace: Optional[str] = None,
               tenant: Optional[str] = None) -> Tuple[Optional[Root], bytes, int]:
        """``(root, key, num_pages)``: the registered root of ``namespace`` (``None`` when it holds
        nothing), the key bytes of ``tokens``'s whole pages and their count; changes nothing.

        What the engine's tree and a lower layer key pages by, for a layer's own
        public lookups (:meth:`radixkv.tiers.TieredCache.peek`). Validates as
        :meth:`match`. O(tokens).
        """
        data, num_pages = self._pages(tokens)
        return self._existing_root(namespace, tenant), data, num_pages

    def prefix_pages(self, root: Root, key: bytes, num_pages: int) -> int:
        """Leading pages of ``key`` (at most ``num_pages``) cached in HBM under ``root``, touching nothing.

        The bytes-level :meth:`cached_pages`, for a lower layer that keys its
        copies by HBM root and key (see :meth:`locate`). O(depth in nodes +
        matched tokens) at C speed.
        """
        _, pos, _, common = self._tree.walk(root, key, num_pages)
        return pos + common

    @property
    def payload(self) -> Optional[np.ndarray]:
        """The pool's payload array (one row per block), or ``None`` without ``kv_shape``. O(1).

        A live view for a lower layer, which copies out the rows of pages HBM is
        evicting or that were just written; read-only by contract (callers write
        through :meth:`write`). Unlike :meth:`read` it checks no block state:
        the seam hands the layer the blocks (:meth:`LowerLayer.evicting
        <radixkv.lower.LowerLayer.evicting>`), so there is nothing to check and
        no copy to make twice.
        """
        return self._pool.data

    def peek_victim(self) -> Optional[Tuple[int, Any, int]]:
        """``(retention class, policy priority, pages)`` of the leaf eviction looks at first, or ``None``
        when nothing is evictable; changes nothing. Amortized O(log n).

        The policy may still spare that leaf (``on_victim``) when eviction
        comes. For a cluster that compares instances' coldest pages before it
        evicts one to lend its block (value lending).
        """
        entry = self._victims.head()  # once: a lane queue's choose() need not answer twice alike
        if entry is None:
            return None
        return entry[0], entry[1], entry[-1].num_pages

    def advance_clock(self, now: int) -> None:
        """Move :attr:`clock` forward to ``now`` (no-op when it is there already). O(1).

        For instances that share one cluster clock, so last-use times compare
        across caches. The clock never goes back: an expiry or a policy
        timestamp already given stays in the past.
        """
        if not is_int(now):
            raise ArgumentTypeError(f"now must be an int clock value, got {now!r}")
        if now > self._clock:
            self._clock = int(now)

    def are_held(self, blocks: Union[Sequence[int], np.ndarray]) -> bool:
        """Whether every block of ``blocks`` is held by a caller (allocated, not inserted nor freed).
        For a lender's ledger check. Raises on ids outside the pool. O(len(blocks))."""
        arr = self._pool.validate_ids(blocks)
        return bool(np.all(self._pool.states(arr) == HELD))

    def release_root(self, root: Root) -> None:
        """Unregister ``root`` if it holds no page, no lock, and the lower layer keys nothing by it.

        For a lower layer whose last page of a namespace just left (the
        engine drops a root itself when its own last page goes). Handles to
        it stay valid (see :meth:`match`). O(1).
        """
        if not isinstance(root, Root):
            raise ArgumentTypeError(f"release_root needs a namespace root, got {root!r}")
        self._drop_root_if_unused(root)

    def close(self) -> None:
        """Release the lower layer's external connections (Redis); nothing to do without one."""
        if self._lower is not None:
            self._lower.close()

    def peek_match(self, tokens: TokensLike, *, namespace: Optional[str] = None,
                   tenant: Optional[str] = None) -> MatchResult:
        """The part of :meth:`match` that needs no split, touching nothing: a handle of the deepest
        cached node that ``tokens`` cover whole, and the blocks from the root through it.

        ``num_tokens`` can be below :meth:`cached_pages` (times the page size)
        when the cached prefix ends inside a node, which only :meth:`match`
        splits. For an embedder that looks up what it has just inserted
        without counting a use. Tenant-blind (as :meth:`cached_pages`): it must
        not face a tenant. O(depth + matched pages).
        """
        data, num_pages = self._pages(tokens)
        root = self._existing_root(namespace, tenant)
        if root is None:
            root = self._tree.empty_root(self._partition(namespace, tenant))
            return MatchResult(0, _NO_BLOCKS, NodeHandle(root, root.gen))
        node, pos, _, _ = self._tree.walk(root, data, num_pages)
        return MatchResult(pos * self.page_size, self._tree.path_blocks(node), NodeHandle(node, node.gen))

    def path_blocks(self, handle: NodeHandle) -> np.ndarray:
        """Block ids of every page from the root through ``handle``, in order (a new array). O(depth).

        Raises :class:`StaleHandleError` for a handle whose pages were evicted.
        """
        return self._tree.path_blocks(self._resolve(handle))

    def namespaces(self) -> List[Optional[str]]:
        """The namespaces that hold pages or locks now (a new list, each once: under a sharing
        rule that isolates tenants, a namespace's tenants' partitions count as the namespace).
        O(namespaces)."""
        keys = self._tree.namespaces()
        if self._sharing.name != "isolated":
            return list(keys)
        return list(dict.fromkeys(key[0] if key.__class__ is tuple else key for key in keys))

    def holds_namespace(self, namespace: Optional[str]) -> bool:
        """Whether ``namespace`` holds pages or locks now, in its own partition (an isolated
        tenant's pages are in the tenant's). O(1)."""
        return namespace in self._tree.namespaces()

    def nodes(self) -> Iterator[Node]:
        """Every cached node, parents before children, for observers that index pages (the event
        log, miss reasons). Read-only: a caller must not change a node. O(nodes) to exhaust."""
        return self._tree.nodes()

    def namespace_roots(self) -> Iterator[Tuple[Optional[str], Node]]:
        """``(namespace, root)`` of every namespace that holds pages or locks (a snapshot), for
        tools that walk the cached tree. Read-only. O(namespaces)."""
        return self._tree.roots()

    @property
    def lower(self) -> Optional[LowerLayer]:
        """The layer that keeps pages below HBM (the ``lower`` argument), or ``None``. O(1)."""
        return self._lower

    @property
    def page_index(self) -> Optional[Any]:
        """The page observer :meth:`attach_page_index` attached, or ``None``. O(1)."""
        return self._page_index

    # ------------------------------------------------------------------ locks
    def lock(self, handle: NodeHandle) -> None:
        """Protect the pages from the root through ``handle`` from eviction. Nests. O(depth).

        Raises:
            StaleHandleError: the handle's pages were evicted, truncated or uncached by an abort.
            ArgumentTypeError: ``handle`` is not a :class:`NodeHandle`.
        """
        node = self._resolve(handle)
        if self._detached and node in self._detached:
            raise StaleHandleError(f"{handle!r} is stale: its pages were uncached by Admission.abort")
        if node.parent is None:  # a root: registered while locked
            node = self._tree.adopt(node)
        self._lock_node(node)
        self._locks[node] = self._locks.get(node, 0) + 1

    def unlock(self, handle: NodeHandle) -> None:
        """Undo one :meth:`lock` of ``handle``.

        Only locks taken with :meth:`lock` count: a pin's lock is released by
        :meth:`unpin` and an admission's by :meth:`Admission.release`, never
        here, so an unlock cannot leave them to unlock a second time. O(depth).

        Raises:
            LockError: no :meth:`lock` of ``handle`` is left to undo (cache unchanged).
            StaleHandleError: the handle's pages are gone. ArgumentTypeError: not a :class:`NodeHandle`.
        """
        node = self._unlockable(handle)
        count = self._locks[node] - 1
        if count:
            self._locks[node] = count
        else:
            del self._locks[node]
        self._unlock_node(node)

    def pin(self, tokens: TokensLike, *, namespace: Optional[str] = None,
            tenant: Optional[str] = None) -> int:
        """Keep the longest cached page prefix of ``tokens`` resident until :meth:`unpin`.

        A pin is a lock that needs no handle and outlives requests; pins nest.
        Returns the tokens pinned (0, and nothing recorded, when no page of
        ``tokens`` is cached). Not a use: the clock and the policy's state do
        not change. O(depth).

        On a :class:`~radixkv.tiers.TieredCache` "cached" includes the lower
        tiers: pages of the prefix held below HBM are loaded back first (under
        its ``load_back`` rule, evicting other pages as a match would), so the
        whole pinned prefix is resident in HBM. The load is a transfer, not a
        use: no hit, recompute or selective write-through count changes, and
        lower-tier ranks are not touched.

        Tenant-blind, as :meth:`unpin`: ``tenant`` names a partition (see
        :meth:`cached_pages`); it pins (and loads back) pages whatever the
        sharing rule serves whom and copies nothing, so it is the operator's
        (pinning a system prompt), never a tenant's request.

        >>> cache = PrefixCache(num_blocks=4, page_size=2)
        >>> cache.admit([7, 7, 8, 8]).release()
        >>> cache.pin([7, 7, 8, 8, 9])
        4
        >>> cache.evict(4), cache.unpin([7, 7, 8, 8, 9]), cache.evict(4)
        (0, 4, 2)

        Raises:
            InvalidTokensError / ArgumentTypeError: bad ``tokens``, ``namespace`` or ``tenant``.
        """
        data, num_pages = self._pages(tokens)
        root = self._existing_root(namespace, tenant)
        if root is None:
            return 0
        node, pos = self._descend(root, data, num_pages, use=False)
        if pos == 0:
            return 0
        self._lock_node(node)
        self._pins[node] = self._pins.get(node, 0) + 1
        return pos * self.page_size

    def unpin(self, tokens: TokensLike, *, namespace: Optional[str] = None,
              tenant: Optional[str] = None) -> int:
        """Release one pin, the deepest on ``tokens``'s cached path; return the tokens it covered.

        Tenant-blind, as :meth:`pin`. O(depth).

        Raises:
            LockError: no pin covers a prefix of ``tokens`` (cache unchanged).
            InvalidTokensError / ArgumentTypeError: bad ``tokens``, ``namespace`` or ``tenant``.
        """
        data, num_pages = self._pages(tokens)
        root = self._existing_root(namespace, tenant)
        node = None
        if root is not None and self._pins:
            node = self._tree.walk(root, data, num_pages)[0]
            while node.parent is not None and node not in self._pins:
                node = node.parent
        if node is None or node.parent is None:
            raise LockError(f"unpin: no pin covers a prefix of tokens ({num_pages} full pages, "
                            f"namespace={namespace!r}); pin() it first")
        count = self._pins.pop(node) - 1
        if count:
            self._pins[node] = count
        self._unlock_node(node)
        return node.end * self.page_size

    # ------------------------------------------------------------------ blocks
    def allocate(self, n: int) -> Optional[np.ndarray]:
        """``n`` free block ids, evicting unprotected pages as needed.

        Returns ``None`` (and changes nothing) when ``n`` blocks cannot be
        freed because the rest is protected or held: an answer, not an error. Cost:
        O(n + evicted leaves * log(evictable leaves)).

        Raises:
            ArgumentTypeError / ArgumentValueError: ``n`` not an int, or negative.
        """
        n = check_positive_int(n, "n", allow_zero=True)
        free = self._pool.num_free
        if n > free + self._cached - self._protected:
            return None
        if n > free:
            self._evict(n - free)
        return self._pool.take(n)

    def free(self, blocks: Union[Sequence[int], np.ndarray]) -> None:
        """Return allocated blocks that were never inserted. O(len(blocks)).

        Raises:
            InvalidBlocksError: a block id out of range or repeated, or a block the caller does not
                hold (free, or cached); nothing is freed then.
        """
        arr = self._pool.validate_ids(blocks)
        self._require_state(arr, HELD, "free")
        self._pool.give_back(arr)

    def evict(self, n: int) -> int:
        """Free up to ``n`` blocks now by evicting unprotected pages; returns how many were freed.

        With a free-block sink (:attr:`on_free`) the freed blocks go to it, in one call.

        Raises:
            ArgumentTypeError / ArgumentValueError: ``n`` not an int, or negative.
        """
        n = check_positive_int(n, "n", allow_zero=True)
        if self._on_free is None:
            return self._evict(n)
        # _evict puts what it frees on the free list, because allocate, admit and a tier's load
        # take those blocks back at once; here nothing does, so they are the free list's top.
        free = self._pool.num_free
        try:
            return self._evict(n)
        finally:
            if self._pool.num_free > free:
                self._sink(self._pool.take(self._pool.num_free - free))

    def insert(self, tokens: TokensLike, blocks: Union[Sequence[int], np.ndarray], *,
               namespace: Optional[str] = None,
                    tenant: Optional[str] = None) -> int:
        """Cache ``tokens``'s full pages in ``blocks`` (one id per full page); return pages already present.

        ``blocks`` covers all full pages, matched ones included (as SGLang
        passes them). For a page already cached, a passed block that differs
        from the cached one goes back to the pool; new pages take ownership of
        their passed blocks, which must be held by the caller. Pages the policy
        declines (admission control) give their blocks back too. With a
        free-block sink both go to it, in one call: the duplicates in page
        order, then the declined blocks (the tail of ``blocks``).

        ``tenant`` computed the KV (after a :meth:`match` with the same tenant):
        the pages go to its partition, and under a sharing rule that shares by
        copy it counts as an asker of every page, as a released admission does
        (see :meth:`admit`).

        Raises:
            InvalidTokensError / ArgumentTypeError: bad ``tokens``, ``namespace`` or ``tenant``.
            InvalidBlocksError: not one block per full page, an id out of range or repeated, or a
                block (new, or differing from a cached page's) the caller does not hold.
        """
        key = self._partition(namespace, tenant)
        data, root, node, child, common, present, duplicate, new = self._plan_insert(tokens, blocks, key)
        self._clock += 1
        now = self._clock
        if root is None:
            root = node = self._tree.root(key)
        if child is not None:
            node = self._split(child, common)
        self._touch_path(node, now)
        keep = self._admit_pages(node, data, present, len(new), now)
        try:
            leaf = self._add_pages(node, data, present, new[:keep].copy(), now)
        except BaseException:  # a hook raised: the caller keeps every block it passed
            if root.children is None:
                self._drop_root_if_unused(root)
            raise
        if self._copying is not None:
            self._copying.asked(tenant, self._copies.request_keys(data, len(new) + present, namespace))
        if root.children is None:  # nothing cached (declined): the namespace stays unused
            self._drop_root_if_unused(root)
        if self._lower is not None and len(new):  # it reads the blocks: before they leave the cache
            self._lower.inserted(self._tree.find_root(key), data, present, new)
        self._give_back(np.concatenate((duplicate, new[keep:])))  # the duplicates, then the declined pages
        return present

    def _plan_insert(self, tokens: TokensLike, blocks: object, key: Any):
        """Validate an :meth:`insert` completely, changing nothing; return what it needs to apply it.

        ``key`` is the checked partition (:meth:`_partition`). Read-only (one
        walk), so layers above (the SGLang adapter) can check an insert before
        they change their own state. Raises as :meth:`insert`.
        """
        data, num_pages = self._pages(tokens)
        arr = self._pool.validate_ids(blocks)
        if len(arr) != num_pages:
            raise InvalidBlocksError(
                f"blocks must hold one id per full page ({num_pages}), got {len(arr)}")
        root = self._tree.find_root(key)
        node, pos, child, common = (
            self._tree.walk(root, data, num_pages) if root is not None else (None, 0, None, 0))
        present = pos + common
        cached = self._tree.path_parts(node) if node is not None else extents.NONE
        if common:
            cached += extents.cut(child.parts, common)[0]
        cached = extents.to_array(cached)
        duplicate = arr[:present][arr[:present] != cached]
        self._require_state(duplicate, HELD, "insert")
        new = arr[present:]
        self._require_state(new, HELD, "insert")
        return data, root, node, child, common, present, duplicate, new

    # ------------------------------------------------------------------ requests
    @overload
    def admit(self, tokens: TokensLike, *, namespace: Optional[str] = ..., priority: int = ...,
              expires_at: Optional[int] = ..., tenant: Optional[str] = ...,
              hints: Optional["_policies.RequestHints"] = ..., all_or_nothing: Literal[False] = ...) -> Admission:
        ...

    @overload
    def admit(self, tokens: TokensLike, *, namespace: Optional[str] = ..., priority: int = ...,
              expires_at: Optional[int] = ..., tenant: Optional[str] = ...,
              hints: Optional["_policies.RequestHints"] = ..., all_or_nothing: bool) -> Optional[Admission]:
        ...

    def admit(self, tokens: TokensLike, *, namespace: Optional[str] = None, priority: int = 0,
              expires_at: Optional[int] = None, tenant: Optional[str] = None,
              hints: Optional["_policies.RequestHints"] = None, all_or_nothing: bool = False) -> Optional[Admission]:
        """Match, protect, allocate and insert a request's full pages in one step.

        The remaining pages get blocks as far as unprotected pages can be
        evicted; the first ones are cached, and the rest are counted in
        :attr:`Admission.uncached_pages` (10 free blocks and a 20-page prompt:
        ``new=10, uncached=10``). The admission keeps every page of the request
        protected until :meth:`Admission.release`. This is the replay path.
        Cost: one descent plus the evictions it needs.

        ``all_or_nothing=True`` is for an engine that would rather wait than
        compute part of a prompt outside the cache (vLLM's ``allocate_slots``):
        when the pages past the hit cannot all get a block, it returns ``None``
        having done only what :meth:`match` does (the matched pages marked used),
        with nothing evicted, allocated or protected; retry once admissions are
        released. Pages a policy with admission control declines are still
        declined (``uncached_pages``): the check is for room, not for the policy.

        ``priority`` is a retention class (``>= 0``; higher is evicted later,
        by every policy): the request's cached pages are raised to it, and a
        page keeps the highest class any admission gave it until that class's
        ``expires_at`` (a :attr:`clock` value; ``None`` = never) has passed,
        then falls back to class 0. Expiry is applied lazily, before the next
        eviction. O(depth) extra when ``priority > 0``.

        ``tenant`` is who sends the request (see :mod:`radixkv.tenancy`): the
        cache's ``sharing`` rule picks its partition, and under a rule that
        shares by copy (``"k-anonymous"``, ``"adaptive"``) the pages after its
        own partition's that another tenant holds in HBM are copied into its
        partition as hits where the rule allows (:attr:`Admission.copied_pages`),
        and a release counts it as an asker of every page. That rule costs the
        request's page keys (a few numpy calls) and one dict lookup per page;
        ``"shared"`` and ``"isolated"`` cost nothing.

        ``hints`` (a :class:`~radixkv.policies.RequestHints`: output length,
        timestamp, session fields) is handed, with the request's length in
        pages, to a policy that asks for it (``on_request``), before the match.

        Raises:
            InvalidTokensError / ArgumentTypeError: ``tokens`` are not a 1-D run of ints in
                ``[0, 2**32)`` (a bool or float anywhere is a type error).
            ArgumentValueError / ArgumentTypeError: a bad ``namespace``, ``tenant``,
                ``priority``, ``expires_at`` or ``hints``.
            Any exception of a hook (the policy's, a lower tier's, an observer's) propagates
            with the admission undone: the cache is as it was, less what the descent loaded.
        """
        if all_or_nothing.__class__ is not bool:
            raise ArgumentTypeError(f"all_or_nothing must be a bool, got {all_or_nothing!r}")
        data, num_pages = self._pages(tokens)
        if priority.__class__ is not int or priority or expires_at is not None:
            priority, expires_at = _check_retention(priority, expires_at)
        if hints is not None and not isinstance(hints, _policies.RequestHints):
            raise ArgumentTypeError(f"hints must be a RequestHints or None, got {hints!r}")
        key = self._partition(namespace, tenant)
        root = self._tree.find_root(key)
        if self._policy.on_request is not None:
            self._policy.on_request(num_pages, hints, self._clock + 1)
        self._clock += 1
        now = self._clock
        if root is None:
            root = self._tree.root(key)
        node, pos = self._descend(root, data, num_pages, tenant=tenant, namespace=namespace)
        if node.parent is None:  # a root (a lower tier's lookup may have let it go): registered while locked
            node = self._tree.adopt(node)
        path = self._touch_path(node, now)
        self._lock_node(node)
        need = num_pages - pos
        if all_or_nothing and need > self._pool.num_free + self._cached - self._protected:
            self._unlock_node(node)  # as a match() leaves it: touched, nothing protected (an empty root goes)
            self._count_query(tokens, pos)
            return None
        holder = node
        new = extents.NONE
        if need:
            # Ask the policy first, so pages it declines cost no eviction.
            keep = self._admit_pages(node, data, pos, need, now)
            free = self._pool.num_free
            fit = min(keep, free + self._cached - self._protected)
            dropped = ()
            if fit > free:
                try:
                    dropped = self._evict_parts(fit - free)[1]
                except BaseException:  # a tier failed mid-eviction: the admission never happened
                    self._unlock_node(node)
                    raise
            # The evicted blocks come straight back (nothing between can raise).
            new = self._pool.take_after(dropped, fit, CACHED)
            try:
                leaf = self._add_pages(node, data, pos, new, now, locked=True, already_cached=True)
            except BaseException:  # a hook raised: the new pages went back, the admission never happened
                self._unlock_node(node)
                raise
            if leaf is not None:
                # The admission's lock moves from node down to the new leaf: the
                # path above already carries it, only the leaf's pages join.
                self._protected += leaf.num_pages
                holder = leaf
                self._unwritten_nodes[leaf] = None
        if priority:
            self._retain(holder, priority, expires_at)
        admitted = self._admitted
        admitted[holder] = admitted.get(holder, 0) + 1
        record = new_blocks = None
        if self._lower is not None and new:
            new_blocks = extents.to_array(new)
            new_blocks.flags.writeable = False
            record = self._lower.admitted(self._tree.find_root(key), data, pos, new_blocks)
        finish = partial(self._finish_admission, holder, pos, record)
        if self._store is not None and new and self._store_keys is None:  # write-through at the release
            chain = self._store_chain[1] if self._store_chain[0] is data else None
            finish = partial(self._finish_storing, root, data, chain, pos, new, holder, finish)
        if self._copying is not None:  # a release asks for every page of the request
            finish = partial(self._finish_asking, tenant, data, num_pages, namespace, finish)
        self._count_query(tokens, pos)
        return Admission(pos * self.page_size, path, new, NodeHandle(holder, holder.gen), finish, new_blocks,
                         self._copied, need - extents.size(new))

    def _finish_storing(self, root: Root, data: bytes, chain: Optional[List[bytes]], start: int, new: Parts,
                        holder: Node, finish: Callable[[bool], None], aborted: bool) -> None:
        """End an admission with a shared page store: ``finish`` it; a release whose new pages still
        hold their KV (no batch mate's abort uncached them) writes them to the store, first
        writer wins (one round trip; a store that fails counts it and raises nothing)."""
        written = not aborted and not (self._detached and holder in self._detached)
        finish(aborted)
        if written:
            blocks = extents.to_array(new)
            # Only pages whose whole prefix holds KV: a batch mate's pages above them may still be
            # unwritten (and may yet abort), and the store cannot take a page back.
            blocks = blocks[: max(0, self._settled(root, data, start + len(blocks)) - start)]
            if not len(blocks):
                return
            if chain is None:
                chain = self._store.chain(np.frombuffer(data, dtype=TOKEN_DTYPE), root.namespace)
            payload = self._pool.data
            pages = [payload[b] for b in blocks.tolist()] if payload is not None else [b""] * len(blocks)
            self._store.put(chain, pages, start)

    def _page_identities(self, data: bytes, num_pages: int, namespace: Optional[str]) -> np.ndarray:
        """The copy index's keys of the request with key bytes ``data``: hashed once a request (its
        copy-in and its release both need them). O(tokens) numpy the first time, O(1) after."""
        memo = self._identities
        if memo[0] is not data or memo[1] != namespace or len(memo[2]) != num_pages:
            memo = self._identities = (data, namespace, self._copies.request_keys(data, num_pages, namespace))
        return memo[2]

    def _finish_asking(self, tenant: Optional[str], data: bytes, num_pages: int, namespace: Optional[str],
                       finish: Callable[[bool], None], aborted: bool) -> None:
        """End an admission under a rule that shares by copy: ``finish`` it, and a release records
        ``tenant`` as an asker of every page of the request (an abort asks for nothing)."""
        finish(aborted)
        if not aborted:
            self._copying.asked(tenant, self._page_identities(data, num_pages, namespace))

    # ------------------------------------------------------------------ payloads
    def read(self, blocks: Union[Sequence[int], np.ndarray]) -> np.ndarray:
        """Copy of the payload of ``blocks``: shape ``(len(blocks), page_size, *kv_shape)``. O(bytes).

        Raises:
            RadixKVError: the cache keeps no payload (made without ``kv_shape``).
            InvalidBlocksError: a block id out of range, or a free block.
        """
        arr = self._payload_blocks(blocks, "read")
        return self._pool.data[arr]

    def write(self, blocks: Union[Sequence[int], np.ndarray], data: np.ndarray) -> None:
        """Store ``data`` (shape ``(len(blocks), page_size, *kv_shape)``) as the payload of ``blocks``. O(bytes).

        Raises:
            RadixKVError: the cache keeps no payload (made without ``kv_shape``).
            InvalidBlocksError: a block id out of range, or a free block.
            ArgumentValueError: ``data`` of another shape; ArgumentTypeError: a dtype that does not
                cast ``same_kind`` to the payload's. Nothing is written then.
        """
        arr = self._payload_blocks(blocks, "write")
        payload = self._pool.data
        expected = (len(arr),) + payload.shape[1:]
        try:
            values = np.asarray(data)
        except ValueError as exc:  # a ragged nesting of lists
            raise ArgumentValueError(f"data must be an array of shape {expected}: {exc}") from None
        # same_kind allows int -> float and float64 -> float16, not complex -> real or float -> int.
        if not np.can_cast(values.dtype, payload.dtype, casting="same_kind"):
            raise ArgumentTypeError(f"data must be castable to the payload dtype {payload.dtype} "
                                    f"(same_kind), got dtype {values.dtype}")
        if values.shape != expected:
            raise ArgumentValueError(f"data must have shape {expected}, got {values.shape}")
        payload[arr] = values

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """O(n) check of every invariant; raises AssertionError naming what broke.

        Tree shape, lock counts, pool free list, block ownership (every cached
        block owned once, free + held + cached == capacity), the cached and
        protected counters, and the victim queue (exactly the unlocked leaves,
        each at its current rank).
        """
        self._tree.check()
        self._pool.check()
        cached = protected = 0
        owned = []
        evictable_leaves = {}
        for node in self._tree.nodes():
            cached += node.num_pages
            owned.append(node.blocks)
            if node.lock_ref:
                protected += node.num_pages
            elif node.children is None:
                evictable_leaves[id(node)] = node
        assert cached == self._cached, f"cached counter {self._cached}, recount {cached}"
        assert protected == self._protected, f"protected counter {self._protected}, recount {protected}"
        blocks = np.concatenate(owned) if owned else _NO_BLOCKS
        values, counts = np.unique(blocks, return_counts=True)
        assert len(values) == len(blocks), f"blocks owned twice: {values[counts > 1][:10].tolist()}"
        states = self._pool.states(blocks)
        assert np.all(states == CACHED), f"tree holds blocks not in state cached: {blocks[states != CACHED][:10].tolist()}"
        detached = self._check_detached()
        for node in self._unwritten_nodes:
            assert node.lock_ref > 0 and node.alive, f"unwritten {node} is not held by its admission"
        assert self._pool.count(CACHED) == cached + detached, (
            f"{self._pool.count(CACHED)} blocks in state cached, tree holds {cached} (+ {detached} aborted, held)")
        held = self._pool.count(HELD)
        assert self._pool.num_free + held + cached + detached == self.num_blocks, "free + held + cached != capacity"
        live = dict((id(node), (key, node)) for key, node in self._victims.entries())
        assert len(live) == len(self._victims), "victim queue live count drifted"
        for nid, (key, node) in live.items():
            assert nid in evictable_leaves, f"victim queue holds {node}, which is not an evictable leaf"
            rank = rank_key(self._policy.priority, node)
            assert key == rank, f"{node} queued at {key}, current rank {rank}"
        missing = [n for nid, n in evictable_leaves.items() if nid not in live and n not in self._unranked]
        assert not missing, f"evictable leaves missing from the victim queue: {missing[:5]}"
        for node in self._unranked:
            assert node.heap_id == 0, f"{node} waits to be ranked and is queued"
        for node, count in self._pins.items():
            assert node.alive and count > 0, f"pinned node {node} is gone or holds {count} pins"
            assert node.lock_ref >= count, f"pinned node {node} has lock_ref {node.lock_ref} < {count} pins"
        for node in self._expiry:
            assert node.alive and node.retention > 0, f"{node} has an expiry but retention {node.retention}"
        for node, count in self._admitted.items():
            assert node.alive and count > 0, f"admitted node {node} is gone or holds {count} admissions"
        for node, count in self._locks.items():
            assert node.alive and count > 0, f"locked node {node} is gone or holds {count} locks"
        for ns, root in self._tree.roots():
            assert root.children is not None or root.lock_ref or self._keeps_root(root), (
                f"root of namespace {ns!r} holds no page and no lock: it should have been dropped")
        for node in itertools.chain(self._pins, self._locks, self._admitted):
            if node.parent is None and node not in self._detached:
                assert isinstance(node, Root) and self._tree.find_root(node.namespace) is node, (
                    f"locked root {node!r} is not registered")
        roots = (root for _, root in self._tree.roots())
        # A lock on a node locks every node above it (aborted nodes still held count among themselves).
        for node in itertools.chain(roots, self._tree.nodes(), self._detached):
            own = self._locks.get(node, 0) + self._pins.get(node, 0) + self._admitted.get(node, 0)
            below = sum(c.lock_ref for c in node.children.values()) if node.children else 0
            assert node.lock_ref == own + below, (
                f"{node} has lock_ref {node.lock_ref}: {own} of its own (lock, pin, admission) + {below} below")
        if self._page_hashes is not None:
            self._page_hashes.check(self._tree.nodes())
        self._sharing.check()
        if self._copies is not None:
            self._copies.check((namespace_of(node), node) for node in self._tree.nodes())
        if self._lower is not None:
            self._lower.check()

    def _check_detached(self) -> int:
        """Check the aborted nodes other holders still protect; return their blocks (part of check)."""
        pages = 0
        for node in self._detached:
            assert node.alive and node.lock_ref > 0, f"detached {node} is gone or unprotected"
            assert node.heap_id == 0, f"detached {node} is in the victim queue"
            for child in (node.children or {}).values():
                assert child in self._detached and child.parent is node, f"detached {node} has child {child}"
            pages += node.num_pages
            assert np.all(self._pool.states(node.blocks) == CACHED), f"detached {node}'s blocks changed state"
        assert pages == self._detached_blocks, f"detached counter {self._detached_blocks}, recount {pages}"
        return pages

    def reset(self) -> None:
        """Drop every cached page (blocks back to the pool, or the free-block sink). Raises
        :class:`~radixkv.errors.LockError`, changing nothing, if anything is protected. A hook
        that raises (the policy's ``on_evict``, an observer, a lower tier's policy) does not stop
        it: every page goes, then the first such error propagates."""
        if self._protected or self._detached or any(root.lock_ref for _, root in self._tree.roots()):
            raise LockError("reset while pages are locked; release them first")
        error = None  # a hook that raises (a tier's or the policy's): the reset completes, then the first error
        if self._lower is not None:
            try:
                self._lower.reset()
            except BaseException as exc:
                error = exc
        dropped = []
        for node in list(self._tree.nodes()):
            dropped.append(node.blocks)
            if self._on_evict is not None:
                try:
                    self._on_evict(node, node.num_pages, None)
                except BaseException as exc:
                    error = error or exc
            node.gen = -1
            node.heap_id = 0
        for _, root in self._tree.roots():  # handles to them outlive the reset: they must find nothing
            root.children = None
        self._tree = RadixTree(self.page_size)
        self._victims = make_queue(self._policy)
        self._unranked.clear()
        self._cached = 0
        self._expiry.clear()
        self._expiry_heap.clear()
        for observer in self._observers:
            try:
                observer.cleared()
            except BaseException as exc:
                error = error or exc
        self._give_back_then_raise(dropped, error)

    def attach_page_index(self, index: Optional[Any]) -> Optional[Any]:
        """Attach (or, with ``None``, detach) a page observer; return the one attached before.

        The observer (:class:`radixkv.analysis.stats.PageIndex`, which replay's miss reasons
        attach) gets ``stored(leaf)`` for every node of newly cached pages,
        ``removed(blocks)`` before cached blocks leave, and ``cleared()`` on
        :meth:`reset` (:class:`radixkv.events.page_hashes.PageObserver`), after the
        page-hash index (:meth:`attach_page_hashes`) and the event recorder, which
        are told through the same seam. With no observer, pages entering or
        leaving cost one empty loop. O(1).
        """
        previous, self._page_index = self._page_index, index
        self._observe()
        return previous

    @property
    def on_free(self) -> Optional[Callable[[np.ndarray], None]]:
        """The free-block sink: where blocks the cache frees go, instead of its free list.

        For a caller whose own allocator hands out the blocks (the SGLang
        adapter): ``on_free(blocks)`` gets, once each, the int32 ids of the
        blocks the cache lets go of: pages :meth:`evict` evicted, the
        duplicates and declined pages of an :meth:`insert`, aborted pages
        (:meth:`Admission.abort`, when their last holder lets go), and
        :meth:`reset`'s. They leave the cache as the caller's: the pool counts
        them as held (in :attr:`num_held_blocks`, never on the free list), so
        :meth:`check` still accounts for every block. Not sunk: blocks
        :meth:`free` returns (the caller gives them to the pool), and pages
        that :meth:`allocate`, :meth:`admit` or a tier's load evict to reuse at
        once. The sink runs inside the cache's call and must not call back
        into the cache. A sink that raises took none of the blocks: they stay
        on the free list, the cache stays consistent, and the error reaches
        the caller of the operation. Settable; ``None`` (the default) keeps
        freed blocks on the free list, at the cost of one ``is None`` test per free.
        """
        return self._on_free

    @on_free.setter
    def on_free(self, sink: Optional[Callable[[np.ndarray], None]]) -> None:
        self._on_free = _check_sink(sink)

    def _give_back(self, blocks: np.ndarray) -> None:
        """``blocks`` leave the cache: onto the pool's free list, or, held, to the free-block sink."""
        if self._on_free is None:
            self._pool.give_back(blocks)
        elif len(blocks):
            self._pool.set_state(blocks, HELD)
            self._sink(blocks)

    def _sink(self, held: np.ndarray) -> None:
        """Hand ``held`` blocks to the free-block sink. If the sink raises, it took none of them:
        they go onto the free list (still the cache's, never lost) and the error propagates."""
        try:
            self._on_free(held)
        except BaseException:
            self._pool.give_back(held)
            raise

    def attach_page_hashes(self, hasher: Optional[BlockHasher] = None) -> PageHashIndex:
        """Keep the page-hash index (block <-> vLLM-compatible chained hash of every cached page)
        from now on, without recording events; return it.

        :class:`radixkv.adapters.vllm.VLLMBlockView` looks pages up in it. The
        pages cached now are indexed at once (O(cached pages) hashes), then each
        page is hashed once, when it enters HBM. A cache that keeps the index
        already (``enable_events``, or an earlier call) returns it; ``hasher``
        must then hash alike (same function and seed) or is refused with
        :class:`ArgumentValueError`.
        """
        if hasher is not None and not isinstance(hasher, BlockHasher):
            raise ArgumentTypeError(f"hasher must be a BlockHasher, got {hasher!r}")
        index = self._page_hashes
        if index is None:
            index = self._page_hashes = PageHashIndex(self.num_blocks, self.page_size, hasher, self._tree.nodes())
            self._observe()
        elif hasher is not None and (hasher.hash_function, hasher.hash_seed) != (
                index.hasher.hash_function, index.hasher.hash_seed):
            raise ArgumentValueError(f"the cache keeps page hashes with {index.hasher!r} already, got {hasher!r}")
        return index

    @property
    def page_hashes(self) -> Optional[PageHashIndex]:
        """The page-hash index (see :meth:`attach_page_hashes`), or ``None`` when the cache keeps none. O(1)."""
        return self._page_hashes

    def add_page_observer(self, observer: Any) -> None:
        """Tell ``observer`` of every page entering or leaving HBM from now on, as the attached page
        index (:meth:`attach_page_index`): ``stored(leaf)``, ``removed(blocks)``, ``cleared()``
        (:class:`radixkv.events.page_hashes.PageObserver`). Any number may be added, each once (a
        cluster-wide index, :class:`radixkv.global_index.GlobalPageIndex`). It is not told of the
        pages cached now. Raises ArgumentTypeError for an object without the three methods,
        ArgumentValueError for one added already. O(observers)."""
        if not all(callable(getattr(observer, name, None)) for name in ("stored", "removed", "cleared")):
            raise ArgumentTypeError(f"a page observer needs stored, removed and cleared methods, got {observer!r}")
        if any(o is observer for o in self._extra_observers):
            raise ArgumentValueError(f"{observer!r} observes this cache already")
        self._extra_observers += (observer,)
        self._observe()

    def remove_page_observer(self, observer: Any) -> None:
        """Stop telling ``observer`` (added by :meth:`add_page_observer`) of pages; raises
        ArgumentValueError when it was not added. O(observers)."""
        kept = tuple(o for o in self._extra_observers if o is not observer)
        if len(kept) == len(self._extra_observers):
            raise ArgumentValueError(f"{observer!r} does not observe this cache")
        self._extra_observers = kept
        self._observe()

    def _observe(self) -> None:
        """Rebuild the observers told of pages entering and leaving: the hash index (through the
        event recorder when events are on, which updates it), the attached page index, the added
        observers, then the copy index of a sharing rule that shares by copy."""
        first = self._events if self._events is not None else self._page_hashes
        self._observers = tuple(o for o in (first, self._page_index, *self._extra_observers, self._copies)
                                if o is not None)

    # ------------------------------------------------------------------ events
    @property
    def event_log(self) -> Optional[EventLog]:
        """The event recorder, or ``None`` without ``enable_events`` (its hashes: :attr:`page_hashes`)."""
        return self._events

    def take_events(self) -> List[KVCacheEvent]:
        """KV events recorded since the last call, oldest first (see :mod:`radixkv.events`).

        Always empty for a cache created without ``enable_events``. Tenant-blind: the
        events are every tenant's (each partition's pages hashed with its own salt), so
        they are the operator's and a router's, never a tenant's to read. O(1).
        """
        return self._events.take() if self._events is not None else []

    # ------------------------------------------------------------------ internals
    def _existing_root(self, namespace: Optional[str], tenant: Optional[str] = None) -> Optional[Node]:
        """The root of the partition of ``namespace`` (and ``tenant``, under a rule that partitions by
        tenant) if it exists; raises on a namespace or tenant that is not a str (or None)."""
        return self._tree.find_root(self._partition(namespace, tenant))

    def _pages(self, tokens: TokensLike):
        return page_key(tokens, self.page_size)

    def _descend(self, root: Node, data: bytes, num_pages: int, use: bool = True, tenant: Optional[str] = None,
                 namespace: Optional[str] = None):
        """Walk to the deepest cached page of ``data`` (splitting there), loading the pages that
        continue below HBM and then, under a rule that shares by copy, copying the pages that
        continue in another tenant's partition; ``use`` is False for a pin, which a tier layer must
        not count as a hit and which copies nothing."""
        node, pos, child, common = self._tree.walk(root, data, num_pages)
        if child is not None:
            node = self._split(child, common)
            pos += common
        if self._lower is not None:
            node, pos = self._load_below(root, data, num_pages, node, pos, use)
        self._copied = 0
        # (a cache whose freed blocks go to a sink owns no free block to copy into: its caller allocates)
        if self._copying is not None and use and pos < num_pages and self._on_free is None:
            node, pos = self._copy_in(root, data, num_pages, node, pos, tenant, namespace)
        if self._store is not None and use and pos < num_pages and self._on_free is None:
            node, pos = self._store_in(root, data, num_pages, node, pos)
        return node, pos

    def _store_in(self, root: Root, data: bytes, num_pages: int, node: Node, pos: int):
        """Continue a match that reached page ``pos`` (``node``) with the pages the shared page store
        holds under the same tokens in the same partition: one verified round trip for the rest
        of the request's chain, stopping at the first gap, which also refreshes the store's
        recency of the pages before ``pos`` (an LRU-bounded store keeps what the fleet uses);
        the pages are cached in blocks the engine frees and takes itself, as a load from a lower
        tier would. O(pages) hashing once."""
        store = self._store
        memo = self._store_chain
        if memo[0] is data and memo[2] == root.namespace:
            chain = memo[1]
        else:
            chain = store.chain(np.frombuffer(data, dtype=TOKEN_DTYPE), root.namespace)
            self._store_chain = (data, chain, root.namespace)  # the release writes with the same keys
        pages, n = store.get(chain, pos, touch=True)  # the pages held already stay recent in the store
        if not n:
            return node, pos
        payload = self._pool.data
        if payload is not None:  # a payload of another size is no page of this cache's: a miss from there
            size = payload[0].nbytes
            n = next((i for i, page in enumerate(pages) if page.nbytes != size), n)
        self._lock_node(node)
        try:
            got = min(n, self._pool.num_free + self._cached - self._protected)
            if got <= 0:
                return node, pos
            free = self._pool.num_free
            if got > free:
                self._evict(got - free)
            blocks = self._pool.take(got)
            if payload is not None:
                shape = payload.shape[1:]
                for block, page in zip(blocks.tolist(), pages[:got]):
                    payload[block] = np.frombuffer(page, dtype=payload.dtype).reshape(shape)
            try:
                leaf = self._add_pages(node, data, pos, blocks, self._clock)
            except BaseException:  # a hook raised: the fetched pages have nowhere to go
                self._pool.give_back(blocks)
                raise
            self.store_hit_blocks += got
            return leaf, pos + got
        finally:
            self._unlock_node(node)

    def _copy_in(self, root: Root, data: bytes, num_pages: int, node: Node, pos: int, tenant: Optional[str],
                 namespace: Optional[str]):
        """Continue a match of ``tenant``'s partition that reached page ``pos`` (``node``) with copies
        of the pages another partition holds under the same tokens, as far as the sharing rule
        allows and their KV is written: into blocks the engine frees and takes itself, cached in
        ``tenant``'s partition, as a load from a lower tier would. The source pages are read, not
        touched, locked or split. O(pages looked up + pages copied)."""
        copies = self._copies
        keys = self._page_identities(data, num_pages, namespace)
        held, source = copies.holders(keys, pos, exclude=root.namespace)
        if source is None:
            return node, pos
        end, decision = self._copying.serve_copies(tenant, keys, pos, held)
        source_root = self._tree.find_root(source)
        end = min(end, self._settled(source_root, data, end)) if end > pos else pos
        if end <= pos:
            return node, pos
        self._lock_node(node)
        try:
            got = min(end - pos, self._pool.num_free + self._cached - self._protected)
            if got <= 0:
                return node, pos
            payload = None
            if self._pool.data is not None:  # read before room is made: the source's pages may go
                walked, wpos, child, common = self._tree.walk(source_root, data, pos + got)
                parts = self._tree.path_parts(walked)
                if common:
                    parts += extents.cut(child.parts, common)[0]
                payload = self._pool.data[extents.to_array(parts)[pos : pos + got]]
            free = self._pool.num_free
            if got > free:
                self._evict(got - free)
            blocks = self._pool.take(got)
            if payload is not None:
                self._pool.data[blocks] = payload
            copies.expect(keys)
            try:
                leaf = self._add_pages(node, data, pos, blocks, self._clock)
            except BaseException:  # a hook raised: the copied pages have nowhere to go
                self._pool.give_back(blocks)
                raise
            finally:
                copies.expect(None)
            self._copying.served(tenant, decision)
            self._copied = got
            self.copied_blocks += got
            if self._lower is not None:
                self._lower.hbm_hit(leaf, data, got)
            return leaf, pos + got
        finally:
            self._unlock_node(node)

    def _load_below(self, root: Root, data: bytes, num_pages: int, node: Node, pos: int, use: bool):
        """Continue a match that reached HBM's page ``pos`` (``node``) below HBM: the lower layer
        reads the pages worth loading, the engine caches them in blocks it frees and takes itself."""
        lower = self._lower
        found = lower.lookup(root, data, node, pos, num_pages, use)
        if found is None:
            return node, pos
        self._lock_node(node)
        try:
            load = lower.prepare_load(found, pos, self._pool.num_free + self._cached - self._protected, use)
            got = load.pages
            if not got:
                return node, pos
            try:
                free = self._pool.num_free
                if got > free:
                    self._evict(got - free)
            except BaseException:  # a tier's spill raised: the loaded pages have nowhere to go
                lower.cancel_load(load, root, data, pos)
                raise
            blocks = self._pool.take(got)
            if load.payload is not None:
                self._pool.data[blocks] = load.payload
            try:
                leaf = self._add_pages(node, data, pos, blocks, self._clock)
            except BaseException:  # a hook raised: the loaded pages have nowhere to go
                self._pool.give_back(blocks)
                lower.cancel_load(load, root, data, pos)
                raise
            lower.complete_load(load, use)
            return leaf, pos + got
        finally:
            self._unlock_node(node)

    def _split(self, child: Node, pages: int) -> Node:
        upper = self._tree.split(child, pages)
        if self._unwritten_nodes and child in self._unwritten_nodes:
            self._unwritten_nodes[upper] = None
        self._policy.on_split(upper, child)
        if self._lower is not None:
            self._lower.split(upper, child)
        if self._expiry and child in self._expiry:  # expiry propagates to the new upper part
            at = self._expiry[upper] = self._expiry[child]
            heapq.heappush(self._expiry_heap, (at, next(self._expiry_seq), upper))
        if child.heap_id:
            self._rank(child)
        return upper

    def _cut(self, node: Node, pages: int) -> Node:
        """The node above ``node`` whose last page is page ``pages`` (splitting one there). O(depth)."""
        while node.parent is not None and node.start >= pages:
            node = node.parent
        if node.parent is not None and node.end > pages:
            node = self._split(node, pages - node.start)
        return node

    def _touch_path(self, node: Node, now: int) -> List[Parts]:
        """Record a use of every node from ``node`` up; return their extents, root first.

        Per node this is one timestamp (or the policy's ``on_access``) and one
        list append, and no per-block work: :func:`radixkv.extents.join` and
        :func:`~radixkv.extents.to_array` make the ids when a caller wants them.
        """
        on_access = self._on_access
        parts = []
        append = parts.append
        n = node
        if on_access is None:  # the policy keeps the base hook: a use is a timestamp
            while n.parent is not None:
                n.policy_state = now
                append(n.parts)
                n = n.parent
        else:
            while n.parent is not None:
                on_access(n, now)
                append(n.parts)
                n = n.parent
        if node.heap_id:
            self._rank(node)
        parts.reverse()
        return parts

    def _add_pages(self, node: Node, data: bytes, start: int, blocks: Union[np.ndarray, Parts], now: int,
                   locked: bool = False, already_cached: bool = False) -> Optional[Node]:
        """Cache pages ``start..`` of ``data`` below ``node`` in ``blocks`` (an id array held by the
        caller, or extents ``already_cached``: taken from the pool straight into state cached)."""
        if len(blocks) == 0:  # no id, or no part (parts are never empty)
            return None
        leaf = self._tree.add_leaf(node, data, blocks, start * self._tree.page_bytes)
        if self._store_keys is not None:
            self._remember_store_keys(leaf, data, start)
        if not already_cached:
            self._pool.set_state(blocks, CACHED)
        self._cached += leaf.num_pages
        if node.heap_id:  # no longer a leaf
            self._victims.discard(node)
        told = -2  # -1: the policy took the leaf; from 0: observers told of it
        try:
            self._policy.on_insert(leaf, now)
            told = -1
            if locked:
                leaf.lock_ref = 1  # born locked (admit): never queued, so no stale heap entry
            else:
                self._rank(leaf)
            told = 0
            for observer in self._observers:
                observer.stored(leaf)
                told += 1
        except BaseException:  # a policy hook or an observer raised: the pages are not cached after all
            self._unadd(leaf, told, already_cached)
            raise
        return leaf

    def _remember_store_keys(self, leaf: Node, data: bytes, start: int) -> None:
        """Write-back: note the store key of each page of ``leaf`` (pages ``start..`` of ``data``),
        from the request's chain (hashed once a request). O(pages)."""
        root = leaf.parent
        while root.parent is not None:
            root = root.parent
        memo = self._store_chain
        if memo[0] is not data or memo[2] != root.namespace:
            chain = self._store.chain(np.frombuffer(data, dtype=TOKEN_DTYPE), root.namespace)
            memo = self._store_chain = (data, chain, root.namespace)
        keys = self._store_keys
        for block, key in zip(extents.id_list(leaf.parts), memo[1][start : start + leaf.num_pages]):
            keys[block] = key

    def _write_back(self, evicted: List[Tuple[Node, Parts]]) -> None:
        """Write-back: the evicted pages go to the store (one round trip), those whose whole prefix
        holds KV (a batch mate's pages above may be unwritten yet: the store cannot take a page
        back). A store that fails counts it and raises nothing. O(pages + depth a node)."""
        keys, pages = [], []
        payload, store_keys, unwritten = self._pool.data, self._store_keys, self._unwritten_nodes
        for node, parts in evicted:
            up = node
            while up.parent is not None and not (unwritten and up in unwritten):
                up = up.parent
            if up.parent is not None:
                continue
            for block in extents.id_list(parts):
                key = store_keys[block]
                if key is not None:
                    keys.append(key)
                    pages.append(payload[block] if payload is not None else b"")
        if keys:
            self._store.put(keys, pages)

    def _unadd(self, leaf: Node, told: int, already_cached: bool) -> None:
        """Undo :meth:`_add_pages` of ``leaf`` after a hook raised: the observers told of it (and
        the one that raised) hear its pages leave, so does the policy if it took them
        (``on_evict`` with no rank), it leaves the tree (and the pending set), and its blocks go back
        where they came from: to the free list when they were taken ``already_cached``, else
        to the caller, held again. Its pages never held KV: left cached, a later match would
        be served blocks nobody wrote."""
        node = leaf.parent
        blocks = leaf.blocks
        if told >= 0:  # (the error being raised is the one that made the undo)
            self._tell_removed(blocks, self._observers[: told + 1])
        if told >= -1 and self._on_evict is not None:  # the policy took the pages: they leave its books
            try:
                self._on_evict(leaf, leaf.num_pages, None)
            except BaseException:
                pass
        self._victims.discard(leaf)
        self._unranked.pop(leaf, None)
        leaf.lock_ref = 0
        parts = self._tree.truncate(leaf, leaf.num_pages)
        self._cached -= len(blocks)
        if already_cached:
            self._pool.give_back_parts(parts)
        else:
            self._pool.set_state(blocks, HELD)
        if node.parent is not None and node.children is None and not node.lock_ref:
            self._rank(node)  # a leaf again

    def _admit_pages(self, node: Node, data: bytes, start: int, n: int, now: int) -> int:
        """How many of the ``n`` new pages ``start..`` of ``data`` below ``node`` the policy caches.

        Counts the declined ones. The policy sees the new pages' token bytes
        as a zero-copy view.
        """
        if n == 0 or self._admit_hook is None:
            return n
        pb = self._tree.page_bytes
        keep = min(self._admit_hook(node, n, now, memoryview(data)[start * pb : (start + n) * pb]), n)
        if keep < n:
            self.declined_blocks += n - keep
        return keep

    def _retain(self, node: Node, priority: int, expires_at: Optional[int], upto: Optional[Node] = None) -> None:
        """Raise every node from ``node`` up to retention class ``priority`` (see :meth:`admit`),
        stopping below ``upto`` (the root by default).

        The nodes are locked by the admission, so none is queued now; they are
        ranked with their new class when it is released.
        """
        expiry, heap = self._expiry, self._expiry_heap
        while node.parent is not None and node is not upto:
            current = node.retention
            if priority > current or (priority == current and node in expiry):
                old = expiry.get(node) if priority == current else None
                node.retention = priority
                if expires_at is None:
                    expiry.pop(node, None)
                elif old is None or expires_at > old:
                    expiry[node] = expires_at
                    heapq.heappush(heap, (expires_at, next(self._expiry_seq), node))
            node = node.parent

    def _expire(self) -> None:
        """Drop retention classes whose expiry has passed (lazily, before evicting). O(log n) each."""
        heap, expiry, now = self._expiry_heap, self._expiry, self._clock
        while heap and heap[0][0] < now:
            at, _, node = heapq.heappop(heap)
            if expiry.get(node) == at:
                del expiry[node]
                node.retention = 0
                if node.heap_id:
                    self._rank(node)

    def _rank(self, node: Node) -> None:
        """(Re-)queue ``node`` if it is an evictable leaf.

        If the policy's ``priority`` (or ``lane``) raises, the leaf leaves the queue (its entry
        is at a rank no longer its own) for the pending set, which the next eviction ranks first
        (:func:`radixkv.victims.rank_waiting`), and the error propagates: no evictable leaf is lost track of.
        """
        if node.children is None and node.lock_ref == 0 and node.parent is not None:
            _victims.rank(self._victims, node, self._policy.priority, self._unranked)

    def _evict(self, n: int) -> int:
        """Evict up to ``n`` pages through the victim loop (:func:`radixkv.victims.evict`); return pages
        freed (their blocks onto the free list)."""
        freed, dropped = self._evict_parts(n)
        if dropped:
            self._pool.give_back_parts(dropped)
        return freed

    def _evict_parts(self, n: int) -> Tuple[int, List[extents.Part]]:
        """:meth:`_evict`, but the evicted blocks are returned as extents (cached in state, owned
        by nobody) for the caller to hand to the pool at once: :meth:`admit` takes them straight
        back (:meth:`BlockPool.take_after`). If the victim loop raises, what it cut already is
        back on the free list."""
        if self._expiry_heap:
            self._expire()
        if self._unranked:
            _victims.rank_waiting(self._unranked, self._rank, _ALIVE)
        victims, tree = self._victims, self._tree
        on_evict, spill, rank = self._on_evict, self._spill, self._rank
        dropped = []  # extents go back to the pool in one batch at the end
        evicted: List[Tuple[Node, Parts]] = []  # write-back: what goes to the store, in one round trip

        def take(node: Node, k: int, priority: Any) -> None:
            if spill is not None:  # a tier layer demotes the pages instead of dropping them
                spill(node, k)
            if self._store_keys is not None:
                evicted.append((node, extents.cut_tail(node.parts, k)[1]))
            if on_evict is not None:
                on_evict(node, k, priority)
            error = None
            if self._observers:
                error = self._tell_removed(extents.to_array(extents.cut_tail(node.parts, k)[1]))
            dropped.extend(tree.truncate(node, k))
            self._cached -= k
            self.evicted_blocks += k
            if node.gen >= 0:
                rank(node)
            else:
                victims.discard(node)
                if self._expiry:
                    self._expiry.pop(node, None)
                parent = node.parent
                if parent.parent is not None:
                    rank(parent)
                elif parent.children is None and not parent.lock_ref:
                    self._drop_root_if_unused(parent)
            if error is not None:  # an observer raised: the victim left all the same, the eviction stops
                raise error

        try:
            freed = _victims.evict(victims, self._policy, n, rank, take)
        except BaseException:  # a tier's spill raised: the victims already cut still go back to the pool
            if evicted:
                self._write_back(evicted)
            if dropped:
                self._pool.give_back_parts(dropped)
            raise
        if evicted:  # (before the blocks are handed out again)
            self._write_back(evicted)
        return freed, dropped

    def _lock_node(self, node: Node) -> None:
        while node is not None:
            node.lock_ref += 1
            if node.lock_ref == 1:
                self._protected += node.num_pages
                if node.heap_id:
                    self._victims.discard(node)
            node = node.parent

    def _unlock_node(self, node: Node) -> None:
        error = None  # a free-block sink or a policy that raised: re-raised once every lock on the path is off
        while node is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                if self._detached and node in self._detached:  # an aborted page's last holder let go
                    try:
                        self._free_detached(node)
                    except BaseException as exc:  # the blocks went to the free list (see _sink)
                        error = error or exc
                else:
                    self._protected -= node.num_pages
                    if node.children is None:
                        if node.parent is not None:
                            try:
                                self._rank(node)
                            except BaseException as exc:  # the leaf waits to be ranked (see _rank)
                                error = error or exc
                        else:
                            self._drop_root_if_unused(node)
            node = node.parent
        if error is not None:
            raise error

    def _keeps_root(self, root: Root) -> bool:
        """Whether an empty, unlocked ``root`` must stay registered (the lower layer's pages hang off it)."""
        return self._lower is not None and self._lower.keeps_root(root)

    def _drop_root_if_unused(self, root: Root) -> None:
        """Unregister ``root`` if it holds no page and no lock, so an unused namespace costs nothing.

        Handles to it stay valid: a root handle means its namespace's empty
        prefix, and :meth:`_resolve` maps it to whichever root is registered.
        """
        if root.children is None and not root.lock_ref and not self._keeps_root(root):
            self._tree.discard_root(root)
        if self._lower is not None:
            self._lower.root_released(root, self._tree.find_root(root.namespace) is root)

    # ------------------------------------------------------------------ abort
    def _abort_admission(self, node: Node, start: int) -> None:
        """End one admission whose deepest page is ``node`` and whose new pages start at page ``start``.

        Uncaches the subtree from the first new page down (see :meth:`Admission.abort`):
        pins in it end, the admission's lock goes, the subtree is cut from the tree
        (its other holders' locks leave the path above it), and every node of it
        leaves the cache: freed at once, or detached until its last holder lets go.
        """
        if node.end <= start or (self._detached and node in self._detached):
            self._release_admission(node)  # no new pages of its own left in the cache
            return
        top = node
        while top.start > start:
            top = top.parent
        subtree = [top]
        for n in subtree:  # grows while iterated: parents before children
            if n.children:
                subtree.extend(n.children.values())
        # A hook that raises while the locks go (a policy's priority, re-ranking a leaf) must not stop
        # the abort half way: the pages never held KV, so they leave all the same, then it raises.
        unlock_error = None
        for n in subtree:
            if self._pins and n in self._pins:
                for _ in range(self._pins.pop(n)):
                    try:
                        self._unlock_node(n)
                    except BaseException as exc:
                        unlock_error = unlock_error or exc
        try:
            self._release_admission(node)
        except BaseException as exc:
            unlock_error = unlock_error or exc
        lower_error = None
        try:  # a lower tier's policy that raises: the pages leave HBM all the same (they never held KV)
            self._forget_below(top)
        except BaseException as exc:
            lower_error = exc
        parent = top.parent
        del parent.children[top.first]
        if not parent.children:
            parent.children = None
        held = top.lock_ref  # other holders' locks in the subtree leave the path above it
        up = parent
        while held and up is not None:
            up.lock_ref -= held
            if not up.lock_ref:
                self._protected -= up.num_pages
            up = up.parent
        if not parent.lock_ref and parent.children is None:
            if parent.parent is not None:
                self._rank(parent)
            else:
                self._drop_root_if_unused(parent)
        # A hook that raises (an observer, the policy's on_evict) is re-raised once every node is
        # accounted for and the freed blocks are back: the abort itself always completes.
        error = self._tell_removed(np.concatenate([n.blocks for n in subtree]))
        error = unlock_error or lower_error or error
        freed = []
        on_evict = self._on_evict
        for n in subtree:
            self._cached -= n.num_pages
            if n.heap_id:
                self._victims.discard(n)
            if self._expiry:
                self._expiry.pop(n, None)
            if self._unwritten_nodes:
                self._unwritten_nodes.pop(n, None)
            if self._unranked:
                self._unranked.pop(n, None)
            if on_evict is not None:
                try:
                    on_evict(n, n.num_pages, None)
                except BaseException as exc:
                    error = error or exc
            if n.lock_ref:
                self._protected -= n.num_pages
                self._detached[n] = None
                self._detached_blocks += n.num_pages
                if n.children:
                    n.children = {k: c for k, c in n.children.items() if c.lock_ref} or None
            else:
                freed.append(n.blocks)
                n.gen = -1
        top.parent = None  # cut only now: the policy's on_evict may walk up to the namespace root
        self._give_back_then_raise(freed, error)

    def _give_back_then_raise(self, freed: List[np.ndarray], error: Optional[BaseException]) -> None:
        """Give the ``freed`` block arrays back (pool or sink), then raise ``error`` (a hook's, kept
        while an operation completed) if there is one: even if the give-back raises itself."""
        try:
            if freed:
                self._give_back(np.concatenate(freed))
        finally:
            if error is not None:
                raise error

    def _tell_removed(self, blocks: np.ndarray, observers: Optional[Sequence[Any]] = None) -> Optional[BaseException]:
        """Tell every observer (or those of ``observers``) that cached ``blocks`` leave; return the
        first exception one raised.

        Each observer is told whatever the others did (the hash index must forget pages
        that go even when the page index raises), and the caller removes the pages
        before it raises the error, so what the observers hold matches the tree."""
        error = None
        for observer in self._observers if observers is None else observers:
            try:
                observer.removed(blocks)
            except BaseException as exc:
                error = error or exc
        return error

    def _spill(self, node: Node, k: int) -> None:
        """The last ``k`` pages of leaf ``node`` are about to be evicted: the lower layer may demote them."""
        self._lower.evicting(node, k)

    def _forget_below(self, top: Node) -> None:
        """The pages from ``top`` down are being uncached by an abort: the lower layer drops its copies."""
        if self._lower is not None:
            self._lower.aborted(top)

    def _end_write(self, record: Any, node: Optional[Node]) -> None:
        """An admission with a lower layer's ``record`` ends: released (``node``, its deepest page,
        still locked; the lock goes whatever the layer does) or aborted (``None``).

        Its pages count as written unless an abort uncached them meanwhile (a
        batch mate's whose pages they continued): their KV was computed over
        unwritten bytes.
        """
        lower = self._lower
        if node is None:
            lower.unwritten(record)
            return
        try:
            if self._detached and node in self._detached:
                lower.unwritten(record)
            else:
                lower.written(record, node)
        finally:
            self._release_admission(node)

    def _free_detached(self, node: Node) -> None:
        """The last holder of detached (aborted) ``node`` let go: its blocks go back to the pool (or the sink)."""
        del self._detached[node]
        self._detached_blocks -= node.num_pages
        blocks = node.blocks
        node.gen = -1
        parent = node.parent
        if parent is not None and parent.children is not None:
            parent.children.pop(node.first, None)
            if not parent.children:
                parent.children = None
        self._give_back(blocks)  # last: a sink that raises finds the node gone and the blocks freed

    def _unlockable(self, handle: NodeHandle) -> Node:
        """The node of ``handle`` if :meth:`unlock` may undo one of its locks, else raise (nothing changed).

        :meth:`lock` counts its locks per node (pins and admissions keep their own
        counts), so this is O(1) however many children the node has.
        """
        node = self._resolve(handle)
        if self._locks.get(node, 0) <= 0:
            raise LockError(f"unlock of {handle!r}, which holds no lock taken by lock() "
                            "(an admission's lock is given up by Admission.release, a pin's by unpin)")
        return node

    def _finish_admission(self, node: Node, hit_pages: int, record: Any, aborted: bool) -> None:
        """End an admission whose deepest page is ``node`` (:meth:`Admission.release` / ``abort``)."""
        if self._unwritten_nodes:  # released: its new pages hold KV now; aborted: they leave the cache
            n = node
            while n.parent is not None and n.start >= hit_pages:
                self._unwritten_nodes.pop(n, None)
                n = n.parent
        if not aborted:
            if record is None:
                self._release_admission(node)
            else:
                self._end_write(record, node)
            return
        try:
            if record is not None:
                self._end_write(record, None)
        finally:  # the admission ends whatever the lower layer did
            self._abort_admission(node, hit_pages)

    def _partition(self, namespace: Optional[str], tenant: Optional[str]) -> Any:
        """The tree root key of a request (the namespace unless the sharing rule isolates tenants);
        raises on a bad namespace or tenant, before anything changes."""
        check_namespace(namespace)
        if tenant is None:
            return namespace
        _tenancy.check_tenant(tenant)
        return self._sharing.partition(namespace, tenant)

    def _release_admission(self, node: Node) -> None:
        """Give up one admission's lock on ``node`` (called once per admission by :meth:`Admission.release`)."""
        admitted = self._admitted
        count = admitted[node] - 1
        if count:
            admitted[node] = count
        else:
            del admitted[node]
        self._unlock_node(node)

    def _resolve(self, handle: NodeHandle) -> Node:
        if not isinstance(handle, NodeHandle):
            raise ArgumentTypeError(f"expected a NodeHandle (MatchResult.node), got {handle!r}")
        node = handle._node
        if node.gen != handle._gen:
            raise StaleHandleError(f"{handle!r} is stale: its pages were evicted since it was issued")
        if node.__class__ is Root:
            # The empty prefix of its namespace, whichever root holds it now; never the handle's own
            # root object, which may be another cache's or one a reset emptied (its children were
            # this cache's pages then, and adopting it would serve blocks that hold other KV now).
            registered = self._tree.find_root(node.namespace)
            return registered if registered is not None else self._tree.empty_root(node.namespace)
        if self._detached and node in self._detached:  # an aborted page still held (see Admission.abort)
            return node
        root = node.parent
        while root.parent is not None:
            root = root.parent
        if root.__class__ is not Root or self._tree.find_root(root.namespace) is not root:
            raise ArgumentValueError(f"{handle!r} is not a handle of this cache's pages")
        return node

    def _require_state(self, blocks: np.ndarray, state: int, action: str) -> None:
        if len(blocks) == 0:
            return
        states = self._pool.states(blocks)
        bad = np.flatnonzero(states != state)
        if len(bad):
            block, actual = int(blocks[bad[0]]), int(states[bad[0]])
            raise InvalidBlocksError(
                f"{action}: block {block} is {STATE_NAMES[actual]}, expected {STATE_NAMES[state]}"
                " (allocated by this cache and not yet inserted or freed)")

    def _payload_blocks(self, blocks, action: str) -> np.ndarray:
        if self._pool.data is None:
            raise RadixKVError(f"{action}: this cache keeps no payload; create it with kv_shape=...")
        arr = self._pool.validate_ids(blocks)
        states = self._pool.states(arr)
        bad = np.flatnonzero(states == FREE)
        if len(bad):
            raise InvalidBlocksError(f"{action}: block {int(arr[bad[0]])} is free")
        return arr

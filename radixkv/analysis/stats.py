"""Replay metrics: the counters of one replay, per-request records, and why each miss missed.

:class:`ReplayStats` is the one owner of a replay's counters; :func:`radixkv.analysis.replay.replay`
feeds it one admitted request at a time. Every counter only grows.

**Miss reasons.** Every prompt token that is not a hit is counted under exactly one
reason, so ``hit_tokens + sum(miss_tokens_by_reason.values()) == prompt_tokens``:

=================  ============================================================
reason             the missed token lies in
=================  ============================================================
partial_page       the trailing partial page (``len % page_size`` tokens), which
                   is never cached
evicted            a page cached earlier in this namespace and evicted since
declined           a page the policy declined to cache earlier (admission
                   control) and never cached in this namespace since
other_namespace    a page not cached in this namespace but cached under another
                   one right now (the same token prefix)
first_sight        a page never cached in this namespace before: its first
                   reference, or earlier references found no room
=================  ============================================================

A page is the whole token prefix through that page, in one namespace. The
reasons are checked in the order of the table.

**How pages are remembered** (:class:`PageHistory`). Each full page gets a 64-bit
key of its token prefix (:class:`~radixkv.page_keys.PrefixKeys`), computed once per
request and shared by every part of the classification; replay keys its requests
in batches of :data:`~radixkv.analysis.replay.READ_AHEAD`, a few vectorized numpy calls per
batch, so a short prompt does not pay numpy's per-call overhead. The pages ever
cached in a namespace are prefix-closed (a page is cached only below cached
pages), so they form a tree of *runs*: each request adds at most one run, the
pages it cached for the first time, starting at a page never cached before.
Runs are stored in a dict from ``(namespace, first key)`` to the array of their
keys. Finding how many leading pages of a request were ever cached walks that
tree: one dict lookup and one key comparison per run on the path. So the cost
per request is a small constant plus O(pages) (keying, and the index of pages
cached under other namespaces, :class:`PageIndex`) in plain Python on ints, and
memory is 8 bytes per distinct page ever cached (plus ~150 bytes per run). Two
different prefixes can share a key with probability about 2**-64 per pair; a
collision could move a miss from one reason to another, never change a hit.
``replay(..., miss_reasons=False)`` turns the tracking off.
"""

from __future__ import annotations

from array import array
from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import extents
from ..costs import (DEFAULT_HARDWARE, DEFAULT_MODEL, CostModel, HardwareSpec, ModelSpec, get_hardware, get_model,
                    prefill_flops)
from ..errors import ArgumentTypeError
from ..keys import TOKEN_DTYPE, as_tokens
from ..page_keys import PrefixKeys
from ..workload.traces import Request

MISS_REASONS = ("first_sight", "evicted", "partial_page", "declined", "other_namespace")
"""Every reason a prompt token can miss, in the order they are checked (see the module doc)."""

_U64 = np.uint64


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request of a replay (one line of ``--records``).

    Attributes:
        index: position in the trace, from 0.
        timestamp: arrival time in seconds, or ``None``.
        namespace: the request's cache partition, or ``None``.
        prompt_tokens: prompt length.
        hit_tokens: prompt tokens served from the cache.
        admitted_blocks: new pages the request cached.
        declined_blocks: new pages the policy declined to cache.
        evicted_blocks: blocks evicted to make room for this request.
        miss_tokens_by_reason: missed tokens per reason (:data:`MISS_REASONS`); empty when
            miss reasons are off.
        prefill_flops_saved: ``prefill_flops(model, 0, hit_tokens)``.
        ttft_saving_seconds: prefill time of the hit prefix on the chosen hardware, less the
            load time of its pages that came from lower tiers (at least 0).
    """

    index: int
    timestamp: Optional[float]
    namespace: Optional[str]
    prompt_tokens: int
    hit_tokens: int
    admitted_blocks: int
    declined_blocks: int
    evicted_blocks: int
    miss_tokens_by_reason: Dict[str, int]
    prefill_flops_saved: int
    ttft_saving_seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def _ints(keys: Union[Sequence[int], np.ndarray]) -> Sequence[int]:
    """``keys`` as Python ints: indexing and iterating a list is several times faster than a
    small numpy array."""
    return keys.tolist() if isinstance(keys, np.ndarray) else keys


def _agreeing(run: Sequence[int], keys: Sequence[int], d: int, m: int) -> int:
    """Leading keys of ``run`` equal to ``keys[d:]``, given ``run[0] == keys[d]`` and
    ``run[m - 1] != keys[d + m - 1]``. Keys are prefix keys: where two agree, every key before
    agrees too, so a binary search finds the first difference, in O(log m) scalar comparisons
    (cheaper than comparing whole arrays for the short runs of short prompts)."""
    lo, hi = 1, m - 1  # run[:lo] agrees, run[hi] differs
    while lo < hi:
        mid = (lo + hi) // 2
        if run[mid] == keys[d + mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


Keys = Union[Sequence[int], np.ndarray]
"""Page keys: a list of Python ints (what replay hands over), an ``array('Q')`` or a uint64 array."""


class PageHistory:
    """Which pages were ever cached, and ever declined, per namespace (see the module doc).

    Works on the namespace-free keys of :class:`PrefixKeys`; a run is filed
    under ``(namespace, its first key)``, so namespaces never share one. Keys
    may come as a list of ints (cheapest: no numpy scalar per key) or an array.
    Cost: :meth:`ever_cached` is one dict lookup and one key comparison per run
    on the request's path (a binary search where the request leaves a run);
    :meth:`add_cached` is O(pages added). Memory: 8 bytes per page ever cached
    (runs are ``array('Q')``) plus ~150 bytes per run.
    """

    def __init__(self) -> None:
        self._cached: Dict[Tuple[Optional[str], int], array] = {}
        self._declined: Dict[Tuple[Optional[str], int], array] = {}
        self._declining: set = set()  # the namespaces with declined pages
        self.num_cached = 0
        """Distinct pages ever cached."""

    @staticmethod
    def _covered(runs: Dict[Tuple[Optional[str], int], array], namespace: Optional[str], keys: Sequence[int],
                 d: int) -> int:
        """Walk ``namespace``'s run tree in ``runs`` along ``keys`` (ints) from depth ``d``; return the depth reached."""
        n = len(keys)
        while d < n:
            run = runs.get((namespace, keys[d]))
            if run is None:
                break
            m = min(len(run), n - d)
            if run[m - 1] != keys[d + m - 1]:  # equal last keys: equal prefixes, so all equal
                m = _agreeing(run, keys, d, m)
            d += m  # m >= 1: the run starts with keys[d]
        return d

    def ever_cached(self, keys: Keys, namespace: Optional[str] = None) -> int:
        """How many leading pages of ``keys`` were ever cached in ``namespace`` (a prefix, since the
        set is prefix-closed)."""
        return self._covered(self._cached, namespace, keys if keys.__class__ is list else _ints(keys), 0)

    def add_cached(self, keys: Keys, start: int, end: int, namespace: Optional[str] = None) -> None:
        """Record pages ``start..end-1`` as cached in ``namespace``: ``start`` is :meth:`ever_cached` of ``keys``."""
        if end > start:
            keys = keys if keys.__class__ is list else _ints(keys)
            self._cached[namespace, keys[start]] = array("Q", keys[start:end])
            self.num_cached += end - start

    def declines(self, namespace: Optional[str]) -> bool:
        """Whether any page was ever declined in ``namespace``. O(1)."""
        return namespace in self._declining

    def declined_mask(self, keys: Keys, namespace: Optional[str] = None) -> np.ndarray:
        """Which pages of ``keys`` were ever declined in ``namespace``. O(pages) dict lookups; call
        only if :meth:`declines`."""
        keys = _ints(keys)
        mask = np.zeros(len(keys), dtype=bool)
        runs = self._declined
        for d, key in enumerate(keys):
            run = runs.get((namespace, key))
            if run is not None:  # a run starting here; an earlier one may have ended sooner
                mask[d : self._covered({(namespace, key): run}, namespace, keys, d)] = True
        return mask

    def add_declined(self, keys: Keys, start: int, namespace: Optional[str] = None) -> None:
        """Record pages ``start..`` of ``keys`` as declined in ``namespace``; only the part not
        already on a run is stored."""
        keys = _ints(keys)
        start = self._covered(self._declined, namespace, keys, start)
        if start < len(keys):
            self._declined[namespace, keys[start]] = array("Q", keys[start:])
            self._declining.add(namespace)


class PageIndex:
    """How many namespaces cache each page identity right now, for the ``other_namespace`` reason.

    A page's identity is its token prefix without the namespace (the
    namespace-free key of :class:`PrefixKeys`). Attached to a cache with
    :meth:`~radixkv.PrefixCache.attach_page_index`, it is told of every page that
    becomes cached (:meth:`stored`) or leaves (:meth:`removed`), and keeps
    ``key -> number of namespaces caching that prefix``. Asking how deep another
    namespace caches a request's prefix is then O(pages of the request), however
    many namespaces the cache holds (walking every namespace's root instead is
    quadratic over a trace of single-use namespaces). Cost: one dict update per
    page stored or removed, in plain Python (a few numpy calls per request cost
    more than the whole update of a short prompt); the keys of stored pages come
    from :meth:`expect`, or are hashed from the node's tokens. Memory: one list
    slot per block plus one dict entry per distinct cached page.
    """

    def __init__(self, cache, keys: PrefixKeys) -> None:
        self._keys = keys
        self._page_size = cache.page_size
        self._block_key: List[int] = [0] * cache.num_blocks
        self._count: Dict[int, int] = {}
        self._expected: Optional[Sequence[int]] = None
        for node in cache.nodes():  # parents before children
            self.stored(node)

    def expect(self, free_keys: Optional[Union[Sequence[int], np.ndarray]]) -> None:
        """Until the next call, every page stored is a page of the prefix with these namespace-free
        keys (the request being admitted), so :meth:`stored` takes its keys from them instead of
        hashing the pages again. ``None`` ends it."""
        self._expected = None if free_keys is None else _ints(free_keys)

    def stored(self, leaf) -> None:
        """``leaf``'s pages became cached (the engine calls this). O(pages)."""
        expected = self._expected
        end = leaf.start + leaf.num_pages
        if expected is not None and end <= len(expected):
            keys = expected[leaf.start : end]
        else:
            parent = leaf.parent
            prev = self._block_key[parent.last_block] if parent.parent is not None else 0
            tokens = np.frombuffer(leaf.key, dtype=TOKEN_DTYPE, count=leaf.num_pages * self._page_size)
            keys = self._keys.extend(tokens, leaf.start, leaf.num_pages, _U64(prev)).tolist()
        count = self._count
        for key in keys:
            count[key] = count.get(key, 0) + 1
        parts = leaf.parts
        part = parts[0]
        if len(parts) == 1 and part.__class__ is tuple and part[0] <= part[1]:  # one ascending run
            self._block_key[part[0] : part[1] + 1] = keys
        else:
            block_key = self._block_key
            for block, key in zip(extents.id_list(parts), keys):
                block_key[block] = key

    def removed(self, blocks: np.ndarray) -> None:
        """Cached ``blocks`` leave the cache (the engine calls this). O(len(blocks))."""
        block_key, count = self._block_key, self._count
        for block in blocks.tolist():
            key = block_key[block]
            c = count[key] - 1
            if c:
                count[key] = c
            else:
                del count[key]

    def cleared(self) -> None:
        """Every page left the cache."""
        self._count.clear()
        self._expected = None

    def __len__(self) -> int:
        """Distinct page identities cached now."""
        return len(self._count)

    def held(self, key: int) -> int:
        """How many namespaces cache the page with namespace-free key ``key`` now. O(1)."""
        return self._count.get(key, 0)

    def other_pages(self, free_keys: Union[Sequence[int], np.ndarray], own_pages: int) -> int:
        """Most leading pages of the prefix with namespace-free keys ``free_keys`` that another
        namespace caches, given that the request's own namespace caches its first ``own_pages``.
        Stops at the first page no other namespace holds (each namespace's pages are
        prefix-closed). O(pages returned + 1)."""
        count = self._count
        d = 0
        for k in _ints(free_keys):
            if count.get(k, 0) - (d < own_pages) <= 0:
                break
            d += 1
        return d

    def other_depth(self, cache, request: Request, free_keys: Sequence[int]) -> int:
        """:func:`other_namespace_pages` of ``request`` (not admitted yet) in ``cache`` (which this index
        is attached to and which holds a namespace other than the request's), given the keys of
        its full pages (ints). Walks the request's own namespace only when that namespace holds
        pages and another one holds the request's first page. O(pages of the request)."""
        if not free_keys or free_keys[0] not in self._count:
            return 0
        own = (cache.cached_pages(request.tokens[: len(free_keys) * cache.page_size], namespace=request.namespace)
               if cache.holds_namespace(request.namespace) else 0)
        return self.other_pages(free_keys, own)


def other_namespace_pages(cache, request: Request, index: Optional[PageIndex] = None,
                          free_keys: Optional[np.ndarray] = None) -> int:
    """Most leading full pages of ``request`` cached right now under another namespace than its own.

    Call it before admitting the request (admission may evict those pages). Read-only. With
    ``index`` (attached to ``cache``) and the request's namespace-free keys it is O(pages of the
    request), and walks the request's own namespace only when that namespace holds pages and
    another namespace holds its first page; without, it walks the tree from each other
    namespace's root. O(1) while the cache holds at most the request's own namespace.
    """
    namespace = request.namespace
    held = cache.num_namespaces
    if not held or (held == 1 and cache.holds_namespace(namespace)):
        return 0
    num_pages = len(request.tokens) // cache.page_size
    if index is not None:
        return index.other_depth(cache, request, _ints(free_keys[:num_pages]))
    tokens = request.tokens[: num_pages * cache.page_size]
    return max((cache.cached_pages(tokens, namespace=ns) for ns in cache.namespaces() if ns != namespace),
               default=0)


class ReplayStats:
    """Counters of one replay, fed one admitted request at a time by :func:`radixkv.analysis.replay.replay`.

    Args:
        page_size: the cache's page size.
        model, hardware: a :class:`~radixkv.costs.ModelSpec` / :class:`~radixkv.costs.HardwareSpec`
            or a preset name, for the FLOPs and TTFT estimates.
        miss_reasons: classify missed tokens by reason (:class:`PageHistory`; memory grows
            with the distinct pages ever cached). Off: ``miss_tokens_by_reason`` stays empty.
        tier_costs: a tiered cache's :class:`~radixkv.costs.CostModel`, whose tier paths and
            links price pages loaded from lower tiers (for ``model`` on ``hardware``).
        by_tenant: remember pages per ``(namespace, tenant)`` instead of per namespace: under
            a sharing rule (:mod:`radixkv.tenancy`) what was cached for one tenant says nothing
            of what another is served, so a page another tenant cached is no ``evicted`` miss.

    Cost of :meth:`add`: a small constant plus O(runs on the request's path) with miss
    reasons on (see the module doc).
    """

    def __init__(self, page_size: int, *, model: Union[str, ModelSpec] = DEFAULT_MODEL,
                 hardware: Union[str, HardwareSpec] = DEFAULT_HARDWARE, miss_reasons: bool = True,
                 tier_costs: Optional[CostModel] = None, by_tenant: bool = False) -> None:
        self.page_size = page_size
        self.by_tenant = bool(by_tenant)
        self.model = get_model(model) if isinstance(model, str) else model
        self.hardware = get_hardware(hardware) if isinstance(hardware, str) else hardware
        if not isinstance(self.model, ModelSpec):
            raise ArgumentTypeError(f"model must be a ModelSpec or a preset name, got {model!r}")
        if not isinstance(self.hardware, HardwareSpec):
            raise ArgumentTypeError(f"hardware must be a HardwareSpec or a preset name, got {hardware!r}")
        if tier_costs is not None and not isinstance(tier_costs, CostModel):
            raise ArgumentTypeError(f"tier_costs must be a CostModel, got {tier_costs!r}")
        self.costs = (tier_costs.with_specs(self.model, self.hardware) if tier_costs is not None
                      else CostModel(self.model, self.hardware, page_size))
        self.requests = 0
        self.prompt_tokens = 0
        self.hit_tokens = 0
        self.hit_requests = 0
        self.admitted_blocks = 0
        self.declined_blocks = 0
        self.evicted_blocks = 0
        self.prefill_flops_saved = 0
        self.ttft_saving_seconds = 0.0
        """Prefill seconds the hits saved, summed over requests: per request, the hit prefix's
        recompute time less the load time of its lower-tier pages, at least 0
        (:meth:`radixkv.costs.CostModel.ttft_saving_seconds`)."""
        self.miss_tokens_by_reason: Dict[str, int] = dict.fromkeys(MISS_REASONS, 0) if miss_reasons else {}
        self._keys = PrefixKeys(page_size) if miss_reasons else None
        self._history = PageHistory() if miss_reasons else None
        self._index: Optional[PageIndex] = None
        self._previous_index = None
        self._last: Optional[Tuple[Request, List[int]]] = None  # the last request keyed, and its keys

    def reset_counts(self) -> None:
        """Zero every total (the end of a warm-up), keeping what the miss reasons remember of the
        pages seen so far: a page first seen during the warm-up is no first sight after it. O(1)."""
        self.requests = self.prompt_tokens = self.hit_tokens = self.hit_requests = 0
        self.admitted_blocks = self.declined_blocks = self.evicted_blocks = self.prefill_flops_saved = 0
        self.ttft_saving_seconds = 0.0
        for reason in self.miss_tokens_by_reason:
            self.miss_tokens_by_reason[reason] = 0

    def prepare(self, requests: Sequence[Request]) -> List[Optional[List[int]]]:
        """Key the full pages of ``requests`` in one batch (:meth:`PrefixKeys.many`); return each one's
        namespace-free keys (a list of ints), to hand to :meth:`other_pages` and :meth:`add` as ``keys``.

        Optional: a request given no keys is keyed on its own when it needs them. Keying a
        batch costs a fixed number of numpy calls plus O(tokens), where one request at a time
        pays those calls per request, which is most of the miss reasons' cost on short
        prompts. A request whose tokens are not a 1-D uint32 array gets ``None`` (checked and
        keyed later). All ``None`` with miss reasons off.
        """
        if self._keys is None:
            return [None] * len(requests)
        good = [r.tokens for r in requests
                if r.tokens.__class__ is np.ndarray and r.tokens.dtype == TOKEN_DTYPE and r.tokens.ndim == 1]
        keys, offsets = self._keys.many(good)
        keys = keys.tolist()  # once per batch: each request's keys are then a list slice
        if len(good) == len(requests):
            return [keys[offsets[i] : offsets[i + 1]] for i in range(len(requests))]
        out: List[Optional[List[int]]] = []
        i = 0
        for r in requests:
            if i < len(good) and r.tokens is good[i]:
                out.append(keys[offsets[i] : offsets[i + 1]])
                i += 1
            else:
                out.append(None)
        return out

    def _free_keys(self, request: Request) -> List[int]:
        """The namespace-free keys of ``request``'s full pages, as ints, computed now (and kept for the
        next call). Its tokens must be valid (raises as ``admit`` does otherwise)."""
        last = self._last
        if last is not None and last[0] is request:
            return last[1]
        tokens = as_tokens(request.tokens)
        keys = self._keys.keys(tokens, len(tokens) // self.page_size).tolist()
        self._last = (request, keys)
        return keys

    def other_pages(self, cache, request: Request, keys: Optional[List[int]] = None) -> int:
        """:func:`other_namespace_pages` of ``request``, taken before admitting it; ``keys``: its keys
        from :meth:`prepare`, if it was prepared.

        The first time ``cache`` holds a namespace other than the request's, a
        :class:`PageIndex` of its pages is built and attached to it (until :meth:`detach`);
        from then on each call is O(pages of the request) however many namespaces
        ``cache`` holds. With miss reasons off it walks every other root.
        """
        held = cache.num_namespaces
        if not held or (held == 1 and cache.holds_namespace(request.namespace)):
            if self._index is not None:  # the pages the admission stores are this request's, when known
                self._index.expect(keys)
            return 0
        if self._keys is None:
            return other_namespace_pages(cache, request)
        index = self._index
        if index is None or cache.page_index is not index:
            index = self._index = PageIndex(cache, self._keys)
            self._previous_index = cache.attach_page_index(index)
        free = keys if keys is not None else self._free_keys(request)
        index.expect(free)  # the pages the admission stores are this request's
        return index.other_depth(cache, request, free)

    def detach(self, cache) -> None:
        """Detach the :class:`PageIndex` :meth:`other_pages` attached to ``cache``, if any. O(1)."""
        if self._index is not None and cache.page_index is self._index:
            cache.attach_page_index(self._previous_index)
        self._index = self._previous_index = None
        self._last = None

    def add(self, request: Request, hit_tokens: int, admitted: int, declined: int, evicted: int,
            other_pages: int = 0, *, loaded_pages: Optional[Mapping[str, int]] = None,
            want_record: bool = False, keys: Optional[List[int]] = None) -> Optional[RequestRecord]:
        """Count one admitted request: ``hit_tokens`` served, ``admitted`` pages cached, ``declined``
        pages refused by the policy, ``evicted`` blocks evicted for it; ``other_pages`` is
        :func:`other_namespace_pages` taken before admitting it; ``loaded_pages`` maps a lower tier
        to the hit pages loaded from it; ``keys``: its keys from :meth:`prepare`, if it was
        prepared. Returns its record when ``want_record``.
        """
        tokens = request.tokens
        prompt = len(tokens)
        flops = prefill_flops(self.model, 0, hit_tokens) if hit_tokens else 0
        saving = self.costs.ttft_saving_seconds(hit_tokens, prompt, loaded_pages) if hit_tokens else 0.0
        self.requests += 1
        self.prompt_tokens += prompt
        self.hit_tokens += hit_tokens
        self.hit_requests += hit_tokens > 0
        self.admitted_blocks += admitted
        self.declined_blocks += declined
        self.evicted_blocks += evicted
        self.prefill_flops_saved += flops
        self.ttft_saving_seconds += saving
        if self._keys is not None:
            misses = self._classify(request, hit_tokens, admitted, declined, other_pages, keys)
            if self._index is not None:
                self._index.expect(None)
        if not want_record:
            return None
        misses = dict(zip(MISS_REASONS, misses)) if self._keys is not None else {}
        return RequestRecord(self.requests - 1, request.timestamp, request.namespace, prompt, hit_tokens, admitted, declined,
                             evicted, misses, flops, saving)

    def _classify(self, request: Request, hit_tokens: int, admitted: int, declined: int,
                  other: int, keys: Optional[List[int]]) -> Tuple[int, int, int, int, int]:
        """Add the request's missed tokens to :attr:`miss_tokens_by_reason`; return its own counts,
        in the order of :data:`MISS_REASONS`.

        O(1) plus O(runs on the request's path) dict lookups, and O(pages) for a namespace
        with declined pages; the request's keys are computed once (:meth:`prepare`).
        """
        p = self.page_size
        num_tokens = len(request.tokens)
        n = num_tokens // p
        h = hit_tokens // p
        partial = num_tokens - n * p
        totals = self.miss_tokens_by_reason
        if partial:
            totals["partial_page"] += partial
        if not n:
            return 0, 0, partial, 0, 0
        history = self._history
        namespace = (request.namespace, request.tenant) if self.by_tenant else request.namespace
        if keys is None:
            keys = self._free_keys(request)
        covered = history.ever_cached(keys, namespace)
        if h >= n:  # every full page hit: they were cached, which the history missed if the cache was
            history.add_cached(keys, covered, n, namespace)  # filled before the replay
            return 0, 0, partial, 0, 0
        seen = covered if covered > h else h  # hit pages were cached, unless the cache was filled before
        first = n - seen  # pages seen..n-1 are still to be explained
        was_declined = others = 0
        if history.declines(namespace):
            mask = history.declined_mask(keys, namespace)[seen:]
            was_declined = int(mask.sum())
            first -= was_declined
            if other > seen:
                others = other - seen - int(mask[: other - seen].sum())
        elif other > seen:
            others = other - seen
        history.add_cached(keys, covered, min(h + admitted, n), namespace)
        if declined:
            history.add_declined(keys, n - declined, namespace)
        first = (first - others) * p
        evicted = (seen - h) * p
        totals["first_sight"] += first
        if evicted:
            totals["evicted"] += evicted
        if was_declined:
            was_declined *= p
            totals["declined"] += was_declined
        if others:
            others *= p
            totals["other_namespace"] += others
        return first, evicted, partial, was_declined, others

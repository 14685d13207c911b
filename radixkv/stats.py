"""Replay metrics: the counters of one replay, per-request records, and why each miss missed.

:class:`ReplayStats` is the one owner of a replay's counters; :func:`radixkv.replay.replay`
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
key: a random linear hash of its token prefix, computed for a whole request in
a few vectorized numpy calls. The pages ever cached in a namespace are
prefix-closed (a page is cached only below cached pages), so they form a tree
of *runs*: each request adds at most one run, the pages it cached for the first
time, starting at a page never cached before. Runs are stored in a dict from
their first key to the array of their keys. Finding how many leading pages of
a request were ever cached walks that tree: one dict lookup and one array
comparison per run on the path. So the default cost per request is O(pages)
numpy work plus O(runs on the path), and memory is 8 bytes per distinct page
ever cached (plus ~150 bytes per run). Two different prefixes can share a key
with probability about 2**-64 per pair; a collision could move a miss from one
reason to another, never change a hit. ``replay(..., miss_reasons=False)``
turns the tracking off.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Dict, Mapping, Optional, Union

from cachetools import LRUCache
import numpy as np

from .costs import CostModel, HardwareSpec, ModelSpec, get_hardware, get_model, prefill_flops
from .errors import ArgumentTypeError
from .traces import TOKEN_DTYPE, Request

MISS_REASONS = ("first_sight", "evicted", "partial_page", "declined", "other_namespace")
"""Every reason a prompt token can miss, in the order they are checked (see the module doc)."""

DEFAULT_MODEL = "llama-3-8b"
DEFAULT_HARDWARE = "h100"

_U64 = np.uint64
_SALT_MEMO = 4096


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


class PrefixKeys:
    """64-bit keys of the page prefixes of token arrays, vectorized.

    ``key[d] = salt ^ sum_{j<=d} (page_hash[j] + b) * r[j]  (mod 2**64)``, where
    ``page_hash[j] = sum_i token[j, i] * a[i]`` and ``a``, ``b``, ``r`` are fixed
    random odd 64-bit numbers. Equal prefixes (and namespaces) give equal keys.
    Cost: O(tokens) numpy work, a handful of calls per request.
    """

    def __init__(self, page_size: int, seed: int = 0x52AD1C) -> None:
        self.page_size = page_size
        self._rng = np.random.default_rng(seed)
        self._coef = self._odd(page_size)
        self._offset = self._odd(1)[0]
        self._depth = self._odd(1024)
        # The recent namespaces' salts: a bounded LRU map, so single-use namespaces (per-request
        # salts) neither grow memory nor evict the busy tenants' salts wholesale.
        self._salts: LRUCache = LRUCache(maxsize=_SALT_MEMO)

    def _odd(self, n: int) -> np.ndarray:
        return self._rng.integers(0, 1 << 63, size=n, dtype=np.uint64) * _U64(2) + _U64(1)

    def keys(self, tokens: np.ndarray, num_pages: int, namespace: Optional[str] = None) -> np.ndarray:
        """Keys of the first ``num_pages`` full pages of ``tokens`` (uint64)."""
        h = self.extend(np.asarray(tokens, dtype=TOKEN_DTYPE), 0, num_pages, _U64(0))
        salt = self.salt(namespace)
        if salt:
            h ^= salt
        return h

    def extend(self, tokens: np.ndarray, start: int, num_pages: int, prev: np.uint64) -> np.ndarray:
        """Namespace-free keys of pages ``start .. start + num_pages - 1`` of a prefix whose page
        ``start - 1`` has namespace-free key ``prev`` (0 at ``start == 0``); ``tokens`` holds those
        pages' tokens. ``keys(t, n, None)`` is ``extend(t, 0, n, 0)``."""
        end = start + num_pages
        while len(self._depth) < end:
            self._depth = np.concatenate([self._depth, self._odd(len(self._depth))])
        pages = tokens[: num_pages * self.page_size]
        # einsum sums the products without a (pages, page_size) uint64 temporary: 2x faster
        h = np.einsum("ij,j->i", pages.reshape(num_pages, self.page_size), self._coef,
                      dtype=np.uint64, casting="unsafe")
        h += self._offset
        h *= self._depth[start:end]
        if prev:
            h[:1] += prev
        np.cumsum(h, out=h)
        return h

    def salt(self, namespace: Optional[str]) -> np.uint64:
        """The 64-bit salt XORed into ``namespace``'s keys (0 for ``None``). Memoized, boundedly:
        single-use namespaces must not grow memory without bound."""
        if namespace is None:
            return _U64(0)
        salt = self._salts.get(namespace)
        if salt is None:
            digest = hashlib.blake2b(str(namespace).encode("utf-8", "surrogatepass"), digest_size=8).digest()
            salt = self._salts[namespace] = _U64(int.from_bytes(digest, "little"))
        return salt


class PageHistory:
    """Which pages were ever cached, and ever declined, per namespace (see the module doc).

    Works on the keys of :class:`PrefixKeys`. Cost: :meth:`ever_cached` is one dict
    lookup and one array comparison per run on the request's path;
    :meth:`add_cached` is O(pages added). Memory: 8 bytes per page ever cached.
    """

    def __init__(self) -> None:
        self._cached: Dict[int, np.ndarray] = {}
        self._declined: Dict[int, np.ndarray] = {}
        self.num_cached = 0
        """Distinct pages ever cached."""

    @staticmethod
    def _covered(runs: Dict[int, np.ndarray], keys: np.ndarray, d: int) -> int:
        """Walk the run tree ``runs`` along ``keys`` from depth ``d``; return the depth reached."""
        n = len(keys)
        while d < n:
            run = runs.get(int(keys[d]))
            if run is None:
                break
            m = min(len(run), n - d)
            if m > 1 and run[m - 1] != keys[d + m - 1]:  # equal last keys: equal prefixes, so all equal
                differ = run[:m] != keys[d : d + m]
                m = int(differ.argmax())
            d += m  # m >= 1: the run starts with keys[d]
        return d

    def ever_cached(self, keys: np.ndarray) -> int:
        """How many leading pages of ``keys`` were ever cached (a prefix, since the set is prefix-closed)."""
        return self._covered(self._cached, keys, 0)

    def add_cached(self, keys: np.ndarray, start: int, end: int) -> None:
        """Record pages ``start..end-1`` as cached: ``start`` is :meth:`ever_cached` of ``keys``."""
        if end > start:
            self._cached[int(keys[start])] = keys[start:end].copy()
            self.num_cached += end - start

    @property
    def any_declined(self) -> bool:
        return bool(self._declined)

    def declined_mask(self, keys: np.ndarray) -> np.ndarray:
        """Which pages of ``keys`` were ever declined. O(pages) dict lookups; call only if :attr:`any_declined`."""
        mask = np.zeros(len(keys), dtype=bool)
        runs = self._declined
        for d, key in enumerate(keys.tolist()):
            run = runs.get(key)
            if run is not None:  # a run starting here; an earlier one may have ended sooner
                mask[d : self._covered({key: run}, keys, d)] = True
        return mask

    def add_declined(self, keys: np.ndarray, start: int) -> None:
        """Record pages ``start..`` of ``keys`` as declined; only the part not already on a run is stored."""
        start = self._covered(self._declined, keys, start)
        if start < len(keys):
            self._declined[int(keys[start])] = keys[start:].copy()


class PageIndex:
    """How many namespaces cache each page identity right now, for the ``other_namespace`` reason.

    A page's identity is its token prefix without the namespace (the
    namespace-free key of :class:`PrefixKeys`). Attached to a cache with
    :meth:`~radixkv.PrefixCache.attach_page_index`, it is told of every page that
    becomes cached (:meth:`stored`) or leaves (:meth:`removed`), and keeps
    ``key -> number of namespaces caching that prefix``. Asking how deep another
    namespace caches a request's prefix is then O(pages of the request), however
    many namespaces the cache holds (walking every namespace's root instead is
    quadratic over a trace of single-use namespaces). Cost: O(pages) numpy work
    plus one dict update per page stored or removed; memory 8 bytes per block
    plus one dict entry per distinct cached page.
    """

    def __init__(self, cache, keys: PrefixKeys) -> None:
        self._keys = keys
        self._page_size = cache.page_size
        self._block_key = np.zeros(cache.num_blocks, dtype=np.uint64)
        self._count: Counter = Counter()
        self._expected: Optional[np.ndarray] = None
        for node in cache.nodes():  # parents before children
            self.stored(node)

    def expect(self, free_keys: Optional[np.ndarray]) -> None:
        """Until the next call, every page stored is a page of the prefix with these namespace-free
        keys (the request being admitted), so :meth:`stored` takes its keys from them instead of
        hashing the pages again. ``None`` ends it."""
        self._expected = free_keys

    def stored(self, leaf) -> None:
        """``leaf``'s pages became cached (the engine calls this). O(pages)."""
        expected = self._expected
        if expected is not None and leaf.start + leaf.num_pages <= len(expected):
            keys = expected[leaf.start : leaf.start + leaf.num_pages]
        else:
            parent = leaf.parent
            prev = self._block_key[parent.blocks[-1]] if parent.parent is not None else _U64(0)
            tokens = np.frombuffer(leaf.key, dtype=TOKEN_DTYPE, count=leaf.num_pages * self._page_size)
            keys = self._keys.extend(tokens, leaf.start, leaf.num_pages, prev)
        self._block_key[leaf.blocks] = keys
        self._count.update(keys.tolist())

    def removed(self, blocks: np.ndarray) -> None:
        """Cached ``blocks`` leave the cache (the engine calls this). O(len(blocks))."""
        count = self._count
        for k in self._block_key[blocks].tolist():
            c = count[k] - 1
            if c:
                count[k] = c
            else:
                del count[k]

    def cleared(self) -> None:
        """Every page left the cache."""
        self._count.clear()
        self._expected = None

    def __len__(self) -> int:
        """Distinct page identities cached now."""
        return len(self._count)

    def other_pages(self, free_keys: np.ndarray, own_pages: int) -> int:
        """Most leading pages of the prefix with namespace-free keys ``free_keys`` that another
        namespace caches, given that the request's own namespace caches its first ``own_pages``.
        Stops at the first page no other namespace holds (each namespace's pages are
        prefix-closed). O(pages returned + 1)."""
        count = self._count
        d = 0
        for k in free_keys.tolist():
            if count.get(k, 0) - (d < own_pages) <= 0:
                break
            d += 1
        return d


def _own_pages(cache, request: Request, num_pages: int) -> int:
    """Leading pages of ``request`` cached in its own namespace now. O(depth)."""
    return cache.cached_pages(request.tokens[: num_pages * cache.page_size], namespace=request.namespace)


def other_namespace_pages(cache, request: Request, index: Optional[PageIndex] = None,
                          free_keys: Optional[np.ndarray] = None) -> int:
    """Most leading full pages of ``request`` cached right now under another namespace than its own.

    Call it before admitting the request (admission may evict those pages). Read-only. With
    ``index`` (attached to ``cache``) and the request's namespace-free keys it is O(pages of the
    request); without, it walks the tree from each other namespace's root. O(1) while the cache
    holds at most the request's own namespace.
    """
    namespace = request.namespace
    held = cache.num_namespaces
    if not held or (held == 1 and cache.holds_namespace(namespace)):
        return 0
    num_pages = len(request.tokens) // cache.page_size
    if index is not None:
        return index.other_pages(free_keys[:num_pages], _own_pages(cache, request, num_pages))
    tokens = request.tokens[: num_pages * cache.page_size]
    return max((cache.cached_pages(tokens, namespace=ns) for ns in cache.namespaces() if ns != namespace),
               default=0)


class ReplayStats:
    """Counters of one replay, fed one admitted request at a time by :func:`radixkv.replay.replay`.

    Args:
        page_size: the cache's page size.
        model, hardware: a :class:`~radixkv.costs.ModelSpec` / :class:`~radixkv.costs.HardwareSpec`
            or a preset name, for the FLOPs and TTFT estimates.
        miss_reasons: classify missed tokens by reason (:class:`PageHistory`; memory grows
            with the distinct pages ever cached). Off: ``miss_tokens_by_reason`` stays empty.
        tier_costs: a tiered cache's :class:`~radixkv.costs.CostModel`, whose tier paths and
            links price pages loaded from lower tiers (for ``model`` on ``hardware``).

    Cost of :meth:`add`: O(1) for a request that hits every full page; otherwise
    O(pages) numpy work to key the pages (see the module doc).
    """

    def __init__(self, page_size: int, *, model: Union[str, ModelSpec] = DEFAULT_MODEL,
                 hardware: Union[str, HardwareSpec] = DEFAULT_HARDWARE, miss_reasons: bool = True,
                 tier_costs: Optional[CostModel] = None) -> None:
        self.page_size = page_size
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
        self._free = None  # (request, its namespace-free page keys): computed once per request

    def other_pages(self, cache, request: Request) -> int:
        """:func:`other_namespace_pages` of ``request``, taken before admitting it.

        The first time ``cache`` holds a namespace other than the request's, a
        :class:`PageIndex` of its pages is built and attached to it (until :meth:`detach`);
        from then on each call is O(pages of the request) however many namespaces
        ``cache`` holds. With miss reasons off it walks every other root.
        """
        held = cache.num_namespaces
        if not held or (held == 1 and cache.holds_namespace(request.namespace)):
            if self._index is not None:
                self._index.expect(None)
            return 0
        if self._keys is None:
            return other_namespace_pages(cache, request)
        index = self._index
        if index is None or cache.page_index is not index:
            index = self._index = PageIndex(cache, self._keys)
            self._previous_index = cache.attach_page_index(index)
        n = len(request.tokens) // self.page_size
        free = self._keys.keys(request.tokens, n)
        self._free = (request, free)
        index.expect(free)  # the pages the admission stores are this request's
        return other_namespace_pages(cache, request, index, free)

    def detach(self, cache) -> None:
        """Detach the :class:`PageIndex` :meth:`other_pages` attached to ``cache``, if any. O(1)."""
        if self._index is not None and cache.page_index is self._index:
            cache.attach_page_index(self._previous_index)
        self._index = self._previous_index = None

    def add(self, request: Request, hit_tokens: int, admitted: int, declined: int, evicted: int,
            other_pages: int = 0, *, loaded_pages: Optional[Mapping[str, int]] = None,
            want_record: bool = False) -> Optional[RequestRecord]:
        """Count one admitted request: ``hit_tokens`` served, ``admitted`` pages cached, ``declined``
        pages refused by the policy, ``evicted`` blocks evicted for it; ``other_pages`` is
        :func:`other_namespace_pages` taken before admitting it; ``loaded_pages`` maps a lower tier
        to the hit pages loaded from it. Returns its record when ``want_record``.
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
        misses = self._classify(request, hit_tokens, admitted, declined, other_pages) if self._keys is not None else {}
        if self._free is not None:
            self._free = None
            self._index.expect(None)
        if not want_record:
            return None
        return RequestRecord(self.requests - 1, request.timestamp, request.namespace, prompt, hit_tokens, admitted, declined,
                             evicted, misses, flops, saving)

    def _classify(self, request: Request, hit_tokens: int, admitted: int, declined: int, other: int) -> Dict[str, int]:
        """Add the request's missed tokens to :attr:`miss_tokens_by_reason`; return its own counts."""
        p = self.page_size
        tokens = request.tokens
        n = len(tokens) // p
        h = hit_tokens // p
        out = dict.fromkeys(MISS_REASONS, 0)
        out["partial_page"] = len(tokens) - n * p
        if h < n:
            history = self._history
            memo = self._free
            if memo is not None and memo[0] is request:
                keys = memo[1] ^ self._keys.salt(request.namespace)
            else:
                keys = self._keys.keys(tokens, n, request.namespace)
            covered = history.ever_cached(keys)
            seen = max(covered, h)  # hit pages were cached, unless the cache was filled before the replay
            out["evicted"] = (seen - h) * p
            if history.any_declined or other > seen:
                rest = np.ones(n - seen, dtype=bool)  # still to be explained: pages seen..n-1
                if history.any_declined:
                    was_declined = history.declined_mask(keys)[seen:]
                    out["declined"] = int(was_declined.sum()) * p
                    rest &= ~was_declined
                if other > seen:
                    out["other_namespace"] = int(rest[: other - seen].sum()) * p
                    rest[: other - seen] = False
                out["first_sight"] = int(rest.sum()) * p
            else:
                out["first_sight"] = (n - seen) * p
            history.add_cached(keys, covered, min(h + admitted, n))
            if declined:
                history.add_declined(keys, n - declined)
        totals = self.miss_tokens_by_reason
        for reason, count in out.items():
            if count:
                totals[reason] += count
        return out

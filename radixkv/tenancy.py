"""Sharing rules between tenants: which cached pages a tenant is served as a hit.

A prefix cache shared by tenants is a timing oracle: a hit is much faster than
a miss, so a tenant who sends a guessed prompt learns whether another tenant
sent it (PromptPeek, NDSS'25). A *tenant* is who sends a request (a user, an
API key); it is not a *namespace*, which stays a hard partition (a LoRA
adapter, a model variant) whatever the rule. The rules here decide, per
request, how many leading cached pages the tenant is *served*; the pages
after them are *served as a miss*: the caller recomputes them in private
blocks (see :meth:`radixkv.cache.PrefixCache.admit`), the tree keeps its one
copy.

=============  ==============================================================
name           rule
=============  ==============================================================
shared         every cached page is a hit (no defence; the default)
isolated       one partition per tenant, as vLLM's ``cache_salt``
k-anonymous    a page is a hit for X if X requested it before, or at least
               ``k`` distinct other tenants did
adaptive       shared, until a tenant has been served ``budget`` requests that
               k-anonymous would have refused; k-anonymous for it from then on
=============  ==============================================================

Threat model, common to all: one attacker tenant that sends prompts of its
choice and observes, per request, how many tokens were served from the cache
and from which tier (exactly: TTFT). What none of them hides: that the pool is
shared (an attacker who fills HBM and times its own pages' eviction learns how
busy others are, isolated included).

Under a rule that filters (``k-anonymous``, ``adaptive``) a refused page is
invisible to the request it is refused to: :meth:`~radixkv.cache.PrefixCache.match`
and :meth:`~radixkv.cache.PrefixCache.admit` touch, split, lock, load and tell
hooks and events about the served prefix only, and compute the rest in private
blocks; the release caches the pages still missing then. Pages below HBM keep
no requesters, so such a rule never serves (or loads) them.

Which entry points take a tenant: ``match``, ``admit`` and ``insert`` (and the
adapters' faces that call them). These are tenant-blind and must not face a
tenant (an operator's tools, or a router that sees every tenant's pages anyway):
``cached_pages``, ``peek_match``, ``locate``/``prefix_pages``, ``pin``/``unpin``
(a pin loads pages back from below and keeps them), ``TieredCache.peek``, the
vLLM block view's lookups, :class:`~radixkv.analysis.stats` miss reasons, and
the KV events, which under a filtering rule show where a request was
deduplicated (a release that found its pages cached stores nothing).

Bookkeeping is per cached block: the rules that need it are observers of
the engine (``stored`` / ``removed`` / ``cleared``), and a page that leaves
HBM forgets its requesters, so a page cached again (or loaded back from a lower
tier) starts with none: its next requesters are refused until they count
again. Forgetting only ever refuses more.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any, Dict, Hashable, List, Optional, Tuple, Type, Union

import numpy as np
from cachetools import LRUCache

from .errors import ArgumentTypeError, ArgumentValueError
from .keys import check_int, check_namespace

__all__ = ["Sharing", "Shared", "Isolated", "KAnonymous", "Adaptive", "create", "available", "check_tenant"]

DEFAULT_K = 3
"""``k`` of ``"k-anonymous"`` and ``"adaptive"`` when not given."""

DEFAULT_BUDGET = 2
"""Requests ``"adaptive"`` serves beyond k-anonymity before it isolates the tenant."""

DEFAULT_MAX_TENANTS = 65536
"""Strike counts ``"adaptive"`` keeps at most (the least recently suspect tenant's goes first)."""

_PUBLIC: Any = object()  # a page's requester record once k + 1 distinct tenants asked for it: a hit for all


def check_tenant(tenant: object) -> None:
    """Raise unless ``tenant`` is ``None`` (no tenant) or a str that is valid Unicode text (as a namespace)."""
    if tenant is not None and type(tenant) is not str:
        raise ArgumentTypeError(f"tenant must be a str or None, got {tenant!r}")
    try:
        check_namespace(tenant)
    except ArgumentValueError as exc:
        raise ArgumentValueError(str(exc).replace("namespace", "tenant", 1)) from None


class Sharing:
    """The seam the engine consults: a partition key per request, then which matched pages to serve.

    ``filters`` is False for rules that serve every matched page (the engine
    then calls neither :meth:`serve` nor :meth:`commit`, and registers no
    observer: the rule costs nothing on the hit path).
    """

    name = ""
    filters = False

    def partition(self, namespace: Optional[str], tenant: Optional[str]) -> Hashable:
        """The tree root key of a request of ``tenant`` in ``namespace`` (the namespace, by default). O(1)."""
        return namespace

    def bind(self) -> None:
        """Claim the rule for one cache (the engine calls this once). A rule that keeps records
        (:attr:`filters`) keys them by block id, which means nothing in another cache: it
        refuses a second cache (:class:`~radixkv.errors.ArgumentValueError`) instead of serving
        one cache's pages by another's records. :meth:`fresh` makes one for each. O(1)."""
        if self.filters:
            if getattr(self, "_bound", False):
                raise ArgumentValueError(f"the sharing rule {self!r} serves another cache already; give each cache "
                                         f"its own (rule.fresh())")
            self._bound = True

    def fresh(self) -> "Sharing":
        """A rule of the same kind and parameters with no records, bound to no cache. O(1)."""
        return type(self)()

    def serve(self, tenant: Optional[str], blocks: np.ndarray) -> Tuple[int, Any]:
        """``(pages served, decision)`` for ``tenant`` whose request matched cached ``blocks`` (root
        first). Changes nothing: the engine hands ``decision`` to :meth:`served` once the match or
        admission happened, and to :meth:`commit` when an admission is released. O(len(blocks))
        dict lookups, one a page."""
        return len(blocks), None

    def served(self, tenant: Optional[str], decision: Any) -> None:
        """``tenant`` was served by ``decision`` (a match, or an admission that may still abort). O(1)."""

    def commit(self, tenant: Optional[str], decision: Any, new_blocks: np.ndarray) -> None:
        """Record a released admission: ``decision`` from :meth:`serve` (its pages are all still
        cached), ``new_blocks`` the pages it cached (``tenant`` caused them). An aborted
        admission records nothing. O(pages not yet public + new pages)."""

    # observer hooks (called by the engine for every page entering or leaving HBM)
    def stored(self, leaf: Any) -> None:
        """Pages entered HBM; a page with no record has no requesters yet."""

    def removed(self, blocks: np.ndarray) -> None:
        """``blocks`` left HBM: their records go."""

    def cleared(self) -> None:
        """Every page left HBM (reset)."""

    def check(self, cached_blocks: np.ndarray) -> None:
        """Assert the bookkeeping covers only ``cached_blocks`` (a rule's own bound). O(records)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Shared(Sharing):
    """Every cached page is served to every tenant: today's prefix cache.

    Threat model: none. An attacker confirms any guessed prompt another tenant
    sent while it is cached, one probe per page (and extends a confirmed
    prefix page by page).
    """

    name = "shared"


class Isolated(Sharing):
    """One partition per tenant: ``(namespace, tenant)`` is the root key (what
    :meth:`~radixkv.cache.PrefixCache.namespaces` lists, and what KV events hash as the cache
    salt); requests without a tenant share the namespace's plain partition.

    Threat model: a tenant observes only its own pages; nothing is shared,
    so no probe reveals another tenant's prompt, sybils included, and public
    prefixes (system prompts, popular documents) are computed and stored once
    per tenant. Only the pool's occupancy is shared (see the module doc).
    """

    name = "isolated"

    def partition(self, namespace: Optional[str], tenant: Optional[str]) -> Hashable:
        return namespace if tenant is None else (namespace, tenant)


class KAnonymous(Sharing):
    """A cached page is served to tenant X only if X requested it before (while it stayed
    cached), or at least ``k`` distinct other tenants did; else X is told a miss.

    The hit prefix ends at the first refused page. When the admission is
    released, every page of it records X among its requesters, so X's second
    request of a prefix is a hit whoever had cached it: X learns the same
    whether the prefix was someone else's or its own first request cached it.
    A match or an aborted admission records nothing (an uncached prefix would
    not have been cached by them either), and pages of an admission not yet
    released have no requester yet. Per page at
    most ``k`` tenants are kept; the ``k + 1``-th makes it public (a hit for all)
    and its set is dropped. Memory: O(cached pages * k) at most.

    Threat model: one attacker tenant learns nothing from hits about prefixes
    fewer than ``k`` other tenants requested: its own requests count once,
    its repeats only serve itself. A hit reveals that ``k`` others asked, so
    a sybil with ``s`` accounts learns that ``k - s + 1`` honest tenants did:
    with ``k`` accounts (the others' probes plus the one victim make ``k``) it
    confirms a single victim's prefix, so ``k`` must exceed the accounts an
    attacker can get.

    A refused page is invisible to the prober (see the module doc): no touch,
    load, split, lock, hook or event. One residual channel remains, on a full
    pool: the cache keeps one copy of a page, so after X asks for pages
    another tenant cached, the pool holds one copy fewer than had they not,
    and X's own pages are evicted later (a dedup side channel, the
    indistinguishability game's strict xfail in the tests): an attacker that
    can fill the pool confirms a guessed prompt with one probe. Policies with
    a history of evicted pages key it by namespace, which the tenants of one
    namespace share. Closing both means keeping a refused tenant's pages as
    its own copy, with its own history, until they are public; until then
    :class:`Isolated` is the rule for a pool that runs full.
    """

    name = "k-anonymous"
    filters = True

    def __init__(self, k: int = DEFAULT_K) -> None:
        self.k = check_int(k, "k", minimum=1)
        self._seen: Dict[int, Any] = {}  # block -> set of requesters (at most k), or _PUBLIC

    def fresh(self) -> "KAnonymous":
        return type(self)(k=self.k)

    def serve(self, tenant: Optional[str], blocks: np.ndarray) -> Tuple[int, List[int]]:
        seen, k = self._seen, self.k
        served = len(blocks)
        pending = []  # blocks whose record does not yet hold tenant and is not public
        missing = object()
        for i, block in enumerate(blocks.tolist()):
            who = seen.get(block, missing)
            if who is _PUBLIC:
                continue
            if who is missing or tenant not in who:
                pending.append(block)
                if served > i and (who is missing or len(who) < k):
                    served = i
        return served, pending

    def commit(self, tenant: Optional[str], decision: List[int], new_blocks: np.ndarray) -> None:
        # new pages may have requesters already: others were served them while the admission was open
        seen, k = self._seen, self.k
        for block in itertools.chain(decision, new_blocks.tolist()):
            who = seen.get(block)
            if who is None:
                seen[block] = {tenant}
            elif who is not _PUBLIC:
                who.add(tenant)
                if len(who) > k:
                    seen[block] = _PUBLIC

    def removed(self, blocks: np.ndarray) -> None:
        seen = self._seen
        if seen:
            for block in blocks.tolist():
                seen.pop(block, None)

    def cleared(self) -> None:
        self._seen.clear()

    def check(self, cached_blocks: np.ndarray) -> None:
        stale = set(self._seen) - set(cached_blocks.tolist())
        assert not stale, f"{self.name}: records of blocks no longer cached: {sorted(stale)[:8]}"
        for block, who in self._seen.items():
            assert who is _PUBLIC or 0 < len(who) <= self.k, (
                f"{self.name}: block {block} records {len(who)} tenants (at most k={self.k} before public)")

    def requesters(self, block: int) -> Optional[frozenset]:
        """The tenants recorded for cached ``block`` (``None`` once public; empty when none). O(k)."""
        who = self._seen.get(block, set())
        return None if who is _PUBLIC else frozenset(who)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k})"


class Adaptive(KAnonymous):
    """Shared until a tenant looks like it probes, then k-anonymous for that tenant (in the spirit
    of CacheSolidarity, 2026).

    A request is *suspect* when it matches a page k-anonymity would refuse: a
    first-time hit on a prefix that fewer than ``k`` other tenants asked for,
    which honest tenants seldom need (public prefixes become public after ``k``
    requesters) and a prober needs for every confirmation. A tenant's first
    ``budget`` suspect requests are served in full; from the next one on the
    tenant is isolated (k-anonymous) for good. Memory: the k-anonymous records
    plus one count per suspect tenant.

    Threat model: one attacker tenant confirms at most ``budget`` prefixes it
    could not have learned under k-anonymity (each suspect request confirms
    one probe's pages), then learns no more; a sybil with ``s`` accounts
    confirms ``s * budget`` (plus what k-anonymity gives ``s`` accounts). An
    honest tenant pays only after ``budget`` early hits on not-yet-public
    prefixes, and then only what k-anonymity costs.

    Memory: the strike counts of at most ``max_tenants`` tenants, the least
    recently suspect one forgotten first (O(1) per suspect request). A
    forgotten tenant starts again with a full budget, as a new account would:
    pushing one account out takes ``max_tenants`` other suspect accounts, whose
    budgets confirm more than the reset gives back.
    """

    name = "adaptive"

    def __init__(self, k: int = DEFAULT_K, budget: int = DEFAULT_BUDGET, max_tenants: int = DEFAULT_MAX_TENANTS) -> None:
        super().__init__(k)
        self.budget = check_int(budget, "budget", minimum=0)
        self.max_tenants = check_int(max_tenants, "max_tenants", minimum=1)
        # tenant -> suspect requests served in full; an LRU map so the memory has a bound
        self._strikes: LRUCache = LRUCache(maxsize=self.max_tenants)

    def fresh(self) -> "Adaptive":
        return type(self)(k=self.k, budget=self.budget, max_tenants=self.max_tenants)

    def serve(self, tenant: Optional[str], blocks: np.ndarray) -> Tuple[int, Tuple[List[int], bool]]:
        served, pending = super().serve(tenant, blocks)
        suspect = served < len(blocks)
        if suspect and self._strikes.get(tenant, 0) < self.budget:
            return len(blocks), (pending, True)
        return served, (pending, False)

    def served(self, tenant: Optional[str], decision: Tuple[List[int], bool]) -> None:
        # counted when served, not at release: admissions held open, or matches, spend it too
        if decision[1]:
            self._strikes[tenant] = self._strikes.get(tenant, 0) + 1

    def commit(self, tenant: Optional[str], decision: Tuple[List[int], bool], new_blocks: np.ndarray) -> None:
        super().commit(tenant, decision[0], new_blocks)

    def isolated_tenants(self) -> List[Optional[str]]:
        """Tenants that spent their budget (served k-anonymously from now on). O(suspect tenants)."""
        return [t for t, n in self._strikes.items() if n >= self.budget]

    def check(self, cached_blocks: np.ndarray) -> None:
        super().check(cached_blocks)
        assert len(self._strikes) <= self.max_tenants, (
            f"{self.name}: {len(self._strikes)} strike counts, over max_tenants={self.max_tenants}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k}, budget={self.budget}, max_tenants={self.max_tenants})"


_RULES: Dict[str, Type[Sharing]] = {cls.name: cls for cls in (Shared, Isolated, KAnonymous, Adaptive)}


def available() -> List[str]:
    """Names of the sharing rules."""
    return list(_RULES)


def create(sharing: Union[str, Sharing, None] = None, **options: object) -> Sharing:
    """A sharing rule from its name (``options``: ``k``, ``budget`` where the rule takes them) or
    an instance (returned as is; ``None`` is ``"shared"``). Raises ArgumentValueError naming the rules."""
    if isinstance(sharing, Sharing):
        if options:
            raise ArgumentValueError(f"options {sorted(options)} given with a sharing instance {sharing!r}")
        return sharing
    if sharing is None:
        sharing = "shared"
    cls = _RULES.get(sharing) if isinstance(sharing, str) else None
    if cls is None:
        if not isinstance(sharing, str):
            raise ArgumentTypeError(f"sharing must be a name or a Sharing, got {sharing!r}")
        raise ArgumentValueError(f"unknown sharing {sharing!r}; expected one of: {', '.join(_RULES)}")
    accepted = inspect.signature(cls).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ArgumentValueError(f"sharing {sharing!r} takes no option {unknown[0]!r}; accepted: {list(accepted)}")
    return cls(**options)

"""Sharing rules between tenants: which cached pages a tenant is served as a hit.

A prefix cache shared by tenants is a timing oracle: a hit is much faster than
a miss, so a tenant who sends a guessed prompt learns whether another tenant
sent it (PromptPeek, NDSS'25). A *tenant* is who sends a request (a user, an
API key); it is not a *namespace*, which stays a hard partition (a LoRA
adapter, a model variant) whatever the rule.

=============  ==============================================================
name           rule
=============  ==============================================================
shared         every cached page is a hit (no defence; the default)
isolated       one partition per tenant, as vLLM's ``cache_salt``
k-anonymous    a page is a hit for X if X's own copy is cached, or at least
               ``k`` distinct other tenants requested it and one of them holds
               it: X gets a copy
adaptive       as k-anonymous, but a tenant's first ``budget`` requests that
               k-anonymity would refuse a copy are served one all the same
=============  ==============================================================

Threat model, common to all: one attacker tenant that sends prompts of its
choice and observes, per request, how many tokens were served from the cache
and from which tier (exactly: TTFT). What none of them hides: that the pool is
shared (an attacker who fills HBM and times its own pages' eviction learns how
busy others are, isolated included).

**How k-anonymous and adaptive keep it** (:attr:`Sharing.copies`). Every tenant
keeps its pages in a partition of its own, as under ``isolated``: its own tree
root, so its own eviction order, policy history, lower-tier copies and event
hashes. Nothing is deduplicated between tenants, so what one tenant's requests
do to the cache (touches, splits, locks, loads, evictions, hooks, events) never
depends on what another's prompts contain. What is shared is compute: a request
whose own partition ends before its prompt does gets a *copy* of the following
pages from another tenant's partition, as a hit, when the rule allows it (for
k-anonymous: at least ``k`` distinct other tenants asked for every one of
them), the way a load from a lower tier would. The engine copies them into new
blocks of the tenant's own partition (:meth:`radixkv.cache.PrefixCache.admit`),
so later requests hit its own copy. Who asked for a page is kept per page
identity (its namespace-salted 64-bit prefix key) until ``horizon`` released
requests have passed without anyone asking for it: a record's life depends on the
asks of its own page only, so what is forgotten never depends on another tenant's
prompts (a bound by count would: a new page's record would push out another's),
and forgetting only refuses more.

Which entry points take a tenant: ``match``, ``admit`` and ``insert`` (and the
adapters' faces that call them). These are tenant-blind and must not face a
tenant (an operator's tools, or a router that sees every tenant's pages anyway):
``cached_pages``, ``cached_blocks``, ``settled_pages``, ``peek_match``,
``locate``/``prefix_pages``, ``pin``/``unpin`` (a pin loads pages back from
below and keeps them), ``TieredCache.peek``, the vLLM block view's lookups,
:class:`~radixkv.analysis.stats` miss reasons, and the KV events (every
tenant's partitions, each hashed with its own salt).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any, Dict, Hashable, List, Optional, Tuple, Type, Union

import numpy as np

from .errors import ArgumentTypeError, ArgumentValueError
from .keys import check_int, check_namespace

__all__ = ["Sharing", "Shared", "Isolated", "KAnonymous", "Adaptive", "create", "available", "check_tenant"]

DEFAULT_K = 3
"""``k`` of ``"k-anonymous"`` and ``"adaptive"`` when not given."""

DEFAULT_BUDGET = 2
"""Requests ``"adaptive"`` serves beyond k-anonymity before it isolates the tenant."""

DEFAULT_HORIZON = 1 << 14
"""Releases after which ``"k-anonymous"`` forgets who asked for a page nobody asked for since (and
``"adaptive"`` a strike count): records age out by time, never because others' records came in."""

_PUBLIC: Any = object()  # a page's askers once k + 1 distinct tenants asked for it: a copy for all


def check_tenant(tenant: object) -> None:
    """Raise unless ``tenant`` is ``None`` (no tenant) or a str that is valid Unicode text (as a namespace)."""
    if tenant is not None and type(tenant) is not str:
        raise ArgumentTypeError(f"tenant must be a str or None, got {tenant!r}")
    try:
        check_namespace(tenant)
    except ArgumentValueError as exc:
        raise ArgumentValueError(str(exc).replace("namespace", "tenant", 1)) from None


class Sharing:
    """The seam the engine consults: a partition key per request and, for rules that share by
    copy (:attr:`copies`), how far a request may be served copies of other tenants' pages.

    ``copies`` is False for rules that only partition (``shared``, ``isolated``): the engine
    then never calls :meth:`serve_copies` nor :meth:`asked` (the rule costs nothing on the hit path).
    """

    name = ""
    copies = False

    def partition(self, namespace: Optional[str], tenant: Optional[str]) -> Hashable:
        """The tree root key of a request of ``tenant`` in ``namespace`` (the namespace, by default). O(1)."""
        return namespace

    def bind(self) -> None:
        """Claim the rule for one cache (the engine calls this once). A rule that keeps records
        (:attr:`copies`) refuses a second cache (:class:`~radixkv.errors.ArgumentValueError`):
        one cache's askers must not open another's pages. :meth:`fresh` makes one for each. O(1)."""
        if self.copies:
            if getattr(self, "_bound", False):
                raise ArgumentValueError(f"the sharing rule {self!r} serves another cache already; give each cache "
                                         f"its own (rule.fresh())")
            self._bound = True

    def fresh(self) -> "Sharing":
        """A rule of the same kind and parameters with no records, bound to no cache. O(1)."""
        return type(self)()

    def serve_copies(self, tenant: Optional[str], keys: np.ndarray, start: int, held: int) -> Tuple[int, Any]:
        """``(end, decision)``: ``tenant``'s request, whose own partition holds its pages up to
        ``start``, may be served copies of pages ``start..end`` (``end <= held``: other tenants
        hold pages ``start..held``); ``keys`` are its pages' identities. Changes nothing: the
        engine hands ``decision`` to :meth:`served` once the copies are made. O(pages looked at)."""
        return start, None

    def served(self, tenant: Optional[str], decision: Any) -> None:
        """``tenant`` was served copies by ``decision`` (from :meth:`serve_copies`). O(1)."""

    def asked(self, tenant: Optional[str], keys: np.ndarray) -> None:
        """``tenant`` asked for the pages with identities ``keys`` (a released admission, an insert). O(len(keys))."""

    def check(self) -> None:
        """Assert the rule's own bounds. O(records)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Shared(Sharing):
    """Every cached page is served to every tenant: today's prefix cache.

    Threat model: none. An attacker confirms any guessed prompt another tenant
    sent while it is cached, one probe per page (and extends a confirmed
    prefix page by page).
    """

    name = "shared"


def _tenant_partition(namespace: Optional[str], tenant: Optional[str]) -> Hashable:
    """``(namespace, tenant)``, or the namespace itself for a request without a tenant."""
    return namespace if tenant is None else (namespace, tenant)


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
        return _tenant_partition(namespace, tenant)


class KAnonymous(Sharing):
    """Each tenant's pages are its own (as :class:`Isolated`); a page another tenant holds is
    copied to X, as a hit, only if at least ``k`` distinct other tenants asked for it.

    A tenant *asks* for every page of an admission it releases and of an
    :meth:`~radixkv.cache.PrefixCache.insert`; a match, or an aborted admission,
    asks for nothing. Per page identity at most ``k`` askers are kept; the
    ``k + 1``-th makes the page public (a copy for all). A record is forgotten
    ``horizon`` releases after the last ask of its page (which only refuses
    more). Memory: the pages asked for in the last ``horizon`` releases, each
    up to ``k`` tenant names and an int.

    Threat model: one attacker tenant learns nothing from hits about prefixes
    fewer than ``k`` other tenants requested: they are never copied to it, and
    nothing is shared between tenants' partitions, so its own pages' fate
    (evictions, the policy's history, lower tiers, events) cannot depend on
    them either: what it observes is what it would observe if they had not sent
    them (tests/core/test_indistinguishability.py plays that game on full
    pools). A hit copied to it reveals that ``k`` others asked, so a sybil with
    ``s`` accounts learns that ``k - s + 1`` honest tenants did: ``k`` must
    exceed the accounts an attacker can get. The price is memory: a public
    prefix is computed once but stored once per tenant that uses it, as under
    ``isolated``.
    """

    name = "k-anonymous"
    copies = True

    def __init__(self, k: int = DEFAULT_K, horizon: int = DEFAULT_HORIZON) -> None:
        self.k = check_int(k, "k", minimum=1)
        self.horizon = check_int(horizon, "horizon", minimum=1)
        self._now = 0  # releases asked so far: the records' clock
        # page key -> (tuple of askers (<= k) or _PUBLIC, the release that last asked), oldest ask first
        self._asked: "OrderedDict[int, Tuple[Any, int]]" = OrderedDict()

    def fresh(self) -> "KAnonymous":
        return type(self)(k=self.k, horizon=self.horizon)

    def _age(self, records: "OrderedDict[Any, Tuple[Any, int]]") -> None:
        """Forget the ``records`` (``key -> (value, release of its last renewal)``, oldest first) that
        nothing renewed in the last ``horizon`` releases. O(records forgotten)."""
        oldest = self._now - self.horizon
        while records:
            key, (_, last) = next(iter(records.items()))
            if last > oldest:
                break
            del records[key]

    def partition(self, namespace: Optional[str], tenant: Optional[str]) -> Hashable:
        return _tenant_partition(namespace, tenant)

    def _allowed(self, tenant: Optional[str], keys: np.ndarray, start: int, held: int) -> int:
        """The end of the run of pages from ``start`` (below ``held``) that ``k`` others asked for."""
        asked, k = self._asked, self.k
        end = start
        for key in keys[start:held].tolist():
            record = asked.get(key)  # (a read: recency is the asks', not the lookups')
            if record is None:
                break
            who = record[0]
            if who is not _PUBLIC and len(who) - (tenant in who) < k:
                break
            end += 1
        return end

    def serve_copies(self, tenant: Optional[str], keys: np.ndarray, start: int, held: int) -> Tuple[int, Any]:
        return self._allowed(tenant, keys, start, held), None

    def asked(self, tenant: Optional[str], keys: np.ndarray) -> None:
        # Every page of the request is asked for, public ones too: a record's life must depend on
        # the asks of its own page alone, not on which pages of another tenant's request were new.
        self._now += 1
        now, asked, k = self._now, self._asked, self.k
        for key in keys.tolist():
            record = asked.pop(key, None)
            if record is None:
                who = (tenant,)
            else:
                who = record[0]
                if who is not _PUBLIC and tenant not in who:
                    who = _PUBLIC if len(who) >= k else who + (tenant,)
            asked[key] = (who, now)
        self._age(asked)

    def check(self) -> None:
        last = self._now - self.horizon
        for key, (who, at) in self._asked.items():
            assert who is _PUBLIC or (0 < len(who) <= self.k and len(set(who)) == len(who)), (
                f"{self.name}: page {key} records {who!r} (at most k={self.k} distinct tenants before public)")
            assert last <= at <= self._now, f"{self.name}: page {key} asked at {at}, now {self._now}"
            last = at  # oldest ask first

    def askers(self, key: int) -> Optional[frozenset]:
        """The tenants recorded as asking for the page with identity ``key`` (``None`` once public;
        empty when none). O(k)."""
        who = self._asked.get(key, ((),))[0]
        return None if who is _PUBLIC else frozenset(who)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k}, horizon={self.horizon})"


class Adaptive(KAnonymous):
    """k-anonymous, except that a tenant's first ``budget`` *suspect* requests are served every
    copy another tenant holds (in the spirit of CacheSolidarity, 2026).

    A request is *suspect* when another tenant holds pages it asks for that
    k-anonymity would not copy to it: a first-time hit on a prefix that fewer
    than ``k`` other tenants asked for, which honest tenants seldom need
    (public prefixes become public after ``k`` askers) and a prober needs for
    every confirmation. Once a tenant spent its budget it is served as under
    k-anonymity until ``horizon`` releases pass with no suspect request of its
    own. Memory: the k-anonymous records plus a strike count per tenant that
    was suspect in the last ``horizon`` releases (O(1) per suspect request). A
    count ages out by time alone, never because other tenants were suspect:
    another tenant's traffic cannot hand a prober a fresh budget.

    Threat model: one attacker tenant confirms at most ``budget`` prefixes it
    could not have learned under k-anonymity (each suspect request confirms
    one probe's pages), then learns no more; a sybil with ``s`` accounts
    confirms ``s * budget`` (plus what k-anonymity gives ``s`` accounts). An
    honest tenant pays only after ``budget`` early hits on not-yet-public
    prefixes, and then only what k-anonymity costs.
    """

    name = "adaptive"

    def __init__(self, k: int = DEFAULT_K, budget: int = DEFAULT_BUDGET, horizon: int = DEFAULT_HORIZON) -> None:
        super().__init__(k, horizon)
        self.budget = check_int(budget, "budget", minimum=0)
        # tenant -> (suspect requests served in full, the release clock of its last one), oldest first
        self._strikes: "OrderedDict[Optional[str], Tuple[int, int]]" = OrderedDict()

    def fresh(self) -> "Adaptive":
        return type(self)(k=self.k, budget=self.budget, horizon=self.horizon)

    def _spent(self, tenant: Optional[str]) -> int:
        """``tenant``'s strikes, once the counts no suspect request renewed in ``horizon`` releases went."""
        self._age(self._strikes)
        return self._strikes.get(tenant, (0, 0))[0]

    def serve_copies(self, tenant: Optional[str], keys: np.ndarray, start: int, held: int) -> Tuple[int, Any]:
        end = self._allowed(tenant, keys, start, held)
        if end < held and self._spent(tenant) < self.budget:
            return held, True  # suspect, within its budget: served in full
        return end, False

    def served(self, tenant: Optional[str], decision: Any) -> None:
        # counted when served, not at release: admissions held open, or matches, spend it too
        if decision:
            count = self._strikes.pop(tenant, (0, 0))[0]
            self._strikes[tenant] = (count + 1, self._now)

    def isolated_tenants(self) -> List[Optional[str]]:
        """Tenants that spent their budget (served k-anonymously from now on). O(suspect tenants)."""
        self._spent(None)
        return [t for t, (n, _) in self._strikes.items() if n >= self.budget]

    def check(self) -> None:
        super().check()
        last = None
        for tenant, (count, at) in self._strikes.items():
            assert 0 < count and at <= self._now and (last is None or at >= last), (
                f"{self.name}: strikes of {tenant!r}: {count} at {at}")
            last = at

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k}, budget={self.budget}, horizon={self.horizon})"


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

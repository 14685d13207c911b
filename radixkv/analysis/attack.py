"""The prefix-cache timing attack, replayed: how many private pages an attacker tenant recovers.

A trace of requests with tenants (``radixkv gen multitenant``, or any token trace
with a ``tenant`` field) is replayed through a :class:`~radixkv.cache.PrefixCache`
under a sharing rule (:mod:`radixkv.tenancy`). The attacker tenant's requests are
probes: a probe served ``h`` cached pages tells it those pages were cached, and
for a page it had never sent itself, that another tenant sent it (a
*confirmation*). A probe that extends an earlier probe of the attacker by more
pages is sent only if that earlier probe was served in full (page-by-page
reconstruction); else it is skipped.

Ground truth comes from the trace itself: a page (a token prefix in a namespace)
is *private* when exactly one honest tenant sends it over the whole trace.
``private_pages`` counts the private pages among the attacker's probes (its
dictionary), ``recovered_private_pages`` those it confirmed. ``precision`` is the
share of confirmations that were true (an honest tenant had sent the page by
then); a cache that never returns wrong hits keeps it at 1.0, and it is ``None``
when nothing was confirmed. Cost: one pass to intern pages, one replay.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional, Union

from ..cache import PrefixCache
from ..errors import ArgumentValueError
from ..keys import check_positive_int
from ..page_keys import PageInterner
from ..tenancy import Sharing, create
from ..workload.generators import ATTACKER
from ..workload.traces import Request

__all__ = ["AttackResult", "attack"]


@dataclass(frozen=True, slots=True)
class AttackResult:
    """What one replay of a multi-tenant trace measured.

    Attributes:
        sharing: the sharing rule (its repr, e.g. ``KAnonymous(k=3)``'s name and k).
        k: its ``k``, or ``None`` for rules without one.
        probes: attacker requests sent; ``skipped_probes`` those not sent (extensions of a miss).
        private_pages: private pages (one honest tenant sent them) among the attacker's probes.
        recovered_private_pages: of those, the ones the attacker confirmed through a hit.
        confirmed_pages: pages the attacker confirmed (hit on a page it never sent itself).
        precision: true confirmations / ``confirmed_pages`` (``None`` when none).
        honest_requests, honest_hit_tokens, honest_prompt_tokens: the other tenants' requests,
            the tokens they were served from the cache, and their prompt tokens.
    """

    sharing: str
    k: Optional[int]
    probes: int
    skipped_probes: int
    private_pages: int
    recovered_private_pages: int
    confirmed_pages: int
    precision: Optional[float]
    honest_requests: int
    honest_hit_tokens: int
    honest_prompt_tokens: int

    def as_dict(self) -> dict:
        return asdict(self)


def attack(requests: Iterable[Request], *, sharing: Union[str, Sharing] = "shared", page_size: int = 16,
           num_blocks: Optional[int] = None, policy: str = "lru", attacker: str = ATTACKER,
           **options: object) -> AttackResult:
    """Replay ``requests`` under ``sharing`` (``options``: its ``k`` / ``budget``) and measure the
    attack of tenant ``attacker``.

    ``num_blocks`` defaults to every page of the trace plus the longest request,
    so nothing is evicted and the sharing rule alone decides the hits. Each
    request is admitted and released at once (a batch of one). Cost: O(total
    tokens) for the page ids plus the replay.

    Raises:
        ArgumentValueError: no request is the attacker's (a trace without tenants, or another
            attacker name): there would be nothing to measure, and "0 probes" would read as a
            defence that held. A bad ``page_size``, sharing name or option.
    """
    page_size = check_positive_int(page_size, "page_size")
    rule = create(sharing, **options).fresh()  # a rule instance given is left untouched, each run starts clean
    trace = list(requests)
    if not any(request.tenant == attacker for request in trace):
        tenants = sorted({r.tenant for r in trace if r.tenant is not None})
        seen = f"its tenants are {', '.join(map(repr, tenants[:5]))}" if tenants else "it has no tenant field"
        raise ArgumentValueError(f"no request of the attacker tenant {attacker!r} in the trace ({len(trace):,} "
                                 f"requests; {seen}): nothing to measure")
    interners: Dict[Optional[str], PageInterner] = {}
    pages: List[list] = []
    honest_senders: Dict[tuple, set] = {}  # page -> honest tenants that send it (two at most are kept)
    for request in trace:
        interner = interners.setdefault(request.namespace, PageInterner(page_size))
        ids = [(request.namespace, i) for i in interner.ids(request.tokens).tolist()]
        pages.append(ids)
        if request.tenant != attacker:
            for page in ids:
                senders = honest_senders.setdefault(page, set())
                if len(senders) < 2:
                    senders.add(request.tenant)
    private = {page for ids, request in zip(pages, trace) if request.tenant == attacker
               for page in ids if len(honest_senders.get(page, ())) == 1}
    if num_blocks is None:
        num_blocks = sum(len(set(ids)) for ids in pages) + max((len(ids) for ids in pages), default=0) + 1
    cache = PrefixCache(num_blocks, page_size, policy, sharing=rule)
    sent_by_honest: set = set()
    sent_by_attacker: set = set()
    missed: set = set()  # last pages of attacker probes not served in full
    confirmed: set = set()
    true = probes = skipped = honest = hit_tokens = prompt_tokens = 0
    for request, ids in zip(trace, pages):
        is_probe = request.tenant == attacker
        if is_probe and len(ids) >= 2 and ids[-2] in missed:
            skipped += 1
            continue
        with cache.admit(request.tokens, namespace=request.namespace, tenant=request.tenant) as admission:
            hit = admission.hit_tokens
        if not is_probe:
            honest += 1
            hit_tokens += hit
            prompt_tokens += len(request.tokens)
            sent_by_honest.update(ids)
            continue
        probes += 1
        for page in ids[: hit // page_size]:
            if page not in sent_by_attacker and page not in confirmed:
                confirmed.add(page)
                true += page in sent_by_honest
        if hit < len(ids) * page_size:
            missed.add(ids[-1])
        sent_by_attacker.update(ids)
    return AttackResult(
        sharing=rule.name, k=getattr(rule, "k", None), probes=probes, skipped_probes=skipped,
        private_pages=len(private), recovered_private_pages=len(confirmed & private),
        confirmed_pages=len(confirmed), precision=true / len(confirmed) if confirmed else None,
        honest_requests=honest, honest_hit_tokens=hit_tokens, honest_prompt_tokens=prompt_tokens)

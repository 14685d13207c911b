"""Trace replay: run requests through a :class:`PrefixCache` and count what it saved.

Each request is admitted (match, protect, allocate, insert) and released at
once, with the engine's logical clock ticking once per request. The exact
rule set is in the README ("Replay semantics").
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Optional

from .cache import PrefixCache
from .traces import Request


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Totals of one replay.

    Attributes:
        policy: eviction policy name.
        page_size: tokens per page.
        num_blocks: cache capacity in blocks.
        requests: requests replayed.
        prompt_tokens: all prompt tokens, partial last pages included.
        hit_tokens: prompt tokens served from the cache.
        token_hit_rate: ``hit_tokens / prompt_tokens``.
        request_hit_rate: share of requests with at least one page hit.
        evicted_blocks: blocks evicted during the replay.
        declined_blocks: new pages the policy declined to cache.
        wall_seconds: replay time, trace reading included.
    """

    policy: str
    page_size: int
    num_blocks: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    token_hit_rate: float
    request_hit_rate: float
    evicted_blocks: int
    declined_blocks: int
    wall_seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def replay(
    requests: Iterable[Request],
    cache: PrefixCache,
    *,
    on_request: Optional[Callable[[Request, int], None]] = None,
) -> ReplayResult:
    """Replay ``requests`` in order through ``cache``; return the totals.

    ``on_request(request, hit_tokens)`` is called after each request (progress
    bars, per-request records, invariant checks in tests).

    An offline policy (``cache.policy.offline``, e.g. Belady) first gets the
    whole sequence through ``policy.prepare(requests, page_size, first_clock)``;
    a one-shot iterator is materialized for it, a re-iterable (a list, a
    :class:`~radixkv.traces.TraceReader`) is read twice.
    """
    start = time.perf_counter()
    if cache.policy.offline:
        if iter(requests) is requests:
            requests = list(requests)
        cache.policy.prepare(requests, cache.page_size, cache.clock + 1)
    evicted0, declined0 = cache.evicted_blocks, cache.declined_blocks
    num_requests = prompt_tokens = hit_tokens = hit_requests = 0
    admit = cache.admit
    for request in requests:
        admission = admit(request.tokens, namespace=request.namespace)
        admission.release()
        hit = admission.hit_tokens
        num_requests += 1
        prompt_tokens += len(request.tokens)
        hit_tokens += hit
        hit_requests += hit > 0
        if on_request is not None:
            on_request(request, hit)
    return ReplayResult(
        policy=cache.policy.name,
        page_size=cache.page_size,
        num_blocks=cache.num_blocks,
        requests=num_requests,
        prompt_tokens=prompt_tokens,
        hit_tokens=hit_tokens,
        token_hit_rate=hit_tokens / prompt_tokens if prompt_tokens else 0.0,
        request_hit_rate=hit_requests / num_requests if num_requests else 0.0,
        evicted_blocks=cache.evicted_blocks - evicted0,
        declined_blocks=cache.declined_blocks - declined0,
        wall_seconds=time.perf_counter() - start,
    )

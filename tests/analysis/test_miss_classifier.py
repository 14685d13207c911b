"""The miss classifier against a plain reference: sets of token prefixes per namespace.

The classifier keys pages with 64-bit hashes, in batches read ahead of the replay,
files its history under (namespace, key) and finds pages of other namespaces through a
page index. The reference below does none of that: it remembers every page as the tuple
of its namespace and token prefix, and asks the cache itself (``cached_pages``, before
each request) how deep every other namespace holds the prompt.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import radixkv.page_keys as page_keys
import radixkv.analysis.replay as replay_module
from radixkv import PrefixCache
from radixkv.analysis.replay import replay
from radixkv.page_keys import PrefixKeys
from radixkv.analysis.stats import MISS_REASONS
from radixkv.tiers import HostTier, TieredCache
from radixkv.workload.traces import Request

from .test_replay_tools import DeclineOdd

SHARED = [None, "a", "b", "c"]


class Reference:
    """Why each miss missed, from the definitions in radixkv.analysis.stats, on plain sets."""

    def __init__(self, page_size: int) -> None:
        self.p = page_size
        self.ever: set = set()      # (namespace, prefix) ever cached
        self.declined: set = set()  # (namespace, prefix) ever declined

    def page(self, tokens: list, namespace, d: int) -> tuple:
        return namespace, tuple(tokens[: (d + 1) * self.p])

    def classify(self, tokens: list, namespace, hit_tokens: int, admitted: int, declined: int,
                 other_depth: int) -> dict:
        """``other_depth``: leading pages cached under another namespace before the request."""
        p = self.p
        n, h = len(tokens) // p, hit_tokens // p
        out = dict.fromkeys(MISS_REASONS, 0)
        out["partial_page"] = len(tokens) - n * p
        for d in range(h, n):
            page = self.page(tokens, namespace, d)
            if page in self.ever:
                out["evicted"] += p
            elif page in self.declined:
                out["declined"] += p
            elif d < other_depth:
                out["other_namespace"] += p
            else:
                out["first_sight"] += p
        self.ever |= {self.page(tokens, namespace, d) for d in range(min(h + admitted, n))}
        self.declined |= {self.page(tokens, namespace, d) for d in range(n - declined, n)}
        return out


def other_depth(cache, tokens: list, namespace, namespaces) -> int:
    """Most leading pages of ``tokens`` some other namespace caches now, asking the cache."""
    return max((cache.cached_pages(tokens, namespace=o) for o in namespaces if o != namespace), default=0)


@st.composite
def traces(draw):
    """Prompts that share prefixes, in shared and single-use namespaces."""
    base = draw(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=8), min_size=1, max_size=4))
    trace = []
    for i in range(draw(st.integers(1, 40))):
        start = draw(st.sampled_from(base + [t for t, _ in trace]))
        tokens = start[: draw(st.integers(0, len(start)))] + draw(st.lists(st.integers(0, 5), max_size=8))
        namespace = draw(st.sampled_from(SHARED + [f"once-{i}"]))
        trace.append((tokens, namespace))
    return trace


def request(tokens: list, namespace, as_list: bool) -> Request:
    # int64 tokens are not keyed ahead in a batch: the classifier keys them on their own
    return Request(np.asarray(tokens, dtype=np.int64 if as_list else np.uint32), namespace=namespace)


@given(trace=traces(), page_size=st.integers(1, 3), num_blocks=st.integers(1, 12),
       declines=st.booleans(), tiered=st.booleans(), warm=st.integers(0, 3), read_ahead=st.integers(1, 7),
       read_ahead_tokens=st.sampled_from([1, 9, 1 << 18]), unbatched=st.sets(st.integers(0, 39), max_size=6))
@settings(deadline=None)
def test_classifier_equals_the_reference(trace, page_size, num_blocks, declines, tiered, warm, read_ahead,
                                         read_ahead_tokens, unbatched):
    policy = DeclineOdd() if declines else "lru"
    cache = (TieredCache(num_blocks, page_size, tiers=[HostTier(4)], policy=policy) if tiered
             else PrefixCache(num_blocks, page_size, policy=policy))
    for tokens, namespace in trace[:warm]:  # pages cached before the replay: hits the history never saw
        cache.admit(tokens, namespace=namespace).release()
    requests = [request(t, ns, i in unbatched) for i, (t, ns) in enumerate(trace)]
    namespaces = {ns for _, ns in trace}
    depths = [other_depth(cache, trace[0][0], trace[0][1], namespaces)]

    def before_next(req, hit):  # the state after this request is the state before the next one
        cache.check()
        if len(depths) < len(trace):
            tokens, namespace = trace[len(depths)]
            depths.append(other_depth(cache, tokens, namespace, namespaces))

    records = []
    with mock.patch.object(replay_module, "READ_AHEAD", read_ahead), \
            mock.patch.object(replay_module, "READ_AHEAD_TOKENS", read_ahead_tokens):
        result = replay(requests, cache, on_request=before_next, on_record=records.append)
    reference = Reference(page_size)
    for i, ((tokens, namespace), record) in enumerate(zip(trace, records)):
        expected = reference.classify(tokens, namespace, record.hit_tokens, record.admitted_blocks,
                                      record.declined_blocks, depths[i])
        assert record.miss_tokens_by_reason == expected, (i, tokens, namespace)
    assert result.miss_tokens_by_reason == {r: sum(rec.miss_tokens_by_reason[r] for rec in records)
                                            for r in MISS_REASONS}
    assert result.hit_tokens + sum(result.miss_tokens_by_reason.values()) == result.prompt_tokens
    assert cache.page_index is None  # replay detached its index


def test_a_reader_error_surfaces_after_the_requests_read_before_it():
    """Reading ahead must not move an error: the requests before a bad one are replayed and
    recorded first, as when reading one at a time."""
    def requests():
        yield Request(np.arange(8, dtype=np.uint32))
        yield Request(np.arange(8, dtype=np.uint32), namespace="t")
        raise ValueError("bad line 3")

    seen = []
    with pytest.raises(ValueError, match="bad line 3"):
        replay(requests(), PrefixCache(16, 4), on_record=seen.append)
    assert [r.miss_tokens_by_reason["other_namespace"] for r in seen] == [0, 8]


@pytest.mark.parametrize("batch_tokens", [1, 30, 1 << 20])
def test_keys_of_a_batch_equal_keys_one_at_a_time(batch_tokens):
    keys = PrefixKeys(4)
    rng = np.random.default_rng(7)
    arrays = [rng.integers(0, 9, size=int(rng.integers(0, 40))).astype(np.uint32) for _ in range(50)]
    with mock.patch.object(page_keys, "BATCH_TOKENS", batch_tokens):
        flat, offsets = keys.many(arrays)
    assert len(flat) == offsets[-1] == sum(len(t) // 4 for t in arrays)
    for i, tokens in enumerate(arrays):
        assert flat[offsets[i] : offsets[i + 1]].tolist() == keys.keys(tokens, len(tokens) // 4).tolist()


def test_a_page_cached_before_the_replay_and_evicted_since_is_evicted():
    """A request that hit every page of a cache filled before the replay recorded nothing, so
    the page evicted later came back as first sight (or other namespace) instead of evicted."""
    cache = PrefixCache(num_blocks=1, page_size=1)
    cache.admit([0], namespace=None).release()  # before the replay
    records = []
    replay([Request(np.array([0], dtype=np.uint32)), Request(np.array([0], dtype=np.uint32), namespace="a"),
            Request(np.array([0], dtype=np.uint32))], cache, on_record=records.append)
    reasons = [{k: v for k, v in r.miss_tokens_by_reason.items() if v} for r in records]
    assert reasons == [{}, {"other_namespace": 1}, {"evicted": 1}]


def test_pages_another_tenant_cached_count_as_cached_for_the_tenant():
    """x asks for the victim's two pages and one more: all three are cached for x once released
    (in its own partition). Evicted by x's own next request, they miss as ``evicted`` the next
    time, not as ``first_sight``."""
    X = list(range(1, 9))
    requests = [Request(tokens=X, tenant="victim"), Request(tokens=X + [9, 9, 9, 9], tenant="x"),
                Request(tokens=list(range(20, 36)), tenant="x"), Request(tokens=X + [9, 9, 9, 9], tenant="x")]
    cache = PrefixCache(4, page_size=4, sharing="k-anonymous")
    result = replay(requests, cache)
    cache.check()
    assert result.hit_tokens == 0
    assert result.miss_tokens_by_reason["evicted"] == 12, result.miss_tokens_by_reason
    # x's first two pages were cached in the victim's partition then: another namespace's
    assert result.miss_tokens_by_reason["other_namespace"] == 8, result.miss_tokens_by_reason
    assert result.miss_tokens_by_reason["first_sight"] == 8 + 4 + 16, result.miss_tokens_by_reason

"""The one-pass LRU curve against the plain reference replay, capacity by capacity."""

from __future__ import annotations

import itertools
import json
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.analysis.curve import LruStackDistances, PageInterner, lru_curve, lru_curve_mooncake
from radixkv.errors import TraceFormatError
from radixkv.testing.reference import ReferenceLru, reference_lru_replay
from radixkv.workload.traces import expand_mooncake

from ..shared_traces import CONVERSATION as _CONVERSATION

CONVERSATION = str(_CONVERSATION)


@st.composite
def shared_prefix_traces(draw, max_requests=20):
    """``(page_size, requests)``: each request cuts an earlier one (or a seed) and extends it.

    A 3-token alphabet makes independent extensions collide too, and an
    extension of up to 12 pages makes requests longer than small capacities.
    """
    page_size = draw(st.integers(1, 4))
    bundle = [[]] + draw(st.lists(st.lists(st.integers(0, 2), max_size=6 * page_size), min_size=1, max_size=3))
    requests = []
    for _ in range(draw(st.integers(1, max_requests))):
        base = draw(st.sampled_from(bundle))
        cut = draw(st.integers(0, len(base)))
        tokens = base[:cut] + draw(st.lists(st.integers(0, 2), max_size=12 * page_size))
        bundle.append(tokens)
        requests.append(np.array(tokens, dtype=np.uint32))
    return page_size, requests


def _working_set_pages(requests, page_size):
    return sum(len(r) // page_size for r in requests)


@settings(max_examples=300, deadline=None)
@given(shared_prefix_traces())
def test_curve_equals_reference_at_every_capacity(trace):
    page_size, requests = trace
    capacities = list(range(_working_set_pages(requests, page_size) + 3))
    curve = lru_curve(requests, page_size, capacities)
    for capacity, hits in zip(capacities, curve.hit_tokens):
        ref = reference_lru_replay(requests, page_size, capacity)
        assert hits == ref.hit_tokens, f"capacity {capacity}"
        assert curve.hit_tokens_at(capacity) == ref.hit_tokens
        assert curve.prompt_tokens == ref.prompt_tokens
        assert curve.requests == ref.requests
    assert curve.max_hit_tokens == curve.hit_tokens[-1]


@settings(max_examples=150, deadline=None)
@given(shared_prefix_traces(), st.integers(0, 12))
def test_reference_cache_is_the_top_of_one_capacity_free_order(trace, capacity):
    """The stack property the curve rests on, checked on the reference's own state.

    Every page ever referenced (cached or not) keys ``(request index, -depth)``
    by its latest reference; after each request the reference caches exactly
    the top ``capacity`` of them, also when a request is longer than the cache.
    """
    page_size, requests = trace
    model = ReferenceLru(page_size, capacity)
    latest: dict[int, tuple[int, int]] = {}
    for t, tokens in enumerate(requests, 1):
        model.step(tokens)
        model.check()
        for depth, page in enumerate(model.page_ids(tokens)):  # interned already: same ids
            latest[page] = (t, -depth)
        top = sorted(latest, key=latest.__getitem__, reverse=True)[:capacity]
        assert set(model.cached_pages()) == set(top), f"after request {t}"


@settings(max_examples=100, deadline=None)
@given(shared_prefix_traces())
def test_stack_distances_check_after_every_request(trace):
    page_size, requests = trace
    stack, interner = LruStackDistances(page_size), PageInterner(page_size)
    for tokens in requests:
        stack.add(interner.ids(tokens), len(tokens))
        stack.check()


def test_request_longer_than_capacity_keeps_its_first_pages():
    long = np.arange(40, dtype=np.uint32)  # 10 pages of 4
    requests = [long, long, long[:8], np.arange(100, 104, dtype=np.uint32), long]
    for capacity in range(12):
        ref = reference_lru_replay(requests, 4, capacity)
        expected = [0, min(capacity, 10) * 4, min(capacity, 2) * 4, 0, min(capacity - 1, 10) * 4 if capacity else 0]
        assert list(ref.per_request_hits) == expected, f"capacity {capacity}"
        assert lru_curve(requests, 4, [capacity]).hit_tokens == [ref.hit_tokens]


def test_eviction_takes_deepest_of_equally_old_pages():
    # Two branches of 2 pages; at 3 blocks the third request evicts the deeper
    # page of the older branch only, so the first branch still hits 1 page.
    a = np.array([1, 2], dtype=np.uint32)
    b = np.array([3, 4], dtype=np.uint32)
    ref = reference_lru_replay([a, b, a], 1, 3)
    assert ref.per_request_hits == (0, 0, 1)
    assert ref.evicted_blocks == 2
    assert lru_curve([a, b, a], 1, [3]).hit_tokens == [1]


def test_partial_trailing_page_counts_in_prompt_but_is_never_cached():
    tokens = np.arange(10, dtype=np.uint32)  # 2 pages of 4, 2 tokens left over
    ref = reference_lru_replay([tokens, tokens], 4, 100)
    assert (ref.prompt_tokens, ref.hit_tokens) == (20, 8)
    curve = lru_curve([tokens, tokens], 4, [100])
    assert (curve.prompt_tokens, curve.hit_tokens) == (20, [8])


def test_hit_tokens_at_any_capacity_after_the_pass():
    requests = [np.arange(16, dtype=np.uint32), np.arange(12, dtype=np.uint32), np.arange(16, dtype=np.uint32)]
    curve = lru_curve(requests, 2, [])
    for capacity in range(12):
        assert curve.hit_tokens_at(capacity) == reference_lru_replay(requests, 2, capacity).hit_tokens
    assert curve.hit_tokens_at(10**9) == curve.max_hit_tokens == 12 + 16


@st.composite
def mooncake_records(draw):
    """Records with few hash ids (heavy sharing, ids at several positions) and any input length."""
    records = []
    for _ in range(draw(st.integers(1, 12))):
        hash_ids = draw(st.lists(st.integers(0, 5), max_size=6))
        input_length = draw(st.integers(0, 512 * len(hash_ids) + 700))
        records.append({"timestamp": 0, "input_length": input_length, "output_length": 1, "hash_ids": hash_ids})
    return records


def _write_jsonl(directory, records):
    path = os.path.join(directory, "trace.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


@settings(max_examples=60, deadline=None)
@given(mooncake_records(), st.sampled_from([64, 128, 256, 512, 96]))
def test_mooncake_direct_equals_token_expansion(records, page_size):
    # 96 does not divide 512, so it checks the expanding fallback.
    capacities = list(range(0, 60, 3))
    tokens = [expand_mooncake(r["hash_ids"], r["input_length"]) for r in records]
    expected = lru_curve(tokens, page_size, capacities)
    with tempfile.TemporaryDirectory() as directory:
        got = lru_curve_mooncake(_write_jsonl(directory, records), page_size, capacities)
    assert (got.hit_tokens, got.prompt_tokens, got.requests) == (expected.hit_tokens, expected.prompt_tokens, expected.requests)


def test_conversation_slice_curve_reference_and_direct_agree(tmp_path):
    with open(CONVERSATION, encoding="utf-8") as f:
        lines = list(itertools.islice(f, 300))
    records = [json.loads(line) for line in lines]
    tokens = [expand_mooncake(r["hash_ids"], r["input_length"]) for r in records]
    longest = max(len(t) for t in tokens) // 16
    capacities = [0, 1, 100, longest - 1, longest, 2000, 10_000, 40_000, 100_000, 10**6]

    curve = lru_curve(tokens, 16, capacities)
    for capacity, hits in zip(capacities, curve.hit_tokens):
        assert hits == reference_lru_replay(tokens, 16, capacity).hit_tokens, f"capacity {capacity}"
    assert 0 < curve.hit_tokens[5] < curve.hit_tokens[-1]  # the slice exercises both regimes

    path = tmp_path / "slice.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    for page_size in (16, 64, 512):
        direct = lru_curve_mooncake(str(path), page_size, capacities)
        expanded = curve if page_size == 16 else lru_curve(tokens, page_size, capacities)
        assert direct == expanded, f"page_size {page_size}"


def test_conversation_block_level_matches_published_figures():
    # The traces README: one page per hash id (the partial last block counts
    # as a block): 4.45% at 1,000 blocks, 13.61% at 5,859, 36.6% unlimited.
    with open(CONVERSATION, encoding="utf-8") as f:
        blocks = [np.array(json.loads(line)["hash_ids"], dtype=np.uint32) for line in f]
    curve = lru_curve(blocks, 1, [1000, 5859])
    assert curve.prompt_tokens == 288_500
    assert curve.hit_tokens == [12_847, 39_258]
    assert round(100 * curve.token_hit_rates[0], 2) == 4.45
    assert round(100 * curve.token_hit_rates[1], 2) == 13.61
    assert round(100 * curve.max_hit_tokens / curve.prompt_tokens, 1) == 36.6


@pytest.mark.parametrize(
    "call",
    [
        lambda: lru_curve([np.arange(4)], 1, [3, -1]),
        lambda: reference_lru_replay([np.arange(4)], 1, -1),
        lambda: lru_curve([np.arange(4)], 1, [2]).hit_tokens_at(-1),
    ],
)
def test_negative_capacity_is_rejected_by_value(call):
    with pytest.raises(ValueError, match="-1"):
        call()


@pytest.mark.parametrize(
    "call",
    [
        lambda: lru_curve([np.arange(4)], 0, [1]),
        lambda: reference_lru_replay([np.arange(4)], 0, 1),
        lambda: lru_curve_mooncake(CONVERSATION, 0, [1]),
    ],
)
def test_zero_page_size_is_rejected_by_value(call):
    with pytest.raises(ValueError, match="page_size.*got 0"):
        call()


def test_capacity_error_names_the_argument():
    with pytest.raises(ValueError, match=r"capacities\[1\] must be >= 0, got -5"):
        lru_curve([np.arange(4)], 1, [3, -5])


def test_stack_rejects_repeated_pages_and_records_nothing():
    stack = LruStackDistances(1)
    with pytest.raises(ValueError, match="distinct, got 1 repeats"):
        stack.add(np.array([3, 4, 3]), 3)
    assert (stack.requests, stack.prompt_tokens, stack.num_live) == (0, 0, 0)
    stack.check()


def test_malformed_mooncake_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"input_length": 4, "hash_ids": [1]}\n{"input_length": 4, "hash_ids": "x"}\n')
    with pytest.raises(TraceFormatError, match=r"bad.jsonl:2: hash_ids"):
        lru_curve_mooncake(str(path), 16, [1])
    path.write_text('{"input_length": 4, "hash_ids": [-3]}\n')
    with pytest.raises(ValueError, match="got -3"):
        lru_curve_mooncake(str(path), 16, [1])

"""Replay metrics, miss reasons, trace sources, capacity parsing and the one-pass curve against replays."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.costs import get_hardware, get_model, prefill_flops
from radixkv.errors import TraceFormatError
from radixkv.workload.generators import generate
from radixkv.policies import LRU
from radixkv.analysis.replay import replay
from radixkv.workload.sources import detect_format, open_trace
from radixkv.analysis.stats import MISS_REASONS, PageHistory, PrefixKeys
from radixkv.analysis.sweep import parse_capacities, parse_capacity, trace_curve
from radixkv.workload.traces import Request, TraceReader

from ..shared_traces import CONVERSATION, SYNTHETIC


def req(tokens, namespace=None, timestamp=None):
    return Request(np.asarray(tokens, dtype=np.uint32), timestamp, 0, namespace)


class DeclineOdd(LRU):
    """Admission control for tests: never caches a new page whose first token is odd (nor what follows)."""

    name = "decline-odd"

    def admit(self, node_parent, num_pages, now, pages):
        tokens = np.frombuffer(pages, dtype=np.uint32)
        odd = np.flatnonzero(tokens[:: len(tokens) // num_pages] % 2 == 1)
        return int(odd[0]) if len(odd) else num_pages


# ------------------------------------------------------------------ one-pass curve == replays


@pytest.mark.parametrize("trace", [CONVERSATION, SYNTHETIC], ids=["conversation", "synthetic"])
def test_curve_equals_replays_at_ten_capacities_on_mooncake_slices(trace):
    requests = list(TraceReader(str(trace), limit=200))
    steps = np.flatnonzero(np.diff(trace_curve(requests, 16, [0], mooncake=True).hits_below))
    # ten capacities spread over the ones where the curve moves, plus one past its end
    capacities = [int(c) for c in steps[np.linspace(0, len(steps) - 1, 9).astype(int)] + 1] + [int(steps[-1]) + 50]
    curve = trace_curve(requests, 16, capacities, mooncake=True)
    replays = [replay(requests, PrefixCache(c, 16), miss_reasons=False).hit_tokens for c in capacities]
    assert curve.hit_tokens == replays
    assert len(set(replays)) >= 8  # the capacities really span the curve
    assert curve.prompt_tokens == sum(len(r.tokens) for r in requests)


def test_curve_from_block_ids_equals_curve_from_token_pages():
    requests = list(TraceReader(str(SYNTHETIC), limit=60))
    caps = [10, 100, 1000, 5000, 20000]
    for page_size in (16, 32):
        by_blocks = trace_curve(requests, page_size, caps, mooncake=True)
        by_pages = trace_curve(requests, page_size, caps, mooncake=False)
        assert by_blocks.hit_tokens == by_pages.hit_tokens


def test_curve_rejects_namespaces():
    with pytest.raises(ValueError, match=r"requests\[1\] has namespace 'a'"):
        trace_curve([req([1, 2]), req([1, 2], "a")], 1, [1])


# ------------------------------------------------------------------ metrics


def test_result_keeps_old_keys_and_adds_metrics():
    requests = list(generate("mix", 3, 150))
    result = replay(requests, PrefixCache(2000, 16))
    d = result.as_dict()
    old = {"policy", "page_size", "num_blocks", "requests", "prompt_tokens", "hit_tokens", "token_hit_rate",
           "request_hit_rate", "evicted_blocks", "declined_blocks", "wall_seconds"}
    assert old <= set(d)
    model, hw = get_model("llama-3-8b"), get_hardware("h100")
    records = []
    result = replay(requests, PrefixCache(2000, 16), on_record=records.append)
    assert result.prefill_flops_saved == sum(prefill_flops(model, 0, r.hit_tokens) for r in records) > 0
    assert result.ttft_saving_seconds == pytest.approx(result.prefill_flops_saved / hw.flops)
    assert result.admitted_blocks == sum(r.admitted_blocks for r in records) > 0
    assert result.evicted_blocks == sum(r.evicted_blocks for r in records) > 0
    assert [r.index for r in records] == list(range(150))
    assert result.first_timestamp == requests[0].timestamp and result.last_timestamp == requests[-1].timestamp
    json.dumps(records[0].as_dict())  # a record is plain JSON
    other = replay(requests, PrefixCache(2000, 16), model="llama-3-70b", hardware="a100")
    assert other.hit_tokens == result.hit_tokens
    assert other.prefill_flops_saved > result.prefill_flops_saved
    assert (other.model, other.hardware) == ("llama-3-70b", "a100")


def test_miss_reasons_off_keeps_hits_and_leaves_reasons_empty():
    requests = list(generate("multi_turn", 1, 120))
    on = replay(requests, PrefixCache(500, 16))
    off = replay(requests, PrefixCache(500, 16), miss_reasons=False)
    assert (on.hit_tokens, on.evicted_blocks) == (off.hit_tokens, off.evicted_blocks)
    assert off.miss_tokens_by_reason == {}
    assert on.hit_tokens + sum(on.miss_tokens_by_reason.values()) == on.prompt_tokens


def test_timestamps_going_backwards_raise_before_admitting():
    cache = PrefixCache(10, 1)
    with pytest.raises(ValueError, match=r"requests\[1\]\.timestamp 1\.0 is before the previous 2\.0"):
        replay([req([1, 2], timestamp=2.0), req([3, 4], timestamp=1.0)], cache)
    assert cache.num_cached_blocks == 2  # the second request was not admitted
    replay([req([5], timestamp=None), req([6], timestamp=0.5), req([7], timestamp=0.5)], PrefixCache(10, 1))


# ------------------------------------------------------------------ miss reasons


def replay_records(requests, cache):
    records = []
    result = replay(requests, cache, on_record=records.append)
    return result, [r.miss_tokens_by_reason for r in records]


def test_each_miss_reason_on_a_hand_made_trace():
    a, b, c = [2, 2, 4, 4, 6], [8, 8, 10, 10], [12, 12, 14, 14]
    cache = PrefixCache(4, 2, policy=DeclineOdd())
    trace = [
        req(a),                    # 0: pages (2,2),(4,4) first sight; 1 token partial
        req(a),                    # 1: hit 4, partial 1
        req(b), req(c),            # 2, 3: first sight; a is evicted to make room
        req(a),                    # 4: a's pages were cached before: evicted
        req(a, namespace="t"),     # 5: cached under the shared namespace right now: other namespace
        req([8, 8, 3, 3, 1, 1]),   # 6: (8,8) evicted in 4; (3,3),(1,1) first sight, declined now
        req([8, 8, 3, 3, 1, 1]),   # 7: (8,8) hit; the same two pages were declined before: declined
    ]
    result, per_request = replay_records(trace, cache)
    reasons = [{k: v for k, v in m.items() if v} for m in per_request]
    assert reasons == [
        {"first_sight": 4, "partial_page": 1},
        {"partial_page": 1},
        {"first_sight": 4},
        {"first_sight": 4},
        {"evicted": 4, "partial_page": 1},
        {"other_namespace": 4, "partial_page": 1},
        {"evicted": 2, "first_sight": 4},
        {"declined": 4},
    ]
    assert result.hit_tokens + sum(result.miss_tokens_by_reason.values()) == result.prompt_tokens
    assert set(result.miss_tokens_by_reason) == set(MISS_REASONS)
    assert all(result.miss_tokens_by_reason[r] > 0 for r in MISS_REASONS)


def test_no_room_pages_stay_first_sight_until_cached():
    cache = PrefixCache(2, 1)
    _, reasons = replay_records([req([1, 2, 3, 4]), req([1, 2, 3, 4])], cache)
    assert reasons[0]["first_sight"] == 4
    # pages 1, 2 were cached (and are hits); 3, 4 never found room: still first sight, not evicted
    assert (reasons[1]["first_sight"], reasons[1]["evicted"]) == (2, 0)


def cached_prefixes(cache):
    """Every cached page as (namespace, token prefix tuple), read from the tree."""
    out = set()
    tree = cache._tree
    pb = tree.page_bytes

    def visit(node, ns, prefix):
        for child in (node.children or {}).values():
            toks = np.frombuffer(child.key[: child.num_pages * pb], dtype=np.uint32).tolist()
            for i in range(child.num_pages):
                out.add((ns, tuple(prefix + toks[: (i + 1) * tree.page_size])))
            visit(child, ns, prefix + toks)

    for ns, root in tree.roots():
        visit(root, ns, [])
    return out


@st.composite
def namespaced_traces(draw):
    base = draw(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=8), min_size=1, max_size=4))
    trace = []
    for _ in range(draw(st.integers(1, 30))):
        start = draw(st.sampled_from(base + [t for t, _ in trace]))
        tokens = start[: draw(st.integers(0, len(start)))] + draw(st.lists(st.integers(0, 5), max_size=8))
        trace.append((tokens, draw(st.sampled_from([None, None, "a", "b"]))))
    return trace


@given(trace=namespaced_traces(), page_size=st.integers(1, 3), num_blocks=st.integers(1, 12),
       declines=st.booleans())
@settings(max_examples=150, deadline=None)
def test_miss_reasons_equal_a_brute_force_model(trace, page_size, num_blocks, declines):
    cache = PrefixCache(num_blocks, page_size, policy=DeclineOdd() if declines else "lru")
    ever, declined, snapshots, admitted = set(), set(), [], []
    requests = [req(t, ns) for t, ns in trace]

    def before_next(request, hit):  # state after this request = state before the next one
        snapshots.append(cached_prefixes(cache))

    snapshots.append(set())
    records = []
    result = replay(requests, cache, on_request=before_next, on_record=records.append)
    for i, (request, record) in enumerate(zip(requests, records)):
        tokens, ns, p = request.tokens.tolist(), request.namespace, page_size
        n, h = len(tokens) // p, record.hit_tokens // p
        expected = dict.fromkeys(MISS_REASONS, 0)
        expected["partial_page"] = len(tokens) - n * p
        for d in range(h, n):
            key = (ns, tuple(tokens[: (d + 1) * p]))
            if key in ever:
                expected["evicted"] += p
            elif key in declined:
                expected["declined"] += p
            elif any((o, key[1]) in snapshots[i] for o in (None, "a", "b") if o != ns):
                expected["other_namespace"] += p
            else:
                expected["first_sight"] += p
        assert record.miss_tokens_by_reason == expected, (i, tokens, ns)
        ever |= {(ns, tuple(tokens[: (d + 1) * p])) for d in range(h + record.admitted_blocks)}
        declined |= {(ns, tuple(tokens[: (d + 1) * p])) for d in range(n - record.declined_blocks, n)}
        admitted.append(record.admitted_blocks)
    assert result.hit_tokens + sum(result.miss_tokens_by_reason.values()) == result.prompt_tokens
    for reason in MISS_REASONS:
        assert result.miss_tokens_by_reason[reason] == sum(r.miss_tokens_by_reason[reason] for r in records)


def test_prefix_keys_equal_exactly_for_equal_prefixes():
    keys = PrefixKeys(4)
    a = np.arange(40, dtype=np.uint32)
    b = a.copy()
    b[21] += 1  # page 5 differs
    ka, kb = keys.keys(a, 10), keys.keys(b, 10)
    assert (ka[:5] == kb[:5]).all() and not (ka[5:] == kb[5:]).any()
    assert not (keys.keys(a, 10, "t") == ka).any()  # namespaces never share a key
    zeros = keys.keys(np.zeros(12, dtype=np.uint32), 3)
    assert len(set(zeros.tolist())) == 3  # all-zero pages at different depths differ
    swapped = keys.keys(np.r_[a[4:8], a[:4]], 2)
    assert swapped[1] != ka[1]  # order matters


def test_page_history_walks_runs_across_divergence():
    keys = PrefixKeys(1)
    history = PageHistory()
    first = keys.keys(np.array([1, 2, 3, 4], dtype=np.uint32), 4)
    history.add_cached(first, 0, 4)
    branch = keys.keys(np.array([1, 2, 9, 9, 9], dtype=np.uint32), 5)
    assert history.ever_cached(branch) == 2
    history.add_cached(branch, 2, 4)
    assert history.ever_cached(keys.keys(np.array([1, 2, 9, 9, 7], dtype=np.uint32), 5)) == 4
    assert history.ever_cached(keys.keys(np.array([1, 2, 3, 4, 5], dtype=np.uint32), 5)) == 4
    assert history.num_cached == 6


# ------------------------------------------------------------------ sources and parsing


@pytest.mark.parametrize("text, value", [("1000", 1000), ("10k", 10_000), ("10K", 10_000), ("1.5M", 1_500_000),
                                         ("2g", 2_000_000_000), (" 7 ", 7), (".5k", 500)])
def test_parse_capacity(text, value):
    assert parse_capacity(text) == value


@pytest.mark.parametrize("text", ["0", "-5", "0k", "1.0001k", "abc", "1kb", "", "1e3"])
def test_parse_capacity_rejects_by_value(text):
    with pytest.raises(ValueError, match="capacity"):
        parse_capacity(text)


def test_parse_capacities_keeps_order():
    assert parse_capacities("10k,1k, 5") == [10_000, 1000, 5]
    with pytest.raises(ValueError, match="at least one"):
        parse_capacities(" , ")


def write(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_sharegpt_detected_and_replayed_in_timestamp_order(tmp_path):
    conversations = [{"conversations": [{"from": "human", "value": f"question {i}"},
                                        {"from": "gpt", "value": "an answer " * 20},
                                        {"from": "human", "value": "and a follow-up"}]} for i in range(5)]
    jsonl = write(tmp_path / "chats.jsonl", conversations)
    (tmp_path / "chats.json").write_text(json.dumps(conversations))
    assert detect_format(jsonl) == "sharegpt" and detect_format(str(tmp_path / "chats.json")) == "sharegpt"
    trace = open_trace(jsonl)
    requests = list(trace)
    assert len(requests) == 10 and list(trace)[3].tokens.tolist() == requests[3].tokens.tolist()  # re-iterable
    stamps = [r.timestamp for r in requests]
    assert stamps == sorted(stamps)
    result = replay(trace, PrefixCache(1000, 4))
    assert result.hit_tokens > 0  # follow-ups extend their conversation's first prompt
    assert len(list(open_trace(jsonl, limit=3))) == 3
    skipping = open_trace(jsonl, skip_bad=True)  # nothing malformed: nothing skipped
    assert len(list(skipping)) == 10 and skipping.skipped == 0


def test_formats_detected(tmp_path):
    assert detect_format(write(tmp_path / "t.jsonl", [{"tokens": [1]}])) == "tokens"
    assert detect_format(write(tmp_path / "m.jsonl", [{"hash_ids": [1], "input_length": 3}])) == "mooncake"
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(TraceFormatError, match="empty"):
        list(open_trace(str(tmp_path / "e.jsonl")))


def test_trace_size_hint_counts_lines(tmp_path):
    path = write(tmp_path / "t.jsonl", [{"tokens": [i]} for i in range(7)])
    assert open_trace(path).size_hint() == 7
    assert open_trace(path, limit=3).size_hint() == 3

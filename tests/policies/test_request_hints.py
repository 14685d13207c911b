"""Request metadata for policies: RequestHints, admit(..., hints=), replay passing a trace's fields."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.analysis.replay import replay
from radixkv.errors import ArgumentTypeError, ArgumentValueError
from radixkv.policies.base import RequestHints
from radixkv.policies.lru import LRU
from radixkv.workload.traces import Request, TraceReader
from radixkv.errors import TraceFormatError

from ..strategies import snapshot


class Recorder(LRU):
    """LRU that records what on_request was told."""

    name = "recorder"

    def __init__(self):
        self.seen = []

    def on_request(self, num_pages, hints, now):
        self.seen.append((num_pages, hints, now))


def test_admit_hands_length_and_hints_to_the_policy_before_the_match():
    policy = Recorder()
    cache = PrefixCache(num_blocks=8, page_size=2, policy=policy)
    hints = RequestHints(output_length=7, timestamp=1.5, chat_id=3, parent_chat_id=-1, turn=1, type="text")
    cache.admit([1, 2, 3, 4, 5], hints=hints).release()
    cache.admit([1, 2]).release()
    cache.match([1, 2])  # a match is no request
    assert policy.seen == [(2, hints, 1), (1, None, 2)]
    cache.check()


@pytest.mark.parametrize("bad", [{"output_length": 5}, "text", 3])
def test_admit_refuses_hints_of_another_type_and_leaves_the_cache_as_it_was(bad):
    policy = Recorder()
    cache = PrefixCache(num_blocks=8, page_size=2, policy=policy)
    cache.admit([1, 2, 3, 4]).release()
    before = snapshot(cache)
    with pytest.raises(ArgumentTypeError, match="hints"):
        cache.admit([1, 2, 9, 9], hints=bad)
    assert snapshot(cache) == before and len(policy.seen) == 1
    cache.check()


@pytest.mark.parametrize("field, value, exc", [
    ("output_length", -1, ArgumentValueError), ("output_length", 1.5, ArgumentTypeError),
    ("output_length", True, ArgumentTypeError), ("turn", 0, ArgumentValueError),
    ("chat_id", "7", ArgumentTypeError), ("timestamp", math.nan, ArgumentValueError),
    ("timestamp", "1", ArgumentTypeError), ("type", 3, ArgumentTypeError)])
def test_request_hints_name_the_bad_field(field, value, exc):
    with pytest.raises(exc, match=f"hints.{field}"):
        RequestHints(**{field: value})


def test_replay_passes_each_requests_fields(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 9, "hash_ids": [1, 2], "chat_id": 5,
             "parent_chat_id": -1, "turn": 1, "type": "text"},
            {"timestamp": 2000, "input_length": 1100, "output_length": 0, "hash_ids": [1, 2, 3]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    policy = Recorder()
    replay(TraceReader(str(path)), PrefixCache(num_blocks=64, page_size=256, policy=policy))
    assert policy.seen == [(2, RequestHints(9, 0.0, 5, -1, 1, "text"), 1),
                           (4, RequestHints(None, 2.0, None, None, None, None), 2)]


def test_replay_builds_no_hints_for_a_policy_that_does_not_ask():
    class Counting(Request):
        __slots__ = ()
        calls = []

        def hints(self):
            Counting.calls.append(1)
            return super().hints()

    requests = [Counting(np.arange(8, dtype=np.uint32))]
    replay(requests, PrefixCache(num_blocks=8, page_size=2, policy="lru"))
    assert Counting.calls == []
    replay(requests, PrefixCache(num_blocks=8, page_size=2, policy=Recorder()))
    assert Counting.calls == [1]


@pytest.mark.parametrize("field, value", [("turn", 0), ("turn", "2"), ("chat_id", 1.5), ("type", 5),
                                          ("parent_chat_id", None)])
def test_trace_session_fields_are_checked(tmp_path, field, value):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"tokens": [1, 2], field: value}) + "\n")
    with pytest.raises(TraceFormatError, match=field):
        list(TraceReader(str(path)))

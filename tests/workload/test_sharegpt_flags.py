"""--sessions and --request-rate on every command that reads ShareGPT: the interleaving that shapes the
hit rates (more conversations open at once, longer reuse distances) reaches the replay, the sweep
workers and the other readers, and is refused for a trace of token ids."""

from __future__ import annotations

import json
import random

import pytest

from radixkv import PrefixCache
from radixkv.analysis.replay import replay
from radixkv.workload.sharegpt import load_sharegpt

from ..analysis.test_tool_cli import fails, ok


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    rng = random.Random(1)
    words = "the cache keeps pages of prefixes so a later turn of the same chat hits its history".split()
    convs = [{"id": str(c), "conversations": [
        {"from": role, "value": " ".join(rng.choice(words) for _ in range(rng.randint(20, 200)))}
        for _ in range(rng.randint(2, 6)) for role in ("human", "gpt")]} for c in range(40)]
    path = tmp_path_factory.mktemp("chats") / "chat.json"
    path.write_text(json.dumps(convs))
    return path


def test_sessions_and_rate_reach_the_replay(chats):
    rates = {}
    for sessions in (1, 32):
        out = json.loads(ok("replay", chats, "--num-blocks", "300", "--policy", "s3fifo", "--sessions", sessions,
                            "--request-rate", "4", "--json", "--quiet"))
        expected = replay(load_sharegpt(chats, num_sessions=sessions, request_rate=4.0), PrefixCache(300, 16, "s3fifo"))
        assert out["hit_tokens"] == expected.hit_tokens
        assert out["last_timestamp"] == pytest.approx((out["requests"] - 1) / 4)
        rates[sessions] = out["token_hit_rate"]
    assert rates[1] > rates[32]  # interleaving more chats pushes each one's history out


def test_every_reader_takes_them(chats, tmp_path):
    rows = [json.loads(line) for line in ok("sweep", chats, "--policies", "lru,fifo", "--capacities", "100,300,1k",
                                            "--sessions", "2", "--jobs", "2", "--json", "--quiet").splitlines()]
    expected = replay(load_sharegpt(chats, num_sessions=2), PrefixCache(300, 16, "fifo")).hit_tokens
    assert [r["hit_tokens"] for r in rows if r["policy"] == "fifo"][1] == expected
    curve = json.loads(ok("curve", chats, "--capacities", "300", "--sessions", "2", "--json", "--quiet"))
    assert curve["hit_tokens"] == [r["hit_tokens"] for r in rows if r["policy"] == "lru"][1:2]
    assert json.loads(ok("analyze", chats, "--request-rate", "2", "--json"))["request_rate"] == pytest.approx(2.0)
    ok("convert", chats, "--to", "tokens", "--sessions", "3", "-o", tmp_path / "t.jsonl")
    ok("cluster", chats, "--num-blocks", "300", "--sessions", "3", "--quiet")


def test_they_are_refused_where_they_mean_nothing(chats, tmp_path):
    tokens = tmp_path / "t.jsonl"
    ok("gen", "rag", "--num-requests", "5", "-o", tokens)
    fails("replay", tokens, "--num-blocks", "10", "--sessions", "4", message="--sessions shape ShareGPT")
    fails("replay", chats, "--num-blocks", "10", "--request-rate", "0", message="--request-rate")
    fails("replay", chats, "--num-blocks", "10", "--sessions", "0", message="--sessions")

"""Tests of the workload sources: tokenizer, ShareGPT loader, synthetic generators."""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter, defaultdict

import numpy as np
import pytest

from radixkv.errors import TraceFormatError
from radixkv.workload.generators import GENERATORS, MIX_KINDS, generate, write_token_jsonl
from radixkv.workload.sharegpt import END_MARKER, ROLE_MARKERS, load_sharegpt
from radixkv.workload.tokenizer import DEFAULT_VOCAB_SIZE, Tokenizer, split_pieces, tokenize
from radixkv.workload.traces import TOKEN_DTYPE, Request

# ----------------------------------------------------------------- helpers


def _common_prefix_len(arrays: list[np.ndarray]) -> int:
    first = arrays[0]
    n = min(len(a) for a in arrays)
    for a in arrays[1:]:
        diff = np.flatnonzero(first[:n] != a[:n])
        if len(diff):
            n = int(diff[0])
    return n


def _digest(requests) -> str:
    h = hashlib.sha256()
    for r in requests:
        h.update(r.tokens.tobytes())
        h.update(repr((r.timestamp, r.output_length, r.namespace)).encode())
        if r.tenant is not None:  # only multitenant names tenants: the other digests stay
            h.update(r.tenant.encode())
    return h.hexdigest()[:16]


# --------------------------------------------------------------- tokenizer


def test_tokenizer_pinned_ids():
    # A change here changes every tokenized trace: update only on purpose.
    assert tokenize("Hello, world!").tolist() == [107580, 5126, 94552, 11839]
    assert tokenize("Hello, world!", vocab_size=1000).tolist() == [580, 126, 552, 839]


def test_tokenizer_is_blake2b_of_pieces():
    for piece in ["Hello", ",", "internat", "你"]:
        digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
        expected = int.from_bytes(digest, "little") % DEFAULT_VOCAB_SIZE
        assert tokenize(piece).tolist() == [expected]


def test_tokenizer_pieces():
    assert split_pieces("Don't  cache-me!") == ["Don", "'", "t", "cache", "-", "me", "!"]
    assert split_pieces("internationalization 你好") == ["internat", "ionaliza", "tion", "你", "好"]
    assert split_pieces("") == []
    assert tokenize("").dtype == TOKEN_DTYPE and len(tokenize("")) == 0


def test_tokenizer_shared_prefix_and_bounds():
    a = tokenize("You are a helpful assistant. Answer briefly.")
    b = tokenize("You are a helpful assistant. Answer at length, with sources.")
    assert a.dtype == TOKEN_DTYPE and a.ndim == 1
    assert np.array_equal(a[:6], b[:6])  # "You are a helpful assistant ."
    assert int(tokenize("x y z " * 50, vocab_size=7).max()) < 7
    assert np.array_equal(Tokenizer(1000)("Hello, world!"), tokenize("Hello, world!", 1000))


@pytest.mark.parametrize("vocab_size", [0, -1, 2**32 + 1])
def test_tokenizer_bad_vocab_size(vocab_size):
    with pytest.raises(ValueError, match=rf"vocab_size.*got {vocab_size!r}"):
        tokenize("a", vocab_size=vocab_size)
    with pytest.raises(ValueError, match="vocab_size"):
        Tokenizer(vocab_size)


def test_tokenizer_rejects_non_text():
    with pytest.raises(TypeError, match="text must be a str, got b'a'"):
        tokenize(b"a")
    with pytest.raises(TypeError, match="vocab_size"):
        tokenize("a", vocab_size=1.5)


# -------------------------------------------------------------- generators

KINDS = sorted(GENERATORS)


@pytest.mark.parametrize("kind", KINDS)
def test_generator_deterministic(kind):
    a = list(generate(kind, seed=7, num_requests=60))
    b = list(generate(kind, seed=7, num_requests=60))
    c = list(generate(kind, seed=8, num_requests=60))
    assert len(a) == len(b) == len(c) == 60
    for x, y in zip(a, b):
        assert np.array_equal(x.tokens, y.tokens)
        assert (x.timestamp, x.output_length, x.namespace) == (y.timestamp, y.output_length, y.namespace)
    assert _digest(a) != _digest(c)
    assert any(not np.array_equal(x.tokens, z.tokens) for x, z in zip(a, c))


# Exact outputs at seed 0, 40 requests: a tripwire for accidental changes to
# the generators (or to numpy's random streams). If a change is intended,
# the failure message prints the new digest.
GOLDEN = {
    "agent": "56ee9c865b5e139b",
    "long_doc_qa": "a4c183d964c128c3",
    "mix": "04755a6053f09ab2",
    "multi_turn": "0d79c4b5ee40d63a",
    "multitenant": "3f869d00aa8d447e",
    "rag": "8e6d559cf254ac2c",
    "scan": "8640bb4aa83fe57b",
    "system_prompt": "94bd817f24ae982a",
}


@pytest.mark.parametrize("kind", KINDS)
def test_generator_golden(kind):
    digest = _digest(generate(kind, seed=0, num_requests=40))
    assert digest == GOLDEN[kind], f"GOLDEN[{kind!r}] is now {digest!r}"


@pytest.mark.parametrize("kind", KINDS)
def test_generator_shape_and_time(kind):
    requests = list(generate(kind, seed=3, num_requests=300))
    assert len(requests) == 300
    times = [r.timestamp for r in requests]
    assert all(isinstance(t, float) for t in times)
    assert times[0] >= 0 and all(a <= b for a, b in zip(times, times[1:]))
    for r in requests:
        assert isinstance(r, Request)
        assert r.tokens.dtype == TOKEN_DTYPE and r.tokens.ndim == 1 and len(r.tokens) > 0
        assert int(r.tokens.max()) < DEFAULT_VOCAB_SIZE
        assert r.output_length >= 0 and r.namespace is None
    assert list(generate(kind, seed=3, num_requests=0)) == []


@pytest.mark.parametrize("kind", KINDS)
def test_generator_default_size_is_small(kind):
    total = sum(len(r.tokens) for r in generate(kind, seed=0, num_requests=1000))
    assert 100_000 < total < 3_000_000


def test_generator_vocab_size():
    for kind in KINDS:
        assert max(int(r.tokens.max()) for r in generate(kind, 0, 50, vocab_size=100)) < 100


def _check_sessions(requests: list[Request], num_concurrent: int) -> None:
    """Each session's step k prompt extends step k-1's prompt by more than its output."""
    system = _common_prefix_len([r.tokens for r in requests])
    sessions: dict[bytes, list[Request]] = defaultdict(list)
    keys = []
    for r in requests:
        key = r.tokens[system : system + 8].tobytes()  # the session's first message
        sessions[key].append(r)
        keys.append(key)
    followups = 0
    for steps in sessions.values():
        for prev, cur in zip(steps, steps[1:]):
            assert np.array_equal(cur.tokens[: len(prev.tokens)], prev.tokens)
            assert len(cur.tokens) > len(prev.tokens) + prev.output_length
            followups += 1
    assert followups > len(requests) // 2
    assert len(sessions) > num_concurrent  # finished sessions are replaced
    # Interleaved: consecutive requests mostly come from different sessions.
    assert sum(a == b for a, b in zip(keys, keys[1:])) < len(requests) // 4


def test_multi_turn_turns_extend_previous_prompt():
    requests = list(generate("multi_turn", seed=1, num_requests=400, num_sessions=16))
    _check_sessions(requests, num_concurrent=16)
    assert _common_prefix_len([r.tokens for r in requests]) >= 64  # shared system prompt


def test_agent_context_grows_each_step():
    requests = list(generate("agent", seed=1, num_requests=400, num_agents=8))
    _check_sessions(requests, num_concurrent=8)


def test_system_prompt_shares_few_prefixes():
    requests = list(generate("system_prompt", seed=2, num_requests=300, num_prompts=3))
    groups: dict[bytes, list[Request]] = defaultdict(list)
    for r in requests:
        groups[r.tokens[:16].tobytes()].append(r)
    assert len(groups) == 3
    sizes = sorted(len(g) for g in groups.values())
    assert sizes[-1] > sizes[0]  # Zipf: one prompt is clearly the most popular
    min_prefix = 256 + 4 * 64  # shortest system prompt + shortest 4 shots
    for group in groups.values():
        assert _common_prefix_len([r.tokens for r in group]) >= min_prefix
    # The question makes every prompt unique.
    assert len({r.tokens.tobytes() for r in requests}) == len(requests)


def test_rag_shares_system_prompt_and_orders_vary():
    # One-token system prompt, documents and question: prompt = [sys, d1, d2, d3, q].
    requests = list(
        generate(
            "rag", seed=4, num_requests=300, num_docs=6, docs_per_request=3,
            doc_tokens=1, system_tokens=1, question_tokens=1,
        )
    )
    assert all(len(r.tokens) == 5 for r in requests)
    assert len({int(r.tokens[0]) for r in requests}) == 1
    docs = [tuple(int(t) for t in r.tokens[1:4]) for r in requests]
    assert all(len(set(d)) == 3 for d in docs)  # distinct documents per request
    assert len({t for d in docs for t in d}) <= 6
    orders_of_set: dict[frozenset, set] = defaultdict(set)
    for d in docs:
        orders_of_set[frozenset(d)].add(d)
    assert any(len(orders) > 1 for orders in orders_of_set.values())
    first_doc = Counter(d[0] for d in docs)
    assert first_doc.most_common()[0][1] > 2 * first_doc.most_common()[-1][1]  # Zipf


def test_rag_default_requests_share_system_prompt():
    requests = list(generate("rag", seed=5, num_requests=100))
    assert _common_prefix_len([r.tokens for r in requests]) >= 64


def test_long_doc_qa_many_questions_per_doc():
    requests = list(generate("long_doc_qa", seed=6, num_requests=200, num_docs=3))
    groups = Counter(r.tokens[:16].tobytes() for r in requests)
    assert len(groups) == 3 and min(groups.values()) > 20
    for key in groups:
        group = [r.tokens for r in requests if r.tokens[:16].tobytes() == key]
        assert _common_prefix_len(group) >= 1000


def test_scan_shares_nothing():
    requests = list(generate("scan", seed=7, num_requests=1000))
    assert len({r.tokens[:16].tobytes() for r in requests}) == 1000


def test_mix_spans_and_mixes():
    requests = list(generate("mix", seed=8, num_requests=600, request_rate=6.0))
    assert len(requests) == 600
    assert requests[0].timestamp == 0.0 and requests[-1].timestamp == pytest.approx(100.0)
    only_scan = list(generate("mix", seed=8, num_requests=200, weights={"scan": 1.0}))
    assert len({r.tokens[:16].tobytes() for r in only_scan}) == 200
    tuned = list(generate("mix", 8, 50, weights={"rag": 1}, kind_params={"rag": {"docs_per_request": 1}}))
    assert len(tuned) == 50


BAD_PARAMS = [
    ("scan", {"num_requests": -1}, ValueError, "num_requests must be >= 0, got -1"),
    ("scan", {"seed": -3}, ValueError, "seed must be >= 0, got -3"),
    ("scan", {"num_requests": 1.5}, TypeError, "num_requests must be an int, got 1.5"),
    ("scan", {"seed": "1"}, TypeError, "seed must be an int, got '1'"),
    ("scan", {"prompt_tokens": 0}, ValueError, "prompt_tokens must be >= 1, got 0"),
    ("scan", {"request_rate": 0}, ValueError, "request_rate must be finite and > 0, got 0.0"),
    ("scan", {"request_rate": float("inf")}, ValueError, "request_rate"),
    ("scan", {"vocab_size": 0}, ValueError, "vocab_size must be >= 1, got 0"),
    ("rag", {"docs_per_request": 9, "num_docs": 5}, ValueError, r"docs_per_request must be <= num_docs \(5\), got 9"),
    ("rag", {"zipf_alpha": -1}, ValueError, "zipf_alpha must be finite and >= 0, got -1.0"),
    ("multi_turn", {"num_sessions": 0}, ValueError, "num_sessions must be >= 1, got 0"),
    ("multi_turn", {"mean_turns": 0.5}, ValueError, "mean_turns must be finite and >= 1, got 0.5"),
    ("multi_turn", {"think_time": -1}, ValueError, "think_time"),
    ("agent", {"max_steps": 0}, ValueError, "max_steps must be >= 1, got 0"),
    ("system_prompt", {"num_prompts": True}, TypeError, "num_prompts must be an int, got True"),
    ("long_doc_qa", {"num_docs": 0}, ValueError, "num_docs must be >= 1, got 0"),
    ("mix", {"weights": {"scan": 0}}, ValueError, "weights must give some kind a positive weight"),
    ("mix", {"weights": {"mix": 1}}, ValueError, "weights has unknown kind 'mix'"),
    ("mix", {"weights": {"scan": -1}}, ValueError, r"weights\['scan'\] must be finite and >= 0"),
    ("mix", {"kind_params": {"scan": {"prompt_tokens": 0}}}, ValueError, "prompt_tokens must be >= 1, got 0"),
]


@pytest.mark.parametrize("kind,params,error,message", BAD_PARAMS)
def test_bad_params_raise_on_call(kind, params, error, message):
    args = {"seed": 0, "num_requests": 10, **params}
    with pytest.raises(error, match=message):
        GENERATORS[kind](**args)  # raised at the call, before any iteration
    with pytest.raises(error, match=message):
        generate(kind, **args)


def test_generate_unknown_kind_and_param():
    with pytest.raises(ValueError, match="unknown workload kind 'chat'; expected one of: agent, long_doc_qa, mix"):
        generate("chat", 0, 10)
    with pytest.raises(ValueError, match="rag has no parameter 'num_documents'; accepted: num_docs"):
        generate("rag", 0, 10, num_documents=5)


def test_mix_covers_all_base_kinds():
    # multitenant is the attack workload (tenants and probes), not a serving pattern to mix
    assert set(MIX_KINDS) == set(GENERATORS) - {"mix", "multitenant"}


# ---------------------------------------------------------- token JSONL out


def test_write_token_jsonl_round_trip(tmp_path):
    requests = list(generate("multi_turn", seed=0, num_requests=20))
    extra = Request(np.array([1, 2, 3], dtype=TOKEN_DTYPE), None, 5, "t1")
    path = tmp_path / "out.jsonl"
    assert write_token_jsonl(requests + [extra], path) == 21
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 21
    for r, line in zip(requests, lines):
        assert line == {"tokens": r.tokens.tolist(), "timestamp": r.timestamp, "output_length": r.output_length}
    assert lines[-1] == {"tokens": [1, 2, 3], "output_length": 5, "namespace": "t1"}

    buffer = io.StringIO()
    assert write_token_jsonl(iter(requests), buffer) == 20
    assert buffer.getvalue() == "".join(path.read_text().splitlines(keepends=True)[:20])
    with pytest.raises(TypeError, match="path_or_file must be a path or a text file, got 5"):
        write_token_jsonl(requests, 5)


# ------------------------------------------------------------ ShareGPT


CONV_A = {
    "id": "a",
    "conversations": [
        {"from": "system", "value": "You are terse."},
        {"from": "human", "value": "What is a radix tree?"},
        {"from": "gpt", "value": "A compressed trie."},
        {"from": "human", "value": "And a KV cache?"},
        {"from": "gpt", "value": "Saved attention keys and values, reused across requests."},
        {"from": "human", "value": "Thanks!"},
    ],
}
CONV_B = {
    "id": "b",
    "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
}


def _turn(role: str, text: str) -> np.ndarray:
    return np.concatenate([tokenize(ROLE_MARKERS[role]), tokenize(text), tokenize(END_MARKER)])


def test_sharegpt_prompts_extend_each_other(tmp_path):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([CONV_A, CONV_B], indent=2))
    requests = list(load_sharegpt(path, num_sessions=2, request_rate=2.0))
    # Round-robin over the two open conversations: A1 B1 A2 B2 A3.
    assert [r.timestamp for r in requests] == [0.0, 0.5, 1.0, 1.5, 2.0]
    a1, b1, a2, b2, a3 = requests
    gen_prompt = tokenize(ROLE_MARKERS["assistant"])
    turns = CONV_A["conversations"]
    expected_a1 = np.concatenate([_turn("system", turns[0]["value"]), _turn("user", turns[1]["value"]), gen_prompt])
    assert np.array_equal(a1.tokens, expected_a1)
    assert a1.output_length == len(tokenize(turns[2]["value"]))
    expected_a2 = np.concatenate(
        [a1.tokens, tokenize(turns[2]["value"]), tokenize(END_MARKER), _turn("user", turns[3]["value"]), gen_prompt]
    )
    assert np.array_equal(a2.tokens, expected_a2)
    assert np.array_equal(a3.tokens[: len(a2.tokens)], a2.tokens)
    assert a3.output_length == 0  # no reply follows the last turn
    assert np.array_equal(b2.tokens[: len(b1.tokens)], b1.tokens)
    assert b1.output_length == len(tokenize("Hello! How can I help?"))
    assert all(r.tokens.dtype == TOKEN_DTYPE for r in requests)


def test_sharegpt_jsonl_matches_json(tmp_path):
    json_path = tmp_path / "chat.json"
    json_path.write_text(json.dumps([CONV_A, CONV_B]), encoding="utf-8-sig")  # with a BOM
    jsonl_path = tmp_path / "chat.jsonl"
    jsonl_path.write_text(json.dumps(CONV_A) + "\n\n" + json.dumps(CONV_B) + "\n")
    a = list(load_sharegpt(json_path, num_sessions=1))
    b = list(load_sharegpt(str(jsonl_path), num_sessions=1))
    assert len(a) == len(b) == 5
    for x, y in zip(a, b):
        assert np.array_equal(x.tokens, y.tokens) and x.timestamp == y.timestamp
    # One session open at a time: conversation order.
    assert [len(r.tokens) for r in a[:3]] == sorted(len(r.tokens) for r in a[:3])


def test_sharegpt_jsonl_streams(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(CONV_B) + "\n" + "{not json\n")
    requests = load_sharegpt(path, num_sessions=1)
    assert len(next(requests).tokens) > 0  # served before the bad line is read
    with pytest.raises(TraceFormatError, match="chat.jsonl:2: conversation 1: invalid JSON"):
        list(requests)


def test_sharegpt_custom_tokenizer(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(CONV_B) + "\n")
    requests = list(load_sharegpt(path, tokenizer=lambda text: [len(text)]))
    assert requests[0].tokens.tolist() == [len(ROLE_MARKERS["user"]), 2, len(END_MARKER), len(ROLE_MARKERS["assistant"])]
    with pytest.raises(ValueError, match="tokenizer returned ids outside"):
        list(load_sharegpt(path, tokenizer=lambda text: [-1]))


MALFORMED = [
    # (file name, content, line, message)
    ("bad.jsonl", '{"conversations": []}\n\n{"id": 3}\n', 3, r"conversation 1: missing field 'conversations' \(or 'messages'\)"),
    ("bad.jsonl", '{"conversations": [{"from": "human"}]}\n', 1, r"conversation 0: missing field 'conversations\[0\].value'"),
    ("bad.jsonl", '{"messages": [{"role": "user", "content": 5}]}\n', 1, r"'messages\[0\].content' must be a string, got 5"),
    ("bad.jsonl", '{"conversations": [{"from": "alien", "value": "x"}]}\n', 1, r"'conversations\[0\].from' must be one of"),
    ("bad.jsonl", '{"conversations": {"from": "human"}}\n', 1, "field 'conversations' must be a list"),
    ("bad.json", '[\n  {"conversations": []},\n  "oops"\n]\n', 3, "conversation 1: expected a JSON object, got 'oops'"),
    ("bad.json", '[\n  {"conversations": []},\n  {"conversations": [{"from": "gpt", "value": null}]}\n]', 3,
     r"conversation 1: field 'conversations\[0\].value' must be a string, got None"),
    ("bad.json", '[\n  {"conversations": []}\n  {"conversations": []}\n]', 3, "expected ',' or ']' after conversation 0"),
    ("bad.json", '[\n  {"conversations": [}\n]', 2, "conversation 0: invalid JSON"),
    ("bad.json", '[{"conversations": []}]\nextra', 2, "unexpected data after the closing"),
]


@pytest.mark.parametrize("name,content,line,message", MALFORMED)
def test_sharegpt_malformed(tmp_path, name, content, line, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TraceFormatError, match=message) as info:
        list(load_sharegpt(path))
    assert info.value.line == line
    assert info.value.path == str(path)
    assert str(info.value).startswith(f"{path}:{line}: ")


def test_sharegpt_bad_params(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("")
    assert list(load_sharegpt(path)) == []
    with pytest.raises(ValueError, match="num_sessions must be >= 1, got 0"):
        load_sharegpt(path, num_sessions=0)
    with pytest.raises(ValueError, match="request_rate must be finite and > 0, got -1"):
        load_sharegpt(path, request_rate=-1)
    with pytest.raises(TypeError, match="tokenizer must be callable, got 'gpt2'"):
        load_sharegpt(path, tokenizer="gpt2")
    with pytest.raises(FileNotFoundError):
        load_sharegpt(tmp_path / "missing.json")

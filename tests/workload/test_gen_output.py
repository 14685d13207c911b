"""``radixkv gen -o FILE`` and :func:`write_token_jsonl` replace FILE only once the whole trace is
written, and a generator parameter past its bound is a typed error at the call, before anything
is written (review issue 29, item 6: ``gen rag --param doc_tokens=99999999999999 -o FILE``
emptied FILE, then died with a traceback)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import radixkv.workload.generators as generators
from radixkv.cli import main
from radixkv.errors import ArgumentValueError
from radixkv.workload.generators import GENERATORS, generate, write_token_jsonl
from radixkv.workload.sharegpt import load_sharegpt

OLD = '{"tokens": [1, 2, 3]}\n'


def gen(*args):
    runner = CliRunner(mix_stderr=False) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else CliRunner()
    return runner.invoke(main, ["gen", *map(str, args)])


@pytest.fixture()
def old_file(tmp_path):
    """A trace FILE already there, alone in its directory."""
    path = tmp_path / "trace.jsonl"
    path.write_text(OLD)
    return path


def untouched(path):
    """FILE still holds the old trace, and nothing else (no temporary file) is left beside it."""
    assert path.read_text() == OLD
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


@pytest.mark.parametrize("kind, param", [("rag", "doc_tokens=99999999999999"),
                                         ("multitenant", "num_tenants=99999999999999")])
def test_gen_refuses_a_parameter_past_its_bound_and_keeps_the_file(old_file, kind, param):
    result = gen(kind, "--param", param, "-o", old_file)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"radixkv: error: {param.split('=')[0]} must be at most"), lines
    untouched(old_file)


def test_a_generation_that_fails_midway_leaves_the_file_untouched(old_file, monkeypatch):
    def breaks(seed, num_requests, **params):
        for i, request in enumerate(generators.scan(seed, num_requests)):
            if i == 3:
                raise ArgumentValueError("the generator broke at request 3")
            yield request

    monkeypatch.setitem(GENERATORS, "scan", breaks)
    result = gen("scan", "--num-requests", 10, "-o", old_file)
    assert result.exit_code == 2 and "the generator broke" in result.stderr
    untouched(old_file)


def test_write_token_jsonl_replaces_the_file_only_on_success(old_file):
    def requests():
        yield from generate("scan", 0, 3)
        raise KeyboardInterrupt  # even an interrupt leaves the old file

    with pytest.raises(KeyboardInterrupt):
        write_token_jsonl(requests(), old_file)
    untouched(old_file)
    assert write_token_jsonl(generate("scan", 0, 3), old_file) == 3
    assert [len(json.loads(line)["tokens"]) for line in old_file.read_text().splitlines()] == [
        len(r.tokens) for r in generate("scan", 0, 3)]
    assert sorted(p.name for p in old_file.parent.iterdir()) == [old_file.name]


BEYOND = [
    ("scan", 10, {"prompt_tokens": 2**24 + 1}, "prompt_tokens must be at most 2**24"),
    ("scan", 2**32 + 1, {}, "num_requests must be at most 2**32"),
    ("rag", 10, {"doc_tokens": 99999999999999}, "doc_tokens must be at most 2**24"),
    ("rag", 10, {"num_docs": 2**20 + 1}, "num_docs must be at most 2**20"),
    ("rag", 10, {"num_docs": 64, "docs_per_request": 64, "doc_tokens": 2**19}, "docs_per_request x doc_tokens"),
    ("rag", 10**6, {"num_docs": 2**20, "doc_tokens": 2**11}, "num_docs x doc_tokens"),
    ("long_doc_qa", 10, {"doc_tokens": 2**24 + 1}, "doc_tokens must be at most 2**24"),
    ("system_prompt", 10, {"num_prompts": 2**20, "num_shots": 2**10, "shot_tokens": 1}, "num_prompts x"),
    ("system_prompt", 10, {"num_shots": 2**20 + 1}, "num_shots must be at most 2**20"),
    ("multi_turn", 10**6, {"max_turns": 2**20}, "max_turns"),
    ("multi_turn", 10, {"num_sessions": 2**20, "message_tokens": 2**10}, "num_sessions x"),
    ("agent", 10, {"num_agents": 2**20 + 1}, "num_agents must be at most 2**20"),
    ("multitenant", 10, {"num_tenants": 99999999999999}, "num_tenants must be at most 2**16"),
    ("multitenant", 10, {"num_tenants": 2**16, "private_docs": 2**10}, "num_tenants x private_docs"),
    ("multitenant", 10, {"page_size": 2**16 + 1}, "page_size must be at most 2**16"),
    ("mix", 10, {"kind_params": {"rag": {"doc_tokens": 2**30}}}, "doc_tokens must be at most 2**24"),
]


@pytest.mark.parametrize("kind, num_requests, params, message", BEYOND)
def test_a_parameter_past_its_bound_raises_at_the_call(kind, num_requests, params, message):
    with pytest.raises(ArgumentValueError) as info:
        generate(kind, 0, num_requests, **params)  # at the call: nothing generated, nothing written
    assert message in str(info.value) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_the_defaults_pass_at_any_request_count(kind):
    generate(kind, 0, 2**32)  # checks only; the bounds leave every default workload alone
    generators.scan(0, 10, prompt_tokens=2**24)


def test_sharegpt_sessions_are_bounded(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text('{"conversations": [{"from": "human", "value": "hi"}]}\n')
    with pytest.raises(ArgumentValueError, match=r"num_sessions must be at most 2\*\*20"):
        load_sharegpt(path, num_sessions=2**20 + 1)
    assert len(list(load_sharegpt(path, num_sessions=2**20))) == 1

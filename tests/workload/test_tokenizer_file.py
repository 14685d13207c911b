"""``--tokenizer PATH`` / ``tokenizer=``: a local tokenizer.json read with the tokenizers library gives
ShareGPT prompts the ids that library gives; without the library, or with a bad file, one clear error."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from radixkv import api
from radixkv.cli import main
from radixkv.errors import ArgumentValueError, MissingExtraError
from radixkv.workload.hf_tokenizer import load_tokenizer
from radixkv.workload.sharegpt import END_MARKER, ROLE_MARKERS
from radixkv.workload.sources import open_trace

import tokenizers  # noqa: F401,E402  (installed by the test extra: these tests never skip)

TURNS = [
    [("human", "What is a radix tree?"), ("gpt", "A compressed trie keyed by token prefixes."),
     ("human", "And why do KV caches use one?")],
    [("human", "Summarise the paper on paged attention."), ("gpt", "Pages of KV blocks, like virtual memory.")],
]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    """A small BPE tokenizer.json trained here on the conversations' text (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [text for conv in TURNS for _, text in conv] + list(ROLE_MARKERS.values()) + [END_MARKER]
    tok.train_from_iterator(corpus * 20, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def sharegpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("sharegpt") / "chat.json"
    path.write_text(json.dumps([{"id": str(i), "conversations": [{"from": r, "value": v} for r, v in conv]}
                                for i, conv in enumerate(TURNS)]))
    return path


def reference_ids(tokenizer_file, text):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_file)).encode(text, add_special_tokens=False).ids


def expected_prompt(tokenizer_file, turns):
    """The ChatML-style prompt of the last user turn of ``turns``, piece by piece through tokenizers."""
    role = {"human": "user", "gpt": "assistant"}
    ids = []
    for r, text in turns:
        for piece in (ROLE_MARKERS[role[r]], text, END_MARKER):
            ids += reference_ids(tokenizer_file, piece)
    return ids + reference_ids(tokenizer_file, ROLE_MARKERS["assistant"])


def test_ids_equal_the_tokenizers_library(tokenizer_file):
    encode = load_tokenizer(tokenizer_file)
    for text in ["What is a radix tree?", "unseen wörds, ünïcode and 123", ""]:
        ids = encode(text)
        assert ids.dtype == np.uint32
        assert ids.tolist() == reference_ids(tokenizer_file, text)
    assert len(encode("What is a radix tree?")) > 0


def test_sharegpt_prompts_use_the_file(tokenizer_file, sharegpt):
    requests = list(open_trace(str(sharegpt), tokenizer=str(tokenizer_file)))
    # Round-robin over the two conversations: conv 0 turn 0, conv 1 turn 0, conv 0 turn 1.
    assert requests[0].tokens.tolist() == expected_prompt(tokenizer_file, TURNS[0][:1])
    assert requests[1].tokens.tolist() == expected_prompt(tokenizer_file, TURNS[1][:1])
    assert requests[2].tokens.tolist() == expected_prompt(tokenizer_file, TURNS[0])
    assert requests[0].output_length == len(reference_ids(tokenizer_file, TURNS[0][1][1]))
    builtin = list(open_trace(str(sharegpt)))
    assert [r.tokens.tolist() for r in builtin] != [r.tokens.tolist() for r in requests]


def test_api_and_cli_count_the_files_tokens(tokenizer_file, sharegpt):
    prompt_tokens = sum(len(r.tokens) for r in open_trace(str(sharegpt), tokenizer=str(tokenizer_file)))
    result = api.replay(str(sharegpt), num_blocks=64, page_size=4, tokenizer=str(tokenizer_file))
    assert result.prompt_tokens == prompt_tokens
    assert result.hit_tokens > 0  # turn 2 of conversation 0 extends turn 1's prompt
    [point] = api.curve(str(sharegpt), [64], page_size=4, tokenizer=str(tokenizer_file))
    assert (point.prompt_tokens, point.hit_tokens) == (prompt_tokens, result.hit_tokens)
    [row] = api.sweep(str(sharegpt), ["lru"], [64], page_size=4, tokenizer=str(tokenizer_file))
    assert row.hit_tokens == result.hit_tokens
    for command in (["replay", "--num-blocks", "64"], ["sweep", "--capacities", "64"]):
        out = CliRunner().invoke(main, [command[0], str(sharegpt), *command[1:], "--page-size", "4",
                                        "--tokenizer", str(tokenizer_file), "--format", "json", "--quiet"])
        assert out.exit_code == 0, out.output
        row = json.loads(out.output.strip().splitlines()[-1])
        assert (row["prompt_tokens"], row["hit_tokens"]) == (prompt_tokens, result.hit_tokens)


def one_line_error(args):
    runner = CliRunner(mix_stderr=False) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else CliRunner()
    out = runner.invoke(main, args)
    lines = out.stderr.strip().splitlines()
    assert out.exit_code == 2 and len(lines) == 1, (args, out.stderr)
    assert lines[0].startswith("radixkv: error: "), lines
    return lines[0]


def test_missing_library_names_the_extra(tokenizer_file, sharegpt, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` now raises ImportError
    with pytest.raises(MissingExtraError, match=r"radixkv\[tokenizers\]"):
        api.replay(str(sharegpt), num_blocks=64, tokenizer=str(tokenizer_file))
    with pytest.raises(ImportError):
        load_tokenizer(tokenizer_file)
    line = one_line_error(["replay", str(sharegpt), "--num-blocks", "64", "--tokenizer", str(tokenizer_file)])
    assert "--tokenizer" in line and "pip install 'radixkv[tokenizers]'" in line


def test_bad_file_is_one_line_naming_the_flag(tmp_path, sharegpt, tokenizer_file):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ArgumentValueError, match="tokenizer.json"):
        load_tokenizer(bad)
    for path in (bad, tmp_path / "missing.json"):
        line = one_line_error(["curve", str(sharegpt), "--capacities", "8", "--tokenizer", str(path)])
        assert "--tokenizer" in line and str(path) in line


def test_tokenizer_on_a_token_trace_is_refused(tmp_path, tokenizer_file):
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text('{"tokens": [1, 2, 3], "timestamp": 0}\n')
    with pytest.raises(ArgumentValueError, match="ShareGPT"):
        open_trace(str(tokens), tokenizer=str(tokenizer_file))
    line = one_line_error(["replay", str(tokens), "--num-blocks", "8", "--tokenizer", str(tokenizer_file)])
    assert "--tokenizer" in line and "tokens trace" in line

"""LRU replay: against the independent oracle, golden numbers, Mooncake slices and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.cli import main
from radixkv.workload.generators import generate
from radixkv.testing.reference import reference_lru_replay
from radixkv.analysis.replay import replay
from radixkv.workload.traces import Request, TraceReader

from ..shared_traces import CONVERSATION, SYNTHETIC


@st.composite
def shared_prefix_traces(draw):
    """Requests built by extending earlier requests, so prefixes are shared often."""
    base = draw(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=10), min_size=1, max_size=4))
    requests = []
    for _ in range(draw(st.integers(1, 25))):
        pool = base + requests
        start = draw(st.sampled_from(pool))
        cut = draw(st.integers(0, len(start)))
        extra = draw(st.lists(st.integers(0, 3), max_size=12))
        requests.append(start[:cut] + extra)
    return requests


@given(trace=shared_prefix_traces(), page_size=st.integers(1, 3), num_blocks=st.integers(1, 20))
@settings(max_examples=200)
def test_lru_replay_equals_the_oracle(trace, page_size, num_blocks):
    cache = PrefixCache(num_blocks=num_blocks, page_size=page_size)
    hits = []
    result = replay([Request(np.asarray(t, dtype=np.uint32)) for t in trace], cache,
                    on_request=lambda r, h: (hits.append(h), cache.check()))
    ref = reference_lru_replay([np.asarray(t, dtype=np.uint32) for t in trace], page_size, num_blocks)
    assert tuple(hits) == ref.per_request_hits
    assert result.hit_tokens == ref.hit_tokens
    assert result.evicted_blocks == ref.evicted_blocks
    assert result.prompt_tokens == ref.prompt_tokens


# Exact LRU hit tokens of generate("mix", seed=7, 400 requests) at page size 16. A change that
# moves these is a change of replay semantics: rerun `python -m tests.test_replay` to print new values.
GOLDEN_CAPACITIES = (50, 200, 1000, 5000)
GOLDEN_HITS = (14720, 41248, 133712, 237472)


def golden_hits():
    requests = list(generate("mix", 7, 400))
    return tuple(replay(requests, PrefixCache(cap, 16)).hit_tokens for cap in GOLDEN_CAPACITIES)


def test_golden_lru_hits():
    assert golden_hits() == GOLDEN_HITS


@pytest.mark.parametrize("trace", [CONVERSATION, SYNTHETIC], ids=["conversation", "synthetic"])
@pytest.mark.parametrize("num_blocks", [2000, 31250])
def test_mooncake_slice_matches_the_oracle(trace, num_blocks):
    requests = list(TraceReader(str(trace), limit=250))
    result = replay(requests, PrefixCache(num_blocks, 16))
    ref = reference_lru_replay([r.tokens for r in requests], 16, num_blocks)
    assert (result.hit_tokens, result.evicted_blocks) == (ref.hit_tokens, ref.evicted_blocks)
    assert result.hit_tokens > 0


def test_reference_figure_of_the_trace_readme():
    """Block-level LRU at page 512, 1,000 blocks: 4.45% block hit rate (shared/traces/README.md)."""
    hit_blocks = total_blocks = 0
    cache = PrefixCache(1000, 1)
    with CONVERSATION.open() as f:
        lines = list(f)
    for line in lines:
        ids = json.loads(line)["hash_ids"]
        admission = cache.admit(ids)   # one token per 512-token block: a block-level replay
        admission.release()
        hit_blocks += admission.hit_tokens
        total_blocks += len(ids)
    assert round(100 * hit_blocks / total_blocks, 2) == 4.45


def run_cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_cli_replay_json(tmp_path):
    out = run_cli("replay", str(CONVERSATION), "--num-blocks", "5000", "--limit", "200", "--json", "--quiet")
    assert out.exit_code == 0, out.output
    result = json.loads(out.output.strip().splitlines()[-1])
    requests = list(TraceReader(str(CONVERSATION), limit=200))
    ref = reference_lru_replay([r.tokens for r in requests], 16, 5000)
    assert result["requests"] == 200
    assert result["hit_tokens"] == ref.hit_tokens
    assert result["prompt_tokens"] == ref.prompt_tokens
    assert result["token_hit_rate"] == pytest.approx(ref.hit_tokens / ref.prompt_tokens)
    for key in ("evicted_blocks", "wall_seconds"):
        assert key in result


def test_cli_replay_table():
    out = run_cli("replay", str(SYNTHETIC), "--num-blocks", "1000", "--limit", "20")
    assert out.exit_code == 0
    assert "token_hit_rate" in out.output.splitlines()[0]


@pytest.mark.parametrize("content, message", [
    ('{"tokens": [1, 2]}\n{"tokens": [1, "x"]}\n', ":2: field 'tokens' must hold ints"),
    ('{"tokens": [1, 2]}\nnot json\n', ":2: invalid JSON"),
    ('{"hash_ids": [1, 2], "timestamp": 5}\n', ":1: missing field 'input_length'"),
    ('{"hash_ids": [1], "input_length": 9999}\n', ":1: field 'input_length' 9999 does not fit"),
    ('{"tokens": [1], "timestamp": 5}\n{"tokens": [2], "timestamp": 4}\n', ":2: field 'timestamp' goes backwards"),
    ('[1, 2]\n', ":1: expected a JSON object"),
    ('', ":0: trace is empty"),
])
def test_cli_malformed_trace_exits_2_naming_file_and_line(tmp_path, content, message):
    path = tmp_path / "trace.jsonl"
    path.write_text(content)
    out = CliRunner().invoke(main, ["replay", str(path), "--num-blocks", "10", "--quiet"])
    assert out.exit_code == 2
    assert f"{path}{message}" in out.output
    assert "Traceback" not in out.output


def test_cli_skip_bad_counts_lines(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"tokens": [1, 2]}\nnot json\n{"tokens": [1, 2, 3]}\n')
    out = run_cli("replay", str(path), "--num-blocks", "10", "--page-size", "1", "--skip-bad", "--json")
    result = json.loads(out.output.strip().splitlines()[-1])
    assert result["requests"] == 2 and result["skipped_lines"] == 1 and result["hit_tokens"] == 2


@pytest.mark.parametrize("args", [["--num-blocks", "0"], ["--num-blocks", "-4"],
                                  ["--num-blocks", "10", "--policy", "nope"],
                                  ["--num-blocks", "10", "--page-size", "0"]])
def test_cli_bad_options_exit_2(args):
    out = CliRunner().invoke(main, ["replay", str(SYNTHETIC)] + args)
    assert out.exit_code == 2


def test_cli_missing_file_exits_2(tmp_path):
    out = CliRunner().invoke(main, ["replay", str(tmp_path / "missing.jsonl"), "--num-blocks", "10"])
    assert out.exit_code == 2 and "missing.jsonl" in out.output


if __name__ == "__main__":
    print("GOLDEN_HITS =", golden_hits())

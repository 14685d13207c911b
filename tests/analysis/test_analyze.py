"""radixkv analyze: lengths, reuse distances, page popularity and its Zipf fit, shared prefixes and
request rate, checked on traces whose answers are known, and against the one-pass curve."""

from __future__ import annotations

import json

import numpy as np
import pytest

from radixkv.analysis.profile import profile, zipf_fit
from radixkv.analysis.sweep import trace_curve
from radixkv.workload.sources import open_trace
from radixkv.workload.traces import Request

from ..shared_traces import conversation_head
from .test_tool_cli import WIDTH, fails, ok


def test_a_repeated_prompt_has_the_stack_distances_of_its_pages():
    tokens = np.arange(64, dtype=np.uint32)  # 4 pages of 16
    p = profile([Request(tokens, 0.0, 5), Request(tokens, 2.0, 7), Request(np.arange(100, 120, dtype=np.uint32), 4.0)],
                16)
    assert (p.distinct_pages, p.page_references, p.first_references) == (5, 9, 5)
    assert p.reuse_distance == [[0, 1, 1], [1, 3, 2], [3, 7, 1]]  # distances 0, 1, 2, 3: shallowest most recent
    assert p.shared_prefix["max"] == 64 and p.requests_sharing == pytest.approx(1 / 3)
    assert p.prompt_length["max"] == 64 and p.output_length["p50"] == 5
    assert p.duration_seconds == 4.0 and p.request_rate == pytest.approx(0.5)


def test_zipf_fit_recovers_the_exponent():
    counts = np.round(1e7 * np.arange(1, 20_001) ** -1.2).astype(np.int64)
    fit = zipf_fit(counts[counts > 0])
    assert fit["alpha"] == pytest.approx(1.2, abs=0.02) and fit["r2"] > 0.99


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conversation_head(tmp_path_factory.mktemp("traces"), 400)


def test_analyze_agrees_with_the_curve_and_fits_the_terminal(conv, tmp_path):
    out = json.loads(ok("analyze", conv, "--json"))
    curve = trace_curve(open_trace(conv), 16, [1], mooncake=True)
    assert out["requests"] == 400 and out["prompt_tokens"] == curve.prompt_tokens
    assert out["shared_prefix"]["mean"] * 400 == pytest.approx(curve.max_hit_tokens)  # a cache that never evicts
    reused = sum(n for _, _, n in out["reuse_distance"])
    assert reused + out["first_references"] == out["page_references"]
    assert out["distinct_pages"] == out["first_references"]
    table = ok("analyze", conv, "--plot", tmp_path / "a" / "p.svg")
    assert max(map(len, table.splitlines())) <= WIDTH and "Zipf alpha" in table
    assert (tmp_path / "a" / "p.svg").read_text().count("<svg") == 1
    fails("analyze", tmp_path / "nope.jsonl", message="TRACE ")

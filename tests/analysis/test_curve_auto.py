"""``radixkv curve`` without --capacities: a dense log-spaced grid up to the trace's distinct pages, equal
to replays, and ``radixkv plot`` draws it as a line in tokens (GiB on top) with the no-eviction ceiling."""

from __future__ import annotations

import json

import numpy as np
import pytest

from radixkv import api
from radixkv.analysis.curve import AUTO_POINTS, log_grid
from radixkv.analysis.replay import replay
from radixkv.cache import PrefixCache
from radixkv.workload.generators import generate, write_token_jsonl
from radixkv.workload.traces import TraceReader

from .test_cluster_cli import ok


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("auto") / "mix.jsonl"
    write_token_jsonl(generate("mix", 3, 150), str(path))
    return path


@pytest.mark.parametrize("top", [0, 1, 2, 7, 49, 50, 51, 1000, 123_457, 10**9])
def test_log_grid_spans_one_to_top_log_spaced(top):
    grid = log_grid(top)
    assert grid[0] == 1 and grid[-1] == max(top, 1)
    assert all(a < b for a, b in zip(grid, grid[1:]))
    assert len(grid) == min(AUTO_POINTS, max(top, 1))
    if top >= 10**5:  # past the dense low end, even ratios
        ratios = np.diff(np.log(grid[10:]))
        assert ratios.max() < 1.2 * np.log(top) / (AUTO_POINTS - 1)
    if top <= AUTO_POINTS:
        assert grid == list(range(1, max(top, 1) + 1))


def test_cli_default_grid_ends_at_distinct_pages_and_equals_replays(trace):
    curve = json.loads(ok("curve", trace, "--json", "--quiet").splitlines()[-1])
    assert curve == json.loads(ok("curve", trace, "--capacities", "auto", "--json", "--quiet").splitlines()[-1])
    caps = curve["capacities"]
    distinct = api.distinct_pages(str(trace))
    assert caps == log_grid(distinct) and len(caps) == AUTO_POINTS
    requests = list(TraceReader(str(trace)))
    for i in (0, len(caps) // 3, 2 * len(caps) // 3, len(caps) - 1):
        assert curve["hit_tokens"][i] == replay(requests, PrefixCache(caps[i], 16), miss_reasons=False).hit_tokens
    assert curve["hit_tokens"][-1] / curve["prompt_tokens"] == pytest.approx(curve["no_eviction_hit_rate"])
    assert curve["model"] == "llama-3-8b"
    points = api.curve(str(trace))
    assert [p.num_blocks for p in points] == caps and [p.hit_tokens for p in points] == curve["hit_tokens"]
    table = ok("curve", trace, "--quiet")
    assert len(table.splitlines()) == len(caps) + 3  # summary line, header, rule, one row per capacity
    assert max(map(len, table.splitlines()[1:])) <= 100


def test_plot_draws_the_dense_curve_as_a_line_in_tokens(trace, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from radixkv.analysis.plot import POLICY_STYLES

    out = tmp_path / "curve.json"
    out.write_text(ok("curve", trace, "--json", "--quiet").splitlines()[-1] + "\n")
    curve = json.loads(out.read_text())
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    ok("plot", out, "-o", tmp_path / "curve.png")
    ax = figures[0].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    lru = lines["lru (curve)"]
    assert list(lru.get_xdata()) == [c * 16 for c in curve["capacities"]]  # tokens, every grid point
    assert lru.get_marker() == "None" and lru.get_color() == POLICY_STYLES["lru"][0]  # LRU's colour, a line
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "capacity (tokens)"
    assert lines["no eviction"].get_ydata()[0] == pytest.approx(curve["no_eviction_hit_rate"])
    assert any("GiB" in child.get_xlabel() for child in ax.child_axes)  # the model's KV on the top axis


def test_a_policy_keeps_its_style_beside_a_curve_and_in_any_company(tmp_path, monkeypatch):
    """A policy's colour, marker and dash are its own: the same next to a curve, alone, or among others."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from radixkv.analysis.plot import plot_results

    def drawn(policies, curve):
        rows = [{"policy": p, "num_blocks": c, "page_size": 16, "token_hit_rate": r + d}
                for p, d in policies for c, r in ((100, 0.2), (1000, 0.5))]
        if curve:
            rows += [{"policy": "lru (curve)", "num_blocks": c, "page_size": 16, "token_hit_rate": c / 2000}
                     for c in range(1, 1001, 40)]
        figures = []
        monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
        plot_results(rows, str(tmp_path / "p.png"))
        return {line.get_label(): (line.get_color(), line.get_marker(), str(line.get_linestyle()))
                for ax in figures[0].axes for line in ax.get_lines()}

    crowded = drawn([("lru", 0.0), ("s3fifo", 0.1), ("fifo", 0.05), ("arc", 0.07)], curve=True)
    alone = drawn([("s3fifo", 0.1)], curve=False)
    pair = drawn([("arc", 0.0), ("lru", 0.1)], curve=False)
    assert crowded["s3fifo"] == alone["s3fifo"] and crowded["arc"] == pair["arc"] and crowded["lru"] == pair["lru"]
    assert len({crowded[name] for name in ("lru", "s3fifo", "fifo", "arc")}) == 4

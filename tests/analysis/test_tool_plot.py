"""radixkv plot: a figure a reader can use (styles per policy, ceilings, tokens on x, y from 0, a title)."""

from __future__ import annotations

import pytest

matplotlib = pytest.importorskip("matplotlib")

from matplotlib.figure import Figure  # noqa: E402

from radixkv.analysis.plot import default_title, no_eviction_ceiling, plot_results  # noqa: E402


def rows():
    out = []
    for policy, rates in (("lru", [0.1, 0.3]), ("fifo", [0.1, 0.3]), ("s3fifo", [0.2, 0.35]), ("belady", [0.3, 0.4])):
        for blocks, rate in zip((100, 10_000), rates):
            prompt = 1000
            out.append({"policy": policy, "num_blocks": blocks, "page_size": 16, "model": "llama-3-8b",
                        "trace": "/x/conv.jsonl", "token_hit_rate": rate, "prompt_tokens": prompt,
                        "prefill_flops_saved": int(rate * 1e15),
                        "miss_tokens_by_reason": {"first_sight": 550, "partial_page": 5, "evicted": 0}})
    return out


def test_the_figure_tells_policies_apart_and_draws_both_ceilings(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    plot_results(rows(), str(tmp_path / "p.png"))
    fig = figures[0]
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    styles = [(lines[n].get_marker(), str(lines[n].get_linestyle())) for n in ("fifo", "lru (same as fifo)", "s3fifo")]
    assert len(set(styles)) == 3  # each policy its own marker and line style
    assert lines["belady (offline optimum)"].get_color() == "black"
    assert lines["no eviction"].get_ydata()[0] == pytest.approx(0.445)  # 1 - (550 + 5) / 1000
    assert list(lines["s3fifo"].get_xdata()) == [1600, 160_000]  # capacity in tokens
    assert fig.axes[1].get_xlabel() == "capacity (tokens)" and ax.get_ylim()[0] == 0
    assert fig._suptitle.get_text() == "conv.jsonl \u00b7 page 16 \u00b7 llama-3-8b"


def test_ceiling_and_title_helpers():
    assert no_eviction_ceiling([{"policy": "lru"}]) is None
    assert default_title([{"trace": "a"}, {"trace": "b", "page_size": 16}]) == "page 16"

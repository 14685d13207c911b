"""Figures a paper can use: one style per policy everywhere, several files on one x axis, ticks at the
capacities run, a comparison panel, a policy filter, a demo figure of at most 7 policies, vector output."""

from __future__ import annotations

import json

import pytest

matplotlib = pytest.importorskip("matplotlib")

from matplotlib.figure import Figure  # noqa: E402

from radixkv import policies  # noqa: E402
from radixkv.analysis.plot import POLICY_STYLES, choose_policies, comparison, policy_style  # noqa: E402

from .test_tool_cli import fails, ok  # noqa: E402


@pytest.fixture
def figures(monkeypatch):
    """Every figure a command saves (the file is still written by the real savefig)."""
    saved = []
    real = Figure.savefig

    def keep(self, *args, **kwargs):
        saved.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def lines_of(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def write_rows(path, trace, rates, page_size=16):
    """A sweep's JSONL: ``rates`` maps policy -> hit rate at 100, 1,000 and 10,000 blocks."""
    with open(path, "w") as f:
        for policy, values in rates.items():
            for blocks, rate in zip((100, 1000, 10_000), values):
                f.write(json.dumps({"policy": policy, "num_blocks": blocks, "page_size": page_size,
                                    "token_hit_rate": rate, "trace": trace}) + "\n")
    return path


RATES = {"lru": [0.1, 0.3, 0.5], "s3fifo": [0.2, 0.35, 0.5], "sieve": [0.1, 0.4, 0.5], "belady": [0.3, 0.5, 0.6]}


def test_every_registered_policy_has_its_own_style():
    names = policies.available()
    assert set(names) <= set(POLICY_STYLES)
    assert len({POLICY_STYLES[n][0] for n in names}) == len(names)  # no two share a colour
    assert policy_style("lfu-da") == policy_style("lfu")  # an alias looks like its policy
    assert policy_style("my_policy") == policy_style("my_policy")  # a user's policy: stable too


def test_comparison_is_the_share_of_the_gap_closed_or_the_miss_reduction():
    series = {name: list(zip((1, 2, 3), values)) for name, values in RATES.items()}
    label, second = comparison(series)
    assert label.startswith("share of LRU") and set(second) == {"s3fifo", "sieve"}
    assert [c for c, _ in second["s3fifo"]] == [1, 2, 3]
    assert [y for _, y in second["s3fifo"]] == pytest.approx([0.5, 0.25, 0.0])  # (0.35-0.3)/(0.5-0.3)
    label, second = comparison({k: v for k, v in series.items() if k != "belady"})
    assert label.startswith("miss-ratio reduction")
    assert second["sieve"][1] == (2, pytest.approx((0.7 - 0.6) / 0.7))
    assert comparison({"s3fifo": series["s3fifo"]}) == ("", {})


def test_plot_of_two_files_of_one_trace_shares_its_axes(tmp_path, figures):
    sweep = write_rows(tmp_path / "s.jsonl", "conv.jsonl", RATES)
    curve = tmp_path / "c.json"
    curve.write_text(json.dumps({"capacities": [1, 10, 100, 1000, 10_000], "hit_tokens": [0, 10, 20, 40, 60],
                                 "prompt_tokens": 100, "page_size": 16, "trace": "conv.jsonl"}) + "\n")
    ok("plot", sweep, curve, "-o", tmp_path / "p.png")
    top, second = figures[0].axes[:2]
    drawn = lines_of(top)
    assert {"lru", "lru (curve)", "s3fifo", "sieve", "belady (offline optimum)"} <= set(drawn)
    assert list(top.get_xticks()) == [1600, 16_000, 160_000]  # ticks at the capacities run, in tokens
    assert [t.get_text() for t in second.get_xticklabels()] == ["1.6k", "16k", "160k"]
    assert second.get_ylabel().startswith("share of LRU")
    assert lines_of(second)["s3fifo"].get_ydata()[0] == pytest.approx(0.5)


def test_plot_of_two_traces_draws_a_column_each_on_one_x_range(tmp_path, figures):
    a = write_rows(tmp_path / "a.jsonl", "a.jsonl", RATES)
    b = write_rows(tmp_path / "b.jsonl", "b.jsonl", {"lru": [0.2, 0.3, 0.4], "belady": [0.5, 0.6, 0.7]}, 32)
    ok("plot", a, b, "-o", tmp_path / "p.png")
    axes = figures[0].axes[:4]
    assert [ax.get_title() for ax in figures[0].axes if ax.get_title()] == ["a.jsonl", "b.jsonl"]
    assert len({tuple(ax.get_xlim()) for ax in axes}) == 1
    assert lines_of(axes[0])["lru"].get_color() == lines_of(axes[1])["lru"].get_color() == POLICY_STYLES["lru"][0]


def test_plot_policies_filter(tmp_path, figures):
    path = write_rows(tmp_path / "s.jsonl", "t", RATES)
    ok("plot", path, "--policies", "lru,sieve", "-o", tmp_path / "p.png")
    assert set(lines_of(figures[0].axes[0])) == {"lru", "sieve"}
    fails("plot", path, "--policies", "lru,arc", "-o", tmp_path / "q.png", message="no results for 'arc'")


@pytest.mark.parametrize("suffix, magic", [(".pdf", b"%PDF"), (".svg", b"<?xml")])
def test_vector_output_by_extension(tmp_path, suffix, magic):
    path = write_rows(tmp_path / "s.jsonl", "t", RATES)
    out = tmp_path / f"fig{suffix}"
    ok("plot", path, "-o", out)
    assert out.read_bytes()[:5].startswith(magic)


def test_the_demo_figure_shows_belady_lru_and_the_best_five(tmp_path, figures):
    text = ok("demo", "--requests", "150", "--out-dir", tmp_path / "out", "--quiet")
    rows = [json.loads(line) for line in (tmp_path / "out" / "demo.jsonl").read_text().splitlines()]
    chosen = choose_policies(rows, 7)
    assert chosen[:2] == ["belady", "lru"] and len(chosen) == 7
    mean = {p: sum(r["token_hit_rate"] for r in rows if r["policy"] == p) for p in {r["policy"] for r in rows}}
    left_out = set(mean) - set(chosen)
    assert min(mean[p] for p in chosen[2:]) >= max(mean[p] for p in left_out)
    drawn = {label.split(" (")[0] for label in lines_of(figures[0].axes[0])} - {"no eviction"}
    assert drawn == set(chosen)
    assert f"figure: {', '.join(chosen)}" in text and "all 14 in the table" in text

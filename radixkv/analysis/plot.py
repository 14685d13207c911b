"""Draw sweep results: hit rate against capacity, one line per policy, and how each compares.

Reads the JSONL of ``radixkv sweep`` (one object per (policy, capacity)) and
the last-line JSON of ``radixkv curve --json`` (drawn as ``lru (curve)``).
matplotlib is the optional ``plot`` extra, imported only here, when drawing.
"""

from __future__ import annotations

import os
import textwrap
import zlib
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import ArgumentValueError, TraceFormatError
from ..workload.traces import json_lines

CEILING_POLICY = "belady"
"""Drawn dashed, as the ceiling the online policies are measured against."""


def read_results(path: str) -> List[dict]:
    """Rows of a results JSONL file; a curve object becomes one row per capacity.

    Raises :class:`~radixkv.errors.TraceFormatError` naming the line and field.
    """
    rows: List[dict] = []
    for lineno, obj in json_lines(path):
        if not isinstance(obj, dict):
            raise TraceFormatError(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
        if "capacities" in obj:
            rows.extend(_curve_rows(obj, path, lineno))
            continue
        for name, kind in (("policy", str), ("num_blocks", int), ("token_hit_rate", (int, float))):
            if name not in obj:
                raise TraceFormatError(path, lineno, f"missing field {name!r}")
            if not isinstance(obj[name], kind) or isinstance(obj[name], bool):
                raise TraceFormatError(path, lineno, f"field {name!r} has the wrong type: {obj[name]!r:.60}")
        rows.append(obj)
    if not rows:
        raise TraceFormatError(path, 0, "no results to plot (empty file)")
    return rows


def _curve_rows(obj: dict, path: str, lineno: int) -> List[dict]:
    caps, hits, prompt = obj.get("capacities"), obj.get("hit_tokens"), obj.get("prompt_tokens")
    if not isinstance(caps, list) or not isinstance(hits, list) or len(caps) != len(hits):
        raise TraceFormatError(path, lineno, "fields 'capacities' and 'hit_tokens' must be lists of equal length")
    if not isinstance(prompt, int) or prompt <= 0:
        raise TraceFormatError(path, lineno, f"field 'prompt_tokens' must be an int > 0, got {prompt!r}")
    extra = {key: obj[key] for key in ("trace", "page_size", "model", "no_eviction_hit_rate") if key in obj}
    return [{"policy": "lru (curve)", "num_blocks": c, "token_hit_rate": h / prompt, **extra}
            for c, h in zip(caps, hits)]


def no_eviction_ceiling(rows: List[dict]) -> Optional[float]:
    """Token hit rate with unbounded capacity, from any run's miss reasons: every miss but the
    first sight of a page (and partial pages, other namespaces' pages) would have hit; or as a
    one-pass curve gives it (``no_eviction_hit_rate``)."""
    best = None
    for row in rows:
        if isinstance(row.get("no_eviction_hit_rate"), (int, float)):
            best = max(best or 0.0, float(row["no_eviction_hit_rate"]))
        misses, prompt = row.get("miss_tokens_by_reason"), row.get("prompt_tokens")
        if not misses or not prompt:
            continue
        unavoidable = sum(misses.get(r, 0) for r in ("first_sight", "partial_page", "other_namespace"))
        rate = (prompt - unavoidable) / prompt
        best = rate if best is None else max(best, rate)
    return best


def default_title(rows: List[dict]) -> str:
    """``trace · page 16 · llama-3-8b`` from the rows (each part only when the rows agree on it)."""
    parts = []
    for key, fmt in (("trace", "{}"), ("page_size", "page {}"), ("model", "{}")):
        values = {row.get(key) for row in rows} - {None}
        if len(values) == 1:
            value = values.pop()
            parts.append(fmt.format(os.path.basename(str(value)) if key == "trace" else value))
    return " \u00b7 ".join(parts)


POLICY_STYLES: Dict[str, Tuple[str, str, object]] = {
    "lru": ("#0072B2", "o", "-"),
    "fifo": ("#E69F00", "s", "--"),
    "lfu": ("#009E73", "^", "-."),
    "s3fifo": ("#CC79A7", "D", "-"),
    "sieve": ("#D55E00", "v", "--"),
    "arc": ("#56B4E9", "P", "-."),
    "2q": ("#882255", "X", ":"),
    "slru": ("#999933", "<", "-"),
    "lirs": ("#44AA99", ">", "--"),
    "density": ("#332288", "h", "-."),
    "adaptive": ("#AA4499", "*", ":"),
    "gdsf": ("#117733", "p", "-"),
    "wa": ("#661100", "d", "--"),
    CEILING_POLICY: ("black", "x", "--"),
}
"""(colour, marker, line style) of each policy, the same in every figure radixkv draws: the
colour-blind-safe Okabe-Ito and Tol colours, each colour once, and markers and dashes that differ
too, so a greyscale print still tells them apart. Belady is the dashed black ceiling."""

FALLBACK_COLORS = ("#BBBBBB", "#EE7733", "#0077BB", "#33BBEE", "#EE3377", "#CC3311", "#009988")
FALLBACK_MARKERS = ("o", "s", "^", "v", "D", "P", "X")
FALLBACK_DASHES = ("-", (0, (5, 1)), (0, (3, 1, 1, 1)), (0, (1, 1)))
DENSE_POINTS = 20
"""A series with more points than this is drawn as a line with a few evenly spaced markers."""
MAX_CAPACITY_TICKS = 8
"""Capacities run up to this many are the x ticks themselves; more (a curve's grid) get log ticks."""
MIN_GAP = 0.01
"""The LRU-to-Belady gap, as a share of prompt tokens, below which the share closed is not drawn:
a gap of a few tokens makes the ratio noise."""
COLUMN_INCHES = 3.3
"""Width of one column of panels: a paper's single column."""


def base_policy(name: str) -> str:
    """The registered policy a series name stands for: ``lru (curve)`` -> ``lru``, an alias
    (``lfu-da``) -> its policy; any other name as is. O(1)."""
    from .. import policies

    name = name.split(" (", 1)[0]
    try:
        return policies.resolve(name).name
    except KeyError:
        return name


def policy_style(name: str) -> Dict[str, object]:
    """matplotlib keywords of series ``name``: its policy's fixed :data:`POLICY_STYLES` entry, or
    for a name radixkv does not ship (a user's policy) one picked from its CRC-32, so it too
    looks the same in every figure. A curve (``lru (curve)``) is its policy's colour, solid, thin."""
    base = base_policy(name)
    if base in POLICY_STYLES:
        color, marker, dash = POLICY_STYLES[base]
    else:
        h = zlib.crc32(base.encode())
        color, marker, dash = (FALLBACK_COLORS[h % 7], FALLBACK_MARKERS[(h // 7) % 7],
                               FALLBACK_DASHES[(h // 49) % len(FALLBACK_DASHES)])
    style: Dict[str, object] = dict(color=color, marker=marker, linestyle=dash, linewidth=1.0, markersize=3.5)
    if base == CEILING_POLICY:
        style["linewidth"] = 1.3
    if name.endswith("(curve)"):
        style.update(linestyle="-", linewidth=0.8, marker="None")
    return style


def choose_policies(rows: List[dict], limit: int = 7) -> List[str]:
    """The policies a figure of ``rows`` shows when it may show ``limit``: Belady and LRU (ceiling
    and baseline) when present, then the others by mean token hit rate over the capacities run,
    best first. O(rows)."""
    means: Dict[str, List[float]] = defaultdict(list)
    for row in rows:
        means[row["policy"]].append(float(row["token_hit_rate"]))
    fixed = [p for p in (CEILING_POLICY, "lru") if p in means]
    rest = sorted((p for p in means if p not in fixed), key=lambda p: (-sum(means[p]) / len(means[p]), p))
    return (fixed + rest)[:limit]


def select_policies(rows: List[dict], wanted: Sequence[str]) -> List[dict]:
    """The rows of the policies named in ``wanted`` (``lru`` keeps ``lru (curve)`` too); an unknown
    name is an :class:`~radixkv.errors.ArgumentValueError` listing those the rows have. O(rows)."""
    have = sorted({row["policy"] for row in rows})
    keep = {name.strip() for name in wanted if name.strip()}
    unknown = [n for n in keep if n not in have and not any(base_policy(h) == n for h in have)]
    if not keep or unknown:
        raise ArgumentValueError(f"--policies: no results for {(unknown or [''])[0]!r}; the files have "
                                 f"{', '.join(have)}")
    return [row for row in rows if row["policy"] in keep or base_policy(row["policy"]) in keep]


def _group(rows: List[dict]) -> Dict[str, List[dict]]:
    """Rows by trace (its file name), in first-seen order: one column of panels each."""
    groups: Dict[str, List[dict]] = {}
    for row in rows:
        groups.setdefault(os.path.basename(str(row.get("trace", ""))), []).append(row)
    return groups


def _series(rows: List[dict]) -> Dict[str, List[Tuple[int, float]]]:
    """Token hit rate against capacity (tokens when the rows have a page size) per policy, sorted;
    the page size joins the name when the rows mix page sizes."""
    mixed = len({r.get("page_size") for r in rows}) > 1
    lines: Dict[str, List[Tuple[int, float]]] = defaultdict(list)
    for row in rows:
        label = row["policy"] + (f" (page {row.get('page_size')})" if mixed else "")
        lines[label].append((row["capacity_tokens"], float(row["token_hit_rate"])))
    ordered = sorted(lines.items(), key=lambda kv: (CEILING_POLICY in kv[0], kv[0]))
    return {label: sorted(points) for label, points in ordered}


def comparison(series: Dict[str, List[Tuple[int, float]]]) -> Tuple[str, Dict[str, List[Tuple[int, float]]]]:
    """The second panel: with Belady and LRU run at the same capacities, the share of the gap from
    LRU to Belady each policy closes, ``(p - lru) / (belady - lru)`` (0 is LRU, 1 the optimum;
    capacities where the gap is under :data:`MIN_GAP` left out); with LRU only, the miss-ratio
    reduction over LRU, ``(miss_lru - miss_p) / miss_lru``; without LRU, nothing. Returns the
    y-axis label and the series. O(points)."""
    lru = dict(series.get("lru", ()))
    best = dict(series.get(CEILING_POLICY, ()))
    if not lru:
        return "", {}
    gap = bool(best) and any(best.get(c, 0) - h >= MIN_GAP for c, h in lru.items())
    out: Dict[str, List[Tuple[int, float]]] = {}
    for name, points in series.items():
        if name == "lru" or base_policy(name) == CEILING_POLICY or name.endswith("(curve)"):
            continue
        if gap:
            ys = [(c, (h - lru[c]) / (best[c] - lru[c])) for c, h in points
                  if c in lru and c in best and best[c] - lru[c] >= MIN_GAP]
        else:
            ys = [(c, ((1 - lru[c]) - (1 - h)) / (1 - lru[c])) for c, h in points if c in lru and lru[c] < 1]
        if ys:
            out[name] = ys
    label = "share of LRU\u2013Belady gap closed" if gap else "miss-ratio reduction vs LRU"
    return (label, out) if out else ("", {})


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display).

    Raises:
        RuntimeError: matplotlib (the ``plot`` extra) is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("radixkv plot needs matplotlib: pip install 'radixkv[plot]'") from None
    return plt


def legend_height(entries: int, ncols: int) -> float:
    """Inches a legend of ``entries`` under ``ncols`` columns of panels takes: rows of 3 a column."""
    return 0.13 * -(-entries // (3 * ncols)) + 0.08


def finish(fig, handles: dict, title: str, ncols: int, out: str) -> None:
    """Put one legend under the panels and the wrapped ``title`` above, fit the panels between, and
    write ``out`` (PNG at 300 dpi, or PDF / SVG by the extension; its folder made); close ``fig``."""
    import matplotlib.pyplot as plt

    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=3 * ncols, frameon=False,
               bbox_to_anchor=(0.5, 0.0), handlelength=2.6, columnspacing=1.0)
    fig.suptitle(textwrap.fill(title, 60 * ncols), fontsize=7)
    fig.tight_layout(rect=(0, legend_height(len(handles), ncols) / fig.get_figheight(), 1, 1), h_pad=0.4)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=300)
    plt.close(fig)


def capacity_ticks(rows: List[dict], log_x: bool) -> List[int]:
    """The capacities run (not a curve's grid) as x ticks, when there are at most
    :data:`MAX_CAPACITY_TICKS` and no two would print on each other (a factor 1.4 apart on a log
    axis, 1/12 of the range on a linear one); else ``[]``, for matplotlib's own. O(rows)."""
    caps = sorted({row["capacity_tokens"] for row in rows if not row["policy"].endswith("(curve)")})
    if not caps or len(caps) > MAX_CAPACITY_TICKS:
        return []
    close = any(b < 1.4 * a if log_x else b - a < caps[-1] / 12 for a, b in zip(caps, caps[1:]))
    return [] if close else caps


def compact(value: float, _pos: object = None) -> str:
    """A count in two or three digits and a suffix, ``9.8k``, ``157k``, ``1.2M``, ``63``: capacity
    ticks, and analyze's buckets (``_pos``: matplotlib's formatter argument)."""
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if value >= scale:
            v = value / scale
            return f"{v:.2g}{unit}" if v < 10 else f"{v:.0f}{unit}"
    return f"{value:.0f}"


def plot_results(rows: List[dict], out: str, title: str = "", ceiling: Optional[float] = None,
                 policies: Optional[Sequence[str]] = None) -> str:
    """Draw sweep and curve results; write ``out`` as PNG, PDF or SVG (by its extension). Returns ``out``.

    One column of panels per trace (several files of one trace, a sweep and its curve, share
    theirs), all on one shared x axis: capacity in tokens (GiB of the model's KV on top when the
    rows name one model), logarithmic when the capacities span more than 10x, ticked at the
    capacities run when there are at most :data:`MAX_CAPACITY_TICKS`. The top panel is the token
    hit rate, y from 0, under the dotted no-eviction hit rate (from the miss reasons, or
    ``ceiling``); the second carries the comparison (:func:`comparison`). Each policy keeps its
    :func:`policy_style` in every figure; a policy whose points equal another's is labelled
    ``same as ...``. ``policies`` keeps only those (:func:`select_policies`). A column is
    :data:`COLUMN_INCHES` wide, a paper's single column, with fonts to read at that size; the
    legend sits below the panels. The title defaults to the trace, page size and model.

    Raises:
        RuntimeError: matplotlib (the ``plot`` extra) is missing.
        ArgumentValueError: ``policies`` names a policy the rows do not have.
    """
    plt = pyplot()
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator, PercentFormatter

    if policies is not None:
        rows = select_policies(rows, policies)
    rows = [{**row, "capacity_tokens": row["num_blocks"] * int(row.get("page_size") or 1)} for row in rows]
    in_tokens = all(row.get("page_size") for row in rows)
    groups = _group(rows)
    panels = {name: (_series(group),) + comparison(_series(group)) for name, group in groups.items()}
    has_second = any(second for _, _, second in panels.values())
    nrows, ncols = 1 + has_second, len(groups)
    entries = len({name for series, _, second in panels.values() for name in [*series, *second]}) + 1
    legend_inches = legend_height(entries, ncols)
    with plt.rc_context({"font.size": 7, "axes.titlesize": 7, "legend.fontsize": 6.5, "axes.linewidth": 0.6,
                         "xtick.major.width": 0.6, "ytick.major.width": 0.6}):
        fig, axes = plt.subplots(nrows, ncols, figsize=(COLUMN_INCHES * ncols, 1.9 * nrows + legend_inches + 0.45),
                                 squeeze=False, sharex="col")
        caps = sorted({row["capacity_tokens"] for row in rows})
        log_x = caps[-1] > 10 * caps[0]
        pad = (caps[-1] / caps[0]) ** 0.04 if log_x else None  # the columns' one x range, with a margin
        xlim = (caps[0] / pad, caps[-1] * pad) if log_x else (0, caps[-1] * 1.04)
        models = {row.get("model") for row in rows} - {None}
        model = next(iter(models)) if len(models) == 1 else None
        gib = _gib_per_token(model) if model and in_tokens else None
        handles: dict = {}
        for col, (group_name, (series, second_label, second)) in enumerate(panels.items()):
            group_rows = groups[group_name]
            top = axes[0][col]
            seen: Dict[tuple, str] = {}
            for name, points in series.items():
                style = policy_style(name)
                shown = f"{name} (offline optimum)" if base_policy(name) == CEILING_POLICY else name
                same = seen.setdefault(tuple(points), shown)
                if same != shown:
                    shown = f"{shown} (same as {same})"
                    style["markerfacecolor"] = "none"
                if len(points) > DENSE_POINTS and style["marker"] != "None":
                    style["markevery"] = 0.1
                xs, ys = zip(*points)
                (line,) = top.plot(xs, ys, label=shown, **style)
                handles.setdefault(shown, line)
            limit = no_eviction_ceiling(group_rows) if ceiling is None else ceiling
            if limit is not None:
                handles["no eviction"] = top.axhline(limit, color="grey", linestyle=":", linewidth=0.9,
                                                     label="no eviction")
            top.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
            top.set_ylim(bottom=0)
            top.set_ylabel("token hit rate")
            if ncols > 1:
                top.set_title(group_name)
            if has_second:
                ax = axes[1][col]
                for name, points in second.items():
                    xs, ys = zip(*points)
                    (line,) = ax.plot(xs, ys, label=name, **policy_style(name))
                    handles.setdefault(name, line)
                ax.axhline(0, color=POLICY_STYLES["lru"][0], linewidth=0.8)
                if second_label.startswith("share"):
                    ax.axhline(1, color="black", linestyle="--", linewidth=0.8)
                ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
                ax.set_ylabel(second_label or "(no LRU to compare with)")
        column_ticks = [capacity_ticks(group, log_x) for group in groups.values()]
        for col, ticks in enumerate(column_ticks):
            for ax in axes[:, col]:
                ax.grid(True, alpha=0.3, linewidth=0.5)
                if log_x:
                    ax.set_xscale("log")
                ax.set_xlim(*xlim)
                if ticks:
                    ax.xaxis.set_major_locator(FixedLocator(ticks))
                    ax.xaxis.set_minor_locator(NullLocator())
                ax.xaxis.set_major_formatter(FuncFormatter(compact))
        for ax in axes[-1]:
            ax.set_xlabel("capacity (tokens)" if in_tokens else "capacity (blocks)")
        for top, ticks in zip(axes[0], column_ticks) if gib else ():  # after the x scale: it resets these
            sec = top.secondary_xaxis("top", functions=(lambda t, g=gib: t * g, lambda v, g=gib: v / g))
            sec.set_xlabel(f"GiB of {model} KV")
            if ticks:  # the same capacities as below, in GiB
                sec.xaxis.set_major_locator(FixedLocator([t * gib for t in ticks]))
            sec.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 100 else f"{v:.3g}"))
            sec.xaxis.set_minor_formatter(NullFormatter())  # log minor labels would print over each other
            sec.tick_params(labelsize=6)
        finish(fig, handles, title or default_title(rows), ncols, out)
    return out


def _gib_per_token(model: str) -> Optional[float]:
    """GiB of KV one token of the preset ``model`` occupies, or ``None`` for an unknown name."""
    from ..costs import MODELS, kv_bytes_per_token

    spec = MODELS.get(model)
    return kv_bytes_per_token(spec) / 2**30 if spec is not None else None


def plot_over_time(rows: List[dict], out: str, title: str = "", policies: Optional[Sequence[str]] = None) -> str:
    """Draw the hit rate over time of results run with ``--interval``: one panel per capacity (a
    shared x axis of requests replayed, a shared y axis), one line per policy in its fixed
    :func:`policy_style`, each point a window's token hit rate at the window's last request.
    Written as PNG, PDF or SVG by the extension of ``out``, a paper's column wide. Returns ``out``.

    Raises:
        RuntimeError: matplotlib (the ``plot`` extra) is missing.
        ArgumentValueError: no row has intervals, or ``policies`` names one the rows lack.
    """
    plt = pyplot()
    from matplotlib.ticker import PercentFormatter

    if policies is not None:
        rows = select_policies(rows, policies)
    rows = [row for row in rows if row.get("intervals")]
    if not rows:
        raise ArgumentValueError("--over-time needs results with a hit rate over time: run replay or sweep with "
                                 "--interval N")
    caps = sorted({(row["num_blocks"], row.get("page_size")) for row in rows})
    with plt.rc_context({"font.size": 7, "legend.fontsize": 6.5, "axes.linewidth": 0.6}):
        fig, axes = plt.subplots(len(caps), 1, figsize=(COLUMN_INCHES, 1.3 * len(caps) + 0.9), squeeze=False,
                                 sharex=True, sharey=True)
        handles: dict = {}
        for ax, (blocks, page_size) in zip(axes[:, 0], caps):
            for row in sorted((r for r in rows if (r["num_blocks"], r.get("page_size")) == (blocks, page_size)),
                              key=lambda r: (CEILING_POLICY in r["policy"], r["policy"])):
                xs = [w["end_request"] + int(row.get("warmup_requests") or 0) for w in row["intervals"]]
                ys = [w["token_hit_rate"] for w in row["intervals"]]
                style = policy_style(row["policy"])
                if len(xs) > DENSE_POINTS:
                    style["markevery"] = 0.1
                (line,) = ax.plot(xs, ys, label=row["policy"], **style)
                handles.setdefault(row["policy"], line)
            size = f"{blocks * page_size:,} tokens" if page_size else f"{blocks:,} blocks"
            ax.set_title(size, fontsize=7, loc="left")
            ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
            ax.set_ylabel("window hit rate")
            ax.grid(True, alpha=0.3, linewidth=0.5)
        top = max(w["token_hit_rate"] for row in rows for w in row["intervals"])
        axes[0, 0].set_ylim(0, top * 1.08 or 1.0)  # shared by every panel: after all lines are drawn
        axes[-1, 0].set_xlabel("requests replayed")
        finish(fig, handles, title or default_title(rows), 1, out)
    return out

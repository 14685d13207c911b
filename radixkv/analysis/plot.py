"""Draw sweep results: hit rate and prefill saved against capacity, one line per policy.

Reads the JSONL of ``radixkv sweep`` (one object per (policy, capacity)) and
the last-line JSON of ``radixkv curve --json`` (drawn as ``lru (curve)``).
matplotlib is the optional ``plot`` extra, imported only here, when drawing.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from ..errors import TraceFormatError
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


def _series(rows: List[dict], key: str) -> Dict[str, List[Tuple[int, float]]]:
    traces = {row.get("trace") for row in rows}
    lines: Dict[str, List[Tuple[int, float]]] = defaultdict(list)
    for row in rows:
        if key not in row:
            continue
        label = row["policy"]
        if len(traces) > 1:
            label = f"{os.path.basename(str(row.get('trace')))}: {label}"
        if row.get("page_size") is not None and len({r.get("page_size") for r in rows}) > 1:
            label += f" (page {row['page_size']})"
        lines[label].append((row.get("capacity_tokens", row["num_blocks"]), float(row[key])))
    return {label: sorted(points) for label, points in lines.items()}


DENSE_POINTS = 20
"""A series with more points than this is drawn as a line with a few evenly spaced markers."""

MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "*", "h", "p", "8", "H", "d")
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#882255", "#999999")
"""Okabe-Ito colours (wine for its hard-to-see yellow), told apart by colour-blind readers; markers
and line styles differ too, for greyscale."""


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


def plot_results(rows: List[dict], out: str, title: str = "", ceiling: Optional[float] = None) -> str:
    """Write a PNG with two panels, token hit rate and prefill PFLOPs saved against capacity in tokens.

    Each policy has its own colour, marker and line style; Belady, when present, is the
    dashed black ceiling of the policies, and the no-eviction hit rate (from the miss
    reasons, or ``ceiling`` when given) a dotted grey line. A policy whose points equal an earlier one's is labelled
    ``(same as ...)``. The x axis (tokens; GiB of the model's KV on top when the rows
    name one model) is logarithmic when capacities span more than 10x; y starts at 0.
    The title defaults to the trace, page size and model. Returns ``out``.
    Raises RuntimeError when matplotlib (the ``plot`` extra) is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import PercentFormatter
    except ImportError:
        raise RuntimeError("radixkv plot needs matplotlib: pip install 'radixkv[plot]'") from None
    rows = [{**row, "capacity_tokens": row["num_blocks"] * int(row.get("page_size") or 1)} for row in rows]
    in_tokens = all(row.get("page_size") for row in rows)
    panels = [("token_hit_rate", "token hit rate", 1.0), ("prefill_flops_saved", "prefill saved (PFLOP)", 1e-15)]
    panels = [p for p in panels if any(p[0] in row for row in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels) + 1.6, 3.8), squeeze=False)
    caps = [row["capacity_tokens"] for row in rows]
    log_x = max(caps) > 10 * min(caps)
    models = {row.get("model") for row in rows} - {None}
    gib = _gib_per_token(models.pop()) if len(models) == 1 and in_tokens else None
    ceiling = no_eviction_ceiling(rows) if ceiling is None else ceiling
    handles: dict = {}
    # One style per series name across the panels: a series missing from a panel (a curve has no
    # prefill figures) must not shift the others onto its colour.
    names = sorted({name for key, _, _ in panels for name in _series(rows, key)},
                   key=lambda name: (CEILING_POLICY in name, name))
    style_index = {name: i for i, name in enumerate(names)}
    for ax, (key, label, scale) in zip(axes[0], panels):
        series = sorted(_series(rows, key).items(), key=lambda kv: (CEILING_POLICY in kv[0], kv[0]))
        seen: Dict[tuple, str] = {}
        for name, points in series:
            i = style_index[name]
            xs, ys = zip(*points)
            if CEILING_POLICY in name:
                style = dict(color="black", linestyle="--", linewidth=1.8, marker="x")
                name = f"{name} (offline optimum)"
            else:
                style = dict(color=COLORS[i % len(COLORS)], linestyle=LINESTYLES[i % len(LINESTYLES)],
                             marker=MARKERS[i % len(MARKERS)], linewidth=1.4)
            if len(xs) > DENSE_POINTS:  # a one-pass curve's grid: a line, with a few markers to tell it apart
                style["markevery"] = 0.1  # evenly spaced along the drawn line, on a log axis too
            same = seen.setdefault(tuple(points), name)
            shown = name if same == name else f"{name} (same as {same})"
            (line,) = ax.plot(xs, [y * scale for y in ys], markersize=4, label=shown, **style,
                              markerfacecolor="none" if same != name else None)
            handles.setdefault(shown, line)
        if key == "token_hit_rate":
            if ceiling is not None:
                handles["no eviction"] = ax.axhline(ceiling, color="grey", linestyle=":", linewidth=1.2,
                                                    label="no eviction")
            ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        if log_x:
            ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("capacity (tokens)" if in_tokens else "capacity (blocks)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if gib:
            top = ax.secondary_xaxis("top", functions=(lambda t, g=gib: t * g, lambda v, g=gib: v / g))
            top.set_xlabel(f"GiB of KV ({next(iter({r.get('model') for r in rows}))})", fontsize="small")
    # One legend beside the panels: it cannot cover a line.
    fig.legend(list(handles.values()), list(handles), loc="center left", bbox_to_anchor=(0.0, 0.5),
               fontsize="small", frameon=False)
    fig.suptitle(title or default_title(rows), fontsize="medium")
    fig.tight_layout(rect=(0.2, 0, 1, 1))
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(out, dpi=150)
    plt.close(fig)
    return out


def _gib_per_token(model: str) -> Optional[float]:
    """GiB of KV one token of the preset ``model`` occupies, or ``None`` for an unknown name."""
    from ..costs import MODELS, kv_bytes_per_token

    spec = MODELS.get(model)
    return kv_bytes_per_token(spec) / 2**30 if spec is not None else None

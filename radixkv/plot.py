"""Draw sweep results: hit rate and prefill saved against capacity, one line per policy.

Reads the JSONL of ``radixkv sweep`` (one object per (policy, capacity)) and
the last-line JSON of ``radixkv curve --json`` (drawn as ``lru (curve)``).
matplotlib is the optional ``plot`` extra, imported only here, when drawing.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Dict, List, Tuple

from .errors import TraceFormatError

CEILING_POLICY = "belady"
"""Drawn dashed, as the ceiling the online policies are measured against."""


def read_results(path: str) -> List[dict]:
    """Rows of a results JSONL file; a curve object becomes one row per capacity.

    Raises :class:`~radixkv.errors.TraceFormatError` naming the line and field.
    """
    rows: List[dict] = []
    with open(path, "r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, lineno, f"invalid JSON: {exc.msg}") from None
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
    return [{"policy": "lru (curve)", "num_blocks": c, "token_hit_rate": h / prompt, "trace": obj.get("trace")}
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
        lines[label].append((row["num_blocks"], float(row[key])))
    return {label: sorted(points) for label, points in lines.items()}


def plot_results(rows: List[dict], out: str, title: str = "") -> str:
    """Write a PNG with two panels, token hit rate and prefill PFLOPs saved against capacity.

    Belady, when present, is drawn dashed in black as the ceiling. The x axis is
    logarithmic when capacities span more than 10x. Returns ``out``.
    Raises RuntimeError when matplotlib (the ``plot`` extra) is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("radixkv plot needs matplotlib: pip install 'radixkv[plot]'") from None
    panels = [("token_hit_rate", "token hit rate", 1.0), ("prefill_flops_saved", "prefill saved (PFLOP)", 1e-15)]
    panels = [p for p in panels if any(p[0] in row for row in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.6), squeeze=False)
    caps = [row["num_blocks"] for row in rows]
    log_x = max(caps) > 10 * min(caps)
    for ax, (key, label, scale) in zip(axes[0], panels):
        for name, points in sorted(_series(rows, key).items(), key=lambda kv: (CEILING_POLICY in kv[0], kv[0])):
            xs, ys = zip(*points)
            style = dict(color="black", linestyle="--", linewidth=2) if CEILING_POLICY in name else {}
            ax.plot(xs, [y * scale for y in ys], marker="o", markersize=3,
                    label=f"{name} (ceiling)" if CEILING_POLICY in name else name, **style)
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel("capacity (blocks)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

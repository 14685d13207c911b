"""Result rows as a terminal table, GitHub markdown, CSV or JSON lines (the commands' ``--format``).

The terminal table is for reading: text left-aligned, numbers right-aligned
with thousands separators, rates (``*_rate``, ``share_*``) in percent. The
markdown table formats cells the same way and marks the alignment; CSV and JSON
keep the raw values (rates as fractions, full precision) for tools. A table's
columns are the command's defaults unless ``--columns`` names others.
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import List, Optional, Sequence

from ..errors import ArgumentValueError

OUTPUT_FORMATS = ("table", "md", "csv", "json")
HEADERS = {"capacity_tokens": "cap_tokens", "capacity_gib": "cap_GiB", "evicted_blocks": "evicted",
           "request_hit_rate": "req_hit_rate", "prefill_pflops_saved": "PFLOP_saved",
           "ttft_saving_seconds": "ttft_saved_s"}
"""Shorter table headers of long keys (``--columns``, CSV and JSON use the keys)."""
"""Values of ``--format`` that choose the output (the trace formats choose the input)."""


def to_json(value: object) -> str:
    """``value`` as strict JSON: a NaN or infinity raises ValueError (exit 2) rather than print
    ``NaN``, which JSON parsers other than Python's refuse."""
    return json.dumps(value, allow_nan=False)


def is_rate(column: str) -> bool:
    """Columns shown in percent: fractions of a whole."""
    return column.endswith("_rate") or column.startswith("share_")


def cell(column: str, value: object) -> str:
    """One table cell: ``12.34%`` for a rate, ``1,234`` for an int, 4 significant digits for a float."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value).lower()
    if isinstance(value, float) and math.isfinite(value):
        if is_rate(column):
            return f"{value * 100:.2f}%"
        return f"{value:,.2f}" if abs(value) >= 0.01 or value == 0 else f"{value:.2g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {cell(column, v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(cell(column, v) for v in value)
    return str(value)


def figure(value: float) -> str:
    """A float in prose as the tables print it (``22,190.53``, ``0.02``, ``0.0031``), so a sentence
    under a table never shows the same quantity in another notation. O(1)."""
    return cell("", float(value))


def _numeric(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def pick_columns(spec: Optional[str], default: Sequence[str], rows: Sequence[dict],
                 flag: str = "--columns") -> List[str]:
    """``default``, or the comma-separated columns of ``spec`` (each must be a key of the rows)."""
    if not spec:
        return list(default)
    names = [c.strip() for c in spec.split(",") if c.strip()]
    known = sorted({k for row in rows for k in row})
    unknown = [c for c in names if rows and c not in known]
    if not names or unknown:
        raise ArgumentValueError(f"{flag}: unknown column {unknown[0] if unknown else spec!r}; "
                                 f"available: {', '.join(known)}")
    return names


def text_table(rows: Sequence[dict], columns: Sequence[str], markdown: bool = False) -> str:
    """A pipe table of ``rows`` restricted to ``columns``: text left, numbers right."""
    cells = [[cell(c, r.get(c)) for c in columns] for r in rows]
    right = [bool(rows) and all(_numeric(r.get(c)) for r in rows if r.get(c) is not None) for c in columns]
    headers = [HEADERS.get(c, c) for c in columns]
    widths = [max(len(h), *(len(row[i]) for row in cells)) if cells else len(h) for i, h in enumerate(headers)]
    if markdown:
        rule = "|" + "|".join(("-" * (w + 1) + ":") if r else (":" + "-" * (w + 1))
                              for w, r in zip(widths, right)) + "|"
    else:
        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    lines = ["| " + " | ".join(h.rjust(w) if r else h.ljust(w) for h, w, r in zip(headers, widths, right)) + " |",
             rule]
    lines += ["| " + " | ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(row, widths, right)) + " |"
              for row in cells]
    return "\n".join(lines)


def csv_text(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """CSV with a header row; dict and list cells as JSON."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([to_json(v) if isinstance(v, (dict, list, tuple)) else ("" if v is None else v)
                         for v in (row.get(c) for c in columns)])
    return out.getvalue().rstrip("\n")


def render(rows: Sequence[dict], columns: Sequence[str], fmt: str) -> str:
    """``rows`` in ``fmt`` (one of :data:`OUTPUT_FORMATS`); JSON is one line per row, all its keys."""
    if fmt == "json":
        return "\n".join(to_json(row) for row in rows)
    if fmt == "csv":
        return csv_text(rows, columns)
    return text_table(rows, columns, markdown=fmt == "md")

"""Rendering rows for a terminal: aligned text tables, or JSON lines for scripts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from spark_ckpt.monitoring.units import size, when

Row = Mapping[str, Any]

__all__ = ["Row", "json_lines", "render", "size", "when"]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def render(rows: Sequence[Row], columns: Sequence[str] | None = None) -> str:
    """*rows* as a text table with a header; numbers right-aligned. '(none)' when empty."""
    if not rows:
        return "(none)"
    cols = list(columns or rows[0].keys())
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    numeric = [
        all(isinstance(r.get(c), int | float) or r.get(c) is None for r in rows) for c in cols
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(cols), line(["-" * w for w in widths])]
    out += [line(row) for row in cells]
    return "\n".join(out)


def json_lines(rows: Sequence[Row]) -> str:
    """One JSON object per row (sorted keys), for scripts."""
    return "\n".join(json.dumps(dict(r), sort_keys=True, default=str) for r in rows)

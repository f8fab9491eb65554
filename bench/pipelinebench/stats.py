"""Small statistics over measured samples."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np


def pct(values: Sequence[float], q: float) -> float | None:
    """The *q*-th percentile of *values* (None when empty)."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def median(values: Sequence[float]) -> float | None:
    """The median of *values* (None when empty)."""
    return float(statistics.median(values)) if len(values) else None


def per_row_us(runs: Sequence[dict[str, Any]], group: str, key: str) -> float:
    """``run[group][key]`` (seconds) summed over *runs*, in microseconds per measured row."""
    seconds = sum(float(r[group][key]) for r in runs)
    return seconds / sum(int(r["rows"]) for r in runs) * 1e6

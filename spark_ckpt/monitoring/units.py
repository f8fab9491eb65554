"""Figures for people: byte counts and durations in a readable unit, instants as UTC text.
Shared by the checkpoint page's charts and notebook view, the CLI's tables and the PNG plot
of ``spark-ckpt stats``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

Unit = tuple[str, float]

#: Binary byte units, smallest first.
SIZE_UNITS: tuple[Unit, ...] = (("B", 1.0), ("KiB", 1024.0), ("MiB", 1024.0**2), ("GiB", 1024.0**3))
#: Duration units of values in milliseconds, smallest first.
DURATION_UNITS: tuple[Unit, ...] = (("ms", 1.0), ("s", 1000.0), ("min", 60_000.0))


def unit_for(largest: float, units: Sequence[Unit]) -> Unit:
    """The largest of *units* (smallest first) in which *largest* is at least 1; the smallest
    for anything less."""
    chosen = units[0]
    for unit in units:
        if largest >= unit[1]:
            chosen = unit
    return chosen


def size(n: int | None) -> str:
    """A byte count with a binary unit ('' for None): ``512 B``, ``6.0 KiB``."""
    if n is None:
        return ""
    name, scale = unit_for(n, SIZE_UNITS)
    return f"{n:.0f} {name}" if scale == 1 else f"{n / scale:.1f} {name}"


def when(ms: int | None) -> str:
    """Epoch milliseconds as an ISO-8601 UTC time to the second ('' for None)."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

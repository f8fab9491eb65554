"""The time bench's arithmetic on checkpoint statistics (:mod:`runbench.timebench`): pure
functions over :class:`Point` (one completed checkpoint, as the statistics history and the
checkpoint's channel positions give it), so ``tests/test_bench_time.py`` checks them on
hand-made points.

* :func:`rate_between` — a counter of the checkpoint statistics (timers fired, timers
  registered, late rows, ...) per second over the checkpoints of a measured window. Each
  checkpoint counts what happened since the previous one, so the checkpoints ``c0 .. cn``
  triggered in the window count, from ``c1`` on, what happened between ``c0`` and ``cn``
  (a window with fewer than two: from the last checkpoint before it to the first after it).
* :func:`state_series` — the TTL section's series: per checkpoint its state bytes, the bytes
  it wrote and the keys in the state. Every input row carries a new key, so the keys in the
  state at a checkpoint are the rows read before its barrier less the entries expired up to
  it (``ttl_expired`` summed over the run's checkpoints so far).
* :func:`growth` — whether a series is flat or growing: its mean over the last tenth of the
  run against its mean over the tenth around the middle (``end_over_mid``: ~1 flat, ~2 for
  a linear growth from zero), its least-squares slope and its mean over the second half.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Point:
    """One completed checkpoint: when it was triggered and completed (epoch ms), the state it
    references and the bytes it wrote, and its time counters (since the previous
    checkpoint); *rows_before*: the data rows read before its barrier (None: not known)."""

    checkpoint_id: int
    trigger_ms: int
    completed_ms: int
    state_bytes: int = 0
    bytes_written: int = 0
    timers_fired: int = 0
    timers_registered: int = 0
    ttl_expired: int = 0
    late_rows: int = 0
    dropped_rows: int = 0
    watermark_ms: int | None = None
    rows_before: int | None = None


#: The counters :func:`rate_between` may take.
COUNTERS = ("timers_fired", "timers_registered", "ttl_expired", "late_rows", "dropped_rows")


def rate_between(
    points: Sequence[Point], start_ms: float, end_ms: float, counter: str
) -> dict[str, Any] | None:
    """*counter* per second over the checkpoints triggered in ``[start_ms, end_ms)`` (see
    the module docstring). With fewer than two of them (checkpoints further apart than the
    window: a checkpoint waits for a micro-batch) the span widens to the last checkpoint
    triggered before the window and the first after it (``widened``); None when there are
    still fewer than two."""
    if counter not in COUNTERS:
        raise ValueError(f"not a counter: {counter!r} (one of {COUNTERS})")
    ordered = sorted(points, key=lambda p: p.trigger_ms)
    inside = [p for p in ordered if start_ms <= p.trigger_ms < end_ms]
    widened = len(inside) < 2
    if widened:
        before = [p for p in ordered if p.trigger_ms < start_ms][-1:]
        after = [p for p in ordered if p.trigger_ms >= end_ms][:1]
        inside = before + inside + after
    if len(inside) < 2:
        return None
    seconds = (inside[-1].trigger_ms - inside[0].trigger_ms) / 1000
    count = sum(int(getattr(p, counter)) for p in inside[1:])
    return {
        "count": count,
        "seconds": seconds,
        "per_s": count / seconds if seconds > 0 else None,
        "checkpoints": len(inside),
        "widened": widened,
    }


def state_series(points: Sequence[Point], started_ms: float) -> list[dict[str, Any]]:
    """Per checkpoint of a run (every one since its start, in id order), seconds since
    *started_ms*, state bytes, bytes written, entries expired, rows read and the keys in the
    state (None where the rows read are not known)."""
    expired = 0
    out: list[dict[str, Any]] = []
    for p in sorted(points, key=lambda p: p.checkpoint_id):
        expired += p.ttl_expired
        out.append(
            {
                "checkpoint_id": p.checkpoint_id,
                "t_s": round((p.completed_ms - started_ms) / 1000, 3),
                "state_bytes": p.state_bytes,
                "bytes_written": p.bytes_written,
                "ttl_expired": p.ttl_expired,
                "rows_read": p.rows_before,
                "state_keys": None if p.rows_before is None else p.rows_before - expired,
            }
        )
    return out


def _mean_between(
    series: Sequence[dict[str, Any]], field: str, lo: float, hi: float
) -> float | None:
    values = [float(s[field]) for s in series if lo <= s["t_s"] <= hi and s[field] is not None]
    return statistics.fmean(values) if values else None


def growth(series: Sequence[dict[str, Any]], field: str, duration_s: float) -> dict[str, Any]:
    """Flat or growing (see the module docstring): *field*'s mean over the middle tenth
    (``mid``) and the last tenth (``end``) of a run of *duration_s*, their ratio, and the
    least-squares slope per minute over the second half (``slope_per_min``) with that slope
    relative to ``end`` (``slope_per_min_of_end``), and the mean over the second half
    (``second_half``: steadier than ``end`` for a series with spikes, such as the bytes
    written, where a checkpoint now and then writes a full blob)."""
    mid = _mean_between(series, field, 0.45 * duration_s, 0.55 * duration_s)
    end = _mean_between(series, field, 0.9 * duration_s, float("inf"))
    half = [
        (float(s["t_s"]), float(s[field]))
        for s in series
        if s["t_s"] >= duration_s / 2 and s[field] is not None
    ]
    slope: float | None = None
    if len(half) >= 2 and len({t for t, _ in half}) >= 2:
        slope = statistics.linear_regression([t for t, _ in half], [v for _, v in half]).slope * 60
    return {
        "mid": mid,
        "end": end,
        "second_half": statistics.fmean(v for _, v in half) if half else None,
        "end_over_mid": end / mid if end is not None and mid else None,
        "slope_per_min": slope,
        "slope_per_min_of_end": slope / end if slope is not None and end else None,
    }

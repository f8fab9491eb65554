"""Charts of a pipeline's checkpoints over time, drawn as SVG on the server: end-to-end
duration (failed checkpoints marked) and size (full state against what each checkpoint
wrote).

Drawn here rather than in the browser so that the page and the notebook view
(:mod:`spark_ckpt.monitoring.notebook`) show the same picture from the same code, with no
charting library to ship and nothing for the page to fetch but the server's API. A chart's
text is O(history records).

What the axes promise (as the PNG of ``spark-ckpt stats --plot``): time in UTC at whole
steps (``14:41:50``, ``14:42``; the date where it changes); every y axis starts at zero,
reaches a little above the largest value, and ticks at 1-2-5 steps in a readable unit.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from spark_ckpt.monitoring.units import DURATION_UNITS, SIZE_UNITS, Unit, unit_for
from spark_ckpt.storage.history import CheckpointRecord

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 40
#: Time steps a time axis may tick at, in seconds.
TIME_STEPS_S = (
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
)
COLORS = {
    "completed": "#1f77b4",
    "full": "#1f77b4",
    "savepoint": "#ff7f0e",
    "failed": "#d62728",
    "written": "#2ca02c",
}


@dataclass(frozen=True)
class Point:
    """A value at a time (epoch ms); *kind* colours it (see :data:`COLORS`)."""

    t_ms: int
    value: float
    kind: str
    label: str


def _nice_step(span: float, ticks: int = 5) -> float:
    """A 1-2-5 step giving about *ticks* ticks over *span*."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    base = 10 ** math.floor(math.log10(raw))
    return float(next(m * base for m in (1, 2, 5, 10) if m * base >= raw))


def time_ticks(t0_ms: int, t1_ms: int, ticks: int = 6) -> list[tuple[int, str]]:
    """Tick positions (epoch ms) and labels between *t0_ms* and *t1_ms*: whole steps of
    :data:`TIME_STEPS_S`, labels ``HH:MM:SS`` below a minute step, else ``HH:MM``, the date
    (``Nov 30``) on the first tick and where the day changes."""
    span_s = max(1.0, (t1_ms - t0_ms) / 1000)
    step = next((s for s in TIME_STEPS_S if span_s / s <= ticks), TIME_STEPS_S[-1])
    while span_s / step > ticks:
        step *= 2
    first = math.ceil(t0_ms / 1000 / step) * step
    out: list[tuple[int, str]] = []
    previous_day = None
    t = first
    while t * 1000 <= t1_ms:
        moment = datetime.fromtimestamp(t, tz=UTC)
        label = moment.strftime("%H:%M:%S" if step < 60 else "%H:%M")
        if moment.date() != previous_day:
            label = f"{moment.strftime('%b')} {moment.day} {label}"
            previous_day = moment.date()
        out.append((t * 1000, label))
        t += step
    return out


def line_chart(
    title: str,
    series: Sequence[Sequence[Point]],
    units: Sequence[Unit],
    now_ms: int | None = None,
) -> str:
    """An SVG chart of *series* (each a line through its points, in time order) over a UTC
    time axis, values in the largest of *units* the largest value reaches. Without points:
    the frame and "no checkpoints yet"."""
    points = [p for s in series for p in s]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">',
        "<style>text{font:11px sans-serif;fill:#333}.grid{stroke:#e5e5e5}"
        ".axis{stroke:#888}</style>",
        f'<text x="{LEFT}" y="16" style="font-weight:bold">{escape(title)}</text>',
    ]
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, TOP
    parts.append(f'<line class="axis" x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}"/>')
    parts.append(f'<line class="axis" x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}"/>')
    if not points:
        parts.append(
            f'<text x="{(x0 + x1) // 2 - 50}" y="{(y0 + y1) // 2}">no checkpoints yet</text></svg>'
        )
        return "".join(parts)
    t0 = min(p.t_ms for p in points)
    t1 = max([p.t_ms for p in points] + ([now_ms] if now_ms else []))
    if t1 - t0 < 10_000:  # a lone point, or a few close together: ten seconds of axis
        t0, t1 = t0 - 5_000, t0 + 5_000
    pad = (t1 - t0) * 0.03
    t0, t1 = int(t0 - pad), int(t1 + pad)
    largest = max(p.value for p in points)
    unit_name, scale = unit_for(largest, units)
    step = _nice_step(largest / scale * 1.15 if largest > 0 else 1.0)
    top = step * math.ceil((largest / scale * 1.15 if largest > 0 else 1.0) / step)

    def x(t: float) -> float:
        return x0 + (t - t0) / (t1 - t0) * (x1 - x0)

    def y(v: float) -> float:
        return y0 - (v / scale) / top * (y0 - y1)

    tick = 0.0
    while tick <= top + step / 2:
        yy = y0 - tick / top * (y0 - y1)
        parts.append(f'<line class="grid" x1="{x0}" y1="{yy:.1f}" x2="{x1}" y2="{yy:.1f}"/>')
        parts.append(
            f'<text x="{x0 - 6}" y="{yy + 4:.1f}" text-anchor="end">{_tick_text(tick)}</text>'
        )
        tick += step
    parts.append(
        f'<text x="12" y="{(y0 + y1) / 2:.0f}" transform="rotate(-90 12 {(y0 + y1) / 2:.0f})" '
        f'text-anchor="middle">{unit_name}</text>'
    )
    for t, label in time_ticks(t0, t1):
        xx = x(t)
        parts.append(f'<line class="axis" x1="{xx:.1f}" y1="{y0}" x2="{xx:.1f}" y2="{y0 + 4}"/>')
        parts.append(f'<text x="{xx:.1f}" y="{y0 + 16}" text-anchor="middle">{label}</text>')
    parts.append(f'<text x="{x1}" y="{HEIGHT - 6}" text-anchor="end">UTC</text>')
    for s in series:
        ordered = sorted(s, key=lambda p: p.t_ms)
        lined = [p for p in ordered if p.kind != "failed"]
        if len(lined) > 1:
            kind = Counter(p.kind for p in lined).most_common(1)[0][0]  # savepoints: marks
            color = COLORS.get(kind, "#333")
            # a second series over the first (bytes written equal the full size when every
            # key changed) stays visible dashed
            dash = ' stroke-dasharray="5 3"' if kind == "written" else ""
            path = " ".join(f"{x(p.t_ms):.1f},{y(p.value):.1f}" for p in lined)
            parts.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} points="{path}"/>'
            )
        for p in ordered:
            color = COLORS.get(p.kind, "#333")
            cx, cy = x(p.t_ms), y(p.value)
            tip = f"<title>{escape(p.label)}</title>"
            if p.kind == "failed":
                parts.append(
                    f'<g stroke="{color}" stroke-width="2">{tip}<line x1="{cx - 4:.1f}" '
                    f'y1="{cy - 4:.1f}" x2="{cx + 4:.1f}" y2="{cy + 4:.1f}"/><line '
                    f'x1="{cx - 4:.1f}" y1="{cy + 4:.1f}" x2="{cx + 4:.1f}" y2="{cy - 4:.1f}"/></g>'
                )
            else:
                r = 4 if p.kind == "savepoint" else 2.5
                parts.append(
                    f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r}" fill="{color}">{tip}</circle>'
                )
    parts.append(_legend({p.kind for p in points}))
    parts.append("</svg>")
    return "".join(parts)


_LEGEND = {
    "completed": "checkpoint",
    "full": "full size",
    "savepoint": "savepoint",
    "failed": "failed",
    "written": "written",
}


def _legend(kinds: set[str]) -> str:
    items = [k for k in _LEGEND if k in kinds]
    out, xx = [], WIDTH - RIGHT - 90 * len(items)
    for kind in items:
        out.append(
            f'<circle cx="{xx}" cy="12" r="4" fill="{COLORS[kind]}"/>'
            f'<text x="{xx + 8}" y="16">{_LEGEND[kind]}</text>'
        )
        xx += 90
    return "".join(out)


def _tick_text(value: float) -> str:
    return f"{value:g}" if value < 1e6 else f"{value:.3g}"


def _kind(record: CheckpointRecord) -> str:
    if record.failure is not None:
        return "failed"
    return "savepoint" if record.is_savepoint else "completed"


def duration_chart(records: Sequence[CheckpointRecord], now_ms: int | None = None) -> str:
    """End-to-end duration of each finished checkpoint (a failed one: until it failed),
    over its trigger time."""
    points = [
        Point(
            r.figures.trigger_ms,
            float(r.figures.end_to_end_ms),
            _kind(r),
            f"#{r.checkpoint_id} {r.figures.end_to_end_ms} ms"
            + (f" {r.reason}" if r.failure is not None else ""),
        )
        for r in records
    ]
    return line_chart(
        "End-to-end duration",
        [
            [p for p in points if p.kind == "completed"],
            [p for p in points if p.kind != "completed"],
        ],
        DURATION_UNITS,
        now_ms,
    )


def size_chart(records: Sequence[CheckpointRecord], now_ms: int | None = None) -> str:
    """Full state size and bytes written of each completed checkpoint, over its trigger
    time."""
    done = [r for r in records if r.stats is not None]
    full = [
        Point(
            r.figures.trigger_ms,
            float(r.figures.state_bytes),
            "savepoint" if r.is_savepoint else "full",
            f"#{r.checkpoint_id} full {r.figures.state_bytes} B",
        )
        for r in done
    ]
    written = [
        Point(
            r.figures.trigger_ms,
            float(r.figures.bytes_written),
            "written",
            f"#{r.checkpoint_id} written {r.figures.bytes_written} B",
        )
        for r in done
    ]
    return line_chart("State size (full) and bytes written", [full, written], SIZE_UNITS, now_ms)

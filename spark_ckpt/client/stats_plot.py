"""A picture of a pipeline's checkpoint statistics history over time: duration, state size
and bytes written, and alignment of every checkpoint and savepoint the history holds
(savepoints marked), and when checkpoints failed or were aborted; for a pipeline that keeps
time, a fourth panel of what each checkpoint counted (late and dropped rows, timers fired,
TTL-expired entries).

Used by ``spark-ckpt stats --plot FILE.png`` and notebooks. Reads only the pipeline's root
(the statistics history, through :class:`~spark_ckpt.client.pipeline_client.PipelineClient`), so it
shows up to ``checkpoint.history`` checkpoints however few ``checkpoint.retained`` keeps.
Draws with matplotlib's non-interactive Agg backend, so it works on a server without a
display.

What the axes promise: the time axis is UTC with concise labels (matplotlib's
``ConciseDateFormatter``: ``14:41:47``, with the date where it changes, never
``41:47.500000``); every y axis starts at zero and reaches a little above the largest value,
with plain tick labels (no offset), so a 0.1 % wobble of the state size looks like one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spark_ckpt.errors import ConfigError, EnvironmentSetupError
from spark_ckpt.monitoring.units import SIZE_UNITS, unit_for

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from spark_ckpt.client.pipeline_client import PipelineClient
    from spark_ckpt.storage.history import CheckpointRecord

#: File types the plot can be written as (by extension).
PLOT_FORMATS = (".png", ".svg", ".pdf")

#: Headroom above the largest value of a panel (fraction of it).
HEADROOM = 0.15

#: ConciseDateFormatter's formats per tick level (years, months, days, hours, minutes,
#: seconds), with whole clock times where its defaults give bare or fractional seconds.
_TICK_FORMATS = ["%Y", "%b", "%d", "%H:%M", "%H:%M", "%H:%M:%S"]
_ZERO_FORMATS = ["", "%Y", "%b", "%b-%d", "%H:%M", "%H:%M:%S"]


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend; an
    :class:`EnvironmentSetupError` naming the ``plot`` extra when matplotlib is not
    installed (it is optional)."""
    try:
        import matplotlib
    except ImportError as e:
        raise EnvironmentSetupError(
            "drawing checkpoint statistics needs matplotlib, an optional dependency: "
            "pip install 'spark-ckpt[plot]'"
        ) from e

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _from_zero(ax: Axes, values: Sequence[float]) -> None:
    """The y axis of *ax* from 0 to :data:`HEADROOM` above the largest of *values* (1 when
    all are 0 or there are none), with plain tick labels."""
    top = max(values, default=0.0)
    ax.set_ylim(0, top * (1 + HEADROOM) if top > 0 else 1)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)


def checkpoint_stats_figure(records: Sequence[CheckpointRecord], title: str) -> Figure:
    """The figure of *records* (a statistics history, see
    :meth:`~spark_ckpt.client.pipeline_client.PipelineClient.history`): three panels over the time
    each checkpoint ended — end-to-end duration (ms), state size and bytes written (a binary unit
    chosen by the largest value), max alignment (ms). Checkpoints are dots, savepoints squares;
    failed checkpoints are red crosses and aborted ones grey crosses on the duration panel. Axes as
    the module docstring promises. The caller closes the figure."""
    plt = _pyplot()
    import matplotlib.dates as mdates

    from spark_ckpt.runtime.failure import is_aborted

    completed = [r for r in records if r.stats is not None]
    timed = any(r.figures.task_time for r in completed)
    fig: Figure
    fig, axes = plt.subplots(4 if timed else 3, 1, figsize=(9, 10.5 if timed else 8), sharex=True)
    duration, size, alignment = axes[:3]
    bottom = axes[-1]
    unit, scale = unit_for(
        max((max(r.figures.state_bytes, r.figures.bytes_written) for r in completed), default=0),
        SIZE_UNITS,
    )
    heights: dict[str, list[float]] = {"duration": [], "size": [], "alignment": [], "time": []}
    for savepoint, marker, label in ((False, "o", "checkpoint"), (True, "s", "savepoint")):
        group = [r.figures for r in completed if r.is_savepoint == savepoint]
        if not group:
            continue
        times = [_time(s.completed_ms) for s in group]
        durations = [float(s.end_to_end_ms) for s in group]
        states = [s.state_bytes / scale for s in group]
        written = [s.bytes_written / scale for s in group]
        aligned = [float(s.max_alignment_ms) for s in group]
        duration.plot(times, durations, marker, label=label)
        size.plot(times, states, marker, label=f"{label} state")
        size.plot(times, written, marker, mfc="none", label=f"{label} written")
        alignment.plot(times, aligned, marker, label=label)
        heights["duration"] += durations
        heights["size"] += states + written
        heights["alignment"] += aligned
    failures = [r.failure for r in records if r.failure is not None]
    for aborted, color, label in ((False, "red", "failed"), (True, "grey", "aborted")):
        group_f = [f for f in failures if is_aborted(f) == aborted]
        if group_f:
            durations = [float(f.duration_ms) for f in group_f]
            duration.plot(
                [_time(f.failed_ms) for f in group_f], durations, "x", color=color, label=label
            )
            heights["duration"] += durations
    panels = [(duration, "duration"), (size, "size"), (alignment, "alignment")]
    if timed:
        _time_panel(axes[3], completed, heights["time"])
        panels.append((axes[3], "time"))
    duration.set_ylabel("duration (ms)")
    size.set_ylabel(f"size ({unit})")
    alignment.set_ylabel("alignment (ms)")
    bottom.set_xlabel("ended (UTC)")
    for ax, name in panels:
        _from_zero(ax, heights[name])
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="upper left", fontsize="small")
    locator = mdates.AutoDateLocator(tz=UTC)  # type: ignore[no-untyped-call]
    bottom.xaxis.set_major_locator(locator)
    concise = mdates.ConciseDateFormatter(  # type: ignore[no-untyped-call]
        locator, tz=UTC, formats=_TICK_FORMATS, zero_formats=_ZERO_FORMATS
    )
    bottom.xaxis.set_major_formatter(concise)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


#: The time counts of the fourth panel: (statistic, legend).
_TIME_COUNTS = (
    ("late_rows", "late rows"),
    ("dropped_rows", "dropped rows"),
    ("timers_fired", "timers fired"),
    ("ttl_expired", "TTL expired"),
)


def _time_panel(ax: Axes, completed: Sequence[CheckpointRecord], heights: list[float]) -> None:
    """Per checkpoint of a pipeline that keeps time, what it counted since the previous one:
    late and dropped rows, timers fired, TTL-expired entries (those that ever moved)."""
    stats = [r.figures for r in completed if r.figures.task_time]
    times = [_time(s.completed_ms) for s in stats]
    for name, label in _TIME_COUNTS:
        values = [float(getattr(s, name)) for s in stats]
        if any(values):
            ax.plot(times, values, ".-", label=label)  # type: ignore[arg-type]
            heights += values
    ax.set_ylabel("per checkpoint")


def plot_checkpoint_stats(root: str, path: str, *, client: PipelineClient | None = None) -> str:
    """Draw the checkpoint statistics history of the pipeline under *root* into *path*
    (``.png``, ``.svg`` or ``.pdf``; see :func:`checkpoint_stats_figure`). Returns *path*.
    Raises :class:`ConfigError` for another extension."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in PLOT_FORMATS:
        raise ConfigError("plot", path, f"a file name ending in {', '.join(PLOT_FORMATS)}")
    from spark_ckpt.client.pipeline_client import PipelineClient

    plt = _pyplot()
    client = client or PipelineClient(root)
    records = client.history()
    fig = checkpoint_stats_figure(records, f"checkpoint history of {client.root}")
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path

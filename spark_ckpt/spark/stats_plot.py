"""A picture of a pipeline's checkpoints over time: duration, state size and alignment of
each retained checkpoint (savepoints marked), and when checkpoints failed.

Used by ``spark-ckpt stats --plot FILE.png`` and notebooks. Reads only the pipeline's root
(through :class:`~spark_ckpt.spark.client.PipelineClient`); draws with matplotlib's
non-interactive Agg backend, so it works on a server without a display.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from spark_ckpt.errors import ConfigError

if TYPE_CHECKING:
    from spark_ckpt.spark.client import PipelineClient

#: File types the plot can be written as (by extension).
PLOT_FORMATS = (".png", ".svg", ".pdf")


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def plot_checkpoint_stats(root: str, path: str, *, client: PipelineClient | None = None) -> str:
    """Draw the checkpoints of the pipeline under *root* into *path* (``.png``, ``.svg`` or
    ``.pdf``): three panels over completion time — end-to-end duration (ms), state size and
    bytes written (KiB), max alignment (ms) — with savepoints as squares and failed or aborted
    checkpoints as red marks on the duration panel. Returns *path*. Raises
    :class:`ConfigError` for another extension."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in PLOT_FORMATS:
        raise ConfigError("plot", path, f"a file name ending in {', '.join(PLOT_FORMATS)}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spark_ckpt.spark.client import PipelineClient

    client = client or PipelineClient(root)
    completed = client.checkpoints()
    failures = client.failures()
    fig, (duration, size, alignment) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for savepoint, marker, label in ((False, "o", "checkpoint"), (True, "s", "savepoint")):
        cps = [c for c in completed if c.is_savepoint == savepoint]
        if not cps:
            continue
        times = [_time(c.stats.completed_ms) for c in cps]
        duration.plot(times, [c.stats.end_to_end_ms for c in cps], marker, label=label)
        size.plot(times, [c.stats.state_bytes / 1024 for c in cps], marker, label=f"{label} state")
        size.plot(
            times, [c.stats.bytes_written / 1024 for c in cps], marker, mfc="none", label="written"
        )
        alignment.plot(times, [c.stats.max_alignment_ms for c in cps], marker, label=label)
    if failures:
        times = [_time(f.failed_ms) for f in failures]
        duration.plot(
            times, [f.duration_ms for f in failures], "x", color="red", label="failed/aborted"
        )
    duration.set_ylabel("duration (ms)")
    size.set_ylabel("size (KiB)")
    alignment.set_ylabel("alignment (ms)")
    alignment.set_xlabel("completed (UTC)")
    for ax in (duration, size, alignment):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="upper left", fontsize="small")
    fig.suptitle(f"checkpoints of {client.root}")
    fig.autofmt_xdate()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path

"""The statistics plot (:mod:`spark_ckpt.client.stats_plot`) without Spark: axes that do not
magnify noise, and readable clock times. The records are made here; the oracles are their
own values."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from spark_ckpt.client.stats_plot import checkpoint_stats_figure, plot_checkpoint_stats
from spark_ckpt.errors import EnvironmentSetupError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint, FailedCheckpoint
from spark_ckpt.protocol.state_handles import CheckpointMetrics
from spark_ckpt.storage.history import CheckpointRecord

T0 = 1_795_000_000_000  # 2026-11-18T11:06:40Z, in ms


def records(step_ms: int, n: int = 20) -> list[CheckpointRecord]:
    """*n* completed checkpoints *step_ms* apart whose state size wobbles by under 0.1 %
    around 1956 KiB (the noise the issue saw magnified), one savepoint and two failures."""
    out = []
    for i in range(n):
        metrics = {"op#0": CheckpointMetrics(alignment_ms=3 + i % 2)}
        stats = CheckpointStats(
            T0 + i * step_ms,
            T0 + i * step_ms + 40 + i % 5,
            2_003_000 + (i % 3) * 900,
            9_000,
            task_metrics=metrics,
        )
        kind = SnapshotType.SAVEPOINT if i == n // 2 else SnapshotType.CHECKPOINT
        out.append(CheckpointRecord.completed(CompletedCheckpoint(i, kind, (), stats)))
    out.append(
        CheckpointRecord.failed(
            FailedCheckpoint(n, SnapshotType.CHECKPOINT, T0, T0 + 600, "expired")
        )
    )
    out.append(
        CheckpointRecord.failed(
            FailedCheckpoint(n + 1, SnapshotType.CHECKPOINT, T0, T0 + 90, "subsumed")
        )
    )
    return out


@pytest.mark.parametrize("step_ms", [500, 1_000, 60_000, 3_600_000])
def test_every_y_axis_starts_at_zero_and_holds_every_value(step_ms: int) -> None:
    recs = records(step_ms)
    fig = checkpoint_stats_figure(recs, "t")
    try:
        fig.canvas.draw()
        duration, size, alignment = fig.axes
        completed = [r.stats for r in recs if r.stats is not None]
        largest = {
            duration: max([s.end_to_end_ms for s in completed] + [600, 90]),
            size: max(s.state_bytes for s in completed) / 1024**2,  # MiB: 1.9 MiB
            alignment: max(s.max_alignment_ms for s in completed),
        }
        assert size.get_ylabel() == "size (MiB)"
        for ax, top in largest.items():
            low, high = ax.get_ylim()
            assert low == 0, ax.get_ylabel()
            assert top <= high <= 1.5 * top, (ax.get_ylabel(), high, top)
            assert ax.yaxis.get_offset_text().get_text() == ""  # no "+1.956e3" offset
        # the 0.1 % wobble of the state size spans under 1 % of the size axis
        states = [s.state_bytes / 1024**2 for s in completed]
        assert (max(states) - min(states)) / size.get_ylim()[1] < 0.01
        labels = [t.get_text() for t in alignment.get_xticklabels()]
        assert labels and all(labels)
        assert not any(re.search(r"\.\d{3,}", text) for text in labels), labels
        if step_ms <= 60_000:  # clock times of the day, as HH:MM:SS or HH:MM
            assert all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", t) for t in labels), labels
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_an_empty_history_draws_empty_axes(tmp_path: Path) -> None:
    fig = checkpoint_stats_figure([], "empty")
    try:
        assert all(ax.get_ylim() == (0, 1) for ax in fig.axes)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_plot_checkpoint_stats_refuses_other_file_types(tmp_path: Path) -> None:
    from spark_ckpt.errors import ConfigError

    with pytest.raises(ConfigError, match=r"\.png"):
        plot_checkpoint_stats(str(tmp_path), str(tmp_path / "x.gif"))


def test_without_matplotlib_the_plot_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(EnvironmentSetupError, match=r"pip install 'spark-ckpt\[plot\]'"):
        plot_checkpoint_stats(str(tmp_path / "root"), str(tmp_path / "x.png"))
    with pytest.raises(EnvironmentSetupError, match="matplotlib"):
        checkpoint_stats_figure(records(1000), "t")
    assert not (tmp_path / "x.png").exists()


def test_a_pipeline_that_keeps_time_gets_a_panel_of_its_counts() -> None:
    from spark_ckpt.protocol.state_handles import TimeMetrics

    recs = []
    for i in range(6):
        time = {"chain#0": TimeMetrics(T0, T0, late_rows=i, timers_fired=10 * i, ttl_expired=3)}
        stats = CheckpointStats(T0 + i * 1000, T0 + i * 1000 + 50, 100, 100, task_time=time)
        recs.append(
            CheckpointRecord.completed(CompletedCheckpoint(i, SnapshotType.CHECKPOINT, (), stats))
        )
    fig = checkpoint_stats_figure(recs, "t")
    try:
        fig.canvas.draw()
        *_, counts = fig.axes
        assert len(fig.axes) == 4 and counts.get_ylabel() == "per checkpoint"
        legend = [t.get_text() for t in counts.get_legend().get_texts()]
        assert legend == ["late rows", "timers fired", "TTL expired"]  # those that moved
        assert counts.get_ylim()[0] == 0 and counts.get_ylim()[1] >= 50
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    untimed = checkpoint_stats_figure(records(1000), "t")
    try:
        assert len(untimed.axes) == 3  # no time: no panel
    finally:
        import matplotlib.pyplot as plt

        plt.close(untimed)

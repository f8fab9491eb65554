"""Statistics that outlive retention, on real Spark and real Delta: a pipeline that keeps one
checkpoint completes many; afterwards the statistics history holds every one of them.

The main job (``python -m spark_ckpt.demo``) runs in a subprocess with ``--retained 1`` and
``--available-now`` over a backlog read in small micro-batches, so it completes several
checkpoints and ends with a final one. The oracle is read from outside the history code:
every ``completed`` row ever added to the ``checkpoints`` table, from the Delta log's add
actions and their data files (retention removes those rows, but Delta keeps the files
until a vacuum)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from spark_ckpt.client.pipeline_client import PipelineClient
from spark_ckpt.client.stats_plot import checkpoint_stats_figure
from spark_ckpt.testing.jobs import DemoArgs, DemoLauncher

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def committed_ids(table: Path) -> list[int]:
    """Every checkpoint id ever committed as ``completed`` to the ``checkpoints`` table, from
    the Delta log by hand (add actions, then their Parquet files)."""
    ids: set[int] = set()
    for log_file in sorted((table / "_delta_log").glob("*.json")):
        for line in log_file.read_text().splitlines():
            if not line.strip():
                continue
            add = json.loads(line).get("add")
            if add is None:
                continue
            rows = pq.read_table(table / add["path"], columns=["record", "checkpoint_id"])
            for record, cid in zip(
                rows["record"].to_pylist(), rows["checkpoint_id"].to_pylist(), strict=True
            ):
                if record == "completed":
                    ids.add(int(cid))
    return sorted(ids)


def test_the_history_holds_every_checkpoint_of_a_run_that_retains_one(tmp_path: Path) -> None:
    launcher = DemoLauncher(tmp_path)
    args = DemoArgs(
        root=tmp_path / "root",
        output=tmp_path / "out",
        pipeline="history",
        backlog="3000",
        channels=2,
        keys=20,
        interval="200ms",
        max_rows_per_trigger=100,
        available_now=True,
        retained=1,
        restarts=0,
    )
    run = launcher.start(args)
    try:
        assert run.wait(600) == 0, run.tail()
    finally:
        assert launcher.cleanup() == []
    root = args.root
    expected = committed_ids(root / "checkpoints")
    client = PipelineClient(str(root))  # fresh: knows nothing of the run
    retained = client.checkpoints()
    assert len(expected) > 3 > len(retained), (expected, retained)  # more than retention keeps
    history = client.history()
    completed = [r.checkpoint_id for r in history if r.failure is None]
    assert completed == expected
    assert len(history) <= 100  # the default bound
    by_id = {r.checkpoint_id: r for r in history}
    for cp in retained:  # the figures are the checkpoint's own
        assert by_id[cp.checkpoint_id].stats == cp.stats
    # the table itself: at most the bound, one row per record, readable by delta-rs
    rows = DeltaTable(str(root / "checkpoint_history")).to_pyarrow_table()
    assert rows.num_rows <= 100
    assert sorted(rows["checkpoint_id"].to_pylist()) == [r.checkpoint_id for r in history]
    summary = client.stats()
    assert summary.total == len(history)
    assert summary.checkpoints + summary.savepoints == len(expected)

    # the CLI: its count equals its rows, and the plot is drawn
    script = Path(sys.executable).parent / "spark-ckpt"
    plot = tmp_path / "stats.png"
    done = subprocess.run(
        [str(script), "stats", "--root", str(root), "--plot", str(plot)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    header, table = done.stdout.split("\n", 1)
    assert header.startswith(f"{len(history)} checkpoints on record: {len(expected)} completed")
    first_table = table.split("\n\n")[0].split("plot written to")[0]
    body = [line for line in first_table.splitlines()[2:] if line.strip()]
    assert [int(line.split()[0]) for line in body] == [r.checkpoint_id for r in history]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = checkpoint_stats_figure(history, "t")
    try:
        assert all(ax.get_ylim()[0] == 0 for ax in fig.axes)
        durations = [by_id[i].figures.end_to_end_ms for i in expected]
        assert fig.axes[0].get_ylim()[1] >= max(durations)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)

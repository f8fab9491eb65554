"""Statistics that last, on real Spark and real Delta: a checkpoint that fails while the
pipeline runs is on record after the pipeline stopped, for a client that never saw the run.

The main job runs in a subprocess with fail points in its components
(``python -m spark_ckpt.testing.faulty_job``); the
``store-commit`` fail point, armed for one hit before the job starts, makes the completion
commit of its first fully acknowledged checkpoint fail (FINALIZE_FAILED, counted against 3
tolerable failures). The job goes on, completes later checkpoints, and is stopped; then a
fresh :class:`~spark_ckpt.client.pipeline_client.PipelineClient` reads the failure back from the
checkpoint store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spark_ckpt.client.pipeline_client import PipelineClient
from spark_ckpt.testing import faults
from spark_ckpt.testing.jobs import DemoArgs, DemoLauncher

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: Liveness bound (never an assertion about speed).
STEP_TIMEOUT_S = 240.0


def test_a_failed_checkpoint_is_on_record_after_the_pipeline_stopped(tmp_path: Path) -> None:
    launcher = DemoLauncher(tmp_path)
    args = DemoArgs(
        root=tmp_path / "root",
        output=tmp_path / "out",
        pipeline="failures",
        backlog="20000",
        channels=2,
        keys=20,
        interval="500ms",
        max_rows_per_trigger=100,
        tolerable_failures=3,
        restarts=0,
    )
    root = str(args.root)
    faults.arm(root, faults.Fault.STORE_COMMIT, faults.Action.RAISE, times=1, error="store")
    run = launcher.start(args)
    try:
        launcher.wait_until(
            run,
            lambda: len(faults.hits(root, faults.Fault.STORE_COMMIT)) == 1,
            STEP_TIMEOUT_S,
            "the failing completion commit",
        )
        # a checkpoint completes after the failed one: the job tolerated the failure
        launcher.wait_until(
            run,
            lambda: (
                bool(PipelineClient(root).failures())
                and (PipelineClient(root).latest() is not None)
            ),
            STEP_TIMEOUT_S,
            "a completed checkpoint after the failure",
        )
        script = Path(sys.executable).parent / "spark-ckpt"
        done = subprocess.run(
            [str(script), "stop", "--root", root, "--timeout", "180"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr + run.tail()
        assert run.wait(120) == 0, run.tail()
    finally:
        assert launcher.cleanup() == []

    client = PipelineClient(root)  # fresh: knows nothing of the run
    [failed] = [f for f in client.failures() if f.reason == "finalize_failed"]
    assert "injected fault store-commit" in failed.message, failed
    assert failed.trigger_ms <= failed.failed_ms
    # every task had acknowledged before the commit failed: their figures are on record
    assert failed.task_metrics, failed
    assert all(m.sync_ms >= 0 and m.async_ms >= 0 for m in failed.task_metrics.values())
    completed = client.checkpoints()
    assert completed and completed[-1].checkpoint_id > failed.checkpoint_id
    assert failed.checkpoint_id not in {c.checkpoint_id for c in completed}
    stats = client.stats()
    assert stats.failures.get("finalize_failed") == 1, stats.failures
    assert stats.last_failure is not None
    assert stats.last_failure == client.failures()[-1]

"""Per-run files and the picklable foreachBatch function."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from spark_ckpt.coordination.runs import (
    RestorePoint,
    RunFiles,
    Runs,
    RunState,
    RunStatus,
    SkippedCheckpoint,
)
from spark_ckpt.errors import ProtocolError
from spark_ckpt.runtime.operator import RunningCount
from spark_ckpt.spark.driver.foreach_batch import ForeachBatchFunction
from spark_ckpt.spark.subtask_spec import AlignerSpec


def test_run_files_round_trip(tmp_path: Path) -> None:
    files = RunFiles(str(tmp_path), "run-1")
    assert files.restore_point() is None and files.status() is None and files.fatal() is None
    point = RestorePoint(7, (SkippedCheckpoint(9, "checksum mismatch"),))
    files.write_restore_point(point)
    assert files.restore_point() == point
    status = RunStatus("run-1", "driver", RunState.STOPPED, 2, 123, 7, "req", None)
    files.write_status(status)
    assert files.status() == status
    files.write_aborted(range(100))
    assert files.aborted() == list(range(36, 100))  # the newest ABORTED_KEPT
    files.write_fatal("FencedError: x")
    assert files.fatal() == "FencedError: x"


def test_newest_lease_across_runs(tmp_path: Path) -> None:
    RunFiles(str(tmp_path), "a").write_lease(3)
    RunFiles(str(tmp_path), "b").write_lease(5)
    RunFiles(str(tmp_path), "c")  # no lease yet
    newest = Runs(str(tmp_path)).newest_lease()
    assert newest is not None and (newest.run_id, newest.epoch) == ("b", 5)


@pytest.mark.parametrize("run_id", ["", "a/b", ".."])
def test_invalid_run_ids_are_refused(tmp_path: Path, run_id: str) -> None:
    with pytest.raises(ProtocolError):
        RunFiles(str(tmp_path), run_id)


def test_the_foreach_batch_function_pickles_without_its_runtime(tmp_path: Path) -> None:
    spec = AlignerSpec(
        root=str(tmp_path),
        pipeline="p",
        run_id="r",
        operators=(RunningCount(),),
        channels=2,
        output=str(tmp_path / "out"),
    )
    function = ForeachBatchFunction(spec)
    copy = pickle.loads(pickle.dumps(function))
    assert (
        copy.aligner is None and copy.spec.run_id == "r" and copy.spec.operators[0].uid == "counter"
    )
    with pytest.raises(ProtocolError, match="no restore point"):
        copy.runtime()  # the run's coordinator has not published where to restore from


def test_prune_keeps_the_newest_ended_runs_and_every_live_one(tmp_path: Path) -> None:
    root = str(tmp_path)
    states = [RunState.STOPPED, RunState.RUNNING, RunState.FAILED, RunState.FINISHED]
    for i, state in enumerate(states):
        RunFiles(root, f"r{i}").write_status(RunStatus(f"r{i}", "d", state, 1, 100 + i))
    RunFiles(root, "no-status").write_lease(1)
    assert Runs(root).prune(keep=1) == ["r0", "r2"]
    assert Runs(root).ids() == ["no-status", "r1", "r3"]

"""``committed.json``: the run's coordinator records each checkpoint whose output the sink
committed (and, at its start, the restore point recovery committed), and the subtasks on the
executors learn of completions from it before each micro-batch. The coordinator's host on a
real Delta store, driven poll by poll (no Spark)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from coordinator_hosts import SUBTASKS, run_host, started_host

from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.runs import COMMITTED_FILE, RunFiles, new_run_id
from spark_ckpt.errors import StoreError
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import AcknowledgeCheckpoint, TaskStateHandle
from spark_ckpt.spark.executors.subtask_function import _notify_committed


def test_each_completion_and_the_restore_point_are_recorded_for_the_run(tmp_path: Path) -> None:
    root = str(tmp_path)
    host, clock, run_id = started_host(root)
    assert RunFiles(root, run_id).committed() == 1
    clock.advance(60)
    [barrier] = host.poll()
    for task in SUBTASKS:
        ack = AcknowledgeCheckpoint(barrier.checkpoint_id, task, TaskStateHandle(task))
        Mailbox(root, run_id).post(ack)
    host.poll(tick=False)
    assert RunFiles(root, run_id).committed() == barrier.checkpoint_id
    host.shutdown()

    again, next_run = run_host(root, ManualClock(clock.now_ms()))
    restored = again.start_run()
    assert restored is not None
    assert RunFiles(root, next_run).committed() == restored.checkpoint_id


class RecordingTask:
    """What :func:`_notify_committed` uses of a subtask's task."""

    def __init__(self, acknowledged: list[int]) -> None:
        self.sink = SimpleNamespace()
        self.acknowledged = acknowledged
        self.notified: list[tuple[int, Any]] = []

    def sealed_transactions(self) -> list[object]:
        return []

    def acknowledged_checkpoints(self) -> list[int]:
        return self.acknowledged

    def notify_complete(self, checkpoint_id: int, sink_committed: int | None = None) -> None:
        self.notified.append((checkpoint_id, sink_committed))


def test_a_subtask_learns_of_completions_from_the_record(tmp_path: Path) -> None:
    run = RunFiles(str(tmp_path), new_run_id())
    waiting = RecordingTask([7])
    _notify_committed(waiting, run)  # type: ignore[arg-type]
    assert waiting.notified == []  # nothing committed yet
    run.write_committed(7)
    _notify_committed(waiting, run)  # type: ignore[arg-type]
    assert waiting.notified == [(7, 7)]
    idle = RecordingTask([])
    _notify_committed(idle, run)  # type: ignore[arg-type]
    assert idle.notified == []  # awaits nothing: reads nothing


def test_a_damaged_record_is_a_store_error(tmp_path: Path) -> None:
    run = RunFiles(str(tmp_path), new_run_id())
    run.write_committed(3)
    path = next(tmp_path.rglob(COMMITTED_FILE))
    path.write_text('{"checkpoint": 3}')
    with pytest.raises(StoreError, match="malformed completion record"):
        run.committed()

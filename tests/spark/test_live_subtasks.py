"""The subtasks a Python worker keeps alive between micro-batches: a worker continues its
task only at the fence Spark kept for the subtask (else it catches up by the changelog, or
a new task rebuilds), never after a failed micro-batch, and a root's newer run drops its
older runs' tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from spark_ckpt.spark.executors.changelog import SubtaskChangelog
from spark_ckpt.spark.executors.executor_cache import CacheKey, Fence
from spark_ckpt.spark.executors.subtask_function import HIT, LiveSubtask, LiveSubtasks, _resume


class StandInTask:
    """What the registry needs of a task: it can be closed (counted)."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def live(batch: int, token: str) -> LiveSubtask:
    task = cast(Any, StandInTask())
    return LiveSubtask(task, writer=None, batch_id=batch, token=token, segment=None)


KEY = CacheKey("/root", "run-1", 0)


def test_a_worker_continues_its_task_only_at_the_fence(tmp_path: Path) -> None:
    empty = SubtaskChangelog(str(tmp_path), "run-1", 0)
    registry = LiveSubtasks()
    kept = live(4, "a")
    registry.keep(KEY, kept)
    taken = registry.take(KEY)
    assert taken is kept
    resumed = _resume(taken, KEY, Fence("run-1", 4, "a", "exec-1"), empty)
    assert resumed is not None and resumed[0] is kept.task and resumed[2] == HIT
    # taken out while the micro-batch runs: a failure half-way leaves nothing behind
    assert registry.take(KEY) is None
    for fence in (
        None,  # no fence: the run's first micro-batch restores
        Fence("run-1", 4, "b", "exec-1"),  # another attempt of the micro-batch won
        Fence("run-1", 5, "c", "exec-2"),  # another worker ran a later micro-batch
        Fence("run-2", 4, "a", "exec-1"),  # another run
    ):
        assert _resume(kept, KEY, fence, empty) is None  # no changelog to catch up by


def test_a_newer_run_of_a_root_drops_the_older_runs() -> None:
    registry = LiveSubtasks()
    old = [live(1, "a"), live(1, "a")]
    other = live(1, "a")
    registry.keep(KEY, old[0])
    registry.keep(CacheKey("/other", "run-9", 0), other)
    registry.keep(CacheKey("/root", "run-1", 1), old[1])
    assert len(registry) == 3
    newer = live(1, "b")
    registry.keep(CacheKey("/root", "run-2", 0), newer)
    assert len(registry) == 2  # the other root's subtask stays
    assert registry.take(KEY) is None
    # the dropped tasks were let go in order (closed once), the kept ones not
    assert [t.task.closed for t in (*old, other, newer)] == [1, 1, 0, 0]
    registry.close()  # the host ends: every task it kept is closed
    assert len(registry) == 0 and [t.task.closed for t in (other, newer)] == [1, 1]

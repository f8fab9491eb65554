"""The executors' asynchronous snapshot phase (:mod:`spark_ckpt.spark.executors.snapshot_threads`):
it runs off the task in a reused Python worker, every changelog segment names its writer and what it
was still writing, and a lost writer's checkpoints are declined."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from typing import Any

import pyarrow as pa
import pytest

from spark_ckpt.coordination.host import CoordinatorHost
from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.runs import new_run_id
from spark_ckpt.coordination.topology import SinkSpec, Topology, write_topology
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import (
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    TaskId,
    TaskStateHandle,
)
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.subtask_image import FULL, SubtaskImage
from spark_ckpt.runtime.task import CHAIN_VERTEX, AsyncPhase
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.spark.executors.changelog import SubtaskChangelog
from spark_ckpt.spark.executors.executor_cache import CacheKey
from spark_ckpt.spark.executors.snapshot_threads import (
    WRITER,
    ExecutorSnapshots,
    LostWriterScan,
    Writer,
    decline_lost_writes,
)
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

KEY = CacheKey("/root", "run-1", 0)


def test_inline_unless_spark_reuses_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_REUSE_WORKER", raising=False)
    assert ExecutorSnapshots().run_async(KEY) is None
    monkeypatch.setenv("SPARK_REUSE_WORKER", "0")
    assert ExecutorSnapshots().run_async(KEY) is None
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    assert ExecutorSnapshots().run_async(KEY) is not None


def test_writes_run_on_the_thread_in_order_and_are_named_while_they_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    snapshots = ExecutorSnapshots()
    run_async = snapshots.run_async(KEY)
    assert run_async is not None
    gate = threading.Event()
    ran: list[tuple[int, str]] = []

    def write(cid: int) -> AsyncPhase:
        def run() -> None:
            if cid == 3:
                gate.wait(30)
            ran.append((cid, threading.current_thread().name))

        return AsyncPhase(cid, run)

    run_async(write(3))
    run_async(write(4))
    # the task goes on while checkpoint 3's write waits: both are named as in flight
    assert snapshots.writer(KEY) == Writer(socket.gethostname(), _pid(), (3, 4))
    assert snapshots.writer(CacheKey("/root", "run-1", 1)).writing == ()
    gate.set()
    snapshots.drain()
    assert [c for c, _ in ran] == [3, 4]
    assert {name for _, name in ran} == {"spark-ckpt-executor-snapshot"}
    assert snapshots.writer(KEY).writing == ()


def test_an_unexpected_error_fails_the_next_task_then_a_new_thread_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    snapshots = ExecutorSnapshots()
    run_async = snapshots.run_async(KEY)
    assert run_async is not None

    def broken() -> None:
        raise RuntimeError("boom")

    run_async(AsyncPhase(1, broken))
    with pytest.raises(RuntimeError, match="boom"):
        snapshots.drain()
    with pytest.raises(RuntimeError, match="boom"):
        run_async(AsyncPhase(2, lambda: None))
    done: list[int] = []
    run_async(AsyncPhase(3, lambda: done.append(3)))
    snapshots.drain()
    assert done == [3]
    assert snapshots.writer(KEY).writing == ()


def _pid() -> int:
    import os

    return os.getpid()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_writer_is_lost_when_its_process_is_gone_or_on_another_host() -> None:
    here = socket.gethostname()
    assert not Writer(here, _pid(), (5,)).lost()
    assert Writer(here, _dead_pid(), (5,)).lost()
    assert Writer(here + "-elsewhere", _pid(), (5,)).lost()


class RecordingTask:
    task_id = TaskId("chain", 0)

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def respond(self, message: Any) -> None:
        self.sent.append(message)


def test_a_lost_writer_s_checkpoints_are_declined_and_a_live_one_s_are_not() -> None:
    here = socket.gethostname()
    task = RecordingTask()
    lost = {WRITER: Writer(here, _dead_pid(), (7, 8)).to_json()}
    assert decline_lost_writes(task, lost) == [7, 8]  # type: ignore[arg-type]
    assert [(m.checkpoint_id, m.task) for m in task.sent] == [(7, task.task_id), (8, task.task_id)]
    assert all(isinstance(m, DeclineCheckpoint) and "was lost" in m.reason for m in task.sent)
    task.sent.clear()
    alive = {WRITER: Writer(here, _pid(), (9,)).to_json()}
    finished = {WRITER: Writer(here, _dead_pid(), ()).to_json()}
    for meta in (alive, finished, {}):
        assert decline_lost_writes(task, meta) == []  # type: ignore[arg-type]
    assert task.sent == []
    assert Writer.from_meta(lost) == Writer(here, Writer.from_meta(lost).pid, (7, 8))  # type: ignore[union-attr]


def _publish(root: str, subtask: int, batch: int, token: str, writer: Writer) -> None:
    """A changelog segment of micro-batch *batch* naming *writer*."""
    log = SubtaskChangelog(root, "run-1", subtask)
    meta = {"kind": FULL, WRITER: writer.to_json()}
    log.publish(batch, token, SubtaskImage({"s0": pa.table({"n": [batch]})}, meta), None)


def test_the_driver_declines_a_pending_write_whose_worker_is_gone(tmp_path: Any) -> None:
    """No micro-batch follows a final checkpoint: the driver finds its lost writer in the
    newest segment of each subtask that has not acknowledged."""
    here, root = socket.gethostname(), str(tmp_path)
    dead, alive = _dead_pid(), _pid()
    _publish(root, 0, 4, "a", Writer(here, alive, (3,)))  # superseded by batch 5
    _publish(root, 0, 5, "a", Writer(here, dead, (6, 7)))
    _publish(root, 1, 5, "a", Writer(here, alive, (7,)))  # still writing: no decline
    _publish(root, 2, 5, "a", Writer(here + "-elsewhere", dead, (7,)))  # cannot tell
    _publish(root, 3, 4, "a", Writer(here, dead, (3,)))  # an older batch's lost write ...
    _publish(root, 3, 5, "b", Writer(here, alive, ()))  # ... another process took over
    chain = [TaskId("chain", s) for s in range(4)]
    scan = LostWriterScan(root, "run-1", interval_s=3600)
    declines = scan.scan({3: chain, 7: chain})
    assert [(d.checkpoint_id, d.task) for d in declines] == [(7, chain[0])]
    assert "was lost before it acknowledged" in declines[0].reason
    assert scan.scan({7: chain}) == []  # once per interval
    assert LostWriterScan(root, "run-1").scan({}) == []
    assert LostWriterScan(str(tmp_path / "none"), "run-1").scan({7: chain}) == []
    assert LostWriterScan("s3://bucket/root", "run-1").scan({7: chain}) == []


@pytest.mark.parametrize("acked", [(0, 1), (0,)])
def test_the_host_reads_the_acks_before_it_declines_a_lost_write(
    tmp_path: Any, acked: tuple[int, ...]
) -> None:
    """Both subtasks' writers of checkpoint 1 are gone. The acks they posted before they
    died count (the checkpoint completes); a subtask without one is declined."""
    root, run_id = str(tmp_path), new_run_id()
    write_topology(root, Topology(CHAIN_VERTEX, 2, SinkSpec("memory", "-", CHAIN_VERTEX)), run_id)
    store, sink, clock = InMemoryCheckpointStore(), MemorySink(), ManualClock(1_000)
    host = CoordinatorHost(
        root,
        CheckpointConfig(interval_ms=50, tolerable_failed_checkpoints=1),
        store,
        sink_factory=lambda spec: sink.committer,
        clock=clock,
        run_id=run_id,
        lost_writers=LostWriterScan(root, run_id),
    )
    host.start_run()
    clock.advance(60)
    assert [b.checkpoint_id for b in host.poll()] == [1]
    dead = Writer(socket.gethostname(), _dead_pid(), (1,))
    for subtask in (0, 1):
        meta = {"kind": FULL, WRITER: dead.to_json()}
        image = SubtaskImage({"s0": pa.table({"n": [subtask]})}, meta)
        SubtaskChangelog(root, run_id, subtask).publish(3, "a", image, None)
    for subtask in acked:
        task = TaskId(CHAIN_VERTEX, subtask)
        Mailbox(root, run_id).post(AcknowledgeCheckpoint(1, task, TaskStateHandle(task)))
    host.poll(tick=False)
    history = host.coordinator.history  # type: ignore[union-attr]
    assert [h.checkpoint_id for h in history] == [1]
    if acked == (0, 1):
        assert history[0].completed is not None
    else:
        failure = history[0].failure
        assert failure is not None and "declined by chain#1" in failure.message
        assert "was lost before it acknowledged" in failure.message

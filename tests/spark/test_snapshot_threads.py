"""The executors' asynchronous snapshot phase (:mod:`spark_ckpt.spark.snapshot_threads`): it
runs off the task in a reused Python worker, every changelog segment names its writer and
what it was still writing, and a lost writer's checkpoints are declined."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from typing import Any

import pytest

from spark_ckpt.protocol.handle import DeclineCheckpoint, TaskId
from spark_ckpt.runtime.task import AsyncPhase
from spark_ckpt.spark.executor_cache import CacheKey
from spark_ckpt.spark.snapshot_threads import (
    WRITER,
    ExecutorSnapshots,
    Writer,
    decline_lost_writes,
)

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

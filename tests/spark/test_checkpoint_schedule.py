"""Pausing and resuming the periodic checkpoints (``pause``/``resume`` requests): the
coordinator's host on a real Delta store, driven poll by poll with a manual clock (no Spark);
the client's side against a root where nothing takes its request."""

from __future__ import annotations

from pathlib import Path

import pytest
from coordinator_hosts import SUBTASKS, run_host, started_host

from spark_ckpt.client.pipeline_client import PipelineClient
from spark_ckpt.coordination.heartbeats import HeartbeatRole, Heartbeats
from spark_ckpt.coordination.host import CoordinatorHost
from spark_ckpt.coordination.mailbox import MAILBOX_DIR, Mailbox
from spark_ckpt.coordination.messages import Request, RequestKind
from spark_ckpt.coordination.schedule import SCHEDULE_FILE, CheckpointSchedule
from spark_ckpt.errors import CheckpointError, StoreError
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import (
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    TaskStateHandle,
)
from spark_ckpt.runtime.checkpoint_cleaner import REQUEST_ID


def ack_all(root: str, run_id: str, checkpoint_id: int) -> None:
    for task in SUBTASKS:
        Mailbox(root, run_id).post(
            AcknowledgeCheckpoint(checkpoint_id, task, TaskStateHandle(task))
        )


def pause(root: str, host: CoordinatorHost, request_id: str = "pause-1") -> None:
    Mailbox(root).post(Request(request_id, RequestKind.PAUSE))
    assert host.poll(tick=False) == []
    paused = CheckpointSchedule(root).paused()
    assert paused is not None and paused.request_id == request_id
    assert host.paused == paused


def resume(root: str, host: CoordinatorHost) -> None:
    Mailbox(root).post(Request("resume-1", RequestKind.RESUME))
    assert host.poll(tick=False) == []
    assert CheckpointSchedule(root).paused() is None and host.paused is None


def test_paused_periodic_checkpoints_leave_manual_ones_and_resume(tmp_path: Path) -> None:
    root = str(tmp_path)
    host, clock, run_id = started_host(root)
    pause(root, host)
    clock.advance(10_000)  # two hundred intervals
    assert host.poll() == []
    Mailbox(root).post(Request("manual-1", RequestKind.CHECKPOINT))
    [manual] = host.poll()
    assert manual.checkpoint_id == 2
    ack_all(root, run_id, 2)
    clock.advance(10_000)
    assert host.poll() == []
    completed = host.last_completed
    assert completed is not None and completed.checkpoint_id == 2
    assert completed.properties[REQUEST_ID] == "manual-1"
    resume(root, host)
    clock.advance(49)
    assert host.poll() == []  # the first one an interval after the resume
    clock.advance(1)
    [periodic] = host.poll()
    assert periodic.checkpoint_id == 3 and not periodic.final


def test_a_pause_holds_for_the_next_run_until_resumed(tmp_path: Path) -> None:
    root = str(tmp_path)
    first, _, _ = started_host(root)
    pause(root, first)
    first.shutdown()
    clock = ManualClock(50_000)
    host, _ = run_host(root, clock)
    restored = host.start_run()
    assert restored is not None and restored.checkpoint_id == 1
    assert host.paused is not None and host.paused.request_id == "pause-1"
    clock.advance(10_000)
    assert host.poll() == []
    resume(root, host)
    clock.advance(50)
    [periodic] = host.poll()
    assert periodic.checkpoint_id > 1 and not periodic.final


def test_a_failed_stop_while_paused_leaves_them_paused(tmp_path: Path) -> None:
    root = str(tmp_path)
    host, clock, run_id = started_host(root)
    pause(root, host)
    Mailbox(root).post(Request("stop-1", RequestKind.STOP))
    [final] = host.poll(tick=False)
    assert final.final
    Mailbox(root, run_id).post(DeclineCheckpoint(final.checkpoint_id, SUBTASKS[0], "disk"))
    assert host.poll(tick=False) == []
    assert host.stopping is None  # the stop failed: the pipeline goes on
    clock.advance(10_000)
    assert host.poll() == []  # still paused


def test_a_resume_during_a_stop_triggers_nothing(tmp_path: Path) -> None:
    root = str(tmp_path)
    host, clock, _ = started_host(root)
    pause(root, host)
    Mailbox(root).post(Request("stop-1", RequestKind.STOP))
    [final] = host.poll(tick=False)
    resume(root, host)
    clock.advance(10_000)
    assert host.poll() == []  # only the final checkpoint, still pending
    assert host.stopping is not None and host.stopping.checkpoint_id == final.checkpoint_id


def test_a_resume_while_running_changes_nothing(tmp_path: Path) -> None:
    root = str(tmp_path)
    host, clock, _ = started_host(root)
    clock.advance(30)
    resume(root, host)
    clock.advance(20)  # 50 ms after the first checkpoint's trigger, not after the resume
    [periodic] = host.poll()
    assert periodic.checkpoint_id == 2


def test_a_request_nobody_takes_times_out_and_is_taken_back(tmp_path: Path) -> None:
    root = str(tmp_path)
    # a live heartbeat of this process: the client posts, but no coordinator polls
    Heartbeats(root).beat("someone", HeartbeatRole.COORDINATOR, 60_000)
    client = PipelineClient(root)
    with pytest.raises(CheckpointError, match="no coordinator took the pause request"):
        client.pause_checkpoints(timeout_s=0.5)
    box = tmp_path / MAILBOX_DIR
    assert not [p for p in box.iterdir() if p.is_file()]
    assert client.checkpoints_paused() is None


def test_a_damaged_pause_record_is_reported_and_checkpoints_go_on(tmp_path: Path) -> None:
    root = str(tmp_path)
    (tmp_path / SCHEDULE_FILE).write_text("{not json")
    client = PipelineClient(root)
    with pytest.raises(StoreError, match=SCHEDULE_FILE):
        client.checkpoints_paused()
    host, _, _ = started_host(root)  # its first periodic checkpoint completes
    assert host.paused is None

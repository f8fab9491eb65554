"""PipelineClient against a stand-in coordinator (no Spark): requests are answered by
completed checkpoints carrying their id, a stop returns only once the run reports STOPPED,
an unanswered request times out with a clear error and is taken back, a request where no run
is live fails at once and posts nothing, and the statistics are those of the retained
checkpoints (oracle: a plain computation over what the stand-in committed)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spark_ckpt.client.pipeline_client import PipelineClient
from spark_ckpt.coordination.heartbeats import (
    Heartbeat,
    HeartbeatRole,
    Heartbeats,
    HeartbeatThread,
    mark_starting,
)
from spark_ckpt.coordination.mailbox import MAILBOX_DIR, Mailbox
from spark_ckpt.coordination.messages import Request, RequestKind
from spark_ckpt.coordination.requests import STOP
from spark_ckpt.coordination.runs import RunFiles, RunState, RunStatus
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.delta.savepoint import (
    SAVEPOINT_DIR,
    export_savepoint,
    open_savepoint,
    savepoint_directory,
)
from spark_ckpt.errors import CheckpointError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import TaskId, TaskStateHandle
from spark_ckpt.runtime.checkpoint_cleaner import REQUEST_ID
from spark_ckpt.runtime.restore_settings import PIPELINE

RUN = "run-1"


class StandInCoordinator:
    """Answers each request in the mailbox with a completed checkpoint (a savepoint when
    asked, exported into its directory); after a stop's checkpoint it reports the run
    STOPPED *stop_delay_s* later. Beats while it runs, as the coordinator host does."""

    def __init__(self, root: Path, stop_delay_s: float = 0.6) -> None:
        self.root = str(root)
        self.store = DeltaCheckpointStore(self.root)
        self.stop_delay_s = stop_delay_s
        self.stopped_at: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._heartbeat = HeartbeatThread(self.root, RUN)

    def __enter__(self) -> StandInCoordinator:
        self._heartbeat.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self._heartbeat.stop()

    def _loop(self) -> None:
        mailbox = Mailbox(self.root)
        lease = self.store.acquire()
        next_id = lease.first_id
        while not self._done.is_set():
            for name, message in mailbox.receive():
                mailbox.delete([name])
                assert isinstance(message, Request)
                savepoint = message.kind is RequestKind.SAVEPOINT or message.savepoint
                props = {REQUEST_ID: message.request_id}
                if message.kind is RequestKind.STOP:
                    props[STOP] = message.request_id
                props[PIPELINE] = "p"
                if message.target:
                    props[SAVEPOINT_DIR] = message.target
                cp = CompletedCheckpoint(
                    next_id,
                    SnapshotType.SAVEPOINT if savepoint else SnapshotType.CHECKPOINT,
                    (TaskStateHandle(TaskId("t")),),
                    CheckpointStats(1000 * next_id, 1000 * next_id + 10 * next_id),
                    props,
                )
                self.store.commit(lease, cp)
                if savepoint:  # as the coordinator host does after the completion
                    directory = savepoint_directory(self.root, cp)
                    export_savepoint(self.store, cp, directory, pipeline="p", max_parallelism=128)
                next_id += 1
                if message.kind is RequestKind.STOP:
                    time.sleep(self.stop_delay_s)
                    self.stopped_at = time.monotonic()
                    RunFiles(self.root, RUN).write_status(
                        RunStatus(RUN, "driver", RunState.STOPPED, 1, 0, None, message.request_id)
                    )
            time.sleep(0.05)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "root"


def test_checkpoint_and_savepoint_requests_are_answered(root: Path) -> None:
    client = PipelineClient(str(root))
    with StandInCoordinator(root):
        cp = client.checkpoint(timeout_s=30)
        sp = client.savepoint(timeout_s=30)
        elsewhere = client.savepoint(str(root.parent / "elsewhere"), timeout_s=30)
    assert cp.snapshot_type is SnapshotType.CHECKPOINT
    assert sp.snapshot_type is SnapshotType.SAVEPOINT
    ids = [cp.checkpoint_id, sp.checkpoint_id, elsewhere.checkpoint_id]
    assert [c.checkpoint_id for c in client.checkpoints()] == ids
    assert client.latest() == elsewhere
    assert client.latest(include_savepoints=False) == cp
    # the savepoints were written where asked: the default directory and the target
    assert client.savepoint_path(sp) == str(root / "savepoints" / f"savepoint-p-{ids[1]}")
    assert client.savepoint_path(elsewhere).startswith(str(root.parent / "elsewhere"))
    for savepoint in (sp, elsewhere):
        assert open_savepoint(client.savepoint_path(savepoint))[1].checkpoint.checkpoint_id == (
            savepoint.checkpoint_id
        )


def test_stop_returns_once_the_run_reports_stopped(root: Path) -> None:
    client = PipelineClient(str(root))
    with StandInCoordinator(root) as coordinator:
        final = client.stop(savepoint=True, timeout_s=30)
        returned_at = time.monotonic()
        assert coordinator.stopped_at is not None and coordinator.stopped_at <= returned_at
    assert final.is_savepoint and STOP in final.properties
    [status] = client.runs()
    assert status.state is RunState.STOPPED and status.stop_request == final.properties[STOP]


def test_an_unanswered_request_times_out_and_is_taken_back(root: Path) -> None:
    client = PipelineClient(str(root))
    Heartbeats(str(root)).beat("silent", HeartbeatRole.COORDINATOR, 60_000)  # live, mute
    with pytest.raises(CheckpointError, match="no answer to the stop request"):
        client.stop(timeout_s=0.5)
    assert Mailbox(str(root)).receive() == []  # nothing left for a pipeline started later


def test_stats_summarize_the_retained_checkpoints(root: Path) -> None:
    client = PipelineClient(str(root))
    with StandInCoordinator(root):
        for _ in range(3):
            client.checkpoint(timeout_s=30)
        client.savepoint(timeout_s=30)
    completed = client.checkpoints()
    durations = [c.stats.completed_ms - c.stats.trigger_ms for c in completed]
    stats = client.stats()
    assert (stats.checkpoints, stats.savepoints) == (3, 1)
    assert stats.latest == completed[-1]
    assert stats.duration_ms is not None
    assert (stats.duration_ms.min, stats.duration_ms.max) == (min(durations), max(durations))
    assert stats.duration_ms.avg == sum(durations) / len(durations)


def test_stats_of_an_empty_pipeline(root: Path) -> None:
    stats = PipelineClient(str(root)).stats()
    assert (stats.checkpoints, stats.savepoints, stats.latest, stats.duration_ms) == (
        0,
        0,
        None,
        None,
    )


# -- liveness: a request needs a live run ------------------------------------------------------


def mailbox_files(root: Path) -> list[str]:
    box = root / MAILBOX_DIR
    return sorted(p.name for p in box.iterdir() if p.is_file()) if box.is_dir() else []


def a_dead_pid() -> int:
    """The pid of a process of this host that has exited (and was reaped)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


@pytest.mark.parametrize("kind", list(RequestKind))
def test_a_request_where_no_run_is_live_fails_at_once_and_posts_nothing(
    root: Path, kind: RequestKind
) -> None:
    client = PipelineClient(str(root))
    with pytest.raises(CheckpointError, match="no live run of the pipeline under") as raised:
        client.request(kind, timeout_s=3600)  # not waited for: fails before posting
    assert str(root) in str(raised.value) and kind.value in str(raised.value)
    assert mailbox_files(root) == []


@dataclass(frozen=True)
class AGO:
    """A heartbeat time *ms* milliseconds before the test runs."""

    ms: int


def write_record(root: Path, **fields: object) -> None:
    record = {
        "holder": "run-x",
        "role": "coordinator",
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "beat_ms": int(time.time() * 1000),
        "valid_ms": 30_000,
        **fields,
    }
    alive = root / MAILBOX_DIR / "_alive"
    alive.mkdir(parents=True, exist_ok=True)
    (alive / f"{record['holder']}.json").write_text(json.dumps(record))


@pytest.mark.parametrize(
    ("fields", "live"),
    [
        ({}, True),  # fresh, its process (this one) exists
        ({"pid": "DEAD"}, False),  # killed: its process is gone, fresh or not
        ({"beat_ms": AGO(31_000)}, False),  # stale
        ({"host": "another-host", "pid": "DEAD"}, True),  # elsewhere: freshness decides
        ({"host": "another-host", "beat_ms": 0}, False),
        (
            {"role": "starting", "valid_ms": 120_000, "beat_ms": AGO(60_000)},
            True,
        ),
    ],
)
def test_a_run_is_live_while_its_record_is_fresh_and_its_process_exists(
    root: Path, fields: dict[str, object], live: bool
) -> None:
    dead, now_ms = a_dead_pid(), int(time.time() * 1000)

    def value(v: object) -> object:
        if v == "DEAD":
            return dead
        return now_ms - v.ms if isinstance(v, AGO) else v  # ages count from now, not collection

    write_record(root, **{k: value(v) for k, v in fields.items()})
    client = PipelineClient(str(root))
    assert client.live() is live
    if not live:
        with pytest.raises(CheckpointError, match="no live run"):
            client.checkpoint(timeout_s=3600)
        assert mailbox_files(root) == []


def test_a_starting_run_and_a_coordinators_heartbeat_make_a_run_live(root: Path) -> None:
    client = PipelineClient(str(root))
    assert not client.live()
    mark_starting(str(root), RUN)  # the driver, before the query starts
    assert client.live()
    [record] = Heartbeats(str(root)).records()
    assert (record.holder, record.role, record.pid) == (RUN, HeartbeatRole.STARTING, os.getpid())
    beating = True
    thread = HeartbeatThread(str(root), RUN, alive=lambda: beating, interval_s=0.01)
    thread.start()  # the coordinator's record replaces the driver's
    [record] = Heartbeats(str(root)).records()
    assert record.role is HeartbeatRole.COORDINATOR and client.live()
    thread.stop()  # the run stopped: nothing left, nothing live
    assert Heartbeats(str(root)).records() == [] and not client.live()
    again = HeartbeatThread(str(root), RUN, alive=lambda: beating, interval_s=0.01)
    again.start()
    beating = False  # its coordinator failed: the thread ends and removes the record
    deadline = time.monotonic() + 30
    while Heartbeats(str(root)).records() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not client.live()
    again.stop()


def test_heartbeat_records_round_trip() -> None:
    record = Heartbeat("h", HeartbeatRole.COORDINATOR, "host", 7, 1_000, 30_000)
    assert Heartbeat.from_dict(record.to_dict()) == record
    assert not record.alive(31_001) and (
        record.alive(31_000) or record.host == socket.gethostname()
    )


def test_the_reporter_counts_checkpoints_retention_removed_before_it_looked(root: Path) -> None:
    """With one checkpoint retained, two complete between the driver's polls: both are
    counted (the history records every completion), the one retention still keeps is handed
    over, and nothing is reported twice."""
    from spark_ckpt.pipeline.reporter import CheckpointReporter

    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()

    def complete(cid: int) -> CompletedCheckpoint:
        cp = CompletedCheckpoint(
            cid,
            SnapshotType.CHECKPOINT,
            (TaskStateHandle(TaskId("t")),),
            CheckpointStats(1000 * cid, 1000 * cid + 5),
        )
        store.commit(lease, cp)
        store.retain(lease, 1)
        return cp

    complete(lease.first_id)
    handed: list[CompletedCheckpoint] = []
    reporter = CheckpointReporter(PipelineClient(str(root)), handed.append)
    assert (reporter.count, reporter.report(), handed) == (0, [], [])
    ids = [lease.first_id + 1, lease.first_id + 2]
    last = [complete(cid) for cid in ids][-1]
    assert [c.checkpoint_id for c in store.list_completed()] == ids[-1:]  # the first is gone
    assert store.completed_ids() == [lease.first_id, *ids]
    assert reporter.report() == [last] and handed == [last]
    assert reporter.count == 2
    assert reporter.report() == [] and reporter.count == 2 and handed == [last]


def test_the_reporter_reports_a_savepoint_completing_after_a_newer_checkpoint(root: Path) -> None:
    """A forced savepoint runs beside checkpoints: one with a lower id may complete after a
    checkpoint with a higher one. It is counted and handed over all the same, once."""
    from spark_ckpt.pipeline.reporter import CheckpointReporter

    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()

    def complete(cid: int, kind: SnapshotType) -> CompletedCheckpoint:
        cp = CompletedCheckpoint(
            cid, kind, (TaskStateHandle(TaskId("t")),), CheckpointStats(1000 * cid, 1000 * cid)
        )
        store.commit(lease, cp)
        store.retain(lease, 1)
        return cp

    first = lease.first_id
    complete(first, SnapshotType.CHECKPOINT)
    handed: list[CompletedCheckpoint] = []
    reporter = CheckpointReporter(PipelineClient(str(root)), handed.append)
    checkpoint = complete(first + 2, SnapshotType.CHECKPOINT)
    assert reporter.report() == [checkpoint] and reporter.count == 1
    savepoint = complete(first + 1, SnapshotType.SAVEPOINT)
    assert reporter.report() == [savepoint] and reporter.count == 2
    assert reporter.report() == [] and reporter.count == 2
    assert handed == [checkpoint, savepoint]

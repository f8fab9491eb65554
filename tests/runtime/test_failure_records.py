"""The coordinator records every failed or aborted checkpoint in the store, with its reason
and the figures of the tasks that had acknowledged; recording never fails the job."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from test_coordinator import OP, SRC, RecordingGateway, ack, ack_all, make

from spark_ckpt.errors import FencedError, StoreError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import FailedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import CheckpointMetrics, DeclineCheckpoint
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.coordinator import CheckpointCoordinator, JobStatus, RequestStatus
from spark_ckpt.runtime.failure import CheckpointFailureReason
from spark_ckpt.storage.lease import CoordinatorLease
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore


def test_declined_and_expired_checkpoints_are_recorded_with_reason_and_subtask_figures() -> None:
    coord, _, clock, store = make(interval_ms=None, timeout_ms=1000, tolerable_failed_checkpoints=5)
    declined = coord.trigger_checkpoint()
    assert declined.checkpoint_id is not None
    ack(coord, store, declined.checkpoint_id, SRC, metrics=CheckpointMetrics(3, 4, 5, 6, 7, 8))
    clock.set(50)
    coord.receive_decline(DeclineCheckpoint(declined.checkpoint_id, OP, "disk full"))
    expired = coord.trigger_checkpoint({"request_id": "r-2"})
    assert expired.checkpoint_id is not None and expired.status is RequestStatus.TRIGGERED
    clock.set(2000)
    coord.tick()  # expires it
    [first, second] = store.list_failed()
    assert first == FailedCheckpoint(
        checkpoint_id=declined.checkpoint_id,
        snapshot_type=SnapshotType.CHECKPOINT,
        trigger_ms=0,
        failed_ms=50,
        reason="declined",
        message=f"declined by {OP}: disk full",
        task_metrics={str(SRC): CheckpointMetrics(3, 4, 5, 6, 7, 8)},
        subtasks=2,  # the source and the operator were to acknowledge it
    )
    assert first.duration_ms == 50
    assert second.checkpoint_id == expired.checkpoint_id and second.reason == "expired"
    assert second.trigger_ms == 50 and second.failed_ms == 2000
    assert second.task_metrics == {}  # nobody had acknowledged
    assert second.properties == {"request_id": "r-2"}  # how its client learns of it


def test_every_abort_is_recorded_subsumed_savepoint_finalize_and_shutdown() -> None:
    """Aborts that do not count as failures are on record too, and so are savepoints."""

    class RefusingCommit(InMemoryCheckpointStore):
        refuse = False

        def commit(self, lease: CoordinatorLease, checkpoint: object) -> None:  # type: ignore[override]
            if self.refuse:
                raise StoreError("disk gone")
            super().commit(lease, checkpoint)  # type: ignore[arg-type]

    store = RefusingCommit()
    coord, _, clock, _ = make(
        store=store, interval_ms=None, max_concurrent=3, tolerable_failed_checkpoints=5
    )
    older = coord.trigger_checkpoint()
    newer = coord.trigger_checkpoint()
    savepoint = coord.trigger_savepoint()
    assert older.checkpoint_id and newer.checkpoint_id and savepoint.checkpoint_id
    ack(coord, store, older.checkpoint_id, OP, metrics=CheckpointMetrics(sync_ms=1))
    clock.set(10)
    ack_all(coord, store, newer.checkpoint_id)  # subsumes the older one
    coord.receive_decline(DeclineCheckpoint(savepoint.checkpoint_id, SRC, "no"))
    store.refuse = True
    failing = coord.trigger_checkpoint()
    assert failing.checkpoint_id is not None
    ack_all(coord, store, failing.checkpoint_id)  # the completion commit fails
    store.refuse = False
    left = coord.trigger_checkpoint()
    assert left.checkpoint_id is not None
    coord.shutdown(JobStatus.SUSPENDED)
    records = {f.checkpoint_id: f for f in store.list_failed()}
    assert {cid: f.reason for cid, f in records.items()} == {
        older.checkpoint_id: "subsumed",
        savepoint.checkpoint_id: "declined",
        failing.checkpoint_id: "finalize_failed",
        left.checkpoint_id: "coordinator_shutdown",
    }
    assert records[older.checkpoint_id].task_metrics == {str(OP): CheckpointMetrics(sync_ms=1)}
    assert records[savepoint.checkpoint_id].snapshot_type is SnapshotType.SAVEPOINT
    assert "disk gone" in records[failing.checkpoint_id].message
    assert set(records[failing.checkpoint_id].task_metrics) == {str(SRC), str(OP)}
    # the history in memory says the same
    assert {h.checkpoint_id for h in coord.history if h.failure} == set(records)
    # completed checkpoints are not disturbed
    assert [c.checkpoint_id for c in store.list_completed()] == [newer.checkpoint_id]


class FlakyRecords(InMemoryCheckpointStore):
    """Refuses failure records with *error* (and still holds everything else)."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def record_failure(
        self, lease: CoordinatorLease, failed: FailedCheckpoint, *, history_size: int = 100
    ) -> None:
        raise self.error


@pytest.mark.parametrize("error", [StoreError("store down"), RuntimeError("a bug")])
def test_a_failure_to_record_never_fails_the_job(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    store = FlakyRecords(error)
    coord, gw, _, _ = make(store=store, interval_ms=None, tolerable_failed_checkpoints=5)
    r = coord.trigger_checkpoint()
    assert r.checkpoint_id is not None
    with caplog.at_level(logging.WARNING, logger="spark_ckpt.runtime.coordinator"):
        coord.receive_decline(DeclineCheckpoint(r.checkpoint_id, OP, "no"))
    assert r.status is RequestStatus.FAILED and r.failure is not None
    assert r.failure.reason is CheckpointFailureReason.DECLINED
    assert {(t, c) for t, c, _ in gw.aborted} == {(SRC, r.checkpoint_id), (OP, r.checkpoint_id)}
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert any(f"checkpoint {r.checkpoint_id}" in w and str(error) in w for w in warnings)
    # the coordinator goes on
    next_one = coord.trigger_checkpoint()
    assert next_one.checkpoint_id is not None
    ack_all(coord, store, next_one.checkpoint_id)
    assert next_one.status is RequestStatus.COMPLETED


def test_a_fenced_coordinator_records_nothing() -> None:
    store = InMemoryCheckpointStore()
    coord, _, _, _ = make(store=store, interval_ms=None, tolerable_failed_checkpoints=5)
    r = coord.trigger_checkpoint()
    assert r.checkpoint_id is not None
    successor = CheckpointCoordinator(
        CheckpointConfig(interval_ms=None, tolerable_failed_checkpoints=5),
        store,
        RecordingGateway(),
        tasks_to_trigger=[SRC],
        tasks_to_ack=[SRC, OP],
        clock=ManualClock(0),
    )
    coord.receive_decline(DeclineCheckpoint(r.checkpoint_id, OP, "no"))
    assert store.list_failed() == []
    successor.start()
    s = successor.trigger_checkpoint()
    assert s.checkpoint_id is not None
    successor.receive_decline(DeclineCheckpoint(s.checkpoint_id, OP, "no"))
    assert [f.checkpoint_id for f in store.list_failed()] == [s.checkpoint_id]
    with pytest.raises(FencedError):
        store.record_failure(
            CoordinatorLease(coord.epoch, 1, 2),
            FailedCheckpoint(1, SnapshotType.CHECKPOINT, 0, 1, "declined"),
        )


def test_an_abort_lets_the_queued_request_trigger() -> None:
    """A decline frees the slot at once, as a completion does (Flink's abort schedules the
    queued requests)."""
    coord, _, _, _ = make(interval_ms=None, tolerable_failed_checkpoints=5)
    first = coord.trigger_checkpoint()
    queued = coord.trigger_checkpoint()
    assert first.checkpoint_id is not None and queued.status is RequestStatus.QUEUED
    coord.receive_decline(DeclineCheckpoint(first.checkpoint_id, OP, "no"))
    assert queued.status is RequestStatus.TRIGGERED


def test_failed_checkpoint_json_round_trip() -> None:
    failed = FailedCheckpoint(
        7,
        SnapshotType.SAVEPOINT,
        100,
        250,
        "expired",
        "not acknowledged by counter#0 ü",
        {"counter#0": CheckpointMetrics(1, 2, 3, 4, 5, 6), "source#0": CheckpointMetrics()},
        subtasks=3,
    )
    text = failed.to_json()
    assert FailedCheckpoint.from_json(text) == failed
    assert failed.to_dict()["duration_ms"] == 150
    assert text == FailedCheckpoint.from_json(text).to_json()  # canonical
    assert "properties" not in failed.to_dict()  # records written before properties existed
    requested = replace(failed, properties={"request_id": "stop-1", "stop": "stop-1"})
    assert FailedCheckpoint.from_json(requested.to_json()) == requested

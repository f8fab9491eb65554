"""Failed-checkpoint records in the Delta store: ``failed`` rows of the ``checkpoints`` table
(same schema; the record JSON and its checksum in ``metadata``/``checksum``), written fenced
and idempotently, read back by a fresh store, invisible to everything that reads completed
checkpoints, and written by a coordinator whose checkpoints fail."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from spark_ckpt.delta.store import DeltaCheckpointStore
from spark_ckpt.delta.store_tables import CHECKPOINTS_SCHEMA, StoreTable
from spark_ckpt.errors import FencedError, StoreError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint, FailedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.handle import (
    AcknowledgeCheckpoint,
    BlobKind,
    CheckpointMetrics,
    DeclineCheckpoint,
    StateBlob,
    TaskId,
    TaskSnapshot,
)
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.coordinator import CheckpointCoordinator, JobStatus

SRC = TaskId("source", 0)
OP = TaskId("counter", 0)


class Gateway:
    def trigger(self, task: object, barrier: object) -> None:
        pass

    def notify_complete(self, task: object, checkpoint_id: int) -> None:
        pass

    def notify_aborted(self, task: object, checkpoint_id: int, reason: str) -> None:
        pass


def failed(cid: int, reason: str = "expired", **metrics: CheckpointMetrics) -> FailedCheckpoint:
    return FailedCheckpoint(
        cid,
        SnapshotType.CHECKPOINT,
        1_000 * cid,
        1_000 * cid + 40,
        reason,
        f"checkpoint {cid} {reason}",
        dict(metrics),
    )


def commit_one(store: DeltaCheckpointStore, lease, cid: int) -> CompletedCheckpoint:  # type: ignore[no-untyped-def]
    blob = StateBlob("counter", 0, BlobKind.OPERATOR, "s", pa.table({"v": [cid]}))
    h = store.write_task_state(cid, TaskSnapshot(OP, (blob,)))
    cp = CompletedCheckpoint(cid, SnapshotType.CHECKPOINT, (h,), CheckpointStats(0, 1))
    store.commit(lease, cp)
    return cp


def checkpoint_rows(root: Path) -> pa.Table:
    return DeltaTable(str(root / StoreTable.CHECKPOINTS.value)).to_pyarrow_table()


def test_failure_records_round_trip_through_a_fresh_store(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    done = commit_one(store, lease, lease.first_id)
    records = [
        failed(
            lease.first_id + 1, "declined", **{"counter#0": CheckpointMetrics(1, 2, 3, 4, 5, 6)}
        ),
        failed(lease.first_id + 2, "expired"),
    ]
    for r in reversed(records):
        store.record_failure(lease, r)
    store.record_failure(lease, records[0])  # idempotent per id
    store.record_failure(lease, failed(lease.first_id + 1, "subsumed"))  # first record wins
    fresh = DeltaCheckpointStore(str(root))
    assert fresh.list_failed() == records  # by id
    # completed checkpoints are not disturbed by the failed rows
    assert fresh.list_completed() == [done]
    assert fresh.latest_completed() == done
    assert fresh.latest_restorable() == (done, [])
    # what is on disk: the same schema, record 'failed', JSON and its SHA-256
    rows = checkpoint_rows(root)
    assert rows.schema.equals(CHECKPOINTS_SCHEMA, check_metadata=False)
    rows = rows.filter(pc.equal(rows["record"], "failed")).sort_by("checkpoint_id")
    assert rows.num_rows == 2
    assert rows["checkpoint_id"].to_pylist() == [r.checkpoint_id for r in records]
    assert rows["epoch"].to_pylist() == [lease.epoch] * 2
    assert rows["snapshot_type"].to_pylist() == ["checkpoint"] * 2
    for text, digest, r in zip(
        rows["metadata"].to_pylist(), rows["checksum"].to_pylist(), records, strict=True
    ):
        assert hashlib.sha256(text.encode()).hexdigest() == digest
        assert json.loads(text)["reason"] == r.reason
    assert rows["state_bytes"].null_count == 2 and rows["id_end"].null_count == 2


def test_failure_records_are_fenced(tmp_path: Path) -> None:
    store = DeltaCheckpointStore(str(tmp_path / "root"))
    old = store.acquire()
    new = DeltaCheckpointStore(str(tmp_path / "root")).acquire()
    with pytest.raises(FencedError):
        store.record_failure(old, failed(old.first_id))
    store.record_failure(new, failed(new.first_id))
    assert [f.checkpoint_id for f in store.list_failed()] == [new.first_id]


def test_a_damaged_failure_record_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "root"
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    store.record_failure(lease, failed(lease.first_id))
    store.record_failure(lease, failed(lease.first_id + 1))
    # rewrite the table with the first record's JSON altered (checksum no longer matches)
    uri = str(root / StoreTable.CHECKPOINTS.value)
    dt = DeltaTable(uri)
    dt.update(
        predicate=f"record = 'failed' AND checkpoint_id = {lease.first_id}",
        updates={"metadata": "'{\"tampered\": true}'"},
    )
    with caplog.at_level(logging.WARNING):
        got = DeltaCheckpointStore(str(root)).list_failed()
    assert [f.checkpoint_id for f in got] == [lease.first_id + 1]
    assert any(f"record {lease.first_id} is damaged" in r.getMessage() for r in caplog.records)


def test_retention_keeps_the_newest_failure_records_only(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Retention deletes all but the newest MAX_FAILED_RECORDS failed rows in its fenced
    commit (here with a limit of 3, to keep the test short)."""
    monkeypatch.setattr("spark_ckpt.delta.checkpoint_log.MAX_FAILED_RECORDS", 3)
    root = tmp_path / "root"
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    base = lease.first_id
    for cid in range(base, base + 5):
        store.record_failure(lease, failed(cid))
    kept = commit_one(store, lease, base + 5)
    store.retain(lease, 1)
    fresh = DeltaCheckpointStore(str(root))
    assert [f.checkpoint_id for f in fresh.list_failed()] == [base + 2, base + 3, base + 4]
    assert fresh.list_completed() == [kept]
    store.retain(lease, 1)  # idempotent
    assert [f.checkpoint_id for f in fresh.list_failed()] == [base + 2, base + 3, base + 4]


def test_a_coordinator_on_delta_records_its_failures_durably(tmp_path: Path) -> None:
    """Declined, expired and shut-down checkpoints of a coordinator on the Delta store are
    read back by another store instance after the coordinator is gone."""
    root = str(tmp_path / "root")
    clock = ManualClock(0)
    coord = CheckpointCoordinator(
        CheckpointConfig(interval_ms=None, timeout_ms=1_000, tolerable_failed_checkpoints=5),
        DeltaCheckpointStore(root, clock=clock),
        Gateway(),
        tasks_to_trigger=[SRC],
        tasks_to_ack=[SRC, OP],
        clock=clock,
    )
    coord.start()
    store = coord.store
    declined = coord.trigger_checkpoint()
    assert declined.checkpoint_id is not None
    blob = StateBlob("source", 0, BlobKind.OPERATOR, "s", pa.table({"v": [1]}))
    handle = store.write_task_state(declined.checkpoint_id, TaskSnapshot(SRC, (blob,)))  # type: ignore[attr-defined]
    coord.receive_acknowledge(
        AcknowledgeCheckpoint(
            declined.checkpoint_id, SRC, handle, CheckpointMetrics(5, 6, 7, 8, 9, 10)
        )
    )
    clock.set(30)
    coord.receive_decline(DeclineCheckpoint(declined.checkpoint_id, OP, "No space left on device"))
    expired = coord.trigger_checkpoint()
    clock.set(2_000)
    coord.tick()
    left = coord.trigger_checkpoint()
    coord.shutdown(JobStatus.SUSPENDED)
    got = DeltaCheckpointStore(root).list_failed()
    assert [(f.checkpoint_id, f.reason) for f in got] == [
        (declined.checkpoint_id, "declined"),
        (expired.checkpoint_id, "expired"),
        (left.checkpoint_id, "coordinator_shutdown"),
    ]
    assert got[0].task_metrics == {str(SRC): CheckpointMetrics(5, 6, 7, 8, 9, 10)}
    assert "No space left on device" in got[0].message
    assert (got[0].trigger_ms, got[0].failed_ms) == (0, 30)
    assert (got[1].trigger_ms, got[1].failed_ms) == (30, 2_000)


def test_a_store_outage_while_recording_does_not_fail_the_coordinator(
    tmp_path: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    root = str(tmp_path / "root")
    store = DeltaCheckpointStore(root)
    coord = CheckpointCoordinator(
        CheckpointConfig(interval_ms=None, tolerable_failed_checkpoints=5),
        store,
        Gateway(),
        tasks_to_trigger=[SRC],
        tasks_to_ack=[SRC, OP],
        clock=ManualClock(0),
    )
    coord.start()
    r = coord.trigger_checkpoint()
    assert r.checkpoint_id is not None

    def outage(*_: object) -> None:
        raise StoreError("checkpoints table unreachable")

    monkeypatch.setattr(store._log, "record_failure", outage)
    with caplog.at_level(logging.WARNING):
        coord.receive_decline(DeclineCheckpoint(r.checkpoint_id, OP, "no"))
    assert any("not recorded" in rec.getMessage() for rec in caplog.records)
    assert coord.trigger_checkpoint().checkpoint_id is not None  # still running

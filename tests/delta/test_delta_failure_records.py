"""The checkpoint statistics history in the Delta store: ``checkpoint_history`` rows for
failed and completed checkpoints (queryable figures plus the record JSON and its checksum),
written fenced and idempotently, read back by a fresh store, bounded by its own size and not
by retention, invisible to everything that reads completed checkpoints, written by a
coordinator whose checkpoints fail; and the upgrade of a root written before the history
table existed (``failed`` rows in ``checkpoints``)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.delta.store_layout import CHECKPOINTS_SCHEMA, HISTORY_SCHEMA, StoreTable
from spark_ckpt.errors import FencedError, StoreError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint, FailedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import (
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


def history_rows(root: Path) -> pa.Table:
    return DeltaTable(str(root / StoreTable.HISTORY.value)).to_pyarrow_table()


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
    # what is on disk: nothing new in ``checkpoints``; in ``checkpoint_history`` a row per
    # record (the completed one too, recorded with the first write), JSON and its SHA-256
    log_rows = checkpoint_rows(root)
    assert sorted(set(log_rows["record"].to_pylist())) == ["completed", "lease"]
    rows = history_rows(root)
    assert rows.schema.equals(HISTORY_SCHEMA, check_metadata=False)
    rows = rows.sort_by("checkpoint_id")
    assert rows["checkpoint_id"].to_pylist() == [done.checkpoint_id] + [
        r.checkpoint_id for r in records
    ]
    assert rows["status"].to_pylist() == ["completed", "failed", "failed"]
    assert rows["reason"].to_pylist() == [None, "declined", "expired"]
    assert rows["writer_epoch"].to_pylist() == [lease.epoch] * 3
    assert rows["snapshot_type"].to_pylist() == ["checkpoint"] * 3
    assert rows["duration_ms"].to_pylist() == [1, 40, 40]
    # the declined one: figures of the subtask that had acknowledged (state 5, channel 6)
    assert rows["state_bytes"].to_pylist()[1] == 5
    assert rows["channel_state_bytes"].to_pylist()[1] == 6
    assert rows["alignment_ms"].to_pylist()[1] == 3
    for text, digest in zip(rows["record"].to_pylist(), rows["checksum"].to_pylist(), strict=True):
        assert hashlib.sha256(text.encode()).hexdigest() == digest
    assert json.loads(rows["record"].to_pylist()[1])["failure"]["reason"] == "declined"
    # readable as plain Delta by others: protocol reader 1 / writer 2, no features
    proto = DeltaTable(str(root / StoreTable.HISTORY.value)).protocol()
    assert (proto.min_reader_version, proto.min_writer_version) == (1, 2)
    assert not proto.reader_features and not proto.writer_features


def test_failure_records_are_fenced(tmp_path: Path) -> None:
    store = DeltaCheckpointStore(str(tmp_path / "root"))
    old = store.acquire()
    new = DeltaCheckpointStore(str(tmp_path / "root")).acquire()
    with pytest.raises(FencedError):
        store.record_failure(old, failed(old.first_id))
    store.record_failure(new, failed(new.first_id))
    assert [f.checkpoint_id for f in store.list_failed()] == [new.first_id]


def test_once_a_newer_coordinator_wrote_the_history_an_older_one_cannot(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """The history's own fence: even when the lease check on ``checkpoints`` is passed (as
    in the race between reading the lease and committing), a write is refused once the
    table holds a newer writer epoch."""
    root = str(tmp_path / "root")
    store = DeltaCheckpointStore(root)
    old = store.acquire()
    new = DeltaCheckpointStore(root).acquire()
    store.record_failure(new, failed(new.first_id))
    monkeypatch.setattr(store._log, "check_lease", lambda lease: None)
    with pytest.raises(FencedError, match="checkpoint history"):
        store.record_failure(old, failed(old.first_id))
    assert [f.checkpoint_id for f in DeltaCheckpointStore(root).list_failed()] == [new.first_id]


def test_a_damaged_failure_record_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "root"
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    store.record_failure(lease, failed(lease.first_id))
    store.record_failure(lease, failed(lease.first_id + 1))
    # rewrite the table with the first record's JSON altered (checksum no longer matches)
    uri = str(root / StoreTable.HISTORY.value)
    dt = DeltaTable(uri)
    dt.update(
        predicate=f"checkpoint_id = {lease.first_id}",
        updates={"record": "'{\"tampered\": true}'"},
    )
    with caplog.at_level(logging.WARNING):
        got = DeltaCheckpointStore(str(root)).list_failed()
    assert [f.checkpoint_id for f in got] == [lease.first_id + 1]
    assert any(f"record {lease.first_id} is damaged" in r.getMessage() for r in caplog.records)


def test_the_history_keeps_its_newest_records_in_one_data_file(tmp_path: Path) -> None:
    """Each write rewrites the table: one live data file holding the newest history_size
    records, however many writes there were; retention (one checkpoint) deletes none of
    the newest records."""
    root = tmp_path / "root"
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    base = lease.first_id
    for cid in range(base, base + 5):
        store.record_failure(lease, failed(cid), history_size=3)
    kept = commit_one(store, lease, base + 5)
    store.retain(lease, 1, history_size=3)
    fresh = DeltaCheckpointStore(str(root))
    assert [f.checkpoint_id for f in fresh.list_failed()] == [base + 3, base + 4]
    assert [r.checkpoint_id for r in fresh.list_history()] == [base + 3, base + 4, base + 5]
    # decoding only the failure records gives what the whole history says of failures
    assert fresh.list_failed() == [r.failure for r in fresh.list_history() if r.failure]
    assert fresh.list_completed() == [kept]
    version = DeltaTable(str(root / StoreTable.HISTORY.value)).version()
    store.retain(lease, 1, history_size=3)  # idempotent: nothing is written
    assert DeltaTable(str(root / StoreTable.HISTORY.value)).version() == version
    dt = DeltaTable(str(root / StoreTable.HISTORY.value))
    assert len(dt.file_uris()) == 1
    assert dt.to_pyarrow_table()["checkpoint_id"].to_pylist() == [base + 3, base + 4, base + 5]
    assert set(dt.to_pyarrow_table()["dropped_below"].to_pylist()) == {base + 3}


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
        raise StoreError("checkpoint_history table unreachable")

    monkeypatch.setattr(store._history, "record", outage)
    with caplog.at_level(logging.WARNING):
        coord.receive_decline(DeclineCheckpoint(r.checkpoint_id, OP, "no"))
    assert any("not recorded" in rec.getMessage() for rec in caplog.records)
    assert coord.trigger_checkpoint().checkpoint_id is not None  # still running


def _legacy_failed_row(lease, f: FailedCheckpoint) -> pa.Table:  # type: ignore[no-untyped-def]
    """A ``failed`` row as the previous version wrote it into ``checkpoints``."""
    text = f.to_json()
    return pa.Table.from_pylist(
        [
            {
                "record": "failed",
                "epoch": lease.epoch,
                "checkpoint_id": f.checkpoint_id,
                "id_end": None,
                "snapshot_type": f.snapshot_type.value,
                "trigger_ts": f.trigger_ms * 1000,
                "completed_ts": f.failed_ms * 1000,
                "state_bytes": None,
                "metadata": text,
                "checksum": hashlib.sha256(text.encode()).hexdigest(),
                "committed_at": 0,
            }
        ],
        schema=CHECKPOINTS_SCHEMA,
    )


def test_a_root_of_the_previous_version_upgrades_without_losing_statistics(
    tmp_path: Path,
) -> None:
    """A root written before the history table existed (completed checkpoints and ``failed``
    rows in ``checkpoints``, no ``checkpoint_history``): readers see all of it at once; the
    first retention records it in the history and removes the old ``failed`` rows."""
    from deltalake import write_deltalake

    root = tmp_path / "root"
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    base = lease.first_id
    first = commit_one(store, lease, base)
    write_deltalake(
        str(root / StoreTable.CHECKPOINTS.value),
        _legacy_failed_row(lease, failed(base + 1, "declined")),
        mode="append",
    )
    second = commit_one(store, lease, base + 2)
    assert not (root / StoreTable.HISTORY.value).exists()
    fresh = DeltaCheckpointStore(str(root))
    expected = [(base, "completed"), (base + 1, "failed"), (base + 2, "completed")]
    assert [(r.checkpoint_id, r.status.value) for r in fresh.list_history()] == expected
    assert fresh.list_failed() == [failed(base + 1, "declined")]
    # the new version's coordinator retains one checkpoint: nothing is lost
    coordinator = DeltaCheckpointStore(str(root))
    new = coordinator.acquire()
    coordinator.retain(new, 1)
    after = DeltaCheckpointStore(str(root))
    assert [(r.checkpoint_id, r.status.value) for r in after.list_history()] == expected
    assert after.list_completed() == [second]
    assert [r.stats for r in after.list_history() if r.stats] == [first.stats, second.stats]
    rows = checkpoint_rows(root)
    assert "failed" not in rows["record"].to_pylist()  # moved into the history
    assert history_rows(root).sort_by("checkpoint_id")["checkpoint_id"].to_pylist() == [
        base,
        base + 1,
        base + 2,
    ]

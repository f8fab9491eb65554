"""Delta-specific behaviour of DeltaCheckpointStore: what is on disk (protocol, second
readers), crashes, fencing between processes, and corruption of the files themselves.

Second readers are independent of the store: polars' Delta reader, and a hand-written replay
of ``_delta_log`` (add/remove actions) whose active Parquet files DuckDB reads. (DuckDB's
``delta`` extension needs a download, which this machine cannot do.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_ckpt.delta import followed_table, store_tables
from spark_ckpt.delta.blob_store import DeltaBlobStore, blob_id
from spark_ckpt.delta.checkpoint_log import DeltaCheckpointLog
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.delta.savepoint import checkpoint_as_of
from spark_ckpt.delta.store_layout import CONFIGURATION, HOT_LOG, StoreTable
from spark_ckpt.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    FencedError,
    RestoreError,
    StoreError,
)
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint, FailedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import (
    BlobKind,
    BlobRef,
    SourceOffset,
    StateBlob,
    TaskId,
    TaskSnapshot,
    TaskStateHandle,
)
from spark_ckpt.testing.damage import (
    column_chunk_span,
    data_files,
    delete_blob_file,
    files_of_checkpoint,
    flip_byte_in_blob,
    flip_byte_in_file,
    set_blob_value,
    tamper_metadata,
)

TASK = TaskId("agg", 0)


def kv(k: str, v: int) -> pa.Table:
    return pa.table({"k": [k], "v": [v]})


def keyed(kg: int, table: pa.Table) -> StateBlob:
    return StateBlob(
        "agg", 0, BlobKind.KEYED_FULL, "counts", table, key_group_start=kg, key_group_end=kg
    )


def commit_one(store, lease, cid, *blobs, offsets=()):
    h = store.write_task_state(cid, TaskSnapshot(TASK, tuple(blobs), (), tuple(offsets)))
    cp = CompletedCheckpoint(
        cid, SnapshotType.CHECKPOINT, (h,), CheckpointStats(1_000, 1_250, h.state_bytes())
    )
    store.commit(lease, cp)
    return cp


# ------------------------------------------------------------------ independent log replay


def log_actions(table: Path) -> list[tuple[int, list[dict]]]:
    """(version, actions) of every commit file, in version order, parsed by hand."""
    out = []
    for f in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        out.append((int(f.stem), actions))
    return out


def active_files(table: Path) -> list[str]:
    live: dict[str, dict] = {}
    for _, actions in log_actions(table):
        for a in actions:
            if "add" in a:
                live[a["add"]["path"]] = a["add"]
            elif "remove" in a:
                live.pop(a["remove"]["path"], None)
    return [str(table / p) for p in sorted(live)]


def duck_rows(table: Path, columns: str) -> list[tuple]:
    files = active_files(table)
    if not files:
        return []
    return duckdb.sql(f"SELECT {columns} FROM read_parquet({files!r}) ORDER BY ALL").fetchall()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "pipeline"


# ------------------------------------------------------------------ layout and protocol


def test_tables_are_plain_spark_readable_delta(root: Path) -> None:
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    a = commit_one(
        store,
        lease,
        lease.first_id,
        keyed(0, kv("a", 1)),
        StateBlob("agg", 0, BlobKind.CHANNEL, "inflight", pa.table({"r": [1, 2]}), channel=1),
        offsets=[SourceOffset("kafka", 3, 99)],
    )
    store.retain(lease, 1)  # copies the first checkpoint's offsets
    commit_one(
        store,
        lease,
        lease.first_id + 1,
        keyed(0, kv("a", 2)),
        offsets=[SourceOffset("kafka", 3, 120)],
    )
    store.retain(lease, 1)  # exercises delete (copy-on-write) on every table
    assert store.latest_completed().checkpoint_id == lease.first_id + 1
    assert a.checkpoint_id not in [c.checkpoint_id for c in store.list_completed()]

    for table in StoreTable:
        path = root / table.value
        proto = DeltaTable(str(path)).protocol()
        assert (proto.min_reader_version, proto.min_writer_version) == (1, 2)
        assert not proto.reader_features and not proto.writer_features
        for _, actions in log_actions(path):
            for action in actions:
                if "protocol" in action:
                    assert action["protocol"] == {"minReaderVersion": 1, "minWriterVersion": 2}
                if "metaData" in action:
                    meta = action["metaData"]
                    assert meta["partitionColumns"] == []
                    conf = meta.get("configuration", {})
                    assert not any("deletionVectors" in k or "columnMapping" in k for k in conf)
                    types = {
                        f["name"]: f["type"] for f in json.loads(meta["schemaString"])["fields"]
                    }
                    # UTC timestamps (not timestamp_ntz, which needs a table feature)
                    assert all(t != "timestamp_ntz" for t in types.values())
                if "add" in action:
                    assert action["add"].get("deletionVector") is None
    ts = {
        f["name"]: f["type"]
        for f in json.loads(
            next(
                a["metaData"]
                for _, acts in log_actions(root / "checkpoints")
                for a in acts
                if "metaData" in a
            )["schemaString"]
        )["fields"]
    }
    assert ts["trigger_ts"] == ts["completed_ts"] == ts["committed_at"] == "timestamp"


def test_second_readers_see_exactly_what_was_committed(root: Path) -> None:
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    state = pa.table({"k": ["x", "y"], "v": [10, 20]})
    cp = commit_one(
        store,
        lease,
        lease.first_id,
        keyed(5, state),
        offsets=[SourceOffset("kafka", 0, 7), SourceOffset("kafka", 1, 3)],
    )
    store.retain(lease, 1)  # writes the offsets' queryable copy
    # polars' reader
    meta = pl.read_delta(str(root / "checkpoints")).filter(pl.col("record") == "completed")
    assert meta["checkpoint_id"].to_list() == [lease.first_id]
    assert meta["metadata"].to_list() == [cp.to_json()]
    assert meta["snapshot_type"].to_list() == ["checkpoint"]
    assert meta["state_bytes"].to_list() == [cp.stats.state_bytes]
    assert str(meta["trigger_ts"].dtype) == "Datetime(time_unit='us', time_zone='UTC')"
    assert meta["trigger_ts"].dt.epoch("ms").to_list() == [1_000]
    blobs = pl.read_delta(str(root / "operator_state"))
    assert blobs.height == 1
    (payload,) = blobs["payload"].to_list()
    assert pa.ipc.open_stream(payload).read_all().equals(state)
    assert blobs["key_group_start"].to_list() == [5]
    # hand-replayed log + DuckDB
    assert duck_rows(
        root / "source_offsets", 'checkpoint_id, vertex, subtask, source, channel, "offset"'
    ) == [
        (lease.first_id, "agg", 0, "kafka", 0, 7),
        (lease.first_id, "agg", 0, "kafka", 1, 3),
    ]
    assert duck_rows(root / "checkpoints", "record, epoch, checkpoint_id") == [
        ("completed", lease.epoch, lease.first_id),
        ("lease", lease.epoch, lease.first_id),
    ]


def test_state_tables_keep_a_short_log(root: Path, monkeypatch) -> None:
    """The tables every checkpoint appends to checkpoint their Delta log every 20 commits and
    drop commit files older than the log retention (a minute; a second here), so the log
    does not grow with the run; a reader opened before the cleanup still updates, second
    readers read from the log checkpoint, and the first checkpoint's blobs still read."""
    hot = (StoreTable.OPERATOR_STATE, StoreTable.CHANNEL_STATE, StoreTable.SOURCE_OFFSETS)
    assert HOT_LOG == {
        "delta.checkpointInterval": "20",
        "delta.logRetentionDuration": "interval 1 minutes",
        "delta.deletedFileRetentionDuration": "interval 1 hours",
    }
    assert all(CONFIGURATION[t] == HOT_LOG for t in StoreTable)
    # a log checkpoint every 5 commits; a minute is a second here
    short = {"delta.checkpointInterval": "5", "delta.logRetentionDuration": "interval 1 seconds"}
    monkeypatch.setattr(
        store_tables, "CONFIGURATION", {**CONFIGURATION, **dict.fromkeys(hot, short)}
    )
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    offsets = [SourceOffset("kafka", 0, 1)]

    def commit(i: int) -> CompletedCheckpoint:
        cp = commit_one(store, lease, lease.first_id + i, keyed(0, kv(f"k{i}", i)), offsets=offsets)
        store.retain(lease, 100)  # the offsets' copy: one append per retention
        return cp

    first = commit(0)  # table version 1 (0: created empty)
    state = root / StoreTable.OPERATOR_STATE.value
    reader = DeltaTable(str(state))
    assert DeltaTable(str(state)).metadata().configuration == short
    for i in range(1, 5):
        commit(i)  # version 5: the log's first checkpoint
    time.sleep(1.1)  # that checkpoint and the commits before it are older than the retention
    n = 10
    for i in range(5, n):
        commit(i)  # version 10: a checkpoint, and the cleanup of the commits before 5
    for table in (state, root / StoreTable.SOURCE_OFFSETS.value):
        commits = sorted(int(f.stem) for f in (table / "_delta_log").glob("*.json"))
        # the reader's version (1) is gone; delta-rs keeps from about the older checkpoint
        assert commits[0] > 1 and commits == list(range(commits[0], n + 1))
    reader.update_incremental()
    assert reader.version() == n
    assert sorted(pl.read_delta(str(state))["checkpoint_id"]) == [
        lease.first_id + i for i in range(n)
    ]
    assert store.read_blobs(list(first.blobs()))[0].equals(kv("k0", 0))


def test_log_checkpoints_forget_removals_older_than_the_retention(root: Path, monkeypatch) -> None:
    """Retention removes about as many blob files as the tasks add; a Delta log checkpoint
    carries every removal younger than ``delta.deletedFileRetentionDuration`` (an hour here, a
    second in this test), so it stays small instead of growing all week."""
    short = {
        "delta.checkpointInterval": "5",
        "delta.logRetentionDuration": "interval 1 seconds",
        "delta.deletedFileRetentionDuration": "interval 1 seconds",
    }
    monkeypatch.setattr(
        store_tables,
        "CONFIGURATION",
        {**CONFIGURATION, StoreTable.OPERATOR_STATE: short},
    )
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    state = root / StoreTable.OPERATOR_STATE.value

    def checkpoint_then_retain(i: int) -> None:
        commit_one(store, lease, lease.first_id + i, keyed(0, kv("k", i)))
        store.retain(lease, 1)  # drops the previous checkpoint: its blob file is removed

    for i in range(6):
        checkpoint_then_retain(i)
    time.sleep(1.1)
    since_ms = time.time() * 1000
    for i in range(6, 20):
        checkpoint_then_retain(i)
    newest = max((state / "_delta_log").glob("*.checkpoint.parquet"))
    removes = [r for r in pq.read_table(newest).column("remove").to_pylist() if r is not None]
    assert removes and all(r["deletionTimestamp"] >= since_ms for r in removes)
    assert pl.read_delta(str(state))["checkpoint_id"].to_list() == [lease.first_id + 19]


def test_the_log_keeps_a_short_log_and_as_of_reads_the_recorded_completions(
    root: Path, monkeypatch
) -> None:
    """``checkpoints`` drops its old commit files too (a commit's cost grows with them); a
    restore as of a time then finds, from the completion times the log and the history
    record, the checkpoint Delta time travel on the whole log would have found — also one
    that retention removed since (the caller refuses it: not retained) — and refuses a time
    whose answer the bounded history may have forgotten."""
    short = {"delta.checkpointInterval": "5", "delta.logRetentionDuration": "interval 1 seconds"}
    monkeypatch.setattr(
        store_tables, "CONFIGURATION", {**CONFIGURATION, StoreTable.CHECKPOINTS: short}
    )
    clock = ManualClock(10_000)
    store = DeltaCheckpointStore(str(root), clock=clock)
    lease = store.acquire()
    completed_at: dict[int, int] = {}
    for i in range(12):
        cid = lease.first_id + i
        h = store.write_task_state(cid, TaskSnapshot(TASK, (keyed(0, kv(f"k{i}", i)),), ()))
        at = 100_000 + 1_000 * i
        stats = CheckpointStats(at - 100, at, h.state_bytes())
        kind = SnapshotType.SAVEPOINT if i == 1 else SnapshotType.CHECKPOINT
        store.commit(lease, CompletedCheckpoint(cid, kind, (h,), stats))
        completed_at[cid] = at
        if i == 5:
            time.sleep(1.1)  # the commits so far are older than the (short) log retention
    store.retain(lease, 2, history_size=6)  # records, then keeps the newest two (and savepoints)
    log = root / StoreTable.CHECKPOINTS.value
    assert DeltaTable(str(log)).metadata().configuration == short
    assert min(int(f.stem) for f in (log / "_delta_log").glob("*.json")) > 1  # cleaned up
    ids = sorted(completed_at)
    savepoint = ids[1]
    assert [c.checkpoint_id for c in store.list_completed()] == [savepoint, *ids[-2:]]

    def as_of(ms: int) -> int:
        return checkpoint_as_of(str(root), datetime.fromtimestamp(ms / 1000, UTC))

    # an oracle: the largest id completed by then (no history bound in the way)
    for cid, at in sorted(completed_at.items())[-6:]:
        assert as_of(at) == cid and as_of(at + 999) == cid
    newest = max(completed_at)
    assert as_of(completed_at[newest] + 60_000) == newest
    # the history kept the newest six of the twelve: earlier times may have lost their
    # answer (the savepoint is known, but a forgotten checkpoint may have completed later)
    with pytest.raises(RestoreError, match="not known any more"):
        as_of(completed_at[ids[3]])
    with pytest.raises(RestoreError, match=r"no checkpoint .* forgot the checkpoints below"):
        as_of(completed_at[ids[0]])


def test_a_root_of_an_earlier_version_gets_the_short_logs_with_the_next_lease(
    root: Path, monkeypatch
) -> None:
    """Tables created with Delta's log defaults (an earlier version) get the missing
    properties when a coordinator takes its lease; the protocol stays reader 1 / writer 2."""
    monkeypatch.setattr(store_tables, "CONFIGURATION", {})
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    commit_one(store, lease, lease.first_id, keyed(0, kv("a", 1)))
    log = root / StoreTable.CHECKPOINTS.value
    assert "delta.logRetentionDuration" not in DeltaTable(str(log)).metadata().configuration
    monkeypatch.undo()
    store = DeltaCheckpointStore(str(root))
    store.acquire()
    for table in (StoreTable.CHECKPOINTS, StoreTable.OPERATOR_STATE):
        dt = DeltaTable(str(root / table.value))
        assert dt.metadata().configuration == dict(CONFIGURATION[table])
        assert (dt.protocol().min_reader_version, dt.protocol().min_writer_version) == (1, 2)
    DeltaTable(str(log)).alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 7 days"}  # the user's choice stays
    )
    version = DeltaTable(str(log)).version()
    store.acquire()  # nothing missing: no metadata commit, only the lease
    conf = DeltaTable(str(log)).metadata().configuration
    assert conf["delta.logRetentionDuration"] == "interval 7 days"
    assert DeltaTable(str(log)).version() == version + 1
    assert store.get(lease.first_id).checkpoint_id == lease.first_id


def test_a_followed_table_is_opened_again_after_some_versions(tmp_path: Path, monkeypatch) -> None:
    """A cached table object follows every commit of another writer, and is replaced by a
    new one once it is ``REOPEN_AFTER_VERSIONS`` past the version it was opened at."""
    monkeypatch.setattr(followed_table, "REOPEN_AFTER_VERSIONS", 3)
    uri = str(tmp_path / "t")
    followed = followed_table.FollowedTable(uri, None)
    assert followed.newest() is None  # not created yet
    write_deltalake(uri, pa.table({"a": [0]}))
    first = followed.newest()
    assert first is not None and first.version() == 0
    seen = []
    for v in range(1, 8):
        write_deltalake(uri, pa.table({"a": [v]}), mode="append")
        dt = followed.newest()
        assert dt is not None and dt.version() == v
        assert sorted(dt.to_pyarrow_table()["a"].to_pylist()) == list(range(v + 1))
        seen.append(dt is first)
    assert seen == [True, True, False, False, False, False, False]  # new at 3, again at 6
    assert followed.newest() is followed.newest()


def test_a_followed_table_is_opened_again_when_old_or_failing(tmp_path: Path, monkeypatch) -> None:
    """An object older than ``REOPEN_AFTER_S`` is replaced (its snapshot may need commit
    files the log's cleanup removed), and so is one whose update fails or that a failed
    use gave up (``forget``)."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"a": [0]}))
    followed = followed_table.FollowedTable(uri, None)
    first = followed.newest()
    assert followed.newest() is first
    monkeypatch.setattr(followed_table, "REOPEN_AFTER_S", 0.0)
    second = followed.newest()
    assert second is not first and second is not None and second.version() == 0
    monkeypatch.setattr(followed_table, "REOPEN_AFTER_S", 3600.0)
    assert followed.newest() is second

    def gone() -> None:
        raise FileNotFoundError("Object at location _delta_log/00000000000000000001.json")

    write_deltalake(uri, pa.table({"a": [1]}), mode="append")
    second.update_incremental = gone  # type: ignore[method-assign]
    third = followed.newest()
    assert third is not second and third is not None and third.version() == 1
    followed.forget()
    fourth = followed.newest()
    assert fourth is not third and fourth is not None and fourth.version() == 1


def test_a_write_whose_log_read_fails_after_its_commit_is_not_duplicated(
    root: Path, monkeypatch
) -> None:
    """delta-rs may fail after a commit landed (a log checkpoint that reads a commit file
    the cleanup removed): the write is tried again on a new table object, finds its rows
    and adds none."""
    from spark_ckpt.delta import blob_store

    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    real = blob_store.write_deltalake
    failed: list[int] = []

    def fails_after_the_first_commit(*args, **kwargs):
        real(*args, **kwargs)
        if not failed:
            failed.append(1)
            raise FileNotFoundError("Object at location _delta_log/00000000000000000007.json")

    monkeypatch.setattr(blob_store, "write_deltalake", fails_after_the_first_commit)
    snap = TaskSnapshot(TASK, (keyed(0, kv("a", 1)),), (), (SourceOffset("kafka", 0, 3),))
    h = store.write_task_state(lease.first_id, snap)
    assert failed == [1]
    assert len(pl.read_delta(str(root / "operator_state"))) == 1
    failed.clear()
    cp = CompletedCheckpoint(lease.first_id, SnapshotType.CHECKPOINT, (h,), CheckpointStats(0, 1))
    store.commit(lease, cp)
    store.retain(lease, 1)  # the offsets' copy
    assert failed == [1]
    assert len(pl.read_delta(str(root / "source_offsets"))) == 1
    assert store.read_blobs(list(h.blobs))[0].equals(kv("a", 1))


def test_the_offsets_copy_is_one_append_per_retention_and_a_savepoints_at_its_completion(
    root: Path,
) -> None:
    """A checkpoint's source offsets reach ``source_offsets`` with the next retention, one
    append for every kept checkpoint the table lacks (a checkpoint retention drops is never
    copied); a savepoint's with its completion."""
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    table = root / StoreTable.SOURCE_OFFSETS.value
    expected: dict[int, list[tuple[str, int, int]]] = {}

    def complete(i: int, kind: SnapshotType) -> int:
        cid = lease.first_id + i
        offsets = (SourceOffset("kafka", 0, 10 * i), SourceOffset("kafka", 1, 10 * i + 1))
        h = store.write_task_state(
            cid, TaskSnapshot(TASK, (keyed(0, kv(f"k{i}", i)),), (), offsets)
        )
        store.commit(lease, CompletedCheckpoint(cid, kind, (h,), CheckpointStats(0, 1)))
        expected[cid] = [(o.source, o.channel, o.offset) for o in offsets]
        return cid

    def copied() -> dict[int, list[tuple[str, int, int]]]:
        rows = pl.read_delta(str(table)).sort("checkpoint_id", "channel").iter_rows(named=True)
        out: dict[int, list[tuple[str, int, int]]] = {}
        for r in rows:
            out.setdefault(r["checkpoint_id"], []).append((r["source"], r["channel"], r["offset"]))
        return out

    dropped = complete(0, SnapshotType.CHECKPOINT)
    complete(1, SnapshotType.CHECKPOINT)
    assert not table.exists()
    savepoint = complete(2, SnapshotType.SAVEPOINT)
    assert copied() == {savepoint: expected[savepoint]}
    complete(3, SnapshotType.CHECKPOINT)
    versions = len(log_actions(table))
    store.retain(lease, 2)  # keeps the newest two checkpoints and the savepoint
    kept = [c.checkpoint_id for c in store.list_completed()]
    assert dropped not in kept and savepoint in kept
    assert copied() == {cid: expected[cid] for cid in kept}
    assert len(log_actions(table)) == versions + 1
    store.retain(lease, 2)  # nothing new: no append
    assert len(log_actions(table)) == versions + 1


def test_the_offsets_copy_scans_only_when_some_may_be_written(root: Path, monkeypatch) -> None:
    """Ids above the copy's app transaction (the highest id written) cannot be in it: their
    append looks none of them up in ``source_offsets`` first (the garbage collection's own
    scan of the table's ids is another matter)."""
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    scanned: list[str] = []
    scan = store_tables.StoreTables.scan

    def recording_scan(self, dt, *args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("ids") is not None:
            scanned.append(dt.table_uri.rstrip("/").rsplit("/", 1)[-1])
        return scan(self, dt, *args, **kwargs)

    monkeypatch.setattr(store_tables.StoreTables, "scan", recording_scan)
    for i in range(4):
        cid = lease.first_id + i
        offsets = (SourceOffset("kafka", 0, i),)
        h = store.write_task_state(cid, TaskSnapshot(TASK, (keyed(0, kv("k", i)),), (), offsets))
        store.commit(
            lease, CompletedCheckpoint(cid, SnapshotType.CHECKPOINT, (h,), CheckpointStats(0, 1))
        )
        scanned.clear()
        store.retain(lease, 2)
        assert StoreTable.SOURCE_OFFSETS.value not in scanned, i
    copied = pl.read_delta(str(root / StoreTable.SOURCE_OFFSETS.value))
    kept = [c.checkpoint_id for c in store.list_completed()]
    assert sorted(copied["checkpoint_id"].to_list()) == kept == [lease.first_id + i for i in (2, 3)]


def test_completion_is_one_small_append(root: Path) -> None:
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    h = store.write_task_state(lease.first_id, TaskSnapshot(TASK, (keyed(0, kv("a", 1)),)))
    before = {t: len(log_actions(root / t.value)) for t in StoreTable}
    store.commit(
        lease,
        CompletedCheckpoint(lease.first_id, SnapshotType.CHECKPOINT, (h,), CheckpointStats(0, 1)),
    )
    after = {t: len(log_actions(root / t.value)) for t in StoreTable}
    assert after[StoreTable.CHECKPOINTS] == before[StoreTable.CHECKPOINTS] + 1
    assert {t: after[t] - before[t] for t in StoreTable if t is not StoreTable.CHECKPOINTS} == {
        StoreTable.OPERATOR_STATE: 0,
        StoreTable.CHANNEL_STATE: 0,
        StoreTable.SOURCE_OFFSETS: 0,
        StoreTable.HISTORY: 0,  # recorded at the next retention, off the completion path
    }
    _, actions = log_actions(root / "checkpoints")[-1]
    adds = [a["add"] for a in actions if "add" in a]
    assert len(adds) == 1 and not any("remove" in a for a in actions)
    assert json.loads(adds[0]["stats"])["numRecords"] == 1


def test_the_completed_checkpoints_after_a_completion_or_retention_decode_nothing(
    root: Path, monkeypatch
) -> None:
    """The coordinator reads a checkpoint back right after committing it (its sink commit)
    and lists the log after each retention: the store's parsed log follows its own commits
    instead of decoding every retained checkpoint again, and says what a fresh reader says."""
    from spark_ckpt.delta import checkpoint_log

    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    ids = [lease.first_id + i for i in range(4)]
    for cid in ids[:2]:
        commit_one(store, lease, cid, keyed(0, kv("a", cid)))
    store.list_completed()
    decoded: list[int] = []
    parse = checkpoint_log.parse_completed

    def counting_parse(rows):  # type: ignore[no-untyped-def]
        decoded.append(1)
        return parse(rows)

    monkeypatch.setattr(checkpoint_log, "parse_completed", counting_parse)
    for cid in ids[2:]:
        cp = commit_one(store, lease, cid, keyed(0, kv("a", cid)))
        assert store.get(cid) == cp
    store.retain(lease, 1)
    listed = [c.checkpoint_id for c in store.list_completed()]
    assert decoded == [] and listed == [ids[-1]]
    fresh = DeltaCheckpointStore(str(root)).list_completed()
    assert fresh == store.list_completed()


def test_a_reader_polling_the_log_decodes_each_checkpoint_once(root: Path, monkeypatch) -> None:
    """A process that only reads the log (the driver's reporter, a client) lists it after
    every completion another process committed: each checkpoint is decoded once."""
    from spark_ckpt.delta import checkpoint_log

    writer = DeltaCheckpointStore(str(root))
    lease = writer.acquire()
    reader = DeltaCheckpointStore(str(root))
    decoded: list[list[int]] = []
    parse = checkpoint_log.parse_completed

    def counting_parse(rows):  # type: ignore[no-untyped-def]
        rows = list(rows)
        decoded.append([cid for cid, _ in rows])
        return parse(rows)

    monkeypatch.setattr(checkpoint_log, "parse_completed", counting_parse)
    ids = [lease.first_id + i for i in range(3)]
    for cid in ids:
        cp = commit_one(writer, lease, cid, keyed(0, kv("a", cid)))
        decoded.clear()
        assert reader.list_completed()[-1] == cp
        assert decoded == [[cid]]
    writer.retain(lease, 1)
    decoded.clear()
    assert [c.checkpoint_id for c in reader.list_completed()] == [ids[-1]]
    assert decoded == []


def test_a_reader_polling_the_log_reads_each_data_file_once(root: Path) -> None:
    """A new version of the log is read file by file, only the files the reader has not
    read: a reader that listed the log does not open an older completion's file again
    (here the file is made unreadable after the listing; a fresh reader fails on it), and
    still lists what a fresh reader lists once the log moves on past that file."""
    writer = DeltaCheckpointStore(str(root))
    lease = writer.acquire()
    reader = DeltaCheckpointStore(str(root))
    first = commit_one(writer, lease, lease.first_id, keyed(0, kv("a", 1)))
    assert reader.list_completed() == [first]
    (old,) = [  # the completion's file (the lease row carries the id too)
        f
        for f in files_of_checkpoint(root, first.checkpoint_id, StoreTable.CHECKPOINTS)
        if pq.read_table(f, columns=["record"])["record"].to_pylist() == ["completed"]
    ]
    kept = old.read_bytes()
    old.write_bytes(b"not parquet")
    second = commit_one(writer, lease, lease.first_id + 1, keyed(0, kv("a", 2)))
    assert reader.list_completed() == [first, second]
    with pytest.raises(StoreError):
        DeltaCheckpointStore(str(root)).list_completed()
    old.write_bytes(kept)
    writer.retain(lease, 1)
    assert reader.list_completed() == [second] == DeltaCheckpointStore(str(root)).list_completed()


def test_a_reader_polling_the_history_scans_it_once_per_version(root: Path, monkeypatch) -> None:
    """The driver's reporter asks for the completed ids twice a second and a waiting client
    for the failures; the history changes at each retention only: each version is scanned
    once, by readers and by the writer that wrote it, and every answer is what a fresh
    reader says."""
    writer = DeltaCheckpointStore(str(root))
    lease = writer.acquire()
    reader = DeltaCheckpointStore(str(root))
    scanned: list[int] = []
    scan = store_tables.StoreTables.scan

    def recording_scan(self, dt, *args, **kwargs):  # type: ignore[no-untyped-def]
        if dt.table_uri.rstrip("/").endswith(StoreTable.HISTORY.value):
            scanned.append(dt.version())
        return scan(self, dt, *args, **kwargs)

    monkeypatch.setattr(store_tables.StoreTables, "scan", recording_scan)
    ids = [lease.first_id + i for i in range(3)]
    for cid in ids:
        commit_one(writer, lease, cid, keyed(0, kv("a", cid)))
        writer.retain(lease, 1)
        scanned.clear()
        for _ in range(3):
            assert reader.completed_ids() == ids[: ids.index(cid) + 1]
            assert reader.list_failed() == []
            assert [r.checkpoint_id for r in reader.list_history()] == ids[: ids.index(cid) + 1]
        version = DeltaTable(str(root / StoreTable.HISTORY.value)).version()
        assert scanned == [version]  # the reader's first poll at this version
    failed = FailedCheckpoint(ids[-1] + 1, SnapshotType.CHECKPOINT, 1, 2, "declined", "no")
    scanned.clear()
    writer.record_failure(lease, failed)  # the writer knows the version it wrote
    writer.retain(lease, 1)
    assert scanned == []
    assert reader.list_failed() == [failed] == DeltaCheckpointStore(str(root)).list_failed()
    assert reader.completed_ids() == ids == writer.completed_ids()


def test_completion_reads_blob_tables_only_where_their_logs_do_not_tell(
    root: Path, monkeypatch
) -> None:
    """The completion check takes a blob of the checkpoint's own tasks as stored when the
    task's app transaction is at the checkpoint, and a reused blob when a completed
    checkpoint references it; everything else is looked up, and a blob retention removed
    is refused."""
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    scans: list[int] = []
    real_scan = DeltaBlobStore._stored_refs

    def counted(self, dt, ids, wanted=None):
        scans.append(len(wanted or ()))
        return real_scan(self, dt, ids, wanted)

    monkeypatch.setattr(DeltaBlobStore, "_stored_refs", counted)

    def checkpoint(cid: int, *handles) -> CompletedCheckpoint:
        return CompletedCheckpoint(cid, SnapshotType.CHECKPOINT, handles, CheckpointStats(0, 1))

    first = lease.first_id
    base = store.write_task_state(first, TaskSnapshot(TASK, (keyed(0, kv("a", 1)),)))
    store.commit(lease, checkpoint(first, base))
    assert scans == []  # its own new blob: the task's commit is the newest
    # the next one reuses the first one's blob, which the first (completed) references
    h = store.write_task_state(first + 1, TaskSnapshot(TASK, (keyed(1, kv("b", 2)),), base.blobs))
    store.commit(lease, checkpoint(first + 1, h))
    assert scans == []
    # the task moved on to a later checkpoint before this one completes: looked up
    late = store.write_task_state(first + 2, TaskSnapshot(TASK, (keyed(2, kv("c", 3)),)))
    store.write_task_state(first + 3, TaskSnapshot(TASK, (keyed(3, kv("d", 4)),)))
    store.commit(lease, checkpoint(first + 2, late))
    assert scans == [1]
    # retention keeps the newest only: the first blob is garbage, and a checkpoint that
    # still reuses it is refused
    store.retain(lease, 1)
    with pytest.raises(StoreError, match="never written"):
        store.commit(lease, checkpoint(first + 3, TaskStateHandle(TASK, base.blobs)))
    assert [c.checkpoint_id for c in store.list_completed()] == [first + 2]


def test_a_pending_checkpoint_overtaken_by_a_completed_one_is_looked_up(root: Path) -> None:
    """A checkpoint still pending when a newer one (a savepoint, say) completed is not newer
    than every completed one: garbage collection may have removed its blobs, whatever its
    tasks' app transactions say, so its completion looks them up and refuses."""
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    first = lease.first_id
    channel = StateBlob("agg", 0, BlobKind.CHANNEL, "in_flight", kv("r", 1), channel=0)
    pending = store.write_task_state(first, TaskSnapshot(TASK, (channel,)))
    commit_one(store, lease, first + 1, keyed(0, kv("a", 1)))  # writes no channel state
    store.retain(lease, 1)  # collects the channel blob: no completed checkpoint needs it
    late = CompletedCheckpoint(first, SnapshotType.CHECKPOINT, (pending,), CheckpointStats(0, 1))
    with pytest.raises(StoreError, match="never written"):
        store.commit(lease, late)
    assert [c.checkpoint_id for c in store.list_completed()] == [first + 1]


def test_read_blobs_reads_many_key_groups_in_one_scan(root: Path, monkeypatch) -> None:
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    tables = [kv(f"k{i}", i) for i in range(128)]
    cp = commit_one(store, lease, lease.first_id, *(keyed(i, t) for i, t in enumerate(tables)))
    scans = []
    real = DeltaTable.to_pyarrow_dataset

    def counting(self, *a, **kw):
        scans.append(self.table_uri)
        return real(self, *a, **kw)

    monkeypatch.setattr(DeltaTable, "to_pyarrow_dataset", counting)
    refs = sorted(cp.blobs(), key=lambda r: -r.key_group_start)  # any order in, same order out
    got = store.read_blobs(refs)
    assert len(scans) == 1
    assert [g.equals(tables[r.key_group_start]) for g, r in zip(got, refs, strict=True)] == [
        True
    ] * 128


def test_a_blob_is_read_from_its_own_row_group(root: Path) -> None:
    """Each blob row is a Parquet row group of its own and the payloads carry no statistics
    (which would put whole payloads into the footer): a read decodes the row groups of the
    blobs it asks for, so a damaged neighbour in the same file does not stop it, while the
    damaged blob itself is corrupt."""
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    rng = np.random.default_rng(5)
    tables = [pa.table({"k": rng.integers(0, 1 << 62, 20_000)}) for _ in range(3)]
    cp = commit_one(store, lease, lease.first_id, *(keyed(i, t) for i, t in enumerate(tables)))
    [path] = files_of_checkpoint(root, cp.checkpoint_id)
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups == 3
    payload = meta.schema.names.index("payload")
    assert all(meta.row_group(g).column(payload).statistics is None for g in range(3))
    assert meta.serialized_size < 64 << 10  # no payload in the footer
    in_group = pq.ParquetFile(path).read(columns=["blob_id"]).column("blob_id").to_pylist()
    refs = {blob_id(r): r for r in cp.blobs()}
    damaged = refs[in_group[1]]
    flip_byte_in_file(path, sum(column_chunk_span(path, "payload", row_group=1)) // 2)
    for g in (0, 2):
        ref = refs[in_group[g]]
        assert store.read_blob(ref).equals(tables[ref.key_group_start])
    with pytest.raises(CorruptCheckpointError):
        store.read_blob(damaged)


# ------------------------------------------------------------------ crashes

_CRASH_SCRIPT = """
import os, signal, sys
import pyarrow as pa
from spark_ckpt.delta.blob_store import DeltaBlobStore
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.delta.store_layout import StoreTable
from spark_ckpt.protocol.state_handles import (
    BlobKind, SourceOffset, StateBlob, TaskId, TaskSnapshot,
)
root, point = sys.argv[1], sys.argv[2]
store = DeltaCheckpointStore(root)
lease = store.acquire()
print(lease.first_id, lease.end_id, flush=True)
snap = TaskSnapshot(
    TaskId("agg", 0),
    (StateBlob("agg", 0, BlobKind.KEYED_FULL, "counts", pa.table({"k": ["a"]}),
               key_group_start=0, key_group_end=0),
     StateBlob("agg", 0, BlobKind.CHANNEL, "inflight", pa.table({"r": [1]}), channel=0)),
    (),
    (SourceOffset("kafka", 0, 5),),
)
if point == "between-tables":
    real = DeltaBlobStore._write_blobs
    def write_then_die(self, table, *a):
        out = real(self, table, *a)
        if table is StoreTable.OPERATOR_STATE:
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    DeltaBlobStore._write_blobs = write_then_die
store.write_task_state(lease.first_id, snap)
os.kill(os.getpid(), signal.SIGKILL)  # before the completion commit
"""


@pytest.mark.parametrize("point", ["before-commit", "between-tables"])
def test_crash_before_commit_leaves_nothing_visible(root: Path, point: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH_SCRIPT, str(root), point],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr
    crashed_first, crashed_end = map(int, proc.stdout.split())
    store = DeltaCheckpointStore(str(root))
    assert store.list_completed() == []
    assert store.latest_completed() is None
    written = {r.kind for r in store.stored_blobs()}
    assert written == (
        {BlobKind.KEYED_FULL, BlobKind.CHANNEL}
        if point == "before-commit"
        else {BlobKind.KEYED_FULL}
    )
    # The next coordinator takes over with fresh ids and works normally.
    lease = store.acquire()
    assert lease.first_id >= crashed_end > crashed_first
    cp = commit_one(store, lease, lease.first_id, keyed(0, kv("b", 2)))
    assert store.latest_completed() == cp
    # Retention collects the crashed attempt's unreferenced state.
    store.retain(lease, 1)
    assert {r.checkpoint_id for r in store.stored_blobs()} == {lease.first_id}


def test_rewrite_after_partial_write_completes_without_duplicates(root: Path, monkeypatch) -> None:
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    snap = TaskSnapshot(
        TASK,
        (keyed(0, kv("a", 1)), StateBlob("agg", 0, BlobKind.CHANNEL, "c", kv("r", 1), channel=0)),
        (),
        (SourceOffset("kafka", 0, 1),),
    )

    class Crash(Exception):
        pass

    real = DeltaBlobStore._write_blobs

    def crash_at_the_second_table(self, table, *args):
        if table is StoreTable.CHANNEL_STATE:
            raise Crash
        return real(self, table, *args)

    monkeypatch.setattr(DeltaBlobStore, "_write_blobs", crash_at_the_second_table)
    with pytest.raises(Crash):
        store.write_task_state(lease.first_id, snap)
    monkeypatch.setattr(DeltaBlobStore, "_write_blobs", real)
    h1 = store.write_task_state(lease.first_id, snap)
    h2 = DeltaCheckpointStore(str(root)).write_task_state(lease.first_id, snap)
    assert h1 == h2
    assert len(pl.read_delta(str(root / "operator_state"))) == 1
    assert len(pl.read_delta(str(root / "channel_state"))) == 1
    assert not (root / "source_offsets").exists()  # copied by the coordinator, not the task
    cp = CompletedCheckpoint(lease.first_id, SnapshotType.CHECKPOINT, (h1,), CheckpointStats(0, 1))
    store.commit(lease, cp)
    store.commit(lease, cp)  # a replayed completion
    DeltaCheckpointStore(str(root)).commit(lease, cp)  # ... by another instance
    assert not (root / "source_offsets").exists()  # a checkpoint's: by the next retention
    store.retain(lease, 1)
    store.retain(lease, 1)  # a replayed retention
    DeltaCheckpointStore(str(root)).retain(lease, 1)  # ... by another instance
    offsets = pl.read_delta(str(root / "source_offsets"))
    assert offsets.select(
        "checkpoint_id", "vertex", "subtask", "source", "channel", "offset"
    ).rows() == [(lease.first_id, "agg", 0, "kafka", 0, 1)]


# ------------------------------------------------------------------ fencing is atomic


def test_lease_landing_between_check_and_commit_fences_the_commit(root: Path, monkeypatch) -> None:
    """A new epoch committed right after the old coordinator checked its lease (the race a
    non-atomic check would lose) must still fence the old coordinator's commit."""
    old_store = DeltaCheckpointStore(str(root))
    old = old_store.acquire()
    h = old_store.write_task_state(old.first_id, TaskSnapshot(TASK, (keyed(0, kv("a", 1)),)))
    rival = DeltaCheckpointStore(str(root))
    real_view = DeltaCheckpointLog._view
    injected = []

    def view_then_rival_acquires(self, dt):
        v = real_view(self, dt)
        if self is old_store._log and not injected:
            injected.append(rival.acquire())  # lands after our check, before our commit
        return v

    monkeypatch.setattr(DeltaCheckpointLog, "_view", view_then_rival_acquires)
    cp = CompletedCheckpoint(old.first_id, SnapshotType.CHECKPOINT, (h,), CheckpointStats(0, 1))
    with pytest.raises(FencedError):
        old_store.commit(old, cp)
    assert injected and DeltaCheckpointStore(str(root)).list_completed() == []


@pytest.mark.slow  # several Python processes
def test_two_coordinator_processes_racing(root: Path) -> None:
    DeltaCheckpointStore(str(root)).acquire()  # create the table before the race
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "spark_ckpt.testing.lease_racer", str(root), "12"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=80)
        assert p.returncode == 0, err
        results.extend(json.loads(out))
    won = {(e, c) for e, c, r in results if r == "won"}
    fenced = {(e, c) for e, c, r in results if r == "fenced"}
    # Replay the log by hand, in commit order: every completion must carry the newest epoch
    # leased before it (so no fenced coordinator committed), and the log must hold exactly
    # the commits the processes saw succeed.
    newest = 0
    logged = set()
    for _, actions in log_actions(root / "checkpoints"):
        for a in actions:
            if "add" not in a:
                continue
            path = root / "checkpoints" / a["add"]["path"]
            for row in duckdb.sql(
                f"SELECT record, epoch, checkpoint_id FROM read_parquet('{path}')"
            ).fetchall():
                if row[0] == "lease":
                    assert row[1] > newest  # epochs strictly increase in log order
                    newest = row[1]
                else:
                    assert row[1] == newest
                    logged.add((row[1], row[2]))
    assert logged == won
    assert not won & fenced
    ids = sorted(c for _, c in logged)
    assert len(ids) == len(set(ids))  # each checkpoint id committed once
    assert len(won) + len(fenced) == 2 * 12 * 2


# ------------------------------------------------------------------ corruption on disk


def test_overwritten_parquet_file_is_corrupt(root: Path) -> None:
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    cp = commit_one(store, lease, lease.first_id, keyed(0, kv("a", 1)))
    (data_file,) = active_files(root / "operator_state")
    Path(data_file).write_bytes(b"this is not parquet" * 10)
    with pytest.raises(CorruptCheckpointError):
        DeltaCheckpointStore(str(root)).read_blob(next(iter(cp.blobs())))


def test_deleted_parquet_file_is_corrupt(root: Path) -> None:
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    commit_one(store, lease, lease.first_id, keyed(0, kv("a", 1)))
    for f in active_files(root / "checkpoints"):
        os.remove(f)
    with pytest.raises(StoreError):
        DeltaCheckpointStore(str(root)).list_completed()


def test_tampered_metadata_row_is_corrupt(root: Path) -> None:
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    cp = commit_one(store, lease, lease.first_id, keyed(0, kv("a", 1)))
    dt = DeltaTable(str(root / "checkpoints"))
    fs = pafs.SubTreeFileSystem(str(root / "checkpoints"), pafs.LocalFileSystem())
    rows = dt.to_pyarrow_dataset(filesystem=fs).to_table()
    row = rows.filter(pa.compute.equal(rows["record"], "completed"))
    forged = cp.to_json().replace('"trigger_ms":1000', '"trigger_ms":999')
    assert forged != cp.to_json()
    row = row.set_column(row.schema.get_field_index("metadata"), "metadata", pa.array([forged]))
    dt.delete("record = 'completed'")
    write_deltalake(dt, row, mode="append")
    with pytest.raises(CorruptCheckpointError):
        DeltaCheckpointStore(str(root)).list_completed()


def test_missing_blob_rows_of_committed_checkpoint_are_corrupt(root: Path) -> None:
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    cp = commit_one(store, lease, lease.first_id, keyed(0, kv("a", 1)), keyed(1, kv("b", 2)))
    gone = next(r for r in cp.blobs() if r.key_group_start == 1)
    DeltaTable(str(root / "operator_state")).delete(f"blob_id = '{blob_id(gone)}'")
    reader = DeltaCheckpointStore(str(root))
    with pytest.raises(CorruptCheckpointError):
        reader.read_blobs(list(cp.blobs()))
    # A blob nobody committed is merely not found.
    never = reader.write_task_state(lease.first_id + 1, TaskSnapshot(TASK, (keyed(2, kv("c", 3)),)))
    (ref,) = never.blobs
    DeltaTable(str(root / "operator_state")).delete(f"blob_id = '{blob_id(ref)}'")
    with pytest.raises(CheckpointNotFoundError):
        reader.read_blob(ref)


def test_store_errors_are_translated(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(StoreError) as info:
        DeltaCheckpointStore(str(not_a_dir)).acquire()
    assert info.value.__cause__ is not None


def test_vacuum_is_explicit_and_keeps_retained_state(root: Path) -> None:
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    commit_one(store, lease, lease.first_id, keyed(0, kv("a", 1)))
    last = commit_one(store, lease, lease.first_id + 1, keyed(0, kv("a", 2)))
    store.retain(lease, 1)
    on_disk = len(list((root / "operator_state").glob("*.parquet")))
    assert on_disk == 2  # retention removed a file from the table, not from the disk
    assert store.vacuum(dry_run=True) == []  # default retention (7 days) protects it
    deleted = store.vacuum(0, enforce_retention_duration=False)
    assert len(deleted) >= 1
    assert len(list((root / "operator_state").glob("*.parquet"))) == 1
    assert store.read_blob(next(iter(last.blobs()))).equals(kv("a", 2))


def test_retention_removes_whole_files_with_remove_actions_only(root: Path) -> None:
    """A completion is a one-row file, and a task's blobs of a checkpoint one file: retention
    and its garbage collection remove those files from the tables with commits of remove
    actions alone (nothing rewritten), which a second reader and an independent replay of
    the log agree on."""
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    ids = [lease.first_id + i for i in range(3)]
    for cid in ids:
        commit_one(store, lease, cid, keyed(0, kv("a", cid)))
    store.retain(lease, 1)
    for table in (StoreTable.CHECKPOINTS, StoreTable.OPERATOR_STATE):
        removals = [
            acts for _, acts in log_actions(root / table.value) if any("remove" in a for a in acts)
        ]
        assert len(removals) == 1, table
        (acts,) = removals
        assert not any("add" in a for a in acts)
        removed = [a["remove"] for a in acts if "remove" in a]
        assert len(removed) == 2 and all(r["dataChange"] and r["size"] > 0 for r in removed)
        assert all(r["deletionTimestamp"] > 0 for r in removed)
        assert active_files(root / table.value) == sorted(
            DeltaTable(str(root / table.value)).file_uris()
        )
    state = pl.read_delta(str(root / StoreTable.OPERATOR_STATE.value))
    assert state["checkpoint_id"].to_list() == [ids[-1]]
    log_rows = pl.read_delta(str(root / StoreTable.CHECKPOINTS.value))
    done = log_rows.filter(pl.col("record") == "completed")["checkpoint_id"].to_list()
    assert (
        done
        == [ids[-1]]
        == [c.checkpoint_id for c in DeltaCheckpointStore(str(root)).list_completed()]
    )


def test_a_garbage_removal_that_loses_to_a_task_append_runs_again(root: Path, monkeypatch) -> None:
    """A garbage file is removed with a commit of remove actions; when that commit loses to
    a task's append (here: the append is real, and the commit then fails as delta-rs fails
    a commit it cannot rebase), retention plans again on the newer version instead of
    failing (and warning) until its next pass."""
    from deltalake.exceptions import CommitFailedError

    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    for i in range(3):
        commit_one(store, lease, lease.first_id + i, keyed(0, kv(f"k{i}", i)))
    real = DeltaTable.create_write_transaction
    lost: list[int] = []

    def loses_once(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not lost and self.table_uri.rstrip("/").endswith(StoreTable.OPERATOR_STATE.value):
            lost.append(1)
            store.write_task_state(lease.first_id + 3, TaskSnapshot(TASK, (keyed(1, kv("z", 9)),)))
            raise CommitFailedError("a concurrent transaction removed the same file")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", loses_once)
    store.retain(lease, 1)
    assert lost == [1]
    ids = sorted(pl.read_delta(str(root / "operator_state"))["checkpoint_id"].to_list())
    assert ids == [lease.first_id + 2, lease.first_id + 3]  # garbage gone, the new write kept


def test_garbage_in_a_file_that_keeps_a_live_blob_is_deleted_and_a_lost_delete_runs_again(
    root: Path, monkeypatch
) -> None:
    """A task's append holds all its blobs of a checkpoint: when one of them is garbage and
    another still referenced (a state that did not change since), the file stays and the
    garbage row is deleted (copy-on-write); a delete that loses to a task's append runs
    again on the newer version."""
    from deltalake.exceptions import CommitFailedError

    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    first, second = lease.first_id, lease.first_id + 1
    other = StateBlob("agg", 0, BlobKind.KEYED_FULL, "other", kv("o", 1), 0, 0)
    h1 = store.write_task_state(first, TaskSnapshot(TASK, (keyed(0, kv("a", 1)), other)))
    store.commit(
        lease, CompletedCheckpoint(first, SnapshotType.CHECKPOINT, (h1,), CheckpointStats(0, 1))
    )
    kept = [r for r in h1.blobs if r.state_name == "other"]  # unchanged: reused
    h2 = store.write_task_state(second, TaskSnapshot(TASK, (keyed(0, kv("a", 2)),), tuple(kept)))
    store.commit(
        lease, CompletedCheckpoint(second, SnapshotType.CHECKPOINT, (h2,), CheckpointStats(0, 1))
    )
    (shared,) = files_of_checkpoint(root, first)
    real = DeltaTable.delete
    lost: list[int] = []

    def loses_once(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not lost and self.table_uri.rstrip("/").endswith(StoreTable.OPERATOR_STATE.value):
            lost.append(1)
            store.write_task_state(second + 1, TaskSnapshot(TASK, (keyed(1, kv("z", 9)),)))
            raise CommitFailedError("a concurrent transactions added new data")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "delete", loses_once)
    store.retain(lease, 1)
    assert lost == [1]
    left = pl.read_delta(str(root / "operator_state"))
    assert sorted(zip(left["checkpoint_id"], left["state_name"], strict=True)) == [
        (first, "other"),
        (second, "counts"),
        (second + 1, "counts"),
    ]
    assert shared not in data_files(root, StoreTable.OPERATOR_STATE)  # rewritten
    assert [store.read_blob(r) for r in h2.blobs] == [kv("a", 2), kv("o", 1)]


def test_reads_and_commits_after_retention_rewrote_files(tmp_path: Path) -> None:
    """delta-rs DELETE (retention) rewrites a data file that holds both dropped blobs and
    blobs a newer incremental checkpoint still reuses; the rewritten file carries string_view
    in its Arrow schema. Filtered reads and later commits must keep working on it."""
    store = DeltaCheckpointStore(str(tmp_path))
    lease = store.acquire()
    task = TaskId("op", 0)
    reused: tuple[BlobRef, ...] = ()
    for i in range(4):
        cid = lease.first_id + i
        fresh = tuple(
            StateBlob(
                "op",
                0,
                BlobKind.KEYED_FULL,
                "s",
                pa.table({"v": [i, kg]}),
                key_group_start=kg,
                key_group_end=kg,
            )
            for kg in range(3)
            if i == 0 or kg > 0  # key group 0 is written once, then reused by every checkpoint
        )
        handle = store.write_task_state(cid, TaskSnapshot(task, fresh, reused))
        reused = tuple(b for b in handle.blobs if b.key_group_start == 0)
        cp = CompletedCheckpoint(cid, SnapshotType.CHECKPOINT, (handle,), CheckpointStats(0, 1))
        store.commit(lease, cp)
        store.retain(lease, 1)
    ops = [h["operation"] for h in DeltaTable(store.table_uri(StoreTable.OPERATOR_STATE)).history()]
    assert "DELETE" in ops
    latest = store.latest_completed()
    assert latest is not None
    tables = store.read_blobs(sorted(latest.blobs(), key=lambda b: b.key_group_start))
    assert [t.column("v").to_pylist() for t in tables] == [[0, 0], [3, 1], [3, 2]]


# ------------------------------------------------------------------ verification of damaged files


def _two_checkpoints(root: Path) -> tuple[CompletedCheckpoint, CompletedCheckpoint]:
    """Two checkpoints, each with two keyed blobs and a channel blob; each task write is its
    own commit, so each checkpoint's rows are in their own data files."""
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    out = []
    for i in range(2):
        out.append(
            commit_one(
                store,
                lease,
                lease.first_id + i,
                keyed(0, pa.table({"k": [f"a{j}" for j in range(40)], "v": list(range(40))})),
                keyed(1, kv("b", i)),
                StateBlob("agg", 0, BlobKind.CHANNEL, "inflight", kv("r", i), channel=0),
            )
        )
    return out[0], out[1]


def _assert_damaged(root: Path, good: CompletedCheckpoint, bad: CompletedCheckpoint) -> str:
    """*bad* fails verification naming its id, *good* verifies, and a restore falls back
    from *bad* to *good*. Returns the error message."""
    store = DeltaCheckpointStore(str(root))
    with pytest.raises(CorruptCheckpointError) as info:
        store.verify(bad)
    assert info.value.checkpoint_id == bad.checkpoint_id
    assert f"checkpoint {bad.checkpoint_id} is damaged" in str(info.value)
    store.verify(good)
    restorable, skipped = DeltaCheckpointStore(str(root)).latest_restorable()
    assert restorable == good
    assert [e.checkpoint_id for e in skipped] == [bad.checkpoint_id]
    return str(info.value)


def test_flipped_payload_byte_is_a_checksum_failure_naming_the_blob(root: Path) -> None:
    good, bad = _two_checkpoints(root)
    damage = flip_byte_in_blob(root, bad.checkpoint_id)
    message = _assert_damaged(root, good, bad)
    assert f"blob_id {damage.row}" in message
    assert "fails its checksum" in message
    # exactly one payload byte differs, everything else is as written
    (ref,) = [r for r in bad.blobs() if blob_id(r) == damage.row]
    rows = pq.read_table(damage.path).to_pylist()
    [row] = [r for r in rows if r["blob_id"] == damage.row]
    stored = DeltaCheckpointStore(str(root))
    assert row["checksum"] == ref.checksum
    assert len(row["payload"]) == ref.nbytes
    other = [r for r in bad.blobs() if r != ref and r.kind is not BlobKind.CHANNEL]
    for r in other:  # the other blobs of the file still read back
        stored.read_blob(r)


@pytest.mark.parametrize("where", ["footer magic", "footer length", "payload pages", "blob ids"])
def test_flipped_byte_in_parquet_file_is_corrupt(root: Path, where: str) -> None:
    """A flipped byte anywhere a read depends on — the footer (pyarrow reports it as an
    OSError, like an I/O failure), the compressed pages of the payloads or of the blob ids
    (the row is not found) — is damage."""
    good, bad = _two_checkpoints(root)
    [path] = files_of_checkpoint(root, bad.checkpoint_id)
    payload = column_chunk_span(path, "payload")
    ids = column_chunk_span(path, "blob_id")
    offset = {
        "footer magic": -1,
        "footer length": -5,
        "payload pages": sum(payload) // 2,
        "blob ids": sum(ids) // 2,
    }[where]
    flip_byte_in_file(path, offset)
    _assert_damaged(root, good, bad)


@pytest.mark.parametrize("table", [StoreTable.OPERATOR_STATE, StoreTable.CHANNEL_STATE])
def test_deleted_data_file_is_corrupt(root: Path, table: StoreTable) -> None:
    good, bad = _two_checkpoints(root)
    path = delete_blob_file(root, bad.checkpoint_id, table)
    assert not path.exists()
    message = _assert_damaged(root, good, bad)
    assert f"{table.value} blob_id" in message
    # the lost file is named as the cause, by its full path (the store's root in it)
    assert f"data file {root}/{table.value}/{path.name} is gone" in message


def test_damaged_metadata_row_on_disk_is_skipped(root: Path) -> None:
    good, bad = _two_checkpoints(root)
    tamper_metadata(root, bad.checkpoint_id)
    store = DeltaCheckpointStore(str(root))
    with pytest.raises(CorruptCheckpointError):
        store.list_completed()
    restorable, skipped = store.latest_restorable()
    assert restorable == good
    assert [e.checkpoint_id for e in skipped] == [bad.checkpoint_id]


def test_verify_does_not_take_an_outage_for_damage(root: Path, monkeypatch) -> None:
    """An I/O error that is not damage (the object store is unreachable) propagates as a
    plain StoreError: a restore must not fall back to an older checkpoint because of it."""
    _good, bad = _two_checkpoints(root)
    store = DeltaCheckpointStore(str(root))
    store.list_completed()  # metadata cached; only the blob reads fail below

    def unreachable(self, *a, **kw):
        raise OSError("connection reset by peer")

    monkeypatch.setattr(DeltaTable, "to_pyarrow_dataset", unreachable)
    with pytest.raises(StoreError) as info:
        store.verify(bad)
    assert not isinstance(info.value, CorruptCheckpointError)
    with pytest.raises(StoreError) as info:
        store.latest_restorable()
    assert not isinstance(info.value, CorruptCheckpointError)


def test_verify_reads_each_table_once_when_intact(root: Path, monkeypatch) -> None:
    _good, bad = _two_checkpoints(root)
    store = DeltaCheckpointStore(str(root))
    store.list_completed()
    scans = []
    real = DeltaTable.to_pyarrow_dataset

    def counting(self, *a, **kw):
        scans.append(self.table_uri)
        return real(self, *a, **kw)

    monkeypatch.setattr(DeltaTable, "to_pyarrow_dataset", counting)
    store.verify(bad)
    assert len(scans) == 2  # operator_state and channel_state, one scan each


def test_file_by_file_check_accepts_intact_files_that_retention_rewrote(
    tmp_path: Path, monkeypatch
) -> None:
    """When the bulk read fails for a passing reason, verify examines the data files one by
    one: files delta-rs rewrote (string_view in their schema) must read as intact there."""
    store = DeltaCheckpointStore(str(tmp_path))
    lease = store.acquire()
    task = TaskId("op", 0)
    reused: tuple[BlobRef, ...] = ()
    for i in range(3):
        fresh = tuple(
            StateBlob(
                "op",
                0,
                BlobKind.KEYED_FULL,
                "s",
                pa.table({"v": [i, kg]}),
                key_group_start=kg,
                key_group_end=kg,
            )
            for kg in range(2)
            if i == 0 or kg > 0
        )
        handle = store.write_task_state(lease.first_id + i, TaskSnapshot(task, fresh, reused))
        reused = tuple(b for b in handle.blobs if b.key_group_start == 0)
        cp = CompletedCheckpoint(
            lease.first_id + i, SnapshotType.CHECKPOINT, (handle,), CheckpointStats(0, 1)
        )
        store.commit(lease, cp)
        store.retain(lease, 1)
    ops = [h["operation"] for h in DeltaTable(store.table_uri(StoreTable.OPERATOR_STATE)).history()]
    assert "DELETE" in ops
    real = DeltaCheckpointStore.read_blobs
    calls = []

    def flaky(self, refs):
        calls.append(len(refs))
        if len(calls) == 1:
            raise StoreError("reading blobs failed: OSError: connection reset")
        return real(self, refs)

    monkeypatch.setattr(DeltaCheckpointStore, "read_blobs", flaky)
    reader = DeltaCheckpointStore(str(tmp_path))
    reader.verify(cp)  # the bulk read failed, the file-by-file check passes
    assert calls == [2]


@pytest.mark.parametrize(
    ("column", "value"),
    [("payload", None), ("blob_id", b"\xff\xfe not utf-8"), ("checksum", b"\xc3\x28")],
)
def test_values_a_damaged_file_can_decode_to_are_corrupt_not_raw_errors(
    root: Path, column: str, value: object
) -> None:
    """pyarrow decodes a damaged file to values the schema forbids — a null payload,
    invalid UTF-8 — without complaint: reads and verify report them as corruption, never
    as a raw TypeError or UnicodeDecodeError."""
    good, bad = _two_checkpoints(root)
    damage = set_blob_value(root, bad.checkpoint_id, column, value)
    (ref,) = [r for r in bad.blobs() if blob_id(r) == damage.row]
    with pytest.raises(CorruptCheckpointError):
        DeltaCheckpointStore(str(root)).read_blob(ref)
    _assert_damaged(root, good, bad)

"""The CheckpointStore contract (spark_ckpt.storage.checkpoint_store module docstring), run against
every store.

Each test gets a ``Backend``: ``open()`` returns a handle onto the same storage — for the
in-memory store the same object, for the Delta store a *new* object on the same root, which
is what a coordinator restart does. Oracles are written out by hand in each test or kept in
a plain Python model, never computed by the store.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_ckpt.delta.blob_store import blob_id
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.errors import (
    CheckpointNotFoundError,
    ConfigError,
    CorruptCheckpointError,
    FencedError,
    StoreError,
)
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import (
    BlobKind,
    BlobRef,
    SourceOffset,
    StateBlob,
    TaskId,
    TaskSnapshot,
    TaskStateHandle,
)
from spark_ckpt.storage.checkpoint_store import CheckpointStore
from spark_ckpt.storage.lease import ID_BLOCK
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore
from spark_ckpt.testing.damage import tamper_metadata

# ------------------------------------------------------------------ backends


@dataclass
class Backend:
    name: str
    open: Callable[[], CheckpointStore]
    corrupt: Callable[[BlobRef], None]  # flip a byte of the stored payload
    lose: Callable[[BlobRef], None]  # remove the stored blob behind the store's back
    corrupt_metadata: Callable[[int], None]  # make a completed checkpoint's metadata fail


def _memory_backend(_: Path) -> Backend:
    store = InMemoryCheckpointStore()
    return Backend(
        "memory", lambda: store, store.corrupt_blob, store.lose_blob, store.corrupt_metadata
    )


def _delta_backend(root: Path) -> Backend:
    def corrupt(ref: BlobRef) -> None:
        # Tamper with the payload through Delta itself: replace the row by one whose payload
        # has its first byte flipped (what a bad writer or bit rot in a rewrite would do).
        table = "channel_state" if ref.kind is BlobKind.CHANNEL else "operator_state"
        dt = DeltaTable(str(root / table))
        rows = dt.to_pyarrow_dataset(
            filesystem=pa.fs.SubTreeFileSystem(str(root / table), pa.fs.LocalFileSystem())
        ).to_table()
        match = [
            i
            for i, d in enumerate(
                rows.select(
                    [
                        "checkpoint_id",
                        "operator_uid",
                        "state_name",
                        "key_group_start",
                        "channel",
                        "seq",
                    ]
                ).to_pylist()
            )
            if (
                d["checkpoint_id"],
                d["operator_uid"],
                d["state_name"],
                d["key_group_start"],
                d["channel"],
                d["seq"],
            )
            == (
                ref.checkpoint_id,
                ref.operator_uid,
                ref.state_name,
                ref.key_group_start,
                ref.channel,
                ref.seq,
            )
        ]
        assert len(match) == 1
        row = rows.slice(match[0], 1)
        payload = row["payload"][0].as_py()
        bad = bytes([payload[0] ^ 0xFF]) + payload[1:]
        row = row.set_column(
            row.schema.get_field_index("payload"), "payload", pa.array([bad], pa.binary())
        )
        dt.delete(f"blob_id = '{row['blob_id'][0].as_py()}'")
        write_deltalake(dt, row, mode="append")

    def lose(ref: BlobRef) -> None:
        table = "channel_state" if ref.kind is BlobKind.CHANNEL else "operator_state"
        DeltaTable(str(root / table)).delete(f"blob_id = '{blob_id(ref)}'")

    def corrupt_metadata(checkpoint_id: int) -> None:
        tamper_metadata(root, checkpoint_id)

    return Backend(
        "delta", lambda: DeltaCheckpointStore(str(root)), corrupt, lose, corrupt_metadata
    )


@pytest.fixture(params=["memory", "delta"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    make = _memory_backend if request.param == "memory" else _delta_backend
    return make(tmp_path / "pipeline")


# ------------------------------------------------------------------ builders

TASK = TaskId("agg", 0)


def kv(*pairs: tuple[str, int]) -> pa.Table:
    return pa.table({"k": [k for k, _ in pairs], "v": [v for _, v in pairs]})


def blob(kind: BlobKind, table: pa.Table, **kw: object) -> StateBlob:
    return StateBlob("agg", 0, kind, kw.pop("state", "counts"), table, **kw)  # type: ignore[arg-type]


def snapshot(*blobs: StateBlob, reused: tuple[BlobRef, ...] = (), offsets=()) -> TaskSnapshot:
    return TaskSnapshot(TASK, tuple(blobs), reused, tuple(offsets))


def completed(cid: int, *handles: TaskStateHandle, savepoint: bool = False) -> CompletedCheckpoint:
    kind = SnapshotType.SAVEPOINT if savepoint else SnapshotType.CHECKPOINT
    size = sum(h.state_bytes() for h in handles)
    return CompletedCheckpoint(
        cid, kind, tuple(handles), CheckpointStats(cid * 10, cid * 10 + 5, size)
    )


def write_and_commit(store, lease, cid, *blobs, reused=(), savepoint=False, offsets=()):
    h = store.write_task_state(cid, snapshot(*blobs, reused=reused, offsets=offsets))
    cp = completed(cid, h, savepoint=savepoint)
    store.commit(lease, cp)
    return cp


def ids(store: CheckpointStore) -> list[int]:
    return [c.checkpoint_id for c in store.list_completed()]


# ------------------------------------------------------------------ ids and fencing


def test_ids_strictly_increase_across_acquires_blocks_and_restarts(backend: Backend) -> None:
    handed_out: list[tuple[int, int]] = []
    for _ in range(3):
        store = backend.open()  # a restart, for the Delta store
        lease = store.acquire()
        handed_out.append((lease.first_id, lease.end_id))
        lease = store.allocate_ids(lease)
        handed_out.append((lease.first_id, lease.end_id))
    assert all(end - first == ID_BLOCK for first, end in handed_out)
    assert handed_out[0][0] >= 1
    # Blocks are disjoint and strictly increasing: each starts at or after the previous end.
    for (_, prev_end), (first, _) in itertools.pairwise(handed_out):
        assert first >= prev_end


def test_new_epoch_fences_every_operation_of_the_old_one(backend: Backend) -> None:
    old_store = backend.open()
    old = old_store.acquire()
    cp = write_and_commit(old_store, old, old.first_id, blob(BlobKind.OPERATOR, kv(("a", 1))))
    new_store = backend.open()
    new = new_store.acquire()
    assert new.epoch > old.epoch
    h = old_store.write_task_state(
        old.first_id + 1, snapshot(blob(BlobKind.OPERATOR, kv(("b", 2))))
    )
    with pytest.raises(FencedError):
        old_store.commit(old, completed(old.first_id + 1, h))
    with pytest.raises(FencedError):
        old_store.commit(old, cp)  # even the no-op re-commit is fenced
    with pytest.raises(FencedError):
        old_store.allocate_ids(old)
    with pytest.raises(FencedError):
        old_store.retain(old, 1)
    with pytest.raises(FencedError):
        old_store.discard(old, [old.first_id])
    assert ids(new_store) == [old.first_id]  # nothing of the fenced calls became visible
    # The new epoch works, and fenced errors are store errors.
    assert issubclass(FencedError, StoreError)
    write_and_commit(new_store, new, new.first_id, blob(BlobKind.OPERATOR, kv(("c", 3))))
    assert ids(backend.open()) == [old.first_id, new.first_id]


# ------------------------------------------------------------------ visibility


def test_task_state_without_commit_is_invisible(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    store.write_task_state(lease.first_id, snapshot(blob(BlobKind.OPERATOR, kv(("a", 1)))))
    reader = backend.open()
    assert reader.list_completed() == []
    assert reader.latest_completed() is None
    with pytest.raises(CheckpointNotFoundError):
        reader.get(lease.first_id)


def test_commit_makes_checkpoint_visible_and_round_trips(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    full = kv(("a", 1), ("b", 2))
    chan = pa.table({"record": ["x", "y", "z"]})
    cp = write_and_commit(
        store,
        lease,
        lease.first_id,
        blob(BlobKind.KEYED_FULL, full, key_group_start=7, key_group_end=7),
        blob(BlobKind.CHANNEL, chan, state="in-flight", channel=2),
        offsets=[SourceOffset("kafka", 0, 42), SourceOffset("kafka", 1, 17)],
    )
    reader = backend.open()
    got = reader.get(lease.first_id)
    assert got == cp
    assert reader.latest_completed() == cp
    assert reader.latest_completed(include_savepoints=False) == cp
    assert got.offsets() == {("kafka", 0): 42, ("kafka", 1): 17}
    tables = {r.kind: reader.read_blob(r) for r in got.blobs()}
    assert tables[BlobKind.KEYED_FULL].equals(full)
    assert tables[BlobKind.CHANNEL].equals(chan)


def test_commit_of_unwritten_blob_is_rejected(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    other = InMemoryCheckpointStore()  # produces a handle whose blob this store never saw
    h = other.write_task_state(lease.first_id, snapshot(blob(BlobKind.OPERATOR, kv(("a", 1)))))
    with pytest.raises(StoreError):
        store.commit(lease, completed(lease.first_id, h))
    assert ids(store) == []


def test_savepoints_are_listed_but_skippable(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    a = write_and_commit(store, lease, lease.first_id, blob(BlobKind.OPERATOR, kv(("a", 1))))
    sp = write_and_commit(
        store, lease, lease.first_id + 1, blob(BlobKind.OPERATOR, kv(("a", 2))), savepoint=True
    )
    assert store.latest_completed() == sp
    assert store.latest_completed(include_savepoints=False) == a


# ------------------------------------------------------------------ idempotency


def test_write_task_state_is_idempotent(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    snap = snapshot(
        blob(BlobKind.KEYED_FULL, kv(("a", 1)), key_group_start=0, key_group_end=0),
        blob(BlobKind.KEYED_FULL, kv(("b", 2)), key_group_start=1, key_group_end=1),
        blob(BlobKind.CHANNEL, pa.table({"r": [1]}), channel=0),
        offsets=[SourceOffset("s", 0, 5)],
    )
    first = store.write_task_state(lease.first_id, snap)
    stored = sorted(r.key for r in store.stored_blobs())
    again = backend.open().write_task_state(lease.first_id, snap)
    assert again == first
    assert sorted(r.key for r in store.stored_blobs()) == stored  # type: ignore[attr-defined]
    assert len(stored) == 3


def test_commit_is_idempotent(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    cp = write_and_commit(store, lease, lease.first_id, blob(BlobKind.OPERATOR, kv(("a", 1))))
    store.commit(lease, cp)
    backend.open().commit(lease, cp)
    assert ids(store) == [lease.first_id]


# ------------------------------------------------------------------ retention


def test_retention_keeps_incremental_chains_savepoints_and_pending_state(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    c1, c2, sp, aborted, c3, pending = (lease.first_id + i for i in range(6))
    # c1: two full key groups.
    cp1 = write_and_commit(
        store,
        lease,
        c1,
        blob(BlobKind.KEYED_FULL, kv(("a", 1)), key_group_start=0, key_group_end=0),
        blob(BlobKind.KEYED_FULL, kv(("b", 1)), key_group_start=1, key_group_end=1),
    )
    kg0_full, kg1_full = sorted(cp1.blobs(), key=lambda r: r.key_group_start)
    # c2: a delta on key group 0, reusing both full blobs.
    cp2 = write_and_commit(
        store,
        lease,
        c2,
        blob(BlobKind.KEYED_DELTA, kv(("a", 2)), key_group_start=0, key_group_end=0, seq=1),
        reused=(kg0_full, kg1_full),
    )
    kg0_delta = next(r for r in cp2.blobs() if r.kind is BlobKind.KEYED_DELTA)
    # a savepoint with its own operator state.
    spc = write_and_commit(store, lease, sp, blob(BlobKind.OPERATOR, kv(("s", 9))), savepoint=True)
    # an aborted checkpoint: written, never committed, older than the latest.
    aborted_h = store.write_task_state(aborted, snapshot(blob(BlobKind.OPERATOR, kv(("x", 0)))))
    # c3: a new full blob for key group 0, still reusing key group 1 of c1.
    cp3 = write_and_commit(
        store,
        lease,
        c3,
        blob(BlobKind.KEYED_FULL, kv(("a", 3)), key_group_start=0, key_group_end=0),
        reused=(kg1_full,),
    )
    # a pending checkpoint newer than every completed one.
    pending_h = store.write_task_state(pending, snapshot(blob(BlobKind.OPERATOR, kv(("p", 1)))))

    removed = backend.open().retain(lease, 1)

    assert sorted(removed) == [c1, c2]
    assert ids(store) == [sp, c3]
    alive = {r.key for r in store.stored_blobs()}
    expected_alive = {
        kg1_full.key,  # still referenced by c3
        *(r.key for r in spc.blobs()),
        *(r.key for r in cp3.blobs()),
        *(r.key for r in pending_h.blobs),  # newer than the latest completed
    }
    assert alive == expected_alive
    assert kg0_full.key not in alive and kg0_delta.key not in alive
    assert not {r.key for r in aborted_h.blobs} & alive
    # Everything the kept checkpoints reference still reads back.
    assert store.read_blob(kg1_full).equals(kv(("b", 1)))
    assert store.read_blob(next(iter(spc.blobs()))).equals(kv(("s", 9)))
    with pytest.raises(StoreError):
        store.read_blob(kg0_full)
    # Retaining again changes nothing.
    assert store.retain(lease, 1) == []
    assert ids(store) == [sp, c3]


def test_retain_without_garbage_collection_leaves_blobs_for_a_later_one(
    backend: Backend,
) -> None:
    store = backend.open()
    lease = store.acquire()
    c1, c2, c3 = lease.first_id, lease.first_id + 1, lease.first_id + 2
    cps = [
        write_and_commit(store, lease, c, blob(BlobKind.OPERATOR, kv((f"o{c}", c))))
        for c in (c1, c2, c3)
    ]
    keys = [{r.key for r in cp.blobs()} for cp in cps]
    assert store.retain(lease, 2, collect_garbage=False) == [c1]
    assert ids(backend.open()) == [c2, c3]
    alive = {r.key for r in store.stored_blobs()}
    assert keys[0] <= alive  # dropped, not yet collected
    assert store.retain(lease, 1) == [c2]
    alive = {r.key for r in store.stored_blobs()}
    assert alive == keys[2]  # both dropped checkpoints' blobs collected now
    assert store.read_blob(next(iter(cps[2].blobs()))).equals(kv((f"o{c3}", c3)))


def test_retain_rejects_zero(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    with pytest.raises(StoreError):
        store.retain(lease, 0)


def test_discard_removes_only_blobs_nobody_else_references(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    a, b, never = lease.first_id, lease.first_id + 1, lease.first_id + 2
    cpa = write_and_commit(
        store,
        lease,
        a,
        blob(BlobKind.KEYED_FULL, kv(("k", 1)), key_group_start=0, key_group_end=0),
        blob(BlobKind.OPERATOR, kv(("o", 1))),
    )
    shared = next(r for r in cpa.blobs() if r.kind is BlobKind.KEYED_FULL)
    own = next(r for r in cpa.blobs() if r.kind is BlobKind.OPERATOR)
    cpb = write_and_commit(store, lease, b, blob(BlobKind.OPERATOR, kv(("o", 2))), reused=(shared,))
    never_h = store.write_task_state(never, snapshot(blob(BlobKind.OPERATOR, kv(("n", 1)))))

    store.discard(lease, [a, never])

    assert ids(backend.open()) == [b]
    alive = {r.key for r in store.stored_blobs()}
    assert alive == {shared.key, *(r.key for r in cpb.blobs())}
    assert own.key not in alive
    assert not {r.key for r in never_h.blobs} & alive
    store.discard(lease, [])  # nothing to do, still fine


# ------------------------------------------------------------------ integrity


def test_corrupt_blob_is_detected_never_returned(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    cp = write_and_commit(store, lease, lease.first_id, blob(BlobKind.KEYED_FULL, kv(("a", 1))))
    ref = next(iter(cp.blobs()))
    backend.corrupt(ref)
    with pytest.raises(CorruptCheckpointError):
        backend.open().read_blob(ref)


def test_ref_with_wrong_checksum_is_corrupt(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    cp = write_and_commit(store, lease, lease.first_id, blob(BlobKind.KEYED_FULL, kv(("a", 1))))
    ref = next(iter(cp.blobs()))
    forged = BlobRef(**{**ref.__dict__, "checksum": "0" * 64})
    with pytest.raises(CorruptCheckpointError):
        store.read_blob(forged)


# ------------------------------------------------------------------ verification before restore


def _chain(store: CheckpointStore, lease) -> list[CompletedCheckpoint]:
    """Three checkpoints in an incremental chain: c1 writes every kind of blob; c2 writes a
    delta of key group 0 and reuses c1's full blobs; c3 writes its own operator and channel
    state and still reuses c1's key group 1."""
    c1, c2, c3 = lease.first_id, lease.first_id + 1, lease.first_id + 2
    cp1 = write_and_commit(
        store,
        lease,
        c1,
        blob(BlobKind.KEYED_FULL, kv(("a", 1)), key_group_start=0, key_group_end=0),
        blob(BlobKind.KEYED_FULL, kv(("b", 1)), key_group_start=1, key_group_end=1),
        blob(BlobKind.OPERATOR, kv(("sink-txn", 1)), state="pending_txn"),
        blob(BlobKind.CHANNEL, pa.table({"r": [1, 2]}), state="in-flight", channel=0),
    )
    full = tuple(r for r in cp1.blobs() if r.kind is BlobKind.KEYED_FULL)
    cp2 = write_and_commit(
        store,
        lease,
        c2,
        blob(BlobKind.KEYED_DELTA, kv(("a", 2)), key_group_start=0, key_group_end=0, seq=1),
        blob(BlobKind.OPERATOR, kv(("sink-txn", 2)), state="pending_txn"),
        reused=full,
    )
    kg1 = tuple(r for r in full if r.key_group_start == 1)
    cp3 = write_and_commit(
        store,
        lease,
        c3,
        blob(BlobKind.KEYED_FULL, kv(("a", 3)), key_group_start=0, key_group_end=0),
        blob(BlobKind.OPERATOR, kv(("sink-txn", 3)), state="pending_txn"),
        blob(BlobKind.CHANNEL, pa.table({"r": [3]}), state="in-flight", channel=0),
        reused=kg1,
    )
    return [cp1, cp2, cp3]


def test_intact_checkpoints_verify_and_the_newest_is_restorable(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    assert store.latest_restorable() == (None, [])  # nothing committed yet
    cps = _chain(store, lease)
    reader = backend.open()
    for cp in cps:
        reader.verify(cp)  # returns normally
    assert reader.latest_restorable() == (cps[-1], [])


@pytest.mark.parametrize("how", ["flip", "lose"])
def test_verify_names_the_checkpoint_and_the_damaged_blob(backend: Backend, how: str) -> None:
    """A damaged blob of c1 that c2 reuses: verifying either names that checkpoint, the blob
    (kind, operator, subtask, state, key groups, writer) and the cause; c3, which does not
    reference it, still verifies."""
    store = backend.open()
    lease = store.acquire()
    cp1, cp2, cp3 = _chain(store, lease)
    victim = next(
        r for r in cp1.blobs() if r.kind is BlobKind.KEYED_FULL and r.key_group_start == 0
    )
    (backend.corrupt if how == "flip" else backend.lose)(victim)
    reader = backend.open()
    for cp in (cp1, cp2):
        with pytest.raises(CorruptCheckpointError) as info:
            reader.verify(cp)
        error = info.value
        assert error.checkpoint_id == cp.checkpoint_id
        message = str(error)
        assert f"checkpoint {cp.checkpoint_id} is damaged" in message
        assert (
            "keyed_full blob of operator 'agg' subtask 0 state 'counts' key groups 0-0" in message
        )
        assert f"written by checkpoint {cp1.checkpoint_id}" in message
        assert ("checksum" if how == "flip" else "missing") in message
    reader.verify(cp3)


@pytest.mark.parametrize("kind", [BlobKind.OPERATOR, BlobKind.CHANNEL])
def test_damaged_newest_falls_back_to_the_previous_retained(
    backend: Backend, kind: BlobKind, caplog: pytest.LogCaptureFixture
) -> None:
    store = backend.open()
    lease = store.acquire()
    _cp1, cp2, cp3 = _chain(store, lease)
    backend.corrupt(next(r for r in cp3.blobs() if r.kind is kind))
    with caplog.at_level(logging.WARNING, logger="spark_ckpt.storage.checkpoint_store"):
        restorable, skipped = backend.open().latest_restorable()
    assert restorable == cp2
    assert [e.checkpoint_id for e in skipped] == [cp3.checkpoint_id]
    assert f"checkpoint {cp3.checkpoint_id}" in str(skipped[0])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"skipping damaged checkpoint {cp3.checkpoint_id}:" in warnings[0]


def test_savepoints_are_restorable_unless_excluded(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    _cp1, cp2, cp3 = _chain(store, lease)
    sp = write_and_commit(
        store, lease, lease.first_id + 3, blob(BlobKind.OPERATOR, kv(("s", 1))), savepoint=True
    )
    backend.corrupt(next(iter(r for r in cp3.blobs() if r.checkpoint_id == cp3.checkpoint_id)))
    reader = backend.open()
    assert reader.latest_restorable() == (sp, [])
    restorable, skipped = reader.latest_restorable(include_savepoints=False)
    assert restorable == cp2
    assert [e.checkpoint_id for e in skipped] == [cp3.checkpoint_id]


def test_all_damaged_gives_none_and_every_error(backend: Backend) -> None:
    """c1's key group 1 blob is reused by every checkpoint of the chain: damaging it
    damages all three."""
    store = backend.open()
    lease = store.acquire()
    cps = _chain(store, lease)
    shared = next(r for r in cps[0].blobs() if r.key_group_start == 1)
    assert all(shared in cp.blobs() for cp in cps)
    backend.corrupt(shared)
    restorable, skipped = backend.open().latest_restorable()
    assert restorable is None
    assert [e.checkpoint_id for e in skipped] == [cp.checkpoint_id for cp in reversed(cps)]
    for error, cp in zip(skipped, reversed(cps), strict=True):
        assert isinstance(error, CorruptCheckpointError)
        assert f"checkpoint {cp.checkpoint_id} is damaged" in str(error)


def test_damaged_metadata_is_skipped_not_fatal(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    store = backend.open()
    lease = store.acquire()
    cp1, cp2, cp3 = _chain(store, lease)
    backend.corrupt_metadata(cp3.checkpoint_id)
    reader = backend.open()
    with pytest.raises(CorruptCheckpointError):
        reader.list_completed()  # the strict listing still refuses
    good, bad = reader.list_completed_lenient()
    assert good == [cp1, cp2]
    assert [e.checkpoint_id for e in bad] == [cp3.checkpoint_id]
    with caplog.at_level(logging.WARNING, logger="spark_ckpt.storage.checkpoint_store"):
        restorable, skipped = reader.latest_restorable(include_savepoints=False)
    assert restorable == cp2
    assert [e.checkpoint_id for e in skipped] == [cp3.checkpoint_id]
    assert "metadata" in str(skipped[0]) and f"checkpoint {cp3.checkpoint_id}" in str(skipped[0])
    assert any(
        f"skipping damaged checkpoint {cp3.checkpoint_id}:" in r.getMessage()
        for r in caplog.records
    )
    # damaged metadata older than the one restored is not reported as skipped
    backend.corrupt_metadata(cp1.checkpoint_id)
    restorable, skipped = backend.open().latest_restorable()
    assert restorable == cp2
    assert [e.checkpoint_id for e in skipped] == [cp3.checkpoint_id]


def _restorable_model(be: Backend, n: int, damaged: set[int], bad_meta: set[int]) -> None:
    """*n* checkpoints, each with its own operator blob; the blobs of the indices in
    *damaged* and the metadata of those in *bad_meta* are damaged. Oracle: the newest
    checkpoint damaged in neither way, and the damaged ones newer than it, newest first."""
    store = be.open()
    lease = store.acquire()
    cps = [
        write_and_commit(store, lease, lease.first_id + i, blob(BlobKind.OPERATOR, kv(("k", i))))
        for i in range(n)
    ]
    for i in damaged:
        be.corrupt(next(iter(cps[i].blobs())))
    for i in bad_meta:
        be.corrupt_metadata(cps[i].checkpoint_id)
    intact = [i for i in range(n) if i not in damaged | bad_meta]
    expected = cps[intact[-1]] if intact else None
    newer = [i for i in range(n) if expected is None or i > intact[-1]]
    restorable, skipped = be.open().latest_restorable()
    assert restorable == expected
    assert [e.checkpoint_id for e in skipped] == [cps[i].checkpoint_id for i in reversed(newer)]


_DAMAGE = st.integers(1, 5).flatmap(
    lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1)), st.sets(st.integers(0, n - 1)))
)


@settings(max_examples=60, deadline=None)
@given(case=_DAMAGE)
def test_latest_restorable_matches_model_memory(case: tuple[int, set[int], set[int]]) -> None:
    n, damaged, bad_meta = case
    _restorable_model(_memory_backend(Path("unused")), n, damaged, bad_meta)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_DAMAGE)
def test_latest_restorable_matches_model_delta(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[int, set[int], set[int]]
) -> None:
    n, damaged, bad_meta = case
    _restorable_model(_delta_backend(tmp_path_factory.mktemp("restorable")), n, damaged, bad_meta)


# ------------------------------------------------------------------ randomized interleavings

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.booleans()),  # (op, restart the store handle?)
        st.tuples(st.just("write"), st.integers(0, 3)),  # write state of a fresh id
        st.tuples(st.just("commit"), st.integers(0, 3)),  # commit a written id, via lease i
        st.tuples(st.just("retain"), st.integers(1, 3)),
        st.tuples(st.just("discard"), st.integers(0, 5)),
        st.tuples(st.just("savepoint"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=14,
)


def _run_model(make_backend: Callable[[], Backend], ops: list[tuple[str, object]]) -> None:
    """Apply *ops* to a store and to a plain model (committed ids with their savepoint flag,
    the current epoch); both must agree after every step."""
    be = make_backend()
    store = be.open()
    leases = [store.acquire()]
    current_epoch = leases[0].epoch
    model: dict[int, bool] = {}  # committed id -> is savepoint
    written: dict[int, TaskStateHandle] = {}
    handed: list[int] = []
    next_in_block = {leases[0].epoch: leases[0].first_id}

    def fresh_id() -> int:
        lease = leases[-1]
        cid = next_in_block[lease.epoch]
        next_in_block[lease.epoch] = cid + 1
        assert cid < lease.end_id
        return cid

    for op, arg in ops:
        if op == "acquire":
            if arg:
                store = be.open()
            lease = store.acquire()
            assert lease.epoch > current_epoch
            assert all(lease.first_id >= le.end_id for le in leases)
            current_epoch = lease.epoch
            leases.append(lease)
            next_in_block[lease.epoch] = lease.first_id
        elif op in ("write", "savepoint"):
            cid = fresh_id()
            handed.append(cid)
            written[cid] = store.write_task_state(
                cid, snapshot(blob(BlobKind.OPERATOR, kv((f"k{cid}", cid))))
            )
            if op == "savepoint":
                lease = leases[-1]
                store.commit(lease, completed(cid, written[cid], savepoint=True))
                model[cid] = True
        elif op == "commit":
            assert isinstance(arg, int)
            uncommitted = [c for c in written if c not in model]
            if not uncommitted:
                continue
            cid = uncommitted[arg % len(uncommitted)]
            lease = leases[-1 - (arg % len(leases))]
            cp = completed(cid, written[cid])
            if lease.epoch != current_epoch:
                with pytest.raises(FencedError):
                    store.commit(lease, cp)
            else:
                store.commit(lease, cp)
                model[cid] = False
        elif op == "retain":
            assert isinstance(arg, int)
            removed = store.retain(leases[-1], arg)
            plain = sorted(c for c, sp in model.items() if not sp)
            expected = plain[:-arg] if len(plain) > arg else []
            assert sorted(removed) == expected
            for c in expected:
                del model[c]
                written.pop(c, None)
            horizon = max(model, default=0)
            for c in [c for c in written if c not in model and c <= horizon]:
                del written[c]  # garbage collected in the model too
        elif op == "discard":
            assert isinstance(arg, int)
            if not handed:
                continue
            cid = handed[arg % len(handed)]
            store.discard(leases[-1], [cid])
            model.pop(cid, None)
            written.pop(cid, None)
        # After every step: visible ids match the model, and every kept blob reads back.
        reader = be.open()
        assert ids(reader) == sorted(model)
        for cp in reader.list_completed():
            assert cp.is_savepoint == model[cp.checkpoint_id]
            for ref in cp.blobs():
                cid = ref.checkpoint_id
                assert reader.read_blob(ref).equals(kv((f"k{cid}", cid)))
    assert handed == sorted(set(handed))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_random_interleavings_memory(ops: list[tuple[str, object]]) -> None:
    _run_model(lambda: _memory_backend(Path("unused")), ops)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_random_interleavings_delta(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, object]]
) -> None:
    _run_model(lambda: _delta_backend(tmp_path_factory.mktemp("model")), ops)


# ------------------------------------------------------------------ the statistics history


def _failed(cid: int, reason: str = "expired"):  # type: ignore[no-untyped-def]
    from spark_ckpt.protocol.checkpoint import FailedCheckpoint
    from spark_ckpt.protocol.state_handles import CheckpointMetrics

    metrics = {"op#0": CheckpointMetrics(1, 2, 3, 4, 5, 6)}
    return FailedCheckpoint(
        cid, SnapshotType.CHECKPOINT, 10 * cid, 10 * cid + 7, reason, "late", metrics
    )


def _history(store: CheckpointStore) -> list[tuple[int, str]]:
    return [(r.checkpoint_id, r.status.value) for r in store.list_history()]


def test_failed_checkpoints_are_recorded_fenced_and_idempotent(backend: Backend) -> None:
    """Records outlive the coordinator (a fresh handle reads them), a repeated record changes
    nothing (the first record of an id wins), a superseded lease records nothing, and
    completed checkpoints are unaffected."""
    store = backend.open()
    lease = store.acquire()
    done = write_and_commit(store, lease, lease.first_id, blob(BlobKind.OPERATOR, kv(("a", 1))))
    store.record_failure(lease, _failed(lease.first_id + 1))
    store.record_failure(lease, _failed(lease.first_id + 1))
    store.record_failure(lease, _failed(lease.first_id + 1, "subsumed"))
    assert backend.open().list_failed() == [_failed(lease.first_id + 1)]
    assert store.list_completed() == [done]
    newer = store.acquire()
    with pytest.raises(FencedError):
        store.record_failure(lease, _failed(lease.first_id + 2))
    assert [f.checkpoint_id for f in backend.open().list_failed()] == [lease.first_id + 1]
    store.record_failure(newer, _failed(newer.first_id))
    assert _history(backend.open()) == [
        (lease.first_id, "completed"),
        (lease.first_id + 1, "failed"),
        (newer.first_id, "failed"),
    ]


def test_history_outlives_retention_and_is_bounded_by_its_own_size(backend: Backend) -> None:
    """With one checkpoint retained, every completed checkpoint stays in the history with
    its figures; the history keeps the newest *history_size* records by id, completed and
    failed alike, and a record the bound dropped does not come back."""
    store = backend.open()
    lease = store.acquire()
    base = lease.first_id
    expected: dict[int, str] = {}  # the oracle: id -> status, in the order things happen
    cps = {}
    for i in range(12):
        cid = base + i
        if i % 4 == 3:
            store.record_failure(lease, _failed(cid), history_size=8)
            expected[cid] = "failed"
        else:
            cps[cid] = write_and_commit(store, lease, cid, blob(BlobKind.OPERATOR, kv(("a", i))))
            expected[cid] = "completed"
            store.retain(lease, 1, history_size=8)
        assert ids(store) == [max(cps)]  # retention keeps one checkpoint only
    newest = sorted(expected)[-8:]
    got = backend.open().list_history()
    assert [(r.checkpoint_id, r.status.value) for r in got] == [(c, expected[c]) for c in newest]
    for r in got:
        if r.checkpoint_id in cps:  # a completed one's figures are its own
            assert r.stats == cps[r.checkpoint_id].stats and r.failure is None
        else:
            assert r.failure == _failed(r.checkpoint_id)
    store.retain(lease, 1, history_size=8)  # idempotent
    assert backend.open().list_history() == got
    # a smaller bound drops the oldest at the next write, and they stay dropped
    store.retain(lease, 1, history_size=3)
    assert [r.checkpoint_id for r in backend.open().list_history()] == newest[-3:]
    store.retain(lease, 1, history_size=8)
    assert [r.checkpoint_id for r in backend.open().list_history()] == newest[-3:]


def test_history_shows_completed_checkpoints_before_any_retention(backend: Backend) -> None:
    """A completed checkpoint is in the history as soon as it is committed (read from the
    log until retention records it), and discard records before it removes."""
    store = backend.open()
    lease = store.acquire()
    a = write_and_commit(store, lease, lease.first_id, blob(BlobKind.OPERATOR, kv(("a", 1))))
    sp = write_and_commit(
        store, lease, lease.first_id + 1, blob(BlobKind.OPERATOR, kv(("a", 2))), savepoint=True
    )
    assert _history(store) == [(a.checkpoint_id, "completed"), (sp.checkpoint_id, "completed")]
    assert [r.is_savepoint for r in store.list_history()] == [False, True]
    store.discard(lease, [a.checkpoint_id])
    assert ids(store) == [sp.checkpoint_id]
    assert _history(backend.open()) == [
        (a.checkpoint_id, "completed"),
        (sp.checkpoint_id, "completed"),
    ]


def test_history_size_must_be_positive(backend: Backend) -> None:
    store = backend.open()
    lease = store.acquire()
    with pytest.raises(ConfigError):
        store.retain(lease, 1, history_size=0)
    with pytest.raises(ConfigError):
        store.record_failure(lease, _failed(lease.first_id), history_size=0)
    assert store.list_history() == []

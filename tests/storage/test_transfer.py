"""Copying a checkpoint between stores and deriving one inside a store (no Spark).

The oracle is the blob contents as written: a copy must read back the same tables in the same
chain order, reference nothing of its source (the source store is emptied afterwards), and
leave the source unchanged.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_ckpt.errors import CheckpointNotFoundError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import (
    BlobKind,
    SourceOffset,
    StateBlob,
    TaskId,
    TaskSnapshot,
)
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore
from spark_ckpt.storage.transfer import copy_checkpoint, derive_checkpoint

TASK = TaskId("agg", 0)


def table(*values: int) -> pa.Table:
    return pa.table({"k": [f"k{v}" for v in values], "v": list(values)})


def chain_checkpoint(store: InMemoryCheckpointStore) -> tuple[CompletedCheckpoint, list[pa.Table]]:
    """Checkpoint 2 reuses the FULL blob of checkpoint 1 and adds a DELTA (a chain)."""
    lease = store.acquire()
    full = StateBlob("agg", 0, BlobKind.KEYED_FULL, "counts", table(1, 2), 0, 63)
    delta = StateBlob("agg", 0, BlobKind.KEYED_DELTA, "counts", table(3), 0, 63, seq=1)
    first = store.write_task_state(lease.first_id, TaskSnapshot(TASK, (full,)))
    second = store.write_task_state(
        lease.first_id + 1,
        TaskSnapshot(TASK, (delta,), first.blobs, (SourceOffset("source", 0, 42),)),
    )
    cp = CompletedCheckpoint(
        lease.first_id + 1, SnapshotType.CHECKPOINT, (second,), CheckpointStats(1, 2)
    )
    store.commit(lease, cp)
    return cp, [table(1, 2), table(3)]


def test_a_copy_holds_the_same_state_and_needs_nothing_of_its_source() -> None:
    source = InMemoryCheckpointStore()
    cp, tables = chain_checkpoint(source)
    target = InMemoryCheckpointStore()
    lease = target.acquire()
    copy = copy_checkpoint(
        source,
        cp,
        target,
        target,
        lease,
        checkpoint_id=77,
        snapshot_type=SnapshotType.SAVEPOINT,
        properties={"pipeline": "p"},
    )
    assert target.get(77) == copy and copy.is_savepoint
    assert {b.checkpoint_id for b in copy.blobs()} == {77}
    assert copy.offsets() == cp.offsets() == {("source", 0): 42}
    refs = sorted(copy.blobs(), key=lambda r: r.seq)
    assert [r.kind for r in refs] == [BlobKind.KEYED_FULL, BlobKind.KEYED_DELTA]
    assert [target.read_blob(r) for r in refs] == tables
    before = source.list_completed()
    lease = source.acquire()
    source.discard(lease, [c.checkpoint_id for c in before])
    assert [target.read_blob(r) for r in refs] == tables  # self-contained
    target.verify(copy)


def test_a_derived_checkpoint_references_the_same_blobs_under_a_new_id() -> None:
    store = InMemoryCheckpointStore()
    cp, tables = chain_checkpoint(store)
    lease = store.acquire()
    derived = derive_checkpoint(
        store,
        lease,
        cp,
        checkpoint_id=lease.first_id,
        properties={"restored_from": "x"},
        stats=CheckpointStats(5, 5),
    )
    assert derived.checkpoint_id > cp.checkpoint_id
    assert derived.tasks == cp.tasks and store.latest_completed() == derived
    # retention of the original keeps the blobs the derived one references
    store.retain(lease, 1)
    with pytest.raises(CheckpointNotFoundError):
        store.get(cp.checkpoint_id)
    refs = sorted(derived.blobs(), key=lambda r: r.seq)
    assert [store.read_blob(r) for r in refs] == tables

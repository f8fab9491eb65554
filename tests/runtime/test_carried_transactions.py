"""The sink transactions an acknowledgement carries: the sink commit takes them instead of
reading the task's blob back, only where they are that blob's rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import pyarrow as pa

from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint, task_state_uid
from spark_ckpt.protocol.state_handles import (
    AcknowledgeCheckpoint,
    BlobKind,
    BlobRef,
    StateBlob,
    TaskId,
    TaskSnapshot,
)
from spark_ckpt.runtime.carried_transactions import (
    SINK_TRANSACTIONS,
    CarriedTransactions,
    sealed_table,
)
from spark_ckpt.runtime.task import sealed_transactions
from spark_ckpt.sinks.two_phase_commit import Transaction
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

VERTEX = task_state_uid("chain")


class CountingStore(InMemoryCheckpointStore):
    """Counts the blobs read back."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[BlobRef] = []

    def read_blobs(self, refs: Sequence[BlobRef]) -> list[pa.Table]:
        self.read.extend(refs)
        return super().read_blobs(refs)


def rows(subtask: int, *checkpoints: int) -> tuple[str, ...]:
    return tuple(
        Transaction("sink", subtask, c, (f"part-{subtask}-{c}.parquet",), "out").to_json()
        for c in checkpoints
    )


def acknowledge(
    store: InMemoryCheckpointStore, cid: int, subtask: int, written: tuple[str, ...]
) -> AcknowledgeCheckpoint:
    """The task writes *written* as its sealed-transactions blob of checkpoint *cid*."""
    task = TaskId("chain", subtask)
    blob = StateBlob(VERTEX, subtask, BlobKind.OPERATOR, SINK_TRANSACTIONS, sealed_table(written))
    handle = store.write_task_state(cid, TaskSnapshot(task, (blob,)))
    return AcknowledgeCheckpoint(cid, task, handle, sealed=written)


def completed(cid: int, *acks: AcknowledgeCheckpoint) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        cid, SnapshotType.CHECKPOINT, tuple(a.state for a in acks), CheckpointStats(0, 1)
    )


def expected(*row_sets: tuple[str, ...]) -> list[Transaction]:
    """The oracle: every row, decoded, one per transaction id, by (checkpoint, subtask)."""
    txns = {t.txn_id: t for rs in row_sets for t in map(Transaction.from_json, rs)}
    return sorted(txns.values(), key=lambda t: (t.checkpoint_id, t.subtask))


def test_carried_rows_spare_the_read() -> None:
    store = CountingStore()
    carried = CarriedTransactions()
    acks = [acknowledge(store, 3, 0, rows(0, 2, 3)), acknowledge(store, 3, 1, rows(1, 3))]
    for ack in acks:
        carried.record(AcknowledgeCheckpoint.from_dict(json.loads(json.dumps(ack.to_dict()))))
    got = sealed_transactions(completed(3, *acks), store, carried)
    assert got == expected(rows(0, 2, 3), rows(1, 3))
    assert store.read == []


def test_rows_that_are_not_the_blob_are_read_from_the_store() -> None:
    """A replayed snapshot: the store keeps its first write, and the acknowledgement
    references that blob while carrying the rows of the second attempt."""
    store = CountingStore()
    carried = CarriedTransactions()
    first = acknowledge(store, 4, 0, rows(0, 3, 4))
    replay = acknowledge(store, 4, 0, rows(0, 4))
    assert replay.state == first.state  # the stored blob is the first write's
    other = acknowledge(store, 4, 1, rows(1, 4))
    for ack in (replay, other):
        carried.record(ack)
    got = sealed_transactions(completed(4, replay, other), store, carried)
    assert got == expected(rows(0, 3, 4), rows(1, 4))
    assert [r.subtask for r in store.read] == [0]


def test_without_carried_rows_every_blob_is_read() -> None:
    store = CountingStore()
    old_version = acknowledge(store, 2, 0, rows(0, 2))
    carried = CarriedTransactions()
    carried.record(AcknowledgeCheckpoint(2, old_version.task, old_version.state))
    assert sealed_transactions(completed(2, old_version), store, carried) == expected(rows(0, 2))
    assert len(store.read) == 1


def test_a_carried_entry_answers_only_its_checksum() -> None:
    store = InMemoryCheckpointStore()
    carried = CarriedTransactions()
    ack = acknowledge(store, 5, 0, rows(0, 5))
    carried.record(ack)
    [ref] = ack.state.blobs
    assert carried.lookup(ref) == tuple(map(Transaction.from_json, rows(0, 5)))
    assert carried.lookup(replace(ref, checksum="0" * 64)) is None


def test_carried_rows_are_forgotten_with_their_checkpoint() -> None:
    store = InMemoryCheckpointStore()
    carried = CarriedTransactions()
    for cid in (1, 2, 3):
        carried.record(acknowledge(store, cid, 0, rows(0, cid)))
    assert len(carried) == 3
    carried.forget(2)
    assert len(carried) == 2
    carried.forget_upto(3)
    assert len(carried) == 0

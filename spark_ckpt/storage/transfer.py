"""Copying a completed checkpoint from one store into another, and deriving a new checkpoint
of a store from one of its own.

Both are how savepoints stay self-contained and how restores never touch their source
(Flink's NO_CLAIM mode):

* :func:`copy_checkpoint` reads every blob a checkpoint references (reused blobs of earlier
  checkpoints included, chains kept in order) and writes them into the target store under
  one new id, then commits the checkpoint there. Used to export a savepoint into its
  directory and to import a savepoint or another root's checkpoint into a pipeline's root.
  The copy references nothing of the source, so the source may be moved or deleted.
* :func:`derive_checkpoint` commits, in the same store, a new checkpoint that references the
  blobs of an existing one (no copy): restoring an older checkpoint of a root starts a new
  lineage whose first checkpoint is that state under a fresh id, so a later restart resumes
  the new lineage and not a newer checkpoint of the old one.

Neither modifies the source checkpoint. Both are idempotent only per target id: a crash
before the commit leaves unreferenced blobs that retention collects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import StateBlob, TaskSnapshot, TaskStateHandle
from spark_ckpt.storage.checkpoint_store import CheckpointLog, StateStorage
from spark_ckpt.storage.lease import CoordinatorLease


def copy_checkpoint(
    source: StateStorage,
    checkpoint: CompletedCheckpoint,
    target: StateStorage,
    target_log: CheckpointLog,
    lease: CoordinatorLease,
    *,
    checkpoint_id: int,
    snapshot_type: SnapshotType,
    properties: Mapping[str, str],
    stats: CheckpointStats | None = None,
) -> CompletedCheckpoint:
    """Copy *checkpoint* (read from *source*) into *target* as *checkpoint_id* and commit it
    to *target_log* under *lease*; returns the committed copy. Blob contents, chains
    (``seq``), key-group ranges and source positions are kept; every copied blob names
    *checkpoint_id* as its writer. *stats*: default the source's, with the bytes written
    recomputed."""
    tasks: list[TaskStateHandle] = []
    for task in checkpoint.tasks:
        refs = list(dict.fromkeys(task.blobs))
        tables = source.read_blobs(refs)
        blobs = tuple(
            StateBlob(
                operator_uid=ref.operator_uid,
                subtask=ref.subtask,
                kind=ref.kind,
                state_name=ref.state_name,
                table=table,
                key_group_start=ref.key_group_start,
                key_group_end=ref.key_group_end,
                channel=ref.channel,
                seq=ref.seq,
            )
            for ref, table in zip(refs, tables, strict=True)
        )
        snapshot = TaskSnapshot(task.task, new_blobs=blobs, offsets=task.offsets)
        tasks.append(target.write_task_state(checkpoint_id, snapshot))
    written = sum(t.state_bytes() for t in tasks)
    base = stats or checkpoint.stats
    copy = CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        snapshot_type=snapshot_type,
        tasks=tuple(sorted(tasks, key=lambda t: t.task)),
        stats=replace(base, state_bytes=written, bytes_written=written),
        properties=dict(properties),
    )
    target_log.commit(lease, copy)
    return copy


def derive_checkpoint(
    log: CheckpointLog,
    lease: CoordinatorLease,
    checkpoint: CompletedCheckpoint,
    *,
    checkpoint_id: int,
    properties: Mapping[str, str],
    stats: CheckpointStats,
) -> CompletedCheckpoint:
    """Commit *checkpoint*'s state as a new checkpoint *checkpoint_id* of the same store
    (a CHECKPOINT referencing the same blobs, nothing copied or written)."""
    derived = CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        snapshot_type=SnapshotType.CHECKPOINT,
        tasks=checkpoint.tasks,
        stats=replace(stats, state_bytes=checkpoint.stats.state_bytes, bytes_written=0),
        properties=dict(properties),
    )
    log.commit(lease, derived)
    return derived

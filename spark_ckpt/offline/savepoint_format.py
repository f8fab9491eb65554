"""The savepoint directory format, and its one writer.

A *savepoint directory* is itself a store root (the four Delta tables of
:mod:`spark_ckpt.delta.store_layout`) holding exactly one completed checkpoint, of
:attr:`~spark_ckpt.protocol.barrier.SnapshotType.SAVEPOINT` type, whose blobs are all written
by that checkpoint (every ``BlobRef.checkpoint_id`` is its id) and hold no deltas: keyed state
is one FULL blob per state per subtask, or per slice of disjoint key groups of a subtask
(each a chain of its own, read like a subtask's). It is self-contained: it can be copied,
moved, read (:class:`~spark_ckpt.offline.StateReader`) and restored from without its origin.

Its properties (string to string) carry at least :data:`PIPELINE` (the pipeline's name),
:data:`MAX_PARALLELISM` (the number of key groups of its keyed state) and :data:`FORMAT`
(:data:`FORMAT_VERSION`), the keys and version :mod:`spark_ckpt.delta.savepoint` defines
(the online savepoints' side).

:func:`write_savepoint` is the only writer of the format: the offline
:class:`~spark_ckpt.offline.SavepointWriter` and the online export of a savepoint both call it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.fs as pafs

from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.delta.savepoint import FORMAT, FORMAT_VERSION
from spark_ckpt.errors import StoreError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import BlobKind, TaskSnapshot, TaskStateHandle
from spark_ckpt.runtime.restore_settings import MAX_PARALLELISM, PIPELINE

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MAX_PARALLELISM",
    "PIPELINE",
    "directory_is_empty",
    "write_savepoint",
]


def directory_is_empty(path: str) -> bool:
    """Whether *path* (a local path or a URI pyarrow understands) does not exist or is an
    empty directory. Paths pyarrow cannot resolve are checked through the store: empty if no
    Delta table of a store root holds anything."""
    fs: pafs.FileSystem
    if "://" not in path:
        fs, inner = pafs.LocalFileSystem(), os.path.abspath(path)
    else:
        try:
            fs, inner = pafs.FileSystem.from_uri(path)
        except (pa.ArrowInvalid, OSError, ValueError):
            store = DeltaCheckpointStore(path)
            return not store.list_completed() and not store.stored_blobs()
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        return True
    if info.type != pafs.FileType.Directory:
        return False
    return not fs.get_file_info(pafs.FileSelector(inner, recursive=False))


def write_savepoint(
    path: str,
    checkpoint_id: int,
    tasks: Sequence[TaskSnapshot],
    properties: Mapping[str, str],
    *,
    stats: CheckpointStats | None = None,
    storage_options: dict[str, str] | None = None,
) -> CompletedCheckpoint:
    """Write a savepoint directory (see the module docstring) at *path* holding *tasks* as
    completed checkpoint *checkpoint_id*, and return it.

    *tasks*: one snapshot per task, with new blobs only (``reused`` must be empty) and no
    DELTA blobs; source positions in their ``offsets``. *properties* must name the
    :data:`PIPELINE` and the :data:`MAX_PARALLELISM`; :data:`FORMAT` is set here. *stats*:
    timestamps of the savepoint (default: now), its byte counts are recomputed.

    Refuses (:class:`~spark_ckpt.errors.StoreError`, nothing written) a target that exists
    and is not an empty directory, and input that breaks the format."""
    if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 1:
        raise StoreError(f"savepoint checkpoint id must be an integer >= 1, got {checkpoint_id!r}")
    props = {str(k): str(v) for k, v in properties.items()}
    for required in (PIPELINE, MAX_PARALLELISM):
        if not props.get(required):
            raise StoreError(f"a savepoint needs the property {required!r}")
    if props.setdefault(FORMAT, FORMAT_VERSION) != FORMAT_VERSION:
        raise StoreError(
            f"savepoint format {props[FORMAT]!r} cannot be written, this writer writes "
            f"format {FORMAT_VERSION!r}"
        )
    seen: set[object] = set()
    for snap in tasks:
        if snap.task in seen:
            raise StoreError(f"task {snap.task} appears twice in the savepoint")
        seen.add(snap.task)
        if snap.reused:
            raise StoreError(
                f"task {snap.task} reuses blobs of another checkpoint: a savepoint is "
                "self-contained"
            )
        for blob in snap.new_blobs:
            if blob.kind is BlobKind.KEYED_DELTA or (
                blob.kind is BlobKind.KEYED_FULL and blob.seq != 0
            ):
                raise StoreError(
                    f"blob {blob.kind.value} seq {blob.seq} of operator {blob.operator_uid!r} "
                    f"state {blob.state_name!r}: a savepoint holds full keyed blobs only"
                )
    if not directory_is_empty(path):
        raise StoreError(
            f"savepoint target {path} is not empty: a savepoint is written into a new or "
            "empty directory"
        )
    store = DeltaCheckpointStore(path, storage_options=storage_options)
    lease = store.acquire()
    started_ms = int(time.time() * 1000)
    handles: list[TaskStateHandle] = [store.write_task_state(checkpoint_id, s) for s in tasks]
    written = sum(h.state_bytes() for h in handles)
    channel_bytes = sum(h.channel_state_bytes() for h in handles)
    base = stats or CheckpointStats(trigger_ms=started_ms, completed_ms=int(time.time() * 1000))
    completed = CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        snapshot_type=SnapshotType.SAVEPOINT,
        tasks=tuple(sorted(handles, key=lambda h: h.task)),
        stats=CheckpointStats(
            trigger_ms=base.trigger_ms,
            completed_ms=base.completed_ms,
            state_bytes=written,
            bytes_written=written,
            channel_state_bytes=channel_bytes,
            task_metrics=base.task_metrics,
        ),
        properties=props,
    )
    store.commit(lease, completed)
    return completed

"""The in-memory checkpoint store: the reference implementation of
:class:`~spark_ckpt.storage.checkpoint_store.CheckpointStore`, for tests, simulations and
benchmarks.

It keeps the whole contract of :mod:`spark_ckpt.storage.checkpoint_store` (fencing, ids, idempotent
task state and commit, visibility, integrity, retention, the bounded statistics history) within one
process and is lost with it. Blobs are kept as Arrow IPC bytes with checksums, exactly as the
durable store keeps them, so corruption is detected the same way. Thread-safe: one lock guards every
call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pyarrow as pa

from spark_ckpt.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    FencedError,
    StoreError,
)
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint, FailedCheckpoint
from spark_ckpt.protocol.state_handles import (
    BlobRef,
    TaskSnapshot,
    TaskStateHandle,
    decode_table,
    encode_table,
    make_ref,
)
from spark_ckpt.storage.checkpoint_store import CheckpointStore
from spark_ckpt.storage.history import (
    DEFAULT_HISTORY_SIZE,
    CheckpointRecord,
    bounded,
    merge_history,
    unrecorded,
)
from spark_ckpt.storage.lease import ID_BLOCK, CoordinatorLease
from spark_ckpt.storage.metadata import parse_completed
from spark_ckpt.storage.retention import garbage_blobs, retention_plan


class InMemoryCheckpointStore(CheckpointStore):
    """Volatile store for tests and simulations (see the module docstring); has test hooks
    to damage or lose what it stores."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epoch = 0
        self._next_id = 1
        self._blobs: dict[tuple[object, ...], tuple[BlobRef, bytes]] = {}
        self._completed: dict[int, tuple[str, str]] = {}  # id -> (json, checksum)
        self._history: dict[int, CheckpointRecord] = {}  # the statistics history
        self._history_floor = 0  # one more than the largest id the bound dropped

    # -- fencing and ids -------------------------------------------------------------------
    def acquire(self) -> CoordinatorLease:
        with self._lock:
            self._epoch += 1
            first = self._next_id
            self._next_id += ID_BLOCK
            return CoordinatorLease(self._epoch, first, self._next_id)

    def _check(self, lease: CoordinatorLease) -> None:
        if lease.epoch != self._epoch:
            raise FencedError(
                f"coordinator epoch {lease.epoch} was superseded by epoch {self._epoch}"
            )

    def allocate_ids(self, lease: CoordinatorLease) -> CoordinatorLease:
        with self._lock:
            self._check(lease)
            first = self._next_id
            self._next_id += ID_BLOCK
            return CoordinatorLease(lease.epoch, first, self._next_id)

    # -- state -----------------------------------------------------------------------------
    def write_task_state(self, checkpoint_id: int, snapshot: TaskSnapshot) -> TaskStateHandle:
        refs: list[BlobRef] = []
        with self._lock:
            for blob in snapshot.new_blobs:
                payload = encode_table(blob.table)
                ref = make_ref(checkpoint_id, blob, payload)
                self._blobs.setdefault(ref.key, (ref, payload))
                refs.append(self._blobs[ref.key][0])
        return TaskStateHandle(snapshot.task, tuple(refs) + snapshot.reused, snapshot.offsets)

    def read_blob(self, ref: BlobRef) -> pa.Table:
        with self._lock:
            entry = self._blobs.get(ref.key)
        if entry is None:
            raise CheckpointNotFoundError(f"blob {ref.key} is not in the store")
        return decode_table(entry[1], ref)

    def stored_blobs(self) -> list[BlobRef]:
        with self._lock:
            return [r for r, _ in self._blobs.values()]

    # -- completion ------------------------------------------------------------------------
    def commit(self, lease: CoordinatorLease, checkpoint: CompletedCheckpoint) -> None:
        with self._lock:
            self._check(lease)
            if checkpoint.checkpoint_id in self._completed:
                return
            for ref in checkpoint.blobs():
                if ref.key not in self._blobs:
                    raise StoreError(
                        f"checkpoint {checkpoint.checkpoint_id} references blob {ref.key} "
                        "that was never written"
                    )
            text = checkpoint.to_json()
            self._completed[checkpoint.checkpoint_id] = (text, checkpoint.checksum())

    def list_completed_lenient(
        self,
    ) -> tuple[list[CompletedCheckpoint], list[CorruptCheckpointError]]:
        with self._lock:
            items = list(self._completed.items())
        return parse_completed(items)

    # -- retention -------------------------------------------------------------------------
    def retain(
        self,
        lease: CoordinatorLease,
        retained: int,
        keep_from: int | None = None,
        *,
        collect_garbage: bool = True,
        history_size: int = DEFAULT_HISTORY_SIZE,
    ) -> list[int]:
        completed = self.list_completed()
        kept, dropped = retention_plan(completed, retained, keep_from)
        bounded([], history_size)
        with self._lock:
            self._check(lease)
            self._record([], completed, history_size)
            for c in dropped:
                self._completed.pop(c.checkpoint_id, None)
            if collect_garbage:
                for ref in garbage_blobs([r for r, _ in self._blobs.values()], kept):
                    self._blobs.pop(ref.key, None)
        return [c.checkpoint_id for c in dropped]

    # -- the statistics history ------------------------------------------------------------
    def record_failure(
        self,
        lease: CoordinatorLease,
        failed: FailedCheckpoint,
        *,
        history_size: int = DEFAULT_HISTORY_SIZE,
    ) -> None:
        completed, _ = self.list_completed_lenient()
        bounded([], history_size)
        with self._lock:
            self._check(lease)
            self._record([CheckpointRecord.failed(failed)], completed, history_size)

    def _record(
        self,
        records: Iterable[CheckpointRecord],
        completed: Iterable[CompletedCheckpoint],
        history_size: int,
    ) -> None:
        """Add *records* and the :func:`unrecorded` ones of *completed* (those not recorded
        yet) and keep the newest *history_size* (under the lock, lease checked)."""
        floor = self._history_floor
        for r in [*records, *unrecorded(self._history, completed, floor=floor)]:
            if r.checkpoint_id >= floor:
                self._history.setdefault(r.checkpoint_id, r)
        kept, self._history_floor = bounded(self._history, history_size, floor)
        self._history = {i: self._history[i] for i in kept}

    def list_history(self) -> list[CheckpointRecord]:
        completed, _ = self.list_completed_lenient()
        with self._lock:
            recorded = list(self._history.values())
            floor = self._history_floor
        return merge_history(recorded, completed, floor=floor)

    def discard(
        self,
        lease: CoordinatorLease,
        checkpoint_ids: Iterable[int],
        *,
        history_size: int = DEFAULT_HISTORY_SIZE,
    ) -> None:
        ids = set(checkpoint_ids)
        completed = self.list_completed()
        bounded([], history_size)
        with self._lock:
            self._check(lease)
            self._record([], completed, history_size)
            for i in ids:
                self._completed.pop(i, None)
        kept = self.list_completed()
        with self._lock:
            referenced = {b.key for c in kept for b in c.blobs()}
            for ref, _ in list(self._blobs.values()):
                if ref.checkpoint_id in ids and ref.key not in referenced:
                    self._blobs.pop(ref.key, None)

    # -- test hooks ------------------------------------------------------------------------
    def corrupt_blob(self, ref: BlobRef) -> None:
        """Flip a byte of a stored blob (tests of corruption detection)."""
        with self._lock:
            r, payload = self._blobs[ref.key]
            self._blobs[ref.key] = (r, bytes([payload[0] ^ 0xFF]) + payload[1:])

    def lose_blob(self, ref: BlobRef) -> None:
        """Remove a stored blob behind the store's back (tests of missing state)."""
        with self._lock:
            del self._blobs[ref.key]

    def corrupt_metadata(self, checkpoint_id: int) -> None:
        """Alter the stored metadata of a completed checkpoint so that it fails its checksum
        (tests of damaged metadata)."""
        with self._lock:
            text, digest = self._completed[checkpoint_id]
            self._completed[checkpoint_id] = (text.replace("{", "{ ", 1), digest)

"""The durable checkpoint store: Delta Lake tables written with delta-rs (``deltalake``).

:class:`DeltaCheckpointStore` provides every view of :mod:`spark_ckpt.storage.checkpoint_store` on
the Delta tables under one root (layout: :mod:`spark_ckpt.delta.store_layout`). It composes three
parts, one job each:

:class:`~spark_ckpt.delta.checkpoint_log.DeltaCheckpointLog`
    The coordinator's log (``checkpoints``): leases with fencing, id blocks, the completion commit,
    the removal of completed rows. Behind the coordinator view
    (:class:`~spark_ckpt.storage.checkpoint_store.CheckpointLog`), used by the coordinator host in
    the driver-side source runner.
:class:`~spark_ckpt.delta.blob_store.DeltaBlobStore`
    The state blobs and source offsets: idempotent writes, verified reads, damage detection. Behind
    the task view (:class:`~spark_ckpt.storage.checkpoint_store.StateStorage`), used by the tasks in
    the foreachBatch process and the ``ckpt-sink`` commit.
:class:`~spark_ckpt.delta.garbage_collector.DeltaGarbageCollector`
    Deleting the blobs retention and discard leave unreferenced, and ``VACUUM``.
:class:`~spark_ckpt.delta.checkpoint_history.DeltaCheckpointHistory`
    The statistics history (``checkpoint_history``): failure records, and the records of
    completed checkpoints, written before retention or discard removes them; bounded by
    its own size, fenced against the log's leases.

How the parts meet the contract: a checkpoint becomes visible with its completion commit to the log,
which first checks that every referenced blob was written (a crash anywhere earlier leaves only
unreferenced blob rows, which retention or :meth:`DeltaCheckpointStore.discard` removes later).
Retention and discard first remove completed rows with one fenced commit, then collect the garbage
defined against the checkpoints kept by that commit. A blob found missing is damage only if a
completed checkpoint references it.
:meth:`~spark_ckpt.storage.checkpoint_store.CheckpointStore.verify` reads a checkpoint's blobs with
one scan per state table; if that fails in any way it examines the data files one by one
(:meth:`~spark_ckpt.delta.blob_store.DeltaBlobStore.examine_files`) to tell damage from an outage.

Threading: an instance may be shared by the coordinator thread and task threads; every call
is an independent transaction on freshly loaded tables (locks only guard caches: opened
tables, the parsed log). Concurrent task writes to a state table are rebased by delta-rs
(blind appends do not conflict); only ``checkpoints`` commits refuse to rebase.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa

from spark_ckpt.delta.blob_store import DeltaBlobStore
from spark_ckpt.delta.boundary import store_boundary
from spark_ckpt.delta.checkpoint_history import DeltaCheckpointHistory
from spark_ckpt.delta.checkpoint_log import DeltaCheckpointLog
from spark_ckpt.delta.garbage_collector import DeltaGarbageCollector
from spark_ckpt.delta.store_layout import StoreTable
from spark_ckpt.delta.store_tables import StoreTables
from spark_ckpt.errors import CorruptCheckpointError, StoreError
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint, FailedCheckpoint
from spark_ckpt.protocol.clock import Clock, SystemClock
from spark_ckpt.protocol.state_handles import BlobRef, TaskSnapshot, TaskStateHandle
from spark_ckpt.storage.checkpoint_store import CheckpointStore
from spark_ckpt.storage.history import DEFAULT_HISTORY_SIZE, CheckpointRecord
from spark_ckpt.storage.lease import CoordinatorLease

#: How often a transaction is re-attempted after losing a commit race before giving up.
DEFAULT_MAX_ATTEMPTS = 64


class DeltaCheckpointStore(CheckpointStore):
    """Checkpoint store on the Delta tables under *root* (a local path or a URI delta-rs
    understands; *storage_options* are passed to delta-rs). See the module docstring.

    *clock* stamps the informational ``committed_at``/``written_at`` columns only.
    *max_attempts* bounds the re-attempts of one transaction after losing a commit race.
    """

    def __init__(
        self,
        root: str,
        *,
        storage_options: dict[str, str] | None = None,
        clock: Clock | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        if max_attempts < 1:
            raise StoreError("max_attempts must be at least 1")
        self._tables = StoreTables(
            root,
            storage_options=storage_options,
            clock=clock if clock is not None else SystemClock(),
        )
        self._log = DeltaCheckpointLog(self._tables, max_attempts=max_attempts)
        self._blobs = DeltaBlobStore(self._tables, completed=self, max_attempts=max_attempts)
        self._history = DeltaCheckpointHistory(self._tables, self._log, max_attempts=max_attempts)
        self._garbage = DeltaGarbageCollector(self._tables, self._blobs)

    # -- locations -------------------------------------------------------------------------
    @property
    def root(self) -> str:
        return self._tables.root

    def table_uri(self, table: StoreTable) -> str:
        """Where *table* lives (for second readers: Spark, polars, DuckDB)."""
        return self._tables.uri(table)

    # -- coordinator view: the log ---------------------------------------------------------
    def acquire(self) -> CoordinatorLease:
        """A new lease (see the contract). Tables an earlier version created first get the log
        settings they lack (:meth:`~spark_ckpt.delta.store_tables.StoreTables.configure`)."""
        with store_boundary("setting the store tables' log properties"):
            for table in StoreTable:
                self._tables.configure(table)
        return self._log.acquire()

    def allocate_ids(self, lease: CoordinatorLease) -> CoordinatorLease:
        return self._log.allocate_ids(lease)

    def commit(self, lease: CoordinatorLease, checkpoint: CompletedCheckpoint) -> None:
        """The completion commit: one small append to ``checkpoints``, fenced; a no-op if the
        id is already committed. Every referenced blob must have been written
        (:class:`StoreError` otherwise). A savepoint's source offsets are copied into
        ``source_offsets`` just before (one append; idempotent); a checkpoint's by the next
        retention (:meth:`retain`), which writes those of every checkpoint it keeps in one
        append instead of one per completion."""
        if checkpoint.is_savepoint:
            self._blobs.write_offsets([checkpoint])
        self._log.commit(lease, checkpoint, check_written=self._blobs.check_written)

    def record_failure(
        self,
        lease: CoordinatorLease,
        failed: FailedCheckpoint,
        *,
        history_size: int = DEFAULT_HISTORY_SIZE,
    ) -> None:
        """A ``failed`` row in ``checkpoint_history``: fenced, idempotent per id."""
        self._history.record(lease, [CheckpointRecord.failed(failed)], history_size)

    def list_history(self) -> list[CheckpointRecord]:
        return self._history.history()

    def completed_ids(self) -> list[int]:
        """As the store contract says: the history's id and status columns and the log's
        completed checkpoints (kept decoded while the log's version stays), no record
        decoded."""
        completed, _ = self._log.list_completed_lenient()
        ids = set(self._history.completed_ids())
        ids.update(c.checkpoint_id for c in completed)
        return sorted(ids)

    def list_failed(self) -> list[FailedCheckpoint]:
        """As the store contract says, decoding only the failure records."""
        return self._history.failed()

    def completion_times(self) -> tuple[dict[int, int], int]:
        """The completion time (epoch ms) of every completed checkpoint and savepoint the
        store still knows, by id (the log's completed rows, the history's completed records),
        and the history's floor: what
        :func:`~spark_ckpt.storage.history.completed_as_of` decides from."""
        recorded, floor = self._history.recorded()
        times = {r.checkpoint_id: r.figures.completed_ms for r in recorded if r.failure is None}
        completed, _ = self._log.list_completed_lenient()
        times.update({c.checkpoint_id: c.stats.completed_ms for c in completed})
        return times, floor

    def list_completed_lenient(
        self,
    ) -> tuple[list[CompletedCheckpoint], list[CorruptCheckpointError]]:
        return self._log.list_completed_lenient()

    def retain(
        self,
        lease: CoordinatorLease,
        retained: int,
        keep_from: int | None = None,
        *,
        collect_garbage: bool = True,
        history_size: int = DEFAULT_HISTORY_SIZE,
    ) -> list[int]:
        """Records the completed checkpoints (and failure rows of earlier versions) not in
        the history yet, then removes what retention drops, and those failure rows, in one
        fenced commit to the log; then copies the source offsets of the checkpoints kept that
        ``source_offsets`` lacks (one append); then collects garbage."""
        self._history.record(lease, [], history_size)
        kept, dropped_ids = self._log.retire(lease, retained, keep_from, drop_legacy_failed=True)
        self._blobs.write_offsets(kept)
        if collect_garbage:
            self._garbage.collect_retained(kept)
        return dropped_ids

    def discard(
        self,
        lease: CoordinatorLease,
        checkpoint_ids: Iterable[int],
        *,
        history_size: int = DEFAULT_HISTORY_SIZE,
    ) -> None:
        """Remove these checkpoints (committed or not) and every blob written for them that
        no remaining checkpoint references, after recording the completed checkpoints not
        in the history yet."""
        ids = sorted(set(checkpoint_ids))
        if ids:
            self._history.record(lease, [], history_size)
        kept = self._log.remove(lease, ids)
        if ids:
            self._garbage.collect_discarded(ids, kept)

    # -- task view: the blobs --------------------------------------------------------------
    def write_task_state(self, checkpoint_id: int, snapshot: TaskSnapshot) -> TaskStateHandle:
        return self._blobs.write_task_state(checkpoint_id, snapshot)

    def read_blob(self, ref: BlobRef) -> pa.Table:
        return self._blobs.read_blob(ref)

    def read_blobs(self, refs: Sequence[BlobRef]) -> list[pa.Table]:
        return self._blobs.read_blobs(refs)

    def describe_blob(self, ref: BlobRef) -> str:
        return self._blobs.describe_blob(ref)

    def stored_blobs(self) -> list[BlobRef]:
        return self._blobs.stored_blobs()

    # -- verification ----------------------------------------------------------------------
    def _find_damage(self, refs: Sequence[BlobRef]) -> tuple[BlobRef | None, StoreError] | None:
        """One :meth:`read_blobs` (one scan per table); if it fails in any way — damage or
        an I/O error, which pyarrow does not tell apart — the file-by-file examination
        decides."""
        try:
            self.read_blobs(refs)
            return None
        except StoreError:
            return self._blobs.examine_files(refs)

    # -- maintenance -----------------------------------------------------------------------
    def vacuum(
        self,
        retention_hours: int = 168,
        *,
        dry_run: bool = False,
        enforce_retention_duration: bool = True,
    ) -> list[str]:
        """Delta ``VACUUM`` of every table (see
        :meth:`~spark_ckpt.delta.garbage_collector.DeltaGarbageCollector.vacuum`); never run
        implicitly."""
        return self._garbage.vacuum(
            retention_hours, dry_run=dry_run, enforce_retention_duration=enforce_retention_duration
        )

"""Garbage collection on Delta: deleting the blob and offset rows no kept checkpoint needs, and
``VACUUM`` of the files Delta no longer references.

The retention side of :class:`~spark_ckpt.delta.delta_store.DeltaCheckpointStore`. It runs after the
fenced removal of completed rows from the log (:mod:`spark_ckpt.delta.checkpoint_log`), with
the checkpoints kept *then*:

* Blob rows go with the data files that hold them: a task writes the blobs of one checkpoint
  and table in one append, one data file, and they usually become garbage together, so a
  file whose every row is garbage is removed from the table by a commit of remove actions
  (:func:`~spark_ckpt.delta.file_removal.remove_files`, decided from the log's
  file statistics, without the query planning of a ``DeltaTable.delete``). Garbage rows in a file
  that also holds live ones are deleted with ``DeltaTable.delete`` (copy-on-write: the file
  is rewritten, no deletion vectors). Both rebase over concurrent task appends with
  delta-rs' conflict resolution (verified with deltalake 1.6).
* Only blobs no kept checkpoint references and none newer than the latest kept one are
  removed (:func:`~spark_ckpt.storage.retention.garbage_blobs`), so a coordinator fenced out
  meanwhile cannot remove anything its successor needs, and the blobs of a pending
  checkpoint newer than every completed one survive (those of a pending checkpoint that a
  savepoint overtook may not: its completion commit then finds them missing and refuses,
  see :meth:`~spark_ckpt.delta.blob_store.DeltaBlobStore.check_written`). Collecting again
  removes nothing more (idempotent).
* Removed files stay on disk (Delta time travel) until :meth:`DeltaGarbageCollector.vacuum`,
  which is never run implicitly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow.compute as pc
from deltalake.exceptions import CommitFailedError

from spark_ckpt.delta.blob_store import DeltaBlobStore, blob_id, blob_table
from spark_ckpt.delta.boundary import store_boundary
from spark_ckpt.delta.file_removal import removal_plan, remove_files
from spark_ckpt.delta.store_layout import BLOB_TABLES, StoreTable
from spark_ckpt.delta.store_tables import StoreTables
from spark_ckpt.delta.store_writes import chunks, sql_list
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.state_handles import BlobRef
from spark_ckpt.storage.retention import garbage_blobs

#: How often a garbage delete is run again after losing to a concurrent append.
DELETE_ATTEMPTS = 5


class DeltaGarbageCollector:
    """Deletes garbage rows from the state and offset tables of *tables*, listing the stored
    blobs through *blobs* (see the module docstring)."""

    def __init__(self, tables: StoreTables, blobs: DeltaBlobStore) -> None:
        self._tables = tables
        self._blobs = blobs

    def collect_retained(self, kept: Sequence[CompletedCheckpoint]) -> None:
        """After retention kept *kept*: delete every blob and offset row up to the newest
        kept checkpoint that no kept checkpoint needs."""
        with store_boundary("retain: removing garbage", reading=True):
            horizon = max((c.checkpoint_id for c in kept), default=0)
            stored = self._blobs.stored_refs_upto(horizon)
            self._delete_blobs(garbage_blobs(stored, kept))
            kept_ids = {c.checkpoint_id for c in kept}
            self._delete_offsets(lambda i: i <= horizon and i not in kept_ids)

    def collect_discarded(self, ids: Sequence[int], kept: Sequence[CompletedCheckpoint]) -> None:
        """After the checkpoints *ids* were discarded: delete every blob and offset row
        written for them that no checkpoint in *kept* references."""
        with store_boundary("discard: removing blobs", reading=True):
            referenced = {b.key for c in kept for b in c.blobs()}
            stored = self._blobs.stored_refs_of(ids)
            self._delete_blobs([r for r in stored if r.key not in referenced])
            kept_ids = {c.checkpoint_id for c in kept}
            id_set = set(ids)
            self._delete_offsets(lambda i: i in id_set and i not in kept_ids)

    def _delete_blobs(self, refs: Sequence[BlobRef]) -> None:
        """Delete blob rows: the data files all of whose rows go are removed, the other rows
        deleted (copy-on-write), rebasing over concurrent task appends."""
        for table in BLOB_TABLES:
            doomed = {(r.checkpoint_id, blob_id(r)) for r in refs if blob_table(r.kind) is table}
            if doomed:
                self._remove_blobs(table, doomed)

    def _remove_blobs(self, table: StoreTable, doomed: set[tuple[int, str]]) -> None:
        """Remove the rows (checkpoint id, blob id) *doomed* from *table* (see
        :meth:`_delete_blobs`; which files go whole is decided from the log's statistics:
        :func:`~spark_ckpt.delta.file_removal.removal_plan`). A lost commit race
        is tried again on the newer version, up to :data:`DELETE_ATTEMPTS` times: what is
        gone by then is not looked for again."""
        for attempt in range(DELETE_ATTEMPTS):
            dt = self._tables.ensure(table)
            whole, rest = removal_plan(dt, doomed, "blob_id")
            try:
                if whole:
                    remove_files(dt, whole)
                for chunk in chunks(sorted(rest)):
                    ids = sorted({cid for cid, _ in chunk})
                    bids = sorted({bid for _, bid in chunk})
                    self._tables.ensure(table).delete(
                        f"checkpoint_id IN {sql_list(ids)} AND blob_id IN {sql_list(bids)}"
                    )
                return
            except CommitFailedError:
                if attempt + 1 == DELETE_ATTEMPTS:
                    raise

    def _delete_offsets(self, drop: Callable[[int], bool]) -> None:
        dt = self._tables.load(StoreTable.SOURCE_OFFSETS)
        if dt is None:
            return
        present = self._tables.scan(dt, ["checkpoint_id"])["checkpoint_id"]
        ids = [i for i in pc.unique(present).to_pylist() if drop(i)]
        for chunk in chunks(sorted(ids)):
            self._delete(StoreTable.SOURCE_OFFSETS, f"checkpoint_id IN {sql_list(chunk)}")

    def _delete(self, table: StoreTable, predicate: str) -> None:
        """Delete the rows of *table* matching *predicate*, on its newest version. delta-rs
        refuses a delete when a concurrent append added files the predicate may match (a
        task writing its blobs meanwhile: "a concurrent transactions added new data"); the
        delete removes only garbage, so it is simply run again on the newer version, up to
        :data:`DELETE_ATTEMPTS` times (then the error goes to the caller: retention is tried
        again later)."""
        for attempt in range(DELETE_ATTEMPTS):
            try:
                self._tables.ensure(table).delete(predicate)
                return
            except CommitFailedError:
                if attempt + 1 == DELETE_ATTEMPTS:
                    raise

    def vacuum(
        self,
        retention_hours: int = 168,
        *,
        dry_run: bool = False,
        enforce_retention_duration: bool = True,
    ) -> list[str]:
        """Physically delete data files that the tables no longer reference and that were
        removed more than *retention_hours* ago (Delta ``VACUUM``). Never run implicitly:
        until then removed state stays readable by Delta time travel. Returns the files
        (to be) deleted. A retention below the table's ``delta.deletedFileRetentionDuration``
        needs ``enforce_retention_duration=False`` and is safe only when no reader is
        reading an older table version."""
        out: list[str] = []
        with store_boundary("vacuum"):
            for table in StoreTable:
                dt = self._tables.load(table)
                if dt is not None:
                    out.extend(
                        dt.vacuum(
                            retention_hours=retention_hours,
                            dry_run=dry_run,
                            enforce_retention_duration=enforce_retention_duration,
                        )
                    )
        return out

"""The checkpoint statistics history on Delta: the ``checkpoint_history`` table.

The Delta side of :mod:`spark_ckpt.storage.history`, part of
:class:`~spark_ckpt.delta.delta_store.DeltaCheckpointStore`. One row per finished checkpoint or
savepoint (schema :data:`~spark_ckpt.delta.store_layout.HISTORY_SCHEMA`): queryable figures
plus the canonical JSON of its :class:`~spark_ckpt.storage.history.CheckpointRecord` and
that JSON's SHA-256. How it keeps the store contract:

* **Bounded.** Every write rewrites the whole table (``mode="overwrite"``, one small data
  file) with the newest ``history_size`` records by id, so the live table never holds more
  than that. The files earlier versions leave behind are kept for an hour, their log entries
  for a minute (table properties ``delta.deletedFileRetentionDuration`` and
  ``delta.logRetentionDuration``; delta-rs checkpoints the log every 20 commits and then
  removes expired log files: :data:`~spark_ckpt.delta.store_layout.HOT_LOG`);
  every :data:`VACUUM_EVERY`-th version the writer also vacuums the table (best effort).
* **Fenced.** A write first checks, on a fresh read of ``checkpoints``, that the caller's
  lease holds the newest epoch
  (:meth:`~spark_ckpt.delta.checkpoint_log.DeltaCheckpointLog.check_lease`), then reads the
  history at version *V*, refuses if its ``writer_epoch`` is newer than the caller's, and
  commits the rewrite (``writer_epoch`` = the caller's) with ``max_commit_retries=0`` on
  *V*, so it lands at exactly *V + 1* or is re-attempted on a fresh snapshot. Once a
  coordinator has written the history, no older one can; between a newer coordinator's
  lease and its first write an older one may still add records of its own checkpoints,
  which are true statistics of checkpoints that did finish.
* **Idempotent.** A record whose id the table holds is not written again (the first record
  of an id wins); a write that adds nothing and drops nothing commits nothing.
* **Integrity.** A row whose JSON fails its checksum is skipped with a WARNING: statistics
  never fail a reader.
* **Cached by version.** What an instance read or wrote at a version of the table (its
  rows, the decoded records, the completed ids) is kept until the table moves on: a Delta
  version never changes, and the history changes at most once per retention pass while the
  driver's reporter and waiting clients poll it several times a second.

Threading: every call is an independent transaction on a freshly loaded table; a lock
guards the caches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from spark_ckpt.delta.boundary import store_boundary
from spark_ckpt.delta.checkpoint_log import DeltaCheckpointLog
from spark_ckpt.delta.store_layout import HISTORY_SCHEMA, StoreTable
from spark_ckpt.delta.store_tables import StoreTables
from spark_ckpt.delta.store_writes import no_rebase
from spark_ckpt.errors import CorruptCheckpointError, FencedError, StoreError
from spark_ckpt.protocol.checkpoint import FailedCheckpoint
from spark_ckpt.storage.history import (
    CheckpointRecord,
    RecordStatus,
    bounded,
    merge_history,
    unrecorded,
)
from spark_ckpt.storage.lease import CoordinatorLease

log = logging.getLogger(__name__)

#: Every this many table versions, the writer vacuums the history's removed files.
VACUUM_EVERY = 100
#: The age (hours) of removed files the vacuum deletes: the table's
#: ``delta.deletedFileRetentionDuration``.
VACUUM_RETENTION_HOURS = 1


@dataclass
class _Snapshot:
    """The history table at one version; what was decoded from it is filled in when first
    asked for."""

    version: int
    rows: pa.Table  # every column of HISTORY_SCHEMA
    ids: frozenset[int]
    writer_epoch: int  # 0 for an empty table
    floor: int  # one more than the largest id the bound dropped (0 for an empty table)
    #: decoded records by failed_only (see :meth:`DeltaCheckpointHistory.recorded`)
    records: dict[bool, list[CheckpointRecord]] = field(default_factory=dict, compare=False)
    completed: list[int] | None = field(default=None, compare=False)


class DeltaCheckpointHistory:
    """The ``checkpoint_history`` table of *tables* (see the module docstring), fenced
    against the leases of *checkpoint_log*."""

    def __init__(
        self, tables: StoreTables, checkpoint_log: DeltaCheckpointLog, *, max_attempts: int
    ) -> None:
        self._tables = tables
        self._log = checkpoint_log
        self._max_attempts = max_attempts
        self._lock = threading.Lock()
        self._cached: _Snapshot | None = None  # the table at the version last read or written

    # -- reading ---------------------------------------------------------------------------
    def recorded(self, *, failed_only: bool = False) -> tuple[list[CheckpointRecord], int]:
        """The records in the table, by id (a damaged row is skipped with a WARNING), and
        the history's floor. *failed_only*: only the failed and aborted records are decoded
        (what a client waiting for its request's answer looks for, several times a
        second)."""
        with store_boundary("reading the checkpoint history", reading=True):
            dt = self._tables.load(StoreTable.HISTORY)
            if dt is None:
                return [], 0
            snap = self._snapshot(dt)
        with self._lock:
            done = snap.records.get(failed_only)
        if done is None:
            done = _decode(snap.rows, failed_only=failed_only)
            with self._lock:
                snap.records[failed_only] = done
        return list(done), snap.floor

    def completed_ids(self) -> list[int]:
        """The ids of the completed records, from the id and status columns alone (a record
        whose JSON is damaged is counted: it says it completed)."""
        with store_boundary("reading the checkpoint history", reading=True):
            dt = self._tables.load(StoreTable.HISTORY)
            if dt is None:
                return []
            snap = self._snapshot(dt)
        with self._lock:
            ids = snap.completed
        if ids is None:
            t = snap.rows
            done = t.filter(pc.equal(t["status"], RecordStatus.COMPLETED.value))
            ids = sorted(set(done["checkpoint_id"].to_pylist()))
            with self._lock:
                snap.completed = ids
        return list(ids)

    def history(self) -> list[CheckpointRecord]:
        """What readers see (:func:`~spark_ckpt.storage.history.merge_history`): the records,
        plus the log's completed checkpoints and older failure rows not recorded yet — all of
        the log for a root written before the history table existed."""
        recorded, floor = self.recorded()
        completed, _ = self._log.list_completed_lenient()
        legacy = self._log.list_legacy_failed()
        return merge_history(recorded, completed, legacy, floor=floor)

    def failed(self) -> list[FailedCheckpoint]:
        """The failed and aborted checkpoints readers see (:meth:`history`'s), by id,
        decoding only those records."""
        recorded, floor = self.recorded(failed_only=True)
        legacy = self._log.list_legacy_failed()
        merged = merge_history(recorded, (), legacy, floor=floor)
        return [r.failure for r in merged if r.failure is not None]

    # -- writing ---------------------------------------------------------------------------
    def record(
        self,
        lease: CoordinatorLease,
        records: Sequence[CheckpointRecord],
        history_size: int,
    ) -> None:
        """Add *records* and the :func:`~spark_ckpt.storage.history.unrecorded` completed
        checkpoints and older failure rows of the log (those whose id is not recorded yet
        and at least the floor); keep the newest *history_size*. Fenced (see the module
        docstring); commits nothing when nothing changes."""
        bounded([], history_size)  # validates the size before anything is read
        legacy = self._log.list_legacy_failed()
        with store_boundary("recording checkpoint statistics", reading=True):
            for _ in range(self._max_attempts):
                self._log.check_lease(lease)
                dt = self._tables.ensure(StoreTable.HISTORY)
                snap = self._snapshot(dt)
                if snap.writer_epoch > lease.epoch:
                    raise FencedError(
                        f"coordinator epoch {lease.epoch} was superseded by epoch "
                        f"{snap.writer_epoch} (checkpoint history)"
                    )
                completed, _ = self._log.list_completed_lenient()
                adds: dict[int, CheckpointRecord] = {}
                for r in [*records, *unrecorded(snap.ids, completed, legacy, floor=snap.floor)]:
                    if r.checkpoint_id not in snap.ids and r.checkpoint_id >= snap.floor:
                        adds.setdefault(r.checkpoint_id, r)
                kept, floor = bounded(snap.ids | set(adds), history_size, snap.floor)
                if not adds and floor == snap.floor:
                    return
                keep = set(kept)
                new = [adds[i] for i in sorted(adds) if i in keep]
                table = self._rewrite(snap.rows, new, keep, lease.epoch, floor)
                try:
                    write_deltalake(dt, table, mode="overwrite", commit_properties=no_rebase())
                except CommitFailedError:
                    continue
                if dt.version() == snap.version + 1:  # our put-if-absent commit: *table*
                    with self._lock:
                        self._cached = _snapshot_of(dt.version(), table)
                self._maintain(dt.version())
                return
            raise StoreError(
                f"recording checkpoint statistics: lost {self._max_attempts} commit races in a row"
            )

    def _snapshot(self, dt: DeltaTable) -> _Snapshot:
        """The table at *dt*'s version: from the cache when this instance read or wrote
        exactly that version, else scanned."""
        version = dt.version()
        with self._lock:
            cached = self._cached
        if cached is not None and cached.version == version:
            return cached
        snap = _snapshot_of(version, self._tables.scan(dt, HISTORY_SCHEMA.names))
        with self._lock:
            self._cached = snap
        return snap

    def _rewrite(
        self,
        rows: pa.Table,
        new: Sequence[CheckpointRecord],
        keep: set[int],
        epoch: int,
        floor: int,
    ) -> pa.Table:
        """The table's next content: the kept rows as they are (``writer_epoch`` set to
        *epoch*, ``dropped_below`` to *floor*), then a row per new record, by id."""
        old = rows.filter(pc.is_in(rows["checkpoint_id"], pa.array(sorted(keep), pa.int64())))
        for name, value in (("writer_epoch", epoch), ("dropped_below", floor)):
            old = old.set_column(
                old.schema.get_field_index(name),
                HISTORY_SCHEMA.field(name),
                pa.array([value] * old.num_rows, pa.int64()),
            )
        now = self._tables.now()
        added = _rows(new, epoch, now, floor)
        merged = pa.concat_tables([old.cast(HISTORY_SCHEMA), added])
        return merged.sort_by("checkpoint_id")

    def _maintain(self, version: int) -> None:
        """Every :data:`VACUUM_EVERY`-th version: vacuum the files earlier versions removed
        (older than the table's one-hour retention). Best effort: a failure is logged."""
        if version % VACUUM_EVERY:
            return
        dt = self._tables.load(StoreTable.HISTORY)
        if dt is None:
            return
        try:
            dt.vacuum(retention_hours=VACUUM_RETENTION_HOURS, dry_run=False)
        except (DeltaError, OSError) as e:
            log.warning("vacuum of the checkpoint history failed: %s", e)


def _rows(records: Sequence[CheckpointRecord], epoch: int, now_us: int, floor: int) -> pa.Table:
    """History rows for *records* (see :data:`HISTORY_SCHEMA`)."""
    cols: dict[str, list[object]] = {name: [] for name in HISTORY_SCHEMA.names}
    fill: dict[str, Callable[[CheckpointRecord], object]] = {
        "checkpoint_id": lambda r: r.checkpoint_id,
        "status": lambda r: r.status.value,
        "snapshot_type": lambda r: r.snapshot_type.value,
        "trigger_ts": lambda r: r.figures.trigger_ms * 1000,
        "end_ts": lambda r: r.figures.completed_ms * 1000,
        "duration_ms": lambda r: r.figures.end_to_end_ms,
        "state_bytes": lambda r: r.figures.state_bytes,
        "bytes_written": lambda r: r.figures.bytes_written,
        "channel_state_bytes": lambda r: r.figures.channel_state_bytes,
        "alignment_ms": lambda r: r.figures.max_alignment_ms,
        "start_delay_ms": lambda r: r.figures.max_start_delay_ms,
        "reason": lambda r: r.failure.reason if r.failure else None,
        "message": lambda r: r.failure.message if r.failure else None,
        "record": lambda r: r.to_json(),
        "checksum": lambda r: r.checksum(),
        "recorded_at": lambda r: now_us,
        "writer_epoch": lambda r: epoch,
        "dropped_below": lambda r: floor,
    }
    for r in records:
        for name, get in fill.items():
            cols[name].append(get(r))
    return pa.Table.from_arrays(
        [pa.array(cols[f.name], type=f.type) for f in HISTORY_SCHEMA], schema=HISTORY_SCHEMA
    )


def _snapshot_of(version: int, rows: pa.Table) -> _Snapshot:
    epoch = pc.max(rows["writer_epoch"]).as_py() if rows.num_rows else 0
    floor = pc.max(rows["dropped_below"]).as_py() if rows.num_rows else 0
    ids = frozenset(int(i) for i in rows["checkpoint_id"].to_pylist())
    return _Snapshot(version, rows, ids, int(epoch or 0), int(floor or 0))


def _decode(rows: pa.Table, *, failed_only: bool) -> list[CheckpointRecord]:
    """The records of history *rows* by id (the first row of an id wins); a damaged one is
    skipped with a WARNING. *failed_only*: only the failed and aborted ones."""
    t = rows
    if failed_only:
        t = t.filter(pc.not_equal(t["status"], RecordStatus.COMPLETED.value))
    out: dict[int, CheckpointRecord] = {}
    for cid, text, digest in zip(
        t["checkpoint_id"].to_pylist(),
        t["record"].to_pylist(),
        t["checksum"].to_pylist(),
        strict=True,
    ):
        try:
            record = CheckpointRecord.from_json(text, digest)
        except CorruptCheckpointError as e:
            log.warning("checkpoint history record %s is damaged; skipped: %s", cid, e)
            continue
        out.setdefault(int(cid), record)
    return [out[k] for k in sorted(out)]

"""The coordinator's log on Delta: the ``checkpoints`` table (leases with fencing, id blocks,
completed checkpoints).

The log side of :class:`~spark_ckpt.delta.delta_store.DeltaCheckpointStore`, written through
the coordinator view (:class:`~spark_ckpt.storage.checkpoint_store.CheckpointLog`) by the
coordinator on the driver side and read
(:class:`~spark_ckpt.storage.checkpoint_store.CompletedCheckpoints`) by everyone. How it keeps
the contract of :mod:`spark_ckpt.storage.checkpoint_store`:

* **Visibility.** A checkpoint exists once its ``completed`` row is committed (one small
  append per checkpoint: the completion commit). Blob rows written before are unreferenced
  until then.
* **Fencing.** Every write reads the table at version *V*, checks that the newest lease epoch
  is the caller's, and commits on that snapshot with ``max_commit_retries=0``: it lands at
  exactly *V + 1* or raises ``CommitFailedError`` (delta-rs writes the log file with
  put-if-absent and does not rebase). A failed attempt re-reads and re-checks; a newer epoch
  raises :class:`FencedError`. Check and commit are therefore atomic where log commits are
  (local disk, ADLS, GCS; S3 with a locking provider or conditional puts).
* **Ids** come from lease rows: a new block starts at the largest ``id_end`` ever logged.
* **Idempotent commit.** ``commit`` of an id with a ``completed`` row is a no-op (checked on
  the fenced snapshot, so it is race free).
* **Retention** removes the dropped checkpoints' ``completed`` rows in one fenced commit. Each
  is a data file of its own (a one-row append), so the commit removes whole files with
  ``remove`` actions (:func:`~spark_ckpt.delta.file_removal.remove_files`: no
  query planning); a file that also holds rows to keep makes it a ``DeltaTable.delete``.
  Their blobs are the garbage collector's (:mod:`spark_ckpt.delta.garbage_collector`).
* **Failed checkpoints** are recorded in the statistics history
  (:mod:`spark_ckpt.delta.checkpoint_history`), not here. ``failed`` rows of roots written by
  earlier versions are read by :meth:`DeltaCheckpointLog.list_legacy_failed` (a row that
  fails its checksum is skipped with a WARNING), never as completed checkpoints, and deleted
  by retention once the history holds them (``drop_legacy_failed``).
* **Integrity.** Metadata is verified against its checksum
  (:func:`~spark_ckpt.storage.metadata.parse_completed`); a completed row without metadata,
  or one committed twice differently, makes the log unreadable
  (:class:`CorruptCheckpointError`).

Reading costs O(data files not read before): a version this instance wrote is known without
a read, and Delta never rewrites a data file in place, so a poller reads each completion's
file once. Threading: every call is an independent transaction on a freshly loaded table;
the lock only guards the caches (the parsed log, the files read).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from spark_ckpt.delta.boundary import store_boundary
from spark_ckpt.delta.file_removal import removal_plan, remove_files
from spark_ckpt.delta.store_layout import CHECKPOINTS_SCHEMA, StoreTable, empty_table
from spark_ckpt.delta.store_tables import StoreTables
from spark_ckpt.delta.store_writes import no_rebase, rows_table, sql_list
from spark_ckpt.errors import CorruptCheckpointError, FencedError, StoreError
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint, FailedCheckpoint
from spark_ckpt.storage.lease import ID_BLOCK, CoordinatorLease
from spark_ckpt.storage.metadata import parse_completed
from spark_ckpt.storage.retention import retention_plan

log = logging.getLogger(__name__)

#: The columns of ``checkpoints`` a view of the log reads.
_VIEW_COLUMNS = ("record", "epoch", "checkpoint_id", "id_end", "metadata", "checksum")

_T = TypeVar("_T")


class LogRecord(StrEnum):
    """The ``record`` column of the ``checkpoints`` table."""

    LEASE = "lease"
    COMPLETED = "completed"
    FAILED = "failed"  # failure records of earlier versions (now in the history table)


@dataclass(frozen=True)
class _LogView:
    """The ``checkpoints`` table at one version, as the coordinator protocol needs it."""

    version: int
    max_epoch: int
    next_id: int  # the largest id_end ever leased (1 when nothing was leased)
    completed: Mapping[int, tuple[str, str]]  # id -> (metadata json, checksum)
    failed: frozenset[int] = frozenset()  # ids with a (legacy) failed-checkpoint row


class DeltaCheckpointLog:
    """The ``checkpoints`` table of *tables* (see the module docstring). *max_attempts*
    bounds the re-attempts of one transaction after losing a commit race.

    Its writes are the fenced halves of the coordinator view; what they leave behind in the
    state tables (blobs of removed checkpoints) is for the caller to collect."""

    def __init__(self, tables: StoreTables, *, max_attempts: int) -> None:
        self._tables = tables
        self._max_attempts = max_attempts
        self._lock = threading.Lock()
        # (version, parsed completed checkpoints, damaged ones) of the last listing.
        self._completed_cache: (
            tuple[int, list[CompletedCheckpoint], list[CorruptCheckpointError]] | None
        ) = None
        self._view_cache: _LogView | None = None
        # checkpoint id -> (metadata, checksum, parsed) of the rows this instance decoded
        self._decoded: dict[int, tuple[str, str, CompletedCheckpoint]] = {}
        # data file -> its rows (the view's columns): a new version is read file by file,
        # only the files this instance has not read
        self._files: dict[str, pa.Table] = {}

    # -- reading ---------------------------------------------------------------------------
    def list_completed_lenient(
        self,
    ) -> tuple[list[CompletedCheckpoint], list[CorruptCheckpointError]]:
        """Every committed checkpoint whose metadata verifies, and an error per completed row whose
        metadata does not (see
        :meth:`~spark_ckpt.storage.checkpoint_store.CompletedCheckpoints.list_completed_lenient`). A
        log that cannot be read at all (a lost data file, a row without metadata) still raises."""
        with store_boundary("listing completed checkpoints", reading=True):
            dt = self._tables.load(StoreTable.CHECKPOINTS)
            if dt is None:
                return [], []
            with self._lock:
                cached = self._completed_cache
            if cached is not None and cached[0] == dt.version():
                return list(cached[1]), list(cached[2])
            view = self._view(dt)
        good, bad = self._parse(view)
        with self._lock:
            self._completed_cache = (view.version, good, bad)
        return list(good), list(bad)

    # -- fencing and ids -------------------------------------------------------------------
    def acquire(self) -> CoordinatorLease:
        """A new epoch above every logged one, with the next id block (fences older ones)."""
        return self._fenced(
            "acquire",
            None,
            lambda dt, view: self._append_lease(dt, view, view.max_epoch + 1),
        )

    def allocate_ids(self, lease: CoordinatorLease) -> CoordinatorLease:
        """The next id block for *lease*'s epoch; fenced."""
        return self._fenced(
            "allocate_ids",
            lease,
            lambda dt, view: self._append_lease(dt, view, lease.epoch),
        )

    # -- completion ------------------------------------------------------------------------
    def commit(
        self,
        lease: CoordinatorLease,
        checkpoint: CompletedCheckpoint,
        *,
        check_written: Callable[[CompletedCheckpoint, Sequence[CompletedCheckpoint]], None],
    ) -> None:
        """The completion commit: one small append to ``checkpoints``, fenced; a no-op if the
        id is already committed. *check_written* raises :class:`StoreError` unless every blob
        the checkpoint references was written; it runs (once) before the append, given the
        checkpoints the fenced snapshot holds completed."""
        cid = checkpoint.checkpoint_id
        text = checkpoint.to_json()
        row = rows_table(
            CHECKPOINTS_SCHEMA,
            {
                "record": [LogRecord.COMPLETED.value],
                "epoch": [lease.epoch],
                "checkpoint_id": [cid],
                "snapshot_type": [checkpoint.snapshot_type.value],
                "trigger_ts": [checkpoint.stats.trigger_ms * 1000],
                "completed_ts": [checkpoint.stats.completed_ms * 1000],
                "state_bytes": [checkpoint.stats.state_bytes],
                "metadata": [text],
                "checksum": [checkpoint.checksum()],
                "committed_at": [self._tables.now()],
            },
        )
        verified = False

        def action(dt: DeltaTable, view: _LogView) -> None:
            nonlocal verified
            if cid in view.completed:
                return
            if not verified:
                check_written(checkpoint, self._parsed(view))
                verified = True
            write_deltalake(dt, row, mode="append", commit_properties=no_rebase())
            digest = checkpoint.checksum()
            with self._lock:  # what it committed needs no decoding when it is listed
                self._decoded = {**self._decoded, cid: (text, digest, checkpoint)}
            self._remember(dt, view, completed=(cid, (text, digest)))

        self._fenced(f"commit of checkpoint {cid}", lease, action)

    # -- fencing of the other coordinator tables ------------------------------------------
    def check_lease(self, lease: CoordinatorLease) -> None:
        """Raise :class:`FencedError` unless *lease* holds the newest epoch of the log now
        (for writes to tables other than ``checkpoints``, which fence against it)."""
        with store_boundary("checking the coordinator lease", reading=True):
            view = self._view(self._tables.ensure(StoreTable.CHECKPOINTS))
        if view.max_epoch != lease.epoch:
            raise FencedError(
                f"coordinator epoch {lease.epoch} was superseded by epoch {view.max_epoch}"
            )

    # -- failure records of earlier versions -----------------------------------------------
    def list_legacy_failed(self) -> list[FailedCheckpoint]:
        """Every ``failed`` row (written by earlier versions), by id; a row that fails its
        checksum is skipped with a WARNING (statistics never fail a caller)."""
        with store_boundary("listing failed checkpoints", reading=True):
            dt = self._tables.load(StoreTable.CHECKPOINTS)
            if dt is None or not self._view(dt).failed:
                return []
            t = self._tables.scan(dt, ["record", "checkpoint_id", "metadata", "checksum"])
        rows = t.filter(pc.equal(t["record"], LogRecord.FAILED.value))
        out: dict[int, FailedCheckpoint] = {}
        for cid, text, digest in zip(
            rows["checkpoint_id"].to_pylist(),
            rows["metadata"].to_pylist(),
            rows["checksum"].to_pylist(),
            strict=True,
        ):
            if text is None or hashlib.sha256(text.encode()).hexdigest() != digest:
                log.warning("failed-checkpoint record %s is damaged; skipped", cid)
                continue
            try:
                out.setdefault(int(cid), FailedCheckpoint.from_json(text))
            except CorruptCheckpointError as e:
                log.warning("failed-checkpoint record %s is damaged; skipped: %s", cid, e)
        return [out[k] for k in sorted(out)]

    # -- removal ---------------------------------------------------------------------------
    def retire(
        self,
        lease: CoordinatorLease,
        retained: int,
        keep_from: int | None = None,
        *,
        drop_legacy_failed: bool = False,
    ) -> tuple[list[CompletedCheckpoint], list[int]]:
        """Fenced removal of the completed rows retention drops
        (:func:`~spark_ckpt.storage.retention.retention_plan`) and, with
        *drop_legacy_failed*, of every ``failed`` row (the caller recorded them in the
        history first), in one commit; returns the checkpoints kept and the ids removed."""
        good, bad = self.list_completed_lenient()
        if bad:
            raise bad[0]
        retention_plan(good, retained)  # validates *retained* first

        def action(dt: DeltaTable, view: _LogView) -> tuple[list[CompletedCheckpoint], list[int]]:
            kept, dropped = retention_plan(_parse(view), retained, keep_from)
            ids = [c.checkpoint_id for c in dropped]
            failed = sorted(view.failed) if drop_legacy_failed else []
            self._delete_completed(dt, view, ids, failed=failed)
            return kept, ids

        return self._fenced("retain", lease, action)

    def remove(self, lease: CoordinatorLease, ids: Sequence[int]) -> list[CompletedCheckpoint]:
        """Fenced removal of the completed rows of *ids* (those present); returns the
        checkpoints that remain."""

        def action(dt: DeltaTable, view: _LogView) -> list[CompletedCheckpoint]:
            self._delete_completed(dt, view, [i for i in ids if i in view.completed])
            return [c for c in _parse(view) if c.checkpoint_id not in ids]

        return self._fenced("discard", lease, action)

    # -- the fenced protocol ---------------------------------------------------------------
    def _fenced(
        self,
        what: str,
        lease: CoordinatorLease | None,
        action: Callable[[DeltaTable, _LogView], _T],
    ) -> _T:
        """Run *action* on a fresh snapshot of ``checkpoints`` after checking that *lease*
        (if given) holds the newest epoch. *action* commits (if at all) through the given
        table with :func:`~spark_ckpt.delta.store_writes.no_rebase`, so its commit fails when
        anything else committed since the check; the attempt is then repeated on a fresh
        snapshot."""
        with store_boundary(what, reading=True):
            for _ in range(self._max_attempts):
                dt = self._tables.ensure(StoreTable.CHECKPOINTS)
                view = self._view(dt)
                if lease is not None and view.max_epoch != lease.epoch:
                    raise FencedError(
                        f"coordinator epoch {lease.epoch} was superseded by epoch {view.max_epoch}"
                    )
                try:
                    return action(dt, view)
                except CommitFailedError:
                    continue
            raise StoreError(f"{what}: lost {self._max_attempts} commit races in a row")

    def _append_lease(self, dt: DeltaTable, view: _LogView, epoch: int) -> CoordinatorLease:
        lease = CoordinatorLease(epoch, view.next_id, view.next_id + ID_BLOCK)
        row: dict[str, list[Any]] = {
            "record": [LogRecord.LEASE.value],
            "epoch": [lease.epoch],
            "checkpoint_id": [lease.first_id],
            "id_end": [lease.end_id],
            "committed_at": [self._tables.now()],
        }
        write_deltalake(
            dt,
            rows_table(CHECKPOINTS_SCHEMA, row),
            mode="append",
            commit_properties=no_rebase(),
        )
        self._remember(dt, view, lease=lease)
        return lease

    def _delete_completed(
        self, dt: DeltaTable, view: _LogView, ids: Sequence[int], failed: Sequence[int] = ()
    ) -> None:
        """Fenced removal of completed rows *ids* and failed-checkpoint rows *failed* (one
        commit on the checked snapshot *view*)."""
        if not ids and not failed:
            return
        doomed = {(i, LogRecord.COMPLETED.value) for i in ids}
        doomed |= {(i, LogRecord.FAILED.value) for i in failed}
        whole, elsewhere = removal_plan(dt, doomed, "record")
        if not elsewhere and remove_files(dt, whole, commit_properties=no_rebase()):
            dt.update_incremental()  # the object stays at the version it committed on
        else:
            parts = []
            if ids:
                parts.append(
                    f"(record = '{LogRecord.COMPLETED.value}' AND checkpoint_id IN {sql_list(ids)})"
                )
            if failed:
                parts.append(
                    f"(record = '{LogRecord.FAILED.value}' AND checkpoint_id IN {sql_list(failed)})"
                )
            dt.delete(" OR ".join(parts), commit_properties=no_rebase())
        self._remember(dt, view, removed=ids, failed_removed=failed)

    # -- the parsed log --------------------------------------------------------------------
    def _parsed(self, view: _LogView) -> list[CompletedCheckpoint]:
        """The completed checkpoints of *view* whose metadata verifies (from the cache of
        :meth:`list_completed_lenient` when it parsed that version)."""
        with self._lock:
            cached = self._completed_cache
        if cached is not None and cached[0] == view.version:
            return list(cached[1])
        good, bad = self._parse(view)
        with self._lock:
            self._completed_cache = (view.version, good, bad)
        return list(good)

    def _parse(
        self, view: _LogView
    ) -> tuple[list[CompletedCheckpoint], list[CorruptCheckpointError]]:
        """:func:`~spark_ckpt.storage.metadata.parse_completed` of *view*'s completed rows,
        decoding only the rows this instance has not decoded (or committed) before with the
        same metadata and checksum: a process polling the log, as the driver's reporter and
        clients do, decodes each completed checkpoint once, not at every new version, and
        the coordinator, listing the log after its own completions and retentions (the
        completion's sink commit reads its checkpoint back), decodes nothing."""
        with self._lock:
            known = self._decoded
        reused: list[CompletedCheckpoint] = []
        fresh: list[tuple[int, tuple[str, str]]] = []
        for cid, (text, digest) in view.completed.items():
            hit = known.get(cid)
            if hit is not None and hit[0] == text and hit[1] == digest:
                reused.append(hit[2])
            else:
                fresh.append((cid, (text, digest)))
        good, bad = parse_completed(fresh) if fresh else ([], [])
        rows = dict(fresh)
        decoded = {c.checkpoint_id: known[c.checkpoint_id] for c in reused}
        decoded.update({c.checkpoint_id: (*rows[c.checkpoint_id], c) for c in good})
        with self._lock:
            self._decoded = decoded
        return sorted([*reused, *good], key=lambda c: c.checkpoint_id), bad

    def _view(self, dt: DeltaTable) -> _LogView:
        """The ``checkpoints`` log at *dt*'s version: from the cache when this instance read
        or wrote exactly that version (see :meth:`_remember`), else scanned."""
        with self._lock:
            cached = self._view_cache
        if cached is not None and cached.version == dt.version():
            return cached
        view = self._scan_view(dt)
        with self._lock:
            self._view_cache = view
        return view

    def _remember(
        self,
        dt: DeltaTable,
        view: _LogView,
        *,
        lease: CoordinatorLease | None = None,
        completed: tuple[int, tuple[str, str]] | None = None,
        removed: Sequence[int] = (),
        failed: int | None = None,
        failed_removed: Sequence[int] = (),
    ) -> None:
        """After a no-rebase commit made on the snapshot *view*: cache the log it produced,
        *view* plus that commit, so the next fenced step need not scan the table again. Only
        when *dt* (updated in place by delta-rs) is at exactly the next version — which our
        put-if-absent commit then wrote; anything else is left to a scan."""
        if dt.version() != view.version + 1:
            return
        gone = set(removed)
        done = {k: v for k, v in view.completed.items() if k not in gone}
        if completed is not None:
            done[completed[0]] = completed[1]
        failed_ids = (view.failed - set(failed_removed)) | (
            {failed} if failed is not None else set()
        )
        after = _LogView(
            view.version + 1,
            max(view.max_epoch, lease.epoch if lease else 0),
            max(view.next_id, lease.end_id if lease else 0),
            done,
            frozenset(failed_ids),
        )
        with self._lock:
            self._view_cache = after

    def _read_files(self, dt: DeltaTable) -> dict[str, pa.Table]:
        """The rows of each data file of *dt* (the view's columns), reading only files this
        instance has not read."""
        with self._lock:
            files = dict(self._files)
        by_file = self._tables.read_files(dt, list(_VIEW_COLUMNS), files)
        with self._lock:
            self._files = files
        return by_file

    def _scan_view(self, dt: DeltaTable) -> _LogView:
        parts = list(self._read_files(dt).values())
        t = pa.concat_tables(parts) if parts else empty_table(list(_VIEW_COLUMNS))
        leases = t.filter(pc.equal(t["record"], LogRecord.LEASE.value))
        done = t.filter(pc.equal(t["record"], LogRecord.COMPLETED.value))
        failed = t.filter(pc.equal(t["record"], LogRecord.FAILED.value))
        max_epoch = pc.max(leases["epoch"]).as_py() if leases.num_rows else 0
        next_id = pc.max(leases["id_end"]).as_py() if leases.num_rows else 1
        completed: dict[int, tuple[str, str]] = {}
        for cid, text, digest in zip(
            done["checkpoint_id"].to_pylist(),
            done["metadata"].to_pylist(),
            done["checksum"].to_pylist(),
            strict=True,
        ):
            if text is None or digest is None:
                raise CorruptCheckpointError(f"completed row of checkpoint {cid} has no metadata")
            previous = completed.setdefault(cid, (text, digest))
            if previous != (text, digest):
                raise CorruptCheckpointError(f"checkpoint {cid} was committed twice, differently")
        return _LogView(
            dt.version(),
            int(max_epoch or 0),
            int(next_id or 1),
            completed,
            frozenset(int(i) for i in failed["checkpoint_id"].to_pylist()),
        )


def _parse(view: _LogView) -> list[CompletedCheckpoint]:
    return [CompletedCheckpoint.from_json(t, d) for _, (t, d) in sorted(view.completed.items())]

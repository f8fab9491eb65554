"""The checkpoint store's contracts: the coordinator's view, the task's view, and the store.

As in Flink (``CheckpointStorageCoordinatorView`` / ``CheckpointStorageWorkerView`` /
``CompletedCheckpointStore``), each side of a job sees only what it uses:
:class:`CompletedCheckpoints` (the read side of the log and the statistics history; read by
everyone, never writes), :class:`CheckpointLog` (the coordinator view, used on the driver side
by the coordinator host, :mod:`spark_ckpt.coordination.host`: leases, the completion commit,
retention, discard), :class:`StateStorage` (the task view: writing a task's snapshot, reading
blobs back; never touches the log), :class:`WorkerStorage` (both, for the task-side runtime of
a run) and :class:`CheckpointStore` (all of it, plus :meth:`~CheckpointStore.verify` and
:meth:`~CheckpointStore.latest_restorable`, which need the log and the blobs), implemented by
:class:`~spark_ckpt.storage.memory_store.InMemoryCheckpointStore` (the reference) and
:class:`~spark_ckpt.delta.delta_store.DeltaCheckpointStore`. Contract every implementation keeps:

* **Fencing and ids.** :meth:`CheckpointLog.acquire` registers a new coordinator *epoch*; a
  superseded lease's ``commit``/``allocate_ids``/``retain``/``discard`` raise
  :class:`~spark_ckpt.errors.FencedError`. ``acquire`` and ``allocate_ids`` are *not*
  idempotent: every call reserves a fresh block. Ids strictly increase, across coordinators
  and restarts: none is handed out twice.
* **Task state** (:meth:`StateStorage.write_task_state`) is written on the task side before
  the checkpoint completes, idempotently (a task retried by Spark may write it twice).
* **Visibility.** A checkpoint is visible only after :meth:`CheckpointLog.commit` (idempotent
  per id) returned; a crash earlier leaves nothing visible and nothing that breaks a later one.
* **Integrity.** Reads verify checksums. Damage (a blob that fails its checksum or does not
  decode, a blob or data file that is gone, metadata that fails its checksum) is always
  :class:`CorruptCheckpointError` with the checkpoint's id, never damaged data; an
  unreachable store is a plain :class:`StoreError`, so an outage never makes a restore fall
  back. :meth:`CheckpointStore.latest_restorable` picks the newest checkpoint that verifies
  (every blob it references), reporting the damaged newer ones it skipped.
* **Retention** (:meth:`CheckpointLog.retain`, idempotent, as ``discard`` is) keeps the newest
  *n* checkpoints, every savepoint and every checkpoint from ``keep_from`` on (the oldest base
  a task's incremental snapshot may build on), and removes the rest with every blob no kept
  checkpoint references, never blobs newer than the latest completed checkpoint (a pending
  one's). With ``collect_garbage=False`` the blobs stay, unreferenced, until a later call
  collects them against the checkpoints kept *then* (:mod:`spark_ckpt.storage.retention`).
* **History** (:mod:`spark_ckpt.storage.history`): the statistics of finished checkpoints and
  savepoints (failures by :meth:`CheckpointLog.record_failure`), bounded by ``history_size``,
  never by retention: ``retain`` and ``discard`` first record every completed checkpoint not
  recorded yet. Writes are fenced and idempotent per id (the first record wins);
  :meth:`CompletedCheckpoints.list_history` adds the log's unrecorded completions.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

import pyarrow as pa

from spark_ckpt.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    StoreError,
)
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint, FailedCheckpoint
from spark_ckpt.protocol.state_handles import BlobRef, TaskSnapshot, TaskStateHandle
from spark_ckpt.storage.history import DEFAULT_HISTORY_SIZE, CheckpointRecord
from spark_ckpt.storage.lease import CoordinatorLease

log = logging.getLogger(__name__)


def describe_blob(ref: BlobRef) -> str:
    """Human-readable name of the blob *ref* for error messages: kind, operator uid,
    subtask, state name, key groups / channel where they apply, and the writer checkpoint."""
    where = f"{ref.kind.value} blob of operator {ref.operator_uid!r} subtask {ref.subtask} "
    where += f"state {ref.state_name!r}"
    if ref.key_group_start >= 0:
        where += f" key groups {ref.key_group_start}-{ref.key_group_end}"
    if ref.channel >= 0:
        where += f" channel {ref.channel}"
    if ref.seq:
        where += f" seq {ref.seq}"
    return f"{where} (written by checkpoint {ref.checkpoint_id})"


class CompletedCheckpoints(ABC):
    """The read side of the checkpoint log: the completed checkpoints and savepoints, as
    committed. Side-effect free; safe from either side (see the module docstring)."""

    @abstractmethod
    def list_completed_lenient(
        self,
    ) -> tuple[list[CompletedCheckpoint], list[CorruptCheckpointError]]:
        """Like :meth:`list_completed`, but a completed checkpoint whose metadata fails
        verification does not hide the others: returns the checkpoints whose metadata
        verifies (oldest first) and one :class:`CorruptCheckpointError` per damaged one
        (with its ``checkpoint_id``, oldest first). Other store errors propagate."""

    @abstractmethod
    def list_history(self) -> list[CheckpointRecord]:
        """The statistics history, by id: every record (completed, failed and aborted
        checkpoints and savepoints; the newest ``history_size`` of the last write), plus the
        completed checkpoints of the log not recorded yet (see the module docstring). Damaged
        records are skipped with a WARNING: statistics never fail a reader."""

    def completed_ids(self) -> list[int]:
        """The ids of the completed checkpoints and savepoints the store knows, ascending:
        the history's (which records each before retention may remove it) and the log's.
        What a poller counting completions reads; stores may answer without decoding the
        records."""
        return sorted({r.checkpoint_id for r in self.list_history() if r.stats is not None})

    def list_failed(self) -> list[FailedCheckpoint]:
        """The failed and aborted checkpoints of the history, by id."""
        return [r.failure for r in self.list_history() if r.failure is not None]

    def list_completed(self) -> list[CompletedCheckpoint]:
        """Every visible completed checkpoint and savepoint, oldest first. Raises
        :class:`CorruptCheckpointError` if the metadata of any of them fails verification
        (see :meth:`list_completed_lenient` to get the others anyway)."""
        good, bad = self.list_completed_lenient()
        if bad:
            raise bad[0]
        return good

    def latest_completed(self, include_savepoints: bool = True) -> CompletedCheckpoint | None:
        """The newest completed checkpoint (savepoints too unless *include_savepoints* is
        false), or ``None``."""
        cps = [c for c in self.list_completed() if include_savepoints or not c.is_savepoint]
        return cps[-1] if cps else None

    def get(self, checkpoint_id: int) -> CompletedCheckpoint:
        """The completed checkpoint *checkpoint_id*; :class:`CheckpointNotFoundError` if it
        is not (or no longer) visible."""
        for c in self.list_completed():
            if c.checkpoint_id == checkpoint_id:
                return c
        raise CheckpointNotFoundError(f"no completed checkpoint {checkpoint_id}")


class CheckpointLog(CompletedCheckpoints):
    """The coordinator view (Flink's ``CheckpointStorageCoordinatorView`` with the writing
    side of its ``CompletedCheckpointStore``): leases, the completion commit, retention.
    Every write is fenced by the lease; see the module docstring."""

    @abstractmethod
    def acquire(self) -> CoordinatorLease:
        """Register a new coordinator epoch (fencing out older ones) and reserve ids above
        every id handed out before. Not idempotent: each call is a new epoch."""

    @abstractmethod
    def allocate_ids(self, lease: CoordinatorLease) -> CoordinatorLease:
        """Reserve the next block of ids for *lease*'s epoch; returns the extended lease.
        Fenced."""

    @abstractmethod
    def commit(self, lease: CoordinatorLease, checkpoint: CompletedCheckpoint) -> None:
        """The completion commit. Idempotent per checkpoint id; fenced. Every blob the
        checkpoint references must have been written (:class:`StoreError` otherwise)."""

    @abstractmethod
    def record_failure(
        self,
        lease: CoordinatorLease,
        failed: FailedCheckpoint,
        *,
        history_size: int = DEFAULT_HISTORY_SIZE,
    ) -> None:
        """Record a failed or aborted checkpoint in the history (statistics that outlive the
        coordinator), which then keeps its newest *history_size* records. Fenced;
        idempotent per checkpoint id."""

    @abstractmethod
    def retain(
        self,
        lease: CoordinatorLease,
        retained: int,
        keep_from: int | None = None,
        *,
        collect_garbage: bool = True,
        history_size: int = DEFAULT_HISTORY_SIZE,
    ) -> list[int]:
        """Apply retention (see module docstring); returns the ids removed. First records
        the completed checkpoints not in the history yet (which then keeps its newest
        *history_size* records). Fenced; idempotent."""

    @abstractmethod
    def discard(
        self,
        lease: CoordinatorLease,
        checkpoint_ids: Iterable[int],
        *,
        history_size: int = DEFAULT_HISTORY_SIZE,
    ) -> None:
        """Remove these completed checkpoints and the blobs only they reference, after
        recording the completed checkpoints not in the history yet, as :meth:`retain` does.
        Fenced; idempotent."""


class StateStorage(ABC):
    """The task view (Flink's ``CheckpointStorageWorkerView``): a task writes its snapshot's
    blobs and reads blobs back on restore. Never reads or writes the log."""

    @abstractmethod
    def write_task_state(self, checkpoint_id: int, snapshot: TaskSnapshot) -> TaskStateHandle:
        """Write *snapshot*'s new blobs (task side, asynchronous phase); idempotent per
        (task, checkpoint). Returns the handle to acknowledge: the stored refs of the new
        blobs in snapshot order, then the reused refs."""

    @abstractmethod
    def read_blob(self, ref: BlobRef) -> pa.Table:
        """Read and verify one blob."""

    def read_blobs(self, refs: Sequence[BlobRef]) -> list[pa.Table]:
        """Read and verify many blobs, in the order of *refs*. Stores override this to read
        them in one scan."""
        return [self.read_blob(r) for r in refs]

    def describe_blob(self, ref: BlobRef) -> str:
        """How messages name the blob *ref* (see :func:`describe_blob`)."""
        return describe_blob(ref)

    @abstractmethod
    def stored_blobs(self) -> list[BlobRef]:
        """Every blob in the store, committed or not (for retention checks and tests)."""


class WorkerStorage(StateStorage, CompletedCheckpoints):
    """The task-side runtime's view: :class:`StateStorage` plus the read side of the log
    (restore from a completed checkpoint, learn which checkpoints completed)."""


class CheckpointStore(CheckpointLog, WorkerStorage):
    """Storage providing both views; adds the restore-point choice, which needs the log and
    the blobs. See the module docstring for the contract."""

    # -- verification before a restore ------------------------------------------------------
    def verify(self, checkpoint: CompletedCheckpoint) -> None:
        """Read and check every blob *checkpoint* references — operator, keyed (reused
        blobs of earlier checkpoints included), channel and sink-transaction state: each
        must be present, match its checksum and decode as Arrow IPC with the recorded row
        count. Returns normally if all do.

        Raises :class:`CorruptCheckpointError` with ``checkpoint_id`` set and a message
        naming the checkpoint, the first damaged blob (operator uid, subtask, state name,
        writer checkpoint; the store may add its own blob id) and the cause. A store that
        cannot be read for reasons other than damage raises a plain :class:`StoreError`
        (the checkpoint may well be intact).

        Reads the blobs once in bulk (one scan per table for stores that override
        :meth:`read_blobs`); only when that fails are they examined one by one to name the
        damaged one."""
        cid = checkpoint.checkpoint_id
        refs = list(dict.fromkeys(checkpoint.blobs()))
        damage = self._find_damage(refs)
        if damage is None:
            return
        ref, cause = damage
        what = "" if ref is None else f"{self.describe_blob(ref)}: "
        raise CorruptCheckpointError(
            f"checkpoint {cid} is damaged: {what}{cause}", checkpoint_id=cid
        ) from cause

    def _find_damage(self, refs: Sequence[BlobRef]) -> tuple[BlobRef | None, StoreError] | None:
        """The first of *refs* that is missing or fails verification, with the error that
        says why (the blob is ``None`` when damage was seen but cannot be attributed to one
        blob); ``None`` if all verify. Errors that are not about damage propagate.

        Default: one :meth:`read_blobs` over all of them; if it reports damage, each blob is
        read on its own to find the first damaged one."""
        try:
            self.read_blobs(refs)
            return None
        except (CorruptCheckpointError, CheckpointNotFoundError) as e:
            bulk: StoreError = e
        for ref in refs:
            try:
                self.read_blob(ref)
            except CorruptCheckpointError as e:
                return ref, e
            except CheckpointNotFoundError as e:
                missing = CorruptCheckpointError(f"the blob is missing ({e})")
                missing.__cause__ = e
                return ref, missing
        # each blob verifies alone (the store changed in between): report what the bulk
        # read saw, unattributed, rather than call the checkpoint intact
        return None, bulk

    def latest_restorable(
        self, *, include_savepoints: bool = True
    ) -> tuple[CompletedCheckpoint | None, list[CorruptCheckpointError]]:
        """The newest completed checkpoint (by id; savepoints too unless
        *include_savepoints* is false) that :meth:`verify` accepts, walking back through
        the retained ones, with the errors of the newer damaged ones it skipped (newest
        first, each with ``checkpoint_id``); ``(None, errors)`` when none verifies.

        A checkpoint whose *metadata* fails verification counts as damaged and is skipped
        like one with a damaged blob (it cannot be told whether it was a savepoint, so it
        is reported with *include_savepoints* false too). Each skipped checkpoint is logged
        as a WARNING naming its id and the reason. A :class:`StoreError` that is not
        damage (the store cannot be reached) propagates rather than making the restore
        fall back."""
        cps, bad_metadata = self.list_completed_lenient()
        candidates: list[tuple[int, CompletedCheckpoint | CorruptCheckpointError]] = [
            (c.checkpoint_id, c) for c in cps if include_savepoints or not c.is_savepoint
        ]
        candidates += [(e.checkpoint_id or 0, e) for e in bad_metadata]
        candidates.sort(key=lambda item: item[0], reverse=True)
        skipped: list[CorruptCheckpointError] = []
        for cid, item in candidates:
            if isinstance(item, CorruptCheckpointError):
                error = item
            else:
                try:
                    self.verify(item)
                except CorruptCheckpointError as e:
                    error = e
                else:
                    return item, skipped
            log.warning("skipping damaged checkpoint %d: %s", cid, error)
            skipped.append(error)
        return None, skipped

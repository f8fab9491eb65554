"""The checkpoint store: where task state is written and completed checkpoints committed.

Contract every implementation keeps (the in-memory store here is the reference; the Delta
store in :mod:`spark_ckpt.delta.store` is the durable one):

* **Fencing.** :meth:`CheckpointStore.acquire` registers a new coordinator *epoch* and
  fences out every earlier one: a superseded lease's ``commit``/``allocate_ids``/``retain``/
  ``discard`` raise :class:`~spark_ckpt.errors.FencedError`.
* **Ids.** Leases hand out checkpoint ids in blocks; an id is never handed out twice, across
  coordinators and restarts (ids strictly increase).
* **Task state** (:meth:`write_task_state`) is written before the checkpoint completes, runs on
  the task side, and is idempotent: writing the same snapshot again changes nothing.
* **Visibility.** A checkpoint is visible (``latest_completed``/``get``/``list_completed``)
  only once :meth:`commit` returned. A crash at any earlier point leaves nothing visible and
  nothing that breaks a later checkpoint. ``commit`` of an id already committed is a no-op.
* **Integrity.** Reads verify checksums and raise :class:`CorruptCheckpointError`, never
  returning damaged data. :meth:`CheckpointStore.verify` checks a whole completed checkpoint
  (every blob it references, reused ones included) before a restore, and
  :meth:`CheckpointStore.latest_restorable` picks the newest checkpoint that verifies,
  reporting the damaged newer ones it skipped. Damage — a blob that fails its checksum or
  does not decode, a blob or data file that is gone, metadata that fails its checksum — is
  always :class:`CorruptCheckpointError` carrying the checkpoint's id; a store that cannot
  be reached raises a plain :class:`StoreError` instead, so an outage never makes a restore
  fall back to an older checkpoint.
* **Retention.** :meth:`retain` keeps the newest *n* checkpoints, every savepoint and every
  checkpoint from ``keep_from`` on (the oldest base a task's incremental snapshot may still
  build on), and removes the rest, together with every blob no kept checkpoint references —
  but never blobs of checkpoints newer than the latest completed one (they may belong to a
  pending checkpoint). With ``collect_garbage=False`` it removes the checkpoints only; their
  blobs stay, unreferenced and invisible, until a later call collects them (garbage is
  always defined against the checkpoints kept *then*, so nothing is missed).
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from spark_ckpt.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    FencedError,
    StoreError,
)
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.handle import (
    BlobRef,
    TaskSnapshot,
    TaskStateHandle,
    decode_table,
    encode_table,
    make_ref,
)

log = logging.getLogger(__name__)

#: How many checkpoint ids a lease reserves at a time.
ID_BLOCK = 1000


@dataclass(frozen=True)
class CoordinatorLease:
    """The right of one coordinator *epoch* to commit, with its reserved ids
    ``[first_id, end_id)``."""

    epoch: int
    first_id: int
    end_id: int


def retention_plan(
    completed: Sequence[CompletedCheckpoint], retained: int, keep_from: int | None = None
) -> tuple[list[CompletedCheckpoint], list[CompletedCheckpoint]]:
    """Split *completed* into (kept, dropped): the newest *retained* checkpoints, all
    savepoints and every checkpoint with an id >= *keep_from* are kept."""
    if retained < 1:
        raise StoreError("at least one checkpoint must be retained")
    checkpoints = sorted(
        (c for c in completed if not c.is_savepoint), key=lambda c: c.checkpoint_id
    )
    dropped = checkpoints[:-retained] if len(checkpoints) > retained else []
    if keep_from is not None:
        dropped = [c for c in dropped if c.checkpoint_id < keep_from]
    dropped_ids = {c.checkpoint_id for c in dropped}
    kept = [c for c in completed if c.checkpoint_id not in dropped_ids]
    return sorted(kept, key=lambda c: c.checkpoint_id), dropped


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


def damaged_metadata(checkpoint_id: int, cause: CorruptCheckpointError) -> CorruptCheckpointError:
    """The error reported for a completed checkpoint whose metadata fails verification."""
    error = CorruptCheckpointError(
        f"checkpoint {checkpoint_id}: metadata is damaged: {cause}", checkpoint_id=checkpoint_id
    )
    error.__cause__ = cause
    return error


def parse_completed(
    rows: Iterable[tuple[int, tuple[str, str]]],
) -> tuple[list[CompletedCheckpoint], list[CorruptCheckpointError]]:
    """Parse and verify stored metadata rows ``(id, (json, checksum))``, oldest first: the
    checkpoints that verify, and one error (with ``checkpoint_id``) per row that does not —
    a bad checksum, malformed JSON, or a row whose JSON holds another id."""
    good: list[CompletedCheckpoint] = []
    bad: list[CorruptCheckpointError] = []
    for cid, (text, digest) in sorted(rows):
        try:
            c = CompletedCheckpoint.from_json(text, digest)
        except CorruptCheckpointError as e:
            bad.append(damaged_metadata(cid, e))
            continue
        if c.checkpoint_id != cid:
            bad.append(
                CorruptCheckpointError(
                    f"row of checkpoint {cid} holds checkpoint {c.checkpoint_id}",
                    checkpoint_id=cid,
                )
            )
            continue
        good.append(c)
    return good, bad


def garbage_blobs(stored: Iterable[BlobRef], kept: Sequence[CompletedCheckpoint]) -> list[BlobRef]:
    """Blobs among *stored* that no kept checkpoint references and that are not newer than
    the latest kept checkpoint (newer ones may belong to a pending checkpoint)."""
    referenced = {b.key for c in kept for b in c.blobs()}
    horizon = max((c.checkpoint_id for c in kept), default=0)
    return [b for b in stored if b.key not in referenced and b.checkpoint_id <= horizon]


class CheckpointStore(ABC):
    """See the module docstring for the contract."""

    @abstractmethod
    def acquire(self) -> CoordinatorLease:
        """Register a new coordinator epoch (fencing out older ones) and reserve ids above
        every id handed out before."""

    @abstractmethod
    def allocate_ids(self, lease: CoordinatorLease) -> CoordinatorLease:
        """Reserve the next block of ids for *lease*'s epoch; returns the extended lease."""

    @abstractmethod
    def write_task_state(self, checkpoint_id: int, snapshot: TaskSnapshot) -> TaskStateHandle:
        """Write *snapshot*'s new blobs (task side, asynchronous phase); idempotent."""

    @abstractmethod
    def read_blob(self, ref: BlobRef) -> pa.Table:
        """Read and verify one blob."""

    def read_blobs(self, refs: Sequence[BlobRef]) -> list[pa.Table]:
        """Read and verify many blobs, in the order of *refs*. Stores override this to read
        them in one scan."""
        return [self.read_blob(r) for r in refs]

    @abstractmethod
    def stored_blobs(self) -> list[BlobRef]:
        """Every blob in the store, committed or not (for retention checks and tests)."""

    @abstractmethod
    def commit(self, lease: CoordinatorLease, checkpoint: CompletedCheckpoint) -> None:
        """The completion commit. Idempotent per checkpoint id; fenced."""

    def list_completed(self) -> list[CompletedCheckpoint]:
        """Every visible completed checkpoint and savepoint, oldest first. Raises
        :class:`CorruptCheckpointError` if the metadata of any of them fails verification
        (see :meth:`list_completed_lenient` to get the others anyway)."""
        good, bad = self.list_completed_lenient()
        if bad:
            raise bad[0]
        return good

    @abstractmethod
    def list_completed_lenient(
        self,
    ) -> tuple[list[CompletedCheckpoint], list[CorruptCheckpointError]]:
        """Like :meth:`list_completed`, but a completed checkpoint whose metadata fails
        verification does not hide the others: returns the checkpoints whose metadata
        verifies (oldest first) and one :class:`CorruptCheckpointError` per damaged one
        (with its ``checkpoint_id``, oldest first). Other store errors propagate."""

    @abstractmethod
    def retain(
        self,
        lease: CoordinatorLease,
        retained: int,
        keep_from: int | None = None,
        *,
        collect_garbage: bool = True,
    ) -> list[int]:
        """Apply retention (see module docstring); returns the ids removed."""

    @abstractmethod
    def discard(self, lease: CoordinatorLease, checkpoint_ids: Iterable[int]) -> None:
        """Remove these completed checkpoints and the blobs only they reference."""

    def latest_completed(self, include_savepoints: bool = True) -> CompletedCheckpoint | None:
        cps = [c for c in self.list_completed() if include_savepoints or not c.is_savepoint]
        return cps[-1] if cps else None

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

    def describe_blob(self, ref: BlobRef) -> str:
        """How messages name the blob *ref* (see :func:`describe_blob`)."""
        return describe_blob(ref)

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

    def get(self, checkpoint_id: int) -> CompletedCheckpoint:
        for c in self.list_completed():
            if c.checkpoint_id == checkpoint_id:
                return c
        raise CheckpointNotFoundError(f"no completed checkpoint {checkpoint_id}")


class InMemoryCheckpointStore(CheckpointStore):
    """Volatile store for tests and simulations. Blobs are kept as Arrow IPC bytes with
    checksums, exactly as the durable store keeps them, so corruption is detected the same way."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epoch = 0
        self._next_id = 1
        self._blobs: dict[tuple[object, ...], tuple[BlobRef, bytes]] = {}
        self._completed: dict[int, tuple[str, str]] = {}  # id -> (json, checksum)

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

    def retain(
        self,
        lease: CoordinatorLease,
        retained: int,
        keep_from: int | None = None,
        *,
        collect_garbage: bool = True,
    ) -> list[int]:
        kept, dropped = retention_plan(self.list_completed(), retained, keep_from)
        with self._lock:
            self._check(lease)
            for c in dropped:
                self._completed.pop(c.checkpoint_id, None)
            if collect_garbage:
                for ref in garbage_blobs([r for r, _ in self._blobs.values()], kept):
                    self._blobs.pop(ref.key, None)
        return [c.checkpoint_id for c in dropped]

    def discard(self, lease: CoordinatorLease, checkpoint_ids: Iterable[int]) -> None:
        ids = set(checkpoint_ids)
        with self._lock:
            self._check(lease)
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

    def stored_blobs(self) -> list[BlobRef]:
        with self._lock:
            return [r for r, _ in self._blobs.values()]

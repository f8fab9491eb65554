"""The checkpoint store: where task state is written and completed checkpoints committed.

Contract every implementation keeps (the in-memory store here is the reference; the Delta
store in :mod:`spark_ckpt.delta_store` is the durable one):

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
  returning damaged data.
* **Retention.** :meth:`retain` keeps the newest *n* checkpoints, every savepoint and every
  checkpoint from ``keep_from`` on (the oldest base a task's incremental snapshot may still
  build on), and removes the rest, together with every blob no kept checkpoint references —
  but never blobs of checkpoints newer than the latest completed one (they may belong to a
  pending checkpoint). With ``collect_garbage=False`` it removes the checkpoints only; their
  blobs stay, unreferenced and invisible, until a later call collects them (garbage is
  always defined against the checkpoints kept *then*, so nothing is missed).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from .checkpoint import CompletedCheckpoint
from .errors import CheckpointNotFoundError, FencedError, StoreError
from .handle import BlobRef, TaskSnapshot, TaskStateHandle, decode_table, encode_table, make_ref

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

    @abstractmethod
    def list_completed(self) -> list[CompletedCheckpoint]:
        """Every visible completed checkpoint and savepoint, oldest first."""

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

    def list_completed(self) -> list[CompletedCheckpoint]:
        with self._lock:
            items = sorted(self._completed.items())
        return [CompletedCheckpoint.from_json(t, c) for _, (t, c) in items]

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

    def stored_blobs(self) -> list[BlobRef]:
        with self._lock:
            return [r for r, _ in self._blobs.values()]

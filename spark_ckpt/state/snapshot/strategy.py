"""The snapshot strategy of a state backend: full and incremental snapshots, and the
bookkeeping of pending and completed snapshots.

Snapshots follow Flink: :meth:`SnapshotStrategy.snapshot` is the synchronous phase — it
builds Arrow tables (which copies the state) and returns a
:class:`~spark_ckpt.protocol.state_handles.TaskSnapshot`; the store writes it later, on any thread.
Keyed state is cut into one blob per state name per snapshot, covering the subtask's
key-group range, its rows sorted by key group and carrying it (Flink's keyed-state files with
key-group offsets play the same role): a restore at another parallelism keeps the rows of the
key groups it owns. Incremental snapshots (the default) keep, per state, a chain
``[FULL, DELTA, DELTA, ...]`` (``BlobRef.seq`` 0, 1, 2, ...):

* a state unchanged since the *base* (the last checkpoint whose completion was notified, or
  the restored checkpoint) reuses the base's chain (``TaskSnapshot.reused``);
* a changed state gets a DELTA blob with exactly the keys changed since the base — their
  current value, or a tombstone (``deleted = true``) — appended to the base chain;
* when the base chain already holds
  :data:`~spark_ckpt.state.snapshot.chain_rules.MAX_CHAIN_DELTAS` deltas, or when the delta
  rows a restore would replay (the chain's deltas plus the new one) would exceed
  :data:`~spark_ckpt.state.snapshot.chain_rules.MAX_DELTA_ROWS_RATIO` times the state's
  current number of keys, the chain's deltas and the new changes are *folded* into one DELTA
  (seq 1) after the chain's FULL blob: the current value of every key changed since that
  FULL blob. Its size follows the keys changed since the FULL blob, not the state (a hot set
  of keys updated over and over folds into a delta of the hot set), so a large state with
  few changing keys never rewrites its FULL blob. Only when the folded delta would exceed
  :data:`~spark_ckpt.state.snapshot.chain_rules.MAX_DELTA_ROWS_RATIO` times the live keys,
  or when the strategy does not know what the chain's deltas hold (a chain it restored
  rather than wrote), is the chain replaced by a new FULL blob (seq 0). So a restore replays
  at most 8 deltas and at most 1.5 times the live rows. A state that became empty is dropped
  (no blob at all);
* after a restore at another parallelism there is no base chain of exactly this subtask's
  key groups, so the first snapshot is full.

``snapshot(full=True)`` (savepoints) writes only FULL blobs. The changes made before
snapshot *n* are kept until a checkpoint ``>= n`` completes; snapshots taken while earlier
ones are pending (max concurrent checkpoints > 1) and snapshots after an abort contain every
change since the base, so nothing is lost whatever the order of completions and aborts.

Cost: O(keys changed since the base), read from the change log the backend keeps per keyed
state (:class:`~spark_ckpt.state.snapshot.changes.StateChanges`), never the whole state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from spark_ckpt.errors import StateError
from spark_ckpt.protocol.state_handles import (
    BlobKind,
    BlobRef,
    StateBlob,
    TaskId,
    TaskSnapshot,
    TaskStateHandle,
)
from spark_ckpt.state.descriptor import KEYED_BLOB_KINDS, operator_blob_schema
from spark_ckpt.state.keygroup import KeyGroupRange
from spark_ckpt.state.operator_state import OperatorListState
from spark_ckpt.state.snapshot.chain_rules import (
    MAX_CHAIN_DELTAS,
    MAX_DELTA_ROWS_RATIO,
    appendable,
    checked_chain,
)
from spark_ckpt.state.snapshot.changes import (
    StateChanges,
    TrackedState,
    start_segment,
)
from spark_ckpt.state.snapshot.tables import delta_table, full_table, full_table_from_changes


def _take_changes(state: TrackedState) -> StateChanges:
    taken = state.changes
    state.changes = StateChanges()
    return taken


class ChangeHistory(Protocol):
    """What changed since a checkpoint's snapshot, as known from elsewhere than the
    strategy's own snapshots: from the changelog of a subtask on the executors, which other
    processes may have run meanwhile
    (:class:`~spark_ckpt.runtime.image_history.ImageHistory`)."""

    def since(self, checkpoint_id: int) -> Mapping[str, StateChanges] | None:
        """Per keyed state name, a superset of the changes from checkpoint
        *checkpoint_id*'s snapshot to the end of the last segment (the current segment's
        changes are on the states); None when they are not known."""
        ...


@dataclass
class _PendingSnapshot:
    """A snapshot taken but neither completed nor aborted, with the changes made between the
    previous snapshot and it, per state name."""

    checkpoint_id: int
    changes: dict[str, StateChanges]


class SnapshotStrategy:
    """Snapshots of the states of subtask *task_id*, which owns the key groups
    *key_group_range* of *max_parallelism* (see the module docstring), and what they build
    on: the base chains, the pending snapshots and their changes. It holds no state itself:
    it reads the backend's *keyed* and *operator* states (by name: the mappings the backend
    registers them into, so a state registered later is snapshotted too) and takes their
    changes. Held by the backend
    (:attr:`KeyedStateBackend.snapshots <spark_ckpt.state.backend.KeyedStateBackend.snapshots>`),
    used by the task. Same threading contract as the backend: every call comes from the
    task thread."""

    def __init__(
        self,
        task_id: TaskId,
        key_type: pa.DataType,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        keyed: Mapping[str, TrackedState],
        operator: Mapping[str, OperatorListState],
    ) -> None:
        self.task_id = task_id
        self.key_type = key_type
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self._keyed = keyed
        self._operator = operator
        self._base: dict[str, tuple[BlobRef, ...]] = {}
        self._base_id = 0
        self._last_snapshot_id = 0
        self._pending: list[_PendingSnapshot] = []
        # per state: the changes the base chain's deltas hold (the keys changed since the
        # chain's FULL blob), known only for chains this strategy wrote since that blob
        self._since_full: dict[str, StateChanges] = {}
        self._snapshotted = 0  # the last snapshot this strategy took itself
        #: distinct keys changed between the previous snapshot and the last one
        self.keys_changed = 0

    @property
    def base_checkpoint_id(self) -> int:
        """The checkpoint the next incremental snapshot builds on (0: none)."""
        return self._base_id

    @property
    def has_history(self) -> bool:
        """Whether a snapshot was taken or a base adopted (a restore needs neither)."""
        return bool(self._pending or self._base or self._last_snapshot_id)

    def pending_snapshots(self) -> list[int]:
        """Ids of snapshots neither completed nor aborted, oldest first."""
        return [p.checkpoint_id for p in self._pending]

    def snapshot(
        self,
        checkpoint_id: int,
        full: bool = False,
    ) -> TaskSnapshot:
        """Synchronous phase of checkpoint *checkpoint_id* over the keyed and operator
        states: a consistent, immutable copy (later updates do not affect it). Incremental
        unless *full*. Takes the keyed states' changes. Ids must increase from snapshot to
        snapshot."""
        if checkpoint_id <= self._last_snapshot_id:
            raise StateError(
                f"snapshot {checkpoint_id} is not newer than snapshot {self._last_snapshot_id}"
            )
        new_blobs: list[StateBlob] = []
        reused: list[BlobRef] = []
        keyed = self._keyed
        for name in sorted(keyed):
            state = keyed[name]
            changed = self._changes_since_base(name, state)
            chain = self._base.get(name, ())
            if not full and chain and not changed:
                reused.extend(chain)
                continue
            live = state.count()
            delta = None if full or not chain else self._delta(name, state, chain, changed, live)
            if delta is not None:
                new_blobs.append(delta)
                reused.extend(chain[: delta.seq])
            elif live:
                table = full_table_from_changes(
                    state, changed, live, self.key_type, self.max_parallelism
                )
                if table is None:
                    table = full_table(state, self.key_type, self.max_parallelism)
                new_blobs.append(self._blob(BlobKind.KEYED_FULL, name, table, 0))
        new_blobs += self.operator_blobs()
        changes = {n: _take_changes(s) for n, s in keyed.items() if s.changes}
        self.keys_changed = sum(c.key_count() for c in changes.values())
        self._pending.append(_PendingSnapshot(checkpoint_id, changes))
        self._last_snapshot_id = checkpoint_id
        self._snapshotted = checkpoint_id
        return TaskSnapshot(self.task_id, tuple(new_blobs), tuple(reused))

    def _delta(
        self,
        name: str,
        state: TrackedState,
        chain: tuple[BlobRef, ...],
        changed: StateChanges,
        live: int,
    ) -> StateBlob | None:
        """The DELTA blob of state *name* on its base *chain*: the *changed* keys appended to
        the chain, else the chain's deltas and *changed* folded into one delta after its FULL
        blob; None when the state needs a FULL blob (see the module docstring)."""
        if len(chain) - 1 < MAX_CHAIN_DELTAS:
            delta = delta_table(state, changed, self.key_type, self.max_parallelism)
            if appendable(chain, delta.num_rows, live):
                return self._blob(BlobKind.KEYED_DELTA, name, delta, len(chain))
        earlier = self._since_full.get(name)
        if earlier is None or len(chain) == 1:
            return None
        folded = delta_table(state, earlier.then(changed), self.key_type, self.max_parallelism)
        if folded.num_rows > MAX_DELTA_ROWS_RATIO * live:
            return None
        return self._blob(BlobKind.KEYED_DELTA, name, folded, 1)

    def full_blobs(self) -> list[StateBlob]:
        """The whole state as the blobs of a full snapshot (a FULL blob per keyed state, empty
        ones included, and an OPERATOR blob per operator state), without taking a snapshot:
        neither the changes nor the snapshot history are touched. What a subtask's image
        holds (:mod:`spark_ckpt.runtime.subtask_image`); a fresh backend loads them back with
        :func:`~spark_ckpt.state.state_restore.restore_backend`."""
        keyed = self._keyed
        blobs = [
            self._blob(
                BlobKind.KEYED_FULL,
                name,
                full_table(keyed[name], self.key_type, self.max_parallelism),
                0,
            )
            for name in sorted(keyed)
        ]
        return blobs + self.operator_blobs()

    def delta_blob(self, name: str, changes: StateChanges) -> StateBlob:
        """The DELTA blob (``seq`` 1: the caller orders a chain) of keyed state *name* for
        *changes* of it: the current value of every changed key, or its tombstone. Costs
        O(keys changed); neither the changes nor the snapshot history are touched. What a
        subtask's changelog segment holds (:mod:`spark_ckpt.runtime.image_history`)."""
        state = self._keyed[name]
        table = delta_table(state, changes, self.key_type, self.max_parallelism)
        return self._blob(BlobKind.KEYED_DELTA, name, table, 1)

    def operator_blobs(self) -> list[StateBlob]:
        """An OPERATOR blob per operator state (always whole), by name."""
        return [self._operator_blob(name, self._operator[name]) for name in sorted(self._operator)]

    def unchanged_since(self, checkpoint_id: int) -> bool:
        """Whether the states are exactly what snapshot *checkpoint_id* copied: it is the
        last snapshot this strategy took itself, and no keyed state changed since."""
        return self._snapshotted == checkpoint_id and not any(
            state.changes for state in self._keyed.values()
        )

    def can_rebase(
        self, checkpoint_id: int, refs: Sequence[BlobRef], history: ChangeHistory
    ) -> bool:
        """Whether :meth:`rebase` onto completed checkpoint *checkpoint_id*, whose blobs of
        this backend are *refs*, is possible: its keyed blobs cover exactly this subtask's
        key groups, and *history* knows what changed since its snapshot."""
        kgr = self.key_group_range
        return history.since(checkpoint_id) is not None and all(
            (r.key_group_start, r.key_group_end) == (kgr.start, kgr.end)
            for r in refs
            if r.kind in KEYED_BLOB_KINDS
        )

    def rebase(self, checkpoint_id: int, refs: Sequence[BlobRef], history: ChangeHistory) -> None:
        """Build the next snapshots on completed checkpoint *checkpoint_id*, whose blobs of
        this backend are *refs*, although this strategy did not snapshot it (another
        process ran the subtask meanwhile; subtasks on the executors): its chains become
        the base, and the changes since it are what *history* says changed since its
        snapshot, plus the keyed states' current segment. The pending snapshots are
        forgotten. StateError unless :meth:`can_rebase`."""
        since = history.since(checkpoint_id)
        if since is None or not self.can_rebase(checkpoint_id, refs, history):
            raise StateError(
                f"subtask {self.task_id}: cannot rebase onto checkpoint {checkpoint_id}: its "
                "blobs do not cover exactly this subtask's key groups, or what changed since "
                "it is not known here"
            )
        grouped: dict[str, list[BlobRef]] = {}
        for ref in refs:
            if ref.kind in KEYED_BLOB_KINDS:
                grouped.setdefault(ref.state_name, []).append(ref)
        chains = {name: checked_chain(c) for name, c in grouped.items()}
        for name, state in self._keyed.items():
            earlier = since.get(name)
            changes = state.segment if earlier is None else earlier.then(state.segment)
            state.changes = StateChanges().then(changes).compacted()  # not the segment's
        self._base = chains
        self._base_id = checkpoint_id
        self._pending = []
        # what a chain's deltas hold: nothing, or (a superset) what changed since its FULL
        # blob's snapshot, when the history tells
        self._since_full = {}
        for name, c in chains.items():
            if len(c) == 1:
                self._since_full[name] = StateChanges()
                continue
            after_full = history.since(c[0].checkpoint_id)
            if after_full is not None:
                self._since_full[name] = after_full.get(name, StateChanges())
        self._last_snapshot_id = max(self._last_snapshot_id, checkpoint_id)

    def _operator_blob(self, name: str, op: OperatorListState) -> StateBlob:
        table = pa.table(
            [pa.array(op.get(), type=op.element_type)],
            schema=operator_blob_schema(name, op.element_type),
        )
        return self._blob(BlobKind.OPERATOR, name, table, 0)

    def _blob(self, kind: BlobKind, name: str, table: pa.Table, seq: int) -> StateBlob:
        keyed = kind in KEYED_BLOB_KINDS
        return StateBlob(
            operator_uid=self.task_id.vertex,
            subtask=self.task_id.subtask,
            kind=kind,
            state_name=name,
            table=table,
            key_group_start=self.key_group_range.start if keyed else -1,
            key_group_end=self.key_group_range.end if keyed else -1,
            seq=seq,
        )

    def _changes_since_base(self, name: str, state: TrackedState) -> StateChanges:
        """Changes of state *name* since the base: pending snapshots' changes, then the
        changes since the last snapshot."""
        changes = state.changes
        for pending in reversed(self._pending):
            earlier = pending.changes.get(name)
            if earlier:
                changes = earlier.then(changes)
        return changes

    def notify_checkpoint_complete(self, checkpoint_id: int, handle: TaskStateHandle) -> None:
        """Checkpoint *checkpoint_id* completed, and *handle* is what the store wrote for this
        subtask's snapshot of it: its chains become the base of the next incremental
        snapshot, and the changes up to that snapshot are forgotten. Notifications of
        checkpoints older than the base are ignored (idempotent)."""
        if checkpoint_id <= self._base_id:
            return
        if checkpoint_id not in self.pending_snapshots():
            raise StateError(f"checkpoint {checkpoint_id} completed but was never snapshotted here")
        if handle.task != self.task_id:
            raise StateError(f"handle of {handle.task} notified to {self.task_id}")
        chains: dict[str, list[BlobRef]] = {}
        for ref in handle.blobs:
            if ref.kind in KEYED_BLOB_KINDS:
                chains.setdefault(ref.state_name, []).append(ref)
        base = {name: checked_chain(refs) for name, refs in chains.items()}
        completed = [p for p in self._pending if p.checkpoint_id <= checkpoint_id]
        self._since_full = {
            name: since
            for name, chain in base.items()
            if (since := self._since_full_after(name, chain, completed)) is not None
        }
        self._base = base
        self._base_id = checkpoint_id
        self._pending = [p for p in self._pending if p.checkpoint_id > checkpoint_id]

    def _since_full_after(
        self, name: str, chain: tuple[BlobRef, ...], completed: list[_PendingSnapshot]
    ) -> StateChanges | None:
        """What the deltas of state *name*'s new base *chain* hold, given the snapshots
        *completed* with it (None: unknown, the chain was not built on what this strategy
        tracked)."""
        if len(chain) == 1:
            return StateChanges()
        old = self._base.get(name)
        since = self._since_full.get(name)
        if since is None or not old or old[0] != chain[0]:
            return None
        for pending in completed:
            changes = pending.changes.get(name)
            if changes:
                since = since.then(changes)
        return since.bounded()

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint *checkpoint_id* was aborted: its changes go to the next snapshot (they
        stay part of every later delta until a later checkpoint completes), merged into the
        next pending snapshot's or, if none, into the keyed states' current changes.
        Unknown ids are ignored (idempotent)."""
        for i, pending in enumerate(self._pending):
            if pending.checkpoint_id != checkpoint_id:
                continue
            del self._pending[i]
            if i < len(self._pending):
                target = self._pending[i].changes
                for name, earlier in pending.changes.items():
                    later = target.get(name)
                    target[name] = earlier if later is None else earlier.then(later)
            else:
                for name, earlier in pending.changes.items():
                    state = self._keyed[name]
                    state.changes = earlier.then(state.changes)
            return

    def forget_history(self, last_snapshot_id: int) -> None:
        """Forget the base and the pending snapshots (their changes too): the next snapshot
        is full. Snapshots were taken elsewhere up to *last_snapshot_id*, so the next id must
        exceed it. For a subtask brought forward by a changelog another process wrote
        (:func:`~spark_ckpt.runtime.subtask_image.catch_up`)."""
        self._base = {}
        self._base_id = 0
        self._pending = []
        self._since_full = {}
        self._last_snapshot_id = max(self._last_snapshot_id, last_snapshot_id)

    def adopt_restored(
        self,
        checkpoint_id: int,
        base: Mapping[str, tuple[BlobRef, ...]],
    ) -> None:
        """The keyed states were just restored from checkpoint *checkpoint_id* (0: none):
        *base* (chains covering exactly this subtask's key groups, by state name) is the
        base of the next incremental snapshot, the next snapshot id must exceed
        *checkpoint_id*, and the states' changes so far are dropped."""
        self._base = dict(base)
        self._base_id = checkpoint_id
        self._last_snapshot_id = checkpoint_id
        # what a restored chain's deltas hold is not known here: a long one gets a FULL blob
        self._since_full = {name: StateChanges() for name, chain in base.items() if len(chain) == 1}
        for state in self._keyed.values():
            _take_changes(state)
        start_segment(self._keyed)

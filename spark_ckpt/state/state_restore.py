"""Restore of state backends from a completed checkpoint, at any parallelism (rescale by key
groups).

Keyed state blobs cover a key-group range and carry each row's key group
(:mod:`spark_ckpt.state.descriptor`), so a subtask restored at another parallelism reads the
chains (one FULL blob, then its DELTAs) of every old subtask whose range overlaps its own and
keeps the rows of the key groups it owns. Operator list state is concatenated in old-subtask
order and dealt round-robin (:mod:`spark_ckpt.state.operator_state`). A restored chain covering
exactly the backend's range becomes the base of its next incremental snapshot
(:mod:`spark_ckpt.state.snapshot.strategy`); after a rescale the next snapshot is full.

State schema evolution (:mod:`spark_ckpt.state.schema_evolution`). Tasks open their operators
before restoring them, and ``open`` registers the operator's descriptors, so the restore
matches the checkpoint's states against the states *registered* on the backend:

* a stored state whose registered descriptor differs is migrated blob by blob to it (a
  vectorized Arrow rewrite of the value column), or refused with StateError naming the
  operator, the state and the field; its next snapshot is full (no chain mixes types);
* a registered state with nothing stored starts empty;
* a stored state no registration claims is dropped (logged at INFO) — when the operator
  registered anything at all (its timers, which the task registers, do not count). A
  backend on which nothing is registered (an operator that registers lazily, or a restore
  for inspection/rescaling) adopts every stored state under its stored descriptor,
  *unclaimed*; a later registration claims it, migrating it then
  (:meth:`~spark_ckpt.state.backend.KeyedStateBackend.register`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from spark_ckpt.errors import CorruptCheckpointError, StateError
from spark_ckpt.protocol.state_handles import BlobKind, BlobRef
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.descriptor import (
    KEYED_BLOB_KINDS,
    META_KEY_GROUP_HASH,
    META_MAX_PARALLELISM,
    META_STATE_KIND,
    META_STATE_NAME,
    TIMER_STATES,
    StateDescriptor,
    StateKind,
    descriptor_from_column,
)
from spark_ckpt.state.keygroup import DEFAULT_MAX_PARALLELISM, HASH_NAME, key_group_indices
from spark_ckpt.state.schema_evolution import (
    Migration,
    check_key_type,
    plan_migration,
    state_label,
)
from spark_ckpt.state.snapshot.chain_rules import checked_chain

log = logging.getLogger(__name__)

#: Reads the table of a blob (a store's ``read_blob``).
BlobReader = Callable[[BlobRef], pa.Table]


def restore_backend(
    backend: KeyedStateBackend,
    refs: Sequence[BlobRef],
    read_blob: BlobReader,
    *,
    incremental_base: bool = True,
) -> None:
    """Load *backend*'s share of a completed checkpoint into it; *backend* must be fresh (no
    state entries, no snapshots taken, not restored before).

    *refs* are the blobs of the checkpoint (of any parallelism; blobs of other operators
    are ignored). Keyed state: every chain (one per state and writing subtask) whose
    key-group range overlaps the backend's is read, its FULL blob then its DELTAs in ``seq``
    order, keeping the rows of the backend's key groups. Operator state: dealt round-robin
    (needs the backend's ``parallelism``). A restored chain covering exactly the backend's
    range becomes the base of its next incremental snapshot, unless *incremental_base* is
    false (then the next snapshot is full: the first checkpoint after a restore from a
    savepoint, Flink's NO_CLAIM). Raises
    :class:`CorruptCheckpointError` for broken chains or unreadable blobs and
    :class:`StateError` for state that does not fit the backend (key type, hash,
    ``max_parallelism``, or a state whose registered descriptor is not a compatible evolution
    of the stored one; see the module docstring for schema evolution, added and removed
    states)."""
    if backend.holds_state():
        raise StateError("restore needs a fresh backend: this one already holds state")
    if backend.snapshots.has_history:
        raise StateError("restore needs a fresh backend: this one has taken snapshots")
    mine = [r for r in refs if r.operator_uid == backend.operator_uid]
    keyed_names, operator_names = backend.registered_states()
    declared = bool(set(keyed_names) - TIMER_STATES or operator_names)  # the operator's own
    dropped: set[str] = set()
    chains: dict[tuple[str, int, int, int], list[BlobRef]] = {}
    operator: dict[str, list[BlobRef]] = {}
    own = backend.key_group_range
    for ref in mine:
        if ref.kind in KEYED_BLOB_KINDS:
            if not 0 <= ref.key_group_start <= ref.key_group_end < backend.max_parallelism:
                raise StateError(
                    f"blob of key groups {ref.key_group_start}-{ref.key_group_end} does "
                    f"not fit max_parallelism {backend.max_parallelism}"
                )
            if ref.key_group_start <= own.end and ref.key_group_end >= own.start:
                key = (ref.state_name, ref.subtask, ref.key_group_start, ref.key_group_end)
                chains.setdefault(key, []).append(ref)
        elif ref.kind is BlobKind.OPERATOR:
            operator.setdefault(ref.state_name, []).append(ref)
    per_state: dict[str, list[tuple[BlobRef, ...]]] = {}
    stored_as: dict[str, list[StateDescriptor]] = {}
    for key in sorted(chains):
        chain = checked_chain(chains[key])
        if declared and key[0] not in keyed_names:
            _check_not_operator_state(backend, key[0], operator_names)
            dropped.add(key[0])
            continue
        for ref in chain:
            stored_as.setdefault(key[0], []).append(_apply_blob(backend, ref, read_blob(ref)))
        per_state.setdefault(key[0], []).append(chain)
    for name in sorted(operator):
        if declared and name not in operator_names:
            if name in keyed_names:
                raise StateError(
                    f"{state_label(name, backend.operator_uid)}: changed from operator list "
                    "state to keyed state: incompatible"
                )
            dropped.add(name)
            continue
        _restore_operator_state(backend, name, operator[name], read_blob)
    for name in sorted(dropped):
        log.info(
            "%s, subtask %d: not registered by the operator, dropped from the restored state",
            state_label(name, backend.operator_uid),
            backend.subtask,
        )
    # a state migrated to another descriptor starts a new chain (full snapshot)
    current = {d.name: d for d in backend.descriptors()}
    base = {
        name: found[0]
        for name, found in per_state.items()
        if incremental_base
        and len(found) == 1
        and (found[0][0].key_group_start, found[0][0].key_group_end) == (own.start, own.end)
        and all(d == current.get(name) for d in stored_as.get(name, ()))
    }
    backend.snapshots.adopt_restored(max((r.checkpoint_id for r in mine), default=0), base)


def apply_segment(backend: KeyedStateBackend, blobs: Sequence[tuple[BlobRef, pa.Table]]) -> None:
    """Bring a live *backend* forward by a changelog segment of the same subtask (its DELTA
    blobs, written by another process that ran the subtask since; its OPERATOR blobs, whole):
    keyed rows are upserted or dropped and recorded as changes, so the backend's next
    incremental snapshot and changelog segment hold them; operator states are replaced.
    Blobs of other operators are ignored."""
    for ref, table in blobs:
        if ref.operator_uid != backend.operator_uid:
            continue
        if ref.kind is BlobKind.KEYED_DELTA:
            stored = _apply_blob(backend, ref, table)
            backend.tables[stored.name].log_delta(table)
        elif ref.kind is BlobKind.OPERATOR:
            element_type = table.schema.field("value").type
            backend.restored_operator_state(ref.state_name, element_type).update(
                table.column("value").to_pylist()
            )
        else:
            raise StateError(f"a changelog segment holds no {ref.kind.value} blob")


def _check_not_operator_state(
    backend: KeyedStateBackend, name: str, operator_names: Sequence[str]
) -> None:
    if name in operator_names:
        raise StateError(
            f"{state_label(name, backend.operator_uid)}: changed from keyed state to "
            "operator list state: incompatible"
        )


def _apply_blob(backend: KeyedStateBackend, ref: BlobRef, table: pa.Table) -> StateDescriptor:
    """Apply one keyed blob (FULL: upsert its rows; DELTA: upsert live rows, drop deleted
    ones) restricted to *backend*'s key groups, after checking that it fits *backend*, its
    values migrated to the state's registered descriptor. Returns the descriptor the blob
    was written with."""
    name = ref.state_name
    schema = table.schema
    meta = schema.metadata or {}
    if meta.get(META_KEY_GROUP_HASH, b"").decode() != HASH_NAME:
        raise StateError(
            f"state {name!r} was partitioned with key group hash "
            f"{meta.get(META_KEY_GROUP_HASH, b'?').decode()!r}, not {HASH_NAME!r}"
        )
    if meta.get(META_MAX_PARALLELISM, b"").decode() != str(backend.max_parallelism):
        raise StateError(
            f"state {name!r} was written with max_parallelism "
            f"{meta.get(META_MAX_PARALLELISM, b'?').decode()}, this backend has "
            f"{backend.max_parallelism}"
        )
    if meta.get(META_STATE_NAME, b"").decode() != name:
        raise CorruptCheckpointError(
            f"blob referenced as state {name!r} holds state "
            f"{meta.get(META_STATE_NAME, b'?').decode()!r}"
        )
    delta = ref.kind is BlobKind.KEYED_DELTA
    names = ["key_group", "key", "value"] + (["deleted"] if delta else [])
    if schema.names != names:
        raise CorruptCheckpointError(
            f"blob {ref.kind.value} of state {name!r} has columns {schema.names}, expected {names}"
        )
    check_key_type(
        schema.field("key").type, backend.key_type, state=name, operator_uid=backend.operator_uid
    )
    try:
        kind = StateKind(meta.get(META_STATE_KIND, b"").decode())
    except ValueError as e:
        raise StateError(f"state {name!r}: unknown state kind in blob metadata") from e
    stored_desc = descriptor_from_column(name, kind, schema.field("value").type)
    state, migration = backend.restored_state(stored_desc)
    key_column = table.column("key").combine_chunks()
    kgs = key_group_indices(key_column, backend.max_parallelism).astype(np.int64)
    stored = table.column("key_group").to_numpy().astype(np.int64)
    if not np.array_equal(kgs, stored) or (
        len(kgs) and (kgs.min() < ref.key_group_start or kgs.max() > ref.key_group_end)
    ):
        raise CorruptCheckpointError(
            f"blob {ref.kind.value} of state {name!r} (checkpoint {ref.checkpoint_id}) "
            "holds keys outside the key groups it records"
        )
    own = backend.key_group_range
    inside = (kgs >= own.start) & (kgs <= own.end)
    if inside.all() and bool(np.all(kgs[1:] >= kgs[:-1])):  # all of it, in order already
        taken = table
    else:
        order = np.flatnonzero(inside)
        order = order[np.argsort(kgs[order], kind="stable")]
        kgs = kgs[order]
        taken = table.take(pa.array(order))
    deleted = taken.column("deleted").to_numpy(zero_copy_only=False) if delta else None
    state.load(
        kgs,
        taken.column("key").combine_chunks(),
        migration(taken.column("value").combine_chunks()),
        deleted,
    )
    return stored_desc


def _restore_operator_state(
    backend: KeyedStateBackend, name: str, refs: list[BlobRef], read_blob: BlobReader
) -> None:
    """Operator list state *name*: the elements of every old subtask's blob, in subtask
    order, dealt round-robin over the backend's ``parallelism``."""
    by_subtask: dict[int, BlobRef] = {}
    for ref in refs:
        other = by_subtask.setdefault(ref.subtask, ref)
        if other.key != ref.key:
            raise CorruptCheckpointError(
                f"two operator state blobs {name!r} for subtask {ref.subtask}"
            )
    if backend.parallelism is None:
        raise StateError(
            f"restoring operator state {name!r} needs the backend's parallelism "
            "(use KeyedStateBackend.for_subtask)"
        )
    columns: list[pa.ChunkedArray] = []
    for subtask in sorted(by_subtask):
        table = read_blob(by_subtask[subtask])
        meta = table.schema.metadata or {}
        if table.schema.names != ["value"] or meta.get(META_STATE_KIND) != (
            StateKind.OPERATOR_LIST.value.encode()
        ):
            raise StateError(f"blob of operator state {name!r} is not an operator list")
        columns.append(table.column("value"))
    uid = backend.operator_uid

    def migration(source: pa.DataType, target: pa.DataType) -> Migration:
        return plan_migration(source, target, state=name, operator_uid=uid, operator_state=True)

    # the registered element type, else the type every stored one migrates to
    target: pa.DataType | None = backend.operator_state_types().get(name)
    if target is None:
        for column in columns:
            if target is None or target == column.type:
                target = column.type
                continue
            try:
                migration(target, column.type)
            except StateError:
                migration(column.type, target)  # raises when neither direction works
            else:
                target = column.type
    assert target is not None
    elements: list[Any] = []
    for column in columns:
        elements.extend(migration(column.type, target)(column).to_pylist())
    state = backend.restored_operator_state(name, target)
    state.update(elements[backend.subtask :: backend.parallelism])


def restore_backends(
    operator_uid: str,
    key_type: pa.DataType,
    parallelism: int,
    refs: Sequence[BlobRef],
    read_blob: BlobReader,
    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
) -> list[KeyedStateBackend]:
    """Backends of all *parallelism* subtasks of *operator_uid*, each restored from *refs*
    (a checkpoint taken at any parallelism with the same *max_parallelism*): the rescale
    path. Subtask ``i`` of the result is element ``i``."""
    backends = [
        KeyedStateBackend.for_subtask(operator_uid, i, parallelism, key_type, max_parallelism)
        for i in range(parallelism)
    ]
    for backend in backends:
        restore_backend(backend, refs, read_blob)
    return backends

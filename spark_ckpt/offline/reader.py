"""Reading the state of a checkpoint or savepoint offline, as Arrow tables (Flink's
``SavepointReader``).

.. code-block:: python

    from spark_ckpt.offline import StateReader

    reader = StateReader.open("/lake/_ckpt/orders")        # a pipeline root or a savepoint dir
    reader.uids()                                          # ['counter']
    reader.state_names("counter")                          # ['count']
    counts = reader.keyed("counter", "count")              # pa.Table: key, value
    counts.to_pandas()                                     # pandas, polars.from_arrow(...), ...
    reader.source_offsets()                                # pa.Table: source, channel, offset
    reader.timers("counter")                               # pa.Table: key, timestamp, domain

:meth:`StateReader.keyed` returns exactly the keyed state a restore at parallelism 1 would load
(:func:`~spark_ckpt.state.state_restore.restore_backend`): every chain of the state (one FULL blob
and its DELTAs, one chain per subtask that wrote it) merged with Arrow kernels, without building a
state backend (see :mod:`spark_ckpt.offline.chains`). Every blob is verified when read (checksums,
row counts, key groups). Nothing is ever written to the store read.

Tables are Arrow: ``.to_pandas()``, ``polars.from_arrow``, ``duckdb`` and ``spark.createDataFrame``
(:func:`spark_ckpt.spark.datasource.state_frames.state_dataframe`) take them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from itertools import pairwise
from typing import Protocol

import numpy as np
import pyarrow as pa

from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.errors import CheckpointNotFoundError, CorruptCheckpointError, StateError
from spark_ckpt.offline.chains import (
    KeyedStateInfo,
    blob_info,
    merge_chain,
    sort_by_key_group,
    state_table_schema,
)
from spark_ckpt.offline.savepoint_format import MAX_PARALLELISM
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint, is_task_state_uid
from spark_ckpt.protocol.state_handles import BlobKind, BlobRef
from spark_ckpt.runtime.stage import stage_names, stage_rows
from spark_ckpt.state.descriptor import (
    KEYED_BLOB_KINDS,
    StateDescriptor,
    StateKind,
)
from spark_ckpt.state.snapshot.chain_rules import checked_chain
from spark_ckpt.state.timers import TimeDomain, timer_rows


class ReadableStore(Protocol):
    """What the reader needs of a store: its completed checkpoints and verified blob reads
    (both checkpoint stores provide it)."""

    def list_completed(self) -> list[CompletedCheckpoint]: ...

    def read_blob(self, ref: BlobRef) -> pa.Table: ...

    def read_blobs(self, refs: Sequence[BlobRef]) -> list[pa.Table]: ...


#: Schema of :meth:`StateReader.source_offsets`.
SOURCE_OFFSETS_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("channel", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
    ]
)

#: Schema of :meth:`StateReader.blobs`.
BLOBS_SCHEMA = pa.schema(
    [
        pa.field("operator_uid", pa.string()),
        pa.field("subtask", pa.int32()),
        pa.field("kind", pa.string()),
        pa.field("state_name", pa.string()),
        pa.field("key_group_start", pa.int32()),
        pa.field("key_group_end", pa.int32()),
        pa.field("channel", pa.int32()),
        pa.field("seq", pa.int32()),
        pa.field("rows", pa.int64()),
        pa.field("nbytes", pa.int64()),
        pa.field("written_by", pa.int64()),
    ]
)


def select_checkpoint(
    completed: Sequence[CompletedCheckpoint], checkpoint_id: int | None, where: str
) -> CompletedCheckpoint:
    """Checkpoint *checkpoint_id* (the newest if ``None``) among *completed*;
    :class:`CheckpointNotFoundError` naming *where* if there is none."""
    if not completed:
        raise CheckpointNotFoundError(f"no completed checkpoint or savepoint in {where}")
    if checkpoint_id is None:
        return max(completed, key=lambda c: c.checkpoint_id)
    for c in completed:
        if c.checkpoint_id == checkpoint_id:
            return c
    ids = sorted(c.checkpoint_id for c in completed)
    raise CheckpointNotFoundError(
        f"no completed checkpoint {checkpoint_id} in {where} (completed: {ids})"
    )


class StateReader:
    """The state of one completed checkpoint or savepoint *checkpoint*, read from *store*.
    Open one with :meth:`open` (a path) or :meth:`from_store` (a store object); see the module
    docstring. *location* names the store in messages."""

    def __init__(
        self, store: ReadableStore, checkpoint: CompletedCheckpoint, *, location: str = "store"
    ) -> None:
        self.store = store
        self.checkpoint = checkpoint
        self.location = location
        refs = list(dict.fromkeys(checkpoint.blobs()))
        self._keyed: dict[tuple[str, str], list[BlobRef]] = {}
        self._operator: dict[tuple[str, str], list[BlobRef]] = {}
        self._channel: dict[str, list[BlobRef]] = {}
        self._uids: set[str] = set()
        for ref in refs:
            self._uids.add(ref.operator_uid)
            if ref.kind in KEYED_BLOB_KINDS:
                self._keyed.setdefault((ref.operator_uid, ref.state_name), []).append(ref)
            elif ref.kind is BlobKind.OPERATOR:
                self._operator.setdefault((ref.operator_uid, ref.state_name), []).append(ref)
            else:
                self._channel.setdefault(ref.operator_uid, []).append(ref)
        self._infos: dict[tuple[str, str], KeyedStateInfo] = {}

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str,
        checkpoint_id: int | None = None,
        *,
        storage_options: dict[str, str] | None = None,
    ) -> StateReader:
        """The reader of checkpoint *checkpoint_id* (default: the latest completed one,
        savepoints included) of the store at *path*: a pipeline root or a savepoint
        directory. :class:`~spark_ckpt.errors.CheckpointNotFoundError` (naming *path*) if
        *path* holds no store or no such checkpoint."""
        where = f"checkpoint store {path}"
        if "://" not in str(path) and not os.path.isdir(path):
            raise CheckpointNotFoundError(f"no {where}: the directory does not exist")
        store = DeltaCheckpointStore(str(path), storage_options=storage_options)
        checkpoint = select_checkpoint(store.list_completed(), checkpoint_id, where)
        return cls(store, checkpoint, location=str(path))

    @classmethod
    def from_store(
        cls, store: ReadableStore, checkpoint_id: int | None = None, *, location: str = "store"
    ) -> StateReader:
        """The reader of checkpoint *checkpoint_id* (default: the latest) of *store* (any
        checkpoint store, the in-memory one included)."""
        checkpoint = select_checkpoint(store.list_completed(), checkpoint_id, location)
        return cls(store, checkpoint, location=location)

    # -- what the checkpoint is ------------------------------------------------------------
    @property
    def checkpoint_id(self) -> int:
        return self.checkpoint.checkpoint_id

    @property
    def snapshot_type(self) -> SnapshotType:
        return self.checkpoint.snapshot_type

    @property
    def is_savepoint(self) -> bool:
        return self.checkpoint.is_savepoint

    @property
    def properties(self) -> dict[str, str]:
        """The checkpoint's properties (for savepoints: ``pipeline``, ``max_parallelism``,
        ``format``)."""
        return dict(self.checkpoint.properties)

    @cached_property
    def max_parallelism(self) -> int | None:
        """The number of key groups of the keyed state: the ``max_parallelism`` property when
        set, else what the keyed blobs record (``None``: no keyed state and no property)."""
        prop = self.checkpoint.properties.get(MAX_PARALLELISM)
        if prop:
            return int(prop)
        for uid, name in sorted(self._keyed):
            return self.keyed_info(uid, name).max_parallelism
        return None

    # -- what state there is ---------------------------------------------------------------
    def uids(self, *, internal: bool = False) -> list[str]:
        """Every operator uid with state (keyed or operator state), sorted. With *internal*,
        also the uids of the tasks' own state (channel state, the sink's transactions:
        ``_task:<vertex>``), which belongs to the pipeline's task vertex, not to an
        operator."""
        return sorted(u for u in self._uids if internal or not is_task_state_uid(u))

    def stages(self) -> list[dict[str, object]]:
        """Per keyed stage of the job (:mod:`spark_ckpt.runtime.stage`; a job of one stage has
        one), in order: its ``stage`` name, ``vertex``, ``subtasks`` that acknowledged the
        checkpoint, ``state_bytes``, and the uids of the ``operators`` whose state its
        subtasks wrote."""
        tasks = self.checkpoint.tasks
        rows = stage_rows(
            [(t.task.vertex, t.task.subtask, t.state_bytes()) for t in tasks],
            stage_names(self.checkpoint.properties),
        )
        for row in rows:
            row["operators"] = sorted(
                {
                    b.operator_uid
                    for t in tasks
                    if t.task.vertex == row["vertex"]
                    for b in t.blobs
                    if not is_task_state_uid(b.operator_uid)
                }
            )
        return rows

    def _check_uid(self, uid: str) -> None:
        if uid not in self._uids:
            raise StateError(
                f"{self._what()} has no state of operator uid {uid!r} (operators with state: "
                f"{', '.join(map(repr, self.uids())) or 'none'})"
            )

    def _what(self) -> str:
        kind = "savepoint" if self.is_savepoint else "checkpoint"
        return f"{kind} {self.checkpoint_id} of {self.location}"

    def keyed_state_names(self, uid: str) -> list[str]:
        self._check_uid(uid)
        return sorted(n for u, n in self._keyed if u == uid)

    def operator_state_names(self, uid: str) -> list[str]:
        self._check_uid(uid)
        return sorted(n for u, n in self._operator if u == uid)

    def state_names(self, uid: str) -> list[str]:
        """Names of the keyed and operator states of *uid*, sorted."""
        return sorted({*self.keyed_state_names(uid), *self.operator_state_names(uid)})

    def state_kind(self, uid: str, state_name: str) -> StateKind:
        """``value``, ``list`` or ``map`` for keyed state, ``operator_list`` for operator
        state."""
        if (uid, state_name) in self._keyed:
            return self.keyed_info(uid, state_name).descriptor.kind
        if (uid, state_name) in self._operator:
            return StateKind.OPERATOR_LIST
        raise self._no_state(uid, state_name)

    def _no_state(self, uid: str, state_name: str) -> StateError:
        self._check_uid(uid)
        return StateError(
            f"{self._what()} has no state {state_name!r} of operator {uid!r} "
            f"(states: {self.state_names(uid)})"
        )

    def keyed_info(self, uid: str, state_name: str) -> KeyedStateInfo:
        """Descriptor, key type and max parallelism of keyed state *state_name* of *uid*,
        from its blobs."""
        info = self._infos.get((uid, state_name))
        if info is None:
            refs = self._keyed.get((uid, state_name))
            if not refs:
                raise self._no_state(uid, state_name)
            full = min(refs, key=lambda r: (r.seq, r.subtask))
            info = blob_info(full, self.store.read_blob(full))
            self._infos[(uid, state_name)] = info
        return info

    def descriptor(self, uid: str, state_name: str) -> StateDescriptor:
        return self.keyed_info(uid, state_name).descriptor

    def key_type(self, uid: str) -> pa.DataType | None:
        """The key type of *uid*'s keyed state (``None`` if it has none)."""
        names = self.keyed_state_names(uid)
        return self.keyed_info(uid, names[0]).key_type if names else None

    def parallelism(self, uid: str) -> int:
        """How many subtasks of *uid* wrote state (keyed chains, else operator blobs)."""
        self._check_uid(uid)
        keyed = {r.subtask for (u, _), refs in self._keyed.items() if u == uid for r in refs}
        if keyed:
            return len(keyed)
        other = {r.subtask for (u, _), refs in self._operator.items() if u == uid for r in refs}
        return max(1, len(other))

    def chains(self, uid: str, state_name: str) -> list[tuple[BlobRef, ...]]:
        """The chains of keyed state *state_name* of *uid* (FULL blob, then DELTAs), by key
        group range. :class:`CorruptCheckpointError` if chains are broken or overlap."""
        refs = self._keyed.get((uid, state_name))
        if not refs:
            raise self._no_state(uid, state_name)
        grouped: dict[tuple[int, int, int], list[BlobRef]] = {}
        for ref in refs:
            grouped.setdefault((ref.key_group_start, ref.key_group_end, ref.subtask), []).append(
                ref
            )
        chains = [checked_chain(grouped[k]) for k in sorted(grouped)]
        for a, b in pairwise(chains):
            if b[0].key_group_start <= a[0].key_group_end:
                raise CorruptCheckpointError(
                    f"state {state_name!r} of operator {uid!r}: chains of subtasks "
                    f"{a[0].subtask} and {b[0].subtask} cover overlapping key groups",
                    checkpoint_id=self.checkpoint_id,
                )
        return chains

    def key_group_ranges(self, uid: str, state_name: str) -> list[tuple[int, int]]:
        """The key-group ranges (inclusive) of the chains of keyed state *state_name*."""
        return [(c[0].key_group_start, c[0].key_group_end) for c in self.chains(uid, state_name)]

    # -- the state -------------------------------------------------------------------------
    def keyed(
        self,
        uid: str,
        state_name: str,
        *,
        key_group_range: tuple[int, int] | None = None,
        with_key_group: bool = False,
    ) -> pa.Table:
        """Keyed state *state_name* of *uid* as a table of ``key`` and ``value`` (the value
        of value state, a ``list`` for list state, a ``map`` for map state), sorted by key
        group then key; the schema metadata describes the state (kind, types, max
        parallelism), so the table can be handed back to
        :meth:`~spark_ckpt.offline.SavepointWriter.with_keyed_state`. Exactly what a restore
        at parallelism 1 would load. *key_group_range* (inclusive): only those key groups;
        *with_key_group*: a leading ``key_group`` column."""
        chains = self.chains(uid, state_name)
        info = self.keyed_info(uid, state_name)
        if key_group_range is not None:
            lo, hi = key_group_range
            chains = [c for c in chains if c[0].key_group_start <= hi and c[0].key_group_end >= lo]
        refs = [r for c in chains for r in c]
        tables = iter(self.store.read_blobs(refs))
        parts = [
            merge_chain(chain, [next(tables) for _ in chain], info, key_group_range)
            for chain in chains
        ]
        schema = state_table_schema(info, with_key_group=True)
        if parts:
            merged = sort_by_key_group(pa.concat_tables(parts).combine_chunks())
            table = pa.Table.from_arrays(merged.columns, schema=schema)
        else:
            table = schema.empty_table()
        return table if with_key_group else table.drop_columns(["key_group"])

    def timers(self, uid: str) -> pa.Table:
        """The timers of operator *uid* (:mod:`spark_ckpt.state.timers`): columns ``key``,
        ``timestamp`` (ms since the epoch) and ``domain`` (``event`` or ``processing``),
        ordered by domain, then timestamp and key; empty when it has none. They are the
        keyed states ``_event_timers`` and ``_processing_timers``, which :meth:`keyed`
        reads too (per key, a list of timestamps)."""
        names = set(self.keyed_state_names(uid))
        return timer_rows(
            {d: self.keyed(uid, d.state_name) for d in TimeDomain if d.state_name in names}
        )

    def operator_state(self, uid: str, state_name: str) -> pa.Table:
        """Operator list state *state_name* of *uid*: columns ``subtask`` and ``value``, the
        elements of every subtask in subtask order (what a restore at parallelism 1 holds,
        in the ``value`` column). Task-internal operator state (``_task:`` uids, such as the
        sink's ``_sink_transactions``) has its own columns, after ``subtask``."""
        refs = self._operator.get((uid, state_name))
        if not refs:
            if (uid, state_name) in self._keyed:
                raise StateError(
                    f"state {state_name!r} of operator {uid!r} is keyed state: read it with keyed()"
                )
            raise self._no_state(uid, state_name)
        refs = sorted(refs, key=lambda r: r.subtask)
        if len({r.subtask for r in refs}) != len(refs):
            raise CorruptCheckpointError(
                f"two operator state blobs {state_name!r} of one subtask of {uid!r}",
                checkpoint_id=self.checkpoint_id,
            )
        tables = self.store.read_blobs(refs)
        parts: list[pa.Table] = []
        first = tables[0].schema.remove_metadata()
        for ref, table in zip(refs, tables, strict=True):
            if table.schema.remove_metadata() != first:
                raise StateError(
                    f"operator state {state_name!r} of {uid!r}: subtask {ref.subtask} holds "
                    f"{table.schema.remove_metadata()}, subtask {refs[0].subtask} {first}"
                )
            subtask = pa.array(np.full(table.num_rows, ref.subtask, dtype=np.int32))
            column = pa.field("subtask", pa.int32(), nullable=False)
            parts.append(table.add_column(0, column, subtask))
        return pa.concat_tables(parts).combine_chunks()

    def channel_blobs(self, uid: str) -> list[BlobRef]:
        """The channel-state blobs (in-flight records of unaligned checkpoints) of *uid*."""
        return list(self._channel.get(uid, ()))

    def operator_blobs(self, uid: str) -> list[BlobRef]:
        """The operator-state blobs of *uid*."""
        return [r for (u, _), refs in sorted(self._operator.items()) if u == uid for r in refs]

    def source_offsets(self) -> pa.Table:
        """Where each source channel resumes: columns ``source``, ``channel``, ``offset``."""
        offsets = self.checkpoint.source_offsets()
        return pa.table(
            [
                pa.array([o.source for o in offsets], pa.string()),
                pa.array([o.channel for o in offsets], pa.int32()),
                pa.array([o.offset for o in offsets], pa.int64()),
            ],
            schema=SOURCE_OFFSETS_SCHEMA,
        )

    def blobs(self) -> pa.Table:
        """One row per blob the checkpoint references (what is stored, not its contents)."""
        refs = list(dict.fromkeys(self.checkpoint.blobs()))
        columns = {
            "operator_uid": [r.operator_uid for r in refs],
            "subtask": [r.subtask for r in refs],
            "kind": [r.kind.value for r in refs],
            "state_name": [r.state_name for r in refs],
            "key_group_start": [r.key_group_start for r in refs],
            "key_group_end": [r.key_group_end for r in refs],
            "channel": [r.channel for r in refs],
            "seq": [r.seq for r in refs],
            "rows": [r.rows for r in refs],
            "nbytes": [r.nbytes for r in refs],
            "written_by": [r.checkpoint_id for r in refs],
        }
        return pa.table(columns, schema=BLOBS_SCHEMA)

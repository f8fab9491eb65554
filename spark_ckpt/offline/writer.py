"""Writing savepoints offline: bootstrap state from tables, or transform an existing
checkpoint or savepoint (Flink's ``SavepointWriter``).

.. code-block:: python

from spark_ckpt.offline import SavepointWriter

    # bootstrap: a savepoint from a table of keys and values
    SavepointWriter.new("orders", max_parallelism=128, parallelism=2) \\
        .with_keyed_state("counter", "count", pa.table({"key": [1, 2], "value": [10, 20]})) \\
        .write("/lake/savepoints/bootstrap")

    # transform: drop, rename, edit, re-key into another max parallelism
    SavepointWriter.from_existing("/lake/_ckpt/orders") \\
        .remove_operator("old-uid") \\
        .rename_operator("counter", "counter-v2") \\
        .map_values("counter-v2", "count", lambda t: t.filter(pc.greater(t["value"], 0))) \\
        .with_max_parallelism(256) \\
        .write("/lake/savepoints/migrated")

The operations change the writer (and return it, for chaining); nothing is read from or
written to the source until :meth:`SavepointWriter.write`, which writes a new savepoint
directory (:mod:`spark_ckpt.offline.savepoint_format`) and never modifies the source. Keyed
state is written as FULL blobs, one per state per subtask, or per slice of whole key groups
where a subtask's share is large (:func:`~spark_ckpt.offline.chains.full_blobs`), its key
groups computed with the project's key-group hash (:mod:`spark_ckpt.state.keygroup`) for the
writer's max parallelism;
operator list state and channel state are carried over as they are; source positions are
kept unless replaced (:meth:`SavepointWriter.with_source_offsets`; none: every source starts
from its beginning).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import pyarrow as pa

from spark_ckpt.errors import ConfigError, StateError, StoreError
from spark_ckpt.offline.chains import full_blobs, normalize_state_table
from spark_ckpt.offline.reader import ReadableStore, StateReader
from spark_ckpt.offline.savepoint_format import (
    FORMAT,
    FORMAT_VERSION,
    MAX_PARALLELISM,
    PIPELINE,
    write_savepoint,
)
from spark_ckpt.protocol.checkpoint import TASK_STATE_PREFIX, CompletedCheckpoint, is_task_state_uid
from spark_ckpt.protocol.state_handles import (
    BlobKind,
    BlobRef,
    SourceOffset,
    StateBlob,
    TaskId,
    TaskSnapshot,
)
from spark_ckpt.state.descriptor import (
    META_STATE_KIND,
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    StateKind,
    ValueStateDescriptor,
    descriptor_from_column,
    operator_blob_schema,
)
from spark_ckpt.state.keygroup import (
    DEFAULT_MAX_PARALLELISM,
    check_max_parallelism,
    check_parallelism,
)
from spark_ckpt.state.timers import TimeDomain, timer_states

#: What :meth:`SavepointWriter.with_keyed_state` takes as the state's kind.
KindLike: TypeAlias = "StateDescriptor | StateKind | str | None"
#: What :meth:`SavepointWriter.with_source_offsets` takes.
OffsetsLike: TypeAlias = "pa.Table | Mapping[tuple[str, int], int] | Iterable[SourceOffset] | None"


def as_table(data: Any, what: str) -> pa.Table:
    """*data* (an Arrow table or record batch, a pandas DataFrame, a dict of columns) as an
    Arrow table."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, dict):
        return pa.table(data)
    import pandas as pd

    if isinstance(data, pd.DataFrame):
        return pa.Table.from_pandas(data, preserve_index=False)
    raise StateError(f"{what}: expected an Arrow table or a pandas DataFrame, got {type(data)}")


@dataclass
class _KeyedState:
    """One keyed state: its descriptor, and its table (loaded on first use)."""

    descriptor: StateDescriptor
    load: Callable[[], pa.Table]
    _table: pa.Table | None = None

    def table(self) -> pa.Table:
        if self._table is None:
            self._table = self.load()
        return self._table


@dataclass(frozen=True)
class _CarriedBlob:
    """A non-keyed blob carried over from the source (operator or channel state), read when
    the savepoint is written."""

    ref: BlobRef
    store: ReadableStore


@dataclass(frozen=True)
class _NewOperatorState:
    """Operator list state bootstrapped from values: one blob of subtask 0 (a restore deals
    the elements round-robin over the subtasks)."""

    name: str
    table: pa.Table


@dataclass
class _Operator:
    """The state of one operator uid in the savepoint being built."""

    vertex: str
    parallelism: int
    key_type: pa.DataType | None = None
    keyed: dict[str, _KeyedState] = field(default_factory=dict)
    carried: list[_CarriedBlob] = field(default_factory=list)
    new_operator_state: dict[str, _NewOperatorState] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not (self.keyed or self.carried or self.new_operator_state)


def _vertex_of(uid: str) -> str:
    return uid[len(TASK_STATE_PREFIX) :] if uid.startswith(TASK_STATE_PREFIX) else uid


class SavepointWriter:
    """Builds a savepoint of pipeline *pipeline* (see the module docstring). Start with
    :meth:`new` (empty, to bootstrap state) or :meth:`from_existing` (a checkpoint or
    savepoint); every operation returns the writer itself."""

    def __init__(
        self,
        pipeline: str | None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        parallelism: int = 1,
        *,
        checkpoint_id: int = 1,
    ) -> None:
        check_parallelism(max_parallelism, parallelism)
        self.pipeline = pipeline
        self.max_parallelism = max_parallelism
        self.default_parallelism = parallelism
        self.checkpoint_id = checkpoint_id
        self._operators: dict[str, _Operator] = {}
        self._offsets: dict[tuple[str, int], int] = {}
        self._properties: dict[str, str] = {}

    # -- starting points -------------------------------------------------------------------
    @classmethod
    def new(
        cls, pipeline: str, max_parallelism: int = DEFAULT_MAX_PARALLELISM, parallelism: int = 1
    ) -> SavepointWriter:
        """An empty savepoint of *pipeline*: no state, no source positions (every source
        starts from its beginning). *parallelism*: of the operators added to it."""
        if not pipeline:
            raise ConfigError("pipeline", pipeline, "a non-empty pipeline name")
        return cls(pipeline, max_parallelism, parallelism)

    @classmethod
    def from_existing(
        cls,
        source: str | StateReader,
        checkpoint_id: int | None = None,
        *,
        pipeline: str | None = None,
    ) -> SavepointWriter:
        """A savepoint starting as checkpoint *checkpoint_id* (default: the latest) of
        *source* — a pipeline root, a savepoint directory or a :class:`StateReader` — with
        all its state and source positions, at the parallelism each operator had. *pipeline*:
        default the source's ``pipeline`` property (required by :meth:`write` if the source
        does not record it). The source is only read, when :meth:`write` runs."""
        reader = (
            source if isinstance(source, StateReader) else StateReader.open(source, checkpoint_id)
        )
        name = pipeline or reader.properties.get(PIPELINE)
        max_p = reader.max_parallelism or DEFAULT_MAX_PARALLELISM
        writer = cls(name, max_p, 1, checkpoint_id=reader.checkpoint_id)
        vertices: dict[str, str] = {}
        for task in reader.checkpoint.tasks:
            for ref in task.blobs:
                vertices.setdefault(ref.operator_uid, task.task.vertex)
        for uid in reader.uids(internal=True):
            op = _Operator(vertices.get(uid, _vertex_of(uid)), reader.parallelism(uid))
            op.key_type = reader.key_type(uid)
            for name_ in reader.keyed_state_names(uid):
                op.keyed[name_] = _KeyedState(
                    reader.descriptor(uid, name_), _reader_loader(reader, uid, name_)
                )
            op.carried = [
                _CarriedBlob(ref, reader.store)
                for ref in [*reader.operator_blobs(uid), *reader.channel_blobs(uid)]
            ]
            writer._operators[uid] = op
        writer._offsets = dict(reader.checkpoint.offsets())
        return writer

    # -- inspection ------------------------------------------------------------------------
    def uids(self) -> list[str]:
        """The operator uids the savepoint will hold state of, sorted (not the tasks' own
        state, which belongs to no operator)."""
        return sorted(u for u in self._operators if not is_task_state_uid(u))

    def keyed_state_names(self, uid: str) -> list[str]:
        return sorted(self._operator(uid).keyed)

    def keyed_state(self, uid: str, state_name: str) -> pa.Table:
        """The current table (``key``, ``value``) of keyed state *state_name* of *uid*."""
        return self._keyed(uid, state_name).table()

    def source_offsets(self) -> dict[tuple[str, int], int]:
        return dict(self._offsets)

    def _operator(self, uid: str) -> _Operator:
        op = self._operators.get(uid)
        if op is None:
            raise StateError(
                f"the savepoint has no operator uid {uid!r} (operators with state: "
                f"{', '.join(map(repr, self.uids())) or 'none'})"
            )
        return op

    def _keyed(self, uid: str, state_name: str) -> _KeyedState:
        op = self._operator(uid)
        state = op.keyed.get(state_name)
        if state is None:
            raise StateError(
                f"operator {uid!r} has no keyed state {state_name!r} (states: {sorted(op.keyed)})"
            )
        return state

    # -- operations ------------------------------------------------------------------------
    def with_keyed_state(
        self,
        uid: str,
        state_name: str,
        table: Any,
        kind: KindLike = None,
        *,
        key_type: pa.DataType | None = None,
        parallelism: int | None = None,
    ) -> SavepointWriter:
        """Set keyed state *state_name* of operator *uid* (created if new, at *parallelism*,
        default the writer's) to *table*: columns ``key`` and ``value`` (an Arrow table, a
        pandas DataFrame or a dict of columns; a ``key_group`` column is ignored — key
        groups are computed). Replaces the state if it exists.

        *kind*: a state descriptor, or ``"value"``/``"list"``/``"map"`` (the value column's
        type then fixes the descriptor); default the kind recorded in *table*'s schema
        metadata (tables from :meth:`StateReader.keyed` carry it), else value state.
        *key_type*: default the operator's key type if it has keyed state, else the type of
        the ``key`` column; every keyed state of an operator has the same key type. Rows with
        a null value (or an empty list or map) hold no state and are dropped; keys must be
        unique and not null (:class:`StateError`)."""
        data = as_table(table, f"state {state_name!r} of operator {uid!r}")
        if "value" not in data.column_names or "key" not in data.column_names:
            raise StateError(
                f"state {state_name!r} of operator {uid!r}: expected columns 'key' and "
                f"'value', got {data.column_names}"
            )
        descriptor = _descriptor(state_name, kind, data)
        op = self._operators.get(uid)
        if parallelism is not None:
            check_parallelism(self.max_parallelism, parallelism)
        others = set(op.keyed) - {state_name} if op is not None else set()
        if op is not None and op.key_type is not None and others:
            if key_type is not None and key_type != op.key_type:
                raise StateError(
                    f"operator {uid!r} has keys of type {op.key_type}, not {key_type}: every "
                    "keyed state of an operator has the same key type"
                )
            resolved = op.key_type
        else:
            resolved = key_type or data.schema.field("key").type
        normalized = normalize_state_table(
            data, descriptor, resolved, f"state {state_name!r} of operator {uid!r}"
        )
        if op is None:
            op = self._operators[uid] = _Operator(
                _vertex_of(uid), parallelism or self.default_parallelism
            )
        elif parallelism is not None:
            op.parallelism = parallelism
        op.key_type = resolved
        op.keyed[state_name] = _KeyedState(descriptor, lambda: normalized, normalized)
        return self

    def with_timers(
        self, uid: str, table: Any, *, key_type: pa.DataType | None = None
    ) -> SavepointWriter:
        """Set the timers of operator *uid* to *table* (an Arrow table, a pandas DataFrame or
        a dict of columns): ``key``, ``timestamp`` (ms since the epoch, or an Arrow
        timestamp) and ``domain`` (``event`` or ``processing``), as
        :meth:`StateReader.timers` returns them; a timer listed twice is kept once. Replaces
        the operator's timers of both domains (an empty table removes them). The job's
        operator must handle timers (``on_timers``) in a pipeline that keeps time for them
        to fire after the restore. *key_type*: as :meth:`with_keyed_state`."""
        rows = as_table(table, f"the timers of operator {uid!r}")
        states = timer_states(rows)
        op = self._operators.get(uid)
        for domain in TimeDomain:
            state = states.get(domain)
            if state is not None:
                self.with_keyed_state(
                    uid, domain.state_name, state, domain.descriptor, key_type=key_type
                )
            elif op is not None and domain.state_name in op.keyed:
                self.remove_state(uid, domain.state_name)
        return self

    def map_values(
        self, uid: str, state_name: str, fn: Callable[[pa.Table], Any]
    ) -> SavepointWriter:
        """Replace keyed state *state_name* of *uid* by ``fn(table)``: *fn* gets the current
        table (``key``, ``value``) and returns the new one (rows may be dropped or added,
        values changed; a changed value type changes the state's descriptor, its kind is
        kept)."""
        state = self._keyed(uid, state_name)
        op = self._operators[uid]
        result = as_table(fn(state.table()), f"map_values of state {state_name!r}")
        if "value" not in result.column_names:
            raise StateError(f"map_values of state {state_name!r}: the result has no 'value'")
        descriptor = state.descriptor
        if result.schema.field("value").type != descriptor.column_type:
            descriptor = descriptor_from_column(
                state_name, descriptor.kind, result.schema.field("value").type
            )
        assert op.key_type is not None
        normalized = normalize_state_table(
            result, descriptor, op.key_type, f"map_values of state {state_name!r} of {uid!r}"
        )
        op.keyed[state_name] = _KeyedState(descriptor, lambda: normalized, normalized)
        return self

    def with_operator_state(
        self,
        uid: str,
        state_name: str,
        values: Any,
        element_type: pa.DataType | None = None,
    ) -> SavepointWriter:
        """Set operator list state *state_name* of *uid* (created if new) to *values* (a
        sequence or an Arrow array of non-null elements of *element_type*, default the
        array's type); a restore deals them round-robin over the subtasks. Replaces the
        state if it exists."""
        try:
            arr = values if isinstance(values, pa.Array) else pa.array(values, element_type)
            if element_type is not None and arr.type != element_type:
                arr = arr.cast(element_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise StateError(f"operator state {state_name!r}: {e}") from e
        if arr.null_count:
            raise StateError(f"operator state {state_name!r}: null elements are not allowed")
        op = self._operators.get(uid)
        if op is None:
            op = self._operators[uid] = _Operator(_vertex_of(uid), self.default_parallelism)
        if state_name in op.keyed:
            raise StateError(f"state {state_name!r} of operator {uid!r} is keyed state")
        op.carried = [
            c
            for c in op.carried
            if not (c.ref.kind is BlobKind.OPERATOR and c.ref.state_name == state_name)
        ]
        table = pa.table([arr], schema=operator_blob_schema(state_name, arr.type))
        op.new_operator_state[state_name] = _NewOperatorState(state_name, table)
        return self

    def remove_state(self, uid: str, state_name: str) -> SavepointWriter:
        """Drop state *state_name* (keyed or operator state) of *uid*."""
        op = self._operator(uid)
        carried = [
            c
            for c in op.carried
            if not (c.ref.kind is BlobKind.OPERATOR and c.ref.state_name == state_name)
        ]
        found = (
            state_name in op.keyed
            or state_name in op.new_operator_state
            or len(carried) != len(op.carried)
        )
        if not found:
            raise StateError(f"operator {uid!r} has no state {state_name!r}")
        op.keyed.pop(state_name, None)
        op.new_operator_state.pop(state_name, None)
        op.carried = carried
        if not op.keyed:
            op.key_type = None
        if op.is_empty():
            del self._operators[uid]
        return self

    def remove_operator(self, uid: str) -> SavepointWriter:
        """Drop all state of operator *uid* (keyed, operator and channel state)."""
        self._operator(uid)
        del self._operators[uid]
        return self

    def rename_operator(self, old_uid: str, new_uid: str) -> SavepointWriter:
        """Move all state of operator *old_uid* to *new_uid* (which must hold none). Versions
        before 0.2 named the task vertex after the first operator of the chain: the tasks'
        own state of a vertex named *old_uid* (``_task:<old_uid>``) moves to
        ``_task:<new_uid>`` too (a restore finds it under any vertex name)."""
        task_old, task_new = TASK_STATE_PREFIX + old_uid, TASK_STATE_PREFIX + new_uid
        if (
            not old_uid.startswith(TASK_STATE_PREFIX)
            and task_old in self._operators
            and task_new not in self._operators
        ):
            self.rename_operator(task_old, task_new)
        op = self._operator(old_uid)
        if not new_uid:
            raise ConfigError("new_uid", new_uid, "a non-empty operator uid")
        if new_uid in self._operators and new_uid != old_uid:
            raise StateError(f"operator uid {new_uid!r} already holds state")
        del self._operators[old_uid]
        if op.vertex == _vertex_of(old_uid):
            op.vertex = _vertex_of(new_uid)
        self._operators[new_uid] = op
        return self

    def with_max_parallelism(self, max_parallelism: int) -> SavepointWriter:
        """Write the keyed state into *max_parallelism* key groups (every key's key group is
        computed anew). Operators keep their parallelism, which may not exceed it."""
        check_max_parallelism(max_parallelism)
        for uid, op in sorted(self._operators.items()):
            if op.keyed and op.parallelism > max_parallelism:
                raise ConfigError(
                    "max_parallelism",
                    max_parallelism,
                    f"at least the parallelism {op.parallelism} of operator {uid!r} "
                    "(lower it with with_parallelism first)",
                )
        self.max_parallelism = max_parallelism
        self.default_parallelism = min(self.default_parallelism, max_parallelism)
        return self

    def with_parallelism(self, parallelism: int, uid: str | None = None) -> SavepointWriter:
        """Cut the keyed state of *uid* (default: of every operator, and of operators added
        later) into *parallelism* subtasks. (Any parallelism restores any savepoint; this
        only changes how the savepoint is cut.)"""
        check_parallelism(self.max_parallelism, parallelism)
        if uid is None:
            self.default_parallelism = parallelism
            for op in self._operators.values():
                op.parallelism = parallelism
        else:
            self._operator(uid).parallelism = parallelism
        return self

    def with_source_offsets(self, offsets: OffsetsLike) -> SavepointWriter:
        """Replace every source position by *offsets*: a table with columns ``source``,
        ``channel``, ``offset`` (as :meth:`StateReader.source_offsets` returns it), a
        mapping ``(source, channel) -> offset``, or :class:`SourceOffset` objects. ``None``
        or empty: no positions (every source starts from its beginning)."""
        found: dict[tuple[str, int], int] = {}
        if offsets is None:
            pass
        elif isinstance(offsets, pa.Table):
            for row in offsets.select(["source", "channel", "offset"]).to_pylist():
                found[(str(row["source"]), int(row["channel"]))] = int(row["offset"])
        elif isinstance(offsets, Mapping):
            found = {(str(s), int(c)): int(o) for (s, c), o in offsets.items()}
        else:
            for o in offsets:
                found[(o.source, o.channel)] = o.offset
        for (source, channel), offset in found.items():
            if channel < 0 or offset < 0:
                raise ConfigError(
                    "source offsets", (source, channel, offset), "non-negative channels/offsets"
                )
        self._offsets = found
        return self

    def with_pipeline(self, pipeline: str) -> SavepointWriter:
        """Set the pipeline the savepoint belongs to (its ``pipeline`` property)."""
        if not pipeline:
            raise ConfigError("pipeline", pipeline, "a non-empty pipeline name")
        self.pipeline = pipeline
        return self

    def with_properties(self, properties: Mapping[str, str]) -> SavepointWriter:
        """Extra properties of the savepoint (``pipeline``, ``max_parallelism`` and
        ``format`` are set by the writer)."""
        for key in properties:
            if key in (PIPELINE, MAX_PARALLELISM, FORMAT):
                raise ConfigError("properties", key, "a key other than the writer's own")
        self._properties.update({str(k): str(v) for k, v in properties.items()})
        return self

    # -- writing ---------------------------------------------------------------------------
    def task_snapshots(self) -> list[TaskSnapshot]:
        """The savepoint's task snapshots (what :meth:`write` writes): per vertex and
        subtask, the FULL keyed blobs, the carried and bootstrapped operator state and the
        carried channel state of its operators; every task carries all source positions."""
        per_task: dict[TaskId, list[StateBlob]] = {}
        for uid, op in sorted(self._operators.items()):
            blobs: list[StateBlob] = []
            if op.keyed:
                assert op.key_type is not None
                for name in sorted(op.keyed):
                    state = op.keyed[name]
                    blobs.extend(
                        full_blobs(
                            uid,
                            state.table(),
                            state.descriptor,
                            op.key_type,
                            self.max_parallelism,
                            op.parallelism,
                        )
                    )
            blobs.extend(_carry(uid, op.carried))
            for name in sorted(op.new_operator_state):
                blobs.append(
                    StateBlob(uid, 0, BlobKind.OPERATOR, name, op.new_operator_state[name].table)
                )
            for blob in blobs:
                per_task.setdefault(TaskId(op.vertex, blob.subtask), []).append(blob)
        offsets = tuple(SourceOffset(s, c, o) for (s, c), o in sorted(self._offsets.items()))
        if not per_task:
            by_source: dict[str, list[SourceOffset]] = {}
            for o in offsets:
                by_source.setdefault(o.source, []).append(o)
            return [TaskSnapshot(TaskId(s, 0), offsets=tuple(os_)) for s, os_ in by_source.items()]
        return [
            TaskSnapshot(task, new_blobs=tuple(per_task[task]), offsets=offsets)
            for task in sorted(per_task)
        ]

    def properties(self) -> dict[str, str]:
        """The properties the savepoint will carry."""
        if not self.pipeline:
            raise StoreError(
                "the savepoint's pipeline is unknown (the source does not record it): pass "
                "pipeline= to SavepointWriter.from_existing or call with_pipeline"
            )
        return {
            **self._properties,
            PIPELINE: self.pipeline,
            MAX_PARALLELISM: str(self.max_parallelism),
            FORMAT: FORMAT_VERSION,
        }

    def write(
        self,
        path: str,
        checkpoint_id: int | None = None,
        *,
        storage_options: dict[str, str] | None = None,
    ) -> CompletedCheckpoint:
        """Write the savepoint into directory *path* (new or empty; the source is never
        modified) as checkpoint *checkpoint_id* (default: the source checkpoint's id, 1 for
        a new savepoint); returns its metadata."""
        properties = self.properties()
        return write_savepoint(
            path,
            checkpoint_id or self.checkpoint_id,
            self.task_snapshots(),
            properties,
            storage_options=storage_options,
        )


def _reader_loader(reader: StateReader, uid: str, state_name: str) -> Callable[[], pa.Table]:
    def load() -> pa.Table:
        return reader.keyed(uid, state_name).replace_schema_metadata(None)

    return load


def _carry(uid: str, carried: Sequence[_CarriedBlob]) -> list[StateBlob]:
    """The carried blobs as blobs of *uid* (read from their source, one bulk read per
    source store)."""
    tables: dict[BlobRef, pa.Table] = {}
    stores: dict[int, tuple[ReadableStore, list[BlobRef]]] = {}
    for blob in carried:
        stores.setdefault(id(blob.store), (blob.store, []))[1].append(blob.ref)
    for store, refs in stores.values():
        tables.update(zip(refs, store.read_blobs(refs), strict=True))
    return [
        StateBlob(
            operator_uid=uid,
            subtask=blob.ref.subtask,
            kind=blob.ref.kind,
            state_name=blob.ref.state_name,
            table=tables[blob.ref],
            key_group_start=blob.ref.key_group_start,
            key_group_end=blob.ref.key_group_end,
            channel=blob.ref.channel,
            seq=0,
        )
        for blob in carried
    ]


def _descriptor(state_name: str, kind: KindLike, table: pa.Table) -> StateDescriptor:
    """The descriptor of *state_name* from *kind* (see
    :meth:`SavepointWriter.with_keyed_state`) and the value column of *table*."""
    if isinstance(kind, ValueStateDescriptor | ListStateDescriptor | MapStateDescriptor):
        if kind.name != state_name:
            raise StateError(f"descriptor {kind.name!r} given for state {state_name!r}")
        return kind
    if kind is None:
        recorded = (table.schema.metadata or {}).get(META_STATE_KIND)
        kind = recorded.decode() if recorded else StateKind.VALUE
    try:
        state_kind = StateKind(kind)
    except ValueError as e:
        raise StateError(f"unknown state kind {kind!r}: use value, list or map") from e
    if state_kind is StateKind.OPERATOR_LIST:
        raise StateError("operator list state is set with with_operator_state")
    return descriptor_from_column(state_name, state_kind, table.schema.field("value").type)

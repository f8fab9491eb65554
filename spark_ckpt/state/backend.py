"""Keyed and operator state of one operator subtask, and its (incremental) snapshots.

A :class:`KeyedStateBackend` holds the state of one subtask of one operator: *keyed state*
(value, list and map state per key, for the keys of the subtask's
:class:`~spark_ckpt.state.keygroup.KeyGroupRange`) and *operator state* (lists redistributed
round-robin on rescale). It lives on the task thread: it is not thread-safe, and every call
(record processing, ``snapshot``, notifications, ``restore``) comes from that thread. Only
the tables a snapshot returns travel to other threads, and those are immutable.

Representation. Each keyed state keeps, per key group, a Python ``dict`` from key to value
(keys and values as the Python objects Arrow's ``to_pylist`` yields; lists for list state,
dicts for map state). The per-record API is a dict access; the vectorized API
(:meth:`KeyedStateBackend.get_values` / :meth:`~KeyedStateBackend.put_values`) hashes a whole
Arrow key array at once (:mod:`spark_ckpt.state.keygroup`), radix-sorts it by key group and does
one C-level ``map(dict.get)`` / ``dict.update`` per key group — no per-row Python loop
(except for the rare null values that clear keys). Every mutation is also recorded for the
next incremental snapshot (:class:`_Changes`): the vectorized API appends its Arrow input to
a change log (O(1) per call), the per-record API records the key. A snapshot therefore reads
only what changed, deduplicated with Arrow kernels, not the whole state.

Snapshots follow Flink: :meth:`KeyedStateBackend.snapshot` is the synchronous phase — it
builds Arrow tables (which copies the state) and returns a :class:`TaskSnapshot`; the store
writes it later, on any thread. Keyed state is cut into one blob per state name per
snapshot, covering the subtask's key-group range, its rows sorted by key group and carrying
it (Flink's keyed-state files with key-group offsets play the same role): a restore at
another parallelism keeps the rows of the key groups it owns. Incremental snapshots (the
default) keep, per state, a chain ``[FULL, DELTA, DELTA, ...]`` (``BlobRef.seq`` 0, 1, 2, ...):

* a state unchanged since the *base* (the last checkpoint whose completion was notified, or
  the restored checkpoint) reuses the base's chain (``TaskSnapshot.reused``);
* a changed state gets a DELTA blob with exactly the keys changed since the base — their
  current value, or a tombstone (``deleted = true``) — appended to the base chain;
* the chain is replaced by a new FULL blob (seq 0) when the base chain already holds
  :data:`MAX_CHAIN_DELTAS` deltas, or when the delta rows a restore would replay (the chain's
  deltas plus the new one) exceed :data:`MAX_DELTA_ROWS_RATIO` times the state's current
  number of keys. So a restore replays at most 8 deltas and at most 1.5 times the live rows. A
  state that became empty is dropped (no blob at all);
* after a restore at another parallelism there is no base chain of exactly this subtask's
  key groups, so the first snapshot is full.

``snapshot(full=True)`` (savepoints) writes only FULL blobs. The changes made before
snapshot *n* are kept until a checkpoint ``>= n`` completes; snapshots taken while earlier
ones are pending (max concurrent checkpoints > 1) and snapshots after an abort contain every
change since the base, so nothing is lost whatever the order of completions and aborts.

Blob schemas (Arrow schema metadata carries the key-group hash, ``max_parallelism``, the
state kind and the types):

* value state: ``key_group int32 not null, key <key_type> not null, value <value_type>``;
* list state:  ``key_group, key, value list<element_type>``;
* map state:   ``key_group, key, value map<map_key_type, map_value_type>``;
* DELTA blobs add ``deleted bool not null``; deleted rows have a null value;
* operator list state (``BlobKind.OPERATOR``, one blob per state per subtask):
  ``value <element_type>``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import compress, pairwise
from typing import Any, ClassVar, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import CorruptCheckpointError, StateError
from spark_ckpt.protocol.handle import (
    BlobKind,
    BlobRef,
    StateBlob,
    TaskId,
    TaskSnapshot,
    TaskStateHandle,
)
from spark_ckpt.state.keygroup import (
    DEFAULT_MAX_PARALLELISM,
    HASH_NAME,
    KeyGroupRange,
    check_max_parallelism,
    is_supported_key_type,
    key_group_indices,
    range_for_subtask,
)

#: A chain holding this many deltas is replaced by a FULL blob at the next change.
MAX_CHAIN_DELTAS = 8
#: A chain whose delta rows (with the new delta) exceed this fraction of the key group's
#: live keys is replaced by a FULL blob.
MAX_DELTA_ROWS_RATIO = 0.5

#: Schema metadata keys of state blobs.
META_STATE_NAME = b"spark_ckpt.state_name"
META_STATE_KIND = b"spark_ckpt.state_kind"
META_KEY_GROUP_HASH = b"spark_ckpt.key_group_hash"
META_MAX_PARALLELISM = b"spark_ckpt.max_parallelism"
META_KEY_TYPE = b"spark_ckpt.key_type"
META_VALUE_TYPE = b"spark_ckpt.value_type"
META_BLOB_KIND = b"spark_ckpt.blob_kind"

_KEYED_KINDS = (BlobKind.KEYED_FULL, BlobKind.KEYED_DELTA)
_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)

ArrayLike: TypeAlias = "pa.Array | pa.ChunkedArray | Sequence[Any]"


class StateKind(StrEnum):
    """What a state holds per key (or, for ``OPERATOR_LIST``, per subtask)."""

    VALUE = "value"
    LIST = "list"
    MAP = "map"
    OPERATOR_LIST = "operator_list"


def _check_type(what: str, t: object) -> None:
    if not isinstance(t, pa.DataType):
        raise StateError(f"{what} must be a pyarrow DataType, got {t!r}")


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise StateError(f"state name must be a non-empty string, got {name!r}")


@dataclass(frozen=True)
class ValueStateDescriptor:
    """One value of type *value_type* per key."""

    name: str
    value_type: pa.DataType
    kind: ClassVar[StateKind] = StateKind.VALUE

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_type("value_type", self.value_type)

    @property
    def column_type(self) -> pa.DataType:
        """Arrow type of the ``value`` column of this state's blobs."""
        return self.value_type


@dataclass(frozen=True)
class ListStateDescriptor:
    """A list of non-null elements of type *element_type* per key."""

    name: str
    element_type: pa.DataType
    kind: ClassVar[StateKind] = StateKind.LIST

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_type("element_type", self.element_type)

    @property
    def column_type(self) -> pa.DataType:
        return pa.list_(self.element_type)


@dataclass(frozen=True)
class MapStateDescriptor:
    """A map from non-null *map_key_type* (a primitive type) to *map_value_type* per key."""

    name: str
    map_key_type: pa.DataType
    map_value_type: pa.DataType
    kind: ClassVar[StateKind] = StateKind.MAP

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_type("map_key_type", self.map_key_type)
        _check_type("map_value_type", self.map_value_type)
        if pa.types.is_nested(self.map_key_type):
            raise StateError(f"map key type must be primitive, got {self.map_key_type}")

    @property
    def column_type(self) -> pa.DataType:
        return pa.map_(self.map_key_type, self.map_value_type)


StateDescriptor: TypeAlias = ValueStateDescriptor | ListStateDescriptor | MapStateDescriptor


def _descriptor_from_column(
    name: str, kind: StateKind, column_type: pa.DataType
) -> StateDescriptor:
    """The descriptor whose blobs have a ``value`` column of *column_type*."""
    if kind is StateKind.VALUE:
        return ValueStateDescriptor(name, column_type)
    if kind is StateKind.LIST and pa.types.is_list(column_type):
        return ListStateDescriptor(name, column_type.value_type)
    if kind is StateKind.MAP and pa.types.is_map(column_type):
        return MapStateDescriptor(name, column_type.key_type, column_type.item_type)
    raise StateError(
        f"state {name!r}: value column of type {column_type} does not fit {kind.value}"
    )


def _metadata(
    name: str,
    kind: StateKind,
    key_type: pa.DataType | None,
    value_type: pa.DataType,
    max_parallelism: int,
    blob_kind: BlobKind,
) -> dict[bytes, bytes]:
    meta = {
        META_STATE_NAME: name.encode(),
        META_STATE_KIND: kind.value.encode(),
        META_VALUE_TYPE: str(value_type).encode(),
        META_BLOB_KIND: blob_kind.value.encode(),
    }
    if key_type is not None:
        meta[META_KEY_TYPE] = str(key_type).encode()
        meta[META_KEY_GROUP_HASH] = HASH_NAME.encode()
        meta[META_MAX_PARALLELISM] = str(max_parallelism).encode()
    return meta


@functools.lru_cache(maxsize=1024)
def keyed_blob_schema(
    descriptor: StateDescriptor, key_type: pa.DataType, max_parallelism: int, delta: bool
) -> pa.Schema:
    """Schema of the FULL (``delta=False``) or DELTA blobs of *descriptor*. Cached: schemas
    are immutable."""
    fields = [
        pa.field("key_group", pa.int32(), nullable=False),
        pa.field("key", key_type, nullable=False),
        pa.field("value", descriptor.column_type),
    ]
    if delta:
        fields.append(pa.field("deleted", pa.bool_(), nullable=False))
    blob_kind = BlobKind.KEYED_DELTA if delta else BlobKind.KEYED_FULL
    meta = _metadata(
        descriptor.name,
        descriptor.kind,
        key_type,
        descriptor.column_type,
        max_parallelism,
        blob_kind,
    )
    return pa.schema(fields, metadata=meta)


def operator_blob_schema(name: str, element_type: pa.DataType) -> pa.Schema:
    """Schema of the OPERATOR blob of operator list state *name*."""
    meta = _metadata(name, StateKind.OPERATOR_LIST, None, element_type, 0, BlobKind.OPERATOR)
    return pa.schema([pa.field("value", element_type)], metadata=meta)


def _to_column(kind: StateKind, values: Iterable[Any]) -> list[Any]:
    """Stored Python values -> what ``pa.array`` takes for the value column."""
    if kind is StateKind.MAP:
        return [None if m is None else list(m.items()) for m in values]
    return list(values)


def _from_column(kind: StateKind, column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A value column -> stored Python values."""
    values: list[Any] = column.to_pylist()
    if kind is StateKind.MAP:
        return [None if m is None else dict(m) for m in values]
    return values


def _python_value(value: Any, arrow_type: pa.DataType, what: str) -> Any:
    """*value* as the Python object Arrow yields for *arrow_type*; StateError if it does not
    convert."""
    try:
        return pa.scalar(value, type=arrow_type).as_py()
    except _CONVERSION_ERRORS as e:
        raise StateError(f"{what} {value!r} is not a valid {arrow_type}") from e


#: Column names of a change log (and, with ``deleted``, of a DELTA blob).
_LOG_COLUMNS = ["key_group", "key", "value"]


def _last_occurrences(keys: pa.Array) -> npt.NDArray[np.int64]:
    """Positions of the last occurrence of each distinct key of *keys*, ascending."""
    if len(keys) == 0:
        return np.empty(0, dtype=np.int64)
    codes = keys.dictionary_encode().indices.to_numpy()
    last = np.full(int(codes.max()) + 1, -1, dtype=np.int64)
    np.maximum.at(last, codes, np.arange(len(codes), dtype=np.int64))
    return np.sort(last)


class _Changes:
    """What changed in one keyed state during an interval (between two snapshots, or
    several such intervals merged), which is what an incremental snapshot writes.

    Two kinds of records, because the two APIs mutate differently:

    * the vectorized API (``put_values`` / ``clear_values``) appends its input, as Arrow
      columns ``key_group, key, value`` (a null value: the key was cleared), to a *log* in
      call order — O(1) per call, no per-row Python. The last logged value of a key is its
      value at the end of the interval unless the per-record API changed it afterwards;
    * the per-record API records the key in ``keys`` (per key group): the value is read
      from the state when the snapshot is taken (values of list and map state are mutable
      objects, so they cannot be captured earlier).

    A delta therefore reads the log (last occurrence per key wins), then overrides it with
    the current value of every per-record key. The log is compacted (deduplicated) when it
    outgrows ``2 *`` the state's live keys, so memory stays proportional to the state."""

    __slots__ = ("keys", "log", "log_rows")

    def __init__(self) -> None:
        self.log: list[pa.Table] = []
        self.log_rows = 0
        self.keys: dict[int, set[Any]] = {}

    def __bool__(self) -> bool:
        return bool(self.log_rows or self.keys)

    def append_log(self, table: pa.Table, live_rows: int) -> None:
        self.log.append(table)
        self.log_rows += table.num_rows
        if self.log_rows > 65_536 + 2 * live_rows and len(self.log) > 1:
            compacted = self.compacted_log()
            self.log = [compacted]
            self.log_rows = compacted.num_rows

    def touch(self, key_group: int, key: Any) -> None:
        keys = self.keys.get(key_group)
        if keys is None:
            keys = self.keys[key_group] = set()
        keys.add(key)

    def compacted_log(self) -> pa.Table:
        """The log with one row per key: its last occurrence."""
        table = pa.concat_tables(self.log).combine_chunks() if len(self.log) > 1 else self.log[0]
        positions = _last_occurrences(table.column("key").combine_chunks())
        if len(positions) == table.num_rows:
            return table
        return table.take(pa.array(positions))

    def then(self, later: _Changes) -> _Changes:
        """These changes followed by *later* ones (neither is modified)."""
        merged = _Changes()
        merged.log = [*self.log, *later.log]
        merged.log_rows = self.log_rows + later.log_rows
        for source in (self.keys, later.keys):
            for kg, keys in source.items():
                merged.keys.setdefault(kg, set()).update(keys)
        return merged


@dataclass
class _KeyedState:
    """Storage of one keyed state: per key group, key -> value, and the changes since the
    last snapshot was taken."""

    descriptor: StateDescriptor
    groups: dict[int, dict[Any, Any]] = field(default_factory=dict)
    changes: _Changes = field(default_factory=_Changes)

    def group(self, key_group: int) -> dict[Any, Any]:
        g = self.groups.get(key_group)
        if g is None:
            g = self.groups[key_group] = {}
        return g

    def log(self, key_groups: npt.NDArray[np.integer], keys: pa.Array, values: pa.Array) -> None:
        """Record a vectorized change (a null value clears its key)."""
        table = pa.table([pa.array(key_groups, type=pa.int32()), keys, values], names=_LOG_COLUMNS)
        self.changes.append_log(table, self.count())

    def touch_one(self, key_group: int, key: Any) -> None:
        self.changes.touch(key_group, key)

    def take_changes(self) -> _Changes:
        """The changes since the last snapshot, resetting them."""
        taken = self.changes
        self.changes = _Changes()
        return taken

    def count(self) -> int:
        return sum(len(g) for g in self.groups.values())


@dataclass
class _PendingSnapshot:
    """A snapshot taken but neither completed nor aborted, with the changes made between the
    previous snapshot and it, per state name."""

    checkpoint_id: int
    changes: dict[str, _Changes]


@dataclass(frozen=True)
class _Routing:
    """A key array sorted by key group: the keys of ``groups[j]`` are
    ``sorted_keys[bounds[j]:bounds[j + 1]]``; ``order[s]`` is the input position of sorted
    position ``s``."""

    source: object
    array: pa.Array
    key_groups: npt.NDArray[np.integer]
    groups: list[int]
    bounds: list[int]
    sorted_keys: list[Any]
    order: npt.NDArray[np.int64]

    def segments(self) -> Iterator[tuple[int, int, int]]:
        """(key group, begin, end) of each run of the sorted keys."""
        return zip(self.groups, self.bounds[:-1], self.bounds[1:], strict=True)

    def unsort(self, sorted_array: pa.Array) -> pa.Array:
        """*sorted_array* (aligned with the sorted keys) back in input order."""
        inverse = np.empty_like(self.order)
        inverse[self.order] = np.arange(len(self.order), dtype=np.int64)
        return sorted_array.take(pa.array(inverse))


class OperatorListState:
    """Operator (non-keyed) list state of one subtask. On rescale the elements of all old
    subtasks are concatenated in subtask order and dealt round-robin: new subtask ``i`` gets
    the elements at positions ``j`` with ``j % parallelism == i``."""

    def __init__(self, name: str, element_type: pa.DataType) -> None:
        self.name = name
        self.element_type = element_type
        self._items: list[Any] = []

    def get(self) -> list[Any]:
        """A copy of the elements."""
        return list(self._items)

    def add(self, value: Any) -> None:
        if value is None:
            raise StateError(f"operator state {self.name!r}: null elements are not allowed")
        self._items.append(_python_value(value, self.element_type, "element"))

    def add_all(self, values: Iterable[Any]) -> None:
        converted = [self._convert(v) for v in values]
        self._items.extend(converted)

    def update(self, values: Iterable[Any]) -> None:
        self._items = [self._convert(v) for v in values]

    def clear(self) -> None:
        self._items = []

    def _convert(self, value: Any) -> Any:
        if value is None:
            raise StateError(f"operator state {self.name!r}: null elements are not allowed")
        return _python_value(value, self.element_type, "element")


class _PerKeyState:
    """Base of the per-record state views: bound to the backend's current key."""

    def __init__(self, backend: KeyedStateBackend, state: _KeyedState) -> None:
        self._backend = backend
        self._state = state

    @property
    def descriptor(self) -> StateDescriptor:
        return self._state.descriptor

    def _current(self) -> tuple[int, Any]:
        return self._backend._current()

    def _stored(self) -> Any:
        kg, key = self._current()
        g = self._state.groups.get(kg)
        return None if g is None else g.get(key)

    def _store(self, value: Any) -> None:
        kg, key = self._current()
        self._state.group(kg)[key] = value
        self._state.touch_one(kg, key)

    def clear(self) -> None:
        """Remove the current key's entry."""
        kg, key = self._current()
        g = self._state.groups.get(kg)
        if g is not None:
            g.pop(key, None)
        self._state.touch_one(kg, key)


class ValueState(_PerKeyState):
    """The value of the current key. Returned values are the stored objects: do not mutate
    them (nested values), :meth:`update` instead."""

    def value(self) -> Any:
        """The current key's value, ``None`` if it has none."""
        return self._stored()

    def update(self, value: Any) -> None:
        """Set the current key's value; ``None`` clears it."""
        if value is None:
            self.clear()
            return
        desc = self._state.descriptor
        assert isinstance(desc, ValueStateDescriptor)
        self._store(_python_value(value, desc.value_type, f"value of state {desc.name!r}"))


class ListState(_PerKeyState):
    """The list of the current key. An empty list is the same as no entry."""

    def _element(self, value: Any) -> Any:
        desc = self._state.descriptor
        assert isinstance(desc, ListStateDescriptor)
        if value is None:
            raise StateError(f"list state {desc.name!r}: null elements are not allowed")
        return _python_value(value, desc.element_type, f"element of state {desc.name!r}")

    def get(self) -> list[Any]:
        """A copy of the current key's list (empty if none)."""
        stored = self._stored()
        return [] if stored is None else list(stored)

    def add(self, value: Any) -> None:
        self.add_all([value])

    def add_all(self, values: Iterable[Any]) -> None:
        converted = [self._element(v) for v in values]
        if not converted:
            return
        current = self._stored()
        if current is None:
            current = []
        current.extend(converted)  # in place: snapshots copy into Arrow
        self._store(current)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the current key's list; an empty list clears it."""
        converted = [self._element(v) for v in values]
        if converted:
            self._store(converted)
        else:
            self.clear()


class MapState(_PerKeyState):
    """The map of the current key. An empty map is the same as no entry; map values may be
    null (use :meth:`contains` to tell a null value from a missing key)."""

    def _desc(self) -> MapStateDescriptor:
        desc = self._state.descriptor
        assert isinstance(desc, MapStateDescriptor)
        return desc

    def _map(self) -> dict[Any, Any]:
        stored = self._stored()
        return {} if stored is None else dict(stored)

    def _map_key(self, key: Any) -> Any:
        desc = self._desc()
        if key is None:
            raise StateError(f"map state {desc.name!r}: null map keys are not allowed")
        return _python_value(key, desc.map_key_type, f"map key of state {desc.name!r}")

    def get(self, key: Any) -> Any:
        stored = self._stored()
        return None if stored is None else stored.get(self._map_key(key))

    def put(self, key: Any, value: Any) -> None:
        desc = self._desc()
        k = self._map_key(key)
        v = None if value is None else _python_value(value, desc.map_value_type, "map value")
        stored = self._stored()
        if stored is None:
            stored = {}
        stored[k] = v  # in place: snapshots copy into Arrow, nothing else shares the dict
        self._store(stored)

    def put_all(self, entries: Iterable[tuple[Any, Any]]) -> None:
        for k, v in entries:
            self.put(k, v)

    def contains(self, key: Any) -> bool:
        stored = self._stored()
        return stored is not None and self._map_key(key) in stored

    def remove(self, key: Any) -> None:
        k = self._map_key(key)
        stored = self._stored()
        if stored is None or k not in stored:
            return
        del stored[k]
        if stored:
            self._store(stored)
        else:
            self.clear()

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())

    def keys(self) -> list[Any]:
        return list(self._map().keys())

    def values(self) -> list[Any]:
        return list(self._map().values())

    def is_empty(self) -> bool:
        return not self._stored()


class KeyedStateBackend:
    """Keyed and operator state of subtask *subtask* of operator *operator_uid*, owning the
    key groups *key_group_range* (inclusive ends) of *max_parallelism*. See the module
    docstring for the representation, the snapshot rules and the threading contract.

    *parallelism* (optional) is only needed to redistribute operator state on restore; when
    given, *key_group_range* must be the range Flink assigns to *subtask* at it.
    """

    def __init__(
        self,
        operator_uid: str,
        subtask: int,
        key_type: pa.DataType,
        key_group_range: KeyGroupRange,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        *,
        parallelism: int | None = None,
    ) -> None:
        check_max_parallelism(max_parallelism)
        if not isinstance(key_type, pa.DataType) or not is_supported_key_type(key_type):
            raise StateError(
                f"key type {key_type} is not supported: use an integer, bool, string or binary key"
            )
        if key_group_range.end >= max_parallelism:
            raise StateError(
                f"key group range {key_group_range} exceeds max_parallelism {max_parallelism}"
            )
        if parallelism is not None:
            expected = range_for_subtask(max_parallelism, parallelism, subtask)
            if expected != key_group_range:
                raise StateError(
                    f"subtask {subtask} of {parallelism} owns key groups {expected}, "
                    f"not {key_group_range}"
                )
        self.operator_uid = operator_uid
        self.subtask = subtask
        self.key_type = key_type
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.parallelism = parallelism
        self._states: dict[str, _KeyedState] = {}
        self._operator_states: dict[str, OperatorListState] = {}
        self._current_key: Any = None
        self._current_group = -1
        self._has_current = False
        self._route_cache: _Routing | None = None
        # incremental snapshot bookkeeping
        self._base: dict[str, tuple[BlobRef, ...]] = {}
        self._base_id = 0
        self._last_snapshot_id = 0
        self._pending: list[_PendingSnapshot] = []

    @classmethod
    def for_subtask(
        cls,
        operator_uid: str,
        subtask: int,
        parallelism: int,
        key_type: pa.DataType,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    ) -> KeyedStateBackend:
        """The backend of subtask *subtask* of *parallelism*, with Flink's key group range."""
        rng = range_for_subtask(max_parallelism, parallelism, subtask)
        return cls(operator_uid, subtask, key_type, rng, max_parallelism, parallelism=parallelism)

    @property
    def task_id(self) -> TaskId:
        return TaskId(self.operator_uid, self.subtask)

    def __repr__(self) -> str:
        return (
            f"KeyedStateBackend({self.operator_uid!r}, subtask={self.subtask}, "
            f"key_groups={self.key_group_range}, states={sorted(self._states)})"
        )

    # -- registration ----------------------------------------------------------------------
    def _register(self, descriptor: StateDescriptor) -> _KeyedState:
        if not isinstance(
            descriptor, ValueStateDescriptor | ListStateDescriptor | MapStateDescriptor
        ):
            raise StateError(f"not a state descriptor: {descriptor!r}")
        state = self._states.get(descriptor.name)
        if state is None:
            if descriptor.name in self._operator_states:
                raise StateError(f"state {descriptor.name!r} is already operator state")
            state = self._states[descriptor.name] = _KeyedState(descriptor)
        elif state.descriptor != descriptor:
            raise StateError(
                f"state {descriptor.name!r} is registered as {state.descriptor}, not {descriptor}"
            )
        return state

    def value_state(self, descriptor: ValueStateDescriptor) -> ValueState:
        """The per-record view of value state *descriptor* (registered on first use)."""
        self._expect(descriptor, ValueStateDescriptor)
        return ValueState(self, self._register(descriptor))

    def list_state(self, descriptor: ListStateDescriptor) -> ListState:
        self._expect(descriptor, ListStateDescriptor)
        return ListState(self, self._register(descriptor))

    def map_state(self, descriptor: MapStateDescriptor) -> MapState:
        self._expect(descriptor, MapStateDescriptor)
        return MapState(self, self._register(descriptor))

    @staticmethod
    def _expect(descriptor: object, cls: type) -> None:
        if not isinstance(descriptor, cls):
            raise StateError(f"expected a {cls.__name__}, got {descriptor!r}")

    def operator_list_state(self, name: str, element_type: pa.DataType) -> OperatorListState:
        """Operator list state *name* (registered on first use)."""
        _check_name(name)
        _check_type("element_type", element_type)
        state = self._operator_states.get(name)
        if state is None:
            if name in self._states:
                raise StateError(f"state {name!r} is already keyed state")
            state = self._operator_states[name] = OperatorListState(name, element_type)
        elif state.element_type != element_type:
            raise StateError(
                f"operator state {name!r} holds {state.element_type}, not {element_type}"
            )
        return state

    def descriptors(self) -> list[StateDescriptor]:
        """Every keyed state, registered or restored, by name."""
        return [self._states[n].descriptor for n in sorted(self._states)]

    # -- current key -----------------------------------------------------------------------
    def set_current_key(self, key: Any) -> None:
        """Make *key* the key the per-record state views act on. Raises
        :class:`StateError` if it is null, not of the key type, or outside this subtask's
        key groups."""
        if key is None:
            raise StateError("the current key must not be null")
        try:
            arr = pa.array([key], type=self.key_type)
        except _CONVERSION_ERRORS as e:
            raise StateError(f"key {key!r} is not a valid {self.key_type}") from e
        kg = int(key_group_indices(arr, self.max_parallelism)[0])
        if kg not in self.key_group_range:
            raise StateError(
                f"key {key!r} is in key group {kg}, outside {self.key_group_range} of "
                f"subtask {self.task_id}"
            )
        self._current_key = arr[0].as_py()
        self._current_group = kg
        self._has_current = True

    @property
    def current_key(self) -> Any:
        if not self._has_current:
            raise StateError("no current key: call set_current_key first")
        return self._current_key

    def _current(self) -> tuple[int, Any]:
        if not self._has_current:
            raise StateError("keyed state accessed without a current key")
        return self._current_group, self._current_key

    # -- vectorized access -----------------------------------------------------------------
    def _key_array(self, keys: ArrayLike) -> pa.Array:
        try:
            if isinstance(keys, pa.ChunkedArray):
                arr = keys.combine_chunks()
            elif isinstance(keys, pa.Array):
                arr = keys
            else:
                arr = pa.array(keys, type=self.key_type)
            if pa.types.is_dictionary(arr.type):
                arr = arr.dictionary_decode()
            if arr.type != self.key_type:
                arr = arr.cast(self.key_type)
        except _CONVERSION_ERRORS as e:
            raise StateError(f"keys are not {self.key_type}: {e}") from e
        return arr

    def _route(self, keys: ArrayLike) -> _Routing:
        """Hash, range-check and sort *keys* by key group. The last routing of an Arrow
        array is cached by identity (arrays are immutable), so ``put_values`` right after
        ``get_values`` on the same batch does not hash again."""
        cached = self._route_cache
        if cached is not None and cached.source is keys:
            return cached
        arr = self._key_array(keys)
        kgs = key_group_indices(arr, self.max_parallelism)
        if not self.key_group_range.contains_all(kgs):
            outside = int(
                np.count_nonzero(
                    (kgs < self.key_group_range.start) | (kgs > self.key_group_range.end)
                )
            )
            raise StateError(
                f"{outside} key(s) outside key groups {self.key_group_range} of subtask "
                f"{self.task_id}"
            )
        # key groups < 2**15 fit int16, for which numpy's stable sort is a radix sort
        order = np.argsort(kgs.astype(np.int16), kind="stable").astype(np.int64)
        sorted_kgs = kgs[order]
        starts = np.flatnonzero(np.diff(sorted_kgs)) + 1 if len(order) else np.empty(0, np.int64)
        bounds = [0, *starts.tolist(), len(order)] if len(order) else [0]
        groups = sorted_kgs[bounds[:-1]].tolist() if len(order) else []
        sorted_keys = arr.take(pa.array(order)).to_pylist()
        routing = _Routing(keys, arr, kgs, groups, bounds, sorted_keys, order)
        if isinstance(keys, pa.Array | pa.ChunkedArray):
            self._route_cache = routing
        return routing

    def _value_state(self, descriptor: ValueStateDescriptor) -> _KeyedState:
        self._expect(descriptor, ValueStateDescriptor)
        return self._register(descriptor)

    def get_values(self, descriptor: ValueStateDescriptor, keys: ArrayLike) -> pa.Array:
        """The value of each key (null where it has none), aligned with *keys*, as an array
        of ``descriptor.value_type``. Keys may repeat; all must be in this subtask's key
        groups."""
        state = self._value_state(descriptor)
        routing = self._route(keys)
        out: list[Any] = []
        for kg, begin, end in routing.segments():
            group = state.groups.get(kg)
            segment = routing.sorted_keys[begin:end]
            if group:
                out.extend(map(group.get, segment))
            else:
                out.extend([None] * len(segment))
        return routing.unsort(pa.array(out, type=descriptor.value_type))

    def put_values(
        self, descriptor: ValueStateDescriptor, keys: ArrayLike, values: ArrayLike
    ) -> None:
        """Set the value of each key; a null value clears the key. *keys* are meant to be
        unique; if a key repeats, its last occurrence (in input order) wins. Nothing changes
        if any key is invalid or outside this subtask's key groups."""
        state = self._value_state(descriptor)
        routing = self._route(keys)
        vals = self._value_array(descriptor, values)
        if len(vals) != len(routing.array):
            raise StateError(f"{len(routing.array)} keys but {len(vals)} values")
        sorted_values = vals.take(pa.array(routing.order))
        pyvalues = sorted_values.to_pylist()
        with_nulls = sorted_values.null_count > 0
        for kg, begin, end in routing.segments():
            segment = routing.sorted_keys[begin:end]
            group = state.group(kg)
            if not with_nulls:
                group.update(zip(segment, pyvalues[begin:end], strict=True))
            else:
                # clears are rare: an order-preserving loop keeps "last occurrence wins"
                for k, v in zip(segment, pyvalues[begin:end], strict=True):
                    if v is None:
                        group.pop(k, None)
                    else:
                        group[k] = v
        state.log(routing.key_groups, routing.array, vals)

    def clear_values(self, descriptor: StateDescriptor, keys: ArrayLike) -> None:
        """Remove the entries of *keys* from any keyed state."""
        state = self._register(descriptor)
        routing = self._route(keys)
        for kg, begin, end in routing.segments():
            segment = routing.sorted_keys[begin:end]
            group = state.groups.get(kg)
            if group:
                for k in segment:
                    group.pop(k, None)
        state.log(
            routing.key_groups,
            routing.array,
            pa.nulls(len(routing.array), state.descriptor.column_type),
        )

    def _value_array(self, descriptor: ValueStateDescriptor, values: ArrayLike) -> pa.Array:
        try:
            if isinstance(values, pa.ChunkedArray):
                arr = values.combine_chunks()
            elif isinstance(values, pa.Array):
                arr = values
            else:
                arr = pa.array(values, type=descriptor.value_type)
            if arr.type != descriptor.value_type:
                arr = arr.cast(descriptor.value_type)
        except _CONVERSION_ERRORS as e:
            raise StateError(f"values are not {descriptor.value_type}: {e}") from e
        return arr

    # -- inspection ------------------------------------------------------------------------
    def _state(self, descriptor: StateDescriptor | str) -> _KeyedState:
        if isinstance(descriptor, str):
            state = self._states.get(descriptor)
            if state is None:
                raise StateError(f"no keyed state {descriptor!r}")
            return state
        return self._register(descriptor)

    def keys(self, descriptor: StateDescriptor | str) -> pa.Array:
        """Every key with an entry in the state, in key group order."""
        state = self._state(descriptor)
        out: list[Any] = []
        for kg in sorted(state.groups):
            out.extend(state.groups[kg])
        return pa.array(out, type=self.key_type)

    def to_table(self, descriptor: StateDescriptor | str) -> pa.Table:
        """Every (key group, key, value) of the state, in key group order, with the FULL
        blob schema."""
        return self._full_table(self._state(descriptor))

    def value_count(self, descriptor: StateDescriptor | str | None = None) -> int:
        """Number of (key, state) entries, of one state or of all keyed states."""
        if descriptor is None:
            return sum(s.count() for s in self._states.values())
        return self._state(descriptor).count()

    # -- snapshot --------------------------------------------------------------------------
    def _kg_column(self, groups: list[int], sizes: list[int]) -> pa.Array:
        return pa.array(np.repeat(np.asarray(groups, dtype=np.int32), sizes), type=pa.int32())

    def _full_table(self, state: _KeyedState) -> pa.Table:
        """FULL blob of *state*: every key, sorted by key group."""
        desc = state.descriptor
        groups = [kg for kg in sorted(state.groups) if state.groups[kg]]
        keys: list[Any] = []
        values: list[Any] = []
        sizes: list[int] = []
        for kg in groups:
            group = state.groups[kg]
            keys.extend(group)
            values.extend(group.values())
            sizes.append(len(group))
        schema = keyed_blob_schema(desc, self.key_type, self.max_parallelism, delta=False)
        return pa.table(
            [
                self._kg_column(groups, sizes),
                pa.array(keys, type=self.key_type),
                pa.array(_to_column(desc.kind, values), type=desc.column_type),
            ],
            schema=schema,
        )

    def _delta_table(self, state: _KeyedState, changes: _Changes) -> pa.Table:
        """DELTA blob of *changes* (see :class:`_Changes`), sorted by key group: the current
        value of every changed key, or a tombstone (``deleted``, null value) for keys no
        longer present."""
        desc = state.descriptor
        schema = keyed_blob_schema(desc, self.key_type, self.max_parallelism, delta=True)
        parts: list[pa.Table] = []
        touched = [k for keys in changes.keys.values() for k in keys]
        if changes.log:
            logged = changes.compacted_log()
            if touched:  # the per-record API changed these later: read below
                stale = pc.is_in(logged.column("key"), value_set=pa.array(touched, self.key_type))
                logged = logged.filter(pc.invert(stale))
            value = logged.column("value")
            parts.append(pa.Table.from_arrays([*logged.columns, value.is_null()], schema=schema))
        if touched:
            groups = sorted(changes.keys)
            keys: list[Any] = []
            values: list[Any] = []
            sizes: list[int] = []
            member: list[bool] = []
            for kg in groups:
                segment = changes.keys[kg]  # an unmodified set iterates in the same order twice
                group = state.groups.get(kg, {})
                keys.extend(segment)
                values.extend(map(group.get, segment))
                member.extend(map(group.__contains__, segment))
                sizes.append(len(segment))
            parts.append(
                pa.table(
                    [
                        self._kg_column(groups, sizes),
                        pa.array(keys, type=self.key_type),
                        pa.array(_to_column(desc.kind, values), type=desc.column_type),
                        pa.array(np.logical_not(np.asarray(member, dtype=np.bool_))),
                    ],
                    schema=schema,
                )
            )
        table = pa.concat_tables(parts).combine_chunks() if len(parts) > 1 else parts[0]
        kgs = table.column("key_group").to_numpy()
        if len(kgs) > 1 and bool(np.any(kgs[1:] < kgs[:-1])):
            order = np.argsort(kgs.astype(np.int16), kind="stable")
            table = table.take(pa.array(order))
        return table

    def _changes_since_base(self, name: str, state: _KeyedState) -> _Changes:
        """Changes of state *name* since the base: pending snapshots' changes, then the
        changes since the last snapshot."""
        changes = state.changes
        for pending in reversed(self._pending):
            earlier = pending.changes.get(name)
            if earlier:
                changes = earlier.then(changes)
        return changes

    @staticmethod
    def _needs_full(chain: tuple[BlobRef, ...], new_delta_rows: int, live_rows: int) -> bool:
        if len(chain) - 1 >= MAX_CHAIN_DELTAS:
            return True
        delta_rows = sum(r.rows for r in chain[1:]) + new_delta_rows
        return delta_rows > MAX_DELTA_ROWS_RATIO * live_rows

    def snapshot(self, checkpoint_id: int, full: bool = False) -> TaskSnapshot:
        """Synchronous phase of checkpoint *checkpoint_id*: a consistent, immutable copy of
        the state (later updates do not affect it). Incremental unless *full* (see module
        docstring). Ids must increase from snapshot to snapshot."""
        if checkpoint_id <= self._last_snapshot_id:
            raise StateError(
                f"snapshot {checkpoint_id} is not newer than snapshot {self._last_snapshot_id}"
            )
        new_blobs: list[StateBlob] = []
        reused: list[BlobRef] = []
        for name in sorted(self._states):
            state = self._states[name]
            changed = self._changes_since_base(name, state)
            chain = self._base.get(name, ())
            if not full and chain and not changed:
                reused.extend(chain)
                continue
            live = state.count()
            delta = None
            if not full and chain and not self._needs_full(chain, 0, live):
                delta = self._delta_table(state, changed)
                if self._needs_full(chain, delta.num_rows, live):
                    delta = None
            if delta is not None:
                new_blobs.append(self._blob(BlobKind.KEYED_DELTA, name, delta, len(chain)))
                reused.extend(chain)
            elif live:
                new_blobs.append(self._blob(BlobKind.KEYED_FULL, name, self._full_table(state), 0))
        for name in sorted(self._operator_states):
            op = self._operator_states[name]
            table = pa.table(
                [pa.array(op.get(), type=op.element_type)],
                schema=operator_blob_schema(name, op.element_type),
            )
            new_blobs.append(self._blob(BlobKind.OPERATOR, name, table, 0))
        changes = {n: s.take_changes() for n, s in self._states.items() if s.changes}
        self._pending.append(_PendingSnapshot(checkpoint_id, changes))
        self._last_snapshot_id = checkpoint_id
        return TaskSnapshot(self.task_id, tuple(new_blobs), tuple(reused))

    def _blob(self, kind: BlobKind, name: str, table: pa.Table, seq: int) -> StateBlob:
        keyed = kind in _KEYED_KINDS
        return StateBlob(
            operator_uid=self.operator_uid,
            subtask=self.subtask,
            kind=kind,
            state_name=name,
            table=table,
            key_group_start=self.key_group_range.start if keyed else -1,
            key_group_end=self.key_group_range.end if keyed else -1,
            seq=seq,
        )

    def pending_snapshots(self) -> list[int]:
        """Ids of snapshots neither completed nor aborted, oldest first."""
        return [p.checkpoint_id for p in self._pending]

    @property
    def base_checkpoint_id(self) -> int:
        """The checkpoint the next incremental snapshot builds on (0: none)."""
        return self._base_id

    def notify_checkpoint_complete(self, checkpoint_id: int, handle: TaskStateHandle) -> None:
        """Checkpoint *checkpoint_id* completed, and *handle* is what the store wrote for this
        backend's snapshot of it: its chains become the base of the next incremental
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
            if ref.kind in _KEYED_KINDS:
                chains.setdefault(ref.state_name, []).append(ref)
        self._base = {name: _checked_chain(refs) for name, refs in chains.items()}
        self._base_id = checkpoint_id
        self._pending = [p for p in self._pending if p.checkpoint_id > checkpoint_id]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint *checkpoint_id* was aborted: its changes go to the next snapshot (they
        stay part of every later delta until a later checkpoint completes). Unknown ids are
        ignored (idempotent)."""
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
                    state = self._states[name]
                    state.changes = earlier.then(state.changes)
            return

    # -- restore ---------------------------------------------------------------------------
    def restore(self, refs: Sequence[BlobRef], read_blob: Callable[[BlobRef], pa.Table]) -> None:
        """Load this subtask's share of a completed checkpoint into a fresh backend.

        *refs* are the blobs of the checkpoint (of any parallelism; blobs of other operators
        are ignored). Keyed state: every chain (one per state and writing subtask) whose
        key-group range overlaps this backend's is read, its FULL blob then its DELTAs in
        ``seq`` order, keeping the rows of this backend's key groups. Operator state: dealt
        round-robin (needs ``parallelism``). A restored chain covering exactly this
        backend's range becomes the base of the next incremental snapshot; after a rescale
        the next snapshot is full. Raises :class:`CorruptCheckpointError` for broken chains
        or unreadable blobs and :class:`StateError` for state that does not fit this backend
        (schema, key type, hash, ``max_parallelism``)."""
        if self.value_count() or any(op.get() for op in self._operator_states.values()):
            raise StateError("restore needs a fresh backend: this one already holds state")
        if self._pending or self._base or self._last_snapshot_id:
            raise StateError("restore needs a fresh backend: this one has taken snapshots")
        mine = [r for r in refs if r.operator_uid == self.operator_uid]
        chains: dict[tuple[str, int, int, int], list[BlobRef]] = {}
        operator: dict[str, list[BlobRef]] = {}
        own = self.key_group_range
        for ref in mine:
            if ref.kind in _KEYED_KINDS:
                if not 0 <= ref.key_group_start <= ref.key_group_end < self.max_parallelism:
                    raise StateError(
                        f"blob of key groups {ref.key_group_start}-{ref.key_group_end} does "
                        f"not fit max_parallelism {self.max_parallelism}"
                    )
                if ref.key_group_start <= own.end and ref.key_group_end >= own.start:
                    key = (ref.state_name, ref.subtask, ref.key_group_start, ref.key_group_end)
                    chains.setdefault(key, []).append(ref)
            elif ref.kind is BlobKind.OPERATOR:
                operator.setdefault(ref.state_name, []).append(ref)
        per_state: dict[str, list[tuple[BlobRef, ...]]] = {}
        for key in sorted(chains):
            chain = _checked_chain(chains[key])
            for ref in chain:
                self._apply_blob(ref, read_blob(ref))
            per_state.setdefault(key[0], []).append(chain)
        for name in sorted(operator):
            self._restore_operator_state(name, operator[name], read_blob)
        self._base = {
            name: found[0]
            for name, found in per_state.items()
            if len(found) == 1
            and (found[0][0].key_group_start, found[0][0].key_group_end) == (own.start, own.end)
        }
        self._base_id = max((r.checkpoint_id for r in mine), default=0)
        self._last_snapshot_id = self._base_id
        for state in self._states.values():
            state.take_changes()

    def _apply_blob(self, ref: BlobRef, table: pa.Table) -> None:
        name = ref.state_name
        schema = table.schema
        meta = schema.metadata or {}
        if meta.get(META_KEY_GROUP_HASH, b"").decode() != HASH_NAME:
            raise StateError(
                f"state {name!r} was partitioned with key group hash "
                f"{meta.get(META_KEY_GROUP_HASH, b'?').decode()!r}, not {HASH_NAME!r}"
            )
        if meta.get(META_MAX_PARALLELISM, b"").decode() != str(self.max_parallelism):
            raise StateError(
                f"state {name!r} was written with max_parallelism "
                f"{meta.get(META_MAX_PARALLELISM, b'?').decode()}, this backend has "
                f"{self.max_parallelism}"
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
                f"blob {ref.kind.value} of state {name!r} has columns {schema.names}, "
                f"expected {names}"
            )
        if schema.field("key").type != self.key_type:
            raise StateError(
                f"state {name!r} has keys of type {schema.field('key').type}, this backend "
                f"{self.key_type}"
            )
        try:
            kind = StateKind(meta.get(META_STATE_KIND, b"").decode())
        except ValueError as e:
            raise StateError(f"state {name!r}: unknown state kind in blob metadata") from e
        desc = _descriptor_from_column(name, kind, schema.field("value").type)
        state = self._register(desc)
        key_column = table.column("key").combine_chunks()
        kgs = key_group_indices(key_column, self.max_parallelism).astype(np.int64)
        stored = table.column("key_group").to_numpy().astype(np.int64)
        if not np.array_equal(kgs, stored) or (
            len(kgs) and (kgs.min() < ref.key_group_start or kgs.max() > ref.key_group_end)
        ):
            raise CorruptCheckpointError(
                f"blob {ref.kind.value} of state {name!r} (checkpoint {ref.checkpoint_id}) "
                "holds keys outside the key groups it records"
            )
        own = self.key_group_range
        order = np.flatnonzero((kgs >= own.start) & (kgs <= own.end))
        order = order[np.argsort(kgs[order], kind="stable")]
        kgs = kgs[order]
        taken = table.take(pa.array(order))
        keys = taken.column("key").to_pylist()
        values = _from_column(kind, taken.column("value"))
        deleted = taken.column("deleted").to_pylist() if delta else None
        starts = np.flatnonzero(np.diff(kgs)) + 1
        bounds = [0, *starts.tolist(), len(kgs)]
        for begin, end in pairwise(bounds):
            if begin == end:
                continue
            group = state.group(int(kgs[begin]))
            seg_keys, seg_values = keys[begin:end], values[begin:end]
            if deleted is None:
                group.update(zip(seg_keys, seg_values, strict=True))
                continue
            dead = deleted[begin:end]
            live = [not d for d in dead]
            group.update(zip(compress(seg_keys, live), compress(seg_values, live), strict=True))
            for k in compress(seg_keys, dead):
                group.pop(k, None)

    def _restore_operator_state(
        self, name: str, refs: list[BlobRef], read_blob: Callable[[BlobRef], pa.Table]
    ) -> None:
        by_subtask: dict[int, BlobRef] = {}
        for ref in refs:
            other = by_subtask.setdefault(ref.subtask, ref)
            if other.key != ref.key:
                raise CorruptCheckpointError(
                    f"two operator state blobs {name!r} for subtask {ref.subtask}"
                )
        if self.parallelism is None:
            raise StateError(
                f"restoring operator state {name!r} needs the backend's parallelism "
                "(use KeyedStateBackend.for_subtask)"
            )
        elements: list[Any] = []
        element_type: pa.DataType | None = None
        for subtask in sorted(by_subtask):
            table = read_blob(by_subtask[subtask])
            meta = table.schema.metadata or {}
            if table.schema.names != ["value"] or meta.get(META_STATE_KIND) != (
                StateKind.OPERATOR_LIST.value.encode()
            ):
                raise StateError(f"blob of operator state {name!r} is not an operator list")
            t = table.schema.field("value").type
            if element_type is not None and t != element_type:
                raise StateError(f"operator state {name!r} has elements of {t} and {element_type}")
            element_type = t
            elements.extend(table.column("value").to_pylist())
        assert element_type is not None
        state = self.operator_list_state(name, element_type)
        state.update(elements[self.subtask :: self.parallelism])


def _checked_chain(refs: Sequence[BlobRef]) -> tuple[BlobRef, ...]:
    """The refs of one chain (one state of one subtask) in seq order; CorruptCheckpointError
    unless they are one FULL blob (seq 0) followed by DELTAs with seq 1, 2, ... without
    gaps, all covering the same key groups."""
    chain = sorted(set(refs), key=lambda r: r.seq)
    first = chain[0]
    for expected_seq, ref in enumerate(chain):
        expected_kind = BlobKind.KEYED_FULL if expected_seq == 0 else BlobKind.KEYED_DELTA
        if (
            ref.seq != expected_seq
            or ref.kind is not expected_kind
            or (ref.subtask, ref.key_group_start, ref.key_group_end)
            != (first.subtask, first.key_group_start, first.key_group_end)
        ):
            raise CorruptCheckpointError(
                f"state {first.state_name!r} of subtask {first.subtask}: chain "
                f"{[(r.kind.value, r.seq, r.key_group_start, r.key_group_end) for r in chain]} "
                "is not one full blob followed by consecutive deltas of the same key groups"
            )
    return tuple(chain)


def restore_backends(
    operator_uid: str,
    key_type: pa.DataType,
    parallelism: int,
    refs: Sequence[BlobRef],
    read_blob: Callable[[BlobRef], pa.Table],
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
        backend.restore(refs, read_blob)
    return backends

"""State descriptors and the on-disk format of state blobs.

A descriptor names a state and fixes its Arrow types: :class:`ValueStateDescriptor` (one
value per key), :class:`ListStateDescriptor` (a list per key) and
:class:`MapStateDescriptor` (a map per key); operator (non-keyed) list state is registered by
name and element type alone. Descriptors are immutable and compared by value: registering the
same name twice with different types is an error.

Blob schemas (Arrow schema metadata carries the key-group hash, ``max_parallelism``, the
state kind and the types, under the ``META_*`` keys below):

* value state: ``key_group int32 not null, key <key_type> not null, value <value_type>``;
* list state:  ``key_group, key, value list<element_type>``;
* map state:   ``key_group, key, value map<map_key_type, map_value_type>``;
* DELTA blobs add ``deleted bool not null``; deleted rows have a null value;
* operator list state (``BlobKind.OPERATOR``, one blob per state per subtask):
  ``value <element_type>``.

Stored values are the Python objects Arrow's ``to_pylist`` yields (lists for list state,
dicts for map state); :func:`python_value`, :func:`to_column` and :func:`from_column` convert
between them and Arrow.

**State TTL** (:class:`StateTtlConfig`, ``ttl=`` on a descriptor). A state with a TTL is
stored under its *storage descriptor* (:func:`ttl_storage`): each value, list element or map
value wrapped as ``struct<value: T, _ttl_updated_ms: int64>``, the time of its last update.
The backend, snapshots, restores and the offline tools see only the storage descriptor; the
operator's views unwrap it (:mod:`spark_ckpt.state.ttl`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any, ClassVar, Final, TypeAlias

import pyarrow as pa

from spark_ckpt.errors import StateError
from spark_ckpt.protocol.state_handles import BlobKind
from spark_ckpt.state.keygroup import HASH_NAME

#: Schema metadata keys of state blobs.
META_STATE_NAME: Final = b"spark_ckpt.state_name"
META_STATE_KIND: Final = b"spark_ckpt.state_kind"
META_KEY_GROUP_HASH: Final = b"spark_ckpt.key_group_hash"
META_MAX_PARALLELISM: Final = b"spark_ckpt.max_parallelism"
META_KEY_TYPE: Final = b"spark_ckpt.key_type"
META_VALUE_TYPE: Final = b"spark_ckpt.value_type"
META_BLOB_KIND: Final = b"spark_ckpt.blob_kind"

#: Blob kinds of keyed state (a chain is one FULL blob followed by DELTA blobs).
KEYED_BLOB_KINDS: Final = (BlobKind.KEYED_FULL, BlobKind.KEYED_DELTA)
#: The keyed states that hold an operator's timers (:mod:`spark_ckpt.state.timers`): the
#: engine registers them, so they do not count as the operator's own registrations when a
#: restore decides which stored states it keeps.
EVENT_TIMERS: Final = "_event_timers"
PROCESSING_TIMERS: Final = "_processing_timers"
TIMER_STATES: Final = frozenset({EVENT_TIMERS, PROCESSING_TIMERS})

#: Exceptions Arrow (or Python) raises when a value does not convert to an Arrow type.
CONVERSION_ERRORS: Final = (
    pa.ArrowInvalid,
    pa.ArrowTypeError,
    TypeError,
    ValueError,
    OverflowError,
)


class StateKind(StrEnum):
    """What a state holds per key (or, for ``OPERATOR_LIST``, per subtask)."""

    VALUE = "value"
    LIST = "list"
    MAP = "map"
    OPERATOR_LIST = "operator_list"


def check_arrow_type(what: str, t: object) -> None:
    """:class:`StateError` unless *t* is an Arrow data type."""
    if not isinstance(t, pa.DataType):
        raise StateError(f"{what} must be a pyarrow DataType, got {t!r}")


def check_state_name(name: object) -> None:
    """:class:`StateError` unless *name* is a non-empty string."""
    if not isinstance(name, str) or not name:
        raise StateError(f"state name must be a non-empty string, got {name!r}")


class TtlUpdate(StrEnum):
    """What refreshes an entry's time to live (Flink's ``StateTtlConfig.UpdateType``)."""

    #: writes only (Flink's default; Spark's TTL)
    ON_CREATE_AND_WRITE = "OnCreateAndWrite"
    #: reads refresh it too
    ON_READ_AND_WRITE = "OnReadAndWrite"


#: The field of a stored TTL value that holds its last update (ms since the epoch).
TTL_UPDATED: Final = "_ttl_updated_ms"


@dataclass(frozen=True)
class StateTtlConfig:
    """A state's time to live (Flink's ``StateTtlConfig``; Spark's ``TTLConfig``): an entry
    (a value, a list element, a map entry) last updated at *t* expires once the processing
    time reaches ``t + ttl_ms``; expired entries are never returned
    (``NeverReturnExpired``). *update*: what refreshes *t*. Build it with :meth:`of`."""

    ttl_ms: int
    update: TtlUpdate = TtlUpdate.ON_CREATE_AND_WRITE

    def __post_init__(self) -> None:
        if isinstance(self.ttl_ms, bool) or not isinstance(self.ttl_ms, int) or self.ttl_ms <= 0:
            raise StateError(f"a state TTL is a positive number of ms, got {self.ttl_ms!r}")
        if not isinstance(self.update, TtlUpdate):
            raise StateError(f"a state TTL's update is a TtlUpdate, got {self.update!r}")

    @staticmethod
    def of(ttl: int | timedelta) -> StateTtlConfig:
        """A TTL of *ttl* (ms, or a ``timedelta``), refreshed by writes."""
        if isinstance(ttl, timedelta):
            ttl = ttl // timedelta(milliseconds=1)
        return StateTtlConfig(ttl)

    def refreshed_on_read(self) -> StateTtlConfig:
        """This TTL, refreshed by reads too (``OnReadAndWrite``)."""
        return StateTtlConfig(self.ttl_ms, TtlUpdate.ON_READ_AND_WRITE)


def ttl_wrapped(value_type: pa.DataType) -> pa.DataType:
    """How a TTL state stores a value of *value_type*: with the time of its last update."""
    return pa.struct([pa.field("value", value_type), pa.field(TTL_UPDATED, pa.int64())])


def is_ttl_wrapped(value_type: pa.DataType) -> bool:
    """Whether *value_type* is a TTL state's stored value (:func:`ttl_wrapped`)."""
    return bool(
        pa.types.is_struct(value_type)
        and value_type.num_fields == 2
        and value_type.field(1).name == TTL_UPDATED
    )


def _check_ttl(ttl: object) -> None:
    if ttl is not None and not isinstance(ttl, StateTtlConfig):
        raise StateError(f"ttl must be a StateTtlConfig, got {ttl!r}")


@dataclass(frozen=True)
class ValueStateDescriptor:
    """One value of type *value_type* per key; *ttl*: its time to live."""

    name: str
    value_type: pa.DataType
    ttl: StateTtlConfig | None = None
    kind: ClassVar[StateKind] = StateKind.VALUE

    def __post_init__(self) -> None:
        check_state_name(self.name)
        check_arrow_type("value_type", self.value_type)
        _check_ttl(self.ttl)

    @property
    def column_type(self) -> pa.DataType:
        """Arrow type of the ``value`` column of this state's blobs."""
        return self.value_type


@dataclass(frozen=True)
class ListStateDescriptor:
    """A list of non-null elements of type *element_type* per key; *ttl*: each element's
    time to live."""

    name: str
    element_type: pa.DataType
    ttl: StateTtlConfig | None = None
    kind: ClassVar[StateKind] = StateKind.LIST

    def __post_init__(self) -> None:
        check_state_name(self.name)
        check_arrow_type("element_type", self.element_type)
        _check_ttl(self.ttl)

    @property
    def column_type(self) -> pa.DataType:
        return pa.list_(self.element_type)


@dataclass(frozen=True)
class MapStateDescriptor:
    """A map from non-null *map_key_type* (a primitive type) to *map_value_type* per key;
    *ttl*: each entry's time to live."""

    name: str
    map_key_type: pa.DataType
    map_value_type: pa.DataType
    ttl: StateTtlConfig | None = None
    kind: ClassVar[StateKind] = StateKind.MAP

    def __post_init__(self) -> None:
        check_state_name(self.name)
        check_arrow_type("map_key_type", self.map_key_type)
        check_arrow_type("map_value_type", self.map_value_type)
        if pa.types.is_nested(self.map_key_type):
            raise StateError(f"map key type must be primitive, got {self.map_key_type}")
        _check_ttl(self.ttl)

    @property
    def column_type(self) -> pa.DataType:
        return pa.map_(self.map_key_type, self.map_value_type)


StateDescriptor: TypeAlias = ValueStateDescriptor | ListStateDescriptor | MapStateDescriptor


def ttl_storage(descriptor: StateDescriptor) -> StateDescriptor:
    """The descriptor a state with a TTL is stored under (see the module docstring): the
    same name and kind, no TTL, each value wrapped by :func:`ttl_wrapped`. A descriptor
    without a TTL is its own."""
    if descriptor.ttl is None:
        return descriptor
    if isinstance(descriptor, ValueStateDescriptor):
        return ValueStateDescriptor(descriptor.name, ttl_wrapped(descriptor.value_type))
    if isinstance(descriptor, ListStateDescriptor):
        return ListStateDescriptor(descriptor.name, ttl_wrapped(descriptor.element_type))
    return MapStateDescriptor(
        descriptor.name, descriptor.map_key_type, ttl_wrapped(descriptor.map_value_type)
    )


def stores_ttl(descriptor: StateDescriptor) -> bool:
    """Whether *descriptor* (as stored) holds a TTL state's wrapped values."""
    if isinstance(descriptor, ValueStateDescriptor):
        return is_ttl_wrapped(descriptor.value_type)
    if isinstance(descriptor, ListStateDescriptor):
        return is_ttl_wrapped(descriptor.element_type)
    return is_ttl_wrapped(descriptor.map_value_type)


def descriptor_from_column(name: str, kind: StateKind, column_type: pa.DataType) -> StateDescriptor:
    """The descriptor whose blobs have a ``value`` column of *column_type*; StateError if
    the type does not fit *kind*."""
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


def to_column(kind: StateKind, values: Iterable[Any]) -> list[Any]:
    """Stored Python values -> what ``pa.array`` takes for the value column."""
    if kind is StateKind.MAP:
        return [None if m is None else list(m.items()) for m in values]
    return list(values)


def from_column(kind: StateKind, column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A value column -> stored Python values."""
    values: list[Any] = column.to_pylist()
    if kind is StateKind.MAP:
        return [None if m is None else dict(m) for m in values]
    return values


def python_value(value: Any, arrow_type: pa.DataType, what: str) -> Any:
    """*value* as the Python object Arrow yields for *arrow_type*; StateError (naming it
    *what*) if it does not convert."""
    try:
        return pa.scalar(value, type=arrow_type).as_py()
    except CONVERSION_ERRORS as e:
        raise StateError(f"{what} {value!r} is not a valid {arrow_type}") from e

"""How one keyed state holds its values: as Python objects, or in Arrow arrays.

A :class:`~spark_ckpt.state.backends.heap.HeapStateTable` maps, per key group, each key to a
*stored* form of its value, which its value store turns into Python values (the per-record
views) and into Arrow columns (the vectorized API, snapshots) and back:

* :class:`PythonValues`: the stored form is the Python value Arrow's ``to_pylist`` yields
  (a list for list state, a dict for map state). Cheap for primitive values and for the
  per-record views, which change lists and maps in place.
* :class:`ArrowValues`: the stored form is a slot (an ``int``) in an append-only set of Arrow
  arrays (the *arena*). For value state of a nested type (a list of windows, a struct, a
  list of timers), whose conversion to Python objects and back costs far more than the
  work done on them: a vectorized read is a ``take`` and a vectorized write appends the
  array as is, O(keys) in C plus one dict update per key. Overwritten values stay in the
  arena as garbage until :meth:`ArrowValues.compact` copies the live ones into one array,
  which the table asks for once the arena holds more than twice its keys (amortized
  O(1) per write).

Both are owned by one table and, like it, used from one thread.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from itertools import islice
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from spark_ckpt.state.descriptor import StateDescriptor, StateKind, from_column, to_column

#: Positions into an array (a permutation of them, or a selection).
Positions = npt.NDArray[np.int64]
#: An arena holding fewer slots than this is never compacted.
_COMPACT_FLOOR: Final = 4096
#: An arena of more arrays than this is combined into one when next compacted.
_MAX_CHUNKS: Final = 32


class ValueStore(Protocol):
    """The conversions of one keyed state's values (see the module docstring)."""

    def python(self, stored: Any) -> Any:
        """The Python value of a *stored* form (None: None)."""
        ...

    def stored(self, value: Any) -> Any:
        """The stored form of a Python *value* (not None)."""
        ...

    def column(self, stored: list[Any]) -> pa.Array:
        """The values of *stored* forms (None: null) as one Arrow array of the state's
        column type. O(len(stored))."""
        ...

    def stored_many(self, column: pa.Array, order: Positions | None = None) -> list[Any]:
        """The stored forms of the values of *column* (of the column type; null: None), in
        the order of the positions *order* if given. O(len(column))."""
        ...

    def nbytes(self) -> int:
        """Bytes held outside the stored forms themselves (the arena's arrays)."""
        ...

    def compact(self, groups: dict[int, dict[Any, Any]], live: int) -> None:
        """Reclaim what overwritten values hold, if worth it; *groups* are the table's
        entries (rewritten in place when their stored forms change), *live* their number."""
        ...


class PythonValues:
    """Values stored as Python objects (see the module docstring)."""

    def __init__(self, kind: StateKind, column_type: pa.DataType) -> None:
        self.kind = kind
        self.column_type = column_type

    def python(self, stored: Any) -> Any:
        return stored

    def stored(self, value: Any) -> Any:
        return value

    def column(self, stored: list[Any]) -> pa.Array:
        return pa.array(to_column(self.kind, stored), type=self.column_type)

    def stored_many(self, column: pa.Array, order: Positions | None = None) -> list[Any]:
        if order is not None:
            column = column.take(pa.array(order))
        return from_column(self.kind, column)

    def nbytes(self) -> int:
        return 0

    def compact(self, groups: dict[int, dict[Any, Any]], live: int) -> None:
        return None


class ArrowValues:
    """Values stored as slots of an arena of Arrow arrays (see the module docstring)."""

    def __init__(self, column_type: pa.DataType) -> None:
        self.column_type = column_type
        self._chunks: list[pa.Array] = []
        #: the first slot of each array of the arena
        self._starts: list[int] = []
        #: slots of the arena's arrays, then of the values stored one by one (per-record
        #: writes, pending until a vectorized read or write appends them as one array)
        self._size = 0
        self._pending: list[Any] = []

    @property
    def _flushed(self) -> int:
        return self._size - len(self._pending)

    def python(self, stored: Any) -> Any:
        if stored is None:
            return None
        slot: int = stored
        flushed = self._flushed
        if slot >= flushed:
            return self._pending[slot - flushed]
        chunk = bisect.bisect_right(self._starts, slot) - 1
        return self._chunks[chunk][slot - self._starts[chunk]].as_py()

    def stored(self, value: Any) -> Any:
        self._pending.append(value)
        self._size += 1
        return self._size - 1

    def _append(self, array: pa.Array) -> int:
        """Append *array* to the arena; its first slot."""
        self._flush()
        first = self._size
        if len(array):
            self._chunks.append(array)
            self._starts.append(first)
            self._size += len(array)
        return first

    def _flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self._size -= len(pending)
            self._append(pa.array(pending, type=self.column_type))

    def column(self, stored: list[Any]) -> pa.Array:
        self._flush()
        slots = pa.array(stored, type=pa.int64())
        if not self._chunks:
            return pa.nulls(len(stored), self.column_type)
        if len(self._chunks) == 1:
            return self._chunks[0].take(slots)
        positions = slots.fill_null(-1).to_numpy()
        which = np.searchsorted(np.asarray(self._starts), positions, side="right") - 1
        order = np.argsort(which, kind="stable")
        bounds = np.searchsorted(which[order], np.arange(-1, len(self._chunks) + 1))
        parts = [pa.nulls(int(bounds[1] - bounds[0]), self.column_type)]
        for c, chunk in enumerate(self._chunks):
            picked = order[bounds[c + 1] : bounds[c + 2]]
            parts.append(chunk.take(pa.array(positions[picked] - self._starts[c])))
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return pa.concat_arrays(parts).take(pa.array(inverse))

    def stored_many(self, column: pa.Array, order: Positions | None = None) -> list[Any]:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if column.type != self.column_type:
            column = column.cast(self.column_type)
        first = self._append(column)  # as given: *order* only orders the slots
        positions = np.arange(len(column), dtype=np.int64) if order is None else order
        slots: list[Any] = (positions + first).tolist()
        if column.null_count:
            valid = column.is_valid().to_numpy(zero_copy_only=False)[positions]
            for i in np.flatnonzero(~valid).tolist():
                slots[i] = None
        return slots

    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._chunks)

    def compact(self, groups: dict[int, dict[Any, Any]], live: int) -> None:
        self._flush()
        if self._size <= 2 * live + _COMPACT_FLOOR and len(self._chunks) <= _MAX_CHUNKS:
            return
        order = sorted(groups)
        live_values = self.column([s for kg in order for s in groups[kg].values()])
        self._chunks, self._starts, self._size = [], [], 0
        slot = self._append(live_values)
        for kg in order:
            group = groups[kg]
            groups[kg] = dict(zip(group, range(slot, slot + len(group)), strict=True))
            slot += len(group)


def value_store(descriptor: StateDescriptor) -> ValueStore:
    """The value store of a state of *descriptor*: Arrow for value state of a nested type,
    Python otherwise (see the module docstring)."""
    if descriptor.kind is StateKind.VALUE and pa.types.is_nested(descriptor.column_type):
        return ArrowValues(descriptor.column_type)
    return PythonValues(descriptor.kind, descriptor.column_type)


def migrate_groups(
    groups: dict[int, dict[Any, Any]],
    old: ValueStore,
    new: ValueStore,
    migration: Callable[[pa.Array], pa.Array],
) -> None:
    """Rewrite every entry of *groups* from *old*'s stored forms to *new*'s, through
    *migration* (a function of an Arrow column). One Arrow column for all key groups."""
    order = [kg for kg in sorted(groups) if groups[kg]]
    column = migration(old.column([s for kg in order for s in groups[kg].values()]))
    migrated = iter(new.stored_many(column))
    for kg in order:
        group = groups[kg]
        groups[kg] = dict(zip(group, islice(migrated, len(group)), strict=True))

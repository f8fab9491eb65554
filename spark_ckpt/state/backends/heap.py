"""The ``hashmap`` state backend's storage: keyed state in the host's memory.

:class:`HeapStateTable` keeps, per key group, a Python ``dict`` from key to the stored form
of its value, which the state's value store (:mod:`~spark_ckpt.state.backends.value_store`)
chooses: the Python value itself, or a slot in an arena of Arrow arrays for value state of a
nested type. The per-record API is a dict access; the vectorized one does one C-level
``map(dict.get)`` / ``dict.update`` per key group of a batch (no per-row Python loop, except
for the rare null values that clear keys). Flink's ``HashMapStateBackend``: fastest while
the state fits the host's memory, bounded by it.

Value state of a primitive type under integer keys does not live here but in the compact
columns of :mod:`~spark_ckpt.state.backends.columnar`; :class:`HeapStorage` chooses the
layout per state, and moves a state between them when a schema change asks for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import compress, pairwise, repeat
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from spark_ckpt.protocol.state_handles import StorageMetrics
from spark_ckpt.state.backends import columnar
from spark_ckpt.state.backends.table import (
    KeyRouting,
    StateStorage,
    StateTable,
    TableStats,
)
from spark_ckpt.state.backends.value_store import ValueStore, migrate_groups, value_store
from spark_ckpt.state.descriptor import StateDescriptor

#: A rough size of one dict entry with its key and value objects, for the metrics.
_ENTRY_BYTES = 120


class HeapStateTable(StateTable):
    """Storage of one keyed state in memory (see the module docstring)."""

    def __init__(self, descriptor: StateDescriptor, key_type: pa.DataType | None = None) -> None:
        super().__init__(descriptor)
        #: the type of the keys (None: as Arrow infers it from the Python keys)
        self.key_type = key_type
        self.groups: dict[int, dict[Any, Any]] = {}
        self.values: ValueStore = value_store(descriptor)

    def group(self, key_group: int) -> dict[Any, Any]:
        """The entries of *key_group*, created empty on first use."""
        g = self.groups.get(key_group)
        if g is None:
            g = self.groups[key_group] = {}
        return g

    # -- per record ---------------------------------------------------------------------------
    def lookup(self, key_group: int, key: Any) -> Any:
        g = self.groups.get(key_group)
        return None if g is None else self.values.python(g.get(key))

    def store(self, key_group: int, key: Any, value: Any) -> None:
        self.group(key_group)[key] = self.values.stored(value)

    def remove(self, key_group: int, key: Any) -> None:
        g = self.groups.get(key_group)
        if g is not None:
            g.pop(key, None)

    # -- vectorized -----------------------------------------------------------------------------
    def read(self, routing: KeyRouting) -> pa.Array:
        out: list[Any] = []
        keys = routing.sorted_keys
        for kg, begin, end in routing.segments():
            group = self.groups.get(kg)
            if group:
                out.extend(map(group.get, keys[begin:end]))
            else:
                out.extend([None] * (end - begin))
        return self.values.column(out)

    def write(self, routing: KeyRouting, values: pa.Array) -> None:
        stored = self.values.stored_many(values)
        keys = routing.sorted_keys
        if not values.null_count:
            for kg, begin, end in routing.segments():
                self.group(kg).update(zip(keys[begin:end], stored[begin:end], strict=True))
            return
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        keep, drop = valid.tolist(), (~valid).tolist()
        for kg, begin, end in routing.segments():
            segment, group = keys[begin:end], self.group(kg)
            group.update(
                zip(
                    compress(segment, keep[begin:end]),
                    compress(stored[begin:end], keep[begin:end]),
                    strict=True,
                )
            )
            deque(map(group.pop, compress(segment, drop[begin:end]), repeat(None)), maxlen=0)

    def delete(self, routing: KeyRouting) -> None:
        keys = routing.sorted_keys
        for kg, begin, end in routing.segments():
            group = self.groups.get(kg)
            if group:
                deque(map(group.pop, keys[begin:end], repeat(None)), maxlen=0)

    def read_python(self, routing: KeyRouting) -> list[Any]:
        found: list[Any] = [None] * len(routing.order)
        keys = routing.sorted_keys
        for kg, begin, end in routing.segments():
            group = self.groups.get(kg)
            if group:
                python = self.values.python
                for i in range(begin, end):
                    found[i] = python(group.get(keys[i]))
        return found

    def write_python(self, routing: KeyRouting, entries: list[Any]) -> None:
        keys = routing.sorted_keys
        for kg, begin, end in routing.segments():
            group = self.group(kg)
            for i in range(begin, end):
                if entries[i] is None:
                    group.pop(keys[i], None)
                else:
                    group[keys[i]] = self.values.stored(entries[i])

    # -- snapshots and restores -----------------------------------------------------------------
    def entries(self) -> tuple[npt.NDArray[np.int64], pa.Array, pa.Array]:
        groups = [kg for kg in sorted(self.groups) if self.groups[kg]]
        keys: list[Any] = []
        values: list[Any] = []
        sizes: list[int] = []
        for kg in groups:
            group = self.groups[kg]
            keys.extend(group)
            values.extend(group.values())
            sizes.append(len(group))
        kgs = np.repeat(np.asarray(groups, dtype=np.int64), sizes)
        return kgs, pa.array(keys, type=self.key_type), self.values.column(values)

    def current(self, groups: list[int], keys: list[list[Any]]) -> tuple[pa.Array, list[bool]]:
        values: list[Any] = []
        member: list[bool] = []
        for kg, segment in zip(groups, keys, strict=True):
            group = self.groups.get(kg, {})
            values.extend(map(group.get, segment))
            member.extend(map(group.__contains__, segment))
        return self.values.column(values), member

    def load(
        self,
        key_groups: npt.NDArray[np.int64],
        keys: pa.Array,
        values: pa.Array,
        deleted: npt.NDArray[np.bool_] | None,
    ) -> None:
        py_keys = keys.to_pylist()
        stored = self.values.stored_many(values)
        starts = np.flatnonzero(np.diff(key_groups)) + 1
        bounds = [0, *starts.tolist(), len(key_groups)]
        dead = None if deleted is None else deleted.tolist()
        for begin, end in pairwise(bounds):
            if begin == end:
                continue
            group = self.group(int(key_groups[begin]))
            seg_keys, seg_values = py_keys[begin:end], stored[begin:end]
            if dead is None:
                group.update(zip(seg_keys, seg_values, strict=True))
                continue
            gone = dead[begin:end]
            live = [not d for d in gone]
            group.update(zip(compress(seg_keys, live), compress(seg_values, live), strict=True))
            for k in compress(seg_keys, gone):
                group.pop(k, None)

    def migrate(
        self, migration: Callable[[pa.Array], pa.Array], descriptor: StateDescriptor
    ) -> None:
        new = value_store(descriptor)
        migrate_groups(self.groups, self.values, new, migration)
        self.values, self.descriptor = new, descriptor

    def count(self) -> int:
        return sum(len(g) for g in self.groups.values())

    def is_empty(self) -> bool:
        return not any(self.groups.values())

    def stats(self) -> TableStats:
        entries = self.count()
        return TableStats(entries, entries * _ENTRY_BYTES + self.values.nbytes(), 0)

    def compact(self) -> None:
        self.values.compact(self.groups, self.count())


class HeapStorage(StateStorage):
    """The ``hashmap`` backend: every table in the host's memory, value state of a primitive
    type under integer keys (of *key_type*) in the compact columnar layout
    (:class:`~spark_ckpt.state.backends.columnar.ColumnarStateTable`), the rest in dicts."""

    name = "hashmap"

    def __init__(self, key_type: pa.DataType) -> None:
        self.key_type = key_type

    def new_table(self, descriptor: StateDescriptor) -> StateTable:
        if columnar.holds(descriptor, self.key_type):
            return columnar.ColumnarStateTable(descriptor, self.key_type)
        return HeapStateTable(descriptor, self.key_type)

    def migrate(
        self,
        table: StateTable,
        migration: Callable[[pa.Array], pa.Array],
        descriptor: StateDescriptor,
    ) -> StateTable:
        """The columnar layout holds the migrated values if it holds both descriptors;
        otherwise the entries move into a new table of the other layout. O(entries)."""
        if isinstance(table, columnar.ColumnarStateTable) == columnar.holds(
            descriptor, self.key_type
        ):
            table.migrate(migration, descriptor)
            return table
        kgs, keys, values = table.entries()
        moved = self.new_table(descriptor)
        moved.load(kgs, keys, migration(values), None)
        moved.changes, moved.segment = table.changes, table.segment
        return moved

    def stats(self, tables: list[StateTable]) -> StorageMetrics:
        parts = [t.stats() for t in tables]
        return StorageMetrics(
            self.name, sum(p.entries for p in parts), sum(p.memory_bytes for p in parts), 0
        )

"""The contract of a keyed state's storage, which every state backend implements.

A :class:`StateTable` holds the entries of one keyed state of one subtask: per key group,
key -> value. The keyed state backend (:class:`~spark_ckpt.state.backend.KeyedStateBackend`)
validates and routes keys (:class:`KeyRouting`: hashed, range-checked and sorted by key
group once per batch) and hands the table whole key-group-sorted batches; the table only
stores. Two implementations:

* :class:`~spark_ckpt.state.backends.heap.HeapStateTable` (``hashmap``): Python ``dict`` per
  key group, in the host's memory;
* :class:`~spark_ckpt.state.backends.rocksdb.RocksDBStateTable` (``rocksdb``): one column
  family of an embedded RocksDB on the executor's local disk, keys prefixed by their key
  group (so a key group is a contiguous range), values in an explicit byte encoding
  (:mod:`~spark_ckpt.state.backends.codecs`).

What a table stores never leaves the process in its own form: snapshots read it as Arrow
tables (:meth:`StateTable.entries`, :meth:`StateTable.current`) and restores write Arrow
tables into it (:meth:`StateTable.load`), so a checkpoint's format does not depend on the
backend (a savepoint of one restores on the other).

Change tracking (what the next incremental snapshot and the executors' changelog segment
write) is the same for every table and lives here: :meth:`StateTable.log` for vectorized
changes (O(1) per call), :meth:`StateTable.touch_one` for per-record ones. Tables are used
from the task thread only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from spark_ckpt.protocol.state_handles import StorageMetrics
from spark_ckpt.state.descriptor import StateDescriptor, to_column
from spark_ckpt.state.snapshot.changes import LOG_COLUMNS, StateChanges, log_table


@dataclass(frozen=True)
class KeyRouting:
    """A key array sorted by key group: the keys of ``groups[j]`` are sorted positions
    ``bounds[j]:bounds[j + 1]``; ``order[s]`` is the input position of sorted position ``s``.
    Built once per batch by the backend (O(keys) in C); the sorted keys as Arrow
    (:attr:`sorted_array`) or Python values (:attr:`sorted_keys`) are made on first use."""

    source: object
    array: pa.Array
    key_groups: npt.NDArray[np.integer]
    groups: list[int]
    bounds: list[int]
    order: npt.NDArray[np.int64]

    def segments(self) -> Iterator[tuple[int, int, int]]:
        """(key group, begin, end) of each run of the sorted keys."""
        return zip(self.groups, self.bounds[:-1], self.bounds[1:], strict=True)

    def inverse(self) -> npt.NDArray[np.int64]:
        """Per input position, its position among the sorted keys."""
        inverse = np.empty_like(self.order)
        inverse[self.order] = np.arange(len(self.order), dtype=np.int64)
        return inverse

    @cached_property
    def sorted_array(self) -> pa.Array:
        """The keys in key group order, as Arrow."""
        return self.array.take(pa.array(self.order))

    @cached_property
    def sorted_groups(self) -> npt.NDArray[np.int64]:
        """The key group of each sorted key."""
        return np.asarray(self.key_groups, dtype=np.int64)[self.order]

    @cached_property
    def sorted_keys(self) -> list[Any]:
        """The keys in key group order, as Python values."""
        keys: list[Any] = self.sorted_array.to_pylist()
        return keys


@dataclass(frozen=True)
class TableStats:
    """What one table holds: entries, and bytes in memory and on local disk (estimates
    where the backend only estimates)."""

    entries: int
    memory_bytes: int
    disk_bytes: int


class StateTable(ABC):
    """Storage of one keyed state (see the module docstring). Every batch method takes keys
    sorted by key group (a :class:`KeyRouting`) and, where it takes or returns values,
    values in that sorted order. Keys given to :meth:`write` and :meth:`write_python` are
    unique (the backend keeps a repeated key's last occurrence). Values are Arrow columns of
    the descriptor's column type (null: no entry) or, for the per-record API, the Python
    values Arrow's ``to_pylist`` yields (lists for list state, dicts for map state)."""

    def __init__(self, descriptor: StateDescriptor) -> None:
        self.descriptor = descriptor
        #: the changes since the last snapshot (taken by the snapshot strategy)
        self.changes = StateChanges()
        #: the changes since the last changelog segment (subtasks on the executors)
        self.segment = StateChanges()

    # -- per record ---------------------------------------------------------------------------
    @abstractmethod
    def lookup(self, key_group: int, key: Any) -> Any:
        """The Python value of *key* (None: no entry). The object may be the stored one:
        replace it with :meth:`store`, never mutate it in place. O(1)."""

    @abstractmethod
    def store(self, key_group: int, key: Any, value: Any) -> None:
        """Set the Python value (not None) of *key*; the caller records the change. O(1)."""

    @abstractmethod
    def remove(self, key_group: int, key: Any) -> None:
        """Remove *key*'s entry, if any; the caller records the change. O(1)."""

    # -- vectorized -----------------------------------------------------------------------------
    @abstractmethod
    def read(self, routing: KeyRouting) -> pa.Array:
        """The value of each sorted key (null: none) as one column. O(keys)."""

    @abstractmethod
    def write(self, routing: KeyRouting, values: pa.Array) -> None:
        """Set the value of each sorted (unique) key; a null value removes it. O(keys)."""

    @abstractmethod
    def delete(self, routing: KeyRouting) -> None:
        """Remove the entry of each sorted key. O(keys)."""

    @abstractmethod
    def read_python(self, routing: KeyRouting) -> list[Any]:
        """The Python value of each sorted key (None: none). O(keys), per key in Python."""

    @abstractmethod
    def write_python(self, routing: KeyRouting, entries: list[Any]) -> None:
        """Set the Python value of each sorted (unique) key; None removes it."""

    # -- snapshots and restores -----------------------------------------------------------------
    @abstractmethod
    def entries(self) -> tuple[npt.NDArray[np.int64], pa.Array, pa.Array]:
        """Every entry as (key groups, keys, values), sorted by key group. O(entries)."""

    @abstractmethod
    def current(self, groups: list[int], keys: list[list[Any]]) -> tuple[pa.Array, list[bool]]:
        """For the keys ``keys[j]`` of each key group ``groups[j]``, concatenated: their
        values (null: none) and whether each has an entry. O(keys)."""

    @abstractmethod
    def load(
        self,
        key_groups: npt.NDArray[np.int64],
        keys: pa.Array,
        values: pa.Array,
        deleted: npt.NDArray[np.bool_] | None,
    ) -> None:
        """Apply rows of a restored blob, sorted by key group: set each key's value, or
        remove it where *deleted*. Records no change (the restore does). O(rows)."""

    @abstractmethod
    def migrate(
        self, migration: Callable[[pa.Array], pa.Array], descriptor: StateDescriptor
    ) -> None:
        """Rewrite every value with *migration* (a function of an Arrow column) and make
        *descriptor* the table's descriptor. O(entries)."""

    @abstractmethod
    def count(self) -> int:
        """Number of keys with an entry; exact when :attr:`exact_count`, else an estimate."""

    @property
    def exact_count(self) -> bool:
        """Whether :meth:`count` is exact (a snapshot may then take a FULL blob from the
        change log when every key changed)."""
        return True

    @abstractmethod
    def is_empty(self) -> bool:
        """Whether no key has an entry (exact)."""

    @abstractmethod
    def stats(self) -> TableStats:
        """What the table holds (for metrics); cheap."""

    def compact(self) -> None:
        """Reclaim what overwritten values hold, if worth it (after a batch of writes)."""
        return None

    def column(self, values: list[Any]) -> pa.Array:
        """Python values (None: null) as a column of the descriptor's column type."""
        return pa.array(to_column(self.descriptor.kind, values), type=self.descriptor.column_type)

    # -- changes ----------------------------------------------------------------------------------
    def log(self, key_groups: npt.NDArray[np.integer], keys: pa.Array, values: pa.Array) -> None:
        """Record a vectorized change (a null value clears its key)."""
        self.log_table(log_table(key_groups, keys, values))

    def log_table(self, table: pa.Table) -> None:
        """Record a vectorized change given as a change log's table."""
        live = self.count()
        self.changes.append_table(table, live)
        self.segment.append_table(table, live)

    def log_delta(self, delta: pa.Table) -> None:
        """Record the rows of a DELTA blob of this state (columns ``key_group, key, value,
        deleted``; a deleted row has a null value), just applied to it, as a vectorized
        change."""
        self.log_table(pa.table(delta.columns[:3], names=list(LOG_COLUMNS)))

    def touch_one(self, key_group: int, key: Any) -> None:
        """Record a per-record change of *key*."""
        self.changes.touch(key_group, key)
        self.segment.touch(key_group, key)


class StateStorage(ABC):
    """Where one subtask backend's keyed states are stored: the factory of its tables and
    the owner of what they share (a RocksDB instance, its local directory). Created by
    :meth:`~spark_ckpt.state.backends.spec.StateBackendSpec.storage` where the subtask runs;
    :meth:`close` is called once when the backend is dropped (idempotent) and removes what
    the storage put on local disk."""

    #: the backend's name, as ``state.backend.type`` spells it
    name: str

    @abstractmethod
    def new_table(self, descriptor: StateDescriptor) -> StateTable:
        """An empty table for keyed state *descriptor* (a name this storage has not given
        a table yet)."""

    @abstractmethod
    def stats(self, tables: list[StateTable]) -> StorageMetrics:
        """What *tables* (this storage's) hold; cheap."""

    def migrate(
        self,
        table: StateTable,
        migration: Callable[[pa.Array], pa.Array],
        descriptor: StateDescriptor,
    ) -> StateTable:
        """*table* (this storage's) with every value rewritten by *migration* and
        *descriptor* as its descriptor: *table* itself (:meth:`StateTable.migrate`), or a new
        table where the storage keeps the new descriptor in another layout. O(entries)."""
        table.migrate(migration, descriptor)
        return table

    def close(self) -> None:
        """Release the storage's resources (idempotent)."""
        return None

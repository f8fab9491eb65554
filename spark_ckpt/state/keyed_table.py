"""The storage of one keyed state in the backend: per key group, key -> stored value (its form
chosen by the state's value store, :mod:`spark_ckpt.state.value_store`), with the changes
since the last snapshot and since the last changelog segment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from spark_ckpt.state.descriptor import StateDescriptor
from spark_ckpt.state.snapshot.changes import LOG_COLUMNS, StateChanges, log_table
from spark_ckpt.state.value_store import ValueStore, migrate_groups, value_store


class KeyedStateTable:
    """Storage of one keyed state: per key group, key -> stored value, the changes since the
    last snapshot and those since the last changelog segment (implements
    :class:`~spark_ckpt.state.snapshot.changes.TrackedState`). Stored values are turned
    into Python values and Arrow columns by :attr:`values` only: read them with
    :meth:`lookup` / :meth:`column`, write them with :meth:`store` / :meth:`stored_many`."""

    def __init__(self, descriptor: StateDescriptor) -> None:
        self.descriptor = descriptor
        self.groups: dict[int, dict[Any, Any]] = {}
        self.changes = StateChanges()
        self.segment = StateChanges()
        self.values: ValueStore = value_store(descriptor)

    def group(self, key_group: int) -> dict[Any, Any]:
        """The entries of *key_group*, created empty on first use."""
        g = self.groups.get(key_group)
        if g is None:
            g = self.groups[key_group] = {}
        return g

    # -- values ------------------------------------------------------------------------------
    def lookup(self, key_group: int, key: Any) -> Any:
        """The Python value of *key* (None: no entry)."""
        g = self.groups.get(key_group)
        return None if g is None else self.values.python(g.get(key))

    def store(self, key_group: int, key: Any, value: Any) -> None:
        """Set the Python value (not None) of *key* (the caller records the change)."""
        self.group(key_group)[key] = self.values.stored(value)

    def column(self, stored: list[Any]) -> pa.Array:
        """The values of *stored* forms (None: null) as an Arrow array of the column type."""
        return self.values.column(stored)

    def stored_many(
        self, column: pa.Array, order: npt.NDArray[np.int64] | None = None
    ) -> list[Any]:
        """Stored forms of an Arrow column's values (null: None), for the groups' dicts;
        in the order of the positions *order*, if given."""
        return self.values.stored_many(column, order)

    def compact(self) -> None:
        """Let the value store reclaim overwritten values (after a batch of writes)."""
        self.values.compact(self.groups, self.count())

    def migrate(
        self, migration: Callable[[pa.Array], pa.Array], descriptor: StateDescriptor
    ) -> None:
        """Rewrite every value with *migration* (one Arrow column for all key groups) and
        make *descriptor* the table's descriptor."""
        new = value_store(descriptor)
        migrate_groups(self.groups, self.values, new, migration)
        self.values, self.descriptor = new, descriptor

    # -- changes -----------------------------------------------------------------------------
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

    def count(self) -> int:
        return sum(len(g) for g in self.groups.values())

"""The storage of one keyed state in the backend: per key group, key -> value, with the changes
since the last snapshot and since the last changelog segment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from spark_ckpt.state.descriptor import StateDescriptor
from spark_ckpt.state.snapshot.changes import LOG_COLUMNS, StateChanges, log_table


@dataclass
class KeyedStateTable:
    """Storage of one keyed state: per key group, key -> value, the changes since the last
    snapshot and those since the last changelog segment (implements
    :class:`~spark_ckpt.state.snapshot.changes.TrackedState`)."""

    descriptor: StateDescriptor
    groups: dict[int, dict[Any, Any]] = field(default_factory=dict)
    changes: StateChanges = field(default_factory=StateChanges)
    segment: StateChanges = field(default_factory=StateChanges)

    def group(self, key_group: int) -> dict[Any, Any]:
        """The entries of *key_group*, created empty on first use."""
        g = self.groups.get(key_group)
        if g is None:
            g = self.groups[key_group] = {}
        return g

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

"""The change log of a keyed state: what changed since the last snapshot (and since the last
changelog segment), recorded on every mutation, so that a snapshot reads what changed —
O(keys changed), deduplicated with Arrow kernels — not the whole state.

:class:`StateChanges` is the log; :class:`TrackedState` is what the snapshot side reads of
one keyed state (the backend's storage,
:class:`~spark_ckpt.state.backends.table.StateTable`, implements it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from spark_ckpt.state.descriptor import StateDescriptor

#: Column names of a change log (and, with ``deleted``, of a DELTA blob).
LOG_COLUMNS: Final = ("key_group", "key", "value")


def last_occurrences(keys: pa.Array) -> npt.NDArray[np.int64]:
    """Positions of the last occurrence of each distinct key of *keys*, ascending."""
    if len(keys) == 0:
        return np.empty(0, dtype=np.int64)
    codes = keys.dictionary_encode().indices.to_numpy()
    last = np.full(int(codes.max()) + 1, -1, dtype=np.int64)
    np.maximum.at(last, codes, np.arange(len(codes), dtype=np.int64))
    return np.sort(last)


def log_table(key_groups: npt.NDArray[np.integer], keys: pa.Array, values: pa.Array) -> pa.Table:
    """A vectorized change as a change log records it (columns :data:`LOG_COLUMNS`)."""
    return pa.table([pa.array(key_groups, type=pa.int32()), keys, values], names=list(LOG_COLUMNS))


class StateChanges:
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
    outgrows ``2 *`` the state's live keys, so memory stays proportional to the state.
    Compacting keeps the meaning, so it happens in place and once: every later reader of the
    same changes (the snapshot's delta, the changelog's segment, the merge at a completion)
    finds the log compacted."""

    __slots__ = ("compact", "distinct", "keys", "log", "log_rows")

    def __init__(self) -> None:
        self.log: list[pa.Table] = []
        self.log_rows = 0
        #: at least this many distinct keys are in the log (its rows when last compacted)
        self.distinct = 0
        #: the log is one table with one row per key
        self.compact = True
        self.keys: dict[int, set[Any]] = {}

    def __bool__(self) -> bool:
        return bool(self.log_rows or self.keys)

    def append_log(
        self,
        key_groups: npt.NDArray[np.integer],
        keys: pa.Array,
        values: pa.Array,
        live_rows: int,
    ) -> None:
        """Record a vectorized change of *keys* to *values* (a null value clears its key);
        *live_rows* is the state's current number of keys (it bounds the log)."""
        self.append_table(log_table(key_groups, keys, values), live_rows)

    def append_table(self, table: pa.Table, live_rows: int) -> None:
        """Record a vectorized change as a :func:`log_table`."""
        self.log.append(table)
        self.log_rows += table.num_rows
        self.compact = False
        if self.log_rows > 65_536 + 2 * live_rows and len(self.log) > 1:
            self.compacted_log()

    def touch(self, key_group: int, key: Any) -> None:
        """Record a per-record change of *key* (its value is read at snapshot time)."""
        keys = self.keys.get(key_group)
        if keys is None:
            keys = self.keys[key_group] = set()
        keys.add(key)

    def compacted_log(self) -> pa.Table:
        """The log with one row per key: its last occurrence (the log is replaced by it)."""
        if self.compact and len(self.log) == 1:
            return self.log[0]
        table = pa.concat_tables(self.log).combine_chunks() if len(self.log) > 1 else self.log[0]
        positions = last_occurrences(table.column("key").combine_chunks())
        if len(positions) != table.num_rows:
            table = table.take(pa.array(positions))
        self.log = [table]
        self.log_rows = self.distinct = table.num_rows
        self.compact = True
        return table

    def key_count(self) -> int:
        """The number of distinct keys changed (written or cleared). Compacts the log (see
        :meth:`compacted_log`): O(log rows + keys of the per-record API)."""
        logged = self.compacted_log() if self.log else None
        touched = sum(len(keys) for keys in self.keys.values())
        if logged is None or not touched:
            return touched + (0 if logged is None else logged.num_rows)
        groups, keys = logged.column("key_group").to_pylist(), logged.column("key").to_pylist()
        seen = set(zip(groups, keys, strict=True))
        seen.update((kg, k) for kg, keys in self.keys.items() for k in keys)
        return len(seen)

    def compacted(self) -> StateChanges:
        """These changes with the log deduplicated (one row per key) when it holds several
        tables: compacted in place (see the class docstring), so it is this object."""
        if len(self.log) > 1:
            self.compacted_log()
        return self

    def bounded(self) -> StateChanges:
        """These changes, compacted when the log holds more than twice as many rows as it
        has distinct keys at least (plus a margin): merging changes again and again
        (:meth:`then`) then costs time in proportion to what is merged, and memory in
        proportion to the keys changed."""
        if self.log_rows > 65_536 + 2 * self.distinct and len(self.log) > 1:
            self.compacted_log()
        return self

    def then(self, later: StateChanges) -> StateChanges:
        """These changes followed by *later* ones (neither is modified)."""
        merged = StateChanges()
        merged.log = [*self.log, *later.log]
        merged.log_rows = self.log_rows + later.log_rows
        merged.distinct = max(self.distinct, later.distinct)
        merged.compact = (not self.log and later.compact) or (not later.log and self.compact)
        for source in (self.keys, later.keys):
            for kg, keys in source.items():
                merged.keys.setdefault(kg, set()).update(keys)
        return merged


class TrackedState(Protocol):
    """What a snapshot reads of one keyed state (the backend's storage implements it): its
    descriptor, its entries, the current values of given keys, and the changes since the
    last snapshot, which the strategy takes (replaces by a fresh :class:`StateChanges`) when
    it snapshots."""

    @property
    def descriptor(self) -> StateDescriptor: ...

    def entries(self) -> tuple[npt.NDArray[np.int64], pa.Array, pa.Array]:
        """Every entry as (key groups, keys, values), sorted by key group."""
        ...

    def current(self, groups: list[int], keys: list[list[Any]]) -> tuple[pa.Array, list[bool]]:
        """The values (null: none) of the keys ``keys[j]`` of each group ``groups[j]``,
        concatenated, and whether each has an entry."""
        ...

    @property
    def exact_count(self) -> bool:
        """Whether :meth:`count` is exact."""
        ...

    changes: StateChanges
    #: the changes since the last changelog segment (subtasks on the executors:
    #: :mod:`spark_ckpt.runtime.image_history` reads it and starts the next one)
    segment: StateChanges

    def count(self) -> int:
        """Number of keys with an entry."""
        ...


def start_segment(keyed: Mapping[str, TrackedState]) -> None:
    """Start a new changelog segment of the *keyed* states: forget their segment changes."""
    for state in keyed.values():
        state.segment = StateChanges()

"""The Arrow tables of keyed state blobs (schemas: :mod:`spark_ckpt.state.descriptor`): a FULL
blob from a state's entries (O(keys)) or, when every key changed, from its change log; a
DELTA blob from the changes (O(keys changed)). Rows are sorted by key group.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.state.descriptor import keyed_blob_schema
from spark_ckpt.state.snapshot.changes import StateChanges, TrackedState


def _kg_column(groups: list[int], sizes: list[int]) -> pa.Array:
    return pa.array(np.repeat(np.asarray(groups, dtype=np.int32), sizes), type=pa.int32())


def full_table(state: TrackedState, key_type: pa.DataType, max_parallelism: int) -> pa.Table:
    """FULL blob of *state*: every key, sorted by key group."""
    kgs, keys, values = state.entries()
    schema = keyed_blob_schema(state.descriptor, key_type, max_parallelism, delta=False)
    return pa.table([pa.array(kgs, type=pa.int32()), keys.cast(key_type), values], schema=schema)


def full_table_from_changes(
    state: TrackedState,
    changes: StateChanges,
    live: int,
    key_type: pa.DataType,
    max_parallelism: int,
) -> pa.Table | None:
    """The FULL blob of *state* (as :func:`full_table` gives it, rows of a key group in
    another order) taken from *changes* when they hold every key the state holds: only
    vectorized changes (no per-record key, whose value would have to be read), and as many
    distinct keys with a value as the state has. The last logged value of such a key is its
    current value, and each of them is in the state, so these are all of its entries. None
    otherwise. When every key changed since the last checkpoint (a running count over a
    small key space) this avoids a walk over every entry in Python; the log is compacted in
    place, as :func:`delta_table` compacts it."""
    if not state.exact_count or changes.keys or not changes.log or changes.log_rows < live:
        return None
    logged = changes.compacted_log()
    if logged.num_rows != live or logged.column("value").null_count:
        return None
    schema = keyed_blob_schema(state.descriptor, key_type, max_parallelism, delta=False)
    order = pc.sort_indices(logged.column("key_group"))  # stable: sorted by key group
    try:
        return pa.Table.from_arrays(logged.take(order).columns, names=schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


def delta_table(
    state: TrackedState, changes: StateChanges, key_type: pa.DataType, max_parallelism: int
) -> pa.Table:
    """DELTA blob of *changes* (see :class:`StateChanges`), sorted by key group: the current
    value of every changed key, or a tombstone (``deleted``, null value) for keys no longer
    present."""
    desc = state.descriptor
    schema = keyed_blob_schema(desc, key_type, max_parallelism, delta=True)
    parts: list[pa.Table] = []
    touched = [k for keys in changes.keys.values() for k in keys]
    if changes.log:
        logged = changes.compacted_log()
        if touched:  # the per-record API changed these later: read below
            stale = pc.is_in(logged.column("key"), value_set=pa.array(touched, key_type))
            logged = logged.filter(pc.invert(stale))
        value = logged.column("value")
        parts.append(pa.Table.from_arrays([*logged.columns, value.is_null()], schema=schema))
    if touched:
        groups = sorted(changes.keys)
        segments = [list(changes.keys[kg]) for kg in groups]
        keys: list[Any] = [k for segment in segments for k in segment]
        sizes = [len(segment) for segment in segments]
        values, member = state.current(groups, segments)
        parts.append(
            pa.table(
                [
                    _kg_column(groups, sizes),
                    pa.array(keys, type=key_type),
                    values,
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

"""Keyed state as tables: merging the blob chains of a checkpoint, and cutting a table of
keys and values back into FULL blobs at any parallelism and max parallelism.

A keyed state of one operator is stored as one chain per writing subtask (a FULL blob, then
DELTA blobs, see :mod:`spark_ckpt.state.snapshot.chain_rules`). :func:`merge_chain` folds one
chain into the rows a restore would load (last write of each key wins, tombstones drop it),
vectorized with Arrow kernels: the blobs are concatenated in ``seq`` order, the last position
of each key is found with one ``group_by``, and the deleted rows are filtered out. The chains
of one state cover disjoint key groups, so the state is the concatenation of its merged chains.

The result of a merge (and what :func:`full_blobs` takes) is a *state table*: columns ``key``
(the key type, not null) and ``value`` (the state's column type: the value for value state, a
``list`` for list state, a ``map`` for map state), rows sorted by key group then key, schema
metadata describing the state (:func:`state_table_schema`), with an optional leading
``key_group`` column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import CorruptCheckpointError, StateError
from spark_ckpt.protocol.state_handles import BlobKind, BlobRef, StateBlob
from spark_ckpt.state.descriptor import (
    META_KEY_GROUP_HASH,
    META_KEY_TYPE,
    META_MAX_PARALLELISM,
    META_STATE_KIND,
    META_STATE_NAME,
    META_VALUE_TYPE,
    StateDescriptor,
    StateKind,
    descriptor_from_column,
    keyed_blob_schema,
)
from spark_ckpt.state.keygroup import (
    HASH_NAME,
    check_parallelism,
    is_supported_key_type,
    key_group_indices,
    range_for_subtask,
)

_POS = "__pos"


@dataclass(frozen=True)
class KeyedStateInfo:
    """What the blobs of one keyed state record about it: its descriptor, key type and max
    parallelism."""

    descriptor: StateDescriptor
    key_type: pa.DataType
    max_parallelism: int


def blob_info(ref: BlobRef, table: pa.Table) -> KeyedStateInfo:
    """The state a keyed blob belongs to, from its schema; :class:`StateError` for a blob
    partitioned with another key-group hash, :class:`CorruptCheckpointError` for a blob that
    does not look like a keyed blob of *ref*'s state."""
    name = ref.state_name
    meta = table.schema.metadata or {}
    if meta.get(META_STATE_NAME, b"").decode() != name:
        raise CorruptCheckpointError(
            f"blob referenced as state {name!r} holds state "
            f"{meta.get(META_STATE_NAME, b'?').decode()!r}"
        )
    hash_name = meta.get(META_KEY_GROUP_HASH, b"").decode()
    if hash_name != HASH_NAME:
        raise StateError(
            f"state {name!r} was partitioned with key group hash {hash_name or '?'!r}, "
            f"not {HASH_NAME!r}"
        )
    expected = ["key_group", "key", "value"]
    if ref.kind is BlobKind.KEYED_DELTA:
        expected.append("deleted")
    if table.schema.names != expected:
        raise CorruptCheckpointError(
            f"blob {ref.kind.value} of state {name!r} has columns {table.schema.names}, "
            f"expected {expected}"
        )
    try:
        kind = StateKind(meta.get(META_STATE_KIND, b"").decode())
        max_parallelism = int(meta.get(META_MAX_PARALLELISM, b"").decode())
    except ValueError as e:
        raise CorruptCheckpointError(
            f"state {name!r}: blob metadata lacks a valid state kind or max parallelism"
        ) from e
    descriptor = descriptor_from_column(name, kind, table.schema.field("value").type)
    return KeyedStateInfo(descriptor, table.schema.field("key").type, max_parallelism)


def state_table_schema(info: KeyedStateInfo, *, with_key_group: bool = False) -> pa.Schema:
    """Schema of the state table of *info* (see the module docstring)."""
    desc = info.descriptor
    fields = [
        pa.field("key", info.key_type, nullable=False),
        pa.field("value", desc.column_type),
    ]
    if with_key_group:
        fields.insert(0, pa.field("key_group", pa.int32(), nullable=False))
    meta = {
        META_STATE_NAME: desc.name.encode(),
        META_STATE_KIND: desc.kind.value.encode(),
        META_KEY_TYPE: str(info.key_type).encode(),
        META_VALUE_TYPE: str(desc.column_type).encode(),
        META_KEY_GROUP_HASH: HASH_NAME.encode(),
        META_MAX_PARALLELISM: str(info.max_parallelism).encode(),
    }
    return pa.schema(fields, metadata=meta)


def _check_key_groups(ref: BlobRef, table: pa.Table, max_parallelism: int) -> None:
    """:class:`CorruptCheckpointError` unless every row's ``key_group`` is its key's key group
    and lies in the blob's recorded range."""
    if table.num_rows == 0:
        return
    computed = key_group_indices(table.column("key"), max_parallelism).astype(np.int64)
    stored = table.column("key_group").to_numpy().astype(np.int64)
    if (
        not np.array_equal(computed, stored)
        or computed.min() < ref.key_group_start
        or computed.max() > ref.key_group_end
    ):
        raise CorruptCheckpointError(
            f"blob {ref.kind.value} of state {ref.state_name!r} (checkpoint "
            f"{ref.checkpoint_id}) holds keys outside the key groups it records"
        )


def merge_chain(
    chain: Sequence[BlobRef],
    tables: Sequence[pa.Table],
    info: KeyedStateInfo,
    key_group_range: tuple[int, int] | None = None,
) -> pa.Table:
    """The rows of one chain (*chain* in ``seq`` order, *tables* its blobs) a restore loads:
    columns ``key_group``, ``key``, ``value``; restricted to *key_group_range* (inclusive)
    when given; unsorted."""
    parts: list[pa.Table] = []
    for ref, table in zip(chain, tables, strict=True):
        found = blob_info(ref, table)
        if found != info:
            raise StateError(
                f"state {ref.state_name!r}: blob of subtask {ref.subtask} (checkpoint "
                f"{ref.checkpoint_id}) is {found}, other blobs of the state are {info}"
            )
        _check_key_groups(ref, table, info.max_parallelism)
        if key_group_range is not None:
            kg = table.column("key_group")
            table = table.filter(
                pc.and_(
                    pc.greater_equal(kg, key_group_range[0]),
                    pc.less_equal(kg, key_group_range[1]),
                )
            )
        if ref.kind is BlobKind.KEYED_FULL:
            alive = pa.array(np.zeros(table.num_rows, dtype=np.bool_))
            table = table.append_column(pa.field("deleted", pa.bool_(), nullable=False), alive)
        parts.append(table.replace_schema_metadata(None))
    schema = parts[0].schema if parts else None
    if schema is None:
        raise CorruptCheckpointError("empty chain")
    merged = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    if len(parts) > 1:
        merged = merged.combine_chunks()
        merged = merged.append_column(_POS, pa.array(np.arange(merged.num_rows, dtype=np.int64)))
        last = merged.group_by("key", use_threads=False).aggregate([(_POS, "max")])
        merged = merged.take(last.column(f"{_POS}_max")).drop_columns([_POS])
    live = merged.filter(pc.invert(merged.column("deleted")))
    return live.select(["key_group", "key", "value"])


def sort_by_key_group(table: pa.Table) -> pa.Table:
    """*table* (with ``key_group`` and ``key`` columns) sorted by key group, then key."""
    if table.num_rows < 2:
        return table
    return table.sort_by([("key_group", "ascending"), ("key", "ascending")])


def normalize_state_table(
    table: pa.Table, descriptor: StateDescriptor, key_type: pa.DataType, what: str
) -> pa.Table:
    """*table* (columns ``key`` and ``value``; a ``key_group`` column is ignored) as columns
    ``key``/``value`` of *key_type* / the descriptor's column type, without the rows that
    hold no state (null values, empty lists and maps). :class:`StateError` for missing or
    extra columns, values that do not convert, null or repeated keys."""
    names = [n for n in table.column_names if n != "key_group"]
    if sorted(names) != ["key", "value"]:
        raise StateError(f"{what}: expected columns 'key' and 'value', got {table.column_names}")
    if not is_supported_key_type(key_type):
        raise StateError(
            f"{what}: key type {key_type} is not supported: use an integer, bool, string or "
            "binary key"
        )
    try:
        keys = table.column("key").cast(key_type)
        values = table.column("value").cast(descriptor.column_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise StateError(
            f"{what}: columns do not convert to key {key_type} / value "
            f"{descriptor.column_type}: {e}"
        ) from e
    if keys.null_count:
        raise StateError(f"{what}: {keys.null_count} null key(s)")
    out = pa.table([keys, values], names=["key", "value"])
    keep = pc.is_valid(out.column("value"))
    if descriptor.kind in (StateKind.LIST, StateKind.MAP):
        lengths = [np.diff(c.offsets.to_numpy(zero_copy_only=False)) for c in values.chunks]
        nonempty = np.concatenate(lengths) > 0 if lengths else np.zeros(0, np.bool_)
        keep = pc.and_(keep, pa.array(nonempty, pa.bool_()))
    if not pc.all(keep).as_py():
        out = out.filter(keep)
    if _has_repeats(out.column("key")):
        raise StateError(f"{what}: keys are not unique")
    return out


def _has_repeats(keys: pa.ChunkedArray) -> bool:
    """Whether a key appears twice in *keys*. Integer and bool keys: one sorted numpy copy
    (O(n log n), n key widths of memory); other keys: Arrow's hash count."""
    if len(keys) < 2:
        return False
    if pa.types.is_integer(keys.type) or pa.types.is_boolean(keys.type):
        ordered = np.sort(keys.to_numpy())
        return bool(np.any(ordered[1:] == ordered[:-1]))
    return bool(pc.count_distinct(keys).as_py() != len(keys))


#: The size a FULL blob written by :func:`full_blobs` aims at: a subtask's share of a state
#: larger than this is cut into slices of whole key groups, one blob each.
FULL_BLOB_TARGET_BYTES = 64 << 20


def full_blobs(
    uid: str,
    table: pa.Table,
    descriptor: StateDescriptor,
    key_type: pa.DataType,
    max_parallelism: int,
    parallelism: int,
    *,
    target_bytes: int | None = None,
) -> list[StateBlob]:
    """FULL blobs of state *table* (normalized, see :func:`normalize_state_table`) of
    operator *uid* at *parallelism*, with key groups of *max_parallelism* computed by the
    project's key-group hash. Each subtask with keys gets one blob per slice of consecutive
    key groups holding about *target_bytes* (default :data:`FULL_BLOB_TARGET_BYTES`; at least
    one key group per slice; each slice is a chain of its own, which a restore at any
    parallelism reads like a subtask's). Rows are sorted by key group, then key, as snapshots
    write them. Memory: the table once more, in slices, plus a position and a key group per
    row."""
    check_parallelism(max_parallelism, parallelism)
    if target_bytes is None:
        target_bytes = FULL_BLOB_TARGET_BYTES
    if target_bytes < 1:
        raise StateError(f"target_bytes must be positive, got {target_bytes}")
    kgs = key_group_indices(table.column("key"), max_parallelism)
    order = np.argsort(kgs, kind="stable")
    counts = np.bincount(kgs, minlength=max_parallelism)
    ends = np.cumsum(counts)  # rows of key groups 0..g, in *order*
    row_bytes = max(1.0, table.nbytes / max(1, table.num_rows))
    rows_per_blob = max(1, int(target_bytes / row_bytes))
    schema = keyed_blob_schema(descriptor, key_type, max_parallelism, delta=False)
    blobs: list[StateBlob] = []
    for subtask in range(parallelism):
        rng = range_for_subtask(max_parallelism, parallelism, subtask)
        start = rng.start
        while start <= rng.end:
            first = int(ends[start - 1]) if start else 0
            # the last key group of the slice: as many whole groups as fit, at least one
            end = int(np.searchsorted(ends, first + rows_per_blob, side="right")) - 1
            end = min(max(end, start), rng.end)
            last = int(ends[end])
            if last > first:
                positions = order[first:last]
                blobs.append(
                    _full_blob(
                        uid, subtask, table, kgs, positions, schema, descriptor.name, (start, end)
                    )
                )
            start = end + 1
    return blobs


def _full_blob(
    uid: str,
    subtask: int,
    table: pa.Table,
    kgs: npt.NDArray[np.int32],
    positions: npt.NDArray[np.intp],
    schema: pa.Schema,
    state_name: str,
    key_groups: tuple[int, int],
) -> StateBlob:
    """The FULL blob of state *state_name* of subtask *subtask*: the rows of *table* at
    *positions* (their key groups, *kgs* at them, lie in *key_groups*), sorted by key group,
    then key."""
    part = table.take(pa.array(positions))
    keyed = pa.table(
        [pa.array(kgs[positions], type=pa.int32()), part.column("key"), part.column("value")],
        names=["key_group", "key", "value"],
    )
    keyed = sort_by_key_group(keyed).combine_chunks()
    return StateBlob(
        operator_uid=uid,
        subtask=subtask,
        kind=BlobKind.KEYED_FULL,
        state_name=state_name,
        table=pa.Table.from_arrays(keyed.columns, schema=schema),
        key_group_start=key_groups[0],
        key_group_end=key_groups[1],
        seq=0,
    )

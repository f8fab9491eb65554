"""Byte encodings of keyed state for the ``rocksdb`` backend: explicit, never pickled.

A stored key is its key group (2 bytes, big-endian) followed by the key: integers as 8
bytes, big-endian, signed ones with the sign bit flipped (so byte order is numeric order),
booleans as one byte, strings and binaries as their bytes. The key group comes first, as in
Flink's RocksDB backend, so each key group is one contiguous, ordered range of the column
family: a full scan yields the rows already sorted by key group, and a rescale reads ranges.

A stored value is, by the state's column type:

* fixed width (integers, floats, dates, times, timestamps, durations, decimals): the
  little-endian bytes of the Arrow value buffer, cut per value with numpy;
* booleans: one byte;
* strings and binaries: their bytes;
* anything else (lists, maps, structs: list and map state, windows, TTL-wrapped values):
  the Arrow IPC message of a one-row record batch of the value's column, read back against
  the state's schema (:func:`pyarrow.ipc.read_record_batch`).

Every batch encoding and decoding is O(values) with one C-level pass for the fixed-width
and byte forms; the IPC form costs one small message per value.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import CorruptCheckpointError

#: Bytes of the key group prefix of every stored key.
KG_BYTES: Final = 2
_SIGN: Final = np.uint64(1 << 63)


def _key_kind(key_type: pa.DataType) -> str:
    if pa.types.is_signed_integer(key_type):
        return "signed"
    if pa.types.is_unsigned_integer(key_type):
        return "unsigned"
    if pa.types.is_boolean(key_type):
        return "bool"
    return "bytes"


class KeyCodec:
    """Stored keys of *key_type* (see the module docstring)."""

    def __init__(self, key_type: pa.DataType) -> None:
        self.key_type = key_type
        self._kind = _key_kind(key_type)

    def encode(self, key_groups: npt.NDArray[np.integer], keys: pa.Array) -> list[bytes]:
        """The stored key of each (key group, key). O(keys) in C."""
        n = len(keys)
        if self._kind == "bytes":
            return self._joined(key_groups, keys).to_pylist()  # type: ignore[no-any-return]
        width = "u1" if self._kind == "bool" else ">u8"
        rec = np.empty(n, dtype=[("kg", ">u2"), ("k", width)])
        rec["k"] = self._raw(keys)
        rec["kg"] = key_groups
        stored: list[bytes] = rec.view(f"V{rec.dtype.itemsize}").tolist()
        return stored

    def _joined(self, key_groups: npt.NDArray[np.integer], keys: pa.Array) -> pa.Array:
        """String and binary keys' stored forms, as one Arrow binary array."""
        prefix = np.asarray(key_groups, dtype=">u2").view(f"V{KG_BYTES}").tolist()
        return pc.binary_join_element_wise(
            pa.array(prefix, pa.binary()), keys.cast(pa.binary()), b""
        )

    def _raw(self, keys: pa.Array) -> npt.NDArray[np.unsignedinteger[Any]]:
        """Integer and boolean keys as the unsigned integers whose big-endian bytes they
        are stored as (numeric order is byte order)."""
        if self._kind == "bool":
            return np.asarray(keys.to_numpy(zero_copy_only=False), dtype=np.uint8)
        if self._kind == "signed":
            return (
                np.asarray(keys.cast(pa.int64()).to_numpy(), dtype=np.int64).view(np.uint64) ^ _SIGN
            )
        return np.asarray(keys.cast(pa.uint64()).to_numpy(), dtype=np.uint64)

    def ascending(self, key_groups: npt.NDArray[np.int64], keys: pa.Array) -> npt.NDArray[np.int64]:
        """The positions of the distinct (key group, key) pairs, *key_groups* ascending, in
        the byte order of their stored keys (RocksDB's order, as an SST file needs them); a
        repeated pair keeps its last occurrence, as a write batch would. O(n log n) in C,
        one sort per key group for integer and boolean keys."""
        n = len(keys)
        if self._kind == "bytes":
            stored = self._joined(key_groups, keys)
            order = np.asarray(pc.sort_indices(stored), dtype=np.int64)  # a stable sort
            ordered = stored.take(pa.array(order))
            same = (
                pc.equal(ordered.slice(1), ordered.slice(0, n - 1)).to_numpy(zero_copy_only=False)
                if n > 1
                else np.zeros(0, np.bool_)
            )
        else:
            raw = self._raw(keys)
            order = _sorted_in_groups(key_groups, raw, "quicksort")
            ordered_raw = raw[order]
            same = (ordered_raw[1:] == ordered_raw[:-1]) & (key_groups[1:] == key_groups[:-1])
            if same.any():  # repeats: which one is last needs a stable order
                order = _sorted_in_groups(key_groups, raw, "stable")
        if same.any():
            order = order[np.append(~same, True)]  # the last of each run of equal keys
        return order

    def decode(self, stored: list[bytes]) -> tuple[npt.NDArray[np.int64], pa.Array]:
        """The (key groups, keys) of stored keys."""
        if self._kind == "bytes":
            prefixes = b"".join([s[:KG_BYTES] for s in stored])
            groups = np.frombuffer(prefixes, dtype=">u2").astype(np.int64)
            keys = pa.array([s[KG_BYTES:] for s in stored], pa.binary())
            return groups, keys.cast(self.key_type)
        width = 1 if self._kind == "bool" else 8
        dtype = [("kg", ">u2"), ("k", "u1" if width == 1 else ">u8")]
        rec = np.frombuffer(b"".join(stored), dtype=dtype)
        groups = rec["kg"].astype(np.int64)
        if self._kind == "bool":
            return groups, pa.array(rec["k"].astype(np.bool_))
        raw = rec["k"].astype(np.uint64)
        if self._kind == "signed":
            return groups, pa.array((raw ^ _SIGN).view(np.int64)).cast(self.key_type)
        return groups, pa.array(raw).cast(self.key_type)

    def one(self, key_group: int, key: Any) -> bytes:
        """The stored key of one (key group, Python key)."""
        prefix = key_group.to_bytes(KG_BYTES, "big")
        if self._kind == "signed":
            return prefix + int(key + (1 << 63)).to_bytes(8, "big")
        if self._kind == "unsigned":
            return prefix + int(key).to_bytes(8, "big")
        if self._kind == "bool":
            return prefix + (b"\x01" if key else b"\x00")
        return prefix + (key.encode() if isinstance(key, str) else bytes(key))


def _sorted_in_groups(
    key_groups: npt.NDArray[np.int64], raw: npt.NDArray[Any], kind: Any
) -> npt.NDArray[np.int64]:
    """The permutation sorting *raw* within each run of equal (ascending) *key_groups*:
    one sort per key group, each small enough to stay in cache."""
    n = len(raw)
    order = np.empty(n, np.int64)
    bounds = (np.flatnonzero(np.diff(key_groups)) + 1).tolist()
    for lo, hi in zip([0, *bounds], [*bounds, n], strict=True):
        order[lo:hi] = np.argsort(raw[lo:hi], kind=kind)
        order[lo:hi] += lo
    return order


def _fixed_width(column_type: pa.DataType) -> int | None:
    if pa.types.is_boolean(column_type):
        return None
    try:
        bits = column_type.bit_width
    except ValueError:
        return None
    return bits // 8 if bits % 8 == 0 and column_type.num_buffers == 2 else None


class ValueCodec:
    """Stored values of *column_type* (see the module docstring). Null values are None
    (no entry)."""

    def __init__(self, column_type: pa.DataType) -> None:
        self.column_type = column_type
        self._width = _fixed_width(column_type)
        self._bool = pa.types.is_boolean(column_type)
        self._bytes = (
            pa.types.is_string(column_type)
            or pa.types.is_large_string(column_type)
            or pa.types.is_binary(column_type)
            or pa.types.is_large_binary(column_type)
        )
        self._schema = pa.schema([pa.field("v", column_type)])

    def encode(self, column: pa.Array) -> list[bytes | None]:
        """The stored form of each value of *column* (null: None)."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if column.type != self.column_type:
            column = column.cast(self.column_type)
        n = len(column)
        if self._bool:
            out: list[bytes | None] = (
                column.cast(pa.uint8()).fill_null(0).to_numpy().view("V1").tolist()
            )
        elif self._width is not None:
            w = self._width
            data = column.buffers()[1]
            raw = np.frombuffer(data, dtype=f"V{w}", count=column.offset + n)[column.offset :]
            out = raw.tolist()
        elif self._bytes:
            return column.cast(pa.large_binary()).to_pylist()  # type: ignore[no-any-return]
        else:
            batch = pa.record_batch([column], schema=self._schema)
            out = [batch.slice(i, 1).serialize().to_pybytes() for i in range(n)]
        if column.null_count:
            valid = column.is_valid().to_numpy(zero_copy_only=False)
            for i in np.flatnonzero(~valid).tolist():
                out[i] = None
        return out

    def decode(self, stored: list[bytes | None]) -> pa.Array:
        """The values of stored forms (None: null) as one column."""
        n = len(stored)
        present = np.fromiter((s is not None for s in stored), dtype=np.bool_, count=n)
        try:
            return self._decode(stored, present)
        except (pa.ArrowInvalid, ValueError) as e:
            raise CorruptCheckpointError(
                f"a stored value of type {self.column_type} is not valid: {e}"
            ) from e

    def _decode(self, stored: list[bytes | None], present: npt.NDArray[np.bool_]) -> pa.Array:
        n = len(stored)
        mask = None if present.all() else ~present
        if self._bytes:
            arr = pa.array(stored, pa.large_binary())
            return arr.cast(self.column_type)
        if self._bool or self._width is not None:
            w = 1 if self._bool else self._width
            assert w is not None
            raw = np.zeros(n, dtype=f"V{w}")
            if mask is None:
                raw = np.frombuffer(b"".join(stored), dtype=f"V{w}")  # type: ignore[arg-type]
            else:
                raw[present] = np.frombuffer(
                    b"".join(s for s in stored if s is not None), dtype=f"V{w}"
                )
            if self._bool:
                ints = pa.array(raw.view(np.uint8), mask=mask)
                return ints.cast(pa.bool_())
            data = pa.py_buffer(raw.tobytes())
            validity = None if mask is None else pa.array(present).buffers()[1]
            nulls = 0 if mask is None else int(mask.sum())
            return pa.Array.from_buffers(self.column_type, n, [validity, data], null_count=nulls)
        parts: list[pa.Array] = []
        empty = pa.nulls(1, self.column_type)
        for s in stored:
            if s is None:
                parts.append(empty)
            else:
                batch = pa.ipc.read_record_batch(pa.py_buffer(s), self._schema)
                parts.append(batch.column(0))
        if not parts:
            return pa.array([], self.column_type)
        return pa.concat_arrays(parts)

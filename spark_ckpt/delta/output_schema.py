"""The schema a Delta sink writes: how the columns of a task's output are coerced into
Delta-compatible types (:func:`output_table`), and how a staged file's schema is checked
against the table's (:func:`check_schema`)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import Schema as DeltaSchema

from spark_ckpt.errors import ProtocolError
from spark_ckpt.protocol.barrier import BARRIER_COLUMNS

#: The timestamp type of every timestamp column written (Delta's ``timestamp``).
UTC_MICROS = pa.timestamp("us", tz="UTC")


def _output_type(t: pa.DataType) -> pa.DataType:
    """The type a column of type *t* is written as: timestamps become UTC microseconds (naive
    timestamps are taken as UTC), dictionaries are decoded, unsigned integers widen to the
    signed type Delta can hold (``uint64`` stays 64 bit: overflow raises)."""
    if pa.types.is_timestamp(t):
        return UTC_MICROS
    if pa.types.is_dictionary(t):
        return _output_type(t.value_type)
    if pa.types.is_unsigned_integer(t):
        return {8: pa.int16(), 16: pa.int32()}.get(t.bit_width, pa.int64())
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        value = t.value_field.with_type(_output_type(t.value_type))
        return pa.list_(value) if pa.types.is_list(t) else pa.large_list(value)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_output_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_output_type(t.key_type), _output_type(t.item_type))
    return t


def output_table(table: pa.Table) -> pa.Table:
    """*table* as the sink writes it: barrier columns dropped, types coerced
    (:func:`_output_type`), every column nullable, no schema metadata."""
    table = table.drop_columns([c for c in BARRIER_COLUMNS if c in table.column_names])
    if table.num_columns == 0:
        raise ProtocolError("the sink's input has no user columns")
    columns: list[pa.ChunkedArray] = []
    fields: list[pa.Field] = []
    for field, column in zip(table.schema, table.columns, strict=True):
        target = _output_type(field.type)
        if target != field.type:
            opts = pc.CastOptions(target, allow_time_truncate=True)
            try:
                column = pc.cast(column, options=opts)
            except pa.ArrowException as e:
                raise ProtocolError(
                    f"column {field.name!r} of type {field.type} cannot be written as {target}: {e}"
                ) from e
        columns.append(column)
        fields.append(pa.field(field.name, target, nullable=True))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def delta_fields(schema: pa.Schema) -> dict[str, str]:
    """Column name -> Delta type (JSON) of an Arrow schema; unsupported types raise."""
    try:
        delta = DeltaSchema.from_arrow(schema)
    except Exception as e:  # delta-rs raises a bare Exception for unsupported types
        raise ProtocolError(f"the sink's schema is not a Delta schema: {e}".split("\n")[0]) from e
    return {f["name"]: json.dumps(f["type"]) for f in json.loads(delta.to_json())["fields"]}


def check_schema(table_fields: dict[str, str], staged: pa.Schema, path: str) -> None:
    """Raise :class:`ProtocolError` unless *staged* has the columns and types of the table
    (*table_fields* from :func:`delta_fields`; column order and nullability don't matter)."""
    mine = delta_fields(staged)
    missing = sorted(set(table_fields) - set(mine))
    extra = sorted(set(mine) - set(table_fields))
    differ = sorted(
        f"{n}: table {table_fields[n]} vs staged {mine[n]}"
        for n in set(mine) & set(table_fields)
        if mine[n] != table_fields[n]
    )
    if missing or extra or differ:
        parts = []
        if missing:
            parts.append(f"missing columns {missing}")
        if extra:
            parts.append(f"unexpected columns {extra}")
        if differ:
            parts.append(f"type mismatch {differ}")
        raise ProtocolError(f"staged file {path} does not fit the table: " + "; ".join(parts))

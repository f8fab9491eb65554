"""The three formats of ``source=files`` (Parquet, JSON lines, CSV): a file's row count and
schema, and lines parsed into rows of the source's schema.

A row is a Parquet row, or a non-empty line of JSON lines or CSV (after the CSV header), so
positions within a file are stable whatever the parser. Row counts and schemas are taken in
the source runner when a file is recorded (a Parquet file's footer; a text file read once in
full); lines are parsed on the executors, in one pyarrow call per batch of lines.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from spark_ckpt.errors import SourceError
from spark_ckpt.locations.uris import store_errors
from spark_ckpt.sources.files.files_options import FilesSpec
from spark_ckpt.sources.files.source_directory import SourceDirectory


def text_lines(data: bytes) -> list[tuple[int, bytes]]:
    """The non-empty lines of *data* with their 1-based line numbers."""
    return [(i + 1, line) for i, line in enumerate(data.splitlines()) if line.strip()]


def count_rows(spec: FilesSpec, directory: SourceDirectory, name: str) -> int:
    """Rows of the file *name*: Parquet's row count (its footer only), non-empty lines of
    JSON lines, CSV data lines."""
    if spec.format == "parquet":
        with store_errors(directory.full(name), "read the Parquet footer of"):
            return int(pq.ParquetFile(directory.input_file(name)).metadata.num_rows)
    lines = text_lines(directory.read(name))
    return len(lines) - (1 if spec.format == "csv" and spec.header and lines else 0)


def infer_schema(spec: FilesSpec, directory: SourceDirectory, name: str) -> pa.Schema:
    """The schema of the file *name*, inferred by pyarrow (timestamps as UTC
    microseconds)."""
    if spec.format == "parquet":
        with store_errors(directory.full(name), "read the Parquet footer of"):
            schema = pq.read_schema(directory.input_file(name))
    elif spec.format == "json":
        schema = pajson.read_json(directory.buffer(name)).schema
    else:
        schema = pacsv.read_csv(
            directory.buffer(name),
            read_options=pacsv.ReadOptions(autogenerate_column_names=not spec.header),
        ).schema
    return pa.schema(
        [
            pa.field(f.name, pa.timestamp("us", tz="UTC"))
            if pa.types.is_timestamp(f.type)
            else f.with_nullable(True)
            for f in schema
        ]
    )


def parse_lines(fmt: str, schema: pa.Schema, lines: list[bytes], header: bytes | None) -> pa.Table:
    """*lines* of a JSON-lines (*fmt* ``json``) or CSV file as rows of *schema*, one row per
    line (a CSV file's *header* line, if any, names the columns); ``pa.ArrowInvalid`` or
    ``ValueError`` if any line does not parse."""
    if not lines:
        return schema.empty_table()
    if fmt == "json":
        data = b"\n".join(lines) + b"\n"
        table = pajson.read_json(
            pa.BufferReader(data),
            parse_options=pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    else:
        data = b"\n".join(([header] if header is not None else []) + lines) + b"\n"
        names = None if header is not None else schema.names
        table = pacsv.read_csv(
            pa.BufferReader(data),
            read_options=pacsv.ReadOptions(column_names=names),
            convert_options=pacsv.ConvertOptions(column_types={f.name: f.type for f in schema}),
        )
        if table.num_rows != len(lines):
            raise ValueError(f"{len(lines)} lines gave {table.num_rows} rows")
    return conform(table, schema, "")


def conform(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    """*table* as *schema*: its columns cast, a missing one null (JSON lines and CSV) or,
    for a Parquet file (*where*), an error naming the file, as is a column that does not
    cast."""
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing and where:
        raise SourceError(f"file {where} lacks the columns {missing} of the source's schema")
    arrays = []
    for f in schema:
        if f.name in missing:
            arrays.append(pa.nulls(table.num_rows, f.type))
            continue
        column = table.column(f.name)
        try:
            arrays.append(column.cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            if not where:
                raise
            raise SourceError(
                f"file {where}: column {f.name!r} is {column.type}, the source's schema says "
                f"{f.type} ({e})"
            ) from e
    return pa.Table.from_arrays(arrays, schema=schema)

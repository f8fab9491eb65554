"""Damage a :class:`~spark_ckpt.delta.delta_store.DeltaCheckpointStore` on disk, the way bit rot, a
bad copy or an over-eager clean-up would: helpers shared by unit and integration tests.

Import as ``from spark_ckpt.testing.damage import ...`` (``tests/`` is on ``sys.path`` for tests in
it).

Every helper works on a *local* store root and on the tables' active data files (those the
newest Delta log version references), located through the store's own layout
(:class:`~spark_ckpt.delta.store_layout.StoreTable`, ``table_uri``). Files are rewritten in place
under their own names, so the Delta log does not change: a store object that cached the
parsed ``checkpoints`` table at that version keeps its cache (blob reads are never cached);
open a new store object after damaging metadata.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from spark_ckpt.delta.checkpoint_log import LogRecord
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.delta.store_layout import StoreTable


@dataclass(frozen=True)
class Damage:
    """What a helper damaged: the data file, and the blob id (state tables) or checkpoint
    id (``checkpoints`` table) of the row it altered."""

    path: Path
    row: str


def data_files(root: str | Path, table: StoreTable) -> list[Path]:
    """The active Parquet data files of *table* under the store *root*, sorted."""
    uri = DeltaCheckpointStore(str(root)).table_uri(table)
    return sorted(Path(f) for f in DeltaTable(uri).file_uris())


def files_of_checkpoint(
    root: str | Path, checkpoint_id: int, table: StoreTable = StoreTable.OPERATOR_STATE
) -> list[Path]:
    """The active data files of *table* holding at least one row of *checkpoint_id*."""
    return [
        f
        for f in data_files(root, table)
        if checkpoint_id in pq.read_table(f, columns=["checkpoint_id"])["checkpoint_id"].to_pylist()
    ]


def _first_file_of(root: str | Path, checkpoint_id: int, table: StoreTable) -> Path:
    files = files_of_checkpoint(root, checkpoint_id, table)
    if not files:
        raise AssertionError(f"no row of checkpoint {checkpoint_id} in {table.value} of {root}")
    return files[0]


def _rewrite(path: Path, table: pa.Table) -> None:
    """Write *table* over *path* (atomically: a crash leaves the old or the new file)."""
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def _rewrite_blob_row(
    root: str | Path,
    checkpoint_id: int,
    table: StoreTable,
    column: str,
    change: Callable[[object], object],
) -> Damage:
    """Replace the *column* value *v* of the first row of *checkpoint_id* in *table* by
    ``change(v)``, rewriting that row's data file under its name."""
    path = _first_file_of(root, checkpoint_id, table)
    data = pq.read_table(path)
    row = data["checkpoint_id"].to_pylist().index(checkpoint_id)
    bid = str(data["blob_id"][row].as_py())
    index = data.schema.get_field_index(column)
    field = data.schema.field(index)
    values = data[column].to_pylist()
    values[row] = change(values[row])
    if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
        # built as binary and viewed as string: invalid UTF-8 is written as it is
        raw = [v.encode() if isinstance(v, str) else v for v in values]
        array = pa.array(raw, pa.binary()).view(pa.string()).cast(field.type)
    else:
        array = pa.array(values, field.type)
    data = data.set_column(index, field.with_nullable(True), array)
    _rewrite(path, data)
    return Damage(path, bid)


def flip_byte_in_blob(
    root: str | Path, checkpoint_id: int, table: StoreTable = StoreTable.OPERATOR_STATE
) -> Damage:
    """Flip one byte (the middle one) of the payload of one blob row written by
    *checkpoint_id* in *table* (a state table), rewriting that row's data file under its
    name; every other value stays as it was. The blob then fails its checksum. Returns
    the file and the ``blob_id`` of the damaged row."""

    def flip(payload: object) -> bytes:
        assert isinstance(payload, bytes)
        flipped = bytearray(payload)
        flipped[len(flipped) // 2] ^= 0x01
        return bytes(flipped)

    return _rewrite_blob_row(root, checkpoint_id, table, "payload", flip)


def set_blob_value(
    root: str | Path,
    checkpoint_id: int,
    column: str,
    value: object,
    table: StoreTable = StoreTable.OPERATOR_STATE,
) -> Damage:
    """Set *column* of one blob row of *checkpoint_id* in *table* to *value* — ``None``
    (null, even in a non-nullable column) or, for a string column, ``bytes`` that need not
    be UTF-8 — the way a damaged file can decode. Returns the file and the row's original
    ``blob_id``."""
    return _rewrite_blob_row(root, checkpoint_id, table, column, lambda _: value)


def flip_byte_in_file(path: str | Path, offset: int | None = None) -> int:
    """Flip (xor 0xFF) the byte at *offset* of the file *path* — by default the middle one;
    a negative offset counts from the end. Returns the offset flipped. Size and name stay.
    Whether a flip in a Parquet file matters depends on where it lands (statistics of
    unused columns, for example, are never checked); see :func:`column_chunk_span`."""
    p = Path(path)
    data = bytearray(p.read_bytes())
    at = len(data) // 2 if offset is None else offset % len(data)
    data[at] ^= 0xFF
    p.write_bytes(bytes(data))
    return at


def column_chunk_span(path: str | Path, column: str, row_group: int = 0) -> tuple[int, int]:
    """``[start, end)`` byte range of *column*'s chunk (dictionary and data pages) in row
    group *row_group* of the Parquet file *path*: where a flip damages that column's values."""
    meta = pq.ParquetFile(path).metadata.row_group(row_group)
    for i in range(meta.num_columns):
        chunk = meta.column(i)
        if chunk.path_in_schema == column:
            start = (
                chunk.dictionary_page_offset
                if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None
                else chunk.data_page_offset
            )
            return int(start), int(start + chunk.total_compressed_size)
    raise AssertionError(f"{path} has no column {column!r}")


def delete_blob_file(
    root: str | Path, checkpoint_id: int, table: StoreTable = StoreTable.OPERATOR_STATE
) -> Path:
    """Delete the data file of *table* that holds a blob row of *checkpoint_id* (the first
    such file); the Delta log still references it. Returns the deleted path."""
    path = _first_file_of(root, checkpoint_id, table)
    path.unlink()
    return path


def tamper_metadata(root: str | Path, checkpoint_id: int) -> Damage:
    """Alter the metadata JSON of the ``completed`` row of *checkpoint_id* in the
    ``checkpoints`` table (one character appended), rewriting its data file under its name;
    the row then fails its checksum. Returns the file and the checkpoint id."""
    for path in data_files(root, StoreTable.CHECKPOINTS):
        data = pq.read_table(path)
        mine = pc.and_(
            pc.equal(data["record"], LogRecord.COMPLETED.value),
            pc.equal(data["checkpoint_id"], checkpoint_id),
        ).to_pylist()
        if not any(mine):
            continue
        row = mine.index(True)
        texts = data["metadata"].to_pylist()
        texts[row] = texts[row] + " "
        column = data.schema.get_field_index("metadata")
        field = data.schema.field(column)
        data = data.set_column(column, field, pa.array(texts, field.type))
        _rewrite(path, data)
        return Damage(path, str(checkpoint_id))
    raise AssertionError(f"no completed row of checkpoint {checkpoint_id} under {root}")

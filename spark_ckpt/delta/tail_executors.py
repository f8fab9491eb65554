"""The Delta tail source, executor side: a :class:`DeltaReadPlan` is rows ``[start, end)`` of
one channel as slices of data files (:class:`FileSlice`). The driver's
:class:`~spark_ckpt.delta.tail_driver.DeltaTailSource` plans it; the executors read it
(:meth:`DeltaReadPlan.read`) with pyarrow alone: no delta-rs, no Delta log, only the data
files of the plan and, in each, only the row groups its slice overlaps (O(rows of those row
groups)).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from spark_ckpt.delta.tail_files import file_location, table_filesystem, tail_boundary
from spark_ckpt.errors import ProtocolError


@dataclass(frozen=True)
class FileSlice:
    """Rows ``[offset, offset + rows)`` of one data file; *path* is the Delta-log path (URL
    encoded, relative to the table root, or an absolute URI)."""

    path: str
    offset: int
    rows: int


@dataclass(frozen=True)
class DeltaReadPlan:
    """Rows ``[start, end)`` of *channel*: the concatenation of *slices* (in order), read from
    the table at *root* (a URI), physical columns *columns* renamed/cast to *schema*.

    Frozen and small (one slice per file touched; the schema). Picklable, and also has an
    explicit JSON form (:meth:`to_json` / :meth:`from_json`, the schema as base64 Arrow IPC).
    :meth:`read` is deterministic: the same plan returns the same rows on any process.
    """

    channel: int
    start: int
    end: int
    root: str
    columns: tuple[str, ...]
    schema: pa.Schema
    slices: tuple[FileSlice, ...]

    def __post_init__(self) -> None:
        if sum(s.rows for s in self.slices) != self.end - self.start:
            raise ProtocolError(
                f"plan of channel {self.channel} [{self.start}, {self.end}) has slices "
                f"totalling {sum(s.rows for s in self.slices)} rows"
            )
        if len(self.columns) != len(self.schema):
            raise ProtocolError("plan columns and schema differ in length")

    def read(self) -> pa.Table:
        """Executor side: exactly ``end - start`` rows of :attr:`schema`, in channel order.

        Opens only the files of the plan and, within each, only the row groups that overlap
        the slice. Raises :class:`ProtocolError` when a file is missing or unreadable (the
        Delta log says it holds committed rows) or lacks rows the log promised."""
        if not self.slices:
            return self.schema.empty_table()
        fs, base = table_filesystem(self.root)
        parts = [self._read_slice(fs, base, s) for s in self.slices]
        return pa.concat_tables(parts)

    def _read_slice(self, fs: pafs.FileSystem, base: str, piece: FileSlice) -> pa.Table:
        file_fs, location = file_location(fs, base, piece.path)
        what = f"reading data file {piece.path!r} of {self.root}"
        with tail_boundary(what), file_fs.open_input_file(location) as handle:
            parquet = pq.ParquetFile(handle)
            wanted = [c for c in self.columns if c in parquet.schema_arrow.names]
            metadata = parquet.metadata
            groups: list[int] = []
            first_row = 0  # first row of the first selected group
            row = 0
            stop = piece.offset + piece.rows
            for g in range(metadata.num_row_groups):
                size = metadata.row_group(g).num_rows
                if row + size > piece.offset and row < stop:
                    if not groups:
                        first_row = row
                    groups.append(g)
                row += size
            if row < stop:
                raise ProtocolError(
                    f"data file {piece.path!r} of {self.root} has {row} rows, "
                    f"the plan needs rows up to {stop}"
                )
            table = parquet.read_row_groups(groups, columns=wanted, use_threads=False)
        return _conform(table.slice(piece.offset - first_row, piece.rows), self)

    # --- JSON encoding --------------------------------------------------------------------

    def to_json(self) -> str:
        """Explicit JSON form (sorted keys); :meth:`from_json` inverts it."""
        return json.dumps(
            {
                "channel": self.channel,
                "start": self.start,
                "end": self.end,
                "root": self.root,
                "columns": list(self.columns),
                "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
                "slices": [[s.path, s.offset, s.rows] for s in self.slices],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> DeltaReadPlan:
        """Inverse of :meth:`to_json`; :class:`ProtocolError` on anything else."""
        try:
            d = json.loads(text)
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(d["schema"])))
            return cls(
                channel=int(d["channel"]),
                start=int(d["start"]),
                end=int(d["end"]),
                root=str(d["root"]),
                columns=tuple(str(c) for c in d["columns"]),
                schema=schema,
                slices=tuple(FileSlice(str(p), int(o), int(n)) for p, o, n in d["slices"]),
            )
        except ProtocolError:
            raise
        except (KeyError, TypeError, ValueError, pa.ArrowException) as e:
            raise ProtocolError(f"not a DeltaReadPlan: {text[:200]!r} ({e})") from e


def _conform(table: pa.Table, plan: DeltaReadPlan) -> pa.Table:
    """*table* (physical columns of one file, any subset) as a table of ``plan.schema``:
    columns renamed, cast to the schema's types, missing ones filled with nulls."""
    arrays: list[pa.ChunkedArray | pa.Array] = []
    for column, field in zip(plan.columns, plan.schema, strict=True):
        if column in table.column_names:
            data = table.column(column)
            arrays.append(data if data.type == field.type else data.cast(field.type))
        else:
            arrays.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=plan.schema)

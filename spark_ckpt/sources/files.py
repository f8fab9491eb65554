"""``source=files``: files landing in a directory (Parquet, JSON lines or CSV), as replayable
channels.

The listing
-----------
The source runner lists the directory and records every new file once, in a listing under
the pipeline root (:class:`FileListing`, ``_sources/files.jsonl``, append-only), with its
size, modification time, row count and channel. The recorded order is the log: a replay, a
restart or a restore reads the same files in the same order, whatever the directory holds
by then. New files are recorded by modification time, then name; hidden files (``.`` or
``_`` first) are skipped, so a writer should write under such a name and rename into place.
``maxFilesPerTrigger`` records at most that many new files per micro-batch; under
``Trigger.AvailableNow`` every file there at the start is recorded, and read in batches of
at most that many files (:meth:`FilesChannelSource.admit`), as in Spark.

The first record fixes the schema: the ``schema`` option (a DDL string,
``"user_id long, amount double"``), or the schema of the first file (inferred once). A file
whose columns do not fit it is an error naming the file. Files are assigned to channels round
robin in listing order; a channel's log is the rows of its files, file after file, and a
position is the number of rows before it (for JSON lines and CSV, a row is a non-empty line
after the header).

Reading
-------
:meth:`FilesReadPlan.read_positioned` (executors) reads row ranges of the planned files. A
file whose size or modification time differs from its record changed after it was listed:
a :class:`~spark_ckpt.errors.SourceError` naming it (a replay could not return the same
rows). A malformed JSON line or CSV row is named (file and line) and fails the read; with
``badRecordsPath`` it is set aside instead (:class:`BadRecords`: a Parquet file per file
range read, under that directory, with the file, the line, the record and the reason;
rewritten identically on a replay) and its position is left empty.

Cleaning
--------
``cleanSource`` (``archive`` into ``sourceArchiveDir``, or ``delete``) acts on a file only
after a completed checkpoint covers all of its rows (:meth:`FilesChannelSource.clean`, called
by the source runner with each completed checkpoint's positions), as Spark's option does after
a batch commits. Cleaned files stay in the listing; a restore from an older checkpoint that
needs them again fails naming the file.

Pure: pyarrow only (no pyspark, no deltalake).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from spark_ckpt.errors import ConfigError, SourceError
from spark_ckpt.protocol.option import parse_int

FORMATS: Final = ("parquet", "json", "csv")
CLEAN_SOURCE: Final = ("off", "archive", "delete")
#: Option keys of ``source=files`` (lower-case).
OPTION_KEYS: Final = frozenset(
    {
        "path",
        "format",
        "schema",
        "header",
        "channels",
        "maxfilespertrigger",
        "cleansource",
        "sourcearchivedir",
        "badrecordspath",
    }
)
log = logging.getLogger(__name__)

LISTING: Final = os.path.join("_sources", "files.jsonl")
LISTING_VERSION: Final = 1

#: Spark SQL type names of a DDL schema, as Arrow types.
_TYPES: Final = {
    "string": pa.string(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "tinyint": pa.int8(),
    "byte": pa.int8(),
    "smallint": pa.int16(),
    "short": pa.int16(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


def parse_schema(text: str) -> pa.Schema:
    """A DDL schema (``"name type, name type"``, Spark's simple types and
    ``decimal(p, s)``) as an Arrow schema; :class:`ConfigError` on ``schema`` otherwise."""
    fields = []
    for part in re.split(r",(?![^(]*\))", text):
        words = part.strip().split(None, 1)
        if len(words) != 2:
            raise ConfigError("schema", text, "'name type, name type', e.g. 'id long, v string'")
        name, kind = words[0].strip("`"), words[1].strip().lower()
        decimal = re.fullmatch(r"decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)", kind)
        if decimal:
            fields.append(pa.field(name, pa.decimal128(int(decimal[1]), int(decimal[2]))))
        elif kind in _TYPES:
            fields.append(pa.field(name, _TYPES[kind]))
        else:
            raise ConfigError("schema", text, f"a known type for {name!r}: {sorted(_TYPES)}")
    return pa.schema(fields)


@dataclass(frozen=True)
class FilesSpec:
    """The options of ``source=files`` (see the module docstring). Picklable."""

    path: str
    format: str
    channels: int = 1
    schema: pa.Schema | None = None
    header: bool = True
    max_files_per_trigger: int | None = None
    clean_source: str = "off"
    archive_dir: str | None = None
    bad_records_path: str | None = None

    @staticmethod
    def from_options(options: Mapping[str, str]) -> FilesSpec:
        """From ``ckpt-source`` options (keys in any case); :class:`ConfigError` naming the
        option."""
        options = {k.strip().lower(): str(v) for k, v in options.items()}
        path = options.get("path", "").strip()
        if not path:
            raise ConfigError("path", None, "the directory where the files land (source=files)")
        fmt = options.get("format", "").strip().lower()
        if fmt not in FORMATS:
            raise ConfigError("format", options.get("format"), " or ".join(FORMATS))
        channels = parse_int("channels", options.get("channels", "1"))
        if channels < 1:
            raise ConfigError("channels", options["channels"], "an integer >= 1")
        limit = options.get("maxfilespertrigger")
        max_files = None if limit is None else parse_int("maxFilesPerTrigger", limit)
        if max_files is not None and max_files < 1:
            raise ConfigError("maxFilesPerTrigger", limit, "a positive integer")
        clean = options.get("cleansource", "off").strip().lower()
        if clean not in CLEAN_SOURCE:
            raise ConfigError("cleanSource", options.get("cleansource"), " or ".join(CLEAN_SOURCE))
        archive = options.get("sourcearchivedir")
        if clean == "archive" and not archive:
            raise ConfigError("sourceArchiveDir", None, "a directory (cleanSource=archive)")
        header = options.get("header", "true").strip().lower()
        if header not in ("true", "false"):
            raise ConfigError("header", options.get("header"), "true or false")
        text = options.get("schema")
        return FilesSpec(
            path=os.path.abspath(path),
            format=fmt,
            channels=channels,
            schema=None if text is None else parse_schema(text),
            header=header == "true",
            max_files_per_trigger=max_files,
            clean_source=clean,
            archive_dir=None if archive is None else os.path.abspath(archive),
            bad_records_path=options.get("badrecordspath"),
        )


@dataclass(frozen=True)
class ListedFile:
    """A file as recorded in the listing."""

    seq: int
    path: str  # relative to the directory
    size: int
    mtime_ns: int
    rows: int
    channel: int

    def to_json(self) -> str:
        return json.dumps(
            {
                "seq": self.seq,
                "path": self.path,
                "size": self.size,
                "mtime_ns": self.mtime_ns,
                "rows": self.rows,
                "channel": self.channel,
            },
            sort_keys=True,
        )


class FileListing:
    """The append-only record of the files of one pipeline's directory (see the module
    docstring): a header line (directory, format, channels, schema), then a line per file.
    A torn last line (the source runner was killed while appending) is ignored and
    overwritten."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, LISTING)
        self.header: dict[str, Any] | None = None
        self.files: list[ListedFile] = []
        self._good_bytes = 0
        if os.path.exists(self.path):
            self._load()

    def _load(self) -> None:
        with open(self.path, "rb") as f:
            data = f.read()
        good = 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # torn
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise SourceError(f"the file listing {self.path} is damaged: {e}") from e
            if self.header is None:
                self.header = d
            else:
                self.files.append(ListedFile(**d))
            good += len(line)
        self._good_bytes = good

    @property
    def schema(self) -> pa.Schema | None:
        if self.header is None:
            return None
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(self.header["schema"])))

    def start(self, spec: FilesSpec, schema: pa.Schema) -> None:
        """Record the header (the first file's listing fixes the schema)."""
        header = {
            "v": LISTING_VERSION,
            "directory": spec.path,
            "format": spec.format,
            "channels": spec.channels,
            "schema": base64.b64encode(schema.serialize().to_pybytes()).decode(),
        }
        self._append([json.dumps(header, sort_keys=True)])
        self.header = header

    def record(self, files: Sequence[ListedFile]) -> None:
        self._append([f.to_json() for f in files])
        self.files.extend(files)

    def _append(self, lines: Sequence[str]) -> None:
        if not lines:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "ab") as f:
            f.truncate(self._good_bytes)
            payload = "".join(line + "\n" for line in lines).encode()
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        self._good_bytes += len(payload)


def _is_hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def _text_lines(data: bytes) -> list[tuple[int, bytes]]:
    """The non-empty lines of *data* with their 1-based line numbers."""
    return [(i + 1, line) for i, line in enumerate(data.splitlines()) if line.strip()]


def count_rows(spec: FilesSpec, full_path: str) -> int:
    """Rows of a file: Parquet's row count, non-empty lines of JSON lines, CSV data lines."""
    if spec.format == "parquet":
        return int(pq.ParquetFile(full_path).metadata.num_rows)
    with open(full_path, "rb") as f:
        lines = _text_lines(f.read())
    return len(lines) - (1 if spec.format == "csv" and spec.header and lines else 0)


def infer_schema(spec: FilesSpec, full_path: str) -> pa.Schema:
    """The schema of one file, inferred by pyarrow (timestamps as UTC microseconds)."""
    if spec.format == "parquet":
        schema = pq.read_schema(full_path)
    elif spec.format == "json":
        schema = pajson.read_json(full_path).schema
    else:
        schema = pacsv.read_csv(
            full_path, read_options=pacsv.ReadOptions(autogenerate_column_names=not spec.header)
        ).schema
    return pa.schema(
        [
            pa.field(f.name, pa.timestamp("us", tz="UTC"))
            if pa.types.is_timestamp(f.type)
            else f.with_nullable(True)
            for f in schema
        ]
    )


@dataclass(frozen=True)
class FileRange:
    """Rows ``[first, first + rows)`` of one listed file."""

    file: ListedFile
    first: int
    rows: int


@dataclass(frozen=True)
class BadRecords:
    """Where malformed records are set aside (``badRecordsPath``): one Parquet file per file
    range read (columns ``path``, ``line``, ``record``, ``reason``), named by the range, so a
    replay rewrites the same file."""

    directory: str

    def write(self, source: str, first: int, rows: list[dict[str, Any]]) -> None:
        os.makedirs(self.directory, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", source)
        target = os.path.join(self.directory, f"{name}-{first}.parquet")
        table = pa.Table.from_pylist(
            rows,
            schema=pa.schema(
                [
                    ("path", pa.string()),
                    ("line", pa.int64()),
                    ("record", pa.string()),
                    ("reason", pa.string()),
                ]
            ),
        )
        tmp = f"{target}.tmp-{os.getpid()}"
        pq.write_table(table, tmp)
        os.replace(tmp, target)


@dataclass(frozen=True)
class FilesReadPlan:
    """Rows ``[start, end)`` of one channel: *ranges* of its files, in order (picklable; read
    on an executor)."""

    channel: int
    start: int
    end: int
    spec: FilesSpec
    schema: pa.Schema
    ranges: tuple[FileRange, ...] = field(default=())

    def read(self) -> pa.Table:
        return self.read_positioned()[0]

    def read_positioned(self) -> tuple[pa.Table, pa.Array]:
        """The rows and each row's position (a malformed record set aside leaves a gap)."""
        tables, positions = [], []
        at = self.start
        for r in self.ranges:
            table, kept = self._read_range(r)
            tables.append(table)
            positions.append(pa.array(at + kept, pa.int64()))
            at += r.rows
        if not tables:
            return self.schema.empty_table(), pa.array([], pa.int64())
        return pa.concat_tables(tables), pa.concat_arrays(positions)

    def _read_range(self, r: FileRange) -> tuple[pa.Table, npt.NDArray[np.int64]]:
        full = os.path.join(self.spec.path, r.file.path)
        try:
            st = os.stat(full)
        except OSError as e:
            raise SourceError(f"file {full} (listed) cannot be read: {e}") from e
        if (st.st_size, st.st_mtime_ns) != (r.file.size, r.file.mtime_ns):
            raise SourceError(
                f"file {full} changed after it was listed (size {r.file.size} -> {st.st_size}, "
                "or its modification time): files must not change once they landed"
            )
        if self.spec.format == "parquet":
            table = pq.read_table(full).slice(r.first, r.rows)
            return _conform(table, self.schema, full), np.arange(r.rows, dtype=np.int64)
        with open(full, "rb") as f:
            lines = _text_lines(f.read())
        header: bytes | None = None
        if self.spec.format == "csv" and self.spec.header:
            header, lines = lines[0][1], lines[1:]
        wanted = lines[r.first : r.first + r.rows]
        try:
            parsed = self._parse([line for _, line in wanted], header)
            return parsed, np.arange(len(wanted), dtype=np.int64)
        except (pa.ArrowInvalid, ValueError):
            pass  # find the bad lines, one by one
        good: list[bytes] = []
        kept: list[int] = []
        bad: list[dict[str, Any]] = []
        for i, (number, line) in enumerate(wanted):
            try:
                self._parse([line], header)
            except (pa.ArrowInvalid, ValueError) as e:
                reason = str(e).splitlines()[0]
                if self.spec.bad_records_path is None:
                    raise SourceError(
                        f"malformed {self.spec.format} record in {full}, line {number}: {reason}"
                    ) from e
                bad.append(
                    {
                        "path": full,
                        "line": number,
                        "record": line.decode(errors="replace"),
                        "reason": reason,
                    }
                )
                continue
            good.append(line)
            kept.append(i)
        if bad and self.spec.bad_records_path is not None:
            BadRecords(self.spec.bad_records_path).write(r.file.path, r.first, bad)
        return self._parse(good, header), np.asarray(kept, dtype=np.int64)

    def _parse(self, lines: list[bytes], header: bytes | None) -> pa.Table:
        if not lines:
            return self.schema.empty_table()
        if self.spec.format == "json":
            data = b"\n".join(lines) + b"\n"
            table = pajson.read_json(
                pa.BufferReader(data),
                parse_options=pajson.ParseOptions(
                    explicit_schema=self.schema, unexpected_field_behavior="ignore"
                ),
            )
        else:
            data = b"\n".join(([header] if header is not None else []) + lines) + b"\n"
            names = None if header is not None else self.schema.names
            table = pacsv.read_csv(
                pa.BufferReader(data),
                read_options=pacsv.ReadOptions(column_names=names),
                convert_options=pacsv.ConvertOptions(
                    column_types={f.name: f.type for f in self.schema}
                ),
            )
            if table.num_rows != len(lines):
                raise ValueError(f"{len(lines)} lines gave {table.num_rows} rows")
        return _conform(table, self.schema, "")


def _conform(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
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


class FilesChannelSource:
    """See the module docstring. Driver side (the source runner)."""

    def __init__(self, spec: FilesSpec, root: str) -> None:
        if not os.path.isdir(spec.path):
            raise ConfigError("path", spec.path, "an existing directory")
        self.spec = spec
        self.listing = FileListing(root)
        header = self.listing.header
        if header is not None and (header["directory"], header["channels"]) != (
            spec.path,
            spec.channels,
        ):
            raise ConfigError(
                "channels",
                spec.channels,
                f"{header['channels']} channels over {header['directory']}, as recorded in "
                f"{self.listing.path} (the listing of this pipeline)",
            )
        self._schema = self.listing.schema or spec.schema

    @property
    def channels(self) -> int:
        return self.spec.channels

    @property
    def schema(self) -> pa.Schema:
        """The listing's schema; before the first file is recorded, the ``schema`` option or
        the schema of the file that will be recorded first (nothing is recorded here)."""
        if self._schema is None:
            found = self._unlisted()
            if not found:
                raise SourceError(
                    f"no file in {self.spec.path} yet to infer the schema from: give the "
                    "'schema' option or let a file land first"
                )
            return infer_schema(self.spec, os.path.join(self.spec.path, found[0][1]))
        return self._schema

    def heads(self) -> list[int]:
        """Record new files (at most ``maxFilesPerTrigger``); each channel's rows so far."""
        self._list_new(self.spec.max_files_per_trigger)
        return self._heads()

    def heads_available_now(self) -> list[int]:
        """``Trigger.AvailableNow``: record every file there now; each channel's rows."""
        self._list_new(None)
        return self._heads()

    def admit(self, positions: Sequence[int], target: Sequence[int]) -> list[int]:
        """``Trigger.AvailableNow`` with ``maxFilesPerTrigger``: the heads of the next batch
        from *positions*, at most that many files further in listing order (a file partly
        read counts), never past *target*; *target* itself without the option."""
        limit = self.spec.max_files_per_trigger
        if limit is None:
            return list(target)
        heads = list(positions)
        ends = [0] * self.spec.channels
        taken = 0
        for f in self.listing.files:
            ends[f.channel] += f.rows
            end = min(ends[f.channel], target[f.channel])
            if f.rows == 0 or end <= positions[f.channel]:
                continue
            if taken == limit:
                break
            heads[f.channel] = end
            taken += 1
        return heads

    def _heads(self) -> list[int]:
        heads = [0] * self.spec.channels
        for f in self.listing.files:
            heads[f.channel] += f.rows
        return heads

    def _unlisted(self) -> list[tuple[int, str, int]]:
        """(modification time, name, size) of the files not recorded yet, in listing order."""
        known = {f.path for f in self.listing.files}
        found = []
        for entry in os.scandir(self.spec.path):
            if entry.is_file() and not _is_hidden(entry.name) and entry.name not in known:
                st = entry.stat()
                found.append((st.st_mtime_ns, entry.name, st.st_size))
        return sorted(found)

    def _list_new(self, limit: int | None) -> None:
        found = self._unlisted()
        if limit is not None:
            found = found[:limit]
        if not found:
            return
        if self.listing.header is None:
            first = os.path.join(self.spec.path, found[0][1])
            schema = self.spec.schema or infer_schema(self.spec, first)
            self.listing.start(self.spec, schema)
            self._schema = schema
        seq = len(self.listing.files)
        new = [
            ListedFile(
                seq + i,
                name,
                size,
                mtime,
                count_rows(self.spec, os.path.join(self.spec.path, name)),
                (seq + i) % self.spec.channels,
            )
            for i, (mtime, name, size) in enumerate(found)
        ]
        self.listing.record(new)

    def plan(self, channel: int, start: int, end: int) -> FilesReadPlan:
        ranges = []
        at = 0
        for f in self.listing.files:
            if f.channel != channel:
                continue
            lo, hi = max(start, at), min(end, at + f.rows)
            if lo < hi:
                ranges.append(FileRange(f, lo - at, hi - lo))
            at += f.rows
        return FilesReadPlan(channel, start, end, self.spec, self.schema, tuple(ranges))

    def checkpoint_completed(self, checkpoint_id: int, positions: Sequence[int]) -> None:
        """Source runner, after checkpoint *checkpoint_id* completed with *positions*:
        ``cleanSource`` the files it covers (see :meth:`clean`). Idempotent."""
        for path in self.clean(positions):
            log.info("cleanSource: %s (covered by checkpoint %d)", path, checkpoint_id)

    def clean(self, positions: Sequence[int]) -> list[str]:
        """``cleanSource``: archive or delete every file whose rows all lie before
        *positions* (a completed checkpoint's, per channel). Returns the files cleaned;
        a file already gone is skipped, one that cannot be moved or deleted is logged and
        tried again after the next checkpoint."""
        if self.spec.clean_source == "off":
            return []
        done = []
        at = [0] * self.spec.channels
        for f in self.listing.files:
            at[f.channel] += f.rows
            if at[f.channel] > positions[f.channel]:
                continue
            full = os.path.join(self.spec.path, f.path)
            if not os.path.exists(full):
                continue
            try:
                if self.spec.clean_source == "delete":
                    os.remove(full)
                else:
                    assert self.spec.archive_dir is not None
                    os.makedirs(self.spec.archive_dir, exist_ok=True)
                    shutil.move(full, os.path.join(self.spec.archive_dir, f.path))
            except OSError as e:  # as Spark's cleanSource: a warning, tried again next time
                log.warning("cleanSource=%s of %s failed: %s", self.spec.clean_source, full, e)
                continue
            done.append(f.path)
        return done

"""A :class:`~spark_ckpt.sources.channel_source.ChannelSource` that tails an append-only Delta
table.

``ckpt-source`` with ``source = "delta"`` reads another pipeline's output (any Delta table)
as ``channels`` replayable logs. The Delta log is read with ``deltalake`` (delta-rs) and the
commit files of the Delta protocol; data files are read with pyarrow. No Spark.

The channel logs
----------------
The *log of the table* is its data files in commit order: versions ascending from
``starting_version`` (version 0 holds the table's initial data), and within one version the
files it adds, sorted by their ``path`` as written in the Delta log. A file belongs to
channel :func:`file_channel` ``(path, channels)`` — the first 8 bytes of the SHA-256 of the
UTF-8 path, big endian, modulo ``channels``: stable across processes and Python versions.
The log of channel *c* is the rows of its files, file after file, each file's rows in file
order. A channel position (offset) is the number of rows of that channel's log before it,
so ``heads()[c]`` is the number of rows channel *c* holds so far.

Because committed Delta versions never change, the logs are a pure function of
``(table history, starting_version, channels)``: a source rebuilt after a restart, on any
process, assigns every row the same ``(channel, offset)``.

Append-only history
-------------------
Replay needs rows that never disappear, so only appends are supported:

* a commit that removes data files with ``dataChange = true`` (DELETE, UPDATE, MERGE, an
  overwrite of existing data, ...) raises :class:`~spark_ckpt.errors.ProtocolError` naming
  the version and its operation, from that ``heads()`` call on (the source stops advancing);
* ``add``/``remove`` actions with ``dataChange = false`` (OPTIMIZE, which rewrites existing
  rows into new files) are ignored: such a commit is a no-op for the channels, whose logs go
  on referencing the original files. Those must therefore stay on disk for as long as any
  replay may need them — do not ``VACUUM`` a tailed table with a retention shorter than the
  checkpoints you may restore;
* the commit file of every version from ``starting_version`` on must still exist (Delta log
  cleanup removes old ones after a log checkpoint): a missing one is a ``ProtocolError``.

Unsupported tables are refused at construction with a :class:`~spark_ckpt.errors.ConfigError`
on ``path``: a missing table (the source schema comes from the table, so the upstream must
have created it — e.g. with ``DeltaTable.create`` — before the downstream starts), partitioned
tables, column mapping and deletion vectors. Columns added later by schema evolution are
ignored; a later commit that drops or retypes a column of :attr:`DeltaTailSource.schema` is a
``ProtocolError``. Files that lack a column of the schema (written before it was added) yield
nulls for it.

Schema and upstream barrier columns
-----------------------------------
:attr:`DeltaTailSource.schema` is the table's Arrow schema (delta-rs' mapping: Delta
``timestamp`` is ``timestamp[us, tz=UTC]``). A table written by an upstream spark-ckpt
pipeline that kept its barrier columns has columns named ``_ckpt_*``, which would collide
with the downstream's own barrier columns. Every column named ``_ckpt_*`` — or
``_upstream_ckpt_*``, ``_upstream_upstream_ckpt_*``, ... — is renamed by prefixing
``_upstream`` (:func:`upstream_name`; injective, so chains of pipelines never collide). The
upstream's barrier and cancel rows thus pass through as ordinary data rows: the downstream
aligns on its own barriers only, and the upstream lineage (channel, offset, checkpoint id)
stays queryable.

Where things run
----------------
:meth:`DeltaTailSource.heads` and :meth:`DeltaTailSource.plan` run on the driver (the
source runner) and keep an incremental in-memory index; :meth:`DeltaReadPlan.read` runs on
executors and needs only pyarrow. Data files and commit files are read through a native
pyarrow file system resolved from the table URI (local paths, ``file://``, and the object
stores pyarrow supports, with credentials from the environment); *storage_options* are
passed to delta-rs only. (delta-rs' own Python file system handler is avoided: with
deltalake 1.6 and pyarrow 26 using it aborts the interpreter at exit.)
"""

from __future__ import annotations

import base64
import hashlib
import json
import operator
import re
from bisect import bisect_right
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Final
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError

from spark_ckpt.delta.boundary import delta_boundary
from spark_ckpt.delta.log_commits import COMMIT_FILE, DamagedCommitError, read_commit
from spark_ckpt.errors import ConfigError, ProtocolError
from spark_ckpt.protocol.option import check_int, parse_int
from spark_ckpt.sources.channel_source import check_channel

#: Prefix of the barrier columns of :mod:`spark_ckpt.protocol.barrier`.
BARRIER_PREFIX: Final = "_ckpt_"
#: What :func:`upstream_name` prepends.
UPSTREAM_PREFIX: Final = "_upstream"

_UPSTREAM_COLUMN = re.compile(f"(?:{UPSTREAM_PREFIX})*{BARRIER_PREFIX}.*", re.DOTALL)
_MAX_CHANNELS: Final = 2**31 - 1
_MAX_VERSION: Final = 2**62


def upstream_name(name: str) -> str:
    """The source column name of table column *name*: ``_upstream`` + *name* for barrier-like
    names (``(_upstream)*_ckpt_*``), *name* itself otherwise."""
    return UPSTREAM_PREFIX + name if _UPSTREAM_COLUMN.fullmatch(name) else name


def file_channel(path: str, channels: int) -> int:
    """The channel of the data file whose Delta-log ``path`` is *path*: the first 8 bytes of
    ``sha256(path.encode("utf-8"))`` as a big-endian unsigned integer, modulo *channels*."""
    digest = hashlib.sha256(path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % channels


# --- executor side --------------------------------------------------------------------------


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
        fs, base = _filesystem(self.root)
        parts = [self._read_slice(fs, base, s) for s in self.slices]
        return pa.concat_tables(parts)

    def _read_slice(self, fs: pafs.FileSystem, base: str, piece: FileSlice) -> pa.Table:
        file_fs, location = _file_location(fs, base, piece.path)
        what = f"reading data file {piece.path!r} of {self.root}"
        with _boundary(what), file_fs.open_input_file(location) as handle:
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


def _filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    """The native pyarrow file system of *root* and the root's path in it."""
    with _boundary(f"resolving the file system of {root}"):
        fs, path = pafs.FileSystem.from_uri(root)
    return fs, path.rstrip("/")


def _file_location(fs: pafs.FileSystem, base: str, path: str) -> tuple[pafs.FileSystem, str]:
    """Where the data file with Delta-log *path* lives: relative paths are URL-decoded and
    joined to the table root; absolute URIs get their own file system."""
    if "://" in path:
        return _filesystem(path)
    return fs, f"{base}/{unquote(path)}"


def _boundary(what: str) -> AbstractContextManager[None]:
    """Translate delta-rs / Arrow / OS errors into :class:`ProtocolError`."""
    return delta_boundary(what, ProtocolError)


# --- driver side ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _IndexedFile:
    """One data file of a channel log: its first channel offset, Delta-log path and rows."""

    start: int
    path: str
    rows: int


class DeltaTailSource:
    """The ``source = "delta"`` channel source: ``channels`` logs over the data files the
    Delta table at *table_uri* adds from ``starting_version`` on (see the module docstring).

    Construction loads the table (driver side) and raises :class:`ConfigError` naming
    ``path`` when it does not exist or is unsupported, ``channels``/``startingVersion`` when
    out of range. :meth:`heads` and :meth:`plan` are driver side and not thread safe;
    :meth:`heads` is incremental (reads only the commit files of versions it has not seen).
    """

    #: Option keys understood by :meth:`from_options` (lower case).
    OPTION_KEYS: ClassVar[tuple[str, ...]] = ("path", "channels", "startingversion")

    def __init__(
        self,
        table_uri: str,
        *,
        channels: int = 1,
        starting_version: int = 0,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self._channels = check_int("channels", channels, 1, _MAX_CHANNELS)
        self._starting_version = check_int("startingVersion", starting_version, 0, _MAX_VERSION)
        self._storage_options = storage_options
        uri = str(table_uri)
        try:
            exists = DeltaTable.is_deltatable(uri, storage_options)
            table = DeltaTable(uri, storage_options=storage_options) if exists else None
        except (DeltaError, OSError) as e:
            raise ConfigError("path", uri, f"a readable Delta table ({e})") from e
        if table is None:
            raise ConfigError("path", uri, "the location of an existing Delta table")
        self._table = table
        self._root = table.table_uri.rstrip("/")
        self._check_supported(uri)
        physical = pa.schema(table.schema().to_arrow())
        self._columns: tuple[str, ...] = tuple(physical.names)
        self._physical = physical
        renamed = [upstream_name(name) for name in physical.names]
        if len(set(renamed)) != len(renamed):
            raise ConfigError("path", uri, "a table whose column names stay distinct")
        self._schema = pa.schema(
            [f.with_name(n) for f, n in zip(physical, renamed, strict=True)],
            metadata=physical.metadata,
        )
        self._index: list[list[_IndexedFile]] = [[] for _ in range(self._channels)]
        self._starts: list[list[int]] = [[] for _ in range(self._channels)]
        self._heads = [0] * self._channels
        self._next_version = self._starting_version

    @classmethod
    def from_options(
        cls, options: Mapping[str, str], *, storage_options: dict[str, str] | None = None
    ) -> DeltaTailSource:
        """Build a source from Spark-style string options (keys matched case-insensitively;
        other keys are ignored, they belong to other subsystems).

        =============== ===================================== =======
        key             value                                 default
        =============== ===================================== =======
        path            URI or local path of the Delta table  required
        channels        integer >= 1                          1
        startingVersion first table version to tail, >= 0     0
        =============== ===================================== =======

        Any invalid or missing value raises :class:`ConfigError` naming the option key.
        """
        opts = {str(k).lower(): v for k, v in options.items()}

        def text(key: str, default: str | None) -> str | None:
            value = opts.get(key, default)
            if value is not None and not isinstance(value, str):
                raise ConfigError(key, value, "a string")
            return None if value is None else value.strip()

        path = text("path", None)
        if not path:
            raise ConfigError("path", path, "the location of an existing Delta table")
        channels = parse_int("channels", text("channels", "1") or "")
        starting = parse_int("startingVersion", text("startingversion", "0") or "")
        return cls(
            path, channels=channels, starting_version=starting, storage_options=storage_options
        )

    # --- ChannelSource ---------------------------------------------------------------------

    @property
    def channels(self) -> int:
        return self._channels

    @property
    def schema(self) -> pa.Schema:
        """The table's columns, barrier-like names renamed by :func:`upstream_name`."""
        return self._schema

    @property
    def table_uri(self) -> str:
        """The table root as delta-rs resolved it (a URI, no trailing slash)."""
        return self._root

    @property
    def starting_version(self) -> int:
        return self._starting_version

    @property
    def next_version(self) -> int:
        """The first table version :meth:`heads` has not indexed yet."""
        return self._next_version

    def heads(self) -> list[int]:
        """Driver side: rows per channel in the versions ``[starting_version, latest]``.

        Loads the newest table version and indexes the commits not seen before, in version
        order; each commit is applied atomically (all its files or none). Non-decreasing over
        calls. Raises :class:`ProtocolError` on a commit that removes data (and on every later
        call: the source does not advance past it) or when the log cannot be read."""
        with _boundary(f"loading the Delta table {self._root}"):
            self._table.update_incremental()
            latest = self._table.version()
        if latest >= self._next_version:
            fs, base = _filesystem(self._root)
            while self._next_version <= latest:
                actions = self._read_commit(fs, base, self._next_version)
                self._apply(fs, base, self._next_version, actions)
                self._next_version += 1
        return list(self._heads)

    def plan(self, channel: int, start: int, end: int) -> DeltaReadPlan:
        """Driver side: the files and row ranges holding rows ``[start, end)`` of *channel*.
        Requires ``0 <= start <= end <= heads()[channel]`` (as of the last :meth:`heads`
        call), else :class:`ProtocolError`."""
        channel = check_channel(channel, self._channels, "the source")
        head = self._heads[channel]
        if not 0 <= start <= end <= head:
            raise ProtocolError(
                f"bad row range [{start}, {end}) of channel {channel}: need "
                f"0 <= start <= end <= {head} (its head)"
            )
        files = self._index[channel]
        slices: list[FileSlice] = []
        if start < end:
            i = bisect_right(self._starts[channel], start) - 1
            while i < len(files) and files[i].start < end:
                f = files[i]
                lo = max(start, f.start)
                hi = min(end, f.start + f.rows)
                slices.append(FileSlice(f.path, lo - f.start, hi - lo))
                i += 1
        return DeltaReadPlan(
            channel=channel,
            start=start,
            end=end,
            root=self._root,
            columns=self._columns,
            schema=self._schema,
            slices=tuple(slices),
        )

    # --- internals -------------------------------------------------------------------------

    def _check_supported(self, uri: str) -> None:
        metadata = self._table.metadata()
        if metadata.partition_columns:
            raise ConfigError("path", uri, "an unpartitioned Delta table")
        mode = metadata.configuration.get("delta.columnMapping.mode")
        if mode not in (None, "none"):
            raise ConfigError("path", uri, "a Delta table without column mapping")
        features = self._table.protocol().reader_features or []
        if "deletionVectors" in features:
            raise ConfigError("path", uri, "a Delta table without deletion vectors")

    def _read_commit(self, fs: pafs.FileSystem, base: str, version: int) -> list[dict[str, Any]]:
        """The actions of the commit file of *version*, in file order."""
        name = COMMIT_FILE.format(version=version)
        try:
            actions = read_commit(fs, version, root=base)
        except DamagedCommitError as e:
            raise ProtocolError(f"corrupt commit file {name} of {self._root}: {e}") from e
        except (OSError, pa.ArrowException) as e:
            raise ProtocolError(f"cannot read {name} of {self._root}: {e}") from e
        if actions is None:
            raise ProtocolError(
                f"the commit file of version {version} of {self._root} no longer exists (Delta "
                "log cleanup?): tail from a later startingVersion"
            )
        return actions

    def _apply(
        self, fs: pafs.FileSystem, base: str, version: int, actions: list[dict[str, Any]]
    ) -> None:
        """Index the data files *actions* (the commit of *version*) add; ProtocolError, with
        nothing indexed, if the commit removes data or changes the schema incompatibly."""
        operation = "unknown operation"
        added: list[dict[str, Any]] = []
        for action in actions:
            if "commitInfo" in action:
                operation = str(action["commitInfo"].get("operation", operation))
        for action in actions:
            if "remove" in action and action["remove"].get("dataChange", True):
                raise ProtocolError(
                    f"version {version} of {self._root} ({operation}) removes data files: "
                    "ckpt-source tails append-only Delta tables"
                )
            if "add" in action and action["add"].get("dataChange", True):
                add = action["add"]
                if add.get("deletionVector"):
                    raise ProtocolError(
                        f"version {version} of {self._root} ({operation}) adds a file with a "
                        "deletion vector: ckpt-source tails append-only Delta tables"
                    )
                if add.get("partitionValues"):
                    raise ProtocolError(
                        f"version {version} of {self._root} ({operation}) adds a partitioned "
                        "file: ckpt-source tails unpartitioned Delta tables"
                    )
                added.append(add)
            if "metaData" in action:
                self._check_schema(version, operation, action["metaData"])
        added.sort(key=operator.itemgetter("path"))
        counts = [self._row_count(fs, base, add) for add in added]
        for add, rows in zip(added, counts, strict=True):
            if rows == 0:
                continue
            channel = file_channel(add["path"], self._channels)
            start = self._heads[channel]
            self._index[channel].append(_IndexedFile(start, add["path"], rows))
            self._starts[channel].append(start)
            self._heads[channel] = start + rows

    def _check_schema(self, version: int, operation: str, metadata: dict[str, Any]) -> None:
        """ProtocolError unless the schema of a ``metaData`` action keeps every column of the
        source's physical schema with the same type (additions are fine)."""
        try:
            schema = pa.schema(DeltaSchema.from_json(metadata["schemaString"]).to_arrow())
            partitioned = bool(metadata.get("partitionColumns"))
        except (KeyError, TypeError, DeltaError, ValueError, pa.ArrowException) as e:
            raise ProtocolError(
                f"version {version} of {self._root} ({operation}) has an unreadable schema: {e}"
            ) from e
        for field in self._physical:
            index = schema.get_field_index(field.name)
            if index < 0 or schema.field(index).type != field.type or partitioned:
                raise ProtocolError(
                    f"version {version} of {self._root} ({operation}) changes column "
                    f"{field.name!r} (or partitions the table): ckpt-source needs the columns "
                    "it started with"
                )

    def _row_count(self, fs: pafs.FileSystem, base: str, add: dict[str, Any]) -> int:
        """Rows of the added file: ``numRecords`` of its stats, else its Parquet footer."""
        stats = add.get("stats")
        if stats:
            try:
                records = json.loads(stats).get("numRecords")
            except (ValueError, AttributeError):
                records = None
            if isinstance(records, int) and not isinstance(records, bool) and records >= 0:
                return records
        file_fs, location = _file_location(fs, base, add["path"])
        what = f"reading the footer of {add['path']!r} of {self._root}"
        with _boundary(what), file_fs.open_input_file(location) as handle:
            return int(pq.read_metadata(handle).num_rows)

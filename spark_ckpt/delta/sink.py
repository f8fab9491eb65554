"""Exactly-once output into a Delta table: a two-phase-commit sink on delta-rs (``deltalake``).

The design follows Flink's ``TwoPhaseCommitSinkFunction`` (and Arroyo's Delta sink):

1. **Stage** (task side, executors or driver; never loads the Delta table). Output rows are
   encoded as they arrive into an in-progress Parquet file per (operator, subtask) (zstd,
   timestamps as UTC microseconds, barrier columns dropped; one row group per write), like
   the part files of Flink's file sink, directly under the table root, named
   ``part-<subtask>-<uuid4>-ckpt-<sink tag>.c000.zstd.parquet``. The name is unique and never
   reused; the tag is a hash of the sink's app id, so a sink only ever cleans up its own
   files. A staged file is described by a :class:`StagedFile` (path relative to the table
   root, size, rows, Delta statistics JSON). Staged files are invisible to Delta readers:
   nothing in the log references them.
2. **Pre-commit** (synchronous phase of checkpoint *n*) closes the in-progress file (writes
   its footer) and seals the subtask's staged files into a
   :class:`~spark_ckpt.sinks.sink.Transaction` whose payload is the tuple of
   :meth:`StagedFile.to_json` strings (an empty transaction is fine).
3. **Commit** adds the files to the Delta log. :meth:`DeltaSink.commit_checkpoint` makes
   every file of all transactions of checkpoint *n* visible in **one** Delta commit that also
   records the app transaction ``spark-ckpt/<pipeline>/<sink_uid>`` at version *n*.
   :meth:`DeltaSink.commit` (one transaction, what :meth:`OperatorTask.notify_complete
   <spark_ckpt.runtime.task.OperatorTask.notify_complete>` calls per subtask) adds one transaction's
   files and leaves the version where it is.
4. **Abort / recover** delete staged files that never became part of the table.
5. **Roll back** (at a restore, before recover) removes from the table this sink's output of
   checkpoints after the restored one, which the job replays.

Invariants and why they give exactly-once output:

* **Files are added at most once.** Every commit re-reads the table, drops the files already
  in it, and commits on exactly that snapshot with ``max_commit_retries=0``: delta-rs writes
  the next log file with put-if-absent, so the commit lands at the next version or raises
  ``CommitFailedError``; the loser re-reads, finds the files and does nothing. (Rebasing is
  deliberately off. With delta-rs' default retries an append carrying the same app id as a
  concurrent winner does fail — ``Concurrent transaction failed`` — but two racing
  ``create_table_with_add_actions`` calls were observed to *both* succeed: the loser's
  CREATE TABLE with its add actions was rebased to version 1, duplicating the data.)
  Every commit also carries the sink's app transaction, so delta-rs' own conflict check
  agrees.
* **The app version means "every transaction sealed at a checkpoint <= version is in the
  table".** :meth:`~DeltaSink.commit_checkpoint` for *n* is a no-op once the version is >= *n*
  (delta-rs itself would accept a *lower* version — verified — so the check is ours; it is
  race free because commits are never rebased). This is sound because the state of
  checkpoint *n'* records every sealed, uncommitted transaction <= *n'* of every subtask
  (``OperatorTask._complete`` in :mod:`spark_ckpt.runtime.task`): if *n'* > *n* was committed first,
  it contained the transactions of *n*. Consequently ``commit_checkpoint`` must be given
  **all** transactions of the checkpoint in one call, and one :class:`DeltaSink` (one
  ``sink_uid``) serves one sink vertex.
* **The app version is monotone except for a roll back at restore.** A job that restores
  checkpoint *r* replays its input from *r*'s source positions, so the table must then hold
  exactly the output of checkpoints <= *r* — also when it already holds output of later
  ones (the newest checkpoint was damaged and the restore fell back, or an older one was
  restored on purpose). :meth:`~DeltaSink.roll_back_to` *r* removes, in one commit that sets
  the version to *r*, every file still in the table that this sink's commits with a version
  above *r* added since its newest commit with a version <= *r* (found in the log's JSON
  commits). Such a commit may also have carried transactions of checkpoints <= *r* (whose own
  commit was lost in a crash); :meth:`~DeltaSink.recover`, which follows with *r*'s
  transactions, adds their files again whatever the version, which restores the invariant
  above. Checkpoint ids are never reused, so later checkpoints (> the damaged one > *r*)
  commit normally. Output of this sink that another writer rewrote (OPTIMIZE) cannot be
  rolled back.
* **Nothing referenced is deleted.** :meth:`~DeltaSink.abort` and the orphan sweep of
  :meth:`~DeltaSink.recover` skip files that the current table version references.
  ``recover`` must not run concurrently with writers of the same sink (it would delete their
  in-flight staged files): run it once per job (re)start, before any task writes.

The table is created by the first commit that has files, from their schema (all columns
nullable), with protocol reader 1 / writer 2: no deletion vectors, no column mapping, UTC
``timestamp`` columns — readable by Spark's Delta Lake, polars and DuckDB. ``partition_by``
is accepted for API stability but only ``()`` is supported (staging would have to write
Hive-style partition directories and partition values).

Errors of delta-rs, Arrow and the file system are translated into :class:`StoreError` here;
staged data that does not fit the table raises :class:`ProtocolError` naming the columns.

Threading: an instance may be shared by task threads and a committer thread (the open
buffers are guarded by a lock; every commit is an independent, retried Delta transaction).
Reads go through a native pyarrow file system: delta-rs' default Python file system handler
aborts the interpreter at exit in deltalake 1.6 + pyarrow 26.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake import Transaction as AppTransaction
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from spark_ckpt.delta.errors import delta_boundary
from spark_ckpt.errors import ConfigError, ProtocolError, StoreError
from spark_ckpt.protocol.barrier import BARRIER_COLUMNS
from spark_ckpt.sinks.sink import Transaction

#: The timestamp type of every timestamp column written (Delta's ``timestamp``).
UTC_MICROS = pa.timestamp("us", tz="UTC")

#: Parquet compression of staged files (part of the file name).
COMPRESSION = "zstd"

#: Default Arrow bytes written into one in-progress file per (operator, subtask) after which
#: it rolls before the transaction is sealed.
DEFAULT_TARGET_FILE_BYTES = 64 << 20

#: How often one commit is re-attempted after losing a commit race before giving up.
DEFAULT_MAX_ATTEMPTS = 64

#: Spark truncates string statistics to this many characters; longer maxima are omitted.
_STRING_STATS_PREFIX = 32

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class StagedFile:
    """One staged Parquet file. ``path`` is relative to the table root (what the Delta log
    records), ``size`` in bytes, ``rows`` its row count, ``stats`` the Delta statistics JSON
    (``numRecords``/``minValues``/``maxValues``/``nullCount``), ``modification_time`` in
    milliseconds since the epoch as the file system reported it."""

    path: str
    size: int
    rows: int
    stats: str
    modification_time: int = 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "path": self.path,
                "size": self.size,
                "rows": self.rows,
                "stats": self.stats,
                "modification_time": self.modification_time,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(text: str) -> StagedFile:
        try:
            d: dict[str, Any] = json.loads(text)
            return StagedFile(
                str(d["path"]),
                int(d["size"]),
                int(d["rows"]),
                str(d["stats"]),
                int(d.get("modification_time", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"not a staged file: {text!r}") from e

    def add_action(self) -> AddAction:
        return AddAction(self.path, self.size, {}, self.modification_time, True, self.stats)


def staged_files(txn: Transaction) -> list[StagedFile]:
    """The files of a transaction sealed by :meth:`DeltaSink.pre_commit`."""
    return [StagedFile.from_json(p) for p in txn.payload]


# -- schema coercion ---------------------------------------------------------------------------
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


def _delta_fields(schema: pa.Schema) -> dict[str, str]:
    """Column name -> Delta type (JSON) of an Arrow schema; unsupported types raise."""
    try:
        delta = DeltaSchema.from_arrow(schema)
    except Exception as e:  # delta-rs raises a bare Exception for unsupported types
        raise ProtocolError(f"the sink's schema is not a Delta schema: {e}".split("\n")[0]) from e
    return {f["name"]: json.dumps(f["type"]) for f in json.loads(delta.to_json())["fields"]}


def check_schema(table_fields: dict[str, str], staged: pa.Schema, path: str) -> None:
    """Raise :class:`ProtocolError` unless *staged* has the columns and types of the table
    (*table_fields* from :func:`_delta_fields`; column order and nullability don't matter)."""
    mine = _delta_fields(staged)
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


# -- statistics --------------------------------------------------------------------------------
def _iso_millis(micros: int) -> str:
    return (_EPOCH + timedelta(milliseconds=micros // 1000)).strftime("%Y-%m-%dT%H:%M:%S.%f")[
        :-3
    ] + "Z"


def _raw_bounds(column: pa.ChunkedArray) -> tuple[Any, Any] | None:
    """``(min, max)`` of a primitive column with at least one non-null value, as Python
    values (timestamps as integers of their unit), or ``None`` when the column can have no
    statistics (a type without them, or a float column with NaN)."""
    t = column.type
    if not (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_date32(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
    ):
        return None
    if pa.types.is_floating(t) and pc.any(pc.is_nan(column)).as_py():
        return None
    mm = pc.min_max(column.cast(pa.int64()) if pa.types.is_timestamp(t) else column)
    return mm["min"].as_py(), mm["max"].as_py()


def _json_bounds(t: pa.DataType, lo: Any, hi: Any) -> tuple[Any, Any] | None:
    """JSON-ready statistics from raw bounds, or ``None`` when none can be given safely.
    Timestamps (microseconds) are milliseconds in Delta: min rounded down, max up, so the
    range always contains every value; strings longer than Spark's 32-character prefix have
    no max (minima are cut to it); non-finite float bounds give none."""
    if pa.types.is_timestamp(t):
        return _iso_millis(lo), _iso_millis(-(-hi // 1000) * 1000)
    if pa.types.is_date32(t):
        return lo.isoformat(), hi.isoformat()
    if pa.types.is_floating(t) and not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    if isinstance(lo, str):
        # A prefix is <= the value (a safe min); a truncated max would not be safe.
        if len(hi) > _STRING_STATS_PREFIX:
            return None
        return lo[:_STRING_STATS_PREFIX], hi
    return lo, hi


class DeltaStats:
    """Delta file statistics accumulated over the tables written into one file: row count,
    null counts of top-level columns and min/max of primitive ones (best effort, used by
    Spark's data skipping; a column without min/max is simply never skipped). Bounds are
    accumulated as raw values (the min of the tables' mins, the max of their maxes) and
    formatted once (:func:`_json_bounds`); a column loses them for good once one table has
    non-null values but no safe bounds (:func:`_raw_bounds`)."""

    def __init__(self) -> None:
        self.rows = 0
        self._types: dict[str, pa.DataType] = {}
        self._nulls: dict[str, int] = {}
        self._bounds: dict[str, tuple[Any, Any]] = {}
        self._unsafe: set[str] = set()

    def add(self, table: pa.Table) -> DeltaStats:
        self.rows += table.num_rows
        for name, column in zip(table.column_names, table.columns, strict=True):
            if pa.types.is_nested(column.type):
                continue
            self._types.setdefault(name, column.type)
            self._nulls[name] = self._nulls.get(name, 0) + column.null_count
            if name in self._unsafe or column.null_count == len(column):
                continue
            raw = _raw_bounds(column)
            old = self._bounds.get(name)
            if raw is None:
                self._unsafe.add(name)
                self._bounds.pop(name, None)
            else:
                self._bounds[name] = (
                    raw if old is None else (min(old[0], raw[0]), max(old[1], raw[1]))
                )
        return self

    def to_json(self) -> str:
        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        for name, (lo, hi) in self._bounds.items():
            bounds = _json_bounds(self._types[name], lo, hi)
            if bounds is not None:
                mins[name], maxs[name] = bounds
        return json.dumps(
            {
                "numRecords": self.rows,
                "minValues": mins,
                "maxValues": maxs,
                "nullCount": self._nulls,
            },
            separators=(",", ":"),
        )


def delta_stats(table: pa.Table) -> str:
    """Delta file statistics (the ``stats`` JSON of an add action) of *table*."""
    return DeltaStats().add(table).to_json()


# -- the error boundary ------------------------------------------------------------------------
def _boundary(what: str) -> AbstractContextManager[None]:
    """Translate delta-rs / Arrow / OS errors into :class:`StoreError`."""
    return delta_boundary(what, StoreError)


class _PartFile:
    """An in-progress staged file: a Parquet writer open under the table root. Each
    :meth:`write` adds one row group and updates the Delta statistics; :meth:`close` writes
    the footer and describes the file. Until then the file has no footer: a crash leaves a
    truncated file that nothing references, which the orphan sweep of :meth:`DeltaSink.recover`
    deletes. Not thread safe (one writer thread per subtask)."""

    def __init__(self, fs: pafs.FileSystem, name: str, schema: pa.Schema) -> None:
        self.fs = fs
        self.name = name
        self.schema = schema
        self.stats = DeltaStats()
        self.nbytes = 0
        self._stream = fs.open_output_stream(name)
        self._writer = pq.ParquetWriter(
            self._stream,
            schema,
            compression=COMPRESSION,
            coerce_timestamps="us",
            use_deprecated_int96_timestamps=False,
        )

    def write(self, table: pa.Table) -> None:
        with _boundary(f"staging {self.name}"):
            self._writer.write_table(table)
        self.stats.add(table)
        self.nbytes += table.nbytes

    def close(self) -> StagedFile:
        with _boundary(f"staging {self.name}"):
            self._writer.close()
            self._stream.close()
            info = self.fs.get_file_info(self.name)
        mtime = 0 if info.mtime_ns is None else info.mtime_ns // 1_000_000
        return StagedFile(
            self.name, int(info.size or 0), self.stats.rows, self.stats.to_json(), mtime
        )

    def discard(self) -> None:
        """Close without describing and delete the file (best effort: the orphan sweep
        deletes whatever is left)."""
        with _boundary(f"discarding {self.name}"):
            try:
                self._writer.close()
                self._stream.close()
            finally:
                with suppress(FileNotFoundError):
                    self.fs.delete_file(self.name)


class DeltaSink:
    """Exactly-once sink into the Delta table at *table_uri* (a local path or a URI delta-rs
    understands; *storage_options* are passed to delta-rs). Staging and reading go through
    *filesystem*, a pyarrow file system whose root is the table root (default: a
    ``SubTreeFileSystem`` over ``pyarrow.fs.FileSystem.from_uri(table_uri)``; pass one for
    object stores whose credentials pyarrow does not find by itself). See the module
    docstring for the protocol and its invariants.

    *target_file_bytes*: the in-progress file of one subtask rolls (is closed into the open
    transaction) once the Arrow data written into it exceeds this size, and at
    :meth:`pre_commit`. *max_attempts* bounds re-attempts of one commit
    after losing a race.
    """

    def __init__(
        self,
        table_uri: str,
        *,
        pipeline: str,
        sink_uid: str,
        storage_options: dict[str, str] | None = None,
        partition_by: Sequence[str] = (),
        filesystem: pafs.FileSystem | None = None,
        target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        if tuple(partition_by):
            raise ConfigError("partition_by", tuple(partition_by), "() (unpartitioned tables)")
        if max_attempts < 1:
            raise ConfigError("max_attempts", max_attempts, "an integer >= 1")
        if "://" not in table_uri:
            table_uri = os.path.abspath(table_uri)
        self.table_uri = table_uri.rstrip("/")
        self.pipeline = pipeline
        self.sink_uid = sink_uid
        self.storage_options = storage_options
        self.target_file_bytes = target_file_bytes
        self.max_attempts = max_attempts
        self.app_id = f"spark-ckpt/{pipeline}/{sink_uid}"
        #: Part of every staged file name of this sink (hex, 12 chars).
        self.tag = hashlib.sha256(self.app_id.encode()).hexdigest()[:12]
        if filesystem is None:
            with _boundary(f"resolving the file system of {self.table_uri}"):
                base, root = pafs.FileSystem.from_uri(self.table_uri)
            self._base_fs: pafs.FileSystem = base
            self._root = root
            filesystem = pafs.SubTreeFileSystem(root, base)
        else:
            self._base_fs, self._root = filesystem, ""
        self._fs = filesystem
        self._root_ready = False
        self._table: DeltaTable | None = None
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], list[StagedFile]] = {}  # rolled, not yet sealed
        self._parts: dict[tuple[str, int], _PartFile] = {}  # in progress

    # -- staging (task side) -------------------------------------------------------------------
    def is_staged_name(self, path: str) -> bool:
        """Whether *path* (relative to the table root) is a file this sink stages."""
        return (
            path.startswith("part-") and f"-ckpt-{self.tag}." in path and path.endswith(".parquet")
        )

    def stage(self, table: pa.Table, *, subtask: int) -> StagedFile:
        """Write *table* (barrier columns dropped, types coerced by :func:`output_table`) as
        one new Parquet file under the table root and describe it. Does not touch the Delta
        log or load the table; the file stays invisible until committed. Runs anywhere the
        file system is reachable (executors or driver)."""
        out = output_table(table)
        part = self._open_part(out.schema, subtask)
        part.write(out)
        return part.close()

    def _open_part(self, schema: pa.Schema, subtask: int) -> _PartFile:
        _delta_fields(schema)  # unsupported types fail here, not at commit
        name = f"part-{subtask:05d}-{uuid.uuid4()}-ckpt-{self.tag}.c000.{COMPRESSION}.parquet"
        with _boundary(f"staging {name}"):
            if not self._root_ready and self._root:
                self._base_fs.create_dir(self._root, recursive=True)
                self._root_ready = True
            return _PartFile(self._fs, name, schema)

    def write(self, operator_uid: str, subtask: int, table: pa.Table) -> None:
        """Add *table* to the open transaction of (*operator_uid*, *subtask*): encode it into
        the subtask's in-progress Parquet file (one row group per call), as Flink's file
        sink encodes records as they arrive. The file rolls — is closed and joins the open
        transaction — once it holds ``target_file_bytes`` of Arrow data or the schema
        changes, and at :meth:`pre_commit`. Each (operator, subtask) is written by one
        thread at a time."""
        if table.num_rows == 0:
            return
        key = (operator_uid, subtask)
        out = output_table(table)
        with self._lock:
            part = self._parts.get(key)
        if part is not None and not part.schema.equals(out.schema):
            self._roll(key)  # one file per schema
            part = None
        if part is None:
            part = self._open_part(out.schema, subtask)
            with self._lock:
                self._parts[key] = part
        part.write(out)
        if part.nbytes >= self.target_file_bytes:
            self._roll(key)

    def _roll(self, key: tuple[str, int]) -> None:
        """Close the in-progress file of *key* (if any) into its open transaction."""
        with self._lock:
            part = self._parts.pop(key, None)
        if part is not None:
            staged = part.close()
            with self._lock:
                self._open.setdefault(key, []).append(staged)

    def pre_commit(self, operator_uid: str, subtask: int, checkpoint_id: int) -> Transaction:
        """Close the in-progress file and seal the open transaction of (*operator_uid*,
        *subtask*) as the transaction of *checkpoint_id* (possibly empty)."""
        key = (operator_uid, subtask)
        self._roll(key)
        with self._lock:
            files = self._open.pop(key, [])
        return Transaction(operator_uid, subtask, checkpoint_id, tuple(f.to_json() for f in files))

    # -- reading the table -----------------------------------------------------------------
    def _load(self) -> DeltaTable | None:
        """The newest version of the table (``None`` before its first commit): opened once,
        then brought up to date with ``update_incremental()``."""
        dt = self._table
        if dt is not None:
            dt.update_incremental()
            return dt
        if not DeltaTable.is_deltatable(self.table_uri, self.storage_options):
            return None
        self._table = DeltaTable(self.table_uri, storage_options=self.storage_options)
        return self._table

    @staticmethod
    def _table_paths(dt: DeltaTable) -> set[str]:
        actions = pa.table(dt.get_add_actions(flatten=True))
        return set(actions.column("path").to_pylist())

    def committed_checkpoint(self) -> int:
        """The sink's app-transaction version: every transaction sealed at a checkpoint <= it
        is in the table (0 if nothing was committed by :meth:`commit_checkpoint`)."""
        with _boundary(f"reading {self.table_uri}"):
            dt = self._load()
            version = None if dt is None else dt.transaction_version(self.app_id)
        return version or 0

    def committed_files(self) -> set[str]:
        """Paths (relative to the root) of the data files of the current table version."""
        with _boundary(f"reading {self.table_uri}"):
            dt = self._load()
            return set() if dt is None else self._table_paths(dt)

    def staged_paths(self, *, before_ms: int | None = None) -> list[str]:
        """Every file of this sink under the table root, committed or not (sorted); with
        *before_ms*, only those last modified before that time (ms since the epoch)."""
        with _boundary(f"listing {self.table_uri}"):
            infos = self._fs.get_file_info(pafs.FileSelector("", allow_not_found=True))
        return sorted(
            i.base_name
            for i in infos
            if self.is_staged_name(i.base_name)
            and (before_ms is None or i.mtime_ns is None or i.mtime_ns // 1_000_000 < before_ms)
        )

    def read(self) -> pa.Table:
        """The current table content (an empty table without columns if it doesn't exist).
        Reads through the native pyarrow file system."""
        with _boundary(f"reading {self.table_uri}"):
            dt = self._load()
            if dt is None:
                return pa.table({})
            return dt.to_pyarrow_dataset(filesystem=self._fs).to_table()

    # -- committing ------------------------------------------------------------------------
    def commit(self, txn: Transaction) -> None:
        """Make *txn*'s files visible (driver side). Idempotent: files already in the table
        are skipped. Leaves the app version unchanged (a per-subtask commit must not claim
        the whole checkpoint); raises :class:`StoreError` if a file to add is gone."""
        self._commit(f"committing {txn.txn_id}", staged_files(txn), None, skip_reached=False)

    def commit_checkpoint(self, checkpoint_id: int, txns: Sequence[Transaction]) -> bool:
        """Make every file of *txns* (all transactions recorded in completed checkpoint
        *checkpoint_id*) visible in one Delta commit that sets the app version to
        *checkpoint_id*. A no-op returning ``False`` if the version is already >=
        *checkpoint_id* (see the module docstring for why no file can be lost then) or if
        there is neither a table nor a file to create it from; ``True`` if it committed.
        Safe against concurrent committers of the same checkpoint."""
        if checkpoint_id < 0:
            raise ProtocolError(f"checkpoint id {checkpoint_id} is negative")
        files = [f for t in txns for f in staged_files(t)]
        return self._commit(
            f"committing checkpoint {checkpoint_id}", files, checkpoint_id, skip_reached=True
        )

    def _commit(
        self,
        what: str,
        files: list[StagedFile],
        checkpoint_id: int | None,
        *,
        skip_reached: bool,
    ) -> bool:
        """Add the *files* not yet in the table and raise the app version to
        *checkpoint_id* (``None``: keep it). With *skip_reached*, nothing is done once the
        version is >= *checkpoint_id*. Every commit carries the app transaction, so
        concurrent commits of this sink conflict and the loser retries on a fresh snapshot.
        Returns whether a Delta commit was made."""
        unique = list({f.path: f for f in files}.values())
        with _boundary(what):
            for _ in range(self.max_attempts):
                dt = self._load()
                current = None if dt is None else dt.transaction_version(self.app_id)
                reached = checkpoint_id is None or (current or -1) >= checkpoint_id
                if skip_reached and reached:
                    return False
                present = set() if dt is None else self._table_paths(dt)
                todo = [f for f in unique if f.path not in present]
                if not todo and (reached or dt is None):
                    return False  # nothing to add (or to create the table from)
                version = max(current or 0, checkpoint_id or 0)
                props = CommitProperties(
                    app_transactions=[AppTransaction(self.app_id, version)],
                    max_commit_retries=0,  # never rebased by delta-rs: our loop re-checks
                    custom_metadata={"spark-ckpt.sink": self.app_id},
                )
                schemas = [self._staged_schema(f) for f in todo]
                try:
                    if dt is None:
                        fields = _delta_fields(schemas[0])
                        for f, s in zip(todo, schemas, strict=True):
                            check_schema(fields, s, f.path)
                        create_table_with_add_actions(
                            self.table_uri,
                            DeltaSchema.from_arrow(schemas[0]),
                            [f.add_action() for f in todo],
                            mode="error",
                            storage_options=self.storage_options,
                            commit_properties=props,
                        )
                    else:
                        fields = {
                            f["name"]: json.dumps(f["type"])
                            for f in json.loads(dt.schema().to_json())["fields"]
                        }
                        for f, s in zip(todo, schemas, strict=True):
                            check_schema(fields, s, f.path)
                        dt.create_write_transaction(
                            [f.add_action() for f in todo],
                            "append",
                            dt.schema(),
                            commit_properties=props,
                        )
                except CommitFailedError:
                    continue  # a concurrent commit of this sink: re-check on a fresh snapshot
                except DeltaError:
                    if dt is None and self._load() is not None:
                        continue  # lost the race to create the table
                    raise
                return True
        raise StoreError(f"{what}: lost {self.max_attempts} commit races in a row")

    def _staged_schema(self, f: StagedFile) -> pa.Schema:
        """The Arrow schema of staged file *f* (its Parquet footer); a missing file raises
        :class:`StoreError` — its data would be lost, and adding it would corrupt the table."""
        try:
            with self._fs.open_input_file(f.path) as src:
                return pq.read_schema(src).remove_metadata()
        except FileNotFoundError as e:
            raise StoreError(
                f"staged file {f.path} is gone: it cannot be committed (was it aborted?)"
            ) from e

    def roll_back_to(self, checkpoint_id: int) -> list[str]:
        """Make the table hold exactly this sink's output of checkpoints <= *checkpoint_id*
        again (driver side, at a restore from *checkpoint_id*, **before** :meth:`recover`).

        When the app version is above *checkpoint_id*: remove (Delta ``remove`` actions with
        ``dataChange=true``; the files stay on disk until the orphan sweep of
        :meth:`recover`) every file still in the table that one of this sink's commits
        added with an app version > *checkpoint_id* after the sink's newest commit at or
        below it, and set the app version to *checkpoint_id* — one Delta commit, on exactly
        the snapshot read (``max_commit_retries=0``; a concurrent commit makes it re-read
        and redo, :class:`StoreError` after ``max_attempts`` lost races). Returns the paths
        removed (sorted); a no-op returning ``[]`` when there is no table or the version is
        already <= *checkpoint_id* (so it is idempotent).

        Transactions of checkpoints <= *checkpoint_id* that a later checkpoint's commit
        added (checkpoint *checkpoint_id*'s own commit was lost in a crash) are removed too:
        :meth:`recover` with the restored checkpoint's transactions adds them back, which is
        why it must follow.

        Files of other writers (other app ids, plain appends) are never removed. Output of
        this sink that another writer rewrote (OPTIMIZE, DELETE, ...) is no longer in the
        table under its name and cannot be rolled back; its files are skipped. The commits
        to undo are found in the log's JSON commits, newest first (see
        :meth:`_added_after`); if one that is needed has been cleaned up (log retention),
        :class:`StoreError` says so. Tables with ``delta.appendOnly=true`` refuse remove
        actions (:class:`StoreError`)."""
        if checkpoint_id < 0:
            raise ProtocolError(f"checkpoint id {checkpoint_id} is negative")
        what = f"rolling {self.app_id} back to checkpoint {checkpoint_id}"
        with _boundary(what):
            for _ in range(self.max_attempts):
                dt = self._load()
                if dt is None or (dt.transaction_version(self.app_id) or 0) <= checkpoint_id:
                    return []
                added = self._added_after(dt, checkpoint_id, what)
                actions = pa.table(dt.get_add_actions(flatten=True))
                sizes = dict(
                    zip(
                        actions.column("path").to_pylist(),
                        actions.column("size_bytes").to_pylist(),
                        strict=True,
                    )
                )
                doomed = sorted(p for p in added if p in sizes)
                now_ms = time.time_ns() // 1_000_000
                removes: list[AddAction | RemoveAction] = [
                    RemoveAction(p, True, now_ms, sizes[p]) for p in doomed
                ]
                props = CommitProperties(
                    app_transactions=[AppTransaction(self.app_id, checkpoint_id)],
                    max_commit_retries=0,  # never rebased by delta-rs: our loop re-checks
                    custom_metadata={
                        "spark-ckpt.sink": self.app_id,
                        "spark-ckpt.rollback": str(checkpoint_id),
                    },
                )
                try:
                    dt.create_write_transaction(
                        removes, "append", dt.schema(), commit_properties=props
                    )
                except CommitFailedError:
                    continue  # a concurrent commit: re-check on a fresh snapshot
                return doomed
        raise StoreError(f"{what}: lost {self.max_attempts} commit races in a row")

    def _log_commit(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of the log's JSON commit *version* (``None`` if the file is gone)."""
        try:
            with self._fs.open_input_stream(f"_delta_log/{version:020d}.json") as src:
                text = src.read().decode()
        except FileNotFoundError:
            return None
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _added_after(self, dt: DeltaTable, checkpoint_id: int, what: str) -> set[str]:
        """Paths (relative to the root, decoded) that this sink's commits with an app
        version > *checkpoint_id* added after its newest commit whose app version is <=
        *checkpoint_id* (since the table's first version if there is none), read from the
        log's JSON commits from *dt*'s version down: normally a few recent commits.

        Sound because the app version only falls by a roll back, which removes everything
        above its target: at this sink's newest commit with an app version <= the target,
        none of its files in the table came from a later checkpoint. When the walk reaches
        a JSON commit that has been cleaned up (log retention), the snapshot just before
        the oldest commit of this sink that the walk saw decides (it is readable from a log
        checkpoint, and has the app version of the commit that is gone): with an app version
        <= *checkpoint_id*, or none, the walk is complete; otherwise — or if that snapshot
        cannot be loaded — the files to remove cannot be known: :class:`StoreError`."""
        added: set[str] = set()
        newest = dt.version()
        oldest_mine = newest + 1  # the oldest commit of this sink the walk has seen
        for version in range(newest, -1, -1):
            actions = self._log_commit(version)
            if actions is None:
                self._check_cleaned_up(version, oldest_mine - 1, newest, checkpoint_id, what)
                break
            mine = [
                int(a["txn"]["version"])
                for a in actions
                if "txn" in a and a["txn"].get("appId") == self.app_id
            ]
            if not mine:
                continue  # another writer's commit
            if mine[-1] <= checkpoint_id:
                break
            oldest_mine = version
            added |= {unquote(a["add"]["path"]) for a in actions if "add" in a}
        return added

    def _check_cleaned_up(
        self, gone: int, probe: int, newest: int, checkpoint_id: int, what: str
    ) -> None:
        """JSON commit *gone* is missing and no commit in (*gone*, *probe*] carries this
        sink's app transaction, so the app version after *gone* is that of snapshot *probe*:
        return if it is <= *checkpoint_id* (or absent), raise :class:`StoreError` if it is
        above or cannot be read."""
        lost = StoreError(
            f"{what}: the Delta log's commit {gone} (_delta_log/{gone:020d}.json) has been "
            f"cleaned up (log retention), so the files this sink committed after checkpoint "
            f"{checkpoint_id} cannot be determined; restore a newer checkpoint or remove "
            "them by hand"
        )
        if probe >= newest:
            raise lost  # the newest snapshot's app version is above checkpoint_id
        try:
            before = DeltaTable(self.table_uri, version=probe, storage_options=self.storage_options)
        except DeltaError as e:
            raise lost from e
        if (before.transaction_version(self.app_id) or 0) > checkpoint_id:
            raise lost

    # -- aborting and recovery -------------------------------------------------------------
    def abort(self, txn: Transaction) -> None:
        """Delete *txn*'s staged files (missing ones are fine; files the table references
        are kept — an abort after a commit must not corrupt the table)."""
        self._delete([f.path for f in staged_files(txn)], f"aborting {txn.txn_id}")

    def _delete(self, paths: Sequence[str], what: str) -> list[str]:
        with _boundary(what):
            present = self.committed_files() if paths else set()
            deleted = []
            for path in paths:
                if path in present:
                    continue
                try:
                    self._fs.delete_file(path)
                    deleted.append(path)
                except FileNotFoundError:
                    pass
            return deleted

    def recover(
        self,
        operator_uid: str,
        to_commit: Sequence[Transaction],
        *,
        staged_before_ms: int | None = None,
    ) -> None:
        """Flink's recover-and-commit plus recover-and-abort, once per job (re)start before
        any task writes (never concurrently with writers of this sink): add every file of
        *to_commit* (the transactions of the restored checkpoint) that is not yet in the
        table, raising the app version to their largest checkpoint id, then delete every
        staged file of this sink the table does not reference (orphans of failed or never
        completed checkpoints) and drop this process' open transactions of *operator_uid*
        (in-progress files are deleted).
        With *staged_before_ms* only files staged before that time are orphans: files staged
        since belong to the run that is recovering (a ``ckpt-sink`` query stages its first
        micro-batch before the coordinator learns of it). Idempotent."""
        if to_commit:
            target = max(t.checkpoint_id for t in to_commit)
            files = [f for t in to_commit for f in staged_files(t)]
            self._commit(f"recovering {operator_uid}", files, target, skip_reached=False)
        with self._lock:
            for key in [k for k in self._open if k[0] == operator_uid]:
                del self._open[key]
            parts = [self._parts.pop(k) for k in list(self._parts) if k[0] == operator_uid]
        for part in parts:
            part.discard()
        self.delete_orphans(before_ms=staged_before_ms)

    def delete_orphans(self, *, before_ms: int | None = None) -> list[str]:
        """Delete this sink's staged files that the current table version does not reference;
        returns their paths. Must not run concurrently with writers of this sink. Caveat: a
        file of this sink that another writer logically removed from the table (OPTIMIZE,
        DELETE) is unreferenced too and is deleted like ``VACUUM RETAIN 0 HOURS`` would,
        breaking time travel to versions before that removal. With *before_ms*, only files
        last modified before that time are considered."""
        return self._delete(
            self.staged_paths(before_ms=before_ms), f"deleting orphans of {self.app_id}"
        )

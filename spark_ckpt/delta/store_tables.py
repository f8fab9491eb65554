"""The Delta tables of the checkpoint store: their layout on disk and shared access to them.

One *root* per pipeline holds five Delta tables, created lazily with explicit schemas and kept
readable by Spark's Delta Lake (protocol reader 1 / writer 2, UTC ``timestamp`` columns, no
deletion vectors, no column mapping, no partitioning — the tables are small and a partition
per checkpoint would only multiply tiny files):

``<root>/checkpoints``
    The coordinator's log (:mod:`spark_ckpt.delta.checkpoint_log`), one row per event (the
    ``record`` column says which): ``lease`` rows (``epoch``, id block
    ``[checkpoint_id, id_end)``), ``completed`` rows (the canonical metadata JSON of a
    :class:`~spark_ckpt.protocol.checkpoint.CompletedCheckpoint` with its SHA-256, plus
    queryable copies of id, type, timestamps and size). Only coordinators write it. Roots
    written by earlier versions may also hold ``failed`` rows (the JSON of a
    :class:`~spark_ckpt.protocol.checkpoint.FailedCheckpoint` with its SHA-256, failure
    time in ``completed_ts``): failure records from before the history table; the next
    retention moves them into ``checkpoint_history``. A reader of the table selects its
    rows by ``record``.
``<root>/operator_state`` / ``<root>/channel_state``
    One row per blob (``KEYED_FULL``/``KEYED_DELTA``/``OPERATOR`` resp. ``CHANNEL``): the
    :class:`~spark_ckpt.protocol.state_handles.BlobRef` columns, a ``blob_id`` (hash of the blob
    key, used in predicates) and the Arrow IPC ``payload``. Written by tasks
    (:mod:`spark_ckpt.delta.blob_store`).
``<root>/source_offsets``
    One row per source channel position a task acknowledged, copied by the completion commit
    (queryable record; restore reads offsets from the committed metadata).
``<root>/checkpoint_history``
    The checkpoint statistics history (:mod:`spark_ckpt.delta.checkpoint_history`): one
    row per finished checkpoint or savepoint, completed or failed, the newest
    ``checkpoint.history`` of them, whatever ``checkpoint.retained`` keeps. Only
    coordinators write it, fenced; it is rewritten whole at each write, so it is one small
    data file.

:class:`StoreTables` opens, creates and scans these tables for the store's components; every
error of delta-rs, Arrow and the file system is translated at :func:`store_boundary`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.transaction import RemoveAction

from spark_ckpt.delta.boundary import delta_boundary
from spark_ckpt.errors import CorruptCheckpointError, StoreError
from spark_ckpt.protocol.clock import Clock

_T = TypeVar("_T")

_TS = pa.timestamp("us", tz="UTC")

#: Largest number of values in one ``IN (...)`` delete predicate.
_PREDICATE_CHUNK = 500


class StoreTable(StrEnum):
    """The Delta tables under a store root (the value is the directory name)."""

    CHECKPOINTS = "checkpoints"
    OPERATOR_STATE = "operator_state"
    CHANNEL_STATE = "channel_state"
    SOURCE_OFFSETS = "source_offsets"
    HISTORY = "checkpoint_history"


#: The tables that hold state blobs.
BLOB_TABLES = (StoreTable.OPERATOR_STATE, StoreTable.CHANNEL_STATE)

CHECKPOINTS_SCHEMA = pa.schema(
    [
        pa.field("record", pa.string(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("id_end", pa.int64()),
        pa.field("snapshot_type", pa.string()),
        pa.field("trigger_ts", _TS),
        pa.field("completed_ts", _TS),
        pa.field("state_bytes", pa.int64()),
        pa.field("metadata", pa.string()),
        pa.field("checksum", pa.string()),
        pa.field("committed_at", _TS, nullable=False),
    ]
)
"""``checkpoints``: lease rows fill ``epoch``/``checkpoint_id`` (first id)/``id_end``;
completed rows fill ``epoch`` (the committer's) and every column from ``snapshot_type``
on; failed rows fill ``epoch`` (the recorder's), ``checkpoint_id``, ``snapshot_type``,
``trigger_ts``, ``completed_ts`` (when it failed), ``metadata`` (the
:class:`~spark_ckpt.protocol.checkpoint.FailedCheckpoint` JSON), ``checksum`` (its SHA-256)
and ``committed_at``; ``id_end`` and ``state_bytes`` stay null."""

BLOB_SCHEMA = pa.schema(
    [
        pa.field("blob_id", pa.string(), nullable=False),
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("operator_uid", pa.string(), nullable=False),
        pa.field("subtask", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("state_name", pa.string(), nullable=False),
        pa.field("key_group_start", pa.int64(), nullable=False),
        pa.field("key_group_end", pa.int64(), nullable=False),
        pa.field("channel", pa.int64(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("nbytes", pa.int64(), nullable=False),
        pa.field("checksum", pa.string(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("written_at", _TS, nullable=False),
    ]
)
"""``operator_state`` and ``channel_state``: one row per blob; ``payload`` is the Arrow IPC
stream, ``blob_id`` = :func:`~spark_ckpt.delta.blob_store.blob_id` of the key."""

SOURCE_OFFSETS_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("vertex", pa.string(), nullable=False),
        pa.field("subtask", pa.int64(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("channel", pa.int64(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("written_at", _TS, nullable=False),
    ]
)
"""``source_offsets``: ``offset`` is the first data record *not* covered by the checkpoint."""

HISTORY_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("snapshot_type", pa.string(), nullable=False),
        pa.field("trigger_ts", _TS, nullable=False),
        pa.field("end_ts", _TS, nullable=False),
        pa.field("duration_ms", pa.int64(), nullable=False),
        pa.field("state_bytes", pa.int64(), nullable=False),
        pa.field("bytes_written", pa.int64(), nullable=False),
        pa.field("channel_state_bytes", pa.int64(), nullable=False),
        pa.field("alignment_ms", pa.int64(), nullable=False),
        pa.field("start_delay_ms", pa.int64(), nullable=False),
        pa.field("reason", pa.string()),
        pa.field("message", pa.string()),
        pa.field("record", pa.string(), nullable=False),
        pa.field("checksum", pa.string(), nullable=False),
        pa.field("recorded_at", _TS, nullable=False),
        pa.field("writer_epoch", pa.int64(), nullable=False),
        pa.field("dropped_below", pa.int64(), nullable=False),
    ]
)
"""``checkpoint_history``: one row per finished checkpoint or savepoint (see
:mod:`spark_ckpt.delta.checkpoint_history`). ``status`` is ``completed`` or ``failed``
(``reason``/``message`` then say why); ``end_ts`` is when it completed or failed; the
figures of a failed one are those of the subtasks that had acknowledged
(:attr:`~spark_ckpt.storage.history.CheckpointRecord.figures`). ``record`` is the canonical
JSON of the :class:`~spark_ckpt.storage.history.CheckpointRecord` (per-subtask metrics,
properties), ``checksum`` its SHA-256; ``recorded_at`` when the row was first written;
``writer_epoch`` the lease epoch of the coordinator that wrote the table's current version
(every write rewrites the table: the fence); ``dropped_below`` the history's floor, one more
than the largest id its bound ever dropped (the same in every row; see
:mod:`spark_ckpt.storage.history`)."""

SCHEMAS: Mapping[StoreTable, pa.Schema] = {
    StoreTable.CHECKPOINTS: CHECKPOINTS_SCHEMA,
    StoreTable.OPERATOR_STATE: BLOB_SCHEMA,
    StoreTable.CHANNEL_STATE: BLOB_SCHEMA,
    StoreTable.SOURCE_OFFSETS: SOURCE_OFFSETS_SCHEMA,
    StoreTable.HISTORY: HISTORY_SCHEMA,
}

#: Log settings of the tables committed to at every checkpoint or retention (``checkpoints``: the
#: completion, the retention, the leases; the state tables: each task appends its blobs;
#: ``source_offsets`` and ``checkpoint_history``: every retention): a Delta
#: checkpoint of the log every 20 commits, and commit files older than a minute removed when one
#: is written. A commit's cost grows with the number of files in ``_delta_log`` (deltalake 1.6,
#: an append of one small row: 10 ms of CPU with 100 of them, 60 ms with 1,000, 208 ms with
#: 4,000), and under Delta's default retention (30 days) a table committed to about once a
#: second gains 4,000 an hour; with these settings the log holds about a minute of commits plus
#: 20 (near a hundred files at one checkpoint a second and two subtasks). Removed data files
#: are remembered for an hour (``delta.deletedFileRetentionDuration``; Delta's default is a
#: week): every log checkpoint carries the removals still remembered, and retention removes
#: about as many files as the tasks add (two a second with two subtasks), so under the default
#: each log checkpoint would grow by 170,000 rows a day. Nothing reads these tables at an older
#: version (a restore as of a time reads the completion times the log and
#: the history record: :func:`~spark_ckpt.delta.savepoint.checkpoint_as_of`); a table object
#: older than the removed files may fail on one of them, so objects are opened anew well inside
#: the retention (see FollowedTable).
HOT_LOG: Mapping[str, str] = {
    "delta.checkpointInterval": "20",
    "delta.logRetentionDuration": "interval 1 minutes",
    "delta.deletedFileRetentionDuration": "interval 1 hours",
}

#: Table properties set at creation, and on tables created by earlier versions when a
#: coordinator takes its lease (:meth:`StoreTables.configure`): plain properties, the protocol
#: stays reader 1 / writer 2. Every store table keeps a short log (:data:`HOT_LOG`).
CONFIGURATION: Mapping[StoreTable, Mapping[str, str]] = {
    StoreTable.CHECKPOINTS: HOT_LOG,
    StoreTable.OPERATOR_STATE: HOT_LOG,
    StoreTable.CHANNEL_STATE: HOT_LOG,
    StoreTable.SOURCE_OFFSETS: HOT_LOG,
    StoreTable.HISTORY: HOT_LOG,
}


#: A table object kept up to date with ``update_incremental()`` is opened again once it is
#: this many versions past the version it was opened at: with deltalake 1.6 each commit
#: through such an object costs more the more versions it has followed (an append took
#: 26 ms through a new object and 60 ms through one that had made 200 appends since), while
#: a new object starts from the log's newest checkpoint.
REOPEN_AFTER_VERSIONS = 100

#: ... and once it was opened this many seconds ago: well inside :data:`HOT_LOG`'s log
#: retention. An object's snapshot keeps the commit files it was built from, and delta-rs
#: reads them again (for a commit, a log checkpoint); an object older than the log retention
#: then fails on a commit file the cleanup removed ("Object at location
#: .../_delta_log/00000000000000000127.json not found", seen in a bench run whose subtasks
#: had not committed for a while).
REOPEN_AFTER_S = 20.0


class FollowedTable:
    """One Delta table, opened once and then kept up to date (``update_incremental()``,
    about 1 ms instead of about 10 ms for a fresh open), opened again after
    :data:`REOPEN_AFTER_VERSIONS` versions or :data:`REOPEN_AFTER_S` seconds, or when
    :meth:`forget` says its object failed. Thread-safe."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None) -> None:
        self._uri = uri
        self._storage_options = storage_options
        self._lock = threading.Lock()
        self._dt: DeltaTable | None = None
        self._opened_at = 0
        self._opened_s = 0.0

    def newest(self) -> DeltaTable | None:
        """The newest version of the table, or ``None`` if it does not exist (yet). An
        object that cannot update (a commit file it needs is gone) is replaced by a new
        one."""
        with self._lock:
            dt = self._dt
            if dt is not None and time.monotonic() - self._opened_s < REOPEN_AFTER_S:
                try:
                    dt.update_incremental()
                except (OSError, DeltaError):
                    dt = None
                if dt is not None and dt.version() - self._opened_at < REOPEN_AFTER_VERSIONS:
                    return dt
            if not DeltaTable.is_deltatable(self._uri, self._storage_options):
                self._dt = None
                return None
            dt = DeltaTable(self._uri, storage_options=self._storage_options)
            self._dt, self._opened_at, self._opened_s = dt, dt.version(), time.monotonic()
            return dt

    def forget(self) -> None:
        """Drop the object: a use of it failed; the next :meth:`newest` opens a new one."""
        with self._lock:
            self._dt = None


class StoreTables:
    """The tables under *root* (a local path or a URI delta-rs understands;
    *storage_options* are passed to delta-rs): opened once, then kept up to date
    (:class:`FollowedTable`); created on first write. *clock* stamps the informational
    timestamp columns (:meth:`now`). Thread-safe: the lock guards the cache of opened
    tables, each of which has its own."""

    def __init__(self, root: str, *, storage_options: dict[str, str] | None, clock: Clock) -> None:
        self._root = str(root).rstrip("/")
        self._storage_options = storage_options
        self._clock = clock
        self._lock = threading.Lock()
        self._tables: dict[StoreTable, FollowedTable] = {}

    @property
    def root(self) -> str:
        return self._root

    def uri(self, table: StoreTable) -> str:
        """Where *table* lives (for second readers: Spark, polars, DuckDB)."""
        return f"{self._root}/{table.value}"

    def load(self, table: StoreTable) -> DeltaTable | None:
        """The newest version of *table*, or ``None`` if it was never created (see
        :class:`FollowedTable`)."""
        with self._lock:
            followed = self._tables.get(table)
            if followed is None:
                followed = FollowedTable(self.uri(table), self._storage_options)
                self._tables[table] = followed
        return followed.newest()

    def forget(self, table: StoreTable) -> None:
        """A use of *table*'s object failed: the next :meth:`load` opens it anew."""
        with self._lock:
            followed = self._tables.get(table)
        if followed is not None:
            followed.forget()

    def ensure(self, table: StoreTable) -> DeltaTable:
        """The newest version of *table*, creating it (explicit schema) if missing. Safe when
        several processes create it at once."""
        dt = self.load(table)
        if dt is not None:
            return dt
        try:
            return DeltaTable.create(
                self.uri(table),
                SCHEMAS[table],
                mode="ignore",
                name=table.value,
                description=f"spark-ckpt {table.value}",
                configuration=dict(CONFIGURATION.get(table, {})) or None,
                storage_options=self._storage_options,
            )
        except DeltaError:
            dt = self.load(table)  # lost the creation race
            if dt is None:
                raise
            return dt

    def configure(self, table: StoreTable) -> None:
        """Give *table*, if it exists, the properties of :data:`CONFIGURATION` it lacks (a
        table an earlier version created keeps Delta's log defaults): one metadata commit,
        none when nothing is missing. A property the table has keeps its value, whoever set
        it. The caller holds the boundary."""
        dt = self.load(table)
        if dt is None:
            return
        current = dt.metadata().configuration
        missing = {k: v for k, v in CONFIGURATION.get(table, {}).items() if k not in current}
        if missing:
            dt.alter.set_table_properties(missing, raise_if_not_exists=False)

    def arrow_fs(self, dt: DeltaTable) -> pafs.FileSystem | None:
        """A native pyarrow file system rooted at *dt*. (delta-rs' default Python file system
        handler works too, but in deltalake 1.6 + pyarrow 26 using it aborts the interpreter
        at exit — "terminate called without an active exception".)"""
        if self._storage_options:
            return None
        try:
            fs, path = pafs.FileSystem.from_uri(dt.table_uri)
        except (pa.ArrowInvalid, OSError):
            return None
        return pafs.SubTreeFileSystem(path, fs)

    def scan(
        self,
        dt: DeltaTable,
        columns: list[str],
        *,
        ids: Iterable[int] | None = None,
        row_filter: ds.Expression | None = None,
        filter_columns: Sequence[str] = (),
    ) -> pa.Table:
        """Read *columns* of *dt*; *ids* prunes files by ``checkpoint_id`` statistics before
        any data file is opened, *row_filter* selects rows (over *columns* plus
        *filter_columns*).

        Only the integer ``checkpoint_id`` predicate is pushed into the scan: files that
        delta-rs rewrote (DELETE during retention) carry ``string_view`` in their Arrow schema,
        and pyarrow cannot compare those statistics with string literals."""
        scan_filter: ds.Expression | None = None
        pruning: list[tuple[str, str, Any]] | None = None
        if ids is not None:
            id_list = sorted(set(ids))
            if not id_list:
                return empty_table(columns)
            pruning = [("checkpoint_id", "in", id_list)]
            scan_filter = pc.field("checkpoint_id").isin(id_list)
        dataset = dt.to_pyarrow_dataset(
            filesystem=self.arrow_fs(dt), file_pruning_predicate=pruning
        )
        read = list(dict.fromkeys([*columns, *filter_columns]))
        table = dataset.to_table(columns=read, filter=scan_filter)
        if row_filter is not None:
            table = table.filter(row_filter)
        return table.select(columns)

    def read_files(
        self,
        dt: DeltaTable,
        columns: list[str],
        read: MutableMapping[str, pa.Table],
    ) -> dict[str, pa.Table]:
        """The rows (*columns*) of each data file of *dt*, by the file's path as the Delta log
        names it, in the table's order. *read* holds (and is updated to hold) the rows
        already read from each file: Delta never rewrites a data file in place, so a reader
        following a table that grows by appends reads each file once; files the table no
        longer has are dropped from it."""
        dataset = dt.to_pyarrow_dataset(filesystem=self.arrow_fs(dt))
        out: dict[str, pa.Table] = {}
        for fragment in dataset.get_fragments():
            rows = read.get(fragment.path)
            if rows is None:
                rows = fragment.to_table(schema=dataset.schema, columns=columns)
                read[fragment.path] = rows
            out[fragment.path] = rows
        for path in [p for p in read if p not in out]:
            del read[path]
        return out

    def removal_plan(
        self, dt: DeltaTable, doomed: Collection[tuple[int, str]], column: str
    ) -> tuple[list[str], set[tuple[int, str]]]:
        """How to remove the rows keyed (``checkpoint_id``, *column*) *doomed* from *dt*,
        decided from the Delta log's file statistics alone: the data files every row of
        which is doomed (:meth:`remove_files` removes them), and the doomed keys that may be
        in other files (a ``DeltaTable.delete`` removes those rows). A file's keys are
        known from its statistics when it holds one row, or two rows of one checkpoint with
        different *column* values (the statistics are then the two keys), each value a
        full ``str`` of at most 32 characters (longer ones may be truncated); a file whose
        keys are not known may hold every doomed key of its ``checkpoint_id`` range."""
        actions = pa.table(dt.get_add_actions(flatten=True))
        names = ["path", "num_records", "min.checkpoint_id", "max.checkpoint_id"]
        rows = zip(
            *(actions[n].to_pylist() for n in names),
            actions[f"min.{column}"].to_pylist()
            if f"min.{column}" in actions.column_names
            else [None] * actions.num_rows,
            actions[f"max.{column}"].to_pylist()
            if f"max.{column}" in actions.column_names
            else [None] * actions.num_rows,
            strict=True,
        )
        wanted = set(doomed)
        whole: list[str] = []
        elsewhere: set[tuple[int, str]] = set()
        for path, n, lo, hi, low, high in rows:
            keys = _known_keys(n, lo, hi, low, high)
            if keys is None:
                elsewhere |= {
                    k for k in wanted if (lo is None or lo <= k[0]) and (hi is None or k[0] <= hi)
                }
            elif keys <= wanted:
                whole.append(path)
            else:
                elsewhere |= keys & wanted
        return whole, elsewhere

    def remove_files(
        self,
        dt: DeltaTable,
        paths: Collection[str],
        *,
        commit_properties: CommitProperties | None = None,
    ) -> bool:
        """Remove the data files *paths* of *dt* from the table in one commit on *dt*'s
        version (their rows vanish; the files stay on disk for time travel until a
        ``VACUUM``): what a copy-on-write delete of every row of those files commits,
        without reading or planning anything. False, committing nothing, when one of them
        is not a data file of *dt*. *dt* is not brought up to date."""
        actions = pa.table(dt.get_add_actions(flatten=True)).select(["path", "size_bytes"])
        sizes = dict(
            zip(actions["path"].to_pylist(), actions["size_bytes"].to_pylist(), strict=True)
        )
        if not paths or any(p not in sizes for p in paths):
            return False
        now_ms = int(time.time() * 1000)  # what VACUUM's retention counts from: wall time
        dt.create_write_transaction(
            [RemoveAction(p, True, now_ms, sizes[p]) for p in sorted(paths)],
            "append",
            dt.schema(),
            commit_properties=commit_properties,
        )
        return True

    def now(self) -> int:
        """Now, in microseconds since the epoch (the unit of the timestamp columns)."""
        return self._clock.now_ms() * 1000


@contextmanager
def store_boundary(what: str, *, reading: bool = False) -> Iterator[None]:
    """:func:`~spark_ckpt.delta.boundary.delta_boundary` into :class:`StoreError`; on read paths
    an unreadable data file is :class:`CorruptCheckpointError`. Also catches the
    ``UnicodeDecodeError`` of a damaged string column: pyarrow does not validate UTF-8 when
    it decodes Parquet, so such damage only surfaces when values are converted."""
    with delta_boundary(what, StoreError, unreadable=CorruptCheckpointError if reading else None):
        try:
            yield
        except UnicodeDecodeError as e:
            error = CorruptCheckpointError if reading else StoreError
            raise error(f"{what}: undecodable string data: {e}") from e


def no_rebase() -> CommitProperties:
    """Commit exactly on the snapshot read: a concurrent commit makes ours fail."""
    return CommitProperties(max_commit_retries=0)


def sql_list(values: Iterable[int | str]) -> str:
    """``(v1, v2, ...)`` for a SQL ``IN``; strings must be SQL-safe (hex ids only here)."""
    return "(" + ", ".join(str(v) if isinstance(v, int) else f"'{v}'" for v in values) + ")"


def chunks(values: Sequence[_T], size: int = _PREDICATE_CHUNK) -> Iterator[Sequence[_T]]:
    """*values* in slices of at most *size* (one ``IN (...)`` predicate each)."""
    for i in range(0, len(values), size):
        yield values[i : i + size]


def rows_table(schema: pa.Schema, columns: Mapping[str, list[Any]]) -> pa.Table:
    """A table of *schema*; columns not given are null."""
    n = len(next(iter(columns.values())))
    arrays = [
        pa.array(columns[f.name], type=f.type) if f.name in columns else pa.nulls(n, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _known_keys(
    n: int | None, lo: int | None, hi: int | None, low: Any, high: Any
) -> set[tuple[int, str]] | None:
    """The (checkpoint id, value) keys of a data file from its statistics (see
    :meth:`StoreTables.removal_plan`), or None when they do not tell."""
    if lo is None or lo != hi or not isinstance(low, str) or not isinstance(high, str):
        return None
    if len(low) > 32 or len(high) > 32:
        return None
    if n == 1 and low == high:
        return {(lo, low)}
    if n == 2 and low != high:
        return {(lo, low), (lo, high)}
    return None


def empty_table(columns: list[str]) -> pa.Table:
    """An empty table of *columns* (types as in the store's schemas)."""
    fields = {f.name: f for schema in SCHEMAS.values() for f in schema}
    return pa.schema([fields[c] for c in columns]).empty_table()

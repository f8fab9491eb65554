"""The durable checkpoint store: Delta Lake tables written with delta-rs (``deltalake``).

One *root* per pipeline holds four Delta tables, created lazily with explicit schemas and kept
readable by Spark's Delta Lake (protocol reader 1 / writer 2, UTC ``timestamp`` columns, no
deletion vectors, no column mapping, no partitioning — the tables are small and a partition
per checkpoint would only multiply tiny files):

``<root>/checkpoints``
    The coordinator's log, one row per event: ``lease`` rows (``epoch``, id block
    ``[checkpoint_id, id_end)``) and ``completed`` rows (the canonical metadata JSON of a
    :class:`~spark_ckpt.protocol.checkpoint.CompletedCheckpoint` with its SHA-256, plus queryable
    copies of id, type, timestamps and size). Only coordinators write it.
``<root>/operator_state`` / ``<root>/channel_state``
    One row per blob (``KEYED_FULL``/``KEYED_DELTA``/``OPERATOR`` resp. ``CHANNEL``): the
    :class:`~spark_ckpt.protocol.handle.BlobRef` columns, a ``blob_id`` (hash of the blob key, used
    in predicates) and the Arrow IPC ``payload``. Written by tasks.
``<root>/source_offsets``
    One row per source channel position a task reported (queryable record; restore reads
    offsets from the committed metadata).

How the contract of :mod:`spark_ckpt.storage.store` is kept:

* **Visibility.** A checkpoint exists once its ``completed`` row is committed to
  ``checkpoints`` (a single small append — the completion commit). Blob rows written before
  are unreferenced until then; a crash anywhere earlier leaves only such rows, which
  retention or :meth:`DeltaCheckpointStore.discard` removes later.
* **Fencing.** Every write to ``checkpoints`` reads the table at version *V*, checks that the
  newest lease epoch is the caller's, and commits with ``max_commit_retries=0`` on that
  snapshot, so the commit lands at exactly *V + 1* or fails (delta-rs commits with
  put-if-absent of the log file; verified: a stale snapshot's commit raises
  ``CommitFailedError`` instead of rebasing). After a failed attempt the table is re-read
  and the check repeated; a newer epoch then raises :class:`FencedError`. The check and the
  commit are therefore atomic. (On object stores this needs delta-rs' atomic log commits:
  S3 with a locking provider or conditional puts; local disk, ADLS and GCS are atomic.)
* **Ids** come from lease rows: a new block starts at the largest ``id_end`` ever logged.
* **Idempotent task state.** Each task commits its rows with a Delta *app transaction*
  ``spark-ckpt/<table>/<vertex>/<subtask>`` whose version is the highest checkpoint id the
  task wrote. If that version is below the checkpoint id, nothing of this task and
  checkpoint can exist and the rows are appended blindly; otherwise the stored keys are read
  first and only missing blobs are appended (for a key already stored the *stored* ref is
  returned, like :class:`~spark_ckpt.storage.store.InMemoryCheckpointStore`). Two racing writers of
  one task conflict on the app id (delta-rs raises ``ConcurrentTransaction``); the loser
  re-reads and finds its rows written. Reads additionally pick, per key, the row whose
  checksum matches the reference, so even duplicate rows could not yield wrong data.
* **Idempotent commit.** ``commit`` of an id with a ``completed`` row is a no-op (checked on
  the fenced snapshot, so it is race free).
* **Retention** deletes ``completed`` rows of dropped checkpoints and garbage blob rows with
  ``DeltaTable.delete`` (copy-on-write: files are rewritten or removed, no deletion
  vectors). Removed files stay on disk (Delta time travel) until :meth:`vacuum`, which is
  never run implicitly. Blob deletion follows the fenced metadata commit; it only removes
  blobs no kept checkpoint references and none newer than the latest kept one, so a
  coordinator fenced out meanwhile cannot remove anything its successor needs.
* **Integrity.** Metadata is verified against its checksum, blobs against theirs; a
  referenced blob whose row is missing, or an unreadable data file, raises
  :class:`CorruptCheckpointError`. Errors of delta-rs, Arrow and the file system are
  translated into :class:`StoreError` subclasses here; none escapes raw.
  :meth:`~spark_ckpt.storage.store.CheckpointStore.verify` reads a checkpoint's blobs with one scan
  per state table; if that fails it reads the candidate data files one by one and decodes
  each in memory, which separates damage (a file that is gone or does not decode, a row
  that is missing or fails its checksum: :class:`CorruptCheckpointError`) from a store
  that cannot be read (any other I/O error: :class:`StoreError`) — pyarrow reports a
  damaged Parquet footer and an I/O failure alike as ``OSError``.

Threading: an instance may be shared by the coordinator thread and task threads; every call
is an independent transaction on freshly loaded tables (the instance lock only guards the
cache of parsed metadata). Concurrent task writes to a state table are rebased by delta-rs
(blind appends do not conflict); only ``checkpoints`` commits refuse to rebase.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from spark_ckpt.delta.errors import delta_boundary
from spark_ckpt.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    FencedError,
    StoreError,
)
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import Clock, SystemClock
from spark_ckpt.protocol.handle import (
    BlobKind,
    BlobRef,
    SourceOffset,
    TaskId,
    TaskSnapshot,
    TaskStateHandle,
    decode_table,
    encode_table,
    make_ref,
)
from spark_ckpt.storage.store import (
    ID_BLOCK,
    CheckpointStore,
    CoordinatorLease,
    describe_blob,
    garbage_blobs,
    parse_completed,
    retention_plan,
)

_T = TypeVar("_T")

_TS = pa.timestamp("us", tz="UTC")

#: How often a transaction is re-attempted after losing a commit race before giving up.
DEFAULT_MAX_ATTEMPTS = 64

#: Largest number of values in one ``IN (...)`` delete predicate.
_PREDICATE_CHUNK = 500


class StoreTable(StrEnum):
    """The Delta tables under a store root (the value is the directory name)."""

    CHECKPOINTS = "checkpoints"
    OPERATOR_STATE = "operator_state"
    CHANNEL_STATE = "channel_state"
    SOURCE_OFFSETS = "source_offsets"


class LogRecord(StrEnum):
    """The ``record`` column of the ``checkpoints`` table."""

    LEASE = "lease"
    COMPLETED = "completed"


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
on."""

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
stream, ``blob_id`` = :func:`blob_id` of the key."""

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

_SCHEMAS: Mapping[StoreTable, pa.Schema] = {
    StoreTable.CHECKPOINTS: CHECKPOINTS_SCHEMA,
    StoreTable.OPERATOR_STATE: BLOB_SCHEMA,
    StoreTable.CHANNEL_STATE: BLOB_SCHEMA,
    StoreTable.SOURCE_OFFSETS: SOURCE_OFFSETS_SCHEMA,
}

_REF_COLUMNS = [f.name for f in BLOB_SCHEMA if f.name not in ("payload", "written_at")]


def blob_id(ref: BlobRef) -> str:
    """Stable identifier of a blob key (hex, 32 chars): what delete/read predicates match."""
    text = json.dumps(list(ref.key), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def blob_table(kind: BlobKind) -> StoreTable:
    """The table that holds blobs of *kind*."""
    return StoreTable.CHANNEL_STATE if kind is BlobKind.CHANNEL else StoreTable.OPERATOR_STATE


@dataclass(frozen=True)
class _LogView:
    """The ``checkpoints`` table at one version, as the coordinator protocol needs it."""

    version: int
    max_epoch: int
    next_id: int  # the largest id_end ever leased (1 when nothing was leased)
    completed: Mapping[int, tuple[str, str]]  # id -> (metadata json, checksum)


def _sql_list(values: Iterable[int | str]) -> str:
    """``(v1, v2, ...)`` for a SQL ``IN``; strings must be SQL-safe (hex ids only here)."""
    return "(" + ", ".join(str(v) if isinstance(v, int) else f"'{v}'" for v in values) + ")"


def _chunks(values: Sequence[_T], size: int = _PREDICATE_CHUNK) -> Iterator[Sequence[_T]]:
    for i in range(0, len(values), size):
        yield values[i : i + size]


@contextmanager
def _boundary(what: str, *, reading: bool = False) -> Iterator[None]:
    """:func:`~spark_ckpt.delta.errors.delta_boundary` into :class:`StoreError`; on read paths
    an unreadable data file is :class:`CorruptCheckpointError`. Also catches the
    ``UnicodeDecodeError`` of a damaged string column: pyarrow does not validate UTF-8 when
    it decodes Parquet, so such damage only surfaces when values are converted."""
    with delta_boundary(what, StoreError, unreadable=CorruptCheckpointError if reading else None):
        try:
            yield
        except UnicodeDecodeError as e:
            error = CorruptCheckpointError if reading else StoreError
            raise error(f"{what}: undecodable string data: {e}") from e


class DeltaCheckpointStore(CheckpointStore):
    """Checkpoint store on the Delta tables under *root* (a local path or a URI delta-rs
    understands; *storage_options* are passed to delta-rs). See the module docstring.

    *clock* stamps the informational ``committed_at``/``written_at`` columns only.
    *max_attempts* bounds the re-attempts of one transaction after losing a commit race.
    """

    def __init__(
        self,
        root: str,
        *,
        storage_options: dict[str, str] | None = None,
        clock: Clock | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        if max_attempts < 1:
            raise StoreError("max_attempts must be at least 1")
        self._root = str(root).rstrip("/")
        self._storage_options = storage_options
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._max_attempts = max_attempts
        self._lock = threading.Lock()
        # (version, parsed completed checkpoints, damaged ones) of the last listing.
        self._completed_cache: (
            tuple[int, list[CompletedCheckpoint], list[CorruptCheckpointError]] | None
        ) = None
        self._view_cache: _LogView | None = None
        self._tables: dict[StoreTable, DeltaTable] = {}

    # -- locations -------------------------------------------------------------------------
    @property
    def root(self) -> str:
        return self._root

    def table_uri(self, table: StoreTable) -> str:
        """Where *table* lives (for second readers: Spark, polars, DuckDB)."""
        return f"{self._root}/{table.value}"

    # -- low-level Delta access ------------------------------------------------------------
    def _load(self, table: StoreTable) -> DeltaTable | None:
        """The newest version of *table*, or ``None`` if it was never created. The table is
        opened once per store object and then brought up to date with
        ``update_incremental()`` (about 1 ms instead of about 10 ms for a fresh open)."""
        with self._lock:
            dt = self._tables.get(table)
        if dt is not None:
            dt.update_incremental()
            return dt
        uri = self.table_uri(table)
        if not DeltaTable.is_deltatable(uri, self._storage_options):
            return None
        dt = DeltaTable(uri, storage_options=self._storage_options)
        with self._lock:
            self._tables[table] = dt
        return dt

    def _ensure(self, table: StoreTable) -> DeltaTable:
        """The newest version of *table*, creating it (explicit schema) if missing. Safe when
        several processes create it at once."""
        dt = self._load(table)
        if dt is not None:
            return dt
        try:
            return DeltaTable.create(
                self.table_uri(table),
                _SCHEMAS[table],
                mode="ignore",
                name=table.value,
                description=f"spark-ckpt {table.value}",
                storage_options=self._storage_options,
            )
        except DeltaError:
            dt = self._load(table)  # lost the creation race
            if dt is None:
                raise
            return dt

    def _arrow_fs(self, dt: DeltaTable) -> pafs.FileSystem | None:
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

    def _scan(
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
                return _empty(columns)
            pruning = [("checkpoint_id", "in", id_list)]
            scan_filter = pc.field("checkpoint_id").isin(id_list)
        dataset = dt.to_pyarrow_dataset(
            filesystem=self._arrow_fs(dt), file_pruning_predicate=pruning
        )
        read = list(dict.fromkeys([*columns, *filter_columns]))
        table = dataset.to_table(columns=read, filter=scan_filter)
        if row_filter is not None:
            table = table.filter(row_filter)
        return table.select(columns)

    def _now(self) -> int:
        """Now, in microseconds since the epoch (the unit of the timestamp columns)."""
        return self._clock.now_ms() * 1000

    # -- the coordinator log ---------------------------------------------------------------
    def _view(self, dt: DeltaTable) -> _LogView:
        """The ``checkpoints`` log at *dt*'s version: from the cache when this instance read
        or wrote exactly that version (see :meth:`_remember`), else scanned."""
        with self._lock:
            cached = self._view_cache
        if cached is not None and cached.version == dt.version():
            return cached
        view = self._scan_view(dt)
        with self._lock:
            self._view_cache = view
        return view

    def _remember(
        self,
        dt: DeltaTable,
        view: _LogView,
        *,
        lease: CoordinatorLease | None = None,
        completed: tuple[int, tuple[str, str]] | None = None,
        removed: Sequence[int] = (),
    ) -> None:
        """After a no-rebase commit made on the snapshot *view*: cache the log it produced,
        *view* plus that commit, so the next fenced step need not scan the table again. Only
        when *dt* (updated in place by delta-rs) is at exactly the next version — which our
        put-if-absent commit then wrote; anything else is left to a scan."""
        if dt.version() != view.version + 1:
            return
        gone = set(removed)
        done = {k: v for k, v in view.completed.items() if k not in gone}
        if completed is not None:
            done[completed[0]] = completed[1]
        after = _LogView(
            view.version + 1,
            max(view.max_epoch, lease.epoch if lease else 0),
            max(view.next_id, lease.end_id if lease else 0),
            done,
        )
        with self._lock:
            self._view_cache = after

    def _scan_view(self, dt: DeltaTable) -> _LogView:
        t = self._scan(dt, ["record", "epoch", "checkpoint_id", "id_end", "metadata", "checksum"])
        leases = t.filter(pc.equal(t["record"], LogRecord.LEASE.value))
        done = t.filter(pc.equal(t["record"], LogRecord.COMPLETED.value))
        max_epoch = pc.max(leases["epoch"]).as_py() if leases.num_rows else 0
        next_id = pc.max(leases["id_end"]).as_py() if leases.num_rows else 1
        completed: dict[int, tuple[str, str]] = {}
        for cid, text, digest in zip(
            done["checkpoint_id"].to_pylist(),
            done["metadata"].to_pylist(),
            done["checksum"].to_pylist(),
            strict=True,
        ):
            if text is None or digest is None:
                raise CorruptCheckpointError(f"completed row of checkpoint {cid} has no metadata")
            previous = completed.setdefault(cid, (text, digest))
            if previous != (text, digest):
                raise CorruptCheckpointError(f"checkpoint {cid} was committed twice, differently")
        return _LogView(dt.version(), int(max_epoch or 0), int(next_id or 1), completed)

    def _fenced(
        self,
        what: str,
        lease: CoordinatorLease | None,
        action: Callable[[DeltaTable, _LogView], _T],
    ) -> _T:
        """Run *action* on a fresh snapshot of ``checkpoints`` after checking that *lease*
        (if given) holds the newest epoch. *action* commits (if at all) through the given
        table with :func:`_no_rebase`, so its commit fails when anything else committed
        since the check; the attempt is then repeated on a fresh snapshot."""
        with _boundary(what, reading=True):
            for _ in range(self._max_attempts):
                dt = self._ensure(StoreTable.CHECKPOINTS)
                view = self._view(dt)
                if lease is not None and view.max_epoch != lease.epoch:
                    raise FencedError(
                        f"coordinator epoch {lease.epoch} was superseded by epoch {view.max_epoch}"
                    )
                try:
                    return action(dt, view)
                except CommitFailedError:
                    continue
            raise StoreError(f"{what}: lost {self._max_attempts} commit races in a row")

    def _append_lease(self, dt: DeltaTable, view: _LogView, epoch: int) -> CoordinatorLease:
        lease = CoordinatorLease(epoch, view.next_id, view.next_id + ID_BLOCK)
        row: dict[str, list[Any]] = {
            "record": [LogRecord.LEASE.value],
            "epoch": [lease.epoch],
            "checkpoint_id": [lease.first_id],
            "id_end": [lease.end_id],
            "committed_at": [self._now()],
        }
        write_deltalake(
            dt,
            _table(CHECKPOINTS_SCHEMA, row),
            mode="append",
            commit_properties=_no_rebase(),
        )
        self._remember(dt, view, lease=lease)
        return lease

    # -- fencing and ids -------------------------------------------------------------------
    def acquire(self) -> CoordinatorLease:
        return self._fenced(
            "acquire",
            None,
            lambda dt, view: self._append_lease(dt, view, view.max_epoch + 1),
        )

    def allocate_ids(self, lease: CoordinatorLease) -> CoordinatorLease:
        return self._fenced(
            "allocate_ids",
            lease,
            lambda dt, view: self._append_lease(dt, view, lease.epoch),
        )

    # -- task state ------------------------------------------------------------------------
    def write_task_state(self, checkpoint_id: int, snapshot: TaskSnapshot) -> TaskStateHandle:
        """Task side. Appends the snapshot's new blobs (at most one commit per state table)
        and its source offsets; idempotent per (task, checkpoint) — see the module
        docstring. Returns the handle to acknowledge: the stored refs of the new blobs in
        snapshot order, then the reused refs."""
        payloads = [encode_table(b.table) for b in snapshot.new_blobs]
        refs = [
            make_ref(checkpoint_id, b, p) for b, p in zip(snapshot.new_blobs, payloads, strict=True)
        ]
        stored: dict[str, BlobRef] = {}
        with _boundary(f"writing state of {snapshot.task} for checkpoint {checkpoint_id}"):
            for table in (StoreTable.OPERATOR_STATE, StoreTable.CHANNEL_STATE):
                mine = [
                    (r, p)
                    for r, p in zip(refs, payloads, strict=True)
                    if blob_table(r.kind) is table
                ]
                if mine:
                    stored.update(self._write_blobs(table, checkpoint_id, snapshot.task, mine))
            if snapshot.offsets:
                self._write_offsets(checkpoint_id, snapshot.task, snapshot.offsets)
        out = tuple(stored[blob_id(r)] for r in refs)
        return TaskStateHandle(snapshot.task, out + snapshot.reused, snapshot.offsets)

    def _write_blobs(
        self,
        table: StoreTable,
        checkpoint_id: int,
        task: TaskId,
        blobs: list[tuple[BlobRef, bytes]],
    ) -> dict[str, BlobRef]:
        app_id = f"spark-ckpt/{table.value}/{task.vertex}/{task.subtask}"
        wanted = {blob_id(r): (r, p) for r, p in blobs}
        for _ in range(self._max_attempts):
            dt = self._ensure(table)
            written = dt.transaction_version(app_id)
            existing: dict[str, BlobRef] = {}
            if written is not None and written >= checkpoint_id:
                existing = self._stored_refs(dt, [checkpoint_id], set(wanted))
            missing = [(r, p) for bid, (r, p) in wanted.items() if bid not in existing]
            if missing:
                version = checkpoint_id if written is None else max(written, checkpoint_id)
                try:
                    write_deltalake(
                        dt,
                        self._blob_rows(missing),
                        mode="append",
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(app_id, version)]
                        ),
                    )
                except CommitFailedError:
                    continue  # a racing writer of the same task: re-read what it wrote
            return {bid: existing.get(bid, r) for bid, (r, _) in wanted.items()}
        raise StoreError(f"writing {table.value}: lost {self._max_attempts} commit races")

    def _blob_rows(self, blobs: list[tuple[BlobRef, bytes]]) -> pa.Table:
        refs = [r for r, _ in blobs]
        columns: dict[str, list[Any]] = {
            "blob_id": [blob_id(r) for r in refs],
            **{
                name: [r.kind.value if name == "kind" else getattr(r, name) for r in refs]
                for name in _REF_COLUMNS
                if name != "blob_id"
            },
            "payload": [p for _, p in blobs],
            "written_at": [self._now()] * len(refs),
        }
        return _table(BLOB_SCHEMA, columns)

    def _write_offsets(
        self, checkpoint_id: int, task: TaskId, offsets: Sequence[SourceOffset]
    ) -> None:
        app_id = f"spark-ckpt/{StoreTable.SOURCE_OFFSETS.value}/{task.vertex}/{task.subtask}"
        rows = _table(
            SOURCE_OFFSETS_SCHEMA,
            {
                "checkpoint_id": [checkpoint_id] * len(offsets),
                "vertex": [task.vertex] * len(offsets),
                "subtask": [task.subtask] * len(offsets),
                "source": [o.source for o in offsets],
                "channel": [o.channel for o in offsets],
                "offset": [o.offset for o in offsets],
                "written_at": [self._now()] * len(offsets),
            },
        )
        for _ in range(self._max_attempts):
            dt = self._ensure(StoreTable.SOURCE_OFFSETS)
            written = dt.transaction_version(app_id)
            if written is not None and written >= checkpoint_id:
                mine = (pc.field("vertex") == task.vertex) & (pc.field("subtask") == task.subtask)
                found = self._scan(
                    dt,
                    ["checkpoint_id"],
                    ids=[checkpoint_id],
                    row_filter=mine,
                    filter_columns=("vertex", "subtask"),
                )
                if found.num_rows:
                    return
            version = checkpoint_id if written is None else max(written, checkpoint_id)
            try:
                write_deltalake(
                    dt,
                    rows,
                    mode="append",
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(app_id, version)]
                    ),
                )
            except CommitFailedError:
                continue
            return
        raise StoreError(f"writing source offsets: lost {self._max_attempts} commit races")

    def _stored_refs(
        self, dt: DeltaTable, ids: Iterable[int], wanted: set[str] | None = None
    ) -> dict[str, BlobRef]:
        """blob_id -> stored ref (no payload read) of blobs of checkpoints *ids*."""
        row_filter = None if wanted is None else pc.field("blob_id").isin(sorted(wanted))
        t = self._scan(
            dt, _REF_COLUMNS, ids=ids, row_filter=row_filter, filter_columns=("blob_id",)
        )
        return {d["blob_id"]: BlobRef.from_dict(d) for d in t.to_pylist()}

    def stored_blobs(self) -> list[BlobRef]:
        """Every blob row in the store (without payloads), committed or not."""
        out: list[BlobRef] = []
        with _boundary("listing blobs", reading=True):
            for table in (StoreTable.OPERATOR_STATE, StoreTable.CHANNEL_STATE):
                dt = self._load(table)
                if dt is not None:
                    t = self._scan(dt, _REF_COLUMNS)
                    out.extend(BlobRef.from_dict(d) for d in t.to_pylist())
        return out

    # -- reading blobs ---------------------------------------------------------------------
    def read_blob(self, ref: BlobRef) -> pa.Table:
        return self.read_blobs([ref])[0]

    def read_blobs(self, refs: Sequence[BlobRef]) -> list[pa.Table]:
        """Read and verify many blobs with one scan per state table (restore of many key
        groups is not many scans). Results are in the order of *refs*. A blob missing from
        the store raises :class:`CorruptCheckpointError` if a completed checkpoint references
        it, else :class:`CheckpointNotFoundError`."""
        found: dict[str, list[tuple[str | None, bytes | None]]] = {}
        with _boundary("reading blobs", reading=True):
            for table in (StoreTable.OPERATOR_STATE, StoreTable.CHANNEL_STATE):
                mine = [r for r in refs if blob_table(r.kind) is table]
                if not mine:
                    continue
                dt = self._load(table)
                if dt is None:
                    continue
                ids = {blob_id(r) for r in mine}
                t = self._scan(
                    dt,
                    ["blob_id", "checksum", "payload"],
                    ids={r.checkpoint_id for r in mine},
                    row_filter=pc.field("blob_id").isin(sorted(ids)),
                    filter_columns=("blob_id",),
                )
                for bid, digest, payload in zip(
                    t["blob_id"].to_pylist(),
                    t["checksum"].to_pylist(),
                    t["payload"].to_pylist(),
                    strict=True,
                ):
                    found.setdefault(bid, []).append((digest, payload))
        out: list[pa.Table] = []
        for ref in refs:
            rows = found.get(blob_id(ref))
            if not rows:
                raise self._missing(ref)
            out.append(_verified_payload(rows, ref))
        return out

    def _missing(self, ref: BlobRef) -> StoreError:
        completed, _ = self.list_completed_lenient()
        referenced = any(ref.key == b.key for c in completed for b in c.blobs())
        where = f"blob {ref.key}"
        if referenced:
            return CorruptCheckpointError(f"{where} of a completed checkpoint is missing")
        return CheckpointNotFoundError(f"{where} is not in the store")

    # -- verification ----------------------------------------------------------------------
    def describe_blob(self, ref: BlobRef) -> str:
        """The base description plus where the row lives: table and ``blob_id``."""
        return f"{describe_blob(ref)} [{blob_table(ref.kind).value} blob_id {blob_id(ref)}]"

    def _find_damage(self, refs: Sequence[BlobRef]) -> tuple[BlobRef | None, StoreError] | None:
        """One :meth:`read_blobs` (one scan per table); if it fails in any way — damage or
        an I/O error, which pyarrow does not tell apart — :meth:`_examine_files` decides."""
        try:
            self.read_blobs(refs)
            return None
        except StoreError:
            return self._examine_files(refs)

    def _examine_files(self, refs: Sequence[BlobRef]) -> tuple[BlobRef | None, StoreError] | None:
        """Verify *refs* reading the data files that may hold them (pruned by checkpoint id,
        as :meth:`read_blobs` does) one at a time: the bytes are read first — an I/O error
        there propagates as :class:`StoreError`, a file that is gone is damage — and then
        decoded in memory, where any failure is damage of that file. Rows are then selected
        and checked exactly as :meth:`read_blobs` does, so a checkpoint passes here iff a
        restore can read it. Returns the first damaged blob of *refs* and why, or ``None``."""
        found: dict[str, list[tuple[str | None, bytes | None]]] = {}
        damaged_files: dict[StoreTable, list[str]] = {}
        with _boundary("verifying blobs"):
            for table in (StoreTable.OPERATOR_STATE, StoreTable.CHANNEL_STATE):
                mine = [r for r in refs if blob_table(r.kind) is table]
                dt = self._load(table) if mine else None
                if dt is None:
                    continue
                ids = sorted({r.checkpoint_id for r in mine})
                wanted = {blob_id(r) for r in mine}
                dataset = dt.to_pyarrow_dataset(
                    filesystem=self._arrow_fs(dt),
                    file_pruning_predicate=[("checkpoint_id", "in", ids)],
                )
                bad = damaged_files.setdefault(table, [])
                for path in dataset.files:
                    try:
                        with dataset.filesystem.open_input_file(path) as f:
                            data = f.read()
                    except FileNotFoundError as e:
                        bad.append(f"data file {path} is gone ({e})")
                        continue
                    try:
                        rows = _decode_blob_rows(data, dataset, set(ids), wanted)
                    except (pa.ArrowException, OSError, ValueError) as e:
                        bad.append(f"data file {path} does not decode ({type(e).__name__}: {e})")
                        continue
                    for bid, digest, payload in rows:
                        found.setdefault(bid, []).append((digest, payload))
        for ref in refs:
            rows_of = found.get(blob_id(ref))
            if not rows_of:
                files = damaged_files.get(blob_table(ref.kind), [])
                why = (
                    f"its row cannot be read: {'; '.join(files)}" if files else "its row is missing"
                )
                return ref, CorruptCheckpointError(why)
            try:
                _verified_payload(rows_of, ref)
            except CorruptCheckpointError as e:
                return ref, e
        return None

    # -- completion ------------------------------------------------------------------------
    def commit(self, lease: CoordinatorLease, checkpoint: CompletedCheckpoint) -> None:
        """The completion commit: one small append to ``checkpoints``, fenced; a no-op if the
        id is already committed. Every referenced blob must have been written
        (:class:`StoreError` otherwise)."""
        cid = checkpoint.checkpoint_id
        text = checkpoint.to_json()
        row = _table(
            CHECKPOINTS_SCHEMA,
            {
                "record": [LogRecord.COMPLETED.value],
                "epoch": [lease.epoch],
                "checkpoint_id": [cid],
                "snapshot_type": [checkpoint.snapshot_type.value],
                "trigger_ts": [checkpoint.stats.trigger_ms * 1000],
                "completed_ts": [checkpoint.stats.completed_ms * 1000],
                "state_bytes": [checkpoint.stats.state_bytes],
                "metadata": [text],
                "checksum": [checkpoint.checksum()],
                "committed_at": [self._now()],
            },
        )
        verified = False

        def action(dt: DeltaTable, view: _LogView) -> None:
            nonlocal verified
            if cid in view.completed:
                return
            if not verified:
                self._verify_written(checkpoint)
                verified = True
            write_deltalake(dt, row, mode="append", commit_properties=_no_rebase())
            self._remember(dt, view, completed=(cid, (text, checkpoint.checksum())))

        self._fenced(f"commit of checkpoint {cid}", lease, action)

    def _verify_written(self, checkpoint: CompletedCheckpoint) -> None:
        refs = list(checkpoint.blobs())
        stored: dict[str, BlobRef] = {}
        for table in (StoreTable.OPERATOR_STATE, StoreTable.CHANNEL_STATE):
            mine = [r for r in refs if blob_table(r.kind) is table]
            dt = self._load(table) if mine else None
            if dt is not None:
                ids = {blob_id(r) for r in mine}
                stored.update(self._stored_refs(dt, {r.checkpoint_id for r in mine}, ids))
        for ref in refs:
            if blob_id(ref) not in stored:
                raise StoreError(
                    f"checkpoint {checkpoint.checkpoint_id} references blob {ref.key} "
                    "that was never written"
                )

    def list_completed_lenient(
        self,
    ) -> tuple[list[CompletedCheckpoint], list[CorruptCheckpointError]]:
        """Every committed checkpoint whose metadata verifies, and an error per completed row
        whose metadata does not (see the base class). A log that cannot be read at all (a
        lost data file, a row without metadata) still raises."""
        with _boundary("listing completed checkpoints", reading=True):
            dt = self._load(StoreTable.CHECKPOINTS)
            if dt is None:
                return [], []
            with self._lock:
                cached = self._completed_cache
            if cached is not None and cached[0] == dt.version():
                return list(cached[1]), list(cached[2])
            view = self._view(dt)
        good, bad = parse_completed(view.completed.items())
        with self._lock:
            self._completed_cache = (view.version, good, bad)
        return list(good), list(bad)

    # -- retention -------------------------------------------------------------------------
    def retain(
        self,
        lease: CoordinatorLease,
        retained: int,
        keep_from: int | None = None,
        *,
        collect_garbage: bool = True,
    ) -> list[int]:
        retention_plan(self.list_completed(), retained)  # validates *retained* first

        def action(dt: DeltaTable, view: _LogView) -> tuple[list[CompletedCheckpoint], list[int]]:
            kept, dropped = retention_plan(_parse(view), retained, keep_from)
            ids = [c.checkpoint_id for c in dropped]
            self._delete_completed(dt, view, ids)
            return kept, ids

        kept, dropped_ids = self._fenced("retain", lease, action)
        if not collect_garbage:
            return dropped_ids
        with _boundary("retain: removing garbage", reading=True):
            horizon = max((c.checkpoint_id for c in kept), default=0)
            stored = self._stored_refs_upto(horizon)
            self._delete_blobs(garbage_blobs(stored, kept))
            kept_ids = {c.checkpoint_id for c in kept}
            self._delete_offsets(lambda i: i <= horizon and i not in kept_ids)
        return dropped_ids

    def discard(self, lease: CoordinatorLease, checkpoint_ids: Iterable[int]) -> None:
        """Remove these checkpoints (committed or not) and every blob written for them that
        no remaining checkpoint references."""
        ids = sorted(set(checkpoint_ids))

        def action(dt: DeltaTable, view: _LogView) -> list[CompletedCheckpoint]:
            self._delete_completed(dt, view, [i for i in ids if i in view.completed])
            return [c for c in _parse(view) if c.checkpoint_id not in ids]

        kept = self._fenced("discard", lease, action)
        if not ids:
            return
        with _boundary("discard: removing blobs", reading=True):
            referenced = {b.key for c in kept for b in c.blobs()}
            stored = self._stored_refs_of(ids)
            self._delete_blobs([r for r in stored if r.key not in referenced])
            kept_ids = {c.checkpoint_id for c in kept}
            id_set = set(ids)
            self._delete_offsets(lambda i: i in id_set and i not in kept_ids)

    def _delete_completed(self, dt: DeltaTable, view: _LogView, ids: Sequence[int]) -> None:
        """Fenced removal of completed rows (one commit on the checked snapshot *view*)."""
        if not ids:
            return
        predicate = f"record = '{LogRecord.COMPLETED.value}' AND checkpoint_id IN {_sql_list(ids)}"
        dt.delete(predicate, commit_properties=_no_rebase())
        self._remember(dt, view, removed=ids)

    def _stored_refs_upto(self, horizon: int) -> list[BlobRef]:
        out: list[BlobRef] = []
        for table in (StoreTable.OPERATOR_STATE, StoreTable.CHANNEL_STATE):
            dt = self._load(table)
            if dt is not None:
                t = self._scan(dt, _REF_COLUMNS, row_filter=pc.field("checkpoint_id") <= horizon)
                out.extend(BlobRef.from_dict(d) for d in t.to_pylist())
        return out

    def _stored_refs_of(self, ids: Sequence[int]) -> list[BlobRef]:
        out: list[BlobRef] = []
        for table in (StoreTable.OPERATOR_STATE, StoreTable.CHANNEL_STATE):
            dt = self._load(table)
            if dt is not None:
                out.extend(self._stored_refs(dt, ids).values())
        return out

    def _delete_blobs(self, refs: Sequence[BlobRef]) -> None:
        """Delete blob rows (copy-on-write). Runs with delta-rs' normal conflict resolution:
        a delete rebases over concurrent task appends (verified with deltalake 1.6)."""
        for table in (StoreTable.OPERATOR_STATE, StoreTable.CHANNEL_STATE):
            mine = [r for r in refs if blob_table(r.kind) is table]
            if not mine:
                continue
            dt = self._ensure(table)
            for chunk in _chunks(sorted(mine, key=lambda r: r.key)):
                ids = sorted({r.checkpoint_id for r in chunk})
                bids = sorted({blob_id(r) for r in chunk})
                dt.delete(f"checkpoint_id IN {_sql_list(ids)} AND blob_id IN {_sql_list(bids)}")

    def _delete_offsets(self, drop: Callable[[int], bool]) -> None:
        dt = self._load(StoreTable.SOURCE_OFFSETS)
        if dt is None:
            return
        present = self._scan(dt, ["checkpoint_id"])["checkpoint_id"]
        ids = [i for i in pc.unique(present).to_pylist() if drop(i)]
        for chunk in _chunks(sorted(ids)):
            dt.delete(f"checkpoint_id IN {_sql_list(chunk)}")

    # -- maintenance -----------------------------------------------------------------------
    def vacuum(
        self,
        retention_hours: int = 168,
        *,
        dry_run: bool = False,
        enforce_retention_duration: bool = True,
    ) -> list[str]:
        """Physically delete data files that the tables no longer reference and that were
        removed more than *retention_hours* ago (Delta ``VACUUM``). Never run implicitly:
        until then removed state stays readable by Delta time travel. Returns the files
        (to be) deleted. A retention below the table's ``delta.deletedFileRetentionDuration``
        needs ``enforce_retention_duration=False`` and is safe only when no reader is
        reading an older table version."""
        out: list[str] = []
        with _boundary("vacuum"):
            for table in StoreTable:
                dt = self._load(table)
                if dt is not None:
                    out.extend(
                        dt.vacuum(
                            retention_hours=retention_hours,
                            dry_run=dry_run,
                            enforce_retention_duration=enforce_retention_duration,
                        )
                    )
        return out


def _no_rebase() -> CommitProperties:
    """Commit exactly on the snapshot read: a concurrent commit makes ours fail."""
    return CommitProperties(max_commit_retries=0)


def _verified_payload(rows: Sequence[tuple[str | None, bytes | None]], ref: BlobRef) -> pa.Table:
    """The blob *ref* decoded from the stored (checksum, payload) rows of its blob id (at
    least one): the row whose stored checksum matches is preferred; any other one fails
    verification. Raises :class:`CorruptCheckpointError`."""
    payload = next((p for d, p in rows if d == ref.checksum), rows[0][1])
    if payload is None:  # a damaged file can decode a non-nullable column as null
        raise CorruptCheckpointError(
            f"blob {ref.key} of checkpoint {ref.checkpoint_id} has a null payload"
        )
    return decode_table(payload, ref)


def _decode_blob_rows(
    data: bytes, dataset: ds.FileSystemDataset, ids: set[int], wanted: set[str]
) -> list[tuple[str, str | None, bytes | None]]:
    """(blob_id, checksum, payload) of the rows of the Parquet file *data* (one file of
    *dataset*) whose checkpoint id is in *ids* and blob id in *wanted* — the rows
    :meth:`DeltaCheckpointStore.read_blobs` would select. The file is read as the scan reads
    it: with *dataset*'s format and schema (files that delta-rs rewrote carry ``string_view``,
    which the table schema reads as ``string``) and the same checkpoint-id filter, so row
    groups are pruned by the file's own statistics exactly as there. Raises what pyarrow
    raises for undecodable bytes (``ArrowException``, ``OSError``, ``ValueError``; full
    validation catches invalid UTF-8 too)."""
    fragment = dataset.format.make_fragment(pa.py_buffer(data))
    table = fragment.to_table(
        schema=dataset.schema,
        columns=["blob_id", "checkpoint_id", "checksum", "payload"],
        filter=pc.field("checkpoint_id").isin(sorted(ids)),
    )
    table.validate(full=True)
    out: list[tuple[str, str | None, bytes | None]] = []
    for bid, cid, digest, payload in zip(
        table["blob_id"].to_pylist(),
        table["checkpoint_id"].to_pylist(),
        table["checksum"].to_pylist(),
        table["payload"].to_pylist(),
        strict=True,
    ):
        if cid in ids and bid in wanted:
            out.append((bid, digest, payload))
    return out


def _parse(view: _LogView) -> list[CompletedCheckpoint]:
    return [CompletedCheckpoint.from_json(t, d) for _, (t, d) in sorted(view.completed.items())]


def _table(schema: pa.Schema, columns: Mapping[str, list[Any]]) -> pa.Table:
    """A table of *schema*; columns not given are null."""
    n = len(next(iter(columns.values())))
    arrays = [
        pa.array(columns[f.name], type=f.type) if f.name in columns else pa.nulls(n, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _empty(columns: list[str]) -> pa.Table:
    """An empty table of *columns* (types as in the store's schemas)."""
    fields = {f.name: f for schema in _SCHEMAS.values() for f in schema}
    return pa.schema([fields[c] for c in columns]).empty_table()

"""State blobs on Delta: the ``operator_state``, ``channel_state`` and ``source_offsets``
tables (writing, reading, checksum verification, damage detection).

The blob side of :class:`~spark_ckpt.delta.delta_store.DeltaCheckpointStore`, used through the task
view (:class:`~spark_ckpt.storage.checkpoint_store.StateStorage`) by the tasks in the foreachBatch
process and the ``ckpt-sink`` commit, and by the coordinator host to verify a restore point. How it
keeps the contract of :mod:`spark_ckpt.storage.checkpoint_store`:

* **Idempotent task state.** Each task commits its rows with a Delta *app transaction*
  ``spark-ckpt/<table>/<vertex>/<subtask>`` whose version is the highest checkpoint id the
  task wrote. If that version is below the checkpoint id, nothing of this task and
  checkpoint can exist and the rows are appended blindly; otherwise the stored keys are read
  first and only missing blobs are appended (for a key already stored the *stored* ref is
  returned, like :class:`~spark_ckpt.storage.memory_store.InMemoryCheckpointStore`). Two racing
  writers of one task conflict on the app id (delta-rs raises ``ConcurrentTransaction``); the
  loser re-reads and finds its rows written. Reads additionally pick, per key, the row whose
  checksum matches the reference, so even duplicate rows could not yield wrong data. Blob
  rows stay unreferenced (invisible) until the checkpoint's completion commit.
* **Source offsets** travel in the acknowledgements and are part of the completion commit's
  record; their queryable copy in ``source_offsets`` is written by the coordinator
  (:meth:`write_offsets`): a savepoint's just before its completion commit, the retained
  checkpoints' at each retention (one append for all that completed since).
* **Completion check.** The completion commit first checks that every blob the checkpoint
  references is stored, from the tables' logs where they tell (:meth:`check_written`).
* **Integrity.** Blobs are verified against their checksums; a referenced blob whose row is
  missing, or an unreadable data file, raises :class:`CorruptCheckpointError`. Errors of
  delta-rs, Arrow and the file system are translated into :class:`StoreError` subclasses
  here; none escapes raw. :meth:`DeltaBlobStore.examine_files` reads the candidate data
  files one by one and decodes each in memory, which separates damage (a file that is gone
  or does not decode, a row that is missing or fails its checksum:
  :class:`CorruptCheckpointError`) from a store that cannot be read (any other I/O error:
  :class:`StoreError`) — pyarrow reports a damaged Parquet footer and an I/O failure alike
  as ``OSError``.

Threading: every call is an independent transaction on freshly loaded tables; concurrent task
writes to a state table are rebased by delta-rs (blind appends do not conflict).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError

from spark_ckpt.delta.boundary import store_boundary
from spark_ckpt.delta.store_layout import (
    BLOB_SCHEMA,
    BLOB_TABLES,
    SOURCE_OFFSETS_SCHEMA,
    StoreTable,
)
from spark_ckpt.delta.store_tables import StoreTables
from spark_ckpt.delta.store_writes import rows_table
from spark_ckpt.errors import CheckpointNotFoundError, CorruptCheckpointError, StoreError
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.state_handles import (
    BlobKind,
    BlobRef,
    TaskId,
    TaskSnapshot,
    TaskStateHandle,
    decode_table,
    encode_table,
    make_ref,
)
from spark_ckpt.storage.checkpoint_store import CompletedCheckpoints, StateStorage, describe_blob

#: The columns of a blob row that make up its :class:`BlobRef` (and ``blob_id``).
REF_COLUMNS = [f.name for f in BLOB_SCHEMA if f.name not in ("payload", "written_at")]


def blob_id(ref: BlobRef) -> str:
    """Stable identifier of a blob key (hex, 32 chars): what delete/read predicates match."""
    text = json.dumps(list(ref.key), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


#: The app transaction of the coordinators' appends to ``source_offsets``.
OFFSETS_APP_ID = f"spark-ckpt/{StoreTable.SOURCE_OFFSETS.value}/completion"


#: Blob rows are written one per Parquet row group, so that a read of some blobs decodes their
#: row groups only (pruned by the statistics of the integer columns :meth:`read_blobs` pushes
#: into the scan), never every payload of the file.
#: The payload column has no statistics (a chunk's min and max would be whole payloads, held in
#: the file's footer, which every read parses) and no dictionary.
_ONE_BLOB_PER_ROW_GROUP = WriterProperties(
    max_row_group_size=1,
    compression="SNAPPY",
    column_properties={
        "payload": ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")
    },
)
#: What the other rows (source offsets) are written with: delta-rs's defaults.
_PLAIN_ROWS = WriterProperties(compression="SNAPPY")


def _narrowing(refs: Sequence[BlobRef]) -> ds.Expression:
    """A predicate on integer columns that every row of *refs* satisfies (and few others):
    pushed into a scan, it skips the row groups of other blobs by their statistics."""
    subtasks = sorted({r.subtask for r in refs})
    starts = sorted({r.key_group_start for r in refs})
    seqs = sorted({r.seq for r in refs})
    return (
        pc.field("subtask").isin(subtasks)
        & pc.field("key_group_start").isin(starts)
        & pc.field("seq").isin(seqs)
    )


def _app_id(table: StoreTable, task: TaskId) -> str:
    """The Delta app transaction under which *task* commits its rows of *table*."""
    return f"spark-ckpt/{table.value}/{task.vertex}/{task.subtask}"


def blob_table(kind: BlobKind) -> StoreTable:
    """The table that holds blobs of *kind*."""
    return StoreTable.CHANNEL_STATE if kind is BlobKind.CHANNEL else StoreTable.OPERATOR_STATE


class DeltaBlobStore(StateStorage):
    """The state tables of *tables* (see the module docstring). *completed* tells a blob that
    a completed checkpoint references (its loss is damage) from one that was never
    committed. *max_attempts* bounds the re-attempts of one write after losing a commit
    race."""

    def __init__(
        self, tables: StoreTables, *, completed: CompletedCheckpoints, max_attempts: int
    ) -> None:
        self._tables = tables
        self._completed = completed
        self._max_attempts = max_attempts
        #: checkpoints whose offsets this store found or put in ``source_offsets``
        self._offsets_copied: set[int] = set()

    # -- writing ---------------------------------------------------------------------------
    def write_task_state(self, checkpoint_id: int, snapshot: TaskSnapshot) -> TaskStateHandle:
        """Task side. Appends the snapshot's new blobs (at most one commit per state table);
        idempotent per (task, checkpoint) — see the module docstring. Returns the handle to
        acknowledge: the stored refs of the new blobs in snapshot order, then the reused
        refs, and the snapshot's source offsets (their queryable copy is written with the
        completion: :meth:`write_offsets`)."""
        payloads = [encode_table(b.table) for b in snapshot.new_blobs]
        refs = [
            make_ref(checkpoint_id, b, p) for b, p in zip(snapshot.new_blobs, payloads, strict=True)
        ]
        stored: dict[str, BlobRef] = {}
        with store_boundary(f"writing state of {snapshot.task} for checkpoint {checkpoint_id}"):
            for table in BLOB_TABLES:
                mine = [
                    (r, p)
                    for r, p in zip(refs, payloads, strict=True)
                    if blob_table(r.kind) is table
                ]
                if mine:
                    stored.update(self._write_blobs(table, checkpoint_id, snapshot.task, mine))
        out = tuple(stored[blob_id(r)] for r in refs)
        return TaskStateHandle(snapshot.task, out + snapshot.reused, snapshot.offsets)

    def _write_blobs(
        self,
        table: StoreTable,
        checkpoint_id: int,
        task: TaskId,
        blobs: list[tuple[BlobRef, bytes]],
    ) -> dict[str, BlobRef]:
        wanted = {blob_id(r): (r, p) for r, p in blobs}
        existing: dict[str, BlobRef] = {}

        def missing_rows(dt: DeltaTable, version: int | None) -> pa.Table | None:
            existing.clear()
            if version is not None and version >= checkpoint_id:  # may be written
                existing.update(self._stored_refs(dt, [checkpoint_id], set(wanted)))
            missing = [(r, p) for bid, (r, p) in wanted.items() if bid not in existing]
            return self._blob_rows(missing) if missing else None

        self._append_once(
            table,
            _app_id(table, task),
            checkpoint_id,
            missing_rows,
            f"writing {table.value}",
            properties=_ONE_BLOB_PER_ROW_GROUP,
        )
        return {bid: existing.get(bid, r) for bid, (r, _) in wanted.items()}

    def _append_once(
        self,
        table: StoreTable,
        app_id: str,
        checkpoint_id: int,
        rows: Callable[[DeltaTable, int | None], pa.Table | None],
        what: str,
        *,
        properties: WriterProperties = _PLAIN_ROWS,
    ) -> None:
        """Append *rows* to *table* at most once per *checkpoint_id* and writer *app_id*: one
        commit that sets the writer's app transaction to the newest checkpoint id it wrote.
        ``rows(dt, version)`` gives what is still to append at *dt* (``None``: nothing);
        *version* is the writer's app transaction at *dt* (read once per attempt: each read
        replays the log since its last checkpoint): at or past *checkpoint_id*, an earlier
        attempt may have committed (look the rows up). Tried again on a lost commit race
        and when the table object needed a commit file the log cleanup removed (the commit
        may have landed: a new object re-reads what is written)."""
        for _ in range(self._max_attempts):
            dt = self._tables.ensure(table)
            version = dt.transaction_version(app_id)
            todo = rows(dt, version)
            if todo is None:
                return
            newest = checkpoint_id if version is None else max(version, checkpoint_id)
            try:
                write_deltalake(
                    dt,
                    todo,
                    mode="append",
                    writer_properties=properties,
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(app_id, newest)]
                    ),
                )
            except CommitFailedError:
                continue  # a racing writer: re-read what it wrote
            except FileNotFoundError:
                self._tables.forget(table)
                continue
            return
        raise StoreError(f"{what}: lost {self._max_attempts} commit races")

    def _blob_rows(self, blobs: list[tuple[BlobRef, bytes]]) -> pa.Table:
        refs = [r for r, _ in blobs]
        columns: dict[str, list[Any]] = {
            "blob_id": [blob_id(r) for r in refs],
            **{
                name: [r.kind.value if name == "kind" else getattr(r, name) for r in refs]
                for name in REF_COLUMNS
                if name != "blob_id"
            },
            "payload": [p for _, p in blobs],
            "written_at": [self._tables.now()] * len(refs),
        }
        return rows_table(BLOB_SCHEMA, columns)

    def write_offsets(self, checkpoints: Sequence[CompletedCheckpoint]) -> None:
        """Coordinator side: the queryable copy of *checkpoints*' source offsets in
        ``source_offsets`` (a row per task and channel, as the tasks acknowledged them), in
        one append, for those of them the table does not hold yet: not copied by this store
        before, and not found by a scan of their ids (files pruned by the ids' statistics),
        which is skipped when the app transaction says each of them is newer than what was
        written. The
        app transaction :data:`OFFSETS_APP_ID` is set to the newest id written, so two
        writers of the same rows conflict and the loser finds them on its next attempt.
        Idempotent. Rows of a checkpoint that retention removed later are garbage that
        retention or discard removes."""
        checkpoints = [c for c in checkpoints if c.checkpoint_id not in self._offsets_copied]
        owned = [(c, h.task, o) for c in checkpoints for h in c.tasks for o in h.offsets]
        if not owned:
            return
        newest = max(c.checkpoint_id for c, _, _ in owned)
        ids = sorted({c.checkpoint_id for c, _, _ in owned})

        def unwritten(dt: DeltaTable, version: int | None) -> pa.Table | None:
            present: set[int] = set()
            if version is not None and version >= ids[0]:
                # some may be written: the app transaction holds the highest id written,
                # so ids above it cannot be, and only then is the scan skipped
                found = self._tables.scan(dt, ["checkpoint_id"], ids=ids)["checkpoint_id"]
                present = set(pc.unique(found).to_pylist())
            todo = [(c, t, o) for c, t, o in owned if c.checkpoint_id not in present]
            if not todo:
                return None
            return rows_table(
                SOURCE_OFFSETS_SCHEMA,
                {
                    "checkpoint_id": [c.checkpoint_id for c, _, _ in todo],
                    "vertex": [t.vertex for _, t, _ in todo],
                    "subtask": [t.subtask for _, t, _ in todo],
                    "source": [o.source for _, _, o in todo],
                    "channel": [o.channel for _, _, o in todo],
                    "offset": [o.offset for _, _, o in todo],
                    "written_at": [self._tables.now()] * len(todo),
                },
            )

        with store_boundary(f"writing the source offsets of checkpoints {ids}"):
            self._append_once(
                StoreTable.SOURCE_OFFSETS,
                OFFSETS_APP_ID,
                newest,
                unwritten,
                "writing source offsets",
            )
        self._offsets_copied.update(ids)
        if len(self._offsets_copied) > 10_000:  # ids of checkpoints long gone
            self._offsets_copied = set(sorted(self._offsets_copied)[-1_000:])

    # -- listing ---------------------------------------------------------------------------
    def _stored_refs(
        self, dt: DeltaTable, ids: Iterable[int], wanted: set[str] | None = None
    ) -> dict[str, BlobRef]:
        """blob_id -> stored ref (no payload read) of blobs of checkpoints *ids*."""
        row_filter = None if wanted is None else pc.field("blob_id").isin(sorted(wanted))
        t = self._tables.scan(
            dt, REF_COLUMNS, ids=ids, row_filter=row_filter, filter_columns=("blob_id",)
        )
        return {d["blob_id"]: BlobRef.from_dict(d) for d in t.to_pylist()}

    def stored_blobs(self) -> list[BlobRef]:
        """Every blob row in the store (without payloads), committed or not."""
        out: list[BlobRef] = []
        with store_boundary("listing blobs", reading=True):
            for table in BLOB_TABLES:
                dt = self._tables.load(table)
                if dt is not None:
                    t = self._tables.scan(dt, REF_COLUMNS)
                    out.extend(BlobRef.from_dict(d) for d in t.to_pylist())
        return out

    def stored_refs_upto(self, horizon: int) -> list[BlobRef]:
        """Every stored blob (without payloads) written by a checkpoint id <= *horizon*.
        Raw Delta errors propagate: the caller holds the boundary."""
        out: list[BlobRef] = []
        for table in BLOB_TABLES:
            dt = self._tables.load(table)
            if dt is not None:
                t = self._tables.scan(
                    dt, REF_COLUMNS, row_filter=pc.field("checkpoint_id") <= horizon
                )
                out.extend(BlobRef.from_dict(d) for d in t.to_pylist())
        return out

    def stored_refs_of(self, ids: Sequence[int]) -> list[BlobRef]:
        """Every stored blob (without payloads) written by the checkpoints *ids*. Raw Delta
        errors propagate: the caller holds the boundary."""
        out: list[BlobRef] = []
        for table in BLOB_TABLES:
            dt = self._tables.load(table)
            if dt is not None:
                out.extend(self._stored_refs(dt, ids).values())
        return out

    def check_written(
        self, checkpoint: CompletedCheckpoint, completed: Sequence[CompletedCheckpoint] = ()
    ) -> None:
        """Raise :class:`StoreError` unless every blob *checkpoint* references is stored
        (the precondition of its completion commit); *completed*: the checkpoints the log
        holds completed. Decided from the tables' logs where they tell, without reading
        data files:

        * a blob *checkpoint*'s own tasks wrote is stored when *checkpoint* is newer than
          every completed checkpoint and the task's app transaction in the blob's table is
          at exactly *checkpoint*'s id: the task's rows of one checkpoint and table go in
          one commit, which sets it, and garbage collection removes no blob newer than the
          newest completed checkpoint (a pending checkpoint older than a completed one, say
          one that a savepoint overtook, is looked up: its blobs may be collected);
        * a blob an earlier checkpoint wrote is stored when a completed checkpoint
          references it too: garbage collection removes no blob a completed checkpoint
          references.

        The rest (a task whose app transaction moved on to a later checkpoint, a blob no
        completed checkpoint references) is looked up with one scan per table."""
        cid = checkpoint.checkpoint_id
        kept = {b.key for c in completed for b in c.blobs()}
        newest = cid > max((c.checkpoint_id for c in completed), default=0)
        loaded: dict[StoreTable, DeltaTable | None] = {}  # each table read once
        unsure: list[BlobRef] = []
        for handle in checkpoint.tasks:
            for table in BLOB_TABLES:
                mine = [r for r in handle.blobs if blob_table(r.kind) is table]
                new = [r for r in mine if r.checkpoint_id == cid]
                unsure.extend(r for r in mine if r.checkpoint_id != cid and r.key not in kept)
                if not new:
                    continue
                if newest and table not in loaded:
                    loaded[table] = self._tables.load(table)
                dt = loaded.get(table)
                if dt is None or dt.transaction_version(_app_id(table, handle.task)) != cid:
                    unsure.extend(new)
        stored: dict[str, BlobRef] = {}
        for table in BLOB_TABLES:
            mine = [r for r in unsure if blob_table(r.kind) is table]
            dt = self._tables.load(table) if mine else None
            if dt is not None:
                ids = {blob_id(r) for r in mine}
                stored.update(self._stored_refs(dt, {r.checkpoint_id for r in mine}, ids))
        for ref in unsure:
            if blob_id(ref) not in stored:
                raise StoreError(
                    f"checkpoint {cid} references blob {ref.key} that was never written"
                )

    # -- reading ---------------------------------------------------------------------------
    def read_blob(self, ref: BlobRef) -> pa.Table:
        return self.read_blobs([ref])[0]

    def read_blobs(self, refs: Sequence[BlobRef]) -> list[pa.Table]:
        """Read and verify many blobs with one scan per state table (restore of many key
        groups is not many scans). Results are in the order of *refs*. A blob missing from
        the store raises :class:`CorruptCheckpointError` if a completed checkpoint references
        it, else :class:`CheckpointNotFoundError`."""
        found: dict[str, list[tuple[str | None, bytes | None]]] = {}
        with store_boundary("reading blobs", reading=True):
            for table in BLOB_TABLES:
                mine = [r for r in refs if blob_table(r.kind) is table]
                if not mine:
                    continue
                dt = self._tables.load(table)
                if dt is None:
                    continue
                ids = {blob_id(r) for r in mine}
                t = self._tables.scan(
                    dt,
                    ["blob_id", "checksum", "payload"],
                    ids={r.checkpoint_id for r in mine},
                    row_filter=pc.field("blob_id").isin(sorted(ids)),
                    filter_columns=("blob_id",),
                    pushed=_narrowing(mine),
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
        completed, _ = self._completed.list_completed_lenient()
        referenced = any(ref.key == b.key for c in completed for b in c.blobs())
        where = f"blob {ref.key}"
        if referenced:
            return CorruptCheckpointError(f"{where} of a completed checkpoint is missing")
        return CheckpointNotFoundError(f"{where} is not in the store")

    # -- damage detection ------------------------------------------------------------------
    def describe_blob(self, ref: BlobRef) -> str:
        """The base description plus where the row lives: table and ``blob_id``."""
        return f"{describe_blob(ref)} [{blob_table(ref.kind).value} blob_id {blob_id(ref)}]"

    def examine_files(self, refs: Sequence[BlobRef]) -> tuple[BlobRef | None, StoreError] | None:
        """Verify *refs* reading the data files that may hold them (pruned by checkpoint id,
        as :meth:`read_blobs` does) one at a time: the bytes are read first — an I/O error
        there propagates as :class:`StoreError`, a file that is gone is damage — and then
        decoded in memory, where any failure is damage of that file. Rows are then selected
        and checked exactly as :meth:`read_blobs` does, so a checkpoint passes here iff a
        restore can read it. Returns the first damaged blob of *refs* and why, or ``None``."""
        found: dict[str, list[tuple[str | None, bytes | None]]] = {}
        damaged_files: dict[StoreTable, list[str]] = {}
        with store_boundary("verifying blobs"):
            for table in BLOB_TABLES:
                mine = [r for r in refs if blob_table(r.kind) is table]
                dt = self._tables.load(table) if mine else None
                if dt is None:
                    continue
                ids = sorted({r.checkpoint_id for r in mine})
                wanted = {blob_id(r) for r in mine}
                dataset = dt.to_pyarrow_dataset(
                    filesystem=self._tables.arrow_fs(dt),
                    file_pruning_predicate=[("checkpoint_id", "in", ids)],
                )
                bad = damaged_files.setdefault(table, [])
                where = self._tables.uri(table)
                for name in dataset.files:  # relative to the table: named by full path
                    path = f"{where}/{name}"
                    try:
                        with dataset.filesystem.open_input_file(name) as f:
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
    :meth:`DeltaBlobStore.read_blobs` would select. The file is read as the scan reads
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

"""The layout of a checkpoint-store root: its Delta tables, their schemas and properties.

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

:class:`~spark_ckpt.delta.store_tables.StoreTables` opens, creates and scans them with
:data:`SCHEMAS` and :data:`CONFIGURATION`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import pyarrow as pa

_TS = pa.timestamp("us", tz="UTC")


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
#: ``source_offsets`` and ``checkpoint_history``: every retention): a Delta checkpoint of the log
#: every 20 commits, commit files older than a minute removed when one is written, and removed
#: data files remembered for an hour (``delta.deletedFileRetentionDuration``; Delta's default is
#: a week). A commit's cost grows with the number of files in ``_delta_log``, and every log
#: checkpoint carries the removals still remembered: with these settings the log holds about a
#: minute of commits plus 20, and a log checkpoint the removals of the last hour, instead of
#: growing under Delta's default retentions (figures: docs/architecture.md, "The Delta logs").
#: Nothing reads these tables at an older version (a restore as of a time reads the completion
#: times the log and the history record: :func:`~spark_ckpt.delta.savepoint.checkpoint_as_of`);
#: a table object older than the removed files may fail on one of them, so objects are opened
#: anew well inside the retention (:class:`~spark_ckpt.delta.followed_table.FollowedTable`).
HOT_LOG: Mapping[str, str] = {
    "delta.checkpointInterval": "20",
    "delta.logRetentionDuration": "interval 1 minutes",
    "delta.deletedFileRetentionDuration": "interval 1 hours",
}

#: Table properties set at creation, and on tables created by earlier versions when a
#: coordinator takes its lease (:meth:`~spark_ckpt.delta.store_tables.StoreTables.configure`):
#: plain properties, the protocol stays reader 1 / writer 2. Every store table keeps a short log
#: (:data:`HOT_LOG`).
CONFIGURATION: Mapping[StoreTable, Mapping[str, str]] = {
    StoreTable.CHECKPOINTS: HOT_LOG,
    StoreTable.OPERATOR_STATE: HOT_LOG,
    StoreTable.CHANNEL_STATE: HOT_LOG,
    StoreTable.SOURCE_OFFSETS: HOT_LOG,
    StoreTable.HISTORY: HOT_LOG,
}


def empty_table(columns: list[str]) -> pa.Table:
    """An empty table of *columns* (types as in the store's schemas)."""
    fields = {f.name: f for schema in SCHEMAS.values() for f in schema}
    return pa.schema([fields[c] for c in columns]).empty_table()

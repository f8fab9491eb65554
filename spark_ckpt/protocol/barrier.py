"""Checkpoint barriers, cancel markers and channel progress, and their two encodings.

A barrier for checkpoint *n* travels in-band on every channel: everything a channel emitted
before its barrier *n* belongs to checkpoint *n*, everything after it does not. A cancel
marker tells downstream tasks that checkpoint *n* was aborted, so they stop aligning on it.
A progress row (:class:`ChannelProgress`) follows a channel's data rows of a micro-batch when
the pipeline keeps event time: the micro-batch's processing time, whether the channel is
idle, and the largest event time among the rows since the channel's previous control row.

Two encodings, both explicit and stable:

* JSON (:meth:`CheckpointBarrier.to_json` / :func:`decode_event`), for triggers written to the
  checkpoint store and for logs;
* row columns (:data:`BARRIER_FIELDS`), for barrier rows that sit between data rows in a
  stream. ``_ckpt_kind`` is a ``tinyint`` code (:attr:`RecordKind.code`: 0 data, 1 barrier,
  2 cancel, 3 progress; a number rather than a string because every row carries it, and a
  string column costs Spark a string copy per row twice on the way to Arrow). A data row has
  ``_ckpt_kind == 0`` and nulls in the other barrier columns; a control row has a
  ``_ckpt_checkpoint_id`` (0 for progress, which belongs to no checkpoint).

Offsets: ``_ckpt_offset`` of a data row is its 0-based position in its channel's log. A
barrier row's offset is the number of data rows of that channel before it, i.e. the offset
of the next data row: restoring a channel "at the barrier" replays from that offset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import pyarrow as pa

from spark_ckpt.errors import ProtocolError

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


class SnapshotType(StrEnum):
    """What a barrier asks for. Savepoints are user-triggered and never expire."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


class RecordKind(StrEnum):
    """What a row (``_ckpt_kind`` column, as :attr:`code`) or a JSON event (``kind``, as the
    value) is."""

    DATA = "data"
    BARRIER = "barrier"
    CANCEL = "cancel"
    PROGRESS = "progress"

    @property
    def code(self) -> int:
        """The ``_ckpt_kind`` column value: 0 data, 1 barrier, 2 cancel, 3 progress
        (declaration order)."""
        return _KINDS.index(self)

    @staticmethod
    def from_code(code: object) -> RecordKind:
        """Inverse of :attr:`code`; :class:`ProtocolError` for anything else."""
        if type(code) is int and 0 <= code < len(_KINDS):
            return _KINDS[code]
        raise ProtocolError(
            f"unknown _ckpt_kind {code!r} (0 data, 1 barrier, 2 cancel, 3 progress)"
        )


_KINDS: tuple[RecordKind, ...] = tuple(RecordKind)


@dataclass(frozen=True)
class CheckpointBarrier:
    """Barrier *checkpoint_id*. ``unaligned`` is set when the checkpoint is taken unaligned
    from the start (the aligner may still switch an aligned one after its timeout). ``final``
    marks the checkpoint that ends a run (end of input, stop): like a savepoint it is always
    aligned, so it carries no channel state and commits every output of the input it covers."""

    checkpoint_id: int
    timestamp_ms: int
    snapshot_type: SnapshotType = SnapshotType.CHECKPOINT
    unaligned: bool = False
    final: bool = False

    def __post_init__(self) -> None:
        if self.checkpoint_id < 1:
            raise ProtocolError(f"checkpoint ids start at 1, got {self.checkpoint_id}")

    @property
    def is_savepoint(self) -> bool:
        return self.snapshot_type is SnapshotType.SAVEPOINT

    @property
    def must_align(self) -> bool:
        """Savepoints and final checkpoints are always aligned (never channel state)."""
        return self.is_savepoint or self.final

    def options_json(self) -> str:
        options: dict[str, Any] = {"type": self.snapshot_type.value, "unaligned": self.unaligned}
        if self.final:
            options["final"] = True
        return json.dumps(options, sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": RecordKind.BARRIER.value,
            "checkpoint_id": self.checkpoint_id,
            "timestamp_ms": self.timestamp_ms,
            "type": self.snapshot_type.value,
            "unaligned": self.unaligned,
            "final": self.final,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


@dataclass(frozen=True)
class CancelCheckpointMarker:
    """Checkpoint *checkpoint_id* was aborted upstream; stop aligning on it."""

    checkpoint_id: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": RecordKind.CANCEL.value, "checkpoint_id": self.checkpoint_id}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


@dataclass(frozen=True)
class ChannelProgress:
    """A channel's progress at a point of its log, sent in-band after its data rows of a
    micro-batch (and before any barrier there): *batch_ms*, the micro-batch's processing time
    (the source runner's clock when it planned the batch, recorded in the offsets, so a
    replayed batch carries the same); *idle*, whether the source found the channel idle;
    *max_event_time_us*, the largest event time (microseconds since the epoch) of the
    channel's data rows since its previous control row (None: no such row, or not known yet:
    it is filled in where the event-time column exists, after any transformation);
    *lookups*: the version of each lookup table (by its path) the micro-batch joins with,
    recorded in the offsets as the processing time is."""

    batch_ms: int
    idle: bool = False
    max_event_time_us: int | None = None
    lookups: tuple[tuple[str, int], ...] = ()

    def options_json(self) -> str:
        options: dict[str, Any] = {"idle": self.idle, "max": self.max_event_time_us}
        if self.lookups:
            options["lookups"] = dict(self.lookups)
        return json.dumps(options, sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": RecordKind.PROGRESS.value,
            "batch_ms": self.batch_ms,
            "idle": self.idle,
            "max_event_time_us": self.max_event_time_us,
        }
        if self.lookups:
            d["lookups"] = dict(self.lookups)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


Event = CheckpointBarrier | CancelCheckpointMarker | ChannelProgress


def decode_event(data: str | dict[str, Any]) -> Event:
    """Inverse of ``to_json``/``to_dict``. Raises :class:`ProtocolError` on anything else."""
    try:
        d = json.loads(data) if isinstance(data, str) else dict(data)
        kind = d["kind"]
        if kind == RecordKind.BARRIER.value:
            return CheckpointBarrier(
                checkpoint_id=int(d["checkpoint_id"]),
                timestamp_ms=int(d["timestamp_ms"]),
                snapshot_type=SnapshotType(d.get("type", "checkpoint")),
                unaligned=bool(d.get("unaligned", False)),
                final=bool(d.get("final", False)),
            )
        if kind == RecordKind.CANCEL.value:
            return CancelCheckpointMarker(checkpoint_id=int(d["checkpoint_id"]))
        if kind == RecordKind.PROGRESS.value:
            top = d.get("max_event_time_us")
            return ChannelProgress(
                int(d["batch_ms"]),
                bool(d.get("idle", False)),
                None if top is None else int(top),
                _lookups(d.get("lookups")),
            )
    except ProtocolError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"not a barrier or cancel marker: {data!r} ({e})") from e
    raise ProtocolError(f"not a barrier or cancel marker: {data!r} (kind {kind!r})")


# --- row encoding -------------------------------------------------------------------------

CHANNEL = "_ckpt_channel"
OFFSET = "_ckpt_offset"
KIND = "_ckpt_kind"
CHECKPOINT_ID = "_ckpt_checkpoint_id"
BARRIER_TS = "_ckpt_barrier_ts"
BARRIER_OPTIONS = "_ckpt_barrier_options"

#: The barrier columns every ``ckpt-source`` row carries, after the user's columns.
BARRIER_FIELDS: tuple[pa.Field, ...] = (
    pa.field(CHANNEL, pa.int32(), nullable=False),
    pa.field(OFFSET, pa.int64(), nullable=False),
    pa.field(KIND, pa.int8(), nullable=False),
    pa.field(CHECKPOINT_ID, pa.int64()),
    pa.field(BARRIER_TS, pa.timestamp("us", tz="UTC")),
    pa.field(BARRIER_OPTIONS, pa.string()),
)
BARRIER_COLUMNS: tuple[str, ...] = tuple(f.name for f in BARRIER_FIELDS)

#: Spark DDL of the barrier columns, in the same order. Nullability matters: Spark rejects
#: Arrow batches whose schema differs from the declared one.
BARRIER_DDL = (
    f"{CHANNEL} int not null, {OFFSET} bigint not null, {KIND} tinyint not null, "
    f"{CHECKPOINT_ID} bigint, "
    f"{BARRIER_TS} timestamp, {BARRIER_OPTIONS} string"
)


def _lookups(d: Any) -> tuple[tuple[str, int], ...]:
    """A progress event's lookup table versions (``{path: version}``), sorted by path."""
    if not d:
        return ()
    return tuple(sorted((str(path), int(version)) for path, version in dict(d).items()))


def barrier_row_values(event: Event, channel: int, offset: int) -> dict[str, Any]:
    """The barrier-column values of the row that carries *event* on *channel* at *offset*."""
    if isinstance(event, ChannelProgress):
        return {
            CHANNEL: channel,
            OFFSET: offset,
            KIND: RecordKind.PROGRESS.code,
            CHECKPOINT_ID: 0,
            BARRIER_TS: event.batch_ms * 1000,
            BARRIER_OPTIONS: event.options_json(),
        }
    if isinstance(event, CheckpointBarrier):
        return {
            CHANNEL: channel,
            OFFSET: offset,
            KIND: RecordKind.BARRIER.code,
            CHECKPOINT_ID: event.checkpoint_id,
            BARRIER_TS: event.timestamp_ms * 1000,
            BARRIER_OPTIONS: event.options_json(),
        }
    return {
        CHANNEL: channel,
        OFFSET: offset,
        KIND: RecordKind.CANCEL.code,
        CHECKPOINT_ID: event.checkpoint_id,
        BARRIER_TS: None,
        BARRIER_OPTIONS: None,
    }


def event_from_row(row: dict[str, Any]) -> Event | None:
    """Decode the barrier columns of one row (as from ``Table.to_pylist``); None for data.

    Timestamps may arrive as ``datetime`` or as microseconds since the epoch."""
    kind = RecordKind.from_code(row.get(KIND))
    if kind is RecordKind.DATA:
        return None
    cid = row.get(CHECKPOINT_ID)
    if cid is None:
        raise ProtocolError(f"{kind} row without {CHECKPOINT_ID}: {row!r}")
    if kind is RecordKind.CANCEL:
        return CancelCheckpointMarker(int(cid))
    ts = row.get(BARRIER_TS)
    if ts is None:
        ts_ms = 0
    elif isinstance(ts, int):
        ts_ms = ts // 1000
    else:  # exact integer arithmetic: ts.timestamp() * 1000 can round down by one
        aware = ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)
        ts_ms = (aware - _EPOCH) // _ONE_MS
    try:
        opts = json.loads(row.get(BARRIER_OPTIONS) or "{}")
        if kind is RecordKind.PROGRESS:
            top = opts.get("max")
            return ChannelProgress(
                ts_ms,
                bool(opts.get("idle", False)),
                None if top is None else int(top),
                _lookups(opts.get("lookups")),
            )
        return CheckpointBarrier(
            checkpoint_id=int(cid),
            timestamp_ms=ts_ms,
            snapshot_type=SnapshotType(opts.get("type", "checkpoint")),
            unaligned=bool(opts.get("unaligned", False)),
            final=bool(opts.get("final", False)),
        )
    except (TypeError, ValueError, AttributeError) as e:
        raise ProtocolError(f"bad {BARRIER_OPTIONS}: {row.get(BARRIER_OPTIONS)!r}") from e

"""References to materialized state, as carried in acknowledgements and checkpoint metadata.

A task's snapshot is cut into *blobs*: one Arrow table each, stored as an Arrow IPC stream
with a SHA-256 checksum. A blob belongs to one operator (``operator_uid``) and is one of

* ``KEYED_FULL`` / ``KEYED_DELTA`` — keyed state of one state name of one subtask, covering
  the subtask's key-group range (rows carry their key group, sorted by it, like the
  key-group offsets of Flink's keyed-state files); a full blob holds every key, a delta blob
  the keys changed (or deleted) since the previous blob of the chain. The state is the full
  blob followed by its deltas, in order; a restore at another parallelism reads the rows of
  the key groups it owns from every chain that overlaps them;
* ``OPERATOR`` — operator (non-keyed) state of one subtask;
* ``CHANNEL`` — in-flight records of one input channel of one subtask (unaligned checkpoints).

A completed checkpoint references blobs written by itself and, for incremental snapshots, by
earlier checkpoints (``BlobRef.checkpoint_id`` names the writer). Retention never removes a
blob that a retained checkpoint references.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import pyarrow as pa

from spark_ckpt.errors import CorruptCheckpointError


class BlobKind(StrEnum):
    KEYED_FULL = "keyed_full"
    KEYED_DELTA = "keyed_delta"
    OPERATOR = "operator"
    CHANNEL = "channel"


@dataclass(frozen=True, order=True)
class TaskId:
    """One parallel instance (subtask) of a vertex: a source or an operator, by stable uid."""

    vertex: str
    subtask: int = 0

    def __str__(self) -> str:
        return f"{self.vertex}#{self.subtask}"

    def to_dict(self) -> dict[str, Any]:
        return {"vertex": self.vertex, "subtask": self.subtask}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TaskId:
        return TaskId(str(d["vertex"]), int(d["subtask"]))


@dataclass(frozen=True)
class BlobRef:
    """Where one blob lives and how to verify it. ``key_group_start``/``key_group_end`` (the
    key-group range a keyed blob covers, inclusive) and ``channel`` are -1 where they do not
    apply. ``seq`` orders the blobs of one chain (0 = the full blob)."""

    checkpoint_id: int
    operator_uid: str
    subtask: int
    kind: BlobKind
    state_name: str
    key_group_start: int
    key_group_end: int
    channel: int
    seq: int
    rows: int
    nbytes: int
    checksum: str

    @property
    def key(self) -> tuple[int, str, int, str, str, int, int, int, int]:
        """Identity of the blob within a store."""
        return (
            self.checkpoint_id,
            self.operator_uid,
            self.subtask,
            self.kind.value,
            self.state_name,
            self.key_group_start,
            self.key_group_end,
            self.channel,
            self.seq,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "operator_uid": self.operator_uid,
            "subtask": self.subtask,
            "kind": self.kind.value,
            "state_name": self.state_name,
            "key_group_start": self.key_group_start,
            "key_group_end": self.key_group_end,
            "channel": self.channel,
            "seq": self.seq,
            "rows": self.rows,
            "nbytes": self.nbytes,
            "checksum": self.checksum,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> BlobRef:
        return BlobRef(
            checkpoint_id=int(d["checkpoint_id"]),
            operator_uid=str(d["operator_uid"]),
            subtask=int(d["subtask"]),
            kind=BlobKind(d["kind"]),
            state_name=str(d["state_name"]),
            key_group_start=int(d["key_group_start"]),
            key_group_end=int(d["key_group_end"]),
            channel=int(d["channel"]),
            seq=int(d["seq"]),
            rows=int(d["rows"]),
            nbytes=int(d["nbytes"]),
            checksum=str(d["checksum"]),
        )


@dataclass(frozen=True)
class StateBlob:
    """A blob not yet written: produced by a synchronous snapshot, written by the store in the
    asynchronous phase. ``ref`` is filled in when it is written (checksum, bytes)."""

    operator_uid: str
    subtask: int
    kind: BlobKind
    state_name: str
    table: pa.Table
    key_group_start: int = -1
    key_group_end: int = -1
    channel: int = -1
    seq: int = 0


def encode_table(table: pa.Table) -> bytes:
    """Arrow IPC stream bytes of *table* (schema included)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def decode_table(payload: bytes, ref: BlobRef) -> pa.Table:
    """Verify *payload* against *ref* and decode it. Raises :class:`CorruptCheckpointError`."""
    if len(payload) != ref.nbytes or checksum(payload) != ref.checksum:
        raise CorruptCheckpointError(
            f"blob {ref.kind.value} {ref.operator_uid}#{ref.subtask}/{ref.state_name} key "
            f"groups {ref.key_group_start}-{ref.key_group_end} channel {ref.channel} of "
            f"checkpoint {ref.checkpoint_id} fails its checksum"
        )
    try:
        with pa.ipc.open_stream(payload) as r:
            table = r.read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptCheckpointError(
            f"blob of checkpoint {ref.checkpoint_id} is not Arrow IPC"
        ) from e
    if table.num_rows != ref.rows:
        raise CorruptCheckpointError(
            f"blob of checkpoint {ref.checkpoint_id} has {table.num_rows} rows, expected {ref.rows}"
        )
    return table


def checksum(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def make_ref(checkpoint_id: int, blob: StateBlob, payload: bytes) -> BlobRef:
    return BlobRef(
        checkpoint_id=checkpoint_id,
        operator_uid=blob.operator_uid,
        subtask=blob.subtask,
        kind=blob.kind,
        state_name=blob.state_name,
        key_group_start=blob.key_group_start,
        key_group_end=blob.key_group_end,
        channel=blob.channel,
        seq=blob.seq,
        rows=blob.table.num_rows,
        nbytes=len(payload),
        checksum=checksum(payload),
    )


@dataclass(frozen=True)
class SourceOffset:
    """Channel *channel* of source *source* resumes at *offset* (the offset of the first data
    record not covered by the checkpoint)."""

    source: str
    channel: int
    offset: int

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "channel": self.channel, "offset": self.offset}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SourceOffset:
        return SourceOffset(str(d["source"]), int(d["channel"]), int(d["offset"]))


@dataclass(frozen=True)
class TaskSnapshot:
    """What a task's synchronous snapshot produced: blobs still to write, blobs of earlier
    checkpoints it reuses (incremental), and source positions. Handed to
    :meth:`~spark_ckpt.storage.checkpoint_store.StateStorage.write_task_state` in the asynchronous
    phase."""

    task: TaskId
    new_blobs: tuple[StateBlob, ...] = ()
    reused: tuple[BlobRef, ...] = ()
    offsets: tuple[SourceOffset, ...] = ()


@dataclass(frozen=True)
class TaskStateHandle:
    """What a task acknowledges: references to every blob its state at this checkpoint
    consists of, and its source positions."""

    task: TaskId
    blobs: tuple[BlobRef, ...] = ()
    offsets: tuple[SourceOffset, ...] = ()

    def state_bytes(self) -> int:
        return sum(b.nbytes for b in self.blobs)

    def bytes_written_by(self, checkpoint_id: int) -> int:
        return sum(b.nbytes for b in self.blobs if b.checkpoint_id == checkpoint_id)

    def channel_state_bytes(self) -> int:
        return sum(b.nbytes for b in self.blobs if b.kind is BlobKind.CHANNEL)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task.to_dict(),
            "blobs": [b.to_dict() for b in self.blobs],
            "offsets": [o.to_dict() for o in self.offsets],
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TaskStateHandle:
        return TaskStateHandle(
            task=TaskId.from_dict(d["task"]),
            blobs=tuple(BlobRef.from_dict(b) for b in d.get("blobs", ())),
            offsets=tuple(SourceOffset.from_dict(o) for o in d.get("offsets", ())),
        )


@dataclass(frozen=True)
class CheckpointMetrics:
    """Per-task timings of one checkpoint, reported with the acknowledgement (ms / bytes)."""

    sync_ms: int = 0
    async_ms: int = 0
    alignment_ms: int = 0
    start_delay_ms: int = 0
    state_bytes: int = 0
    channel_state_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> CheckpointMetrics:
        return CheckpointMetrics(**{k: int(v) for k, v in d.items()})


@dataclass(frozen=True)
class ChangeMetrics:
    """What a subtask's snapshot of one checkpoint took in: *keys_changed*, the distinct
    keys of its keyed states written or cleared since its previous snapshot (the keys an
    incremental checkpoint writes), *in_flight_rows*, the rows of its input channels
    stored as channel state (unaligned checkpoints; 0 when aligned), and *bytes_written*,
    the bytes of state it wrote for this checkpoint (the rest it reused from earlier ones:
    Flink's checkpointed size against the full size). The keys are those the state backend of the
    process that took the snapshot recorded as changed: a statistic, as Flink's figures are
    (its state rebuilt on another executor, a subtask may count differently)."""

    keys_changed: int = 0
    in_flight_rows: int = 0
    bytes_written: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ChangeMetrics:
        return ChangeMetrics(
            int(d.get("keys_changed", 0)),
            int(d.get("in_flight_rows", 0)),
            int(d.get("bytes_written", 0)),
        )


@dataclass(frozen=True)
class CacheMetrics:
    """Where a subtask on the executors found its state for the micro-batches since its
    previous checkpoint (this one's included): ``hits`` in its executor — alive in the
    Python worker that ran it, caught up by the changelog's deltas, or (remote roots) in
    the executor's cache — taking ``hit_ms`` in total, and ``rebuilds`` from the
    changelog or the run's restore point, taking ``rebuild_ms``."""

    hits: int = 0
    hit_ms: int = 0
    rebuilds: int = 0
    rebuild_ms: int = 0

    def add(self, *, hit: bool, ms: int) -> CacheMetrics:
        """These metrics and one more micro-batch's lookup."""
        if hit:
            return replace(self, hits=self.hits + 1, hit_ms=self.hit_ms + ms)
        return replace(self, rebuilds=self.rebuilds + 1, rebuild_ms=self.rebuild_ms + ms)

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> CacheMetrics:
        return CacheMetrics(**{k: int(d.get(k, 0)) for k in CacheMetrics.__dataclass_fields__})


@dataclass(frozen=True)
class TimeMetrics:
    """A subtask's time at a checkpoint (a pipeline that keeps time): its watermark and
    processing time as the snapshot saw them (ms since the epoch; None: no watermark yet),
    and since its previous checkpoint: the rows that arrived *late* (event time at or below
    the watermark), those it *dropped* (late beyond the allowed lateness), the timers
    its operators registered and that fired, and the entries of states with a TTL that
    expired."""

    watermark_ms: int | None = None
    processing_ms: int = 0
    late_rows: int = 0
    dropped_rows: int = 0
    timers_registered: int = 0
    timers_fired: int = 0
    ttl_expired: int = 0

    def add(
        self,
        *,
        late: int = 0,
        dropped: int = 0,
        timers_registered: int = 0,
        timers_fired: int = 0,
        ttl_expired: int = 0,
    ) -> TimeMetrics:
        """These metrics with more rows, timers and expired entries counted."""
        return replace(
            self,
            late_rows=self.late_rows + late,
            dropped_rows=self.dropped_rows + dropped,
            timers_registered=self.timers_registered + timers_registered,
            timers_fired=self.timers_fired + timers_fired,
            ttl_expired=self.ttl_expired + ttl_expired,
        )

    def at(self, watermark_ms: int | None, processing_ms: int) -> TimeMetrics:
        """These counts, at *watermark_ms* and *processing_ms*."""
        return replace(self, watermark_ms=watermark_ms, processing_ms=processing_ms)

    def to_dict(self) -> dict[str, int | None]:
        return dict(self.__dict__)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TimeMetrics:
        watermark = d.get("watermark_ms")
        return TimeMetrics(
            None if watermark is None else int(watermark),
            int(d.get("processing_ms", 0)),
            int(d.get("late_rows", 0)),
            int(d.get("dropped_rows", 0)),
            int(d.get("timers_registered", 0)),
            int(d.get("timers_fired", 0)),
            int(d.get("ttl_expired", 0)),
        )


@dataclass(frozen=True)
class StorageMetrics:
    """What a subtask's keyed state holds in its state backend when it snapshots: the
    backend (``hashmap`` | ``rocksdb``), entries, bytes in memory and on local disk
    (estimates), and ``rocksdb``'s block cache hits and misses since the subtask's backend
    opened."""

    backend: str
    entries: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0
    cache_hits: int = 0
    cache_misses: int = 0

    @property
    def cache_hit_rate(self) -> float | None:
        """Hits over lookups of the block cache (None: no lookup, or no cache)."""
        lookups = self.cache_hits + self.cache_misses
        return None if lookups == 0 else self.cache_hits / lookups

    def plus(self, other: StorageMetrics) -> StorageMetrics:
        """The sum of two operators' backends of one subtask."""
        return StorageMetrics(
            self.backend,
            self.entries + other.entries,
            self.memory_bytes + other.memory_bytes,
            self.disk_bytes + other.disk_bytes,
            self.cache_hits + other.cache_hits,
            self.cache_misses + other.cache_misses,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "entries": self.entries,
            "memory_bytes": self.memory_bytes,
            "disk_bytes": self.disk_bytes,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> StorageMetrics:
        return StorageMetrics(
            str(d["backend"]),
            int(d.get("entries", 0)),
            int(d.get("memory_bytes", 0)),
            int(d.get("disk_bytes", 0)),
            int(d.get("cache_hits", 0)),
            int(d.get("cache_misses", 0)),
        )


@dataclass(frozen=True)
class AcknowledgeCheckpoint:
    """Task → coordinator: *task* finished its part of checkpoint *checkpoint_id*.

    ``base_checkpoint_id``: the oldest checkpoint whose blobs the task's incremental
    snapshots may still reuse (its state backends' base when it took this snapshot; bases
    only move forward; 0: no base yet, so it may adopt any completed checkpoint it learns
    of). The coordinator keeps that checkpoint and newer ones, blobs included, beyond the
    retained count until every task reported a newer base (Flink's shared state registry
    plays this role). None: a task without keyed state, which reuses nothing."""

    checkpoint_id: int
    task: TaskId
    state: TaskStateHandle
    metrics: CheckpointMetrics = field(default_factory=CheckpointMetrics)
    base_checkpoint_id: int | None = None
    #: subtasks on the executors: where they found their state (None: in the driver)
    cache: CacheMetrics | None = None
    #: a task with a sink: the rows of the sealed-transactions blob it wrote into *state*
    #: (one sink transaction's JSON each), so that the sink's committer need not read the
    #: blob back; trusted only where they match the blob's checksum (see
    #: :mod:`spark_ckpt.runtime.carried_transactions`). None: a task without a sink, or an
    #: older version.
    sealed: tuple[str, ...] | None = None
    #: a pipeline that keeps event time: the subtask's watermark and late rows (None: none)
    time: TimeMetrics | None = None
    #: keys changed, rows in flight, bytes written (None: an older version)
    changes: ChangeMetrics | None = None
    #: a task with keyed state: what its state backend holds (None: none, or an older
    #: version)
    storage: StorageMetrics | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "type": "ack",
            "checkpoint_id": self.checkpoint_id,
            "task": self.task.to_dict(),
            "state": self.state.to_dict(),
            "metrics": self.metrics.to_dict(),
            "base_checkpoint_id": self.base_checkpoint_id,
        }
        if self.cache is not None:
            d["cache"] = self.cache.to_dict()
        if self.sealed is not None:
            d["sealed"] = list(self.sealed)
        if self.time is not None:
            d["time"] = self.time.to_dict()
        if self.changes is not None:
            d["changes"] = self.changes.to_dict()
        if self.storage is not None:
            d["storage"] = self.storage.to_dict()
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> AcknowledgeCheckpoint:
        base = d.get("base_checkpoint_id")
        cache = d.get("cache")
        return AcknowledgeCheckpoint(
            checkpoint_id=int(d["checkpoint_id"]),
            task=TaskId.from_dict(d["task"]),
            state=TaskStateHandle.from_dict(d["state"]),
            metrics=CheckpointMetrics.from_dict(d.get("metrics", {})),
            base_checkpoint_id=None if base is None else int(base),
            cache=None if cache is None else CacheMetrics.from_dict(cache),
            sealed=None if d.get("sealed") is None else tuple(str(t) for t in d["sealed"]),
            time=None if d.get("time") is None else TimeMetrics.from_dict(d["time"]),
            changes=None if d.get("changes") is None else ChangeMetrics.from_dict(d["changes"]),
            storage=None if d.get("storage") is None else StorageMetrics.from_dict(d["storage"]),
        )


@dataclass(frozen=True)
class DeclineCheckpoint:
    """Task → coordinator: *task* cannot take checkpoint *checkpoint_id*, for *reason*.
    ``code`` classifies it (a :class:`~spark_ckpt.runtime.failure.CheckpointFailureReason` value):
    ``declined`` (a failure: counted) or ``subsumed``/``cancelled`` (the task's aligner gave
    the checkpoint up for a newer one or on a cancel marker: not a failure)."""

    checkpoint_id: int
    task: TaskId
    reason: str
    code: str = "declined"

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "decline",
            "checkpoint_id": self.checkpoint_id,
            "task": self.task.to_dict(),
            "reason": self.reason,
            "code": self.code,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> DeclineCheckpoint:
        return DeclineCheckpoint(
            int(d["checkpoint_id"]),
            TaskId.from_dict(d["task"]),
            str(d["reason"]),
            str(d.get("code", "declined")),
        )

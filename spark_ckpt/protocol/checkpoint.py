"""Completed checkpoints: the metadata a checkpoint store commits and restore reads.

Pending checkpoints (still collecting acknowledgements) live in the coordinator
(:mod:`spark_ckpt.runtime.coordinator`); a :class:`CompletedCheckpoint` is immutable and has an
explicit, canonical JSON encoding, which is what the store persists and checksums.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_ckpt.errors import CorruptCheckpointError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.state_handles import (
    BlobRef,
    CacheMetrics,
    ChangeMetrics,
    CheckpointMetrics,
    SourceOffset,
    StorageMetrics,
    TaskId,
    TaskStateHandle,
    TimeMetrics,
)

#: Operator uid prefix of a task's own state (channel state, sink transactions), kept apart
#: from the uids of its operators: ``_task:<vertex>``. A pipeline has one task vertex, so a
#: checkpoint holds the task state of one vertex; readers find it with
#: :meth:`CompletedCheckpoint.task_blobs` whatever the vertex was named when it was written
#: (older versions named it after the first operator of the chain).
TASK_STATE_PREFIX = "_task:"


def task_state_uid(vertex: str) -> str:
    """The operator uid under which the tasks of *vertex* store their own state."""
    return TASK_STATE_PREFIX + vertex


def is_task_state_uid(uid: str) -> bool:
    """Whether *uid* names a task's own state rather than an operator's."""
    return uid.startswith(TASK_STATE_PREFIX)


@dataclass(frozen=True)
class CheckpointStats:
    """Statistics of one completed checkpoint (ms / bytes)."""

    trigger_ms: int
    completed_ms: int
    state_bytes: int = 0
    bytes_written: int = 0
    channel_state_bytes: int = 0
    task_metrics: Mapping[str, CheckpointMetrics] = field(default_factory=dict)
    #: subtasks on the executors: where each found its state since its previous checkpoint
    task_cache: Mapping[str, CacheMetrics] = field(default_factory=dict)
    #: a pipeline that keeps time: each subtask's watermark, late rows and timers
    task_time: Mapping[str, TimeMetrics] = field(default_factory=dict)
    #: each subtask's keys changed, rows in flight and bytes written (empty: written by an
    #: older version)
    task_changes: Mapping[str, ChangeMetrics] = field(default_factory=dict)
    #: each subtask's state backend and what it holds (empty: no keyed state, or an older
    #: version)
    task_storage: Mapping[str, StorageMetrics] = field(default_factory=dict)

    @property
    def keys_changed(self) -> int:
        return sum(m.keys_changed for m in self.task_changes.values())

    @property
    def in_flight_rows(self) -> int:
        return sum(m.in_flight_rows for m in self.task_changes.values())

    @property
    def watermark_ms(self) -> int | None:
        """The pipeline's watermark at the checkpoint: the lowest of its subtasks' (None:
        no event time, or no watermark yet)."""
        marks = [m.watermark_ms for m in self.task_time.values()]
        if not marks or any(m is None for m in marks):
            return None
        return min(m for m in marks if m is not None)

    @property
    def late_rows(self) -> int:
        return sum(m.late_rows for m in self.task_time.values())

    @property
    def dropped_rows(self) -> int:
        return sum(m.dropped_rows for m in self.task_time.values())

    @property
    def timers_registered(self) -> int:
        return sum(m.timers_registered for m in self.task_time.values())

    @property
    def timers_fired(self) -> int:
        return sum(m.timers_fired for m in self.task_time.values())

    @property
    def ttl_expired(self) -> int:
        return sum(m.ttl_expired for m in self.task_time.values())

    @property
    def end_to_end_ms(self) -> int:
        return self.completed_ms - self.trigger_ms

    @property
    def max_alignment_ms(self) -> int:
        return max((m.alignment_ms for m in self.task_metrics.values()), default=0)

    @property
    def max_start_delay_ms(self) -> int:
        return max((m.start_delay_ms for m in self.task_metrics.values()), default=0)

    def to_dict(self) -> dict[str, Any]:
        return (
            {
                "trigger_ms": self.trigger_ms,
                "completed_ms": self.completed_ms,
                "state_bytes": self.state_bytes,
                "bytes_written": self.bytes_written,
                "channel_state_bytes": self.channel_state_bytes,
                "task_metrics": {k: v.to_dict() for k, v in sorted(self.task_metrics.items())},
            }
            | (  # only when there is any: the metadata of driver-side runs stays as it was
                {"task_cache": {k: v.to_dict() for k, v in sorted(self.task_cache.items())}}
                if self.task_cache
                else {}
            )
            | (
                {"task_time": {k: v.to_dict() for k, v in sorted(self.task_time.items())}}
                if self.task_time
                else {}
            )
            | (
                {"task_changes": {k: v.to_dict() for k, v in sorted(self.task_changes.items())}}
                if self.task_changes
                else {}
            )
            | (
                {"task_storage": {k: v.to_dict() for k, v in sorted(self.task_storage.items())}}
                if self.task_storage
                else {}
            )
        )

    @staticmethod
    def from_dict(d: dict[str, Any]) -> CheckpointStats:
        return CheckpointStats(
            trigger_ms=int(d["trigger_ms"]),
            completed_ms=int(d["completed_ms"]),
            state_bytes=int(d.get("state_bytes", 0)),
            bytes_written=int(d.get("bytes_written", 0)),
            channel_state_bytes=int(d.get("channel_state_bytes", 0)),
            task_metrics={
                k: CheckpointMetrics.from_dict(v) for k, v in d.get("task_metrics", {}).items()
            },
            task_cache={k: CacheMetrics.from_dict(v) for k, v in d.get("task_cache", {}).items()},
            task_time={k: TimeMetrics.from_dict(v) for k, v in d.get("task_time", {}).items()},
            task_changes={
                k: ChangeMetrics.from_dict(v) for k, v in d.get("task_changes", {}).items()
            },
            task_storage={
                k: StorageMetrics.from_dict(v) for k, v in d.get("task_storage", {}).items()
            },
        )


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint every task acknowledged. ``tasks`` is sorted by task id."""

    checkpoint_id: int
    snapshot_type: SnapshotType
    tasks: tuple[TaskStateHandle, ...]
    stats: CheckpointStats
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_savepoint(self) -> bool:
        return self.snapshot_type is SnapshotType.SAVEPOINT

    def blobs(self) -> Iterator[BlobRef]:
        for t in self.tasks:
            yield from t.blobs

    def offsets(self) -> dict[tuple[str, int], int]:
        """(source, channel) -> offset of the first data record after the barrier."""
        out: dict[tuple[str, int], int] = {}
        for t in self.tasks:
            for o in t.offsets:
                out[(o.source, o.channel)] = o.offset
        return out

    def source_offsets(self) -> list[SourceOffset]:
        return [SourceOffset(s, c, o) for (s, c), o in sorted(self.offsets().items())]

    def handle(self, task: TaskId) -> TaskStateHandle | None:
        for t in self.tasks:
            if t.task == task:
                return t
        return None

    def operator_blobs(self, operator_uid: str) -> list[BlobRef]:
        return [b for b in self.blobs() if b.operator_uid == operator_uid]

    def task_blobs(self) -> list[BlobRef]:
        """The blobs of the tasks' own state (channel state, sink transactions), under
        whichever vertex name they were written."""
        return [b for b in self.blobs() if is_task_state_uid(b.operator_uid)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "type": self.snapshot_type.value,
            "tasks": [t.to_dict() for t in self.tasks],
            "stats": self.stats.to_dict(),
            "properties": dict(sorted(self.properties.items())),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def checksum(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @staticmethod
    def from_json(text: str, expected_checksum: str | None = None) -> CompletedCheckpoint:
        """Decode metadata; with *expected_checksum*, verify it first."""
        if expected_checksum is not None:
            actual = hashlib.sha256(text.encode()).hexdigest()
            if actual != expected_checksum:
                raise CorruptCheckpointError("checkpoint metadata fails its checksum")
        try:
            d = json.loads(text)
            return CompletedCheckpoint(
                checkpoint_id=int(d["checkpoint_id"]),
                snapshot_type=SnapshotType(d["type"]),
                tasks=tuple(TaskStateHandle.from_dict(t) for t in d["tasks"]),
                stats=CheckpointStats.from_dict(d["stats"]),
                properties={str(k): str(v) for k, v in d.get("properties", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptCheckpointError(f"checkpoint metadata is malformed: {e}") from e


@dataclass(frozen=True)
class FailedCheckpoint:
    """A checkpoint (or savepoint) that was triggered and then aborted: declined by a task, expired,
    subsumed, or cancelled by a failure or shutdown. Recorded durably next to the completed ones
    (:meth:`~spark_ckpt.storage.checkpoint_store.CheckpointLog.record_failure`), with the figures of
    the tasks that had acknowledged before the abort. ``reason`` is a
    :class:`~spark_ckpt.runtime.failure.CheckpointFailureReason` value; ``properties``: the
    checkpoint's properties as triggered (a client's request id among them: how a client learns that
    its request failed)."""

    checkpoint_id: int
    snapshot_type: SnapshotType
    trigger_ms: int
    failed_ms: int
    reason: str
    message: str = ""
    task_metrics: Mapping[str, CheckpointMetrics] = field(default_factory=dict)
    properties: Mapping[str, str] = field(default_factory=dict)
    #: how many subtasks were to acknowledge it (0: not recorded, an older version)
    subtasks: int = 0

    @property
    def duration_ms(self) -> int:
        return self.failed_ms - self.trigger_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "type": self.snapshot_type.value,
            "trigger_ms": self.trigger_ms,
            "failed_ms": self.failed_ms,
            "duration_ms": self.duration_ms,
            "reason": self.reason,
            "message": self.message,
            "task_metrics": {k: v.to_dict() for k, v in sorted(self.task_metrics.items())},
            **({"properties": dict(sorted(self.properties.items()))} if self.properties else {}),
            **({"subtasks": self.subtasks} if self.subtasks else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> FailedCheckpoint:
        try:
            d = json.loads(text)
            return FailedCheckpoint(
                checkpoint_id=int(d["checkpoint_id"]),
                snapshot_type=SnapshotType(d["type"]),
                trigger_ms=int(d["trigger_ms"]),
                failed_ms=int(d["failed_ms"]),
                reason=str(d["reason"]),
                message=str(d.get("message", "")),
                task_metrics={
                    str(k): CheckpointMetrics.from_dict(v)
                    for k, v in d.get("task_metrics", {}).items()
                },
                properties={str(k): str(v) for k, v in d.get("properties", {}).items()},
                subtasks=int(d.get("subtasks", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptCheckpointError(f"failed-checkpoint record is malformed: {e}") from e

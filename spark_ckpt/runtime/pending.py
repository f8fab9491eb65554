"""A checkpoint in flight: triggered, collecting acknowledgements from its tasks.

Lifecycle: ``PENDING`` → (all tasks acknowledged) → ``COMPLETED`` (the coordinator then
finalizes it into a :class:`~spark_ckpt.protocol.checkpoint.CompletedCheckpoint`) or ``PENDING`` →
``ABORTED`` (declined, expired, subsumed, cancelled). A disposed pending checkpoint accepts no
more acknowledgements (:attr:`AckResult.DISCARDED`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from spark_ckpt.errors import CheckpointError
from spark_ckpt.protocol.barrier import CheckpointBarrier, SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import (
    AcknowledgeCheckpoint,
    CheckpointMetrics,
    TaskId,
    TaskStateHandle,
)
from spark_ckpt.runtime.failure import CheckpointFailure


class AckResult(StrEnum):
    """Outcome of one acknowledgement (Flink's ``TaskAcknowledgeResult``)."""

    SUCCESS = "success"
    DUPLICATE = "duplicate"  # this task already acknowledged
    UNKNOWN = "unknown"  # the task is not part of the checkpoint, or the id is unknown
    DISCARDED = "discarded"  # the checkpoint was already completed or aborted


class PendingStatus(StrEnum):
    PENDING = "pending"
    COMPLETED = "completed"
    ABORTED = "aborted"


@dataclass
class PendingCheckpoint:
    """Mutable; owned by the coordinator, never shared across processes."""

    barrier: CheckpointBarrier
    tasks_to_ack: frozenset[TaskId]
    deadline_ms: int
    properties: Mapping[str, str] = field(default_factory=dict)
    status: PendingStatus = PendingStatus.PENDING
    acks: dict[TaskId, AcknowledgeCheckpoint] = field(default_factory=dict)
    failure: CheckpointFailure | None = None

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id

    @property
    def trigger_ms(self) -> int:
        return self.barrier.timestamp_ms

    @property
    def snapshot_type(self) -> SnapshotType:
        return self.barrier.snapshot_type

    @property
    def not_yet_acknowledged(self) -> frozenset[TaskId]:
        return self.tasks_to_ack - self.acks.keys()

    @property
    def fully_acknowledged(self) -> bool:
        return self.status is PendingStatus.PENDING and not self.not_yet_acknowledged

    def acknowledge(self, ack: AcknowledgeCheckpoint) -> AckResult:
        if self.status is not PendingStatus.PENDING:
            return AckResult.DISCARDED
        if ack.task not in self.tasks_to_ack:
            return AckResult.UNKNOWN
        if ack.task in self.acks:
            return AckResult.DUPLICATE
        self.acks[ack.task] = ack
        return AckResult.SUCCESS

    def abort(self, failure: CheckpointFailure) -> None:
        if self.status is PendingStatus.PENDING:
            self.status = PendingStatus.ABORTED
            self.failure = failure

    def mark_completed(self) -> None:
        self.status = PendingStatus.COMPLETED

    def finalize(self, completed_ms: int) -> CompletedCheckpoint:
        """The completed form of a fully acknowledged checkpoint (no I/O, no state change:
        the coordinator calls :meth:`mark_completed` once the completion commit landed)."""
        if not self.fully_acknowledged:
            raise CheckpointError(
                f"checkpoint {self.checkpoint_id} is not fully acknowledged: "
                f"waiting for {sorted(map(str, self.not_yet_acknowledged))}"
            )
        handles: list[TaskStateHandle] = [self.acks[t].state for t in sorted(self.acks)]
        metrics: dict[str, CheckpointMetrics] = {str(t): self.acks[t].metrics for t in self.acks}
        cid = self.checkpoint_id
        stats = CheckpointStats(
            trigger_ms=self.trigger_ms,
            completed_ms=completed_ms,
            state_bytes=sum(h.state_bytes() for h in handles),
            bytes_written=sum(h.bytes_written_by(cid) for h in handles),
            channel_state_bytes=sum(h.channel_state_bytes() for h in handles),
            task_metrics=metrics,
            task_cache={
                str(t): a.cache for t, a in sorted(self.acks.items()) if a.cache is not None
            },
            task_time={str(t): a.time for t, a in sorted(self.acks.items()) if a.time is not None},
            task_changes={
                str(t): a.changes for t, a in sorted(self.acks.items()) if a.changes is not None
            },
            task_storage={
                str(t): a.storage for t, a in sorted(self.acks.items()) if a.storage is not None
            },
        )
        return CompletedCheckpoint(
            checkpoint_id=cid,
            snapshot_type=self.snapshot_type,
            tasks=tuple(handles),
            stats=stats,
            properties=dict(self.properties),
        )

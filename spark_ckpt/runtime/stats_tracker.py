"""Checkpoint statistics, handed to the
:class:`~spark_ckpt.runtime.coordinator.CheckpointCoordinator` (Flink's
``CheckpointStatsTracker``): the counts, the in-memory history of finished checkpoints for
progress reports, and the failure records in the store's durable statistics history.

Recording a failure never fails the job: a store error is logged as a WARNING (a fenced
coordinator records nothing: the store refuses its writes, and its successor records its
own failures).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from spark_ckpt.errors import FencedError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint, FailedCheckpoint
from spark_ckpt.runtime.failure import CheckpointFailure
from spark_ckpt.runtime.pending import PendingCheckpoint
from spark_ckpt.storage.checkpoint_store import CheckpointLog
from spark_ckpt.storage.lease import CoordinatorLease

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HistoryEntry:
    """One finished checkpoint, for statistics and progress reporting."""

    checkpoint_id: int
    snapshot_type: SnapshotType
    trigger_ms: int
    end_ms: int
    completed: CompletedCheckpoint | None = None
    failure: CheckpointFailure | None = None

    @property
    def duration_ms(self) -> int:
        return self.end_ms - self.trigger_ms


class CheckpointStatsTracker:
    """The statistics of one coordinator: counts, the newest *history_size* finished
    checkpoints in memory, and failure records in *store* (see the module docstring)."""

    def __init__(self, store: CheckpointLog, history_size: int) -> None:
        self._store = store
        self._history_size = history_size
        self.history: deque[HistoryEntry] = deque(maxlen=history_size)
        self.num_triggered = 0
        self.num_completed = 0
        self.num_failed = 0

    def triggered(self) -> None:
        self.num_triggered += 1

    def completed(
        self, pending: PendingCheckpoint, checkpoint: CompletedCheckpoint, now: int
    ) -> None:
        self.num_completed += 1
        self.history.append(
            HistoryEntry(
                checkpoint.checkpoint_id,
                checkpoint.snapshot_type,
                pending.trigger_ms,
                now,
                completed=checkpoint,
            )
        )

    def failed(
        self,
        pending: PendingCheckpoint,
        failure: CheckpointFailure,
        now: int,
        lease: CoordinatorLease,
    ) -> None:
        """*pending* was aborted with *failure* at *now*: count it, keep it in the history
        and record it in the store next to the completed checkpoints, with the figures of
        the tasks that acknowledged."""
        self.num_failed += 1
        self.history.append(
            HistoryEntry(
                pending.checkpoint_id,
                pending.snapshot_type,
                pending.trigger_ms,
                now,
                failure=failure,
            )
        )
        record = FailedCheckpoint(
            checkpoint_id=pending.checkpoint_id,
            snapshot_type=pending.snapshot_type,
            trigger_ms=pending.trigger_ms,
            failed_ms=now,
            reason=failure.reason.value,
            message=failure.message,
            task_metrics={str(t): a.metrics for t, a in sorted(pending.acks.items())},
            properties=dict(pending.properties),
            subtasks=len(pending.tasks_to_ack),
        )
        try:
            self._store.record_failure(lease, record, history_size=self._history_size)
        except FencedError:
            log.debug("checkpoint %d: failure not recorded (fenced)", pending.checkpoint_id)
        except Exception as e:  # statistics must never fail the job
            log.warning(
                "checkpoint %d: failure (%s) not recorded: %s",
                pending.checkpoint_id,
                failure.reason.value,
                e,
            )

    def completed_history(self) -> Iterable[HistoryEntry]:
        return (h for h in self.history if h.completed is not None)

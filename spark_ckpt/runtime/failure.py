"""Why checkpoints fail, and the tolerable-failure rule.

Mirrors Flink's ``CheckpointFailureReason`` / ``CheckpointFailureManager``: some reasons are
part of normal operation (a checkpoint subsumed by a newer one, the coordinator shutting down)
and never count; the others count as *consecutive* failures, reset by every completed
checkpoint. When the count exceeds ``tolerable_failed_checkpoints`` the job must fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from spark_ckpt.errors import TolerableFailuresExceededError


class CheckpointFailureReason(StrEnum):
    EXPIRED = "expired"  # not acknowledged within the checkpoint timeout
    DECLINED = "declined"  # a task declined (snapshot or async write failed)
    FINALIZE_FAILED = "finalize_failed"  # the completion commit failed
    TASK_FAILURE = "task_failure"  # a task failed while the checkpoint was pending
    SUBSUMED = "subsumed"  # a newer checkpoint completed first
    CANCELLED = "cancelled"  # a cancel marker or an explicit abort
    COORDINATOR_SHUTDOWN = "coordinator_shutdown"
    FENCED = "fenced"  # another coordinator took over

    @property
    def counts_as_failure(self) -> bool:
        return self in _COUNTED


_COUNTED = frozenset(
    {
        CheckpointFailureReason.EXPIRED,
        CheckpointFailureReason.DECLINED,
        CheckpointFailureReason.FINALIZE_FAILED,
        CheckpointFailureReason.TASK_FAILURE,
    }
)


@dataclass(frozen=True)
class CheckpointFailure:
    checkpoint_id: int
    reason: CheckpointFailureReason
    message: str = ""

    def __str__(self) -> str:
        text = f"checkpoint {self.checkpoint_id} failed: {self.reason.value}"
        return f"{text} ({self.message})" if self.message else text


class FailureCounter:
    """Counts consecutive counted failures; raises when more than *tolerable* happened."""

    def __init__(self, tolerable: int) -> None:
        self.tolerable = tolerable
        self.consecutive = 0

    def on_failure(self, failure: CheckpointFailure) -> None:
        """Record *failure*. Raises :class:`TolerableFailuresExceededError` when the number of
        consecutive counted failures exceeds the tolerable number."""
        if not failure.reason.counts_as_failure:
            return
        self.consecutive += 1
        if self.consecutive > self.tolerable:
            raise TolerableFailuresExceededError(
                f"exceeded checkpoint tolerable failure threshold ({self.tolerable}): "
                f"{self.consecutive} consecutive failures, last: {failure}"
            )

    def on_success(self) -> None:
        self.consecutive = 0

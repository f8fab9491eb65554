"""Why checkpoints fail, and the tolerable-failure rule.

After Flink's ``CheckpointFailureReason`` / ``CheckpointFailureManager``: some reasons are
part of normal operation (a checkpoint subsumed by a newer one, cancelled, the coordinator
shutting down, fenced) and never count; the others count as *consecutive* failures, reset by
every completed checkpoint or savepoint. When the count exceeds
``tolerable_failed_checkpoints`` the job must fail. Only checkpoints count; the coordinator
never counts a failed savepoint.

Where this differs from Flink's ``CheckpointFailureManager``:

* **Counted reasons.** Flink counts ``CHECKPOINT_DECLINED``, ``CHECKPOINT_EXPIRED``,
  ``IO_EXCEPTION`` and ``CHECKPOINT_ASYNC_EXCEPTION`` and ignores ``TASK_FAILURE`` and
  ``FINALIZE_CHECKPOINT_FAILURE`` (the job fails over anyway, resp. the failure is the
  JobManager's). Here :attr:`~CheckpointFailureReason.EXPIRED`,
  :attr:`~CheckpointFailureReason.DECLINED` (which covers a task's I/O and asynchronous
  failures), :attr:`~CheckpointFailureReason.FINALIZE_FAILED` (the store refused the
  completion commit: as much a storage failure as a declined write) and
  :attr:`~CheckpointFailureReason.TASK_FAILURE` count.
* **Savepoints.** Flink counts a task's decline of a savepoint (and fails the job at once
  when a task declines a stop-with-savepoint); here savepoint failures never count.
* **Order.** Flink ignores a failure of a checkpoint older than the last completed one and
  counts each checkpoint id once; here every counted abort of a checkpoint counts, in the
  order it happens (the coordinator aborts each pending checkpoint once).
* **Fewer reasons.** Flink's pre-flight reasons (``TOO_MANY_CHECKPOINT_REQUESTS``,
  ``MINIMUM_TIME_BETWEEN_CHECKPOINTS``, ``NOT_ALL_REQUIRED_TASKS_RUNNING``, …) do not exist:
  a request that may not trigger yet waits in the coordinator's queue instead of failing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from spark_ckpt.errors import TolerableFailuresExceededError
from spark_ckpt.protocol.checkpoint import FailedCheckpoint


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


def is_aborted(failure: FailedCheckpoint) -> bool:
    """Whether *failure* was an abort (its reason does not count as a failure: subsumed,
    cancelled, coordinator shutdown, fenced) rather than a failure; an unknown reason is a
    failure."""
    try:
        return not CheckpointFailureReason(failure.reason).counts_as_failure
    except ValueError:
        return False

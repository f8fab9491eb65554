"""Which checkpoint request triggers next, and when: Flink's ``CheckpointRequestDecider``,
handed to the :class:`~spark_ckpt.runtime.coordinator.CheckpointCoordinator`.

The decider owns the queue of manual requests, the periodic schedule and the limits (max
concurrent, min pause). The coordinator asks it what to trigger now
(:meth:`CheckpointRequestDecider.choose`) and tells it when a checkpoint completed; the
rules are listed in ``docs/architecture.md`` (*The coordinator's rules*). The queue's order
is one comparator, :func:`request_order`.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.failure import CheckpointFailure


class RequestStatus(StrEnum):
    QUEUED = "queued"
    TRIGGERED = "triggered"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass
class CheckpointRequest:
    """A manual checkpoint or savepoint request; its fields fill in as it progresses."""

    snapshot_type: SnapshotType
    forced: bool
    properties: dict[str, str] = field(default_factory=dict)
    final: bool = False
    status: RequestStatus = RequestStatus.QUEUED
    checkpoint_id: int | None = None
    completed: CompletedCheckpoint | None = None
    failure: CheckpointFailure | None = None
    #: arrival order among the decider's requests (set when queued)
    seq: int = 0


def request_order(req: CheckpointRequest) -> tuple[int, int]:
    """The queue's comparator: savepoints and other forced requests first, then final (stop)
    checkpoints, then manual checkpoints; by arrival within each. A forced request goes
    ahead of a waiting final checkpoint, as Flink's comparator puts savepoints and forced
    requests first: otherwise a savepoint would wait behind a stop checkpoint that waits for
    the limits."""
    if req.snapshot_type is SnapshotType.SAVEPOINT or req.forced:
        return 0, req.seq
    return (1 if req.final else 2), req.seq


#: What :meth:`CheckpointRequestDecider.choose` returns for a due periodic checkpoint.
PERIODIC: Final = "periodic"


def next_on_schedule(due: int, now: int, interval: int) -> int:
    """The periodic schedule's next point after *now*, the schedule being *due* plus whole
    intervals: Flink triggers periodic checkpoints at a fixed rate, so one that fires late
    (the limits held it back, or the source placed its barriers at its next micro-batch) does
    not shift the ones after it; points missed meanwhile are skipped, not caught up."""
    return due + interval * ((now - due) // interval + 1)


class CheckpointRequestDecider:
    """The queue, the periodic schedule and the limits of *config* (see the module
    docstring). Not thread-safe: the coordinator's loop drives it."""

    def __init__(self, config: CheckpointConfig) -> None:
        self._config = config
        self._queue: list[CheckpointRequest] = []
        self._arrivals = itertools.count()
        self._next_periodic_ms: int | None = None
        self._last_completion_ms: int | None = None

    # -- the periodic schedule ---------------------------------------------------------------
    @property
    def next_periodic_ms(self) -> int | None:
        return self._next_periodic_ms

    def start_periodic(self, now: int) -> None:
        """Periodic checkpoints (if an interval is configured), the first one an interval
        from *now*."""
        if self._config.interval_ms is not None:
            self._next_periodic_ms = now + self._config.interval_ms

    def stop_periodic(self) -> None:
        self._next_periodic_ms = None

    # -- the queue ---------------------------------------------------------------------------
    def enqueue(self, req: CheckpointRequest) -> None:
        """Queue *req* behind the requests of its rank and ahead of lower ones."""
        req.seq = next(self._arrivals)
        bisect.insort(self._queue, req, key=request_order)

    def drain(self) -> list[CheckpointRequest]:
        """Remove and return every queued request (the coordinator shuts down)."""
        out, self._queue = self._queue, []
        return out

    # -- deciding ----------------------------------------------------------------------------
    def completed(self, now: int) -> None:
        """A checkpoint completed at *now*: min pause counts from here."""
        self._last_completion_ms = now

    def choose(self, now: int, pending: int) -> CheckpointRequest | str | None:
        """What triggers now with *pending* checkpoints pending: the head of the queue (taken
        out) if it is forced or the limits allow; else :data:`PERIODIC` if a periodic
        checkpoint is due, nothing is queued and the limits allow (the next one is then due
        at the schedule's next point after *now*, :func:`next_on_schedule`, or an interval
        from *now* when min pause held this one back, as Flink reschedules its trigger after
        a checkpoint that came too early); else None."""
        if self._queue and self._may_trigger(now, pending, self._queue[0].forced):
            return self._queue.pop(0)
        due = self._next_periodic_ms
        if (
            due is not None
            and now >= due
            and not self._queue
            and self._may_trigger(now, pending, False)
        ):
            interval = self._config.interval_ms
            assert interval is not None
            if self._pause_ends_ms() > due:  # min pause moved it: the schedule restarts
                self._next_periodic_ms = now + interval
            else:
                self._next_periodic_ms = next_on_schedule(due, now, interval)
            return PERIODIC
        return None

    def next_trigger_ms(self, pending: int) -> int | None:
        """The earliest time at which :meth:`choose` may return something, as things stand
        (see :meth:`CheckpointCoordinator.next_trigger_ms
        <spark_ckpt.runtime.coordinator.CheckpointCoordinator.next_trigger_ms>`)."""
        if self._queue and self._queue[0].forced:
            return 0
        if self._held_back(pending):
            return None
        due = 0 if self._queue else self._next_periodic_ms
        return None if due is None else max(due, self._pause_ends_ms())

    def _may_trigger(self, now: int, pending: int, forced: bool) -> bool:
        return forced or (not self._held_back(pending) and now >= self._pause_ends_ms())

    def _held_back(self, pending: int) -> bool:
        """Max concurrent, or min pause (which counts from a completion), hold back every
        trigger that is not forced until a pending checkpoint ends."""
        return pending >= self._config.max_concurrent or (
            self._config.min_pause_ms > 0 and pending > 0
        )

    def _pause_ends_ms(self) -> int:
        """When min pause after the last completion ends (0: no pause)."""
        if self._config.min_pause_ms <= 0 or self._last_completion_ms is None:
            return 0
        return self._last_completion_ms + self._config.min_pause_ms

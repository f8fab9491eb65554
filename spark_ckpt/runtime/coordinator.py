"""The checkpoint coordinator: triggers checkpoints, collects acknowledgements, completes or
aborts them, and commits completed ones into the checkpoint store.

It runs on the driver side (in Spark, in the source runner's coordinator host,
:mod:`spark_ckpt.coordination.host`), single-threaded: every entry point (:meth:`tick`,
:meth:`trigger_checkpoint`, :meth:`trigger_savepoint`, :meth:`receive_acknowledge`,
:meth:`receive_decline`, :meth:`shutdown`) is called by one loop, and time comes from an
injected :class:`~spark_ckpt.protocol.clock.Clock` — nothing here sleeps or starts threads.
Tasks are reached through a :class:`TaskGateway` (in-process in the simulation; through the
checkpoint store in Spark).

Trigger rules are Flink's ``CheckpointRequestDecider``: a fixed-rate periodic schedule, min
pause, max concurrent, manual checkpoints queued until the limits allow, forced savepoints;
queued requests go by priority (savepoints, final checkpoints, manual checkpoints, a due
periodic trigger), then by arrival. Nothing triggers after :meth:`shutdown`
(:class:`CoordinatorShutdownError`). The rules in full, and the complete list of where they
differ from Flink's on purpose: ``docs/architecture.md``, *The coordinator's rules*.

Completion: all tasks acknowledged → finalize → commit into the store (fenced; one commit
per checkpoint) → drop subsumed pending checkpoints → retention → notify-complete to every
task. Failures (decline, timeout, failed commit) abort the checkpoint, notify every task, are
recorded in the store's statistics history (a store error there is logged as a WARNING, it
never fails the job), and count towards ``tolerable_failed_checkpoints`` (checkpoints only,
never savepoints; every completion resets the count); exceeding it raises
:class:`TolerableFailuresExceededError`. A completion or an abort frees a slot: what waited
for it triggers then (with ``defer_after_completion``, at the next :meth:`tick`). Checkpoint
ids come from store leases: strictly increasing, never reused, across restarts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Protocol, TypeVar

from spark_ckpt.errors import (
    CheckpointError,
    CoordinatorShutdownError,
    FencedError,
    StoreError,
    TolerableFailuresExceededError,
)
from spark_ckpt.protocol.barrier import CheckpointBarrier, SnapshotType
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import Clock, SystemClock
from spark_ckpt.protocol.state_handles import AcknowledgeCheckpoint, DeclineCheckpoint, TaskId
from spark_ckpt.runtime.checkpoint_cleaner import (
    DEFAULT_GARBAGE_EVERY,
    DEFAULT_RETAIN_EVERY_MS,
    RETENTION_RETRY_MS,
    CheckpointCleaner,
    JobStatus,
    discards_checkpoints,
)
from spark_ckpt.runtime.config import (
    CheckpointConfig,
    CheckpointingMode,
)
from spark_ckpt.runtime.failure import CheckpointFailure, CheckpointFailureReason, FailureCounter
from spark_ckpt.runtime.pending import AckResult, PendingCheckpoint
from spark_ckpt.runtime.request_decider import (
    CheckpointRequest,
    CheckpointRequestDecider,
    RequestStatus,
)
from spark_ckpt.runtime.stats_tracker import CheckpointStatsTracker, HistoryEntry
from spark_ckpt.storage.checkpoint_store import CheckpointLog
from spark_ckpt.storage.lease import CoordinatorLease

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class TaskGateway(Protocol):
    """How the coordinator reaches tasks. Implementations must not call back into the
    coordinator synchronously."""

    def trigger(self, task: TaskId, barrier: CheckpointBarrier) -> None: ...

    def notify_complete(self, task: TaskId, checkpoint_id: int) -> None: ...

    def notify_aborted(self, task: TaskId, checkpoint_id: int, reason: str) -> None: ...


class CoordinatorStatus(StrEnum):
    CREATED = "created"
    RUNNING = "running"
    SHUT_DOWN = "shut_down"
    FAILED = "failed"  # tolerable failures exceeded, or fenced out


_DECLINE_REASONS = frozenset(
    {
        CheckpointFailureReason.DECLINED,
        CheckpointFailureReason.SUBSUMED,
        CheckpointFailureReason.CANCELLED,
    }
)


class CheckpointCoordinator:
    """See the module docstring. Not thread-safe: drive it from one loop."""

    def __init__(
        self,
        config: CheckpointConfig,
        store: CheckpointLog,
        gateway: TaskGateway,
        *,
        tasks_to_trigger: Sequence[TaskId],
        tasks_to_ack: Sequence[TaskId],
        tasks_to_commit: Sequence[TaskId] | None = None,
        clock: Clock | None = None,
        defer_after_completion: bool = False,
        garbage_every: int = DEFAULT_GARBAGE_EVERY,
        retain_every_ms: int = DEFAULT_RETAIN_EVERY_MS,
    ) -> None:
        """*defer_after_completion*: a completion only commits the checkpoint and notifies
        the tasks; the next periodic trigger waits for :meth:`tick` and retention for
        :meth:`maintain`. For a host whose triggers must coincide with barrier injection and
        whose retention must not delay it (:class:`~spark_ckpt.coordination.host.HostThread`).

        *garbage_every*, *retain_every_ms*: see
        :class:`~spark_ckpt.runtime.checkpoint_cleaner.CheckpointCleaner`.

        The coordinator is handed its helpers, as Flink's is: the request decider (queue
        order, periodic schedule, min pause, max concurrent), the cleaner (retention and
        garbage) and the statistics tracker (counts, history, failure records)."""
        if not tasks_to_trigger or not tasks_to_ack:
            raise CheckpointError("a checkpointed job needs tasks to trigger and to acknowledge")
        self.config = config
        self.store = store
        self.gateway = gateway
        #: Properties every checkpoint of this coordinator carries (a request's own win),
        #: e.g. the names of the source's channels (set by its host).
        self.checkpoint_properties: dict[str, str] = {}
        self.clock: Clock = clock or SystemClock()
        self.tasks_to_trigger = tuple(tasks_to_trigger)
        self.tasks_to_ack = frozenset(tasks_to_ack)
        self.tasks_to_commit = tuple(
            tasks_to_commit
            if tasks_to_commit is not None
            else sorted(set(tasks_to_trigger) | set(tasks_to_ack))
        )
        self.status = CoordinatorStatus.CREATED
        self._lease: CoordinatorLease = store.acquire()
        self._next_id = self._lease.first_id
        self._pending: dict[int, PendingCheckpoint] = {}
        self._requests_by_id: dict[int, CheckpointRequest] = {}
        self._finished_ids: set[int] = set()
        self._failures = FailureCounter(config.tolerable_failed_checkpoints)
        self.defer_after_completion = defer_after_completion
        self.decider = CheckpointRequestDecider(config)
        self.cleaner = CheckpointCleaner(
            store,
            config,
            self.clock,
            self.tasks_to_ack,
            garbage_every=garbage_every,
            retain_every_ms=retain_every_ms,
        )
        self.stats = CheckpointStatsTracker(store, config.history_size)
        self.failure_cause: Exception | None = None

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._lease.epoch

    def restored_from(self, checkpoint: CompletedCheckpoint | None) -> None:
        """The job restored from *checkpoint* (by default assumed to be the latest completed
        one): until a task reports its own incremental base, retention keeps everything
        from there. Call before :meth:`start`."""
        self.cleaner.restored_from(checkpoint)

    def start(self) -> None:
        """Start periodic triggering (if an interval is configured)."""
        self._ensure_running(allow_created=True)
        self.status = CoordinatorStatus.RUNNING
        self.decider.start_periodic(self.clock.now_ms())

    def stop_periodic_trigger(self) -> None:
        """No more periodic checkpoints (before a final checkpoint or stop); manual requests,
        savepoints and pending checkpoints proceed."""
        self.decider.stop_periodic()

    def resume_periodic_trigger(self) -> None:
        """Periodic checkpoints again, the first one an interval from now: a stop whose final
        checkpoint failed lets the job go on (Flink restarts its checkpoint scheduler after
        a failed stop-with-savepoint)."""
        if self.status is CoordinatorStatus.RUNNING:
            self.decider.start_periodic(self.clock.now_ms())

    def shutdown(self, job_status: JobStatus = JobStatus.SUSPENDED) -> None:
        """Abort pending checkpoints (not counted as failures) and apply externalized
        retention for *job_status*. Savepoints are never discarded. Idempotent."""
        if self.status in (CoordinatorStatus.SHUT_DOWN,):
            return
        fenced = self.status is CoordinatorStatus.FAILED and isinstance(
            self.failure_cause, FencedError
        )
        self.status = CoordinatorStatus.SHUT_DOWN
        self.decider.stop_periodic()
        for p in list(self._pending.values()):
            self._abort(
                p,
                CheckpointFailure(p.checkpoint_id, CheckpointFailureReason.COORDINATOR_SHUTDOWN),
                count=False,
            )
        for r in self.decider.drain():
            r.status = RequestStatus.FAILED
            r.failure = CheckpointFailure(0, CheckpointFailureReason.COORDINATOR_SHUTDOWN)
        if fenced:
            return
        self.cleaner.job_ended(self._lease, job_status)

    # -- triggering ------------------------------------------------------------------------
    def tick(self) -> list[CheckpointBarrier]:
        """Expire timed-out checkpoints, then trigger what is due and allowed. Returns the
        barriers sent. Call it regularly from the driver loop."""
        self.expire_overdue()
        return self._trigger_what_is_allowed()

    def expire_overdue(self) -> None:
        """Abort every pending checkpoint whose timeout has passed (Flink's canceller timer):
        the part of :meth:`tick` that may run on any schedule, triggering nothing."""
        self._ensure_running()
        now = self.clock.now_ms()
        for p in sorted(self._pending.values(), key=lambda p: p.checkpoint_id):
            if now >= p.deadline_ms:
                self._abort(
                    p,
                    CheckpointFailure(
                        p.checkpoint_id,
                        CheckpointFailureReason.EXPIRED,
                        f"not acknowledged within {self.config.timeout_ms} ms by "
                        f"{sorted(map(str, p.not_yet_acknowledged))}",
                    ),
                )

    def trigger_checkpoint(
        self, properties: Mapping[str, str] | None = None, *, final: bool = False
    ) -> CheckpointRequest:
        """Request a checkpoint now (subject to max concurrent and min pause). *properties*
        are recorded in the completed checkpoint (e.g. the id of a client's request). A
        *final* checkpoint (end of input, stop) is always aligned, so it leaves no channel
        state and commits every output of the input it covers."""
        return self._request(
            CheckpointRequest(
                SnapshotType.CHECKPOINT,
                forced=False,
                properties=dict(properties or {}),
                final=final,
            )
        )

    def trigger_savepoint(
        self, target: str | None = None, properties: Mapping[str, str] | None = None
    ) -> CheckpointRequest:
        """Request a savepoint: forced (ignores min pause and max concurrent), aligned, full."""
        props = dict(properties or {})
        directory = target or self.config.savepoint_dir
        if directory:
            props["savepoint_dir"] = directory
        return self._request(
            CheckpointRequest(SnapshotType.SAVEPOINT, forced=True, properties=props)
        )

    def _request(self, req: CheckpointRequest) -> CheckpointRequest:
        """Queue *req* behind the requests of its priority and ahead of lower ones (Flink's
        ``CheckpointRequestDecider``): savepoints (forced) first, then final (stop)
        checkpoints, then manual checkpoints, so a savepoint or stop never waits behind
        queued checkpoints; a savepoint, at the head of the queue and forced, then triggers
        at once (past max concurrent and min pause). A due periodic checkpoint comes after
        all of them (see :meth:`_trigger_what_is_allowed`)."""
        self._ensure_running()
        self.decider.enqueue(req)
        self._trigger_what_is_allowed()
        return req

    def _trigger_what_is_allowed(self) -> list[CheckpointBarrier]:
        sent: list[CheckpointBarrier] = []
        while self.status is CoordinatorStatus.RUNNING:
            choice = self.decider.choose(self.clock.now_ms(), len(self._pending))
            if choice is None:
                break
            if isinstance(choice, CheckpointRequest):
                sent.append(self._trigger(choice.snapshot_type, choice))
            else:  # a due periodic checkpoint
                sent.append(self._trigger(SnapshotType.CHECKPOINT, None))
        return sent

    def _allocate_id(self) -> int:
        if self._next_id >= self._lease.end_id:
            self._lease = self._fenced(lambda: self.store.allocate_ids(self._lease))
            self._next_id = self._lease.first_id
        cid = self._next_id
        self._next_id += 1
        return cid

    def _trigger(
        self, snapshot_type: SnapshotType, req: CheckpointRequest | None
    ) -> CheckpointBarrier:
        now = self.clock.now_ms()
        cid = self._allocate_id()
        # with an aligned-checkpoint timeout, checkpoints start aligned and the aligner switches
        # them after the timeout; without one, unaligned checkpoints are unaligned from the start
        final = req is not None and req.final
        unaligned = (
            self.config.unaligned
            and self.config.aligned_checkpoint_timeout_ms == 0
            and self.config.mode is CheckpointingMode.EXACTLY_ONCE
            and snapshot_type is SnapshotType.CHECKPOINT
            and not final
        )
        barrier = CheckpointBarrier(cid, now, snapshot_type, unaligned, final)
        pending = PendingCheckpoint(
            barrier=barrier,
            tasks_to_ack=self.tasks_to_ack,
            deadline_ms=now + self.config.timeout_ms,
            properties={**self.checkpoint_properties, **(req.properties if req else {})},
        )
        self._pending[cid] = pending
        self.stats.triggered()
        if req is not None:
            req.status = RequestStatus.TRIGGERED
            req.checkpoint_id = cid
            self._requests_by_id[cid] = req
        log.debug("triggering %s %d", snapshot_type.value, cid)
        for task in self.tasks_to_trigger:
            self.gateway.trigger(task, barrier)
        return barrier

    # -- acknowledgements --------------------------------------------------------------------
    def receive_acknowledge(self, ack: AcknowledgeCheckpoint) -> AckResult:
        """Record a task's acknowledgement; completes the checkpoint when it is the last one.
        Acks after shutdown are answered DISCARDED."""
        pending = self._pending.get(ack.checkpoint_id)
        if pending is None:
            return (
                AckResult.DISCARDED
                if ack.checkpoint_id in self._finished_ids
                else AckResult.UNKNOWN
            )
        if self.status is not CoordinatorStatus.RUNNING:
            return AckResult.DISCARDED
        self.cleaner.base_reported(ack.task, ack.base_checkpoint_id)
        result = pending.acknowledge(ack)
        if result is AckResult.SUCCESS and pending.fully_acknowledged:
            self._complete(pending)
        return result

    def receive_decline(self, decline: DeclineCheckpoint) -> None:
        """A task declined: abort the checkpoint. Counts as a failure unless the task gave it
        up for a newer checkpoint or a cancel marker (``code`` subsumed/cancelled). A decline
        of a checkpoint that is not pending, or from a task that has acknowledged it (a
        late decline of a write that finished after all), changes nothing."""
        pending = self._pending.get(decline.checkpoint_id)
        if pending is None or self.status is not CoordinatorStatus.RUNNING:
            return
        if decline.task in pending.acks:
            return
        try:
            reason = CheckpointFailureReason(decline.code)
        except ValueError:
            reason = CheckpointFailureReason.DECLINED
        if reason not in _DECLINE_REASONS:
            reason = CheckpointFailureReason.DECLINED
        self._abort(
            pending,
            CheckpointFailure(
                decline.checkpoint_id, reason, f"declined by {decline.task}: {decline.reason}"
            ),
        )
        self._after_abort()

    def fail_pending(self, reason: str) -> None:
        """A task failed: abort every pending checkpoint (TASK_FAILURE)."""
        for p in sorted(self._pending.values(), key=lambda p: p.checkpoint_id):
            if self.status is CoordinatorStatus.RUNNING:
                self._abort(
                    p,
                    CheckpointFailure(
                        p.checkpoint_id, CheckpointFailureReason.TASK_FAILURE, reason
                    ),
                )
        # nothing is triggered here: the tasks failed, the job restarts

    def _after_abort(self) -> None:
        """An abort freed a slot: trigger what waited for it, as a completion does (Flink's
        ``abortPendingCheckpoint`` schedules the queued requests too). With
        ``defer_after_completion`` that is left to :meth:`tick`."""
        if not self.defer_after_completion and self.status is CoordinatorStatus.RUNNING:
            self._trigger_what_is_allowed()

    # -- completion and abort ------------------------------------------------------------------
    def _complete(self, pending: PendingCheckpoint) -> None:
        cid = pending.checkpoint_id
        now = self.clock.now_ms()
        completed = pending.finalize(now)
        try:
            self._fenced(lambda: self.store.commit(self._lease, completed))
        except FencedError:
            raise
        except StoreError as e:
            self._abort(
                pending, CheckpointFailure(cid, CheckpointFailureReason.FINALIZE_FAILED, str(e))
            )
            self._after_abort()
            return
        pending.mark_completed()
        del self._pending[cid]
        self._finished_ids.add(cid)
        self.decider.completed(now)
        self._failures.on_success()
        self.stats.completed(pending, completed, now)
        req = self._requests_by_id.pop(cid, None)
        if req is not None:
            req.status = RequestStatus.COMPLETED
            req.completed = completed
        if not completed.is_savepoint:
            for p in sorted(self._pending.values(), key=lambda p: p.checkpoint_id):
                if p.checkpoint_id < cid and p.snapshot_type is SnapshotType.CHECKPOINT:
                    self._abort(
                        p,
                        CheckpointFailure(
                            p.checkpoint_id,
                            CheckpointFailureReason.SUBSUMED,
                            f"subsumed by checkpoint {cid}",
                        ),
                        count=False,
                    )
            self.cleaner.completed(completed, final=pending.barrier.final)
            if pending.barrier.final:
                # the job's last checkpoint: retain now, before the sink commit that ends a
                # stop
                self.maintain()
            elif not self.defer_after_completion:
                self.maintain()
        for task in self.tasks_to_commit:
            self.gateway.notify_complete(task, cid)
        if not self.defer_after_completion:
            self._trigger_what_is_allowed()

    def maintain(self) -> None:
        """Apply retention if a completion made it due (see ``defer_after_completion`` and
        :meth:`CheckpointCleaner.maintain
        <spark_ckpt.runtime.checkpoint_cleaner.CheckpointCleaner.maintain>`). A
        :class:`FencedError` fails the coordinator and propagates."""
        if self.status is not CoordinatorStatus.RUNNING:
            return
        self.cleaner.maintain(self._lease, self._fenced)

    def _abort(
        self, pending: PendingCheckpoint, failure: CheckpointFailure, count: bool = True
    ) -> None:
        cid = pending.checkpoint_id
        pending.abort(failure)
        self._pending.pop(cid, None)
        self._finished_ids.add(cid)
        self.stats.failed(pending, failure, self.clock.now_ms(), self._lease)
        req = self._requests_by_id.pop(cid, None)
        if req is not None:
            req.status = RequestStatus.FAILED
            req.failure = failure
        log.info("%s", failure)
        for task in self.tasks_to_commit:
            self.gateway.notify_aborted(task, cid, failure.reason.value)
        if count and pending.snapshot_type is SnapshotType.CHECKPOINT:
            try:
                self._failures.on_failure(failure)
            except TolerableFailuresExceededError as e:
                self._fail(e)
                raise

    def _fail(self, cause: Exception) -> None:
        self.failure_cause = cause
        self.status = CoordinatorStatus.FAILED
        self.decider.stop_periodic()
        for p in list(self._pending.values()):
            self._abort(
                p,
                CheckpointFailure(
                    p.checkpoint_id, CheckpointFailureReason.COORDINATOR_SHUTDOWN, str(cause)
                ),
                count=False,
            )

    def _fenced(self, op: Callable[[], _T]) -> _T:
        try:
            return op()
        except FencedError as e:
            if self.status is CoordinatorStatus.RUNNING:
                self._fail(e)
            raise

    def _ensure_running(self, allow_created: bool = False) -> None:
        if self.status is CoordinatorStatus.RUNNING:
            return
        if allow_created and self.status is CoordinatorStatus.CREATED:
            return
        if self.status is CoordinatorStatus.CREATED:
            raise CheckpointError("the coordinator was not started")
        if self.failure_cause is not None:
            raise CoordinatorShutdownError(
                f"the coordinator failed: {self.failure_cause}"
            ) from self.failure_cause
        raise CoordinatorShutdownError("the coordinator is shut down")

    # -- inspection ------------------------------------------------------------------------
    @property
    def pending(self) -> list[PendingCheckpoint]:
        return sorted(self._pending.values(), key=lambda p: p.checkpoint_id)

    @property
    def next_periodic_ms(self) -> int | None:
        return self.decider.next_periodic_ms

    def next_trigger_ms(self) -> int | None:
        """The earliest time at which :meth:`tick` may trigger something, as things stand: 0
        for a forced request queued; else, unless max concurrent or min pause hold every
        trigger back until a pending checkpoint ends (None), the due time of a queued
        request (0) or of the next periodic checkpoint, no sooner than min pause after the
        last completion; None when nothing would trigger (not running, nothing queued, no
        periodic trigger). Only a completion, an abort or a new request change it."""
        if self.status is not CoordinatorStatus.RUNNING:
            return None
        return self.decider.next_trigger_ms(len(self._pending))

    def latest_completed(self) -> CompletedCheckpoint | None:
        """The checkpoint (or savepoint) a restart restores from."""
        return self.store.latest_completed()

    def completed_history(self) -> Iterable[HistoryEntry]:
        return self.stats.completed_history()

    @property
    def history(self) -> Sequence[HistoryEntry]:
        """The newest ``history_size`` finished checkpoints (see
        :class:`~spark_ckpt.runtime.stats_tracker.CheckpointStatsTracker`)."""
        return self.stats.history

    @property
    def num_triggered(self) -> int:
        return self.stats.num_triggered

    @property
    def num_completed(self) -> int:
        return self.stats.num_completed

    @property
    def num_failed(self) -> int:
        return self.stats.num_failed


__all__ = [
    "DEFAULT_GARBAGE_EVERY",
    "RETENTION_RETRY_MS",
    "AckResult",
    "CheckpointCoordinator",
    "CheckpointRequest",
    "CoordinatorStatus",
    "HistoryEntry",
    "JobStatus",
    "RequestStatus",
    "TaskGateway",
    "discards_checkpoints",
]

"""Retention and garbage of completed checkpoints, handed to the
:class:`~spark_ckpt.runtime.coordinator.CheckpointCoordinator` (Flink's
``CheckpointsCleaner`` with the completed-checkpoint store's subsumption).

After a completion, retention keeps the configured number of checkpoints, every savepoint, and every
checkpoint from the oldest base a task's incremental snapshots may still build on; garbage (blobs no
kept checkpoint references) is collected every ``garbage_every``-th time and after a final
checkpoint. A host may space retentions out (``retain_every_ms``): the log then holds a few subsumed
checkpoints for a few seconds (Flink's store drops a subsumed checkpoint at once and discards its
files asynchronously; here the log is the store, and dropping costs a commit). A checkpoint that
answers a request from another process (property :data:`REQUEST_ID`: the CLI's ``checkpoint``,
:meth:`PipelineClient.checkpoint <spark_ckpt.client.pipeline_client.PipelineClient.checkpoint>`) is
kept :data:`ANSWER_KEEP_MS` after its completion whatever completes after it: its requester learns
of it by finding it in the log, polling, and a newer checkpoint with a retention right after it
would otherwise remove it first (a job's final checkpoint retains exactly the configured count).
When the job ends, externalized retention may discard the retained checkpoints
(:func:`discards_checkpoints`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Final, TypeVar

from spark_ckpt.errors import CheckpointError, FencedError, StoreError
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import Clock
from spark_ckpt.protocol.state_handles import TaskId
from spark_ckpt.runtime.config import CheckpointConfig, ExternalizedCheckpointRetention
from spark_ckpt.storage.checkpoint_store import CheckpointLog
from spark_ckpt.storage.lease import CoordinatorLease

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: How long retention waits after a failed attempt before it tries again.
RETENTION_RETRY_MS: Final = 5_000

#: Default of ``retain_every_ms``: retention follows every completion.
DEFAULT_RETAIN_EVERY_MS: Final = 0

#: Completed-checkpoint property naming the out-of-process request the checkpoint answers.
REQUEST_ID: Final = "request_id"

#: How long retention keeps a checkpoint that answers a request (:data:`REQUEST_ID`) after
#: its completion (and every checkpoint after it: retention keeps from an id on): long
#: enough for its requester, which polls the log, to find it.
ANSWER_KEEP_MS: Final = 5_000

#: Default of ``garbage_every``: unreferenced blobs are collected at every 8th retention (a
#: collection scans every state table, so it is not worth paying at every retention).
DEFAULT_GARBAGE_EVERY: Final = 8


class JobStatus(StrEnum):
    """How the job ended, for externalized-checkpoint retention
    (:meth:`CheckpointCleaner.job_ended`)."""

    FINISHED = "finished"
    CANCELED = "canceled"
    FAILED = "failed"
    SUSPENDED = "suspended"


# Which job end discards retained checkpoints, per externalized retention (Flink's
# CheckpointProperties: discardFinished / discardCancelled / discardFailed / discardSuspended).
_DISCARD_ON: dict[ExternalizedCheckpointRetention, frozenset[JobStatus]] = {
    ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS: frozenset(JobStatus),
    ExternalizedCheckpointRetention.DELETE_ON_CANCELLATION: frozenset(
        {JobStatus.FINISHED, JobStatus.CANCELED}
    ),
    ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION: frozenset(),
}


def discards_checkpoints(retention: ExternalizedCheckpointRetention, status: JobStatus) -> bool:
    """Whether a job ending with *status* discards its retained checkpoints (never its
    savepoints) under *retention*. Unlike Flink, RETAIN_ON_CANCELLATION keeps them even when
    the job finished."""
    return status in _DISCARD_ON[retention]


#: Runs a store operation, failing the coordinator if the store fenced it.
Fenced = Callable[[Callable[[], _T]], _T]


class CheckpointCleaner:
    """Retention and garbage collection on *store* for the tasks *tasks* (see the module
    docstring). *garbage_every*: retention removes subsumed checkpoints at every completion
    but collects the blobs no kept checkpoint references only every *garbage_every*-th time
    (and after a final checkpoint): on a durable store each collection is a scan and a
    copy-on-write delete per state table, a fixed cost that need not be paid every second.
    Unreferenced blobs are invisible; they only occupy storage meanwhile.

    *retain_every_ms*: retention that a completion made due runs at most this often (after
    a final checkpoint at once): on a durable store each retention records the statistics
    and commits to the log, work that checkpoints every second need not pay every second.
    Subsumed checkpoints stay in the log meanwhile; they are complete and restorable."""

    def __init__(
        self,
        store: CheckpointLog,
        config: CheckpointConfig,
        clock: Clock,
        tasks: Iterable[TaskId],
        *,
        garbage_every: int = DEFAULT_GARBAGE_EVERY,
        retain_every_ms: int = DEFAULT_RETAIN_EVERY_MS,
    ) -> None:
        if garbage_every < 1:
            raise CheckpointError(f"garbage_every must be >= 1, got {garbage_every}")
        if retain_every_ms < 0:
            raise CheckpointError(f"retain_every_ms must be >= 0, got {retain_every_ms}")
        self._store = store
        self._config = config
        self._clock = clock
        self._tasks = frozenset(tasks)
        self.garbage_every = garbage_every
        self.retain_every_ms = retain_every_ms
        self._due = False
        self._last_ms: int | None = None  # when retention last ran (None: not in this run)
        self._retry_ms = 0  # no retention attempt before this time (backoff)
        self._retentions = 0
        self._collect_now = False
        # per task: the oldest checkpoint its incremental snapshots may still build on
        # (AcknowledgeCheckpoint.base_checkpoint_id); until a task reports, the checkpoint
        # it restored from
        self._bases: dict[TaskId, int] = {}
        # checkpoints answering a request, by id: when they completed (see ANSWER_KEEP_MS)
        self._answers: dict[int, int] = {}
        self.restored_from(store.latest_completed())

    def restored_from(self, checkpoint: CompletedCheckpoint | None) -> None:
        """The job restored from *checkpoint*: until a task reports its own incremental
        base, retention keeps everything from there."""
        self._bases = {t: checkpoint.checkpoint_id for t in self._tasks} if checkpoint else {}

    def base_reported(self, task: TaskId, base: int | None) -> None:
        """*task* acknowledged with incremental base *base* (None: it reuses nothing)."""
        if base is None:
            self._bases.pop(task, None)
        else:
            self._bases[task] = max(self._bases.get(task, 0), base)

    def completed(self, checkpoint: CompletedCheckpoint, *, final: bool) -> None:
        """*checkpoint* (not a savepoint) completed: retention is due. After the job's
        *final* checkpoint no task snapshots again in this run, so nothing builds on older
        checkpoints any more, and garbage is collected at the next retention."""
        self._due = True
        if REQUEST_ID in checkpoint.properties:
            self._answers[checkpoint.checkpoint_id] = self._clock.now_ms()
        if final:  # retains exactly the configured count: the job ends
            self._answers.clear()
            self._bases.clear()
            self._collect_now = True

    def maintain(self, lease: CoordinatorLease, fenced: Fenced[list[int]]) -> None:
        """Apply retention if a completion made it due and ``retain_every_ms`` has passed
        since the last one (or a final checkpoint completed). Retention is housekeeping: a
        :class:`StoreError` from the store (other than :class:`FencedError`) is logged as a
        WARNING and retention stays due — garbage collection too, if it was — so a later
        call retries it, no sooner than :data:`RETENTION_RETRY_MS` after the failure.
        Checkpoints are never lost by this; old ones only stay longer. A
        :class:`FencedError` propagates (through *fenced*, which fails the coordinator)."""
        if not self._due:
            return
        now = self._clock.now_ms()
        if now < self._retry_ms:
            return  # backing off after a failure (a store outage must not flood the log)
        spaced = self._last_ms is not None and now < self._last_ms + self.retain_every_ms
        if spaced and not self._collect_now:
            return  # stays due: the next call after the spacing runs it
        self._last_ms = now
        self._due = False
        self._retentions += 1
        collect = self._collect_now or self._retentions % self.garbage_every == 0
        self._collect_now = False
        self._answers = {cid: at for cid, at in self._answers.items() if now < at + ANSWER_KEEP_MS}
        keep_from = min([*self._bases.values(), *self._answers], default=None)
        try:
            fenced(
                lambda: self._store.retain(
                    lease,
                    self._config.retained_checkpoints,
                    keep_from,
                    collect_garbage=collect,
                    history_size=self._config.history_size,
                )
            )
        except FencedError:
            raise
        except StoreError as e:
            log.warning("retention failed, retrying in %d ms: %s", RETENTION_RETRY_MS, e)
            self._due = True
            self._retry_ms = self._clock.now_ms() + RETENTION_RETRY_MS
            self._collect_now = self._collect_now or collect

    def job_ended(self, lease: CoordinatorLease, status: JobStatus) -> None:
        """Externalized retention for a job that ended with *status*: discard the retained
        checkpoints (never savepoints) if it says so."""
        if discards_checkpoints(self._config.externalized_retention, status):
            ids = [c.checkpoint_id for c in self._store.list_completed() if not c.is_savepoint]
            if ids:
                self._store.discard(lease, ids, history_size=self._config.history_size)

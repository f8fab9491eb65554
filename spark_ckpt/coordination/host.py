"""The coordinator's home inside a running Spark query: the ``ckpt-source`` runner.

Spark runs a Python stream reader's ``initialOffset``/``latestOffset``/``partitions``/``commit``
in one long-lived driver-side process per query run. :class:`CoordinatorHost` lives there,
next to the source, polled by a thread of its own; ``latestOffset``
takes the barriers it triggered. One poll:

1. re-read the topology (who acknowledges, which sink to commit) — a new topology restarts the
   coordinator (aborting pending checkpoints) after recover-and-commit of the sink;
2. drain the mailbox: acks, declines, checkpoint/savepoint/stop requests, and pause/resume
   requests of the periodic checkpoints (recorded in :mod:`spark_ckpt.coordination.schedule`, which
   a coordinator reads when it starts);
3. tick the coordinator (periodic triggers, timeouts);
4. hand the barriers it triggered to the source, which places them into the offsets.

The host is handed its helpers, as Flink's coordinator is: the global committer
(:mod:`~spark_ckpt.coordination.global_committer`) commits each completed checkpoint's sink
transactions in one step; the run's control (:mod:`~spark_ckpt.coordination.requests`) acts on
requests; a :class:`LostWriters` scan (the executors' side provides it) declines checkpoints
whose state write was lost. Without a topology it triggers nothing: a checkpoint needs someone
to acknowledge it. :class:`~spark_ckpt.coordination.host_thread.HostThread` polls it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from spark_ckpt.coordination.global_committer import STAGING_CLOCK_SKEW_MS, GlobalCommitter
from spark_ckpt.coordination.live_report import InProgress
from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.messages import Request
from spark_ckpt.coordination.requests import RunControl
from spark_ckpt.coordination.runs import RestorePoint, RunFiles, SkippedCheckpoint
from spark_ckpt.coordination.schedule import CheckpointSchedule, SchedulePause
from spark_ckpt.coordination.topology import SinkSpec, Topology, read_topology
from spark_ckpt.errors import CorruptCheckpointError, FencedError, ProtocolError
from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import Clock, SystemClock
from spark_ckpt.protocol.state_handles import AcknowledgeCheckpoint, DeclineCheckpoint, TaskId
from spark_ckpt.runtime.checkpoint_cleaner import DEFAULT_RETAIN_EVERY_MS
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.coordinator import (
    CheckpointCoordinator,
    CheckpointRequest,
    CoordinatorStatus,
    JobStatus,
)
from spark_ckpt.runtime.stage import STAGES
from spark_ckpt.runtime.task import SOURCE_TASK
from spark_ckpt.sinks.two_phase_commit import SinkCommitter
from spark_ckpt.storage.checkpoint_store import CheckpointStore

log = logging.getLogger(__name__)

#: Builds the committer of a topology's sink: the host is its global committer (driver side).
SinkFactory = Callable[[SinkSpec], SinkCommitter]

#: Retention spacing of a host run by a :class:`~spark_ckpt.coordination.host_thread.HostThread`
#: (the source runner's): retention (a statistics write and a commit to the log, with a fresh
#: read of each) runs at most this often instead of after each completion; subsumed
#: checkpoints stay in the log that long.
HOST_RETAIN_EVERY_MS = 5_000


class LostWriters(Protocol):
    """Which pending checkpoints wait for a state write that its process lost after the
    subtask's last micro-batch (provided by the executors' side:
    :class:`~spark_ckpt.spark.executors.snapshot_threads.LostWriterScan`). Called on the
    host's thread before the mailbox is read; its declines are applied after the acks read
    there."""

    def scan(self, waiting: Mapping[int, Iterable[TaskId]]) -> list[DeclineCheckpoint]: ...


class CoordinatorHost:
    """See the module docstring. Single-threaded: call :meth:`poll` from one place."""

    def __init__(
        self,
        root: str,
        config: CheckpointConfig,
        store: CheckpointStore,
        sink_factory: SinkFactory,
        clock: Clock | None = None,
        defer_after_completion: bool = False,
        run_id: str | None = None,
        pipeline: str = "",
        retain_every_ms: int = DEFAULT_RETAIN_EVERY_MS,
        lost_writers: LostWriters | None = None,
    ) -> None:
        """*pipeline*: the pipeline's name (recorded on savepoints). *retain_every_ms*: the
        coordinator's retention spacing (see
        :class:`~spark_ckpt.runtime.checkpoint_cleaner.CheckpointCleaner`;
        :data:`HOST_RETAIN_EVERY_MS` under a host thread). *run_id*: the run (see
        :mod:`spark_ckpt.coordination.runs`) this host coordinates. Its topology
        is the run's own, read once by :meth:`start_run`; its tasks answer in the run's
        mailbox box. Without it (a ``ckpt-sink`` query) the host follows the root's shared
        topology, re-read on every poll. *lost_writers*: the scan for lost state writes of
        the run's subtasks (none: checkpoints wait for their timeout)."""
        self.root = root
        self.pipeline = pipeline
        self.run_id = run_id
        self.run = RunFiles(root, run_id) if run_id else None
        self.defer_after_completion = defer_after_completion
        self.retain_every_ms = retain_every_ms
        self.config = config
        self.store = store
        self.sink_factory = sink_factory
        self.clock: Clock = clock or SystemClock()
        self.mailbox = Mailbox(root)
        self.run_mailbox = Mailbox(root, run_id) if run_id else None
        self._lost_writers = lost_writers
        self.topology: Topology | None = None
        self.restore_point: RestorePoint | None = None
        self._restored: CompletedCheckpoint | None = None
        self._aborted: list[int] = []
        self.coordinator: CheckpointCoordinator | None = None
        self._checkpoint_properties: dict[str, str] = {}
        #: The newest checkpoint this host saw complete (its sink commit follows).
        self.last_completed: CompletedCheckpoint | None = None
        self.committer = GlobalCommitter(
            root,
            store,
            run=self.run,
            pipeline=pipeline,
            max_parallelism=config.max_parallelism,
            staged_before_ms=self.clock.now_ms() - STAGING_CLOCK_SKEW_MS,
        )
        self.control = RunControl(
            CheckpointSchedule(root), self.clock, pipeline=pipeline, run_id=run_id
        )
        self._barriers: list[CheckpointBarrier] = []

    @property
    def sink(self) -> SinkCommitter | None:
        """The committer of the topology's sink (None: no topology, or no sink)."""
        return self.committer.sink

    @property
    def stopping(self) -> CheckpointRequest | None:
        """The final checkpoint (or savepoint) of a stop or restart, once triggered."""
        return self.control.stopping

    @property
    def awaiting_acks(self) -> bool:
        """Whether a triggered checkpoint waits for acknowledgements (mailbox messages)."""
        return self.coordinator is not None and bool(self.coordinator.pending)

    @property
    def draining(self) -> Request | None:
        """A stop with drain waiting for the sources to catch up."""
        return self.control.draining

    @property
    def paused(self) -> SchedulePause | None:
        """Whether (since when) the periodic checkpoints are paused."""
        return self.control.paused

    # -- TaskGateway -------------------------------------------------------------------------
    def trigger(self, task: TaskId, barrier: CheckpointBarrier) -> None:
        self._barriers.append(barrier)

    def notify_complete(self, task: TaskId, checkpoint_id: int) -> None:
        cp = self.committer.complete(checkpoint_id)
        if cp is None:
            return
        self.last_completed = cp
        log.info(
            "completed %s %d in %d ms (%d bytes)",
            cp.snapshot_type.value,
            checkpoint_id,
            cp.stats.end_to_end_ms,
            cp.stats.state_bytes,
        )

    def notify_aborted(self, task: TaskId, checkpoint_id: int, reason: str) -> None:
        """Publish the abort to the run's tasks (``aborted.json``, read with their completion
        polls): they stop aligning on the checkpoint and drop its snapshot. Without a run,
        tasks learn of aborts lazily (a newer barrier subsumes the older one)."""
        if checkpoint_id in self._aborted:
            return
        self._aborted.append(checkpoint_id)
        self.committer.aborted(checkpoint_id)
        if self.run is not None:
            self.run.write_aborted(self._aborted)

    # -- start -------------------------------------------------------------------------------
    def start_run(self) -> CompletedCheckpoint | None:
        """The checkpoint this run restores from (``initialOffset``; idempotent). With a run
        id: take the coordinator lease, then choose the restore point (so that no other
        coordinator can complete a newer checkpoint after the choice), recover the sink to
        it and publish it for the run's tasks (:meth:`RunFiles.restore_point`). The restore
        point is the newest completed checkpoint whose data verifies; newer damaged ones are
        reported and skipped, as Flink falls back to an older retained checkpoint. Raises
        :class:`~spark_ckpt.errors.CorruptCheckpointError` when checkpoints exist but none
        is restorable (starting empty would duplicate committed output)."""
        if self.run is None:
            return self._choose_restore_point()
        if self.coordinator is None:
            topology = read_topology(self.root, self.run_id)
            if topology is None:
                raise ProtocolError(
                    f"run {self.run_id} of {self.root} has no topology: start runs through "
                    "Pipeline.run"
                )
            try:
                self._install(topology)
            except (CorruptCheckpointError, FencedError) as e:
                self.run.write_fatal(f"{type(e).__name__}: {e}")
                raise
        return self._restored

    def _choose_restore_point(self) -> CompletedCheckpoint | None:
        if self.restore_point is not None:
            return self._restored
        restored, damaged = self.store.latest_restorable()
        for error in damaged:
            log.warning("restore skips damaged checkpoint: %s", error)
        if restored is None and damaged:
            raise CorruptCheckpointError(
                f"no restorable checkpoint under {self.root}: every retained checkpoint is "
                "damaged (" + "; ".join(str(e) for e in damaged) + ")",
                checkpoint_id=damaged[0].checkpoint_id,
            )
        self._restored = restored
        self.restore_point = RestorePoint(
            restored.checkpoint_id if restored else None,
            tuple(SkippedCheckpoint(e.checkpoint_id or 0, str(e)) for e in damaged),
            at_ms=self.clock.now_ms(),
        )
        return restored

    def _install(self, topology: Topology) -> None:
        """Start a coordinator for *topology* (shutting down the previous one): it takes the
        lease, the restore point is chosen, the sink recovered to it and the choice
        published for the run's tasks."""
        if self.coordinator is not None:
            self.coordinator.shutdown(JobStatus.SUSPENDED)
        self.topology = topology
        sink = self.sink_factory(topology.sink) if topology.sink else None
        if self.run is None:
            self.restore_point = None  # a new shared topology restores anew
        coordinator = CheckpointCoordinator(  # takes the lease: fences older coordinators
            self.config,
            self.store,
            self,
            tasks_to_trigger=[SOURCE_TASK],
            tasks_to_ack=[TaskId(v, s) for v, s in topology.tasks],
            clock=self.clock,
            defer_after_completion=self.defer_after_completion,
            retain_every_ms=self.retain_every_ms,
        )
        coordinator.checkpoint_properties.update(self._checkpoint_properties)
        if topology.stage_names:  # the offline tools and the page name the stages
            coordinator.checkpoint_properties[STAGES] = json.dumps(dict(topology.stage_names))
        if self.run is not None:
            self.run.write_lease(coordinator.epoch)
        latest = self._choose_restore_point()
        coordinator.restored_from(latest)
        late = self.sink_factory(topology.late_sink) if topology.late_sink else None
        sides = {name: self.sink_factory(spec) for name, spec in topology.side_sinks}
        self.committer.install(sink, latest, late=late, sides=sides)
        if self.run is not None and self.restore_point is not None:
            self.run.write_restore_point(self.restore_point)
            self.run.write_config(self.pipeline, self.config.to_dict())
        self.coordinator = coordinator
        self.coordinator.start()
        self.control.started(coordinator)
        log.info("coordinator epoch %d for %s", self.coordinator.epoch, topology)

    # -- polling ---------------------------------------------------------------------------
    def poll(self, tick: bool = True) -> list[CheckpointBarrier]:
        """One round (see the module docstring); returns the barriers to place, oldest first.
        Without *tick* the coordinator triggers nothing (no periodic trigger: see
        :meth:`tick`), but checkpoints past their timeout expire: a micro-batch that takes
        long must not keep its checkpoint alive until the next ``latestOffset``. Raises
        :class:`~spark_ckpt.errors.TolerableFailuresExceededError` to fail the query."""
        if self.run is None:
            topology = read_topology(self.root)
            if topology is not None and topology != self.topology:
                self._install(topology)
        coordinator = self.coordinator
        if coordinator is None:
            return []
        lost = self._lost_writes(coordinator)  # before the acks: see LostWriters
        for mailbox in (self.mailbox, self.run_mailbox):
            if mailbox is None:
                continue
            received = mailbox.receive()
            for _, message in received:
                if isinstance(message, AcknowledgeCheckpoint):
                    if any(p.checkpoint_id == message.checkpoint_id for p in coordinator.pending):
                        self.committer.record(message)  # late ones would only linger
                    coordinator.receive_acknowledge(message)
                elif isinstance(message, DeclineCheckpoint):
                    coordinator.receive_decline(message)
                elif isinstance(message, Request):
                    self.control.on_request(coordinator, message)
            mailbox.delete([name for name, _ in received])
        for decline in lost:
            waiting = {p.checkpoint_id: p.not_yet_acknowledged for p in coordinator.pending}
            if decline.task in waiting.get(decline.checkpoint_id, ()):
                log.warning("declining checkpoint %d: %s", decline.checkpoint_id, decline.reason)
                coordinator.receive_decline(decline)
        self.control.after_failed_stop(coordinator)
        if tick:
            return self.tick()
        if coordinator.status is CoordinatorStatus.RUNNING:
            coordinator.expire_overdue()
        barriers, self._barriers = self._barriers, []
        return barriers

    def _lost_writes(self, coordinator: CheckpointCoordinator) -> list[DeclineCheckpoint]:
        """The declines of pending checkpoints whose state write was lost with its process
        after the subtask's last micro-batch (:class:`LostWriters`)."""
        if self._lost_writers is None or coordinator.status is not CoordinatorStatus.RUNNING:
            return []
        waiting = {p.checkpoint_id: p.not_yet_acknowledged for p in coordinator.pending}
        return self._lost_writers.scan({c: t for c, t in waiting.items() if t})

    def tick(self) -> list[CheckpointBarrier]:
        """Tick the coordinator (periodic triggers, timeouts): what ``latestOffset`` does, so
        that a periodic checkpoint is triggered when its barriers are placed. Returns the
        barriers to place, oldest first."""
        coordinator = self.coordinator
        if coordinator is not None and coordinator.status is CoordinatorStatus.RUNNING:
            coordinator.tick()
        barriers, self._barriers = self._barriers, []
        return barriers

    def next_trigger_ms(self) -> int | None:
        """When :meth:`tick` may trigger something next (0: now; None: not before something
        else changes), see :meth:`CheckpointCoordinator.next_trigger_ms`. Before the
        coordinator is installed: 0 (unknown)."""
        if self.coordinator is None:
            return 0
        return self.coordinator.next_trigger_ms()

    def maintain(self) -> None:
        """Deferred retention (see ``defer_after_completion``)."""
        if self.coordinator is not None:
            self.coordinator.maintain()

    # -- the source runner's requests --------------------------------------------------------
    def _running(self) -> CheckpointCoordinator | None:
        coordinator = self.coordinator
        if coordinator is None or coordinator.status is not CoordinatorStatus.RUNNING:
            return None
        return coordinator

    def request_final_checkpoint(self) -> CheckpointRequest | None:
        """Trigger the checkpoint that ends a bounded run (``Trigger.AvailableNow``); None
        when nothing coordinates."""
        coordinator = self._running()
        return None if coordinator is None else self.control.final_checkpoint(coordinator)

    def request_restart(self, reason: str) -> bool:
        """Source runner: the source found channels this run does not read (new Kafka
        partitions). End the run as a stop does, with a final checkpoint, which records
        *reason* (:data:`~spark_ckpt.coordination.requests.RESTART`); ``Pipeline.run`` then
        starts the next run, which reads them. False (nothing done) while a stop is under
        way or when nothing coordinates."""
        coordinator = self._running()
        return coordinator is not None and self.control.restart(coordinator, reason)

    def finish_drain(self) -> None:
        """Source runner: the channels reached the positions they had when the draining stop
        request arrived; take its final checkpoint (or savepoint) now. Idempotent."""
        if self.coordinator is not None:
            self.control.finish_drain(self.coordinator)

    def name_channels(self, names: list[str]) -> None:
        """Source runner: every checkpoint of this run records the source's channel names
        (:data:`~spark_ckpt.sources.kafka_options.CHANNEL_NAMES`), by which the next run
        resumes each channel."""
        from spark_ckpt.sources.kafka_options import CHANNEL_NAMES

        self._checkpoint_properties[CHANNEL_NAMES] = json.dumps(names)
        if self.coordinator is not None:
            self.coordinator.checkpoint_properties.update(self._checkpoint_properties)

    def latest_completed(self) -> CompletedCheckpoint | None:
        return self.store.latest_completed()

    def in_progress(self) -> tuple[InProgress, ...]:
        """The checkpoints triggered and not finished yet, oldest first (none when nothing
        coordinates). O(pending checkpoints); no I/O."""
        if self.coordinator is None:
            return ()
        return tuple(
            InProgress(
                p.checkpoint_id,
                p.snapshot_type,
                p.trigger_ms,
                len(p.acks),
                len(p.tasks_to_ack),
            )
            for p in self.coordinator.pending
        )

    def shutdown(self, status: JobStatus = JobStatus.SUSPENDED) -> None:
        if self.coordinator is not None:
            self.coordinator.shutdown(status)

"""The coordinator's home inside a running Spark query: the ``ckpt-source`` runner.

Spark runs a Python stream reader's ``initialOffset``/``latestOffset``/``partitions``/``commit``
in one long-lived driver-side process per query run. :class:`CoordinatorHost` lives there,
next to the source, polled by a thread of its own (:class:`HostThread`); ``latestOffset``
takes the barriers it triggered. One poll:

1. re-read the topology (who acknowledges, which sink to commit) — a new topology restarts the
   coordinator (aborting pending checkpoints) after recover-and-commit of the sink;
2. drain the mailbox: acks, declines, checkpoint/savepoint/stop requests, and pause/resume
   requests of the periodic checkpoints (recorded in :mod:`spark_ckpt.spark.schedule`, which
   a coordinator reads when it starts);
3. tick the coordinator (periodic triggers, timeouts);
4. hand the barriers it triggered to the source, which places them into the offsets.

It is also the *global committer*: when a checkpoint completes it commits the sink
transactions recorded in it, in one step (see :mod:`spark_ckpt.sinks.sink`). Without a topology it
triggers nothing: a checkpoint needs someone to acknowledge it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable
from typing import TypeVar

from spark_ckpt.delta.savepoint import export_savepoint, savepoint_directory
from spark_ckpt.errors import CorruptCheckpointError, FencedError, ProtocolError, StoreError
from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import Clock, SystemClock
from spark_ckpt.protocol.handle import AcknowledgeCheckpoint, DeclineCheckpoint, TaskId
from spark_ckpt.runtime.carried_transactions import CarriedTransactions
from spark_ckpt.runtime.checkpoint_cleaner import DEFAULT_RETAIN_EVERY_MS, REQUEST_ID
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.coordinator import (
    CheckpointCoordinator,
    CheckpointRequest,
    CoordinatorStatus,
    JobStatus,
    RequestStatus,
)
from spark_ckpt.runtime.restore_settings import PIPELINE
from spark_ckpt.runtime.task import commit_checkpoint, recover_sink
from spark_ckpt.sinks.sink import SinkCommitter
from spark_ckpt.spark.mailbox import (
    HeartbeatThread,
    Mailbox,
    Request,
    RequestKind,
    SinkSpec,
    Topology,
    read_topology,
)
from spark_ckpt.spark.run import RestorePoint, RunFiles, SkippedCheckpoint
from spark_ckpt.spark.schedule import CheckpointSchedule, SchedulePause
from spark_ckpt.spark.snapshot_threads import LostWriterScan
from spark_ckpt.spark.source_options import SOURCE_TASK
from spark_ckpt.storage.store import CheckpointStore

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Completed-checkpoint property set on the final checkpoint before a stop.
STOP = "stop"
#: Completed-checkpoint property naming the run whose coordinator took it.
RUN = "run"
#: Completed-checkpoint property set on the final checkpoint of a run that ends for a
#: restart (its source found new channels): why. ``Pipeline.run`` starts the next run.
RESTART = "restart"

#: Builds the committer of a topology's sink: the host is its global committer (driver side).
SinkFactory = Callable[[SinkSpec], SinkCommitter]

#: Recovery discards staged output of earlier runs only: files staged before this host started,
#: less this margin for clock skew between executors and the driver. Files of the starting run
#: (a ``ckpt-sink`` query stages its first micro-batch before the coordinator hears of it) stay.
STAGING_CLOCK_SKEW_MS = 10_000

#: Retention spacing of a host run by a :class:`HostThread` (the source runner's): with
#: checkpoints every second, retention (a statistics write and a commit to the log, with a
#: fresh read of each) runs about every fifth completion instead of after each; subsumed
#: checkpoints stay in the log that long.
HOST_RETAIN_EVERY_MS = 5_000


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
    ) -> None:
        """*pipeline*: the pipeline's name (recorded on savepoints). *retain_every_ms*: the
        coordinator's retention spacing (see
        :class:`~spark_ckpt.runtime.checkpoint_cleaner.CheckpointCleaner`;
        :data:`HOST_RETAIN_EVERY_MS` under a :class:`HostThread`). *run_id*: the run (see
        :mod:`spark_ckpt.spark.run`) this host coordinates. Its topology
        is the run's own, read once by :meth:`start_run`; its tasks answer in the run's
        mailbox box. Without it (a ``ckpt-sink`` query) the host follows the root's shared
        topology, re-read on every poll."""
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
        self._started_ms = self.clock.now_ms()
        self.mailbox = Mailbox(root)
        self.run_mailbox = Mailbox(root, run_id) if run_id else None
        self._lost_writer_scan = LostWriterScan(root, run_id) if run_id else None
        self.topology: Topology | None = None
        self.restore_point: RestorePoint | None = None
        self._restored: CompletedCheckpoint | None = None
        self._aborted: list[int] = []
        self.coordinator: CheckpointCoordinator | None = None
        self._checkpoint_properties: dict[str, str] = {}
        #: The newest checkpoint this host saw complete (its sink commit follows).
        self.last_completed: CompletedCheckpoint | None = None
        self.sink: SinkCommitter | None = None
        self.stopping: CheckpointRequest | None = None
        #: The run's final checkpoint was requested (``Trigger.AvailableNow``).
        self._ending = False
        self.schedule = CheckpointSchedule(root)
        #: Periodic checkpoints are paused (see :mod:`spark_ckpt.spark.schedule`).
        self.paused: SchedulePause | None = None
        #: A stop with drain waiting for the sources to catch up (see :meth:`finish_drain`).
        self.draining: Request | None = None
        self._barriers: list[CheckpointBarrier] = []
        self._committed: set[int] = set()
        #: the sink transactions the acknowledgements carried, for the sink commits
        self._carried = CarriedTransactions()

    # -- TaskGateway -------------------------------------------------------------------------
    def trigger(self, task: TaskId, barrier: CheckpointBarrier) -> None:
        self._barriers.append(barrier)

    def notify_complete(self, task: TaskId, checkpoint_id: int) -> None:
        if checkpoint_id in self._committed:
            return
        self._committed.add(checkpoint_id)
        cp = self.store.get(checkpoint_id)
        self.last_completed = cp
        if self.sink is not None and self.topology is not None:
            commit_checkpoint(self.sink, cp, self.store, self._carried)
        self._carried.forget_upto(checkpoint_id)
        if self.run is not None:
            self._publish_committed(self.run, checkpoint_id)
        if cp.is_savepoint:
            self._export(cp)
        log.info(
            "completed %s %d in %d ms (%d bytes)",
            cp.snapshot_type.value,
            checkpoint_id,
            cp.stats.end_to_end_ms,
            cp.stats.state_bytes,
        )

    def _publish_committed(self, run: RunFiles, checkpoint_id: int) -> None:
        """Tell the run's subtasks on the executors that *checkpoint_id* completed and its
        output is committed (``committed.json``, read before each of their micro-batches:
        its snapshot becomes the base of their next incremental one). A record that cannot
        be written is logged: the subtasks then keep their older base, which is safe."""
        try:
            run.write_committed(checkpoint_id)
        except StoreError as e:
            log.warning("cannot record the completion of checkpoint %d: %s", checkpoint_id, e)

    def _export(self, savepoint: CompletedCheckpoint) -> None:
        """Write the self-contained copy of a completed savepoint into its directory (after
        its sink commit: the copy is what a stop-with-savepoint leaves behind). A failure is
        logged; whoever waits for the copy reports it."""
        directory = savepoint_directory(self.root, savepoint)
        try:
            export_savepoint(
                self.store,
                savepoint,
                directory,
                pipeline=savepoint.properties.get(PIPELINE, self.pipeline),
                max_parallelism=self.config.max_parallelism,
            )
        except StoreError as e:
            log.error(
                "savepoint %d could not be exported to %s: %s",
                savepoint.checkpoint_id,
                directory,
                e,
            )

    def notify_aborted(self, task: TaskId, checkpoint_id: int, reason: str) -> None:
        """Publish the abort to the run's tasks (``aborted.json``, read with their completion
        polls): they stop aligning on the checkpoint and drop its snapshot. Without a run,
        tasks learn of aborts lazily (a newer barrier subsumes the older one)."""
        if checkpoint_id in self._aborted:
            return
        self._aborted.append(checkpoint_id)
        self._carried.forget(checkpoint_id)
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
        )
        return restored

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
        lost = self._lost_writes(coordinator)  # before the acks: see LostWriterScan
        for mailbox in (self.mailbox, self.run_mailbox):
            if mailbox is None:
                continue
            received = mailbox.receive()
            for _, message in received:
                if isinstance(message, AcknowledgeCheckpoint):
                    if any(p.checkpoint_id == message.checkpoint_id for p in coordinator.pending):
                        self._carried.record(message)  # late ones would only linger
                    coordinator.receive_acknowledge(message)
                elif isinstance(message, DeclineCheckpoint):
                    coordinator.receive_decline(message)
                elif isinstance(message, Request):
                    self._on_request(coordinator, message)
            mailbox.delete([name for name, _ in received])
        for decline in lost:
            waiting = {p.checkpoint_id: p.not_yet_acknowledged for p in coordinator.pending}
            if decline.task in waiting.get(decline.checkpoint_id, ()):
                log.warning("declining checkpoint %d: %s", decline.checkpoint_id, decline.reason)
                coordinator.receive_decline(decline)
        self._after_failed_stop(coordinator)
        if tick:
            return self.tick()
        if coordinator.status is CoordinatorStatus.RUNNING:
            coordinator.expire_overdue()
        barriers, self._barriers = self._barriers, []
        return barriers

    def _lost_writes(self, coordinator: CheckpointCoordinator) -> list[DeclineCheckpoint]:
        """The declines of pending checkpoints whose state write on the executors was lost
        with its Python worker after the subtask's last micro-batch (a run's subtasks on the
        executors: :class:`~spark_ckpt.spark.snapshot_threads.LostWriterScan`)."""
        if self._lost_writer_scan is None or coordinator.status is not CoordinatorStatus.RUNNING:
            return []
        waiting = {p.checkpoint_id: p.not_yet_acknowledged for p in coordinator.pending}
        return self._lost_writer_scan.scan({c: t for c, t in waiting.items() if t})

    def _after_failed_stop(self, coordinator: CheckpointCoordinator) -> None:
        """The final checkpoint (or savepoint) of a stop failed: a restart for new channels
        takes it again; a client's stop fails (its client reads the failure, recorded with
        the request's id) and the pipeline goes on, with periodic checkpoints again, as
        Flink's after a failed stop-with-savepoint. The source then reads past the stop's
        positions again (:attr:`stopping` is None)."""
        request = self.stopping
        if request is None or request.status is not RequestStatus.FAILED:
            return
        if coordinator.status is not CoordinatorStatus.RUNNING:
            return
        if RESTART in request.properties:
            log.warning("the final checkpoint of a restart failed (%s); retrying", request.failure)
            self.stopping = coordinator.trigger_checkpoint(dict(request.properties), final=True)
            return
        log.warning(
            "the stop failed (%s): the pipeline goes on; request the stop again", request.failure
        )
        self.stopping = None
        if self.paused is None:
            coordinator.resume_periodic_trigger()

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

    def request_final_checkpoint(self) -> CheckpointRequest | None:
        """Trigger the checkpoint that ends a bounded run (``Trigger.AvailableNow``)."""
        if self.coordinator is None or self.coordinator.status is not CoordinatorStatus.RUNNING:
            return None
        self._ending = True
        self.coordinator.stop_periodic_trigger()
        return self.coordinator.trigger_checkpoint({STOP: "available-now"}, final=True)

    def _on_request(self, coordinator: CheckpointCoordinator, request: Request) -> None:
        if request.expired(self.clock.now_ms()):
            # its client gave up waiting (e.g. a ``stop`` whose CLI timed out before this
            # run started): acting on it now would surprise whoever runs the pipeline now
            log.warning("ignoring expired %s request %s", request.kind.value, request.request_id)
            return
        if request.kind is RequestKind.PAUSE:
            self._pause(coordinator, request)
            return
        if request.kind is RequestKind.RESUME:
            self._resume(coordinator)
            return
        props = {REQUEST_ID: request.request_id, PIPELINE: self.pipeline}
        if self.run_id is not None:
            props[RUN] = self.run_id
        if request.kind is RequestKind.CHECKPOINT:
            coordinator.trigger_checkpoint(props)
        elif request.kind is RequestKind.SAVEPOINT:
            coordinator.trigger_savepoint(request.target, props)
        else:
            coordinator.stop_periodic_trigger()
            if request.drain:
                # the source reader drains the channels first, then calls finish_drain
                self.draining = self.draining or request
                return
            self._trigger_stop(coordinator, request, props)

    def _pause(self, coordinator: CheckpointCoordinator, request: Request) -> None:
        """No periodic checkpoints from now until a resume, in this run and the next ones (the
        record is written first: a client reads it to know the pause took). A record that
        cannot be written leaves the schedule as it was; the client reports it."""
        pause = SchedulePause(request.request_id, self.clock.now_ms())
        try:
            self.schedule.pause(pause)
        except StoreError as e:
            log.error("cannot pause periodic checkpoints: %s", e)
            return
        self.paused = pause
        coordinator.stop_periodic_trigger()
        log.info("periodic checkpoints paused (request %s)", request.request_id)

    def _resume(self, coordinator: CheckpointCoordinator) -> None:
        """Periodic checkpoints again, the first one an interval from now, unless the run is
        stopping or ending (its final checkpoint is under way). Idempotent."""
        try:
            self.schedule.resume()
        except StoreError as e:
            log.error("cannot resume periodic checkpoints: %s", e)
            return
        if self.paused is None:
            return
        self.paused = None
        if self.stopping is None and self.draining is None and not self._ending:
            coordinator.resume_periodic_trigger()
        log.info("periodic checkpoints resumed")

    def _trigger_stop(
        self, coordinator: CheckpointCoordinator, request: Request, props: dict[str, str]
    ) -> None:
        props[STOP] = request.request_id
        self.stopping = (
            coordinator.trigger_savepoint(request.target, props)
            if request.savepoint
            else coordinator.trigger_checkpoint(props, final=True)
        )

    def name_channels(self, names: list[str]) -> None:
        """Source runner: every checkpoint of this run records the source's channel names
        (:data:`~spark_ckpt.sources.kafka_options.CHANNEL_NAMES`), by which the next run
        resumes each channel."""
        from spark_ckpt.sources.kafka_options import CHANNEL_NAMES

        self._checkpoint_properties[CHANNEL_NAMES] = json.dumps(names)
        if self.coordinator is not None:
            self.coordinator.checkpoint_properties.update(self._checkpoint_properties)

    def request_restart(self, reason: str) -> bool:
        """Source runner: the source found channels this run does not read (new Kafka
        partitions). End the run as a stop does, with a final checkpoint, which records
        *reason* (:data:`RESTART`); ``Pipeline.run`` then starts the next run, which reads
        them. False (nothing done) while a stop is under way or when nothing coordinates."""
        coordinator = self.coordinator
        if (
            coordinator is None
            or coordinator.status is not CoordinatorStatus.RUNNING
            or self.stopping is not None
            or self.draining is not None
        ):
            return False
        request_id = f"restart-{uuid.uuid4().hex[:12]}"
        props = {REQUEST_ID: request_id, PIPELINE: self.pipeline, RESTART: reason, STOP: request_id}
        if self.run_id is not None:
            props[RUN] = self.run_id
        coordinator.stop_periodic_trigger()
        self.stopping = coordinator.trigger_checkpoint(props, final=True)
        return True

    def finish_drain(self) -> None:
        """Source runner: the channels reached the positions they had when the draining stop
        request arrived; take its final checkpoint (or savepoint) now. Idempotent."""
        request, self.draining = self.draining, None
        if request is None or self.coordinator is None:
            return
        props = {REQUEST_ID: request.request_id, PIPELINE: self.pipeline}
        if self.run_id is not None:
            props[RUN] = self.run_id
        self._trigger_stop(self.coordinator, request, props)

    def _install(self, topology: Topology) -> None:
        if self.coordinator is not None:
            self.coordinator.shutdown(JobStatus.SUSPENDED)
        self.topology = topology
        self.sink = self.sink_factory(topology.sink) if topology.sink else None
        if self.run is None:
            self.restore_point = None  # a new shared topology restores anew
        coordinator = CheckpointCoordinator(  # takes the lease: fences older coordinators
            self.config,
            self.store,
            self,
            tasks_to_trigger=[SOURCE_TASK],
            tasks_to_ack=[TaskId(topology.vertex, s) for s in range(topology.parallelism)],
            clock=self.clock,
            defer_after_completion=self.defer_after_completion,
            retain_every_ms=self.retain_every_ms,
        )
        coordinator.checkpoint_properties.update(self._checkpoint_properties)
        if self.run is not None:
            self.run.write_lease(coordinator.epoch)
        latest = self._choose_restore_point()
        coordinator.restored_from(latest)
        if self.sink is not None:
            recover_sink(
                self.sink,
                latest,
                self.store,
                staged_before_ms=self._started_ms - STAGING_CLOCK_SKEW_MS,
            )
            if latest is not None:
                self._committed.add(latest.checkpoint_id)
                if self.run is not None:
                    self._publish_committed(self.run, latest.checkpoint_id)
        if self.run is not None and self.restore_point is not None:
            self.run.write_restore_point(self.restore_point)
        self.coordinator = coordinator
        self.coordinator.start()
        try:
            self.paused = self.schedule.paused()
        except StoreError as e:  # checkpoints go on rather than the run failing over it
            log.error("periodic checkpoints run: %s", e)
        if self.paused is not None:
            coordinator.stop_periodic_trigger()
            log.info("periodic checkpoints paused since %d", self.paused.since_ms)
        log.info("coordinator epoch %d for %s", self.coordinator.epoch, topology)

    def latest_completed(self) -> CompletedCheckpoint | None:
        return self.store.latest_completed()

    def shutdown(self, status: JobStatus = JobStatus.SUSPENDED) -> None:
        if self.coordinator is not None:
            self.coordinator.shutdown(status)


class HostThread:
    """Runs a :class:`CoordinatorHost` on its own thread, off Spark's micro-batch path.

    Flink's checkpoint coordinator runs on its own timer thread, never on the data path. In
    the source runner the data path is ``latestOffset``: polling the host there put every
    completion (the checkpoint commit, retention, the global sink commit: Delta commits of
    100-300 ms) into the micro-batch's critical path. Here a daemon thread polls the host
    every *interval_s* — acks, declines, requests, completions — and then, in a separate
    step, applies retention (the host's coordinator defers it: ``defer_after_completion``).
    The polls also expire checkpoints past their timeout (Flink's canceller), so a long
    micro-batch cannot keep its checkpoint alive until the next ``latestOffset``.
    ``latestOffset`` only ticks the coordinator (:meth:`take_barriers`: periodic triggers and
    timeouts, cheap) and takes the barriers, placing them at the channel heads of that
    moment: a periodic checkpoint is triggered when its barriers are injected, as in Flink,
    and its duration counts from there. Barriers of requests (checkpoint/savepoint/stop)
    received by the thread wait in a queue until then.

    Thread safety: every use of the host goes through one lock (:meth:`call`, the polls), so
    the host and its store stay single-threaded; the queue of barriers has a lock of its
    own. An error raised by a poll (tolerable failures exceeded, fenced by another
    coordinator, a bug) stops the thread and is raised again by the next
    :meth:`take_barriers`, failing the query from Spark's own thread."""

    def __init__(self, host: CoordinatorHost, interval_s: float = 0.02) -> None:
        self.host = host
        self.interval_s = interval_s
        self._host_lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._barriers: list[CheckpointBarrier] = []
        self._stopping: CheckpointRequest | None = None
        self._draining = False
        self._last_completed: CompletedCheckpoint | None = None
        #: when a tick may trigger something next, as of the last poll or tick (0: unknown)
        self._due_ms: int | None = 0
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: tells clients a coordinator polls the mailbox (see spark_ckpt.spark.mailbox)
        self.heartbeat = HeartbeatThread(
            host.root,
            host.run_id or f"coordinator-{uuid.uuid4().hex}",
            alive=lambda: self._error is None,
        )

    def start(self) -> None:
        """Start polling (idempotent), and the coordinator's heartbeat."""
        if self._thread is None:
            self.heartbeat.start()
            self._thread = threading.Thread(
                target=self._run, name="spark-ckpt-coordinator", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except BaseException as e:  # handed to Spark's thread (take_barriers)
                log.error("coordinator thread stopped: %s", e)
                self._error = e
                run = self.host.run
                if run is not None and isinstance(e, FencedError):
                    run.write_fatal(f"{type(e).__name__}: {e}")
                return
            self._stop.wait(self.interval_s)

    def _poll(self) -> None:
        with self._host_lock:
            barriers = self.host.poll(tick=False)
            stopping = self.host.stopping
            self._draining = self.host.draining is not None
            self._last_completed = self.host.last_completed
            self._due_ms = self.host.next_trigger_ms()
        self._queue(barriers, stopping)
        with self._host_lock:  # separately: latestOffset may tick in between
            self.host.maintain()

    def _queue(self, barriers: list[CheckpointBarrier], stopping: CheckpointRequest | None) -> None:
        with self._queue_lock:
            self._barriers.extend(barriers)
            self._stopping = stopping

    def call(self, fn: Callable[[CoordinatorHost], T]) -> T:
        """Run *fn* on the host (waits for a poll in progress)."""
        with self._host_lock:
            try:
                return fn(self.host)
            finally:
                self._due_ms = self.host.next_trigger_ms()  # fn may have requested one

    def sync(self) -> None:
        """Wait until a poll in progress has finished — a completion with its global sink
        commit runs inside one — and raise what stopped the polling thread, if anything did."""
        with self._host_lock:
            pass
        if self._error is not None:
            raise self._error

    def take_barriers(self) -> list[CheckpointBarrier]:
        """The barriers triggered since the last call, oldest first; raises what stopped the
        polling thread, if anything did. Starts the thread on first use.

        Ticks the coordinator, except while a poll holds the host (a completion with its
        store and sink commits: 100-300 ms) and, as of the last poll, the tick would trigger
        nothing (no request queued, no periodic checkpoint due): ``latestOffset`` does not
        wait for a completion it has no use for. Only a tick that may trigger waits."""
        if self._error is not None:
            raise self._error
        self.start()
        locked = self._host_lock.acquire(blocking=False)
        if not locked and self._tick_due():
            locked = self._host_lock.acquire()
        if locked:
            try:
                ticked = self.host.tick()
                stopping = self.host.stopping
                self._due_ms = self.host.next_trigger_ms()
            finally:
                self._host_lock.release()
            self._queue(ticked, stopping)
        with self._queue_lock:
            barriers, self._barriers = self._barriers, []
        return barriers

    def _tick_due(self) -> bool:
        """Whether a tick may trigger something now (lock-free: as of the last poll)."""
        due = self._due_ms
        return due is not None and due <= self.host.clock.now_ms()

    @property
    def stopping(self) -> CheckpointRequest | None:
        """The host's stop request as of the last poll (consistent with the barriers
        queued by it)."""
        with self._queue_lock:
            return self._stopping

    @property
    def last_completed(self) -> CompletedCheckpoint | None:
        """The newest checkpoint completed in this run, as of the last poll; read without
        waiting for a poll in progress (a completion's commit takes 100-300 ms)."""
        return self._last_completed

    @property
    def draining(self) -> bool:
        """Whether a stop with drain waits for the channels (as of the last poll)."""
        return self._draining

    def poll_now(self) -> list[CheckpointBarrier]:
        """One poll on the caller's thread, then :meth:`take_barriers`: for callers that
        wait on the coordinator and want no polling delay."""
        if self._error is not None:
            raise self._error
        self._poll()
        return self.take_barriers()  # ticks the coordinator

    def stop(self) -> None:
        """Stop polling and wait for the thread (idempotent); the heartbeat ends."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.heartbeat.stop()


def exit_quietly_if_channel_closed() -> None:
    """Source runner, from the stream reader's ``stop()``: end the process without a trace
    when the JVM closed the runner's channel.

    Spark stops a query's source runner by closing its socket; the runner's loop then reads
    end-of-file, calls ``reader.stop()`` in a ``finally`` and would print the ``EOFError``'s
    stack trace to the job's console while the JVM is killing it. A user who stops a pipeline
    must see no stack trace, so once the coordinator's thread has stopped, a stop caused by
    that end-of-file exits here with status 0 (the runner exits anyway; nothing of ours is
    left to run). Any other exception propagates to Spark as before.
    """
    if isinstance(sys.exc_info()[1], EOFError):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)

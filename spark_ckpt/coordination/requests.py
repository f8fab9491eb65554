"""What the coordinator's host does with the requests of clients and of the source runner:
checkpoints and savepoints now, stops (with a savepoint, with a drain), pauses and resumes of
the periodic checkpoints, the final checkpoint of a bounded run and of a restart for new
channels.

:class:`RunControl` holds where the run stands — stopping, draining, paused, ending — as
Flink's coordinator holds its stop-with-savepoint and scheduler state. It runs on the host's
thread, against the host's :class:`~spark_ckpt.runtime.coordinator.CheckpointCoordinator`.
"""

from __future__ import annotations

import logging
import uuid

from spark_ckpt.coordination.messages import Request, RequestKind
from spark_ckpt.coordination.schedule import CheckpointSchedule, SchedulePause
from spark_ckpt.errors import StoreError
from spark_ckpt.protocol.clock import Clock
from spark_ckpt.runtime.checkpoint_cleaner import REQUEST_ID
from spark_ckpt.runtime.coordinator import (
    CheckpointCoordinator,
    CheckpointRequest,
    CoordinatorStatus,
    RequestStatus,
)
from spark_ckpt.runtime.restore_settings import PIPELINE

log = logging.getLogger(__name__)

#: Completed-checkpoint property set on the final checkpoint before a stop.
STOP = "stop"
#: Completed-checkpoint property naming the run whose coordinator took it.
RUN = "run"
#: Completed-checkpoint property set on the final checkpoint of a run that ends for a
#: restart (its source found new channels): why. ``Pipeline.run`` starts the next run.
RESTART = "restart"


class RunControl:
    """The requests of one host's run (*run_id*; ``None`` for a ``ckpt-sink`` query) of
    pipeline *pipeline*, acted on against the host's coordinator; *schedule* records pauses
    for later runs. Single-threaded (the host's thread)."""

    def __init__(
        self, schedule: CheckpointSchedule, clock: Clock, *, pipeline: str, run_id: str | None
    ) -> None:
        self.schedule = schedule
        self.clock = clock
        self.pipeline = pipeline
        self.run_id = run_id
        #: The final checkpoint (or savepoint) of a stop or a restart, once triggered.
        self.stopping: CheckpointRequest | None = None
        #: A stop with drain waiting for the sources to catch up (see :meth:`finish_drain`).
        self.draining: Request | None = None
        #: Periodic checkpoints are paused (see :mod:`spark_ckpt.coordination.schedule`).
        self.paused: SchedulePause | None = None
        #: The run's final checkpoint was requested (``Trigger.AvailableNow``).
        self._ending = False

    def _properties(self, request_id: str) -> dict[str, str]:
        props = {REQUEST_ID: request_id, PIPELINE: self.pipeline}
        if self.run_id is not None:
            props[RUN] = self.run_id
        return props

    def started(self, coordinator: CheckpointCoordinator) -> None:
        """A coordinator started: periodic checkpoints stay off while the root's schedule
        says they are paused. A record that cannot be read leaves them on."""
        try:
            self.paused = self.schedule.paused()
        except StoreError as e:  # checkpoints go on rather than the run failing over it
            log.error("periodic checkpoints run: %s", e)
        if self.paused is not None:
            coordinator.stop_periodic_trigger()
            log.info("periodic checkpoints paused since %d", self.paused.since_ms)

    def on_request(self, coordinator: CheckpointCoordinator, request: Request) -> None:
        """Act on a client's *request* (ignored once expired: its client gave up)."""
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
        props = self._properties(request.request_id)
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

    def after_failed_stop(self, coordinator: CheckpointCoordinator) -> None:
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

    def final_checkpoint(self, coordinator: CheckpointCoordinator) -> CheckpointRequest:
        """Trigger the checkpoint that ends a bounded run (``Trigger.AvailableNow``)."""
        self._ending = True
        coordinator.stop_periodic_trigger()
        return coordinator.trigger_checkpoint({STOP: "available-now"}, final=True)

    def restart(self, coordinator: CheckpointCoordinator, reason: str) -> bool:
        """End the run as a stop does, with a final checkpoint recording *reason*
        (:data:`RESTART`); ``Pipeline.run`` then starts the next run. False (nothing done)
        while a stop is under way."""
        if self.stopping is not None or self.draining is not None:
            return False
        request_id = f"restart-{uuid.uuid4().hex[:12]}"
        props = self._properties(request_id)
        props[RESTART] = reason
        props[STOP] = request_id
        coordinator.stop_periodic_trigger()
        self.stopping = coordinator.trigger_checkpoint(props, final=True)
        return True

    def finish_drain(self, coordinator: CheckpointCoordinator) -> None:
        """The channels reached the positions they had when the draining stop request
        arrived: take its final checkpoint (or savepoint) now. Idempotent."""
        request, self.draining = self.draining, None
        if request is None:
            return
        self._trigger_stop(coordinator, request, self._properties(request.request_id))

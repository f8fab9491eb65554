"""The restart loop of :meth:`Pipeline.run <spark_ckpt.pipeline.pipeline.Pipeline.run>`:
supervise a run until it ends, is stopped, or fails; after a failure start a new run as the
restart strategy allows (Flink's ``RestartBackoffTimeStrategy``), each restoring from the
latest completed checkpoint that verifies.

Runs in the user's driver process (the Spark Connect client under Connect). It talks to the
runs' coordinators only through the pipeline's client and run files: a stop request from the
CLI or another notebook is seen as a completed checkpoint carrying the stop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from spark_ckpt.coordination.requests import RESTART, RUN, STOP
from spark_ckpt.coordination.runs import Runs, RunState
from spark_ckpt.errors import (
    PipelineFailedError,
    PipelineFencedError,
    SourceError,
    SparkCkptError,
)
from spark_ckpt.pipeline.failure_summary import failure_summary
from spark_ckpt.pipeline.pipeline_run import PipelineRun, RunOwner, end_job
from spark_ckpt.pipeline.reporter import CheckpointReporter
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import SystemClock
from spark_ckpt.runtime.checkpoint_cleaner import REQUEST_ID
from spark_ckpt.runtime.coordinator import JobStatus
from spark_ckpt.runtime.restart import RestartTracker

log = logging.getLogger(__name__)


class StopReason(StrEnum):
    FINISHED = "finished"  # the query ended by itself (Trigger.AvailableNow)
    DURATION = "duration"
    INTERRUPT = "interrupt"  # Ctrl-C
    STOP = "stop"  # a stop request (CLI, another notebook) or PipelineRun.stop()

    @property
    def description(self) -> str:
        return _STOP_DESCRIPTIONS[self]


_STOP_DESCRIPTIONS = {
    StopReason.FINISHED: "finished (the available input was processed)",
    StopReason.DURATION: "stopped (duration reached)",
    StopReason.INTERRUPT: "stopped by Ctrl-C",
    StopReason.STOP: "stopped by a stop request",
}


@dataclass(frozen=True, repr=False)
class RunResult:
    """How :meth:`Pipeline.run <spark_ckpt.pipeline.pipeline.Pipeline.run>` ended. ``str()``
    is a summary of a few lines, ``repr()`` one line; the fields hold the details."""

    restarts: int
    last_checkpoint: CompletedCheckpoint | None
    stopped_by: StopReason
    #: The checkpoint each attempt restored from (None: started empty), in order.
    restored_from: tuple[int | None, ...] = ()
    #: The failures that caused restarts, in order.
    failures: tuple[str, ...] = field(default=())
    #: Checkpoints and savepoints completed during the call.
    checkpoints_completed: int = 0
    #: Checkpoints that failed or were aborted during the call (on record, see
    #: :meth:`PipelineClient.failures <spark_ckpt.client.pipeline_client.PipelineClient.failures>`).
    checkpoints_failed: int = 0
    #: Input rows covered by the call's checkpoints: the source positions of the last
    #: checkpoint less those of the checkpoint the first run restored from (0: started empty).
    rows: int = 0
    #: Wall-clock seconds the call ran.
    duration_s: float = 0.0

    def __str__(self) -> str:
        last = self.last_checkpoint
        lines = [
            f"pipeline run {self.stopped_by.description} after {self.duration_s:.1f} s",
            f"  checkpoints: {self.checkpoints_completed} completed, "
            f"{self.checkpoints_failed} failed; last: "
            + (f"{last.checkpoint_id} ({last.snapshot_type.value})" if last else "none"),
            f"  input rows covered by checkpoints: {self.rows:,}",
            f"  restarts: {self.restarts}; restored from: "
            + ", ".join("nothing" if r is None else str(r) for r in self.restored_from),
        ]
        if self.failures:
            lines.append(f"  last failure: {self.failures[-1]}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        last = self.last_checkpoint
        return (
            f"RunResult(stopped_by={self.stopped_by.value!r}, "
            f"checkpoints_completed={self.checkpoints_completed}, "
            f"checkpoints_failed={self.checkpoints_failed}, "
            f"last_checkpoint={last.checkpoint_id if last else None}, rows={self.rows}, "
            f"restarts={self.restarts}, duration_s={self.duration_s:.1f})"
        )


class RunSupervisor:
    """Runs attempts of one job until it ends: *start(n)* starts attempt *n* as a new run."""

    def __init__(
        self,
        pipeline: RunOwner,
        start: Callable[[int], PipelineRun],
        *,
        duration_s: float | None = None,
        on_checkpoint: Callable[[CompletedCheckpoint], None] | None = None,
        on_stop: Callable[[StopReason], None] | None = None,
        poll_s: float = 0.5,
        start_from: CompletedCheckpoint | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.start = start
        self.started = time.monotonic()
        self.deadline = None if duration_s is None else self.started + duration_s
        self.reporter = CheckpointReporter(pipeline.client, on_checkpoint)
        self.on_stop = on_stop
        self.poll_s = poll_s
        self.start_rows = _rows(start_from)

    def on_interrupt(self) -> None:
        """Ctrl-C was pressed (called at once, on a thread of its own, see
        :class:`~spark_ckpt.pipeline.interrupts.Interrupts`): tell *on_stop*."""
        if self.on_stop is not None:
            self.on_stop(StopReason.INTERRUPT)

    def _result(
        self,
        restarts: int,
        last: CompletedCheckpoint | None,
        reason: StopReason,
        restored: list[int | None],
        failures: list[str],
    ) -> RunResult:
        try:
            failed = sum(
                f.checkpoint_id > self.reporter.baseline for f in self.pipeline.client.failures()
            )
        except SparkCkptError as e:  # a summary figure never fails the run's result
            log.debug("counting failed checkpoints: %s", e)
            failed = 0
        return RunResult(
            restarts,
            last,
            reason,
            tuple(restored),
            tuple(failures),
            checkpoints_completed=self.reporter.count,
            checkpoints_failed=failed,
            rows=max(0, _rows(last) - self.start_rows) if last is not None else 0,
            duration_s=time.monotonic() - self.started,
        )

    def run(self, interrupted: threading.Event) -> RunResult:
        """Run until the job ends; *interrupted* is set on Ctrl-C (see
        :class:`~spark_ckpt.pipeline.interrupts.Interrupts`)."""
        from pyspark.errors import StreamingQueryException

        pipeline = self.pipeline
        tracker = RestartTracker(pipeline.config.restart_strategy, SystemClock())
        restored: list[int | None] = []
        failures: list[str] = []
        attempt = 0
        while True:
            attempt += 1
            try:
                run = self.start(attempt)
            except KeyboardInterrupt:  # Ctrl-C while a run starts: nothing runs yet
                last = pipeline.client.latest()
                return self._result(attempt - 1, last, StopReason.INTERRUPT, restored, failures)
            except SourceError as e:  # the source cannot be reached now: a failed run
                failure = f"{type(e).__name__}: {e}"
                failures.append(failure)
                self._restart_or_fail(tracker, attempt, failure)
                continue
            try:
                reason, last = self._supervise(run, interrupted)
            except KeyboardInterrupt:
                last = run.stop_quietly()
                reason = StopReason.INTERRUPT
            except StreamingQueryException as e:
                failure = failure_summary(e)
                restored.append(run.restored_from)
                run.retire()
                fatal = self._fatal(run)
                if fatal is not None:
                    run.report(RunState.FENCED, error=fatal)
                    what = (
                        "was taken over by another driver, or cannot restore"
                        if fatal.startswith("FencedError")
                        else "cannot restore its state"
                    )
                    raise PipelineFencedError(
                        f"pipeline {pipeline.name!r} {what}: {fatal}"
                    ) from None
                run.report(RunState.FAILED, error=failure)
                failures.append(failure)
                self._restart_or_fail(tracker, attempt, failure)
                continue
            restored.append(run.restored_from)
            run.retire()
            if reason is None:  # the run ended for a restart: its source found new channels
                continue
            self.reporter.report()
            return self._result(attempt - 1, last, reason, restored, failures)

    def _restart_or_fail(self, tracker: RestartTracker, attempt: int, failure: str) -> None:
        """Run *attempt* failed: wait as the restart strategy says before the next one, or
        raise :class:`PipelineFailedError` when it allows no more."""
        decision = tracker.record_failure(failure)
        if not decision.restart:
            end_job(self.pipeline, JobStatus.FAILED)
            raise PipelineFailedError(
                f"pipeline {self.pipeline.name!r} failed: {decision.reason}"
            ) from None
        log.warning(
            "run %d failed, next run in %d ms: %s", attempt, decision.delay_ms, decision.reason
        )
        time.sleep(decision.delay_ms / 1000)

    def _supervise(
        self, run: PipelineRun, interrupted: threading.Event
    ) -> tuple[StopReason | None, CompletedCheckpoint | None]:
        """Watch one run until it ends or is stopped; raises what failed its query. The reason is
        None when the run ended for a restart (:data:`~spark_ckpt.coordination.host.RESTART`: its
        source found new channels, e.g. Kafka partitions): the next run reads them."""
        query = run.query
        while query.isActive:
            if interrupted.is_set():
                return StopReason.INTERRUPT, run.stop_quietly()
            query.awaitTermination(self.poll_s)  # type: ignore[arg-type]  # float seconds work
            for cp in self.reporter.report():
                if STOP in cp.properties and cp.properties.get(RUN) == run.run_id:
                    # a stop request from outside (CLI): its final checkpoint completed
                    run.finish_stop(cp, str(cp.properties.get(REQUEST_ID)))
                    if RESTART in cp.properties:
                        log.info(
                            "run %s ended for a restart: %s", run.run_id, cp.properties[RESTART]
                        )
                        return None, cp
                    return StopReason.STOP, cp
            if self.deadline is not None and time.monotonic() >= self.deadline:
                if self.on_stop is not None:
                    self.on_stop(StopReason.DURATION)
                return StopReason.DURATION, run.stop_quietly()
        # raises if it failed; the batch with the final barrier was processed before its
        # foreachBatch call returned, wherever that ran (the driver, or Connect's server)
        query.awaitTermination()
        run.report(RunState.FINISHED, restored_from=run.restored_from)
        return StopReason.FINISHED, self.pipeline.client.latest()

    def _fatal(self, run: PipelineRun) -> str | None:
        """Why *run* failed beyond what a restart can mend: its coordinator said so
        (fenced, no restorable checkpoint), or a coordinator of another driver holds a newer
        lease than any run of this driver."""
        fatal = run.files.fatal()
        if fatal is not None:
            return fatal
        newest = Runs(self.pipeline.root).newest_lease()
        if newest is not None and not self.pipeline.owns_run(newest.run_id):
            return (
                f"FencedError: run {newest.run_id} of another driver holds the coordinator "
                f"lease (epoch {newest.epoch})"
            )
        return None


def _rows(checkpoint: CompletedCheckpoint | None) -> int:
    """Input rows before *checkpoint*'s source positions (0 for none)."""
    return 0 if checkpoint is None else sum(checkpoint.offsets().values())

"""The restart loop of :meth:`Pipeline.run <spark_ckpt.spark.pipeline.Pipeline.run>`:
supervise a run until it ends, is stopped, or fails; after a failure start a new run as the
restart strategy allows (Flink's ``RestartBackoffTimeStrategy``), each restoring from the
latest completed checkpoint that verifies.

Runs in the user's driver process (the Spark Connect client under Connect). It talks to the
runs' coordinators only through the pipeline's client and run files: a stop request from the
CLI or another notebook is seen as a completed checkpoint carrying the stop.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from spark_ckpt.errors import (
    PipelineFailedError,
    PipelineFencedError,
    SourceError,
    SparkCkptError,
)
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import SystemClock
from spark_ckpt.runtime.checkpoint_cleaner import REQUEST_ID
from spark_ckpt.runtime.coordinator import JobStatus
from spark_ckpt.runtime.restart import RestartTracker
from spark_ckpt.spark.host import RESTART, RUN, STOP
from spark_ckpt.spark.pipeline_run import PipelineRun, end_job
from spark_ckpt.spark.run import Runs, RunState

if TYPE_CHECKING:
    from spark_ckpt.spark.client import PipelineClient
    from spark_ckpt.spark.pipeline import Pipeline

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
    """How :meth:`Pipeline.run <spark_ckpt.spark.pipeline.Pipeline.run>` ended. ``str()``
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
    #: :meth:`PipelineClient.failures <spark_ckpt.spark.client.PipelineClient.failures>`).
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
        pipeline: Pipeline,
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
        :class:`Interrupts`): tell *on_stop*."""
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
        """Run until the job ends; *interrupted* is set on Ctrl-C (see :class:`Interrupts`)."""
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
        """Watch one run until it ends or is stopped; raises what failed its query. The
        reason is None when the run ended for a restart (:data:`~spark_ckpt.spark.host.RESTART`:
        its source found new channels, e.g. Kafka partitions): the next run reads them."""
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


#: The last line of a Python traceback: ``module.path.ErrorName: message``.
_PYTHON_ERROR = re.compile(r"^((?:[a-z_]\w*\.)*)([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*): (.*)$")


#: A frame of Spark's driver side of the source runner (``PythonStreamingSourceRunner``).
_RUNNER_FRAME = re.compile(r"PythonStreamingSourceRunner\.(\w+)")
#: A Java exception line of a stack trace (``java.io.EOFException``, ``Caused by: …``).
_JAVA_ERROR = re.compile(
    r"^(?:Caused by: )?(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Exception|Error))\b", re.MULTILINE
)


def failure_summary(error: BaseException, limit: int = 500) -> str:
    """The user-facing cause of a failed query, from Spark's message (a foreachBatch or
    data source error carries the Python traceback): the last error of spark-ckpt's own
    (``spark_ckpt.*``: what a user operator's failure or an injected fault is wrapped in is
    not, so the last Python error line otherwise); else, when Spark's source runner died (its
    message then names no cause, only the query), that; else the message's first line. The
    query's description that Spark appends (``=== Streaming Query ===``, ``Identifier: …``,
    the plan) is not part of the cause."""
    text = str(error).split("\n=== Streaming Query ===", 1)[0]
    lines = [m for line in text.splitlines() if (m := _PYTHON_ERROR.match(line))]
    ours = [m for m in lines if m.group(1).startswith("spark_ckpt.")]
    python = [m for m in lines if not m.group(1).startswith(("org.", "java.", "scala."))]
    candidates = ours or python
    if not candidates:
        runner = _source_runner_died(error)
        if runner is not None:
            return runner[:limit]
        return (text.splitlines()[0] if text else repr(error))[:limit]
    return f"{candidates[-1].group(2)}: {candidates[-1].group(3)}"[:limit]


def _source_runner_died(error: BaseException) -> str | None:
    """What failed when the JVM lost Spark's Python source runner (the process running the
    source's ``latestOffset``, ``partitions`` and ``commit``: killed, out of memory): read
    from the JVM stack trace pyspark keeps with the error. None for any other failure."""
    trace = str(getattr(error, "_stackTrace", None) or "")
    frame = _RUNNER_FRAME.search(trace)
    if frame is None:
        return None
    java = _JAVA_ERROR.search(trace)
    how = java.group(1) if java else "an error"
    return (
        "Spark's Python source runner (the process running the source's latestOffset, "
        f"partitions and commit) ended unexpectedly: {how} in "
        f"PythonStreamingSourceRunner.{frame.group(1)}"
    )


class CheckpointReporter:
    """Counts the checkpoints that complete while :meth:`Pipeline.run` supervises, across its
    runs, and hands each to ``on_checkpoint`` once, oldest first.

    Runs in the user's driver, polled every ``poll_s``. Which checkpoints completed comes
    from the statistics history and the log (:meth:`CompletedCheckpoints.completed_ids
    <spark_ckpt.storage.store.CompletedCheckpoints.completed_ids>`): the history records
    every completed checkpoint before retention may remove it, so the count is exact however
    fast checkpoints complete. ``on_checkpoint`` gets the :class:`CompletedCheckpoint`
    (state handles, source offsets) of those retention still keeps at the poll: with
    ``checkpoint.retained`` 1 and an interval shorter than ``poll_s`` a checkpoint may be
    subsumed before the driver looks, and is then counted but not handed over (as Flink's
    completion notifications, best effort for subsumed checkpoints); its figures stay in
    the history."""

    def __init__(
        self,
        client: PipelineClient,
        on_checkpoint: Callable[[CompletedCheckpoint], None] | None,
    ) -> None:
        self.client = client
        self.on_checkpoint = on_checkpoint
        #: The newest id before the first report: later ids are this call's.
        self.baseline = max(self._completed_ids(), default=0)
        #: Checkpoints completed since the baseline, reported or subsumed before a poll.
        self.count = 0
        # the ids counted, within REPORT_WINDOW of the newest: a savepoint may complete after
        # a checkpoint with a higher id (a forced savepoint runs beside checkpoints)
        self._counted: set[int] = set()

    def _completed_ids(self) -> set[int]:
        return set(self.client.store.completed_ids())

    def report(self) -> list[CompletedCheckpoint]:
        """The retained checkpoints completed since the last call (by id), handed to
        ``on_checkpoint``; every newly completed one is counted."""
        completed = self._completed_ids()
        # read after the history: a checkpoint completing in between is in this list
        retained = self.client.checkpoints()
        completed.update(c.checkpoint_id for c in retained)
        newest = max([*completed, *self._counted], default=0)
        floor = max(self.baseline, newest - REPORT_WINDOW)
        fresh = {i for i in completed if i > floor} - self._counted
        self.count += len(fresh)
        self._counted = {i for i in self._counted | fresh if i > floor}
        handed = [c for c in retained if c.checkpoint_id in fresh]
        if self.on_checkpoint is not None:
            for cp in handed:
                self.on_checkpoint(cp)
        return handed


#: How far behind the newest completed checkpoint id a completion is still reported (ids, a
#: bound on the reporter's memory): a savepoint completing after this many newer checkpoints.
REPORT_WINDOW = 10_000


class Interrupts:
    """Ctrl-C while :meth:`Pipeline.run` supervises (main thread only): the first one is
    noted — and *on_interrupt* called at once, on a thread of its own (so that it may print
    while the main thread prints) — and the supervising loop stops the run with a final
    checkpoint at its next poll; a second one raises ``KeyboardInterrupt`` (stop at once).
    Nothing is interrupted in
    between: PySpark's own SIGINT handler cancels every Spark job (failing the micro-batch
    in progress), and a ``KeyboardInterrupt`` raised inside a Py4J call is logged by Py4J
    with its traceback — dropped meanwhile (:func:`_py4j_interrupt_log`), for the second."""

    def __init__(self, on_interrupt: Callable[[], None] | None = None) -> None:
        self.requested = threading.Event()
        self._on_interrupt = on_interrupt
        self._previous: Any = None

    def _on_sigint(self, signum: int, frame: object) -> None:
        self.requested.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next one is forceful
        if self._on_interrupt is not None:
            threading.Thread(target=self._on_interrupt, name="on-interrupt", daemon=True).start()

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            for name in _PY4J_INTERRUPT_LOGGERS:
                logging.getLogger(name).addFilter(_py4j_interrupt_log)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        for name in _PY4J_INTERRUPT_LOGGERS:
            logging.getLogger(name).removeFilter(_py4j_interrupt_log)


#: Where Py4J logs a KeyboardInterrupt in a call (``logging.exception`` on the root logger)
#: and its failed clean-up of the interrupted connection.
_PY4J_INTERRUPT_LOGGERS = ("", "py4j.clientserver")


def _rows(checkpoint: CompletedCheckpoint | None) -> int:
    """Input rows before *checkpoint*'s source positions (0 for none)."""
    return 0 if checkpoint is None else sum(checkpoint.offsets().values())


def _py4j_interrupt_log(record: logging.LogRecord) -> bool:
    """Logger filter: drops Py4J's logs of a KeyboardInterrupt inside a Py4J call."""
    return record.getMessage() not in (
        "KeyboardInterrupt while sending command.",
        "Exception occurred while shutting down connection",
    )

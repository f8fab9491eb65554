"""The user-facing API: a checkpointed streaming pipeline on Spark.

.. code-block:: python

    from spark_ckpt.spark.pipeline import Pipeline
    from spark_ckpt.runtime.operator import RunningCount

    pipeline = Pipeline(spark, "orders", config=CheckpointConfig(interval_ms=1000))
    pipeline.run(
        {"source": "generator", "channels": 4, "rate": 10_000},   # ckpt-source options
        RunningCount("counter", "user_id"),                       # operators
        output="/lake/counts",                                    # exactly-once Delta output
        duration_s=60,
    )

    # stateless, straight into Delta with two-phase commit:
    pipeline.read(source="generator", channels=4).writeStream.format("ckpt-sink") \\
        .option("pipeline", "orders").option("path", "/lake/orders_out").start()

:meth:`Pipeline.run` takes the *description* of the job — source options, operators, output —
never a prebuilt stateful object: every attempt (the first, and each restart the restart
strategy allows) is a new *run* (:mod:`spark_ckpt.spark.run`) that builds its own foreachBatch
function, coordinator and sink recovery, all restoring from the same checkpoint: the latest
completed one whose data verifies. :meth:`Pipeline.start` starts one run and hands back its
:class:`PipelineRun` (the query, stop).

Everything of a pipeline lives under one root (default ``checkpoint.storage`` when set,
else ``./spark-ckpt-data/<name>``): the Delta checkpoint store, the coordinator's mailbox, the
runs' files, and the Spark checkpoint locations of its query runs. Each run gets a fresh
Spark checkpoint location: the truth is the spark-ckpt checkpoint store, from which every run
restores (rewinding the source channels to their barrier positions), as a Flink job restores
from its latest checkpoint.

Runs in the user's driver process. Imports pyspark lazily.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from spark_ckpt.errors import (
    CheckpointError,
    ConfigError,
    PipelineFailedError,
    PipelineFencedError,
    SparkCkptError,
)
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import SystemClock
from spark_ckpt.runtime.aligner import AlignmentMode
from spark_ckpt.runtime.config import CheckpointConfig, CheckpointingMode
from spark_ckpt.runtime.coordinator import JobStatus, discards_checkpoints
from spark_ckpt.runtime.operator import KeyedOperator
from spark_ckpt.runtime.restart import RestartTracker
from spark_ckpt.spark.foreach_batch import AlignerSpec, ForeachBatchFunction
from spark_ckpt.spark.host import REQUEST_ID, RUN, STOP
from spark_ckpt.spark.mailbox import (
    Mailbox,
    Request,
    RequestKind,
    SinkSpec,
    Topology,
    write_topology,
)
from spark_ckpt.spark.run import RunFiles, Runs, RunState, RunStatus, new_run_id
from spark_ckpt.spark.source_options import SourceOptions, default_root

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from spark_ckpt.delta.store import DeltaCheckpointStore

Source = Mapping[str, object]
Operators = KeyedOperator | Sequence[KeyedOperator]

log = logging.getLogger(__name__)


def register_data_sources(spark: SparkSession) -> None:
    """Register ``ckpt-source`` and ``ckpt-sink`` explicitly (auto-registration needs the
    ``pyspark_*`` shims on the workers' path; this works everywhere)."""
    from datasources.sink import CkptSink
    from datasources.source import CkptSource

    spark.dataSource.register(CkptSource)
    spark.dataSource.register(CkptSink)


def alignment_mode(config: CheckpointConfig) -> tuple[AlignmentMode, int]:
    """The aligner mode and aligned-checkpoint timeout that implement *config*."""
    if config.mode is CheckpointingMode.AT_LEAST_ONCE:
        return AlignmentMode.AT_LEAST_ONCE, 0
    if config.unaligned and config.aligned_checkpoint_timeout_ms > 0:
        return AlignmentMode.ALIGNED, config.aligned_checkpoint_timeout_ms
    if config.unaligned:
        return AlignmentMode.UNALIGNED, 0
    return AlignmentMode.ALIGNED, 0


#: How long a graceful stop waits for a micro-batch in progress before stopping anyway.
STOP_GRACE_S = 30.0


class StopReason(StrEnum):
    FINISHED = "finished"  # the query ended by itself (Trigger.AvailableNow)
    DURATION = "duration"
    INTERRUPT = "interrupt"  # Ctrl-C
    STOP = "stop"  # a stop request (CLI, another notebook) or PipelineRun.stop()


@dataclass(frozen=True)
class RunResult:
    restarts: int
    last_checkpoint: CompletedCheckpoint | None
    stopped_by: StopReason
    #: The checkpoint each attempt restored from (None: started empty), in order.
    restored_from: tuple[int | None, ...] = ()
    #: The failures that caused restarts, in order.
    failures: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class PreparedRun:
    """A run whose query is not started yet (see :meth:`Pipeline.prepare`)."""

    run_id: str
    dataframe: DataFrame
    function: ForeachBatchFunction
    files: RunFiles


@dataclass
class PipelineRun:
    """One run of a pipeline (see :mod:`spark_ckpt.spark.run`): its Spark query and its
    foreachBatch function. Made by :meth:`Pipeline.start`."""

    pipeline: Pipeline
    run_id: str
    attempt: int
    query: StreamingQuery
    function: ForeachBatchFunction
    files: RunFiles

    @property
    def restored_from(self) -> int | None:
        point = self.files.restore_point()
        return None if point is None else point.checkpoint_id

    def stop(
        self, *, savepoint: bool = False, timeout_s: float = 120.0
    ) -> CompletedCheckpoint | None:
        """Stop with a final checkpoint (or savepoint); see :meth:`Pipeline.stop`."""
        return self.pipeline.stop(self, savepoint=savepoint, timeout_s=timeout_s)

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait for the query to end; raises Spark's ``StreamingQueryException`` if it
        failed. Returns whether it ended."""
        if timeout_s is None:
            self.query.awaitTermination()
            return True
        return bool(self.query.awaitTermination(timeout_s))  # type: ignore[arg-type]

    def report(self, state: RunState, **fields: object) -> None:
        self.files.write_status(
            RunStatus(
                self.run_id,
                self.pipeline.driver_id,
                state,
                self.attempt,
                SystemClock().now_ms(),
                **fields,  # type: ignore[arg-type]
            )
        )

    def retire(self) -> None:
        """After the query ended: end the function's runtime and remove the run's mailbox
        box. Idempotent."""
        self.function.retire()
        try:
            Mailbox(self.pipeline.root, self.run_id).remove_box()
        except SparkCkptError as e:
            log.debug("removing the mailbox of run %s: %s", self.run_id, e)


class Pipeline:
    """One checkpointed pipeline: a name, a root, a checkpoint configuration. Runs in the
    user's driver process."""

    def __init__(
        self,
        spark: SparkSession,
        name: str,
        *,
        config: CheckpointConfig | None = None,
        root: str | None = None,
    ) -> None:
        """*root*: the pipeline root (checkpoint store, mailbox, runs); by default the
        configuration's ``checkpoint.storage``, else ``./spark-ckpt-data/<name>``."""
        self.spark = spark
        self.name = name
        self.config = config or CheckpointConfig(interval_ms=1000)
        root = root or self.config.checkpoint_storage or default_root(name)
        self.root = root if "://" in root else os.path.abspath(root)
        self.mailbox = Mailbox(self.root)
        self.driver_id = uuid.uuid4().hex
        self._run_ids: set[str] = set()
        self._store: DeltaCheckpointStore | None = None
        register_data_sources(spark)

    @property
    def store(self) -> DeltaCheckpointStore:
        if self._store is None:
            from spark_ckpt.delta.store import DeltaCheckpointStore

            self._store = DeltaCheckpointStore(self.root)
        return self._store

    # -- building ---------------------------------------------------------------------------
    def source_options(self, **options: object) -> dict[str, str]:
        opts = {k: str(v) for k, v in options.items()}
        opts.update(self.config.to_options())
        opts.update(pipeline=self.name, store=self.root)
        return opts

    def read(self, **options: object) -> DataFrame:
        """``spark.readStream.format("ckpt-source")`` for this pipeline (for ``ckpt-sink``
        queries); options are validated here, raising
        :class:`~spark_ckpt.errors.ConfigError` naming a bad option."""
        opts = self.source_options(**options)
        SourceOptions.parse(opts)
        return self.spark.readStream.format("ckpt-source").options(**opts).load()

    def prepare(
        self,
        source: Source,
        operators: Operators,
        *,
        output: str,
        parallelism: int = 2,
        vertex: str | None = None,
        pipelined: bool = True,
    ) -> PreparedRun:
        """Everything one run needs before its query starts: a run id, its topology (who
        acknowledges, which sink the coordinator commits), the ``ckpt-source`` DataFrame
        bound to the run, and the run's foreachBatch function. :meth:`start` starts it;
        callers that drive the query themselves (benchmarks) start ``dataframe`` with
        ``function`` (or a wrapper calling it) as the ``foreachBatch`` function."""
        ops = (operators,) if isinstance(operators, KeyedOperator) else tuple(operators)
        if not ops:
            raise ConfigError("operators", (), "at least one KeyedOperator")
        Runs(self.root).prune()
        run_id = new_run_id()
        opts = self.source_options(**source)
        opts["run"] = run_id
        parsed = SourceOptions.parse(opts)
        from datasources.source import open_channel_source

        mode, timeout = alignment_mode(self.config)
        out = output if "://" in output else os.path.abspath(output)
        spec = AlignerSpec(
            root=self.root,
            pipeline=self.name,
            run_id=run_id,
            operators=ops,
            channels=open_channel_source(parsed).channels,
            output=out,
            parallelism=parallelism,
            mode=mode,
            aligned_timeout_ms=timeout,
            max_parallelism=self.config.max_parallelism,
            vertex=vertex or "",
            pipelined=pipelined,
        )
        sink = SinkSpec("delta", out, spec.vertex_name)
        write_topology(self.root, Topology(spec.vertex_name, parallelism, sink, run_id), run_id)
        self._run_ids.add(run_id)
        df = self.spark.readStream.format("ckpt-source").options(**opts).load()
        return PreparedRun(run_id, df, ForeachBatchFunction(spec), RunFiles(self.root, run_id))

    def start(
        self,
        source: Source,
        operators: Operators,
        *,
        output: str,
        parallelism: int = 2,
        vertex: str | None = None,
        pipelined: bool = True,
        available_now: bool = False,
        trigger_s: float | None = None,
        attempt: int = 1,
    ) -> PipelineRun:
        """Start one run: *source* (``ckpt-source`` options) through *operators* (keyed
        state, aligned as configured) into the Delta table *output*, exactly-once. The run
        restores from the latest completed checkpoint whose data verifies (chosen by its
        coordinator when the query starts). *pipelined*: process a micro-batch while Spark
        reads the next (see :class:`~spark_ckpt.spark.batch_aligner.BatchAligner`). A failed run
        is not restarted: :meth:`run` does that."""
        prepared = self.prepare(
            source,
            operators,
            output=output,
            parallelism=parallelism,
            vertex=vertex,
            pipelined=pipelined,
        )
        writer = prepared.dataframe.writeStream.foreachBatch(prepared.function).option(
            "checkpointLocation", self.spark_checkpoint_location()
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        elif trigger_s is not None:
            writer = writer.trigger(processingTime=f"{trigger_s} seconds")
        query = writer.queryName(f"{self.name}-{prepared.run_id[:6]}").start()
        run = PipelineRun(self, prepared.run_id, attempt, query, prepared.function, prepared.files)
        run.report(RunState.RUNNING)
        return run

    def spark_checkpoint_location(self) -> str:
        return os.path.join(self.root, "_spark", uuid.uuid4().hex)

    # -- running ------------------------------------------------------------------------------
    def run(
        self,
        source: Source,
        operators: Operators,
        *,
        output: str,
        parallelism: int = 2,
        vertex: str | None = None,
        pipelined: bool = True,
        available_now: bool = False,
        trigger_s: float | None = None,
        duration_s: float | None = None,
        on_checkpoint: Callable[[CompletedCheckpoint], None] | None = None,
        poll_s: float = 0.5,
    ) -> RunResult:
        """Run the pipeline (see :meth:`start` for the job's arguments) until the query
        finishes (``available_now``), *duration_s* passes, Ctrl-C, or a stop request (CLI
        ``spark-ckpt stop``, :meth:`request`) — the last three stop with a final checkpoint.
        A failed run is followed by a new run, restoring from the latest completed
        checkpoint, as the restart strategy allows; beyond it
        :class:`~spark_ckpt.errors.PipelineFailedError` carrying the strategy's reason and
        the last failure. A pipeline taken over by another driver raises
        :class:`~spark_ckpt.errors.PipelineFencedError` at once (no restart)."""

        def start(attempt: int) -> PipelineRun:
            return self.start(
                source,
                operators,
                output=output,
                parallelism=parallelism,
                vertex=vertex,
                pipelined=pipelined,
                available_now=available_now,
                trigger_s=trigger_s,
                attempt=attempt,
            )

        with _Interrupts() as interrupts:
            return self._run(start, interrupts, duration_s, on_checkpoint, poll_s)

    def _run(
        self,
        start: Callable[[int], PipelineRun],
        interrupts: _Interrupts,
        duration_s: float | None,
        on_checkpoint: Callable[[CompletedCheckpoint], None] | None,
        poll_s: float,
    ) -> RunResult:
        """:meth:`run`'s loop: *start* starts attempt *n* as a new run."""
        from pyspark.errors import StreamingQueryException

        tracker = RestartTracker(self.config.restart_strategy, SystemClock())
        deadline = None if duration_s is None else time.monotonic() + duration_s
        reporter = _Reporter(self, on_checkpoint)
        restored: list[int | None] = []
        failures: list[str] = []
        attempt = 0
        while True:
            attempt += 1
            try:
                run = start(attempt)
            except KeyboardInterrupt:  # Ctrl-C while a run starts: nothing runs yet
                last = self.store.latest_completed()
                return RunResult(
                    attempt - 1, last, StopReason.INTERRUPT, tuple(restored), tuple(failures)
                )
            try:
                reason, last = self._supervise(
                    run, deadline, reporter, poll_s, interrupts.requested
                )
            except KeyboardInterrupt:
                last = self._stop_quietly(run)
                reason = StopReason.INTERRUPT
            except StreamingQueryException as e:
                failure = _failure_summary(e)
                restored.append(run.restored_from)
                run.retire()
                fatal = self._fatal(run)
                if fatal is not None:
                    run.report(RunState.FENCED, error=fatal)
                    raise PipelineFencedError(
                        f"pipeline {self.name!r} was taken over by another driver, or cannot "
                        f"restore: {fatal}"
                    ) from None
                run.report(RunState.FAILED, error=failure)
                failures.append(failure)
                decision = tracker.record_failure(failure)
                if not decision.restart:
                    self._end_job(JobStatus.FAILED)
                    raise PipelineFailedError(
                        f"pipeline {self.name!r} failed: {decision.reason}"
                    ) from None
                log.warning(
                    "run %d failed, next run in %d ms: %s",
                    attempt,
                    decision.delay_ms,
                    decision.reason,
                )
                time.sleep(decision.delay_ms / 1000)
                continue
            restored.append(run.restored_from)
            run.retire()
            reporter.report()
            return RunResult(attempt - 1, last, reason, tuple(restored), tuple(failures))

    def _supervise(
        self,
        run: PipelineRun,
        deadline: float | None,
        reporter: _Reporter,
        poll_s: float,
        interrupted: threading.Event,
    ) -> tuple[StopReason, CompletedCheckpoint | None]:
        """Watch one run until it ends or is stopped; raises what failed its query."""
        query = run.query
        while query.isActive:
            if interrupted.is_set():
                return StopReason.INTERRUPT, self._stop_quietly(run)
            query.awaitTermination(poll_s)  # type: ignore[arg-type]  # float seconds work
            for cp in reporter.report():
                if STOP in cp.properties and cp.properties.get(RUN) == run.run_id:
                    # a stop request from outside (CLI): its final checkpoint completed
                    self._finish_stop(run, cp, str(cp.properties.get(REQUEST_ID)))
                    return StopReason.STOP, cp
            if deadline is not None and time.monotonic() >= deadline:
                return StopReason.DURATION, self._stop_quietly(run)
        query.awaitTermination()  # raises if it failed
        run.function.drain()
        run.report(RunState.FINISHED, restored_from=run.restored_from)
        return StopReason.FINISHED, self.store.latest_completed()

    def _fatal(self, run: PipelineRun) -> str | None:
        """Why *run* failed beyond what a restart can mend: its coordinator said so
        (fenced, no restorable checkpoint), or a coordinator of another driver holds a newer
        lease than any run of this driver."""
        fatal = run.files.fatal()
        if fatal is not None:
            return fatal
        newest = Runs(self.root).newest_lease()
        if newest is not None and newest.run_id not in self._run_ids:
            return (
                f"FencedError: run {newest.run_id} of another driver holds the coordinator "
                f"lease (epoch {newest.epoch})"
            )
        return None

    # -- requests (from a notebook, the CLI, or run()) ------------------------------------
    def request(
        self,
        kind: RequestKind,
        target: str | None = None,
        savepoint: bool = False,
        timeout_s: float = 120.0,
    ) -> str:
        """Post a request to the running coordinator; it expires after *timeout_s* (a
        client that stopped waiting leaves nothing for a later run)."""
        request_id = uuid.uuid4().hex
        expires = SystemClock().now_ms() + int(timeout_s * 1000)
        self.mailbox.post(Request(request_id, kind, target, savepoint, expires))
        return request_id

    def wait_for(self, request_id: str, timeout_s: float = 120.0) -> CompletedCheckpoint:
        """Wait until the checkpoint answering *request_id* completed. Raises
        :class:`CheckpointError` on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for cp in self.store.list_completed():
                if cp.properties.get(REQUEST_ID) == request_id:
                    return cp
            time.sleep(0.2)
        raise CheckpointError(f"no checkpoint answered request {request_id} within {timeout_s} s")

    def checkpoint(self, timeout_s: float = 120.0) -> CompletedCheckpoint:
        return self.wait_for(self.request(RequestKind.CHECKPOINT, timeout_s=timeout_s), timeout_s)

    def savepoint(self, target: str | None = None, timeout_s: float = 120.0) -> CompletedCheckpoint:
        return self.wait_for(
            self.request(RequestKind.SAVEPOINT, target, timeout_s=timeout_s), timeout_s
        )

    def stop(
        self, run: PipelineRun, *, savepoint: bool = False, timeout_s: float = 120.0
    ) -> CompletedCheckpoint | None:
        """Stop *run* with a final checkpoint (or savepoint): request it, wait until it
        completed and its output is committed, then stop the query without interrupting a
        micro-batch. Returns it (the latest completed checkpoint if the query had ended)."""
        if not run.query.isActive:
            run.retire()
            return self.store.latest_completed()
        request_id = self.request(RequestKind.STOP, savepoint=savepoint, timeout_s=timeout_s)
        final = self.wait_for(request_id, timeout_s)
        self._finish_stop(run, final, request_id)
        return final

    def _stop_quietly(self, run: PipelineRun) -> CompletedCheckpoint | None:
        """A stop on the user's behalf (duration, Ctrl-C): with a final checkpoint when the
        query still runs; never a stack trace."""
        try:
            return self.stop(run)
        except KeyboardInterrupt:  # a second Ctrl-C: stop now, without a final checkpoint
            _stop_query(run.query)
            run.retire()
            run.report(RunState.STOPPED, restored_from=run.restored_from)
            return self.store.latest_completed()

    def _finish_stop(self, run: PipelineRun, final: CompletedCheckpoint, request_id: str) -> None:
        """The final checkpoint of a stop completed: wait for its sink commit, let the
        micro-batch in progress end (the source emits nothing after the final barrier), stop
        the query, end the runtime, apply externalized retention."""
        run.report(RunState.STOPPING, restored_from=run.restored_from, stop_request=request_id)
        self._wait_committed(final)
        run.function.drain()
        _stop_query(run.query)
        run.retire()
        self._end_job(JobStatus.FINISHED if final.is_savepoint else JobStatus.CANCELED)
        run.report(RunState.STOPPED, restored_from=run.restored_from, stop_request=request_id)

    def _end_job(self, status: JobStatus) -> None:
        """Externalized-checkpoint retention for a job that ended with *status* (no run of
        it is active): discard its checkpoints (never savepoints) where configured. A stop
        without savepoint is CANCELED, a stop with savepoint FINISHED (it resumes from the
        savepoint), a failure beyond the restart strategy FAILED. The end of a
        ``Trigger.AvailableNow`` run is no end of the job (the next run resumes from its
        final checkpoint): nothing is discarded then."""
        if not discards_checkpoints(self.config.externalized_retention, status):
            return
        ids = [c.checkpoint_id for c in self.store.list_completed() if not c.is_savepoint]
        if ids:
            self.store.discard(self.store.acquire(), ids)
            log.info("discarded checkpoints %s (%s)", ids, self.config.externalized_retention)

    def _wait_committed(self, checkpoint: CompletedCheckpoint, timeout_s: float = 60.0) -> None:
        """The coordinator commits sink output right after completion; wait for it."""
        from spark_ckpt.spark.mailbox import read_topology

        run_id = checkpoint.properties.get(RUN)
        topology = read_topology(self.root, str(run_id) if run_id else None)
        if topology is None or topology.sink is None:
            return
        from datasources.sink import sink_from_spec

        sink = sink_from_spec(topology.sink, pipeline=self.name)
        deadline = time.monotonic() + timeout_s
        while sink.committed_checkpoint() < checkpoint.checkpoint_id:
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"output of checkpoint {checkpoint.checkpoint_id} was not committed in time"
                )
            time.sleep(0.2)

    def checkpoints(self) -> list[CompletedCheckpoint]:
        return self.store.list_completed()


#: The last line of a Python traceback: ``module.path.ErrorName: message``.
_PYTHON_ERROR = re.compile(r"^((?:[a-z_]\w*\.)*)([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*): (.*)$")


def _failure_summary(error: BaseException, limit: int = 500) -> str:
    """The user-facing cause of a failed query, from Spark's message (a foreachBatch or
    data source error carries the Python traceback): the last error of spark-ckpt's own
    (``spark_ckpt.*``: what a user operator's failure or an injected fault is wrapped in is
    not, so the last Python error line otherwise), else the message's first line."""
    text = str(error)
    lines = [m for line in text.splitlines() if (m := _PYTHON_ERROR.match(line))]
    ours = [m for m in lines if m.group(1).startswith("spark_ckpt.")]
    python = [m for m in lines if not m.group(1).startswith(("org.", "java.", "scala."))]
    candidates = ours or python
    if not candidates:
        return (text.splitlines()[0] if text else repr(error))[:limit]
    return f"{candidates[-1].group(2)}: {candidates[-1].group(3)}"[:limit]


class _Reporter:
    """Hands each newly completed checkpoint to ``on_checkpoint`` once, across runs."""

    def __init__(
        self,
        pipeline: Pipeline,
        on_checkpoint: Callable[[CompletedCheckpoint], None] | None,
    ) -> None:
        self.pipeline = pipeline
        self.on_checkpoint = on_checkpoint
        self.seen = max((c.checkpoint_id for c in pipeline.store.list_completed()), default=0)

    def report(self) -> list[CompletedCheckpoint]:
        """The checkpoints completed since the last call (oldest first), reported."""
        new = [c for c in self.pipeline.store.list_completed() if c.checkpoint_id > self.seen]
        for cp in new:
            self.seen = cp.checkpoint_id
            if self.on_checkpoint is not None:
                self.on_checkpoint(cp)
        return new


class _Interrupts:
    """Ctrl-C while :meth:`Pipeline.run` supervises (main thread only): the first one is
    noted, and the supervising loop stops the run with a final checkpoint at its next poll;
    a second one raises ``KeyboardInterrupt`` (stop at once). Nothing is interrupted in
    between: PySpark's own SIGINT handler cancels every Spark job (failing the micro-batch
    in progress), and a ``KeyboardInterrupt`` raised inside a Py4J call is logged by Py4J
    with its traceback — dropped meanwhile (:func:`_py4j_interrupt_log`), for the second."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._previous: Any = None

    def _on_sigint(self, signum: int, frame: object) -> None:
        self.requested.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next one is forceful

    def __enter__(self) -> _Interrupts:
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


def _py4j_interrupt_log(record: logging.LogRecord) -> bool:
    """Logger filter: drops Py4J's logs of a KeyboardInterrupt inside a Py4J call."""
    return record.getMessage() not in (
        "KeyboardInterrupt while sending command.",
        "Exception occurred while shutting down connection",
    )


def _stop_query(query: StreamingQuery) -> None:
    """Stop *query* without interrupting a micro-batch in progress where possible: the
    source emits nothing after a stop's final barrier, so wait (bounded) until no trigger is
    active, then stop."""
    deadline = time.monotonic() + STOP_GRACE_S
    while query.isActive and time.monotonic() < deadline:
        try:
            if not query.status.get("isTriggerActive", False):
                break
        except Exception:
            break
        time.sleep(0.05)
    query.stop()

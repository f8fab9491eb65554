"""The foreachBatch aligner: user operators with keyed state over ``ckpt-source``
micro-batches, exactly-once into a two-phase-commit sink.

It runs in the process that calls ``foreachBatch`` (``placement="driver"``: the user's driver;
under Spark Connect a server-side Python process), organised per subtask: each subtask owns a
key-group range and is an :class:`~spark_ckpt.runtime.task.OperatorTask` with its own barrier
aligner over the source channels. A micro-batch (collected as one Arrow table) is routed
vectorized (an Arrow filter per subtask, order kept): data rows to the subtask owning their
key group, barrier rows to every subtask, after its data rows. The source aligns
(:mod:`spark_ckpt.sources.stream_offset`), so a checkpoint falls on a micro-batch boundary and
no alignment state spans micro-batches. Acknowledgements go to the coordinator through the
mailbox; completions are read back from the checkpoint store and applied at the start of a
later batch, on the batch's thread, so the state backends stay single-threaded.

* **Asynchronous phase** (``async_snapshots``, what
  :class:`~spark_ckpt.pipeline.pipeline.Pipeline` uses): a
  :class:`~spark_ckpt.runtime.snapshot_worker.SnapshotWorker` thread writes each task's
  snapshot and posts the acknowledgement, and reads which checkpoints completed: the
  micro-batch pays only the synchronous phase. The store is then used by that thread only
  (after construction): give the aligner a store instance of its own.
* **Pipelined micro-batches** (``pipelined``, what ``Pipeline`` uses): ``foreachBatch``
  collects batch *b*, waits until *b - 1* has been processed, hands *b* to a processing
  thread and returns, so Spark reads *b + 1* while the operators process *b*. At most one
  batch is in flight, processed in order. Safe because every run restores from the latest
  completed checkpoint, never from Spark's offset log. A batch carrying a *final* barrier is
  processed before ``foreachBatch`` returns. A processing error is raised by the next
  ``foreachBatch`` call or by :meth:`BatchAligner.drain` / :meth:`BatchAligner.close`.
  (README.md, *Guarantees and limits*, has the reasoning.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.runs import RunFiles
from spark_ckpt.errors import ProtocolError, SparkCkptError
from spark_ckpt.protocol.barrier import (
    BARRIER_OPTIONS,
    BARRIER_TS,
    CHANNEL,
    CHECKPOINT_ID,
    KIND,
    CheckpointBarrier,
    event_from_row,
)
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import Clock, SystemClock
from spark_ckpt.protocol.state_handles import AcknowledgeCheckpoint, DeclineCheckpoint, TaskId
from spark_ckpt.protocol.trace import NOOP_TRACER, Phase, Tracer
from spark_ckpt.runtime.aligner import AlignmentMode
from spark_ckpt.runtime.event_time import WatermarkStrategy, fill_progress
from spark_ckpt.runtime.operator import KeyedOperator, chain_key
from spark_ckpt.runtime.snapshot_worker import SnapshotWorker
from spark_ckpt.runtime.stage_output import StageOutput, split_for_subtasks
from spark_ckpt.runtime.task import CHAIN_VERTEX, SOURCE_TASK, OperatorTask, Response
from spark_ckpt.sinks.two_phase_commit import TransactionalSink
from spark_ckpt.sources.inputs import INPUT_KEY, Inputs
from spark_ckpt.state.backends.spec import HASHMAP, StateBackendSpec
from spark_ckpt.state.keygroup import subtasks_for_keys
from spark_ckpt.storage.checkpoint_store import WorkerStorage


@dataclass(frozen=True)
class StageSetup:
    """The subtasks of one stage as :class:`BatchAligner` builds them: their vertex,
    operators, parallelism, max parallelism, input channels, sinks and time; *forward*: they
    forward their output to a next stage."""

    vertex: str
    operators: tuple[KeyedOperator, ...]
    parallelism: int
    max_parallelism: int
    channels: int
    sink: TransactionalSink | None
    watermark: WatermarkStrategy | None
    late_sink: TransactionalSink | None = None
    inputs: Inputs | None = None
    side_sinks: Mapping[str, TransactionalSink] = field(default_factory=dict)
    forward: bool = False


@dataclass
class LaterStage:
    """A later stage's subtasks in the aligner, and how rows reach them (by *key_column*'s
    key groups of *max_parallelism*)."""

    key_column: str
    max_parallelism: int
    tasks: list[OperatorTask]


class BatchAligner:
    """See the module docstring. The runtime of one run (:mod:`spark_ckpt.coordination.runs`): it
    restores state from *restore_from* — the checkpoint the run's coordinator chose — at
    construction, and is never reused by another run
    (:class:`~spark_ckpt.spark.driver.foreach_batch.ForeachBatchFunction` builds one per run,
    lazily, in the process that calls it). The run's topology is published by its driver, not here.
    """

    def __init__(
        self,
        root: str,
        store: WorkerStorage,
        *,
        operators: Sequence[KeyedOperator],
        channels: int,
        parallelism: int = 2,
        mode: AlignmentMode = AlignmentMode.ALIGNED,
        max_parallelism: int = 128,
        sink: TransactionalSink | None = None,
        vertex: str | None = None,
        clock: Clock | None = None,
        async_snapshots: bool = False,
        pipelined: bool = False,
        restore_from: CompletedCheckpoint | None = None,
        run_id: str | None = None,
        tracer: Tracer = NOOP_TRACER,
        watermark: WatermarkStrategy | None = None,
        late_sink: TransactionalSink | None = None,
        inputs: Inputs | None = None,
        side_sinks: Mapping[str, TransactionalSink] | None = None,
        later_stages: Sequence[StageSetup] = (),
        state_backend: StateBackendSpec = HASHMAP,
    ) -> None:
        """*later_stages*: the job's stages after the first (:mod:`spark_ckpt.runtime.stage`),
        whose subtasks run here too, each micro-batch after the stage before them, on what
        it forwarded. *watermark*: the pipeline keeps event time; the batches' progress rows get the
        largest event time of each channel's rows here, before they are split among the
        subtasks (:func:`~spark_ckpt.runtime.event_time.fill_progress`). *late_sink*: the
        rows dropped as late go there (see :class:`~spark_ckpt.runtime.task.OperatorTask`).
        *inputs*: several named inputs, in their union form (:mod:`spark_ckpt.sources.inputs`).
        *side_sinks*: the operators' named outputs' tables (see the task's).

        *run_id*: acknowledgements go to the run's mailbox box and abort notifications
        are read from the run's files (see :mod:`spark_ckpt.coordination.runs`). *tracer* receives
        spans around routing, completion handling and polls, mailbox posts, and (through
        the tasks) the operators, the sink and the snapshot phases
        (:mod:`spark_ckpt.protocol.trace`): on the thread processing the batch, and on the
        snapshot worker's thread for what runs there (``async_snapshots``). *sink*: the
        tasks stage output through its writer in this process (where foreachBatch runs);
        its committer is only read for the committed checkpoint — the run's coordinator
        commits."""
        self.root = root
        self.store = store
        self.operators = tuple(operators)
        self.vertex = vertex or CHAIN_VERTEX
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.key_column = chain_key(self.operators) if inputs is None else INPUT_KEY
        self.mailbox = Mailbox(root, run_id)
        self.run = RunFiles(root, run_id) if run_id else None
        self._aborted_seen: set[int] = set()
        self.clock: Clock = clock or SystemClock()
        self.tracer = tracer
        self.state_backend = state_backend
        self._outbox: list[AcknowledgeCheckpoint | DeclineCheckpoint] = []
        self.sink = sink
        self.worker = SnapshotWorker() if async_snapshots else None
        self._batches = SnapshotWorker("spark-ckpt-batch") if pipelined else None
        respond = self._outbox.append if self.worker is None else self._post
        self._respond = respond
        self.tasks = self._stage_tasks(
            StageSetup(
                self.vertex,
                self.operators,
                parallelism,
                max_parallelism,
                channels,
                sink,
                watermark,
                late_sink,
                inputs,
                dict(side_sinks or {}),
                forward=bool(later_stages),
            ),
            mode,
            store,
            SOURCE_TASK.vertex,
        )
        #: the job's later stages (:mod:`spark_ckpt.runtime.stage`): their subtasks, fed
        #: with what the stage before them forwards, in this process
        self.later = [
            LaterStage(
                chain_key(setup.operators),
                setup.max_parallelism,
                self._stage_tasks(setup, mode, store, None),
            )
            for setup in later_stages
        ]
        self.watermark = watermark
        latest = restore_from
        self.restored_from: CompletedCheckpoint | None = latest
        for t in self.all_tasks:
            t.restore(latest)
        self._completed_seen = latest.checkpoint_id if latest else 0
        # filled by the worker's completion polls, applied by the batch's thread
        self._completions: list[tuple[int, int | None]] = []
        self._aborts: list[int] = []
        self._completions_lock = threading.Lock()
        self._polling = False
        self.mode = mode
        self.channels = channels
        self.rows_processed = 0
        self.aborts_received = 0

    @property
    def all_tasks(self) -> list[OperatorTask]:
        """The subtasks of every stage, stage by stage."""
        return [*self.tasks, *(t for stage in self.later for t in stage.tasks)]

    def _stage_tasks(
        self, setup: StageSetup, mode: AlignmentMode, store: WorkerStorage, source: str | None
    ) -> list[OperatorTask]:
        return [
            OperatorTask(
                TaskId(setup.vertex, s),
                channels=range(setup.channels),
                operators=setup.operators,
                parallelism=setup.parallelism,
                store=store,
                respond=self._respond,
                clock=self.clock,
                mode=mode,
                aligned_timeout_ms=0,  # the source cuts lagging channels (see above)
                max_parallelism=setup.max_parallelism,
                sink=setup.sink,
                source_vertex=source,
                run_async=None if self.worker is None else self.worker.submit,
                tracer=self.tracer,
                watermark=setup.watermark,
                late_sink=setup.late_sink,
                inputs=setup.inputs,
                side_sinks=setup.side_sinks,
                forward=StageOutput(s) if setup.forward else None,
                state_backend=self.state_backend,
            )
            for s in range(setup.parallelism)
        ]

    def submit(self, table: pa.Table) -> None:
        """Process one collected micro-batch: at once, or (``pipelined``) on the processing
        thread once the previous one is done — returning before it is processed unless it
        carries a final barrier. Raises what failed the previous batch."""
        if self._batches is None:
            self.process(table)
            return
        self._batches.drain()  # the previous batch is done; raises what failed it
        self._batches.submit(lambda: self.process(table))
        if _ends_run(table):
            self._batches.drain()

    def process(self, table: pa.Table) -> None:
        """Process one micro-batch (rows of every channel, channel order kept), on the calling
        thread. Not thread-safe: one batch at a time (:meth:`submit` ensures it)."""
        with self.tracer.span(Phase.NOTIFY_COMPLETED):
            self._notify_completed()
        if table.num_rows:
            with self.tracer.span(Phase.ROUTE):
                if self.watermark is not None and self.watermark.column is not None:
                    table, _ = fill_progress(table, self.watermark.column)
                parts = self._route(table)
            for task, part in zip(self.tasks, parts, strict=True):
                if part.num_rows:
                    task.process(part)
            self.rows_processed += table.num_rows
        for task in self.tasks:
            task.tick()
        upstream = self.tasks
        for stage in self.later:
            with self.tracer.span(Phase.ROUTE):
                forwarded = [t for t in (u.forwarded() for u in upstream) if t is not None]
                channels = pa.concat_tables(forwarded, promote_options="default")
                parts = split_for_subtasks(
                    channels, stage.key_column, stage.max_parallelism, len(stage.tasks)
                )
            for task, part in zip(stage.tasks, parts, strict=True):
                if part.num_rows:
                    task.process(part)
            for task in stage.tasks:
                task.tick()
            upstream = stage.tasks
        with self.tracer.span(Phase.MAILBOX):
            self._flush()

    def _route(self, table: pa.Table) -> list[pa.Table]:
        """Each subtask's part of *table*: the data rows of its key groups, then every
        control row (barriers reach every subtask), each group in the table's order. Moving
        the control rows after the data keeps every channel's order, as the source emits a
        barrier after its channel's last row of the batch (:func:`barriers_last`)."""
        control = pc.is_valid(table.column(CHECKPOINT_ID))
        control_np = control.to_numpy(zero_copy_only=False)
        if not control_np.any():
            data, barriers = table, None
        else:
            barriers_last(table, control_np)
            data = table.filter(pa.array(~control_np))
            barriers = table.filter(control)
        if self.parallelism == 1:
            parts = [data]
        else:
            owner = subtasks_for_keys(
                data.column(self.key_column), self.max_parallelism, self.parallelism
            ).to_numpy(zero_copy_only=False)
            parts = [data.filter(pa.array(owner == s)) for s in range(self.parallelism)]
        if barriers is None:
            return parts
        return [pa.concat_tables([part, barriers]) for part in parts]

    def _notify_completed(self) -> None:
        if self.worker is None:
            aborts = self._poll_aborts()
            found = self._poll_completions()
        else:
            with self._completions_lock:
                found, self._completions = self._completions, []
                aborts, self._aborts = self._aborts, []
                polling, self._polling = self._polling, True
            if not polling:
                self.worker.submit(self._poll_in_worker)
        for cid in aborts:
            self.aborts_received += 1
            for task in self.all_tasks:
                task.notify_aborted(cid, "aborted by the coordinator")
        for cid, committed in found:
            for task in self.all_tasks:
                task.notify_complete(cid, committed)

    def _poll_in_worker(self) -> None:
        aborts = self._poll_aborts()
        found = self._poll_completions()
        with self._completions_lock:
            self._aborts.extend(aborts)
            self._completions.extend(found)
            self._polling = False

    def _poll_aborts(self) -> list[int]:
        """Checkpoints the run's coordinator aborted since the last call (oldest first)."""
        if self.run is None:
            return []
        new = [c for c in self.run.aborted() if c not in self._aborted_seen]
        self._aborted_seen.update(new)
        return new

    def _poll_completions(self) -> list[tuple[int, int | None]]:
        """(checkpoint id, the sink's committed checkpoint) of each checkpoint completed since
        the last call, oldest first. Reads the store (and the sink, once)."""
        with self.tracer.span(Phase.LIST_COMPLETED):
            completed = self.store.list_completed()
        newer = sorted(c.checkpoint_id for c in completed if c.checkpoint_id > self._completed_seen)
        if not newer:
            return []
        self._completed_seen = newer[-1]
        committed = None
        if self.sink is not None:
            with self.tracer.span(Phase.COMMITTED_CHECKPOINT):
                committed = self.sink.committer.committed_checkpoint()
        return [(cid, committed) for cid in newer]

    def _post(self, message: Response) -> None:
        with self.tracer.span(Phase.MAILBOX):
            self.mailbox.post(message)

    def drain(self) -> None:
        """Wait until the micro-batch in flight (``pipelined``) is processed and the
        asynchronous phase of every checkpoint taken so far is done; raises what failed
        either."""
        if self._batches is not None:
            self._batches.drain()
        if self.worker is not None:
            self.worker.drain()

    def abandon(self) -> None:
        """Drop the micro-batch in flight (``pipelined``) unprocessed, as a crash of the driver
        would, and end the processing thread; for restarts within one process (and tests).
        Spark considered the batch done, but nothing of it was acknowledged: the next run
        restores the latest completed checkpoint and reads it again. Idempotent."""
        if self._batches is not None:
            self._batches.abandon()

    def close(self) -> None:
        """Finish the batch in flight and the asynchronous work, end both threads
        (idempotent); raises what failed the last batch, if anything did. Then the tasks
        end in order: their operators are closed."""
        if self._batches is not None:
            self._batches.close()
        if self.worker is not None:
            self.worker.close()
        if self._batches is not None:
            self._batches.drain()
        for task in self.all_tasks:
            task.close()

    def _flush(self) -> None:
        outbox = list(self._outbox)
        self._outbox.clear()  # in place: the tasks hold its bound append
        for message in outbox:
            self.mailbox.post(message)


class BatchInterruptedError(SparkCkptError):
    """A micro-batch's collect was interrupted or cancelled, as ``query.stop()`` does to the
    batch in progress; the message is the Java error chain without stack traces (see
    :func:`collect_arrow`)."""


#: What marks a Java error as the interruption of a micro-batch: the names Spark's
#: ``StreamExecution.isInterruptionException`` looks for, and a job cancelled by a stop.
_INTERRUPTED = (
    "java.lang.InterruptedException",
    "java.io.InterruptedIOException",
    "java.nio.channels.ClosedByInterruptException",
    "SPARK_JOB_CANCELLED",
)


def collect_arrow(df: Any) -> pa.Table:
    """``df.toArrow()`` in a ``foreachBatch`` function, with a short error when
    ``query.stop()`` interrupts the micro-batch (cancels its collect job or interrupts its
    thread): :class:`BatchInterruptedError` carrying ``Py4JJavaError: <call>: <Java error
    chain>`` without stack traces, instead of Py4J's error with every Java stack trace.

    Spark tells the stop's own interruption from a failure by the text of the Python error
    (``StreamExecution.isInterruptionException``): the regex ``Py4JJavaError: An error
    occurred while calling((.|\\n)*)(InterruptedException|...)`` recurses once per character
    and overflows the stream thread's stack on a few thousand — a
    ``java.lang.StackOverflowError`` printed on the console — and otherwise ``SparkException``,
    ``cancelled`` and the query's job group. The short text satisfies either check, so the
    stop ends the query quietly; py4j's log of the error is dropped too (see
    :class:`_QuietInterruptedBatch`). Any other error is raised unchanged."""
    from py4j.protocol import Py4JJavaError

    try:
        return df.toArrow()
    except Py4JJavaError as e:
        summary = _interruption(e)
        if summary is None:
            raise
        raise BatchInterruptedError(summary) from None


def _interruption(error: Any) -> str | None:
    """The short text of a ``Py4JJavaError`` whose Java error chain is an interruption or a
    cancelled job, else None: at most 700 characters after the ``Py4JJavaError`` prefix,
    short enough for Spark's regex (see :func:`collect_arrow`; ``docs/spark-notes.md``,
    section 6)."""
    try:
        chain: list[str] = []
        cause = error.java_exception
        while cause is not None and len(chain) < 4:
            chain.append(str(cause.toString())[:300])
            cause = cause.getCause()
    except Exception:  # the JVM is going away: not ours to explain
        return None
    if not any(m in text for text in chain for m in _INTERRUPTED):
        return None
    call = str(error.errmsg).strip()[:100]
    return f"py4j.protocol.Py4JJavaError: {call}\n: " + "\nCaused by: ".join(chain)[:600]


class _QuietInterruptedBatch(logging.Filter):
    """Drops py4j's ERROR log (with traceback) of a foreachBatch call that raised
    :class:`BatchInterruptedError`: Spark ends the stopped query without an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], BatchInterruptedError))


for _name in ("py4j.clientserver", "py4j.java_gateway"):
    logging.getLogger(_name).addFilter(_QuietInterruptedBatch())


def _ends_run(table: pa.Table) -> bool:
    """Whether *table* carries a final barrier (end of input, stop): its control rows only."""
    control = pc.indices_nonzero(pc.is_valid(table.column(CHECKPOINT_ID)))
    if len(control) == 0:
        return False
    rows = table.select([KIND, CHECKPOINT_ID, BARRIER_TS, BARRIER_OPTIONS])
    return any(
        isinstance(e := event_from_row(row), CheckpointBarrier) and e.final
        for row in rows.take(control).to_pylist()
    )


def barriers_last(table: pa.Table, control: np.ndarray[Any, np.dtype[np.bool_]]) -> None:
    """Check that no channel of *table* has a data row after one of its control rows, as
    the source emits them (alignment at the source); :class:`ProtocolError` otherwise."""
    channel = table.column(CHANNEL).to_numpy(zero_copy_only=False)
    rows = np.arange(table.num_rows)
    for c in np.unique(channel[control]):
        mine = channel == c
        if rows[mine & ~control].max(initial=-1) > rows[mine & control].min():
            raise ProtocolError(
                f"channel {int(c)} has data rows after a barrier in one micro-batch: the "
                "source must emit barriers after its channels' rows (alignment at the source)"
            )

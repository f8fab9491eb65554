"""One parallel instance (subtask) of an operator chain behind a barrier aligner.

The task turns the aligner's steps into work:

* ``Records`` → every operator of the chain in order, output staged into the sink's open
  transaction;
* ``Snapshot`` → synchronous phase: each operator's state backend takes its consistent copy,
  the sink seals the open transaction (``pre_commit``);
* ``Complete`` → asynchronous phase: state, channel state (unaligned) and the sealed
  transactions are written to the checkpoint store, then the acknowledgement is sent;
* ``Abort`` → the snapshot in progress is dropped. Its sealed transaction stays pending and is
  committed with the next completed checkpoint (nothing is lost);
* ``Progress`` → a channel's event time and the micro-batch's processing time, for the
  task's time (:mod:`spark_ckpt.runtime.task_time`), which moves at the end of each input
  batch (a micro-batch) and before each snapshot; then the operators' timers that are due
  fire (``on_timers``), their output going down the chain like a batch's. Rows late beyond
  the allowed lateness are dropped before the operators and counted, unless the first
  operator receives late rows and decides itself (``KeyedOperator.receives_late_rows``:
  windows, per window); the watermark valve's
  state is part of the task's checkpoint, the timers part of the operators' keyed state.

``notify_complete(n)`` makes *n* the base of the next incremental snapshot and forgets the
sealed transactions the sink reports committed (the job's global committer commits them; see
:mod:`spark_ckpt.sinks.two_phase_commit`). Until then they stay in every checkpoint the task takes.

Tasks run wherever the caller runs them (the driver in the foreachBatch aligner, a simulated
scheduler in tests) and are single-threaded.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ConfigError, SparkCkptError, StateError
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint, task_state_uid
from spark_ckpt.protocol.clock import Clock
from spark_ckpt.protocol.state_handles import (
    AcknowledgeCheckpoint,
    BlobKind,
    BlobRef,
    CacheMetrics,
    ChangeMetrics,
    CheckpointMetrics,
    DeclineCheckpoint,
    SourceOffset,
    StateBlob,
    StorageMetrics,
    TaskId,
    TaskSnapshot,
    TaskStateHandle,
    TimeMetrics,
)
from spark_ckpt.protocol.trace import NOOP_TRACER, Phase, Tracer
from spark_ckpt.runtime.aligner import (
    Abort,
    AbortReason,
    AlignmentMode,
    BarrierAligner,
    Complete,
    Progress,
    Records,
    Snapshot,
    Step,
)
from spark_ckpt.runtime.carried_transactions import (
    SINK_TRANSACTIONS,
    CarriedTransactions,
    sealed_table,
)
from spark_ckpt.runtime.co_operator import KeyedCoOperator
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.runtime.failure import CheckpointFailureReason
from spark_ckpt.runtime.image_history import ImageHistory
from spark_ckpt.runtime.operator import KeyedOperator, chain_key
from spark_ckpt.runtime.restore_settings import RESTORED_FROM, output_checkpoint
from spark_ckpt.runtime.stage import FIRST_STAGE_VERTEX, is_later_stage_vertex
from spark_ckpt.runtime.stage_output import StageOutput
from spark_ckpt.runtime.task_time import TaskTime, own_columns
from spark_ckpt.sinks.two_phase_commit import (
    SinkCommitter,
    Transaction,
    TransactionalSink,
)
from spark_ckpt.sources.inputs import INPUT_KEY, Inputs
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.backends.memory import release_free_memory
from spark_ckpt.state.backends.spec import HASHMAP, StateBackendSpec
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.keygroup import key_groups, range_for_subtask
from spark_ckpt.state.state_restore import restore_backend
from spark_ckpt.storage.checkpoint_store import StateStorage

log = logging.getLogger(__name__)

#: The name of a pipeline's one task vertex: its operator chain and its sink. Internal (it
#: names the tasks' acknowledgements and their own state); nothing depends on it across
#: versions of the job — readers of the tasks' own state find it under any vertex name.
CHAIN_VERTEX = FIRST_STAGE_VERTEX
#: The task of a ``ckpt-source``: its coordinator triggers it, and its channel positions are
#: acknowledged under this vertex.
SOURCE_TASK: Final = TaskId("source", 0)
#: The task's own state of its watermark valve (one blob per subtask and checkpoint).
EVENT_TIME: Final = "_event_time"
#: Rounds of timers fired at one point in time (timers that fire may register more that are
#: due at once); what is left fires at the next point, which keeps a replay identical.
MAX_TIMER_ROUNDS: Final = 64


Response = AcknowledgeCheckpoint | DeclineCheckpoint


@dataclass(frozen=True)
class AsyncPhase:
    """The asynchronous phase of checkpoint *checkpoint_id*'s snapshot of one task (write the
    state, then acknowledge or decline): a job for *run_async*, which may run it on another
    thread, in the order submitted."""

    checkpoint_id: int
    run: Callable[[], None]

    def __call__(self) -> None:
        self.run()


@dataclass
class _SnapshotInProgress:
    snapshots: list[TaskSnapshot]
    step: Snapshot
    sync_ms: int
    base_checkpoint_id: int  # the oldest base the snapshots build on (0: none yet)
    event_time: pa.Table | None = None  # the watermark valve's state at the snapshot
    time: TimeMetrics | None = None
    keys_changed: int = 0  # distinct keys changed since the previous snapshot


class OperatorTask:
    """See the module docstring. ``respond`` receives the task's acks and declines (the
    coordinator's inbox); it must not call back into the task synchronously.

    *run_async* runs the asynchronous phase of a checkpoint (writing the state, then
    acknowledging; an :class:`AsyncPhase`, which names its checkpoint): by default inline,
    on the task's thread; a
    :class:`~spark_ckpt.runtime.snapshot_worker.SnapshotWorker`'s ``submit`` moves it to another
    thread, in which case ``respond`` is called from that thread too.

    *tracer* receives spans around the operator calls, the sink's ``write`` and
    ``pre_commit``, the synchronous and asynchronous snapshot phases and the state write (see
    :mod:`spark_ckpt.protocol.trace`); the state write's span runs where *run_async* runs it."""

    def __init__(
        self,
        task_id: TaskId,
        *,
        channels: Sequence[int],
        operators: Sequence[KeyedOperator],
        parallelism: int,
        store: StateStorage,
        respond: Callable[[Response], None],
        clock: Clock,
        mode: AlignmentMode = AlignmentMode.ALIGNED,
        aligned_timeout_ms: int = 0,
        max_parallelism: int = 128,
        sink: TransactionalSink | None = None,
        source_vertex: str | None = None,
        run_async: Callable[[Callable[[], None]], None] | None = None,
        tracer: Tracer = NOOP_TRACER,
        watermark: WatermarkStrategy | None = None,
        late_sink: TransactionalSink | None = None,
        inputs: Inputs | None = None,
        side_sinks: Mapping[str, TransactionalSink] | None = None,
        forward: StageOutput | None = None,
        state_backend: StateBackendSpec = HASHMAP,
    ) -> None:
        """*state_backend*: where the operators' keyed state is stored (``hashmap`` or
        ``rocksdb``, :mod:`spark_ckpt.state.backends`), built here; :meth:`close` releases it.

        *inputs*: the pipeline reads several named inputs, whose rows arrive in their union
        form (:mod:`spark_ckpt.sources.inputs`): the first operator receives them apart (an
        operator over several inputs, :class:`~spark_ckpt.runtime.co_operator.KeyedCoOperator`)
        or merged (inputs of one schema).

        *source_vertex*: when the task reads source channels directly (the foreachBatch
        aligner), its acknowledgements also carry the source positions — each channel's
        barrier offset — under that vertex name, since the source itself does not ack.

        *sink*: the task stages its output through the sink's writer (in the task's process)
        and only reads the committer's committed checkpoint (:meth:`notify_complete`); it
        never commits — the job's global committer does.

        *watermark*: the pipeline keeps event time (see the module docstring).

        *late_sink*: where the rows dropped as late go (Flink's side output), through their
        own two-phase-commit transaction, sealed and carried like the output's.

        *side_sinks*: per name, the table of an operator's named output (``StateContext.output``,
        Flink's side outputs), each through its own transaction, sealed, carried and committed
        with the same checkpoint as the output's.

        *forward*: the job has a next stage (:mod:`spark_ckpt.runtime.stage`): the chain's
        output, the task's barriers and its event time go there too, in order (read it with
        :meth:`forwarded` after each input batch)."""
        if not operators:
            raise SparkCkptError("an operator task needs at least one operator")
        check_chain(operators, inputs)
        self.task_id = task_id
        self.operators = tuple(operators)
        self.inputs = inputs
        #: the column that routes the rows to subtasks (the union form's key, several inputs)
        self.route_key = chain_key(operators) if inputs is None else INPUT_KEY
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.key_group_range = range_for_subtask(max_parallelism, parallelism, task_id.subtask)
        self.store = store
        self.sink = sink
        self.late_sink = late_sink
        self.side_sinks: dict[str, TransactionalSink] = dict(side_sinks or {})
        self.forward = forward
        self.respond = respond
        self.clock = clock
        self.tracer = tracer
        self.aligner = BarrierAligner(channels, mode, clock, aligned_timeout_ms=aligned_timeout_ms)
        #: the pipeline's watermark strategy, and the task's time under it (None: the pipeline
        #: keeps no time): watermark, processing time, counts, the operators' timers
        self.watermark = watermark
        self.time = None if watermark is None else TaskTime(watermark, channels, inputs)
        self.backends: dict[str, KeyedStateBackend] = {}
        self._handles: dict[str, StateContext] = {}  # what the operators see of their backends
        for position, op in enumerate(self.operators):
            backend = KeyedStateBackend(
                op.uid,
                task_id.subtask,
                op.key_type,
                self.key_group_range,
                max_parallelism,
                parallelism=parallelism,
                storage=state_backend.storage(op.uid, task_id.subtask, op.key_type),
            )
            timers = ttl = late_output = None
            if self.time is not None:
                ttl = self.time.add_ttl(op.uid, backend)
                if op.handles_timers:
                    timers = self.time.add_timers(op.uid, backend)
                late_output = functools.partial(self._dropped_late, position)
            handle = StateContext(
                backend,
                timers,
                self.time,
                ttl,
                late_output,
                self._write_side if self.side_sinks or op.side_outputs else None,
            )
            op.open(handle)
            self.backends[op.uid] = backend
            self._handles[op.uid] = handle
        self._closed = False
        self._in_progress: dict[int, _SnapshotInProgress] = {}
        #: per checkpoint id, the transactions this task sealed (the output's, the late rows')
        self._sealed: dict[int, list[Transaction]] = {}
        self._acked: dict[int, TaskStateHandle] = {}
        self._acked_lock = threading.Lock()  # _acked is written by the asynchronous phase
        self._run_async = run_async or _run_inline
        self.rows_processed = 0
        #: the newest checkpoint snapshotted by this subtask: by this task, or (subtasks on
        #: the executors) in its history another process ran (0: none)
        self.last_snapshot_id = 0
        self.source_vertex = source_vertex
        #: subtasks on the executors: where the subtask found its state since its previous
        #: checkpoint, reported with the next acknowledgement (None: not reported)
        self.cache: CacheMetrics | None = None
        #: subtasks on the executors: per operator uid, what the changelog's segments
        #: changed since its last full image (:mod:`spark_ckpt.runtime.subtask_image` keeps
        #: it; absent: not known, as after a restore), which :meth:`rebase` builds on
        self.image_histories: dict[str, ImageHistory] = {}

    @property
    def sink_uid(self) -> str:
        return self.task_id.vertex

    @property
    def late_uid(self) -> str:
        """Whose transactions of late rows (distinct from the output's: a transaction is
        named by uid, subtask and checkpoint)."""
        return f"{self.task_id.vertex}:late"

    def side_uid(self, name: str) -> str:
        """Whose transactions of the named output *name*."""
        return f"{self.task_id.vertex}:out:{name}"

    def _extra_sinks(self) -> list[tuple[TransactionalSink, str]]:
        """The late rows' sink and the named outputs' sinks, with their transactions' uids."""
        extra = [] if self.late_sink is None else [(self.late_sink, self.late_uid)]
        return extra + [(s, self.side_uid(n)) for n, s in sorted(self.side_sinks.items())]

    @property
    def state_uid(self) -> str:
        return task_state_uid(self.task_id.vertex)

    # -- restore -----------------------------------------------------------------------------
    def restore(self, checkpoint: CompletedCheckpoint | None) -> None:
        """Load this subtask's key groups of every operator's state from *checkpoint* (taken
        at any parallelism), then replay the in-flight records (unaligned channel state) of
        those key groups. Sink transactions are recovered by the job, not here
        (:func:`recover_sink`). Call before the first input."""
        if checkpoint is None:
            return
        self.last_snapshot_id = checkpoint.checkpoint_id
        self.image_histories.clear()  # the restored state is no image's
        # the first checkpoint after a restore a user asked for (savepoint, older checkpoint)
        # is full: the new lineage never builds on the restored chains
        incremental = RESTORED_FROM not in checkpoint.properties
        for op in self.operators:
            restore_backend(
                self.backends[op.uid],
                checkpoint.operator_blobs(op.uid),
                self.store.read_blob,
                incremental_base=incremental,
            )
        own = self.own_task_blobs(checkpoint)
        if self.time is not None:
            refs = [r for r in own if r.state_name == EVENT_TIME]
            self.time.restore(self.store.read_blobs(refs) if refs else [])
        channel_refs = sorted(
            (b for b in own if b.kind is BlobKind.CHANNEL),
            key=lambda b: (b.channel, b.subtask),
        )
        if channel_refs:
            tables = self.store.read_blobs(channel_refs)
            table = pa.concat_tables(tables, promote_options="default")
            kg = key_groups(table.column(self.route_key), self.max_parallelism)
            mine = pc.and_(
                pc.greater_equal(kg, self.key_group_range.start),
                pc.less_equal(kg, self.key_group_range.end),
            )
            self._process_records(table.filter(mine))

    def own_task_blobs(self, checkpoint: CompletedCheckpoint) -> list[BlobRef]:
        """The blobs of *checkpoint* that hold this task's vertex's own state (watermark
        valve, channel state): a later stage's under its vertex; the first stage's under any
        vertex that is not a later stage's (older versions named it otherwise)."""
        blobs = checkpoint.task_blobs()
        if is_later_stage_vertex(self.task_id.vertex):
            return [b for b in blobs if b.operator_uid == self.state_uid]
        return [
            b
            for b in blobs
            if not is_later_stage_vertex(b.operator_uid.removeprefix(task_state_uid("")))
        ]

    # -- input -------------------------------------------------------------------------------
    def process(self, batch: pa.Table | pa.RecordBatch) -> None:
        """Feed one input batch (data and control rows of any of the task's channels: a
        micro-batch); then time moves and the timers due fire."""
        if self.time is not None:
            self.time.begin(batch)
        self._run(self.aligner.process(batch))
        self._advance_time()

    @property
    def watermark_ms(self) -> int | None:
        """The task's watermark (ms since the epoch; None: no event time, or none yet)."""
        return None if self.time is None else self.time.watermark_ms

    def _advance_time(self) -> None:
        """Time moves by the progress observed so far; every timer due fires, in chain
        order (an operator's timer output reaches the operators after it, which may have
        timers due in turn)."""
        time = self.time
        if time is None:
            return
        time.advance()
        for position, op in enumerate(self.operators):
            if op.uid not in time.timers:
                continue
            handle = self._handles[op.uid]
            for _ in range(MAX_TIMER_ROUNDS):
                fired = time.due(op.uid, op.key_column)
                if not fired:
                    break
                for timers in fired:
                    with self.tracer.span(Phase.OPERATOR):
                        out = op.on_timers(timers, handle)
                    self._emit(out, position + 1)

    def tick(self) -> None:
        """Let time-based transitions happen (aligned-checkpoint timeout)."""
        self._run(self.aligner.tick())

    def end_of_input(self, channel: int, end_offset: int) -> None:
        self._run(self.aligner.end_of_input(channel, end_offset))

    def close(self) -> None:
        """The task ends in order: close its operators (:meth:`KeyedOperator.close
        <spark_ckpt.runtime.operator.KeyedOperator.close>`), in chain order, once
        (idempotent). An operator's error is logged and the others are still closed: ending
        must not lose the rest, and the state is already where checkpoints put it."""
        if self._closed:
            return
        self._closed = True
        for op in self.operators:
            try:
                op.close()
            except Exception as e:  # a user's hook: report it, close the others
                log.error("closing operator %r of %s failed: %s", op.uid, self.task_id, e)
        for backend in self.backends.values():
            backend.close()  # rocksdb: its local files

    def _run(self, steps: list[Step]) -> None:
        """Carry out the aligner's *steps* in order. Records with nothing but progress
        between them go through the operators as one batch (each channel's rows in order):
        progress only moves time at the next :meth:`_advance_time`, so they see the same
        watermark either way, and the operators pay their per-batch state access once."""
        pending: list[pa.Table] = []
        for step in steps:
            if isinstance(step, Records):
                pending.append(step.table)
                continue
            if isinstance(step, Progress):
                if self.time is not None:
                    self.time.observe(step.channel, step.progress)
                continue
            self._process_pending(pending)
            pending = []
            self._step(step)
        self._process_pending(pending)

    def _process_pending(self, tables: list[pa.Table]) -> None:
        """Consecutive records of the aligner, as one table where their schemas agree."""
        if len(tables) > 1 and all(t.schema == tables[0].schema for t in tables):
            tables = [pa.concat_tables(tables)]
        for table in tables:
            self._process_records(table)

    def _step(self, step: Step) -> None:
        """One step of the aligner other than records and progress."""
        if isinstance(step, Snapshot):
            with self.tracer.span(Phase.SNAPSHOT_SYNC):
                self._snapshot(step)
        elif isinstance(step, Complete):
            with self.tracer.span(Phase.SNAPSHOT_ASYNC):
                self._complete(step)
        elif isinstance(step, Abort):
            given_up = self._in_progress.pop(step.checkpoint_id, None)
            if given_up is not None and given_up.time is not None and self.time is not None:
                self.time.give_back(given_up.time)  # counted with the next checkpoint
            for backend in self.backends.values():
                backend.snapshots.notify_checkpoint_aborted(step.checkpoint_id)
            if self.forward is not None:
                self.forward.cancel(step.checkpoint_id)
            if step.reason is not AbortReason.COORDINATOR:
                # tell the coordinator at once (Flink's decline on subsumption), instead of
                # leaving the checkpoint pending until it times out
                code = (
                    CheckpointFailureReason.SUBSUMED
                    if step.reason is AbortReason.SUBSUMED
                    else CheckpointFailureReason.CANCELLED
                )
                self.respond(
                    DeclineCheckpoint(
                        step.checkpoint_id,
                        self.task_id,
                        step.message or step.reason.value,
                        code.value,
                    )
                )

    def _process_records(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self.rows_processed += table.num_rows
        if self.time is not None:
            if self.operators[0].receives_late_rows:
                self.time.count_late(table)  # the operator drops late rows itself
            else:
                table, late = self.time.drop_late(table)
                if late is not None:
                    self._write_late(late)
        self._emit(table, 0)

    def _dropped_late(self, position: int, rows: pa.Table) -> None:
        """The operator at *position* of the chain dropped *rows* as late
        (``StateContext.output_late``): counted; the first operator's (with the columns of
        the rows the task receives) go to the late-output table."""
        assert self.time is not None
        self.time.count_dropped(rows.num_rows)
        if position == 0:
            self._write_late(own_columns(rows))

    def _write_late(self, rows: pa.Table) -> None:
        """Rows dropped as late (their own columns) into the open transaction of the
        late-output table, when the pipeline has one."""
        if self.late_sink is not None:
            if self.inputs is not None:  # which input each row is of, and its own columns
                rows = self.inputs.late_rows(rows)
            with self.tracer.span(Phase.SINK_WRITE):
                self.late_sink.writer.write(self.late_uid, self.task_id.subtask, rows)

    def _write_side(self, name: str, rows: pa.Table) -> None:
        """An operator's *rows* for its named output *name*, into that table's open
        transaction; dropped when the pipeline maps no table to it (as Flink drops a side
        output nobody reads)."""
        sink = self.side_sinks.get(name)
        if sink is None:
            if any(name in op.side_outputs for op in self.operators):
                return
            raise StateError(
                f"no output named {name!r}: the operators declare "
                f"{sorted(n for op in self.operators for n in op.side_outputs)} (side_outputs)"
            )
        with self.tracer.span(Phase.SINK_WRITE):
            sink.writer.write(self.side_uid(name), self.task_id.subtask, rows)

    def _emit(self, rows: pa.Table | None, start: int) -> None:
        """*rows* through the operators from position *start* of the chain on, then into
        the sink's open transaction."""
        out = rows
        operators = self.operators[start:]
        if start == 0 and self.inputs is not None and rows is not None and rows.num_rows:
            first = self.operators[0]
            with self.tracer.span(Phase.OPERATOR):
                if isinstance(first, KeyedCoOperator):
                    out = first.process_inputs(self.inputs.split(rows), self._handles[first.uid])
                else:
                    out = first.process_batch(self.inputs.merged(rows), self._handles[first.uid])
            operators = operators[1:]
        for op in operators:
            if out is None or out.num_rows == 0:
                return
            with self.tracer.span(Phase.OPERATOR):
                out = op.process_batch(out, self._handles[op.uid])
        if out is None or not out.num_rows:
            return
        if self.sink is not None:
            with self.tracer.span(Phase.SINK_WRITE):
                self.sink.writer.write(self.sink_uid, self.task_id.subtask, out)
        if self.forward is not None:
            self.forward.rows(out)

    def forwarded(self) -> pa.Table | None:
        """What this task forwarded to the next stage since the previous call (the channel
        of one input batch, :mod:`spark_ckpt.runtime.stage_output`); None: no next stage."""
        if self.forward is None:
            return None
        return self.forward.drain(*self._time_now())

    def _time_now(self) -> tuple[int | None, int]:
        """The task's watermark (µs; None: none) and processing time (ms) now."""
        if self.time is None:
            return None, 0
        return self.time.valve.watermark_us, self.time.processing_ms

    # -- checkpointing -------------------------------------------------------------------------
    def _snapshot(self, step: Snapshot) -> None:
        cid = step.checkpoint_id
        self._advance_time()  # the checkpoint holds the event time of everything before it
        start = self.clock.now_ms()
        full = step.barrier.is_savepoint
        # the oldest checkpoint whose blobs this and later snapshots may reuse: bases only
        # move forward (0: a backend without a base yet, which may adopt any completed one)
        strategies = [self.backends[op.uid].snapshots for op in self.operators]
        base = min(s.base_checkpoint_id for s in strategies)
        snaps = [s.snapshot(cid, full=full) for s in strategies]
        self.last_snapshot_id = cid
        sinks = [(self.sink, self.sink_uid), *self._extra_sinks()]
        if any(s is not None for s, _ in sinks):
            with self.tracer.span(Phase.SINK_PRE_COMMIT):
                self._sealed[cid] = [
                    s.writer.pre_commit(uid, self.task_id.subtask, cid)
                    for s, uid in sinks
                    if s is not None
                ]
        time_state, time = (None, None) if self.time is None else self.time.snapshot()
        if self.forward is not None:  # after everything emitted before the snapshot
            self.forward.barrier(step.barrier, *self._time_now())
        self._in_progress[cid] = _SnapshotInProgress(
            snaps,
            step,
            self.clock.now_ms() - start,
            base,
            time_state,
            time,
            sum(s.keys_changed for s in strategies),
        )

    def _complete(self, step: Complete) -> None:
        cid = step.checkpoint_id
        progress = self._in_progress.pop(cid, None)
        if progress is None:
            return
        start = self.clock.now_ms()
        vertex, subtask = self.state_uid, self.task_id.subtask
        blobs: list[StateBlob] = []
        reused: list[BlobRef] = []
        for snap in progress.snapshots:
            blobs.extend(snap.new_blobs)
            reused.extend(snap.reused)
        in_flight = sum(rows.num_rows for rows in step.channel_state.values())
        for channel, rows in sorted(step.channel_state.items()):
            if rows.num_rows:
                blobs.append(
                    StateBlob(vertex, subtask, BlobKind.CHANNEL, "in_flight", rows, channel=channel)
                )
        if progress.event_time is not None:
            blobs.append(
                StateBlob(vertex, subtask, BlobKind.OPERATOR, EVENT_TIME, progress.event_time)
            )
        sealed: tuple[str, ...] | None = None
        if self.sink is not None or self._extra_sinks():
            sealed = tuple(
                t.to_json() for c, txns in sorted(self._sealed.items()) if c <= cid for t in txns
            )
            blobs.append(
                StateBlob(
                    vertex, subtask, BlobKind.OPERATOR, SINK_TRANSACTIONS, sealed_table(sealed)
                )
            )
        offsets: tuple[SourceOffset, ...] = ()
        if self.source_vertex is not None:
            offsets = tuple(
                SourceOffset(self.source_vertex, c, o)
                for c, o in sorted(step.barrier_offsets.items())
            )
        snapshot = TaskSnapshot(self.task_id, tuple(blobs), tuple(reused), offsets)
        sync_ms = progress.sync_ms + self.clock.now_ms() - start
        cache, self.cache = self.cache, None if self.cache is None else CacheMetrics()
        storage = self.storage_metrics()  # on the task thread: the tables are not shared

        def write_and_acknowledge() -> None:
            async_start = self.clock.now_ms()
            try:
                with self.tracer.span(Phase.SNAPSHOT_WRITE):
                    handle = self.store.write_task_state(cid, snapshot)
            except SparkCkptError as e:
                self.respond(DeclineCheckpoint(cid, self.task_id, f"writing state failed: {e}"))
                return
            with self._acked_lock:
                self._acked[cid] = handle
            metrics = CheckpointMetrics(
                sync_ms=sync_ms,
                async_ms=self.clock.now_ms() - async_start,
                alignment_ms=progress.step.alignment_ms,
                start_delay_ms=progress.step.start_delay_ms,
                state_bytes=handle.state_bytes(),
                channel_state_bytes=handle.channel_state_bytes(),
            )
            self.respond(
                AcknowledgeCheckpoint(
                    cid,
                    self.task_id,
                    handle,
                    metrics,
                    progress.base_checkpoint_id,
                    cache,
                    sealed,
                    progress.time,
                    ChangeMetrics(progress.keys_changed, in_flight, handle.bytes_written_by(cid)),
                    storage,
                )
            )

        self._run_async(AsyncPhase(cid, write_and_acknowledge))

    def storage_metrics(self) -> StorageMetrics | None:
        """What the operators' state backends hold, summed over the chain (None: no
        operator). Task thread only; O(states)."""
        total: StorageMetrics | None = None
        for backend in self.backends.values():
            m = backend.storage_stats()
            total = m if total is None else total.plus(m)
        return total

    def notify_complete(self, checkpoint_id: int, sink_committed: int | None = None) -> None:
        """Checkpoint *checkpoint_id* completed: update the incremental base, and forget the
        sealed transactions the sink has committed (*sink_committed*, the sink's committed
        checkpoint, is read from the sink when not given)."""
        sinks = [s for s, _ in [(self.sink, ""), *self._extra_sinks()] if s is not None]
        if sinks:
            if sink_committed is None:
                with self.tracer.span(Phase.COMMITTED_CHECKPOINT):  # all commit each checkpoint
                    sink_committed = min(s.committer.committed_checkpoint() for s in sinks)
            self.forget_committed(min(checkpoint_id, sink_committed))
        with self._acked_lock:
            handle = self._acked.pop(checkpoint_id, None)
            for c in [c for c in self._acked if c < checkpoint_id]:
                del self._acked[c]
        if handle is not None:
            for uid, backend in self.backends.items():
                mine = tuple(b for b in handle.blobs if b.operator_uid == uid)
                backend.snapshots.notify_checkpoint_complete(
                    checkpoint_id, TaskStateHandle(backend.task_id, mine)
                )
            release_free_memory()  # what the snapshot and the forgotten changes held

    def acknowledged_checkpoints(self) -> list[int]:
        """Checkpoints whose snapshot this task acknowledged and whose completion it was not
        notified of, oldest first."""
        with self._acked_lock:
            return sorted(self._acked)

    def forget_committed(self, committed: int) -> None:
        """The sink committed every transaction of checkpoints <= *committed*: they no
        longer go into this task's checkpoints."""
        for cid in [c for c in self._sealed if c <= committed]:
            del self._sealed[cid]

    def sealed_transactions(self) -> list[Transaction]:
        """The sink transactions this task sealed whose commit it has not seen, oldest
        first (they go into every checkpoint it takes until then)."""
        return [t for c in sorted(self._sealed) for t in self._sealed[c]]

    def adopt_sealed(self, txns: Sequence[Transaction], *, replace: bool = False) -> None:
        """Take over sealed transactions of this subtask (from its image,
        :mod:`spark_ckpt.runtime.subtask_image`), between micro-batches; *replace*: instead
        of those this task holds."""
        if replace:
            self._sealed.clear()
        for txn in txns:
            mine = self._sealed.setdefault(txn.checkpoint_id, [])
            if txn not in mine:
                mine.append(txn)

    def forget_snapshot_history(self, last_snapshot_id: int) -> None:
        """Another process ran this subtask and snapshotted checkpoints up to
        *last_snapshot_id* since this task's last one (subtasks on the executors): this
        task's incremental base may no longer be kept by the coordinator, so its next
        snapshot is full, and its acknowledged snapshots await no completion."""
        with self._acked_lock:
            self._acked.clear()
        for backend in self.backends.values():
            backend.snapshots.forget_history(last_snapshot_id)
        self.last_snapshot_id = max(self.last_snapshot_id, last_snapshot_id)

    def rebase(self, checkpoint: CompletedCheckpoint) -> bool:
        """After :meth:`forget_snapshot_history` (another process ran this subtask and
        snapshotted meanwhile): build the next snapshots on *checkpoint*, a completed
        checkpoint (not a savepoint) this subtask's history snapshotted, instead of taking a
        full one (:meth:`SnapshotStrategy.rebase
        <spark_ckpt.state.snapshot.strategy.SnapshotStrategy.rebase>`). All operators or none:
        False, and nothing changed, when one cannot."""
        if checkpoint.is_savepoint or checkpoint.checkpoint_id > self.last_snapshot_id:
            return False
        mine = [t for t in checkpoint.tasks if t.task == self.task_id]
        if len(mine) != 1:
            return False
        cid = checkpoint.checkpoint_id
        refs = {uid: [b for b in mine[0].blobs if b.operator_uid == uid] for uid in self.backends}
        histories = self.image_histories
        if not all(
            uid in histories and b.snapshots.can_rebase(cid, refs[uid], histories[uid])
            for uid, b in self.backends.items()
        ):
            return False
        for uid, backend in self.backends.items():
            backend.snapshots.rebase(cid, refs[uid], histories[uid])
        return True

    def notify_aborted(self, checkpoint_id: int, reason: str) -> None:
        """The coordinator aborted *checkpoint_id*: stop aligning on it."""
        with self._acked_lock:
            self._acked.pop(checkpoint_id, None)
        self._run(self.aligner.abort(checkpoint_id))


def _run_inline(job: Callable[[], None]) -> None:
    job()


def check_chain(operators: Sequence[KeyedOperator], inputs: Inputs | None) -> None:
    """:class:`~spark_ckpt.errors.ConfigError` unless an operator over several inputs is the
    first of its chain, in a pipeline that has those inputs, and one over one input reads
    several inputs only of one schema (checked where the schemas are known)."""
    for position, op in enumerate(operators):
        if isinstance(op, KeyedCoOperator):
            if position > 0:
                raise ConfigError(
                    "operators", op.uid, "an operator over several inputs first in the chain"
                )
            if inputs is None:
                raise ConfigError(
                    "operators",
                    op.uid,
                    f"a pipeline with the named inputs {list(op.inputs)} "
                    "(Pipeline.run(sources={...}))",
                )
            unknown = [n for n in op.inputs if n not in inputs.names]
            if unknown:
                raise ConfigError(
                    f"operator {op.uid!r}",
                    unknown[0],
                    f"an input of the pipeline: {', '.join(inputs.names)}",
                )


def sealed_transactions(
    checkpoint: CompletedCheckpoint,
    store: StateStorage,
    carried: CarriedTransactions | None = None,
) -> list[Transaction]:
    """The sink transactions recorded in *checkpoint* by the subtasks of its task vertex
    (whatever the vertex was named: the operator chain may have changed since): taken from
    *carried* where the acknowledgements brought them, read from *store* otherwise."""
    found: list[Transaction] = []
    unread: list[BlobRef] = []
    for ref in checkpoint.task_blobs():
        if ref.state_name != SINK_TRANSACTIONS:
            continue
        known = None if carried is None else carried.lookup(ref)
        if known is None:
            unread.append(ref)
        else:
            found.extend(known)
    if unread:
        for table in store.read_blobs(unread):  # one scan for every subtask's blob
            found.extend(Transaction.from_json(t) for t in table.column("transaction").to_pylist())
    txns = {txn.txn_id: txn for txn in found}
    return sorted(txns.values(), key=lambda t: (t.checkpoint_id, t.subtask))


def own_transactions(
    committer: SinkCommitter, txns: Sequence[Transaction], *, legacy: bool = True
) -> list[Transaction]:
    """The transactions of *txns* that *committer* commits: those sealed for its storage
    (:attr:`~spark_ckpt.sinks.two_phase_commit.SinkCommitter.sink_id`), and, with *legacy*
    (the pipeline's output, not its late-output table), those of older versions, which did
    not record one. Transactions for another storage (the pipeline's output changed at a
    restore; the other of output and late rows) stay where they were: a new output starts at
    the restored positions."""
    return [t for t in txns if t.sink == committer.sink_id or (legacy and not t.sink)]


def commit_checkpoint(
    committer: SinkCommitter,
    checkpoint: CompletedCheckpoint,
    store: StateStorage,
    carried: CarriedTransactions | None = None,
    *,
    legacy: bool = True,
) -> bool:
    """The global committer's step after *checkpoint* completed: commit every transaction it
    records for *committer*, at once (*carried*: those the acknowledgements brought, see
    :func:`sealed_transactions`; *legacy*: see :func:`own_transactions`). Idempotent;
    returns False when it was already committed."""
    return committer.commit_checkpoint(
        checkpoint.checkpoint_id,
        own_transactions(committer, sealed_transactions(checkpoint, store, carried), legacy=legacy),
    )


def recover_sink(
    committer: SinkCommitter,
    checkpoint: CompletedCheckpoint | None,
    store: StateStorage,
    *,
    staged_before_ms: int | None = None,
    legacy: bool = True,
) -> list[Transaction]:
    """Flink's recover-and-commit: commit every transaction sealed in the restored (completed)
    checkpoint for this sink's storage, and discard every other staged transaction of the
    sink (staged before *staged_before_ms*, when given: later ones belong to the run that is
    starting). Returns the transactions committed.

    First the sink is rolled back to the restored checkpoint
    (:meth:`~spark_ckpt.sinks.two_phase_commit.SinkCommitter.roll_back_to`): output of later
    checkpoints that it committed (the restore fell back past a damaged newest checkpoint, or an
    older checkpoint or a savepoint was restored on purpose, whichever version of the job wrote that
    output) is withdrawn, since the job replays it — afterwards the sink holds exactly the output of
    checkpoints <= the restored one. The roll back comes *before* the commit of the restored
    transactions because it may withdraw some of them too (a later checkpoint's commit carried them
    when the restored checkpoint's own commit was lost in a crash); committing them afterwards puts
    them back. With no checkpoint (a fresh start) nothing is rolled back: a pipeline starting on an
    existing table leaves it alone. Idempotent. Run once per job start."""
    if checkpoint is not None:
        # a checkpoint a restore created stands for the one it was restored from
        withdrawn = committer.roll_back_to(output_checkpoint(checkpoint))
        if withdrawn:
            log.warning(
                "restoring checkpoint %d: withdrew %d committed output files of later "
                "checkpoints from the sink",
                checkpoint.checkpoint_id,
                len(withdrawn),
            )
    sealed = sealed_transactions(checkpoint, store) if checkpoint is not None else []
    txns = own_transactions(committer, sealed, legacy=legacy)
    if len(txns) < len(sealed):
        log.info(
            "restoring checkpoint %d: %d sink transactions were sealed for another output "
            "than %s; the output starts at the restored positions",
            checkpoint.checkpoint_id if checkpoint is not None else 0,
            len(sealed) - len(txns),
            committer.sink_id,
        )
    committer.recover(txns, staged_before_ms=staged_before_ms)
    return txns

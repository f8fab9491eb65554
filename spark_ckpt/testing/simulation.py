"""A simulated checkpointed job, driven step by step: the engine without Spark.

Topology: ``channels`` source splits (each a replayable log of ``user_id, amount`` rows) →
keyed shuffle → ``parallelism`` subtasks of an operator chain (:class:`AmountTotals` then
:class:`~spark_ckpt.runtime.operator.RunningCount`, both keyed by ``user_id``) → a two-phase-commit
sink. Every hop is an explicit FIFO queue per (source channel, subtask), acknowledgements and
notifications are messages in flight, and time is a :class:`~spark_ckpt.protocol.clock.ManualClock`:
whoever drives the job (a test, hypothesis, the demo) chooses the interleaving, and
:meth:`SimulatedJob.crash` loses everything volatile (queues, tasks, the coordinator, messages in
flight, open sink transactions) while the checkpoint store and the sink's staged and committed
data survive, as they would on durable storage.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import CheckpointNotFoundError, SparkCkptError
from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import (
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    SourceOffset,
    TaskId,
    TaskSnapshot,
)
from spark_ckpt.runtime.aligner import AlignmentMode
from spark_ckpt.runtime.carried_transactions import CarriedTransactions
from spark_ckpt.runtime.config import CheckpointConfig, CheckpointingMode
from spark_ckpt.runtime.coordinator import CheckpointCoordinator, CoordinatorStatus, JobStatus
from spark_ckpt.runtime.operator import KeyedOperator, RunningCount
from spark_ckpt.runtime.task import OperatorTask, commit_checkpoint, recover_sink
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.sources.channel_batch import barrier_rows, data_rows, stream_schema
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import ValueStateDescriptor
from spark_ckpt.state.keygroup import subtasks_for_keys
from spark_ckpt.storage.checkpoint_store import CheckpointStore

SOURCE = "source"
VERTEX = "counter"
RECORD_SCHEMA = pa.schema([pa.field("user_id", pa.int64()), pa.field("amount", pa.int64())])
STREAM_SCHEMA = stream_schema(RECORD_SCHEMA)


class AmountTotals(KeyedOperator):
    """Keeps the total ``amount`` per ``user_id`` and passes rows through unchanged."""

    TOTAL = ValueStateDescriptor("total", pa.int64())

    def __init__(self, uid: str = "totals") -> None:
        super().__init__(uid, "user_id", pa.int64())

    def open(self, state: StateContext) -> None:
        state.value_state(self.TOTAL)

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        grouped = batch.group_by("user_id").aggregate([("amount", "sum")])
        keys = grouped.column("user_id")
        before = state.get_values(self.TOTAL, keys).fill_null(0)
        state.put_values(self.TOTAL, keys, pc.add(before, grouped.column("amount_sum")))
        return batch


def generate_logs(seed: int, channels: int, rows: int, keys: int) -> list[pa.Table]:
    """Deterministic input: *rows* records per channel, keys uniform in ``[0, keys)``."""
    rng = np.random.default_rng(seed)
    return [
        pa.table(
            {
                "user_id": rng.integers(0, keys, rows, dtype=np.int64),
                "amount": rng.integers(1, 100, rows, dtype=np.int64),
            },
            schema=RECORD_SCHEMA,
        )
        for _ in range(channels)
    ]


def stream_rows(log: pa.Table, channel: int, start: int, end: int) -> pa.Table:
    """Rows ``[start, end)`` of a channel's log, with the barrier columns of data rows."""
    return data_rows(log.slice(start, end - start), STREAM_SCHEMA, channel, start)


def barrier_table(barrier: CheckpointBarrier, channel: int, offset: int) -> pa.Table:
    return barrier_rows(STREAM_SCHEMA, channel, [(offset, barrier)])


@dataclass
class SourceSplit:
    """One source channel: a position in its log; barriers are inserted at the position."""

    channel: int
    log: pa.Table
    position: int = 0

    @property
    def task_id(self) -> TaskId:
        return TaskId(SOURCE, self.channel)


@dataclass
class SimulationSpec:
    channels: int = 2
    parallelism: int = 2
    rows_per_channel: int = 200
    keys: int = 20
    seed: int = 0
    mode: AlignmentMode = AlignmentMode.ALIGNED
    aligned_timeout_ms: int = 0
    max_parallelism: int = 128
    config: CheckpointConfig = field(
        default_factory=lambda: CheckpointConfig(
            interval_ms=100, tolerable_failed_checkpoints=1_000_000
        )
    )

    def effective_config(self) -> CheckpointConfig:
        mode = (
            CheckpointingMode.AT_LEAST_ONCE
            if self.mode is AlignmentMode.AT_LEAST_ONCE
            else CheckpointingMode.EXACTLY_ONCE
        )
        d = self.config.to_dict()
        d.update(
            mode=mode.value,
            unaligned=self.mode is AlignmentMode.UNALIGNED,
            aligned_checkpoint_timeout_ms=self.aligned_timeout_ms,
            max_parallelism=self.max_parallelism,
        )
        return CheckpointConfig.from_dict(d)


class SimulatedJob:
    """See the module docstring. All methods are safe to call in any order; they return
    quietly when there is nothing to do."""

    def __init__(
        self,
        spec: SimulationSpec,
        store: CheckpointStore,
        sink: MemorySink | None = None,
        clock: ManualClock | None = None,
    ) -> None:
        self.spec = spec
        self.config = spec.effective_config()
        self.store = store
        self.sink = sink or MemorySink()
        self.clock = clock or ManualClock(0)
        self.logs = generate_logs(spec.seed, spec.channels, spec.rows_per_channel, spec.keys)
        self.triggered_ids: list[int] = []
        self.restarts = 0
        self.start(spec.parallelism)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, parallelism: int) -> None:
        """(Re)start from the latest completed checkpoint at *parallelism*."""
        self.parallelism = parallelism
        restored = self.store.latest_completed()
        self.restored_from = restored
        recover_sink(self.sink.committer, restored, self.store)
        offsets = restored.offsets() if restored else {}
        self.sources = [
            SourceSplit(c, self.logs[c], offsets.get((SOURCE, c), 0))
            for c in range(self.spec.channels)
        ]
        self.queues: dict[tuple[int, int], deque[pa.Table]] = {
            (c, s): deque() for c in range(self.spec.channels) for s in range(parallelism)
        }
        self.inbox: deque[AcknowledgeCheckpoint | DeclineCheckpoint] = deque()
        self.carried = CarriedTransactions()  # as the coordinator host keeps them
        self.notifications: deque[tuple[str, TaskId, int, str]] = deque()
        self.tasks = [
            OperatorTask(
                TaskId(VERTEX, s),
                channels=range(self.spec.channels),
                operators=[AmountTotals(), RunningCount("counter", "user_id")],
                parallelism=parallelism,
                store=self.store,
                respond=self.inbox.append,
                clock=self.clock,
                mode=self.spec.mode,
                aligned_timeout_ms=self.spec.aligned_timeout_ms,
                max_parallelism=self.spec.max_parallelism,
                sink=self.sink,
            )
            for s in range(parallelism)
        ]
        for t in self.tasks:
            t.restore(restored)
        self.coordinator = CheckpointCoordinator(
            self.config,
            self.store,
            self,
            tasks_to_trigger=[s.task_id for s in self.sources],
            tasks_to_ack=[s.task_id for s in self.sources] + [t.task_id for t in self.tasks],
            clock=self.clock,
        )
        self.coordinator.start()

    def crash(self, parallelism: int | None = None) -> None:
        """Lose all volatile state, then restart (optionally at another parallelism)."""
        self.sink.crash()
        self.restarts += 1
        self.start(parallelism or self.parallelism)

    # -- TaskGateway -------------------------------------------------------------------------
    def trigger(self, task: TaskId, barrier: CheckpointBarrier) -> None:
        if task.subtask == 0:
            self.triggered_ids.append(barrier.checkpoint_id)
        src = self.sources[task.subtask]
        for s in range(self.parallelism):
            self.queues[(src.channel, s)].append(barrier_table(barrier, src.channel, src.position))
        snap = TaskSnapshot(task, offsets=(SourceOffset(SOURCE, src.channel, src.position),))
        handle = self.store.write_task_state(barrier.checkpoint_id, snap)
        self.inbox.append(AcknowledgeCheckpoint(barrier.checkpoint_id, task, handle))

    def notify_complete(self, task: TaskId, checkpoint_id: int) -> None:
        if task.vertex == SOURCE and task.subtask == 0:  # once per checkpoint
            self.notifications.append(("commit", task, checkpoint_id, ""))
        self.notifications.append(("complete", task, checkpoint_id, ""))

    def notify_aborted(self, task: TaskId, checkpoint_id: int, reason: str) -> None:
        self.notifications.append(("aborted", task, checkpoint_id, reason))

    # -- actions -----------------------------------------------------------------------------
    def emit(self, channel: int, n: int) -> int:
        """Source *channel* emits up to *n* records into the shuffle. Returns how many."""
        src = self.sources[channel]
        end = min(src.position + n, src.log.num_rows)
        if end <= src.position:
            return 0
        rows = stream_rows(src.log, channel, src.position, end)
        src.position = end
        owner = subtasks_for_keys(
            rows.column("user_id"), self.spec.max_parallelism, self.parallelism
        )
        for s in range(self.parallelism):
            part = rows.filter(pc.equal(owner, s))
            if part.num_rows:
                self.queues[(channel, s)].append(part)
        return int(rows.num_rows)

    def deliver(self, subtask: int, channels: list[int], items: int) -> int:
        """Subtask takes up to *items* queued items from each of *channels*, as one batch."""
        subtask %= self.parallelism
        taken: list[pa.Table] = []
        for c in channels:
            q = self.queues[(c % self.spec.channels, subtask)]
            for _ in range(min(items, len(q))):
                taken.append(q.popleft())
        if taken:
            self.tasks[subtask].process(pa.concat_tables(taken))
        return len(taken)

    def deliver_acks(self, n: int) -> None:
        """Deliver up to *n* acknowledgements/declines to the coordinator."""
        for _ in range(min(n, len(self.inbox))):
            msg = self.inbox.popleft()
            if isinstance(msg, AcknowledgeCheckpoint):
                self.carried.record(msg)
                self.coordinator.receive_acknowledge(msg)
            else:
                self.coordinator.receive_decline(msg)

    def deliver_notifications(self, n: int) -> None:
        """Deliver up to *n* notify-complete/aborted messages to the tasks."""
        for _ in range(min(n, len(self.notifications))):
            kind, task, cid, reason = self.notifications.popleft()
            if kind == "commit":  # the global committer
                try:
                    checkpoint = self.store.get(cid)
                except CheckpointNotFoundError:
                    continue  # retained no more: a later checkpoint carries its transactions
                commit_checkpoint(self.sink.committer, checkpoint, self.store, self.carried)
                self.carried.forget_upto(cid)
                continue
            if task.vertex != VERTEX:
                continue
            t = self.tasks[task.subtask]
            if kind == "complete":
                t.notify_complete(cid)
            else:
                t.notify_aborted(cid, reason)

    def advance(self, ms: int) -> None:
        """Time passes: periodic triggers, timeouts, aligned-checkpoint timeouts."""
        self.clock.advance(ms)
        if self.coordinator.status is CoordinatorStatus.RUNNING:
            self.coordinator.tick()
        for t in self.tasks:
            t.tick()

    def decline_pending(self) -> None:
        """An operator subtask declines the oldest pending checkpoint."""
        pending = self.coordinator.pending
        if pending:
            self.inbox.append(
                DeclineCheckpoint(
                    pending[0].checkpoint_id, self.tasks[0].task_id, "simulated failure"
                )
            )

    # -- running to the end --------------------------------------------------------------------
    def drain(self) -> None:
        """Deliver every queued item and message."""
        while any(self.queues.values()) or self.inbox or self.notifications:
            for s in range(self.parallelism):
                self.deliver(s, list(range(self.spec.channels)), 1_000_000)
            self.deliver_acks(1_000_000)
            self.deliver_notifications(1_000_000)

    def finish(self, max_rounds: int = 100) -> CompletedCheckpoint:
        """Emit all remaining input, deliver everything, then take the *final* checkpoint
        (always aligned) and deliver its notifications, so every output is committed."""
        for c in range(self.spec.channels):
            self.emit(c, self.logs[c].num_rows)
        self.drain()
        final = self.coordinator.trigger_checkpoint(final=True)
        for _ in range(max_rounds):
            self.drain()
            if final.completed is not None:
                return final.completed
            if final.failure is not None:
                final = self.coordinator.trigger_checkpoint(final=True)
            else:
                self.advance(self.config.timeout_ms)  # let anything stuck expire
        raise SparkCkptError("the final checkpoint did not complete")

    def stop(self, status: JobStatus = JobStatus.SUSPENDED) -> None:
        self.coordinator.shutdown(status)

"""The foreachBatch aligner: user operators with keyed state over ``ckpt-source``
micro-batches, exactly-once into a two-phase-commit sink.

It runs in the user's driver process (``foreachBatch``), organised per subtask: each subtask
owns a key-group range and is an :class:`~spark_ckpt.task.OperatorTask` with its own barrier
aligner over the source channels. A micro-batch (collected as one Arrow table) is routed
with one vectorized pass — data rows to the subtask owning their key group, barrier rows to
every subtask, original order kept — so subtasks could later move onto executors unchanged.

Barriers of one checkpoint may arrive in different micro-batches on different channels (a
lagging channel): the aligners carry their state across batches. Acknowledgements go to the
coordinator through the mailbox; completions are read back from the checkpoint store at the
start of the next batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .aligner import AlignmentMode
from .barrier import CHECKPOINT_ID
from .checkpoint import CompletedCheckpoint
from .clock import Clock, SystemClock
from .handle import AcknowledgeCheckpoint, DeclineCheckpoint, TaskId
from .host import SOURCE_TASK
from .keygroup import subtasks_for_keys
from .mailbox import Mailbox, SinkSpec, Topology, write_topology
from .operator import KeyedOperator
from .sink import TwoPhaseCommitSink
from .store import CheckpointStore
from .task import OperatorTask


class BatchAligner:
    """See the module docstring. Construct it before the query starts: it publishes the
    topology (so the coordinator knows whom to wait for) and restores state from the latest
    completed checkpoint."""

    def __init__(
        self,
        root: str,
        store: CheckpointStore,
        *,
        operators: Sequence[KeyedOperator],
        channels: int,
        parallelism: int = 2,
        mode: AlignmentMode = AlignmentMode.ALIGNED,
        aligned_timeout_ms: int = 0,
        max_parallelism: int = 128,
        sink: TwoPhaseCommitSink | None = None,
        sink_spec: SinkSpec | None = None,
        vertex: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.root = root
        self.store = store
        self.operators = tuple(operators)
        self.vertex = vertex or self.operators[0].uid
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.key_column = self.operators[0].key_column
        self.mailbox = Mailbox(root)
        self.clock: Clock = clock or SystemClock()
        self._outbox: list[AcknowledgeCheckpoint | DeclineCheckpoint] = []
        self.tasks = [
            OperatorTask(
                TaskId(self.vertex, s),
                channels=range(channels),
                operators=self.operators,
                parallelism=parallelism,
                store=store,
                respond=self._outbox.append,
                clock=self.clock,
                mode=mode,
                aligned_timeout_ms=aligned_timeout_ms,
                max_parallelism=max_parallelism,
                sink=sink,
                source_vertex=SOURCE_TASK.vertex,
            )
            for s in range(parallelism)
        ]
        latest = store.latest_completed()
        self.restored_from: CompletedCheckpoint | None = latest
        for t in self.tasks:
            t.restore(latest)
        self._completed_seen = latest.checkpoint_id if latest else 0
        write_topology(root, Topology(self.vertex, parallelism, sink_spec, uuid.uuid4().hex))
        self.rows_processed = 0

    def __call__(self, df: object, batch_id: int) -> None:
        """``foreachBatch`` entry point: collects the micro-batch as Arrow and processes it."""
        self.process(df.toArrow())  # type: ignore[attr-defined]

    def process(self, table: pa.Table) -> None:
        """Process one micro-batch (rows of every channel, channel order kept)."""
        self._notify_completed()
        if table.num_rows:
            for task, part in zip(self.tasks, self._route(table), strict=True):
                if part.num_rows:
                    task.process(part)
            self.rows_processed += table.num_rows
        for task in self.tasks:
            task.tick()
        self._flush()

    def _route(self, table: pa.Table) -> list[pa.Table]:
        if self.parallelism == 1:
            return [table]
        control = pc.is_valid(table.column(CHECKPOINT_ID))
        control_np = control.to_numpy(zero_copy_only=False)
        owner = np.full(table.num_rows, -1, dtype=np.int32)
        data_idx = np.flatnonzero(~control_np)
        if len(data_idx):
            keys = table.column(self.key_column).take(pa.array(data_idx))
            owner[data_idx] = subtasks_for_keys(
                keys, self.max_parallelism, self.parallelism
            ).to_numpy(zero_copy_only=False)
        return [table.filter(pa.array(control_np | (owner == s))) for s in range(self.parallelism)]

    def _notify_completed(self) -> None:
        newer = [
            c.checkpoint_id
            for c in self.store.list_completed()
            if c.checkpoint_id > self._completed_seen
        ]
        for cid in sorted(newer):
            for task in self.tasks:
                task.notify_complete(cid)
            self._completed_seen = cid

    def _flush(self) -> None:
        outbox = list(self._outbox)
        self._outbox.clear()  # in place: the tasks hold its bound append
        for message in outbox:
            self.mailbox.post(message)

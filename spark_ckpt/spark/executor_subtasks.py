"""Subtasks on executors: the operator chain runs inside Spark tasks, next to its state.

``Pipeline.run(..., placement="executors")`` builds, instead of a ``foreachBatch`` function,
this query over the ``ckpt-source`` DataFrame (``docs/design/executors.md``)::

    source ─ mapInArrow(Router) ─ groupBy(_ckpt_subtask)
           ─ applyInPandasWithState(SubtaskFunction) ─ writeStream.format("noop")

* :class:`Router` (executors, where the source's partitions are read): cuts every Arrow
  batch into one *payload* per subtask, the Arrow IPC bytes of the data rows of the
  subtask's key groups plus every control row (barriers reach every subtask). Spark's
  shuffle moves a few binary rows per batch and subtask, not the rows one by one, and the
  rows keep their Arrow types exactly.
* :class:`SubtaskFunction` (executors, one Spark task per subtask and micro-batch, in the
  state-store partition that Spark's ``StateStoreCoordinator`` keeps on one executor): the
  subtask's rows of the micro-batch in channel order, data rows first and barrier rows
  after them (the source aligns, :mod:`spark_ckpt.sources.stream_offset`), through an
  :class:`~spark_ckpt.runtime.task.OperatorTask`: operators, keyed and operator state,
  output staged into the Delta table, snapshots written to the checkpoint store and
  acknowledged through the run's mailbox — all in the executor's Python worker. No data row
  passes through the driver.

**State between micro-batches.** The subtask's state after a micro-batch is an image
(:mod:`spark_ckpt.runtime.subtask_image`) published into the executor's cache
(:mod:`spark_ckpt.spark.executor_cache`), and a segment of its durable changelog
(:mod:`spark_ckpt.spark.changelog`: what the micro-batch changed) under the pipeline root.
Spark's own state for the group holds only the fence naming both (run, micro-batch, attempt
token, executor). The next micro-batch loads exactly the image its fence names, never a
zombie's, a retried attempt's or another run's; if its executor does not hold it (the
subtask moved, the executor was lost) it rebuilds from the changelog chain the fence names.
The first micro-batch of a run restores the subtask's key groups from the checkpoint the
run's coordinator chose. Only when neither is possible (a remote pipeline root keeps no
changelog, a segment is gone) does the micro-batch fail with :class:`SubtaskStateLostError`;
the query fails and :meth:`Pipeline.run <spark_ckpt.spark.pipeline.Pipeline.run>` restarts
it from the latest completed checkpoint.

**Exactly-once.** A retried or speculative attempt of a micro-batch starts from the same
fence, stages its output under new names and writes its snapshot idempotently per
(subtask, checkpoint); the coordinator takes the first acknowledgement, and a checkpoint's
commit never adds a transaction of a checkpoint already committed
(:meth:`~spark_ckpt.delta.sink_committer.DeltaSinkCommitter.commit_checkpoint`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ProtocolError, StateError, StoreError
from spark_ckpt.protocol.barrier import CHANNEL, CHECKPOINT_ID, OFFSET
from spark_ckpt.protocol.clock import SystemClock
from spark_ckpt.protocol.handle import (
    AcknowledgeCheckpoint,
    CacheMetrics,
    DeclineCheckpoint,
    TaskId,
    encode_table,
)
from spark_ckpt.runtime.subtask_image import SubtaskImage, export_images, import_images
from spark_ckpt.runtime.task import CHAIN_VERTEX, OperatorTask
from spark_ckpt.spark.changelog import MAX_CHAIN, Segment, SubtaskChangelog
from spark_ckpt.spark.executor_cache import (
    FENCE_SCHEMA,
    CacheKey,
    ExecutorStateCache,
    Fence,
    StateImage,
    attempt_token,
    current_batch_id,
)
from spark_ckpt.spark.foreach_batch import AlignerSpec
from spark_ckpt.spark.host import SOURCE_TASK
from spark_ckpt.spark.mailbox import Mailbox
from spark_ckpt.spark.run import RunFiles
from spark_ckpt.state.keygroup import subtasks_for_keys
from spark_ckpt.testing import faults

# pyspark's own pandas serializer of applyInPandasWithState concatenates the group's (empty)
# state frame with its rows and trips a pandas FutureWarning on every micro-batch, in the
# executors' Python workers (which import this module when they unpickle the function)
warnings.filterwarnings(
    "ignore", category=FutureWarning, module=r"pyspark\.sql\.pandas\.serializers"
)

#: The routing columns between :class:`Router` and :class:`SubtaskFunction`.
SUBTASK = "_ckpt_subtask"
PAYLOAD = "_ckpt_payload"
ROUTED_SCHEMA = f"{SUBTASK} int, {PAYLOAD} binary"
#: What each subtask reports per micro-batch (the query's output, discarded by ``noop``).
REPORT_SCHEMA = "subtask int, batch long, rows long, outcome string, load_ms double"


class SubtaskStateLostError(StateError):
    """A subtask's state after the previous micro-batch is neither where its task runs nor
    rebuildable from its changelog: the run restarts from the latest completed
    checkpoint."""


@dataclass(frozen=True)
class Router:
    """``mapInArrow`` function (executors): each Arrow batch of the source's rows as one
    payload row per subtask (see the module docstring). Picklable."""

    key_column: str
    parallelism: int
    max_parallelism: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            table = pa.Table.from_batches([batch])
            if table.num_rows == 0:
                continue
            control = pc.is_valid(table.column(CHECKPOINT_ID)).to_numpy(zero_copy_only=False)
            owner = np.full(table.num_rows, -1, dtype=np.int64)
            data = np.flatnonzero(~control)
            if len(data):
                keys = table.column(self.key_column).take(pa.array(data))
                owner[data] = subtasks_for_keys(
                    keys, self.max_parallelism, self.parallelism
                ).to_numpy(zero_copy_only=False)
            subtasks, payloads = [], []
            for s in range(self.parallelism):
                mine = table.filter(pa.array(control | (owner == s)))
                if mine.num_rows:
                    subtasks.append(s)
                    payloads.append(encode_table(mine))
            yield pa.RecordBatch.from_arrays(
                [pa.array(subtasks, pa.int32()), pa.array(payloads, pa.binary())],
                names=[SUBTASK, PAYLOAD],
            )


def subtask_rows(payloads: list[bytes]) -> pa.Table:
    """A subtask's rows of one micro-batch from its payloads (in any order): data rows in
    channel order, then the control rows in channel order. The source emits a channel's
    barriers after its last data row of the batch, so this keeps every channel's order."""
    table = pa.concat_tables([pa.ipc.open_stream(pa.py_buffer(p)).read_all() for p in payloads])
    order = pc.sort_indices(
        pa.table(
            {
                "control": pc.is_valid(table.column(CHECKPOINT_ID)),
                "channel": table.column(CHANNEL),
                "offset": table.column(OFFSET),
                "checkpoint": table.column(CHECKPOINT_ID),
            }
        ),
        sort_keys=[(c, "ascending") for c in ("control", "channel", "offset", "checkpoint")],
    )
    return table.take(order)


@dataclass(frozen=True)
class SubtaskFunction:
    """``applyInPandasWithState`` function of one run (executors): one subtask's micro-batch
    (see the module docstring). Picklable: it builds its runtime in the process that calls
    it, at every call."""

    #: the run's job, as for the subtasks in the driver (``pipelined`` does not apply)
    spec: AlignerSpec

    @property
    def parallelism(self) -> int:
        return self.spec.parallelism

    @property
    def max_parallelism(self) -> int:
        return self.spec.max_parallelism

    def __call__(self, key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        import pandas as pd

        subtask = int(key[0])
        payloads = [p for pdf in pdfs for p in pdf[PAYLOAD].tolist()]
        fence = Fence.from_row(state.get) if state.exists else None
        batch_id = current_batch_id()
        if batch_id is None:
            raise ProtocolError("a subtask runs inside a streaming query's task")
        start = time.perf_counter()
        task, writer, outcome, segment = self._open(subtask, fence)
        load_ms = (time.perf_counter() - start) * 1000
        task.cache = (task.cache or CacheMetrics()).add(hit=outcome == "hit", ms=round(load_ms))
        table = subtask_rows(payloads)
        task.process(table)
        task.tick()
        if task.sealed_transactions() and task.sink is not None:
            task.forget_committed(task.sink.committer.committed_checkpoint())
        token = attempt_token()
        changelog = self._changelog(subtask)
        snapshot = any(task.backends[op.uid].pending_snapshots() for op in task.operators)
        changes = (
            changelog is not None
            and segment is not None
            and not snapshot
            and segment.length < MAX_CHAIN
        )
        image, part = export_images(task, writer, changes=changes)
        meta = dict(image.meta)
        if changelog is not None:
            published = changelog.publish(batch_id, token, part, segment)
            meta["segment"] = asdict(published)
        cache = ExecutorStateCache.for_this_executor()
        fenced = cache.publish(
            self._key(subtask),
            batch_id,
            StateImage(image.tables, meta),
            token=token,
            previous=fence,
        )
        state.update(fenced.to_row())
        yield pd.DataFrame(
            {
                "subtask": [subtask],
                "batch": [batch_id],
                "rows": [table.num_rows],
                "outcome": [outcome],
                "load_ms": [load_ms],
            }
        )

    def _key(self, subtask: int) -> CacheKey:
        return CacheKey(self.spec.root, self.spec.run_id, subtask)

    def _changelog(self, subtask: int) -> SubtaskChangelog | None:
        if not SubtaskChangelog.available(self.spec.root):
            return None
        return SubtaskChangelog(self.spec.root, self.spec.run_id, subtask)

    def _open(
        self, subtask: int, fence: Fence | None
    ) -> tuple[OperatorTask, Any, str, Segment | None]:
        """The subtask's task, with its state: the image its fence names in this executor's
        cache (``hit``), else the changelog's chain the fence names (``rebuilt``), or — the
        run's first micro-batch — the run's restore point (``restored``); and the changelog
        segment the state stands at (None: none yet)."""
        from spark_ckpt.delta.sink import DeltaSink
        from spark_ckpt.delta.store import DeltaCheckpointStore

        store = faults.faulty_store(DeltaCheckpointStore(self.spec.root), self.spec.root)
        sink = DeltaSink(self.spec.output, pipeline=self.spec.pipeline)
        mailbox = Mailbox(self.spec.root, self.spec.run_id)

        def respond(message: AcknowledgeCheckpoint | DeclineCheckpoint) -> None:
            mailbox.post(message)

        task = OperatorTask(
            TaskId(CHAIN_VERTEX, subtask),
            channels=range(self.spec.channels),
            operators=self.spec.operators,
            parallelism=self.spec.parallelism,
            store=store,
            respond=respond,
            clock=SystemClock(),
            mode=self.spec.mode,
            max_parallelism=self.spec.max_parallelism,
            sink=sink,
            source_vertex=SOURCE_TASK.vertex,
            tracer=self.spec.tracer,
        )
        if fence is None:
            files = RunFiles(self.spec.root, self.spec.run_id)
            point = files.restore_point()
            if point is None:
                raise ProtocolError(
                    f"run {self.spec.run_id} has no restore point: its coordinator did not start"
                )
            checkpoint = None if point.checkpoint_id is None else store.get(point.checkpoint_id)
            try:
                task.restore(checkpoint)
            except StateError as e:
                # the state does not fit the operators: every restart would fail alike
                files.write_fatal(f"{type(e).__name__}: {e}")
                raise
            return task, sink.writer, "restored", None
        lookup = ExecutorStateCache.for_this_executor().lookup(self._key(subtask), fence)
        if lookup.image is not None:
            image = SubtaskImage(lookup.image.tables, lookup.image.meta)
            import_images(task, sink.writer, [image])
            found = lookup.image.meta.get("segment")
            segment = None if found is None else _segment(found)
            return task, sink.writer, "hit", segment
        changelog = self._changelog(subtask)
        if changelog is None:
            raise SubtaskStateLostError(
                f"subtask {subtask} of run {self.spec.run_id}: its state after micro-batch "
                f"{fence.batch_id} is not on this executor ({lookup.miss}), and the remote "
                "pipeline root keeps no changelog; the run restarts from the latest "
                "completed checkpoint"
            )
        try:
            images, segment = changelog.chain(fence.batch_id, fence.token)
        except StoreError as e:
            raise SubtaskStateLostError(
                f"subtask {subtask} of run {self.spec.run_id}: its state after micro-batch "
                f"{fence.batch_id} is not on this executor ({lookup.miss}) and cannot be "
                f"rebuilt ({e}); the run restarts from the latest completed checkpoint"
            ) from e
        import_images(task, sink.writer, images)
        return task, sink.writer, "rebuilt", segment

    def retire(self) -> None:
        """Nothing to release in the driver: the runtime lives in the executors' tasks."""


def _segment(d: dict[str, Any]) -> Segment:
    base = d["base"]
    return Segment(
        int(d["batch_id"]), str(d["token"]), (int(base[0]), str(base[1])), int(d["length"])
    )


def subtask_query(df: Any, function: SubtaskFunction, key_column: str) -> Any:
    """The streaming DataFrame of the executor path over the ``ckpt-source`` DataFrame *df*
    (see the module docstring); start it with ``writeStream.format("noop")`` in update
    mode."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    routed = df.mapInArrow(
        Router(key_column, function.parallelism, function.max_parallelism), ROUTED_SCHEMA
    )
    return routed.groupBy(SUBTASK).applyInPandasWithState(
        function, REPORT_SCHEMA, FENCE_SCHEMA, "update", GroupStateTimeout.NoTimeout
    )

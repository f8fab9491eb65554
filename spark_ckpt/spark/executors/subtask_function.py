"""Subtasks on executors: the operator chain runs inside Spark tasks, next to its state.

``Pipeline.run`` (``placement="executors"``, the default) builds, instead of a ``foreachBatch``
function, this query over the ``ckpt-source`` DataFrame (``docs/design/executors.md``)::

    ckpt-source (routed) ─ groupBy(_ckpt_group)
           ─ applyInPandasWithState(SubtaskFunction) ─ writeStream.format("noop")

The source's ``read()`` routes (:mod:`spark_ckpt.spark.executors.routing`): each channel's rows
of the micro-batch become one Arrow IPC *payload* per subtask (the data rows of its key groups
plus every control row), so Spark's shuffle moves a few binary rows per channel and subtask,
not the rows one by one, and the rows keep their Arrow types. :class:`SubtaskFunction` then
runs on the executors, one Spark task per subtask and micro-batch, in the state-store
partition Spark's ``StateStoreCoordinator`` keeps on one executor: the task hands the
payloads to the subtask's host (:mod:`spark_ckpt.spark.executors.subtask_host`), which runs
them, data rows first and barrier rows after, through an
:class:`~spark_ckpt.runtime.task.OperatorTask` (operators, state, staged output, snapshots,
acknowledgements). No data row passes through the driver.

**State between micro-batches** (``docs/architecture.md``, *State on the executors*). The task
stays alive in its host (:class:`LiveSubtasks`), and every micro-batch publishes a segment of
the subtask's durable changelog (:mod:`spark_ckpt.spark.executors.changelog`): the keys it
changed (the whole state only at a run's start; every
:data:`~spark_ckpt.spark.executors.changelog.MAX_CHAIN`-th, a fold of the changes since the
full segment). Spark's own state for the group holds only the *fence* naming the segment (run,
micro-batch, attempt token, executor). The next micro-batch continues the task its host holds
at that fence (``hit``), applies the segments since (``caught-up``), rebuilds exactly its key
groups from the chain (``rebuilt``), or, at a run's first micro-batch, restores them from the
checkpoint the run's coordinator chose (``restored``) — never a zombie's, a retried attempt's
or another run's state. A task kept alive keeps its incremental snapshot base, and one caught
up or rebuilt rebases (:meth:`SubtaskFunction._rebase`): its checkpoints write what changed,
not the state. The changelog lives under the pipeline root, local or on an object store
(:mod:`spark_ckpt.spark.executors.changelog`). State that cannot be found fails the
micro-batch with :class:`SubtaskStateLostError`, and the run restarts from the latest
completed checkpoint.

**Exactly-once.** A retried or speculative attempt starts from the same fence, stages its
output under new names and writes its snapshot idempotently per (subtask, checkpoint); the
coordinator takes the first acknowledgement, and a checkpoint's commit never adds a
transaction of a checkpoint already committed.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.runs import RunFiles
from spark_ckpt.errors import ProtocolError, StateError, StoreError
from spark_ckpt.protocol.clock import SystemClock
from spark_ckpt.protocol.state_handles import (
    AcknowledgeCheckpoint,
    CacheMetrics,
    DeclineCheckpoint,
    TaskId,
)
from spark_ckpt.runtime.stage_output import StageOutput
from spark_ckpt.runtime.subtask_image import (
    SubtaskImage,
    catch_up,
    export_folded_image,
    export_image,
    import_images,
    reattach,
)
from spark_ckpt.runtime.task import SOURCE_TASK, OperatorTask
from spark_ckpt.spark.executors.changelog import MAX_CHAIN, Segment, SubtaskChangelog
from spark_ckpt.spark.executors.executor_cache import (
    CacheKey,
    Fence,
    attempt_token,
    current_batch_id,
    executor_identity,
)
from spark_ckpt.spark.executors.routing import (
    GROUP,
    PAYLOAD,
    ROUTED_SCHEMA,
    SUBTASK,
    Router,
    stage_rows,
    subtask_rows,
)
from spark_ckpt.spark.executors.snapshot_threads import SNAPSHOTS, WRITER, decline_lost_writes
from spark_ckpt.spark.executors.subtask_errors import SubtaskStateLostError
from spark_ckpt.spark.executors.subtask_host import SUBTASK_HOSTS, BatchDone, MicroBatch
from spark_ckpt.spark.subtask_spec import AlignerSpec, StageRole
from spark_ckpt.state.backends.memory import release_free_memory

# pyspark's own applyInPandasWithState concatenates a group's output with empty (all-NA)
# padding frames and trips pandas' FutureWarning on concatenation of empty entries, twice per
# micro-batch, in the executors' Python workers (which import this module when they unpickle
# the function): in its pandas serializer up to PySpark 4.2, in ``pyspark.worker`` from 4.3.
# Only that warning of those two modules is silenced.
warnings.filterwarnings(
    "ignore",
    message="The behavior of DataFrame concatenation with empty or all-NA entries",
    category=FutureWarning,
    module=r"pyspark\.(sql\.pandas\.serializers|worker)",
)

#: What each subtask reports per micro-batch (the query's output, discarded by ``noop``).
REPORT_SCHEMA = "subtask int, batch long, rows long, outcome string, load_ms double"


@dataclass(frozen=True)
class SubtaskFunction:
    """``applyInPandasWithState`` function of one run (executors): one subtask's micro-batch
    (see the module docstring). Picklable: it builds its runtime in the process that calls
    it, at every call."""

    #: the run's job, as for the subtasks in the driver (``pipelined`` does not apply)
    spec: AlignerSpec
    #: which stage's subtasks this function runs (:mod:`spark_ckpt.runtime.stage`; 0: the
    #: first, which reads the source)
    position: int = 0

    @cached_property
    def role(self) -> StageRole:
        """The stage whose subtasks this function runs."""
        return self.spec.role(self.position)

    @cached_property
    def downstream(self) -> Router | None:
        """How this stage's output reaches the next stage's subtasks (None: the last)."""
        following = self.role.following
        if following is None:
            return None
        assert following.parallelism is not None and following.max_parallelism is not None
        return Router(
            following.key_column,
            following.parallelism,
            following.max_parallelism,
            self.spec.partitions,
        )

    @property
    def parallelism(self) -> int:
        return self.role.parallelism

    @property
    def max_parallelism(self) -> int:
        return self.role.max_parallelism

    def __call__(self, key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        """The Spark task's side (a Python worker): hands the subtask's micro-batch to the
        subtask's host on this executor (:mod:`spark_ckpt.spark.executors.subtask_host`), then keeps
        the fence it answers in Spark's state (*state*: ``GroupState``, or the value state of
        a later stage, :mod:`spark_ckpt.spark.executors.stage_processor`). Yields the subtask's
        report, or (a stage with a next one) its output routed to the next stage's subtasks."""
        import pandas as pd

        self.spec.storage.install()  # the pipeline's storage options, in this worker
        frames = list(pdfs)  # the group's rows: one subtask's (key: its group key)
        subtask = int(_column(frames[0], SUBTASK).iloc[0])
        payloads = [p for pdf in frames for p in _column(pdf, PAYLOAD).tolist()]
        batch_id = current_batch_id()
        if batch_id is None:
            raise ProtocolError("a subtask runs inside a streaming query's task")
        batch = MicroBatch(
            subtask,
            batch_id,
            attempt_token(),
            executor_identity(),
            Fence.from_row(state.get) if state.exists else None,
        )
        done = SUBTASK_HOSTS.run(self._key(subtask), self, batch, payloads)
        state.update(done.fence.to_row())
        if self.downstream is not None:
            yield pd.DataFrame(
                {
                    GROUP: [self.downstream.groups[s] for s, _ in done.forwarded],
                    SUBTASK: [s for s, _ in done.forwarded],
                    PAYLOAD: [p for _, p in done.forwarded],
                }
            )
            return
        yield pd.DataFrame(
            {
                "subtask": [subtask],
                "batch": [batch_id],
                "rows": [done.rows],
                "outcome": [done.outcome],
                "load_ms": [done.load_ms],
            }
        )

    def run_batch(self, batch: MicroBatch, payloads: list[bytes]) -> BatchDone:
        """Run one micro-batch of one subtask in this process (the subtask's host):
        continue the subtask's live task at the fence, or catch it up, or open a new one;
        process the rows; publish the changelog segment. Returns the fence to keep (see the
        module docstring)."""
        self.spec.storage.install()  # the subtask host's process
        subtask, batch_id, fence = batch.subtask, batch.batch_id, batch.fence
        changelog = self._changelog(subtask)
        start = time.perf_counter()
        live = LIVE_SUBTASKS.take(self._key(subtask))
        resumed = None if live is None else _resume(live, self._key(subtask), fence, changelog)
        if resumed is not None:
            task, writer, outcome, segment = resumed
        else:
            task, writer, outcome, segment = self._open(subtask, fence, changelog)
        if outcome in (CAUGHT_UP, REBUILT):
            if fence is not None:
                decline_lost_writes(task, changelog.segment_meta(fence.batch_id, fence.token))
            self._rebase(task)
        load_ms = (time.perf_counter() - start) * 1000
        hit = outcome in (HIT, CAUGHT_UP)
        task.cache = (task.cache or CacheMetrics()).add(hit=hit, ms=round(load_ms))
        table = subtask_rows(payloads) if self.position == 0 else stage_rows(payloads)
        _notify_committed(task, RunFiles(self.spec.root, self.spec.run_id))
        task.process(table)
        task.tick()
        forwarded = self._forward(task)
        token = batch.token
        image, folded = _segment_image(task, writer, segment)
        image = SubtaskImage(
            image.tables, {**image.meta, WRITER: SNAPSHOTS.writer(self._key(subtask)).to_json()}
        )
        published = changelog.publish(
            batch_id, token, image, segment, executor=batch.executor, folded=folded
        )
        fenced = Fence(self.spec.run_id, batch_id, token, batch.executor)
        reattach(task, writer, image)
        if not _changes_only(segment):
            release_free_memory()  # what a whole or folded image's tables held
        LIVE_SUBTASKS.keep(
            self._key(subtask), LiveSubtask(task, writer, batch_id, token, published)
        )
        return BatchDone(fenced, table.num_rows, outcome, load_ms, forwarded)

    def _forward(self, task: OperatorTask) -> tuple[tuple[int, bytes], ...]:
        """What *task* forwarded in the micro-batch, as one payload per subtask of the next
        stage (none: the last stage)."""
        table = task.forwarded()
        if table is None or self.downstream is None:
            return ()
        routed = self.downstream.route(table)
        return tuple(
            zip(
                routed.column(1).to_pylist(),
                routed.column(2).to_pylist(),
                strict=True,
            )
        )

    def close(self) -> None:
        """The host ends in order (its run ended, or it was idle): the subtasks it kept
        alive end, their operators closed."""
        LIVE_SUBTASKS.close()

    def run_ended(self) -> bool:
        """Whether this run is over, as its driver recorded it (a host of its subtasks then
        ends: the next run has hosts of its own)."""
        status = RunFiles(self.spec.root, self.spec.run_id).status()
        return status is not None and status.ended

    def _key(self, subtask: int) -> CacheKey:
        return CacheKey(self.spec.root, self.spec.run_id, subtask, self.role.vertex)

    def _changelog(self, subtask: int) -> SubtaskChangelog:
        return SubtaskChangelog(self.spec.root, self.spec.run_id, subtask, self.role.vertex)

    def _open(
        self, subtask: int, fence: Fence | None, changelog: SubtaskChangelog
    ) -> tuple[OperatorTask, Any, str, Segment | None]:
        """A new task for the subtask, with its state: the run's restore point (the run's
        first micro-batch: ``restored``), else the changelog's chain the fence names
        (``rebuilt``); and the changelog segment the state stands at (None: none yet)."""
        store = self.spec.store()
        role = self.role
        sink, late_sink, sides = role.sinks(self.spec.pipeline)
        mailbox = Mailbox(self.spec.root, self.spec.run_id)

        def respond(message: AcknowledgeCheckpoint | DeclineCheckpoint) -> None:
            mailbox.post(message)

        task = OperatorTask(
            TaskId(role.vertex, subtask),
            channels=range(role.channels),
            operators=role.operators,
            parallelism=role.parallelism,
            store=store,
            respond=respond,
            clock=SystemClock(),
            mode=self.spec.mode,
            max_parallelism=role.max_parallelism,
            sink=sink,
            source_vertex=SOURCE_TASK.vertex if role.position == 0 else None,
            run_async=SNAPSHOTS.run_async(self._key(subtask)),
            tracer=self.spec.tracer,
            watermark=role.watermark,
            late_sink=late_sink,
            inputs=role.inputs,
            side_sinks=sides,
            forward=None if role.following is None else StageOutput(subtask),
            state_backend=self.spec.state_backend,
        )
        writer: Any = None if sink is None else sink.writer
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
            return task, writer, RESTORED, None
        try:
            images, segment = changelog.chain(fence.batch_id, fence.token)
        except StoreError as e:
            raise SubtaskStateLostError(
                f"subtask {subtask} of run {self.spec.run_id}: its state after micro-batch "
                f"{fence.batch_id} is in no subtask host here and cannot be rebuilt from "
                f"its changelog ({e}); the run restarts from the latest completed checkpoint"
            ) from e
        import_images(task, writer, images)
        return task, writer, REBUILT, segment

    def _rebase(self, task: OperatorTask) -> None:
        """A task that other processes ran meanwhile (rebuilt, or caught up after
        they snapshotted) has no incremental base: build its next snapshots on the latest
        checkpoint the sink committed (:meth:`OperatorTask.rebase
        <spark_ckpt.runtime.task.OperatorTask.rebase>`: what changed since is known from the
        changelog), so that its next checkpoint writes what changed, not the whole state.
        Left as it is (the next snapshot full) when that checkpoint cannot be read or
        rebased onto."""
        from spark_ckpt.delta.delta_store import DeltaCheckpointStore

        if any(b.snapshots.base_checkpoint_id for b in task.backends.values()):
            return
        if task.sink is not None:
            committed = task.sink.committer.committed_checkpoint()
        else:
            committed = RunFiles(self.spec.root, self.spec.run_id).committed() or 0
        if not committed or committed > task.last_snapshot_id:
            return
        try:
            checkpoint = DeltaCheckpointStore(self.spec.root).get(committed)
        except StoreError:
            return  # retention dropped it meanwhile: a full snapshot
        task.rebase(checkpoint)

    def retire(self) -> None:
        """Nothing to release in the driver: the runtime lives in the executors' tasks."""


def _column(pdf: Any, name: str) -> Any:
    """Column *name* of a routed frame (:data:`ROUTED_SCHEMA`), by name or, where Spark hands
    the columns renamed by position (``transformWithStateInPandas`` from PySpark 4.3 rebuilds
    the frames from row tuples, whose field names cannot start with ``_``), by position."""
    if name in pdf.columns:
        return pdf[name]
    return pdf.iloc[:, ROUTED_SCHEMA.names.index(name)]


#: Where a micro-batch found its subtask's state (the ``outcome`` of its report row): its
#: host held it (``hit``), or held an earlier state and applied the changelog since
#: (``caught-up``); a new task loaded the run's restore point (``restored``) or the changelog
#: (``rebuilt``). The first two count as cache hits in the checkpoint statistics.
HIT = "hit"
CAUGHT_UP = "caught-up"
RESTORED = "restored"
REBUILT = "rebuilt"


def _resume(
    live: LiveSubtask, key: CacheKey, fence: Fence | None, changelog: SubtaskChangelog
) -> tuple[OperatorTask, Any, str, Segment | None] | None:
    """The live task of this worker, brought to *fence*: as it is (it ran the previous
    micro-batch), or caught up by the changelog's deltas since its own micro-batch; None
    when it cannot be (the fence is of another run, the chain does not pass through it)."""
    if fence is None or fence.run_id != key.run_id:
        return None
    if (live.batch_id, live.token) == (fence.batch_id, fence.token):
        return live.task, live.writer, HIT, live.segment
    found = changelog.since(fence.batch_id, fence.token, (live.batch_id, live.token))
    if found is None:
        return None
    images, segment = found
    try:
        catch_up(live.task, live.writer, images)
    except (StateError, StoreError):
        return None  # half-updated: a new task rebuilds
    return live.task, live.writer, CAUGHT_UP, segment


def _changes_only(segment: Segment | None) -> bool:
    """Whether a micro-batch at *segment* publishes only what it changed (not a fold, not
    the whole state)."""
    return segment is not None and segment.length < MAX_CHAIN


def _segment_image(
    task: OperatorTask,
    writer: Any,
    segment: Segment | None,
) -> tuple[SubtaskImage, bool]:
    """The image a micro-batch publishes, and whether it is a fold: what the micro-batch changed,
    while the subtask's changelog chain is shorter than
    :data:`~spark_ckpt.spark.executors.changelog.MAX_CHAIN`; then everything changed since the
    chain's full segment, folded into one delta (its size follows the keys changed since, not the
    state); the whole state when there is no chain yet, or when the task cannot fold (it was
    rebuilt since the full segment, or half its keys changed)."""
    if segment is not None:
        if _changes_only(segment):
            return export_image(task, writer, changes=True), False
        folded = export_folded_image(task, writer)
        if folded is not None:
            return folded, True
    return export_image(task, writer), False


def _notify_committed(task: OperatorTask, run: RunFiles) -> None:
    """Before a micro-batch: what the sink committed since the task's previous one (its
    checkpoints completed) becomes the base of the task's next incremental snapshot, and
    its sealed transactions are forgotten. The run's coordinator records each completion
    after its sink commit (``committed.json``, a small file, where the sink's Delta log
    would take a read of its new commits); read only while the task awaits a completion or
    holds sealed transactions."""
    if not (task.sealed_transactions() or task.acknowledged_checkpoints()):
        return
    committed = run.committed()
    if committed:
        task.notify_complete(committed, committed)


@dataclass
class LiveSubtask:
    """A subtask's runtime kept in its host after its micro-batch *batch_id* of
    attempt *token* (the fence Spark kept for it if that attempt won), with its sink writer
    and the changelog segment it stands at."""

    task: OperatorTask
    writer: Any
    batch_id: int
    token: str
    segment: Segment | None


class LiveSubtasks:
    """The subtasks kept alive in this process between micro-batches (the fastest cache:
    nothing to load, and the task's incremental snapshot base survives, so its next
    checkpoint writes only what changed). A subtask host keeps its one subtask here; a task
    that stands at an earlier segment of the subtask's changelog catches up by the deltas
    since (:func:`_resume`).

    An entry is taken out when a micro-batch starts and put back only when it ended well, so
    a micro-batch that failed half-way never leaves a half-updated task behind. One process
    holds at most the subtasks of one run per pipeline root: keeping a run's subtask drops
    those of the root's older runs."""

    def __init__(self) -> None:
        self._live: dict[CacheKey, LiveSubtask] = {}

    def take(self, key: CacheKey) -> LiveSubtask | None:
        """The subtask's runtime if this worker holds it (removed from the registry)."""
        return self._live.pop(key, None)

    def keep(self, key: CacheKey, live: LiveSubtask) -> None:
        """Keep *live* for *key*'s next micro-batch (an older run's subtasks of the root are
        let go: closed)."""
        for other in [k for k in self._live if k.root == key.root and k.run_id != key.run_id]:
            self._live.pop(other).task.close()
        self._live[key] = live

    def close(self) -> None:
        """Let every subtask go, in order: their operators are closed (the host ends)."""
        while self._live:
            _, live = self._live.popitem()
            live.task.close()

    def __len__(self) -> int:
        return len(self._live)


#: This process's live subtasks (one registry per process: a subtask host holds one).
LIVE_SUBTASKS = LiveSubtasks()

"""A job of operator tasks driven micro-batch by micro-batch, for the tests of time: two
source channels of (key, event time) rows, the executors' routing, checkpoints completed at
the batches that ask for one, crashes that lose the tasks and open transactions, restores at
another parallelism, and subtasks rebuilt from their images as on the executors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st

from spark_ckpt.protocol.barrier import (
    KIND,
    ChannelProgress,
    CheckpointBarrier,
    RecordKind,
    SnapshotType,
)
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import AcknowledgeCheckpoint, TaskId
from spark_ckpt.runtime.event_time import WatermarkStrategy, fill_progress
from spark_ckpt.runtime.operator import KeyedOperator
from spark_ckpt.runtime.subtask_image import (
    SubtaskImage,
    catch_up,
    export_image,
    import_images,
)
from spark_ckpt.runtime.task import OperatorTask, commit_checkpoint, recover_sink
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.sources.channel_batch import channel_rows, stream_schema
from spark_ckpt.state.keygroup import subtasks_for_keys
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

USER = pa.schema([("k", pa.int64()), ("ts", pa.timestamp("ms", tz="UTC")), ("v", pa.int64())])
SCHEMA = stream_schema(USER)
MAX_PARALLELISM = 16
CHANNELS = (0, 1)


def value_of(ts: int) -> int:
    """The ``v`` column of a row at event time *ts* (ms)."""
    return ts % 13 - 4


def batch_ms(index: int) -> int:
    """The processing time of micro-batch *index*."""
    return 1000 * (index + 1)


@dataclass
class Batch:
    """One micro-batch: per channel its (key, event time in ms) rows and whether the source
    found it idle."""

    rows: dict[int, list[tuple[int, int]]]
    idle: dict[int, bool]
    checkpoint: bool


@dataclass
class Job:
    """Tasks of *operator* under *strategy*, fed micro-batches as the executors' routing
    does, with a checkpoint store and a memory sink that survive :meth:`crash`."""

    operator: Callable[[], KeyedOperator]
    strategy: WatermarkStrategy
    parallelism: int
    store: InMemoryCheckpointStore = field(default_factory=InMemoryCheckpointStore)
    sink: MemorySink = field(default_factory=MemorySink)
    tasks: list[OperatorTask] = field(default_factory=list)
    acks: list[AcknowledgeCheckpoint] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=lambda: dict.fromkeys(CHANNELS, 0))
    completed: CompletedCheckpoint | None = None
    #: the batch each completed checkpoint ended
    batch_of: dict[int, int] = field(default_factory=dict)
    #: subtasks as on the executors: rebuilt before every micro-batch from their last
    #: ``"image"``, or from their ``"changelog"`` of images, or two ``"workers"`` taking turns,
    #: each catching up on the other's changes (None: kept alive)
    rebuild: str | None = None
    chains: dict[int, list[SubtaskImage]] = field(default_factory=dict)
    #: "workers": per subtask, the idle worker's task and how many images it has seen
    idle: dict[int, tuple[OperatorTask, int]] = field(default_factory=dict)
    #: where the rows dropped as late go (None: nowhere)
    late: MemorySink | None = None

    def _task(self, subtask: int) -> OperatorTask:
        return OperatorTask(
            TaskId("chain", subtask),
            channels=list(CHANNELS),
            operators=[self.operator()],
            parallelism=self.parallelism,
            max_parallelism=MAX_PARALLELISM,
            store=self.store,
            respond=self.acks.append,  # type: ignore[arg-type]
            clock=ManualClock(0),
            sink=self.sink,
            watermark=self.strategy,
            late_sink=self.late,
        )

    def start(self, parallelism: int) -> None:
        self.parallelism = parallelism
        self.acks.clear()
        self.chains.clear()
        self.tasks = [self._task(s) for s in range(parallelism)]
        recover_sink(self.sink.committer, self.completed, self.store)
        if self.late is not None:
            recover_sink(self.late.committer, self.completed, self.store, legacy=False)
        for task in self.tasks:
            task.restore(self.completed)
        self.idle.clear()
        if self.rebuild == "workers":
            for s in range(parallelism):
                other = self._task(s)
                other.restore(self.completed)
                self.idle[s] = (other, 0)

    def crash(self) -> int:
        """Lose the tasks and open transactions; returns the batch to replay from."""
        self.sink.crash()
        if self.late is not None:
            self.late.crash()
        self.tasks = []
        cp = self.completed
        return 0 if cp is None else self.batch_of[cp.checkpoint_id] + 1

    def feed(self, index: int, batch: Batch, positions: dict[int, int]) -> None:
        cid = index + 1
        pieces = []
        for channel in CHANNELS:
            rows = batch.rows.get(channel, [])
            user = pa.table(
                {
                    "k": pa.array([k for k, _ in rows], pa.int64()),
                    "ts": pa.array([t for _, t in rows], USER.field("ts").type),
                    "v": pa.array([value_of(t) for _, t in rows], pa.int64()),
                },
                schema=USER,
            )
            start = positions[channel]
            end = start + len(rows)
            marks = [(end, CheckpointBarrier(cid, cid))] if batch.checkpoint else []
            progress = ChannelProgress(batch_ms(index), batch.idle.get(channel, False))
            pieces.append(channel_rows(user, SCHEMA, channel, start, marks, progress=progress))
            positions[channel] = end
        table, _ = fill_progress(pa.concat_tables(pieces), "ts")
        control = pc.not_equal(table.column(KIND), RecordKind.DATA.code).to_numpy(
            zero_copy_only=False
        )
        keys = pc.fill_null(table.column("k"), 0)
        owner = subtasks_for_keys(keys, MAX_PARALLELISM, self.parallelism).to_numpy()
        for s, task in enumerate(self.tasks):
            task.process(table.filter(pa.array(control | (owner == s))))
        if batch.checkpoint:
            self._complete(cid, index)
        if self.rebuild is not None:
            self.tasks = [self._rebuilt(s, task) for s, task in enumerate(self.tasks)]

    def _rebuilt(self, subtask: int, task: OperatorTask) -> OperatorTask:
        """*task* exported as an image and loaded into a fresh task (another process)."""
        chain = self.chains.setdefault(subtask, [])
        if self.rebuild == "workers":  # the other worker takes the next micro-batch
            chain.append(export_image(task, self.sink.writer, changes=True))
            other, seen = self.idle[subtask]
            self.idle[subtask] = (task, len(chain))
            self.sink.writer.detach(other.sink_uid, subtask)
            catch_up(other, self.sink.writer, chain[seen:])
            return other
        if self.rebuild == "image":
            chain[:] = [export_image(task, self.sink.writer)]
        else:
            chain.append(export_image(task, self.sink.writer, changes=bool(chain)))
        fresh = self._task(subtask)
        import_images(fresh, self.sink.writer, chain)
        return fresh

    def _complete(self, cid: int, index: int) -> None:
        mine = [a for a in self.acks if a.checkpoint_id == cid]
        assert len(mine) == len(self.tasks)
        cp = CompletedCheckpoint(
            cid, SnapshotType.CHECKPOINT, tuple(a.state for a in mine), CheckpointStats(cid, cid)
        )
        self.store.commit(self.store.acquire(), cp)
        commit_checkpoint(self.sink.committer, cp, self.store)
        if self.late is not None:
            commit_checkpoint(self.late.committer, cp, self.store, legacy=False)
        for task in self.tasks:
            task.notify_complete(cid)
        self.completed = cp
        self.batch_of[cid] = index

    def output(self) -> list[tuple[int, int, str]]:
        out = self.sink.committer.output()
        return [] if out is None else sorted(tuple(r.values()) for r in out.to_pylist())


def run(job: Job, batches: list[Batch], crash: int | None, new_parallelism: int) -> None:
    """Run *batches* through *job*; after batch *crash* (rows processed past the last
    checkpoint), lose everything volatile, restore the last completed checkpoint at
    *new_parallelism* and replay from there."""
    job.start(job.parallelism)
    positions = dict.fromkeys(CHANNELS, 0)
    history: list[dict[int, int]] = []
    index = 0
    crashed = False
    while index < len(batches):
        history.append(dict(positions))
        job.feed(index, batches[index], positions)
        if crash is not None and index == crash and not crashed:
            crashed = True
            index = job.crash()
            positions = dict(history[index]) if index < len(history) else positions
            job.start(new_parallelism)
            continue
        index += 1


def watermarks(batches: list[Batch], bound_ms: int) -> list[int | None]:
    """The watermark (ms) after each batch by the documented rule: per channel the largest
    event time seen less the bound and 1 ms (Flink's); the lowest over the channels not idle;
    never lower."""
    top: dict[int, int] = {}
    idle: dict[int, bool] = {}
    mark: int | None = None
    out: list[int | None] = []
    for batch in batches:
        for channel, rows in batch.rows.items():
            for _, t in rows:
                top[channel] = max(top.get(channel, t), t)
        for channel in CHANNELS:
            idle[channel] = batch.idle.get(channel, False)
        active = [c for c in CHANNELS if not idle[c]]
        if active and all(c in top for c in active):
            candidate = min(top[c] for c in active) - bound_ms - 1
            mark = candidate if mark is None else max(mark, candidate)
        out.append(mark)
    return out


#: A drawn stream: its micro-batches, the batch after which the job crashes (None: never),
#: the parallelism before and after the crash.
Stream = tuple[list[Batch], int | None, int, int]


def streams(
    *, batches: int, clock: int, step: int, keys: int, behind: int, ahead: int
) -> st.SearchStrategy[Stream]:
    """Random streams for a :class:`Job`: 2 to *batches* micro-batches, the processing clock
    starting at *clock* and moving 0 to *step* ms per batch; per channel up to 6 rows of keys
    0 to *keys* at event times from *behind* ms before the clock to *ahead* after it; a
    channel without rows idle or not; checkpoints at random and at the last batch; a crash
    after any batch but the last, or none; parallelism 1 to 3 before and after it."""

    @st.composite
    def draw_stream(draw: st.DrawFn) -> Stream:
        n = draw(st.integers(2, batches))
        drawn = []
        now = clock
        for _ in range(n):
            now += draw(st.integers(0, step))
            times = st.integers(now - behind, now + ahead)
            rows = {
                c: draw(st.lists(st.tuples(st.integers(0, keys), times), max_size=6))
                for c in CHANNELS
            }
            idle = {c: not rows[c] and draw(st.booleans()) for c in CHANNELS}
            drawn.append(Batch(rows, idle, draw(st.booleans())))
        drawn[-1].checkpoint = True  # the end: everything committed
        crash = draw(st.one_of(st.none(), st.integers(0, n - 2)))
        return drawn, crash, draw(st.integers(1, 3)), draw(st.integers(1, 3))

    return draw_stream()

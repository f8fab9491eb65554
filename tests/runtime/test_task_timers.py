"""Timers in operator tasks: event-time timers fire when the watermark passes them,
processing-time timers when a micro-batch's processing time does (rows or not), their output
goes through the two-phase-commit sink, and a crash past the last checkpoint with a restore
at another parallelism neither loses nor repeats a timer.

The oracle is a plain loop over the input applying the documented rules (``docs/time.md``):
after each micro-batch a channel's watermark is the largest event time it has seen less the
bound, the subtask's the minimum over channels not idle, never decreasing; rows at or below
the watermark the previous batches left are late (dropped: no allowed lateness)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import example, given, settings
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
from spark_ckpt.runtime.operator import KeyedOperator, RecordOperator
from spark_ckpt.runtime.subtask_image import (
    SubtaskImage,
    catch_up,
    export_image,
    import_images,
)
from spark_ckpt.runtime.task import OperatorTask, commit_checkpoint, recover_sink
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.sources.channel_batch import channel_rows, stream_schema
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import ValueStateDescriptor
from spark_ckpt.state.keygroup import subtasks_for_keys
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

USER = pa.schema([("k", pa.int64()), ("ts", pa.timestamp("ms", tz="UTC"))])
SCHEMA = stream_schema(USER)
OUT = pa.schema([("k", pa.int64()), ("timestamp", pa.int64()), ("domain", pa.string())])
MAX_PARALLELISM = 16
BOUND_MS = 3000
GAP_MS = 5000  # a key is silent once the watermark passes its last event time + GAP_MS
FOLLOW_UP_MS = 1500  # a processing-time timer this long after a key is first seen
CHANNELS = (0, 1)


class Silence(KeyedOperator):
    """Vectorized timers: per key, an event-time timer at its latest event time + GAP_MS
    (moved as later rows come), and, when a key is first seen, a processing-time timer
    FOLLOW_UP_MS later. Emits (k, timestamp, domain) per timer that fires."""

    LAST = ValueStateDescriptor("last", pa.int64())
    SEEN = ValueStateDescriptor("seen", pa.bool_())

    def __init__(self) -> None:
        super().__init__("silence", "k", pa.int64())

    @property
    def output_schema(self) -> pa.Schema:
        return OUT

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        latest = batch.group_by("k").aggregate([("ts", "max")])
        keys = latest.column("k")
        newest = pc.cast(pc.cast(latest.column("ts_max"), pa.timestamp("ms")), pa.int64())
        old = state.get_values(self.LAST, keys)
        moved = pc.or_kleene(pc.is_null(old), pc.greater(newest, old)).fill_null(True)
        had = pc.and_(moved, pc.is_valid(old))
        state.delete_event_time_timers(keys.filter(had), pc.add(old.filter(had), GAP_MS))
        state.register_event_time_timers(keys.filter(moved), pc.add(newest.filter(moved), GAP_MS))
        state.put_values(self.LAST, keys.filter(moved), newest.filter(moved))
        seen = state.get_values(self.SEEN, keys)
        new = pc.is_null(seen)
        if pc.any(new).as_py():
            first = keys.filter(new)
            at = state.current_processing_time + FOLLOW_UP_MS
            state.register_processing_time_timers(first, pa.array([at] * len(first), pa.int64()))
            state.put_values(self.SEEN, first, pa.array([True] * len(first)))
        return None

    def on_timers(self, timers: pa.Table, state: StateContext) -> pa.Table | None:
        if timers.column("domain")[0].as_py() == "event":
            state.clear_values(self.LAST, timers.column("k"))
        return timers.cast(OUT)


@dataclass
class Batch:
    """One micro-batch: per channel its (key, event time in ms) rows and whether the source
    found it idle."""

    rows: dict[int, list[tuple[int, int]]]
    idle: dict[int, bool]
    checkpoint: bool


@dataclass
class Job:
    """Operator tasks fed micro-batches as the executors' routing does, with a checkpoint
    store and a memory sink that survive :meth:`crash`."""

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
    operator: type[KeyedOperator] = Silence

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
            watermark=WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS),
        )

    def start(self, parallelism: int) -> None:
        self.parallelism = parallelism
        self.acks.clear()
        self.chains.clear()
        self.tasks = [self._task(s) for s in range(parallelism)]
        recover_sink(self.sink.committer, self.completed, self.store)
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
                },
                schema=USER,
            )
            start = positions[channel]
            end = start + len(rows)
            marks = [(end, CheckpointBarrier(cid, cid))] if batch.checkpoint else []
            progress = ChannelProgress(1000 * (index + 1), batch.idle.get(channel, False))
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
        for task in self.tasks:
            task.notify_complete(cid)
        self.completed = cp
        self.batch_of[cid] = index

    def output(self) -> list[tuple[int, int, str]]:
        out = self.sink.committer.output()
        return [] if out is None else sorted(tuple(r.values()) for r in out.to_pylist())


def oracle(batches: list[Batch]) -> list[tuple[int, int, str]]:
    """The timers a plain loop fires over *batches* (see the module docstring)."""
    top: dict[int, int] = {}
    idle: dict[int, bool] = {}
    watermark: int | None = None
    last: dict[int, int] = {}
    seen: set[int] = set()
    follow_ups: list[tuple[int, int]] = []
    fired: list[tuple[int, int, str]] = []
    for index, batch in enumerate(batches):
        now = 1000 * (index + 1)
        for channel, rows in batch.rows.items():
            for k, t in rows:
                if watermark is not None and t <= watermark:
                    continue  # late: dropped
                last[k] = max(last.get(k, t), t)
                if k not in seen:
                    seen.add(k)
                    follow_ups.append((k, now + FOLLOW_UP_MS))
                top[channel] = max(top.get(channel, t), t)
        for channel in CHANNELS:
            idle[channel] = batch.idle.get(channel, False)
        active = [c for c in CHANNELS if not idle[c]]
        if active and all(c in top for c in active):
            candidate = min(top[c] for c in active) - BOUND_MS
            watermark = candidate if watermark is None else max(watermark, candidate)
        if watermark is not None:
            for k in [k for k, t in last.items() if t + GAP_MS <= watermark]:
                fired.append((k, last.pop(k) + GAP_MS, "event"))
        for k, at in [f for f in follow_ups if f[1] <= now]:
            fired.append((k, at, "processing"))
        follow_ups = [f for f in follow_ups if f[1] > now]
    return sorted(fired)


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Batch], int | None, int, int]:
    n = draw(st.integers(2, 9))
    batches = []
    clock = 0
    for _ in range(n):
        clock += draw(st.integers(0, 4000))
        rows = {
            c: draw(
                st.lists(
                    st.tuples(st.integers(0, 7), st.integers(clock - 5000, clock + 1000)),
                    max_size=6,
                )
            )
            for c in CHANNELS
        }
        idle = {c: not rows[c] and draw(st.booleans()) for c in CHANNELS}
        batches.append(Batch(rows, idle, draw(st.booleans())))
    batches[-1].checkpoint = True  # the end: everything committed
    crash = draw(st.one_of(st.none(), st.integers(0, n - 2)))
    return batches, crash, draw(st.integers(1, 3)), draw(st.integers(1, 3))


# a worker catching up on timers the other registered (its index of them must be rebuilt)
CATCH_UP = (
    [
        Batch({0: [(0, 0)], 1: []}, {0: False, 1: False}, False),
        Batch({0: [], 1: []}, {0: False, 1: True}, False),
        Batch({0: [(0, 0)], 1: [(1, 0)]}, {0: False, 1: False}, False),
        Batch({0: [(0, 8000)], 1: [(0, 8000)]}, {0: False, 1: False}, True),
    ],
    None,
    1,
    1,
)


@settings(max_examples=120)
@given(streams(), st.sampled_from([None, "image", "changelog", "workers"]))
@example(CATCH_UP, "workers")
def test_timers_fire_once_through_crashes_and_rescales(
    case: tuple[list[Batch], int | None, int, int], rebuild: str | None
) -> None:
    """A crash after batch *crash* (rows processed past the last checkpoint), then a restore
    of the last completed checkpoint at another parallelism and a replay: the committed
    output holds every timer the oracle fires, once — subtasks kept alive, or rebuilt every
    micro-batch from their images as on the executors."""
    batches, crash, parallelism, new_parallelism = case
    job = Job(parallelism, rebuild=rebuild)
    job.start(parallelism)
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
    assert job.output() == oracle(batches)


class Reminder(RecordOperator):
    """Per record: a processing-time timer 2 s after a key's first row; on firing, one row
    with the key's row count."""

    COUNT = ValueStateDescriptor("count", pa.int64())

    def __init__(self) -> None:
        super().__init__("reminder", "k", pa.int64())

    @property
    def output_schema(self) -> pa.Schema:
        return pa.schema([("k", pa.int64()), ("rows", pa.int64()), ("at", pa.int64())])

    def process_record(self, row: dict, state: StateContext) -> list[dict]:
        count = state.value_state(self.COUNT)
        if count.value() is None:
            state.register_processing_time_timer(state.current_processing_time + 2000)
        count.update((count.value() or 0) + 1)
        return []

    def on_timer(self, key: object, timestamp: int, domain: str, state: StateContext) -> list:
        return [{"k": key, "rows": state.value_state(self.COUNT).value(), "at": timestamp}]


def test_processing_time_timers_fire_with_batches_that_carry_no_rows() -> None:
    """Per-record timers: batches 2 and 3 carry only progress (the source's ticks while no
    rows arrive); the timer set at 1 s + 2 s fires with batch 3 (processing time 3 s)."""
    job = Job(1, operator=Reminder)
    job.start(1)
    positions = dict.fromkeys(CHANNELS, 0)
    job.feed(0, Batch({0: [(4, 100), (4, 200)], 1: [(5, 100)]}, {}, False), positions)
    job.feed(1, Batch({}, {}, False), positions)
    assert job.tasks[0].time is not None and job.tasks[0].time.processing_ms == 2000
    job.feed(2, Batch({}, {}, True), positions)
    assert job.output() == [(4, 2, 3000), (5, 1, 3000)]

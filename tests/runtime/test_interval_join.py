"""The interval join over two inputs, in operator tasks fed micro-batch by micro-batch as on
the executors: both inputs' rows in their union form, routed by their key, each channel's
watermark by its own input's bound, checkpoints, a crash past the last checkpoint and a
restore at another parallelism.

The oracle is pandas over the whole input, independent of the operator: rows late by the
documented rule (at or below the watermark the previous micro-batches left; a channel's
watermark is its largest event time less its input's bound and 1 ms, the subtask's the lowest
over channels not idle) are dropped first; then an inner join on the key with the time
condition, plus, for an outer join, the rows of its side that no pair took and whose last
possible match the final watermark passed."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import ConfigError
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
from spark_ckpt.runtime.joins import IntervalJoin, JoinType
from spark_ckpt.runtime.task import OperatorTask, commit_checkpoint, recover_sink
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.sources.channel_batch import channel_rows, stream_schema
from spark_ckpt.sources.inputs import INPUT_KEY, INPUT_TIME, Inputs, InputSpec
from spark_ckpt.state.keygroup import subtasks_for_keys
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

TS = pa.timestamp("ms", tz="UTC")
LEFT = pa.schema([("k", pa.int64()), ("ts", TS), ("lv", pa.int64())])
RIGHT = pa.schema([("k", pa.int64()), ("ts", TS), ("rv", pa.int64())])
INPUTS = Inputs((InputSpec("left", 2, "k", "ts"), InputSpec("right", 2, "k", "ts")))
UNION = INPUTS.union_schema({"left": LEFT, "right": RIGHT}, pa.int64())
SCHEMA = stream_schema(UNION)
CHANNELS = (0, 1, 2, 3)
SIDE = {0: "left", 1: "left", 2: "right", 3: "right"}
BOUNDS = {"left": 2000, "right": 500}
MAX_PARALLELISM = 16
STRATEGY = WatermarkStrategy(INPUT_TIME, channels=tuple((BOUNDS[SIDE[c]], None) for c in CHANNELS))


@dataclass
class Batch:
    """Per channel its (key, event time ms) rows; whether the source found it idle."""

    rows: dict[int, list[tuple[int, int]]]
    idle: dict[int, bool]
    checkpoint: bool


def value(channel: int, position: int) -> int:
    """A row's payload column: unique per (channel, position)."""
    return channel * 100_000 + position


@dataclass
class JoinJob:
    lower: int
    upper: int
    how: JoinType
    parallelism: int
    store: InMemoryCheckpointStore = field(default_factory=InMemoryCheckpointStore)
    sink: MemorySink = field(default_factory=MemorySink)
    tasks: list[OperatorTask] = field(default_factory=list)
    acks: list[AcknowledgeCheckpoint] = field(default_factory=list)
    completed: CompletedCheckpoint | None = None
    batch_of: dict[int, int] = field(default_factory=dict)

    def operator(self) -> IntervalJoin:
        join = IntervalJoin(
            "left", "right", key="k", lower=self.lower, upper=self.upper, time="ts", how=self.how
        )
        join.bind_inputs({"left": LEFT, "right": RIGHT})
        return join

    def start(self, parallelism: int) -> None:
        self.parallelism = parallelism
        self.acks.clear()
        self.tasks = [
            OperatorTask(
                TaskId("chain", s),
                channels=list(CHANNELS),
                operators=[self.operator()],
                parallelism=parallelism,
                max_parallelism=MAX_PARALLELISM,
                store=self.store,
                respond=self.acks.append,  # type: ignore[arg-type]
                clock=ManualClock(0),
                sink=self.sink,
                watermark=STRATEGY,
                inputs=INPUTS,
                source_vertex="source",  # acknowledgements carry the barriers' positions
            )
            for s in range(parallelism)
        ]
        recover_sink(self.sink.committer, self.completed, self.store)
        for task in self.tasks:
            task.restore(self.completed)

    def crash(self) -> int:
        self.sink.crash()
        self.tasks = []
        cp = self.completed
        return 0 if cp is None else self.batch_of[cp.checkpoint_id] + 1

    def feed(self, index: int, batch: Batch, positions: dict[int, int]) -> None:
        cid = index + 1
        pieces = []
        for channel in CHANNELS:
            rows = batch.rows.get(channel, [])
            start = positions[channel]
            schema = LEFT if SIDE[channel] == "left" else RIGHT
            own = pa.table(
                [
                    pa.array([k for k, _ in rows], pa.int64()),
                    pa.array([t for _, t in rows], TS),
                    pa.array([value(channel, start + i) for i in range(len(rows))], pa.int64()),
                ],
                schema=schema,
            )
            user = INPUTS.wrap(SIDE[channel], own, UNION)
            end = start + len(rows)
            marks = [(end, CheckpointBarrier(cid, cid))] if batch.checkpoint else []
            progress = ChannelProgress(1000 * (index + 1), batch.idle.get(channel, False))
            pieces.append(channel_rows(user, SCHEMA, channel, start, marks, progress=progress))
            positions[channel] = end
        table, _ = fill_progress(pa.concat_tables(pieces), INPUT_TIME)
        control = pc.not_equal(table.column(KIND), RecordKind.DATA.code).to_numpy(
            zero_copy_only=False
        )
        keys = pc.fill_null(table.column(INPUT_KEY), 0)
        owner = subtasks_for_keys(keys, MAX_PARALLELISM, self.parallelism).to_numpy()
        for s, task in enumerate(self.tasks):
            task.process(table.filter(pa.array(control | (owner == s))))
        if batch.checkpoint:
            mine = [a for a in self.acks if a.checkpoint_id == cid]
            assert len(mine) == len(self.tasks)
            cp = CompletedCheckpoint(
                cid,
                SnapshotType.CHECKPOINT,
                tuple(a.state for a in mine),
                CheckpointStats(cid, cid),
            )
            self.store.commit(self.store.acquire(), cp)
            commit_checkpoint(self.sink.committer, cp, self.store)
            for task in self.tasks:
                task.notify_complete(cid)
            self.completed = cp
            self.batch_of[cid] = index

    def output(self) -> list[tuple[object, ...]]:
        out = self.sink.committer.output()
        if out is None:
            return []
        cols = ["k", "ts", "lv", "right_ts", "rv"]
        frame = out.to_pandas()[cols]
        return _sorted([_row(r) for r in frame.itertuples(index=False)])


def _row(r: tuple[object, ...]) -> tuple[object, ...]:
    return tuple(
        None if pd.isna(v) else (int(v.value // 10**6) if isinstance(v, pd.Timestamp) else int(v))
        for v in r
    )  # type: ignore[call-overload]


def run(job: JoinJob, batches: list[Batch], crash: int | None, after: int) -> None:
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
            job.start(after)
            continue
        index += 1


def oracle(batches: list[Batch], lower: int, upper: int, how: JoinType) -> list[tuple[object, ...]]:
    """pandas over the rows that are not late (see the module docstring)."""
    top: dict[int, int] = {}
    mark: int | None = None
    kept: dict[str, list[dict[str, int]]] = {"left": [], "right": []}
    positions = dict.fromkeys(CHANNELS, 0)
    for batch in batches:
        for channel in CHANNELS:
            for k, t in batch.rows.get(channel, []):
                if mark is None or t > mark:
                    v = value(channel, positions[channel])
                    kept[SIDE[channel]].append({"k": k, "ts": t, "v": v})
                positions[channel] += 1
        for channel, rows in batch.rows.items():
            for _, t in rows:
                top[channel] = max(top.get(channel, t), t)
        active = [c for c in CHANNELS if not batch.idle.get(c, False)]
        if active and all(c in top for c in active):
            candidate = min(top[c] - BOUNDS[SIDE[c]] for c in active) - 1
            mark = candidate if mark is None else max(mark, candidate)
    left = pd.DataFrame(kept["left"], columns=["k", "ts", "v"]).rename(columns={"v": "lv"})
    right = pd.DataFrame(kept["right"], columns=["k", "ts", "v"]).rename(
        columns={"v": "rv", "ts": "right_ts"}
    )
    pairs = left.merge(right, on="k")
    pairs = pairs[(pairs.right_ts >= pairs.ts + lower) & (pairs.right_ts <= pairs.ts + upper)]
    out = [
        tuple(int(x) for x in r)
        for r in pairs[["k", "ts", "lv", "right_ts", "rv"]].itertuples(index=False)
    ]
    final = -(2**62) if mark is None else mark
    if how is JoinType.LEFT_OUTER:
        lonely = left[~left.lv.isin(pairs.lv) & (left.ts + max(upper, 0) <= final)]
        out += [(int(r.k), int(r.ts), int(r.lv), None, None) for r in lonely.itertuples()]
    if how is JoinType.RIGHT_OUTER:
        lonely = right[~right.rv.isin(pairs.rv) & (right.right_ts + max(-lower, 0) <= final)]
        out += [(int(r.k), None, None, int(r.right_ts), int(r.rv)) for r in lonely.itertuples()]
    return sorted(out, key=lambda r: tuple((v is None, v or 0) for v in r))


@st.composite
def join_streams(draw: st.DrawFn) -> tuple[list[Batch], int | None, int, int, int, int]:
    """2 to 8 micro-batches; per channel up to 5 rows of keys 0..3 at times around a clock
    that moves 0..1500 ms per batch, disorder up to 2.5 s (so some rows are late); a channel
    without rows idle or not; random checkpoints, the last batch one; a crash anywhere but
    the last, or none; parallelism 1..3 before and after; an interval with lower <= upper."""
    n = draw(st.integers(2, 8))
    now = 10_000
    batches = []
    for _ in range(n):
        now += draw(st.integers(0, 1500))
        times = st.integers(now - 2500, now)
        rows = {
            c: draw(st.lists(st.tuples(st.integers(0, 3), times), max_size=5)) for c in CHANNELS
        }
        idle = {c: not rows[c] and draw(st.booleans()) for c in CHANNELS}
        batches.append(Batch(rows, idle, draw(st.booleans())))
    batches[-1].checkpoint = True
    crash = draw(st.one_of(st.none(), st.integers(0, n - 2)))
    lower = draw(st.integers(-3000, 1000))
    upper = draw(st.integers(lower, lower + 3000))
    return batches, crash, draw(st.integers(1, 3)), draw(st.integers(1, 3)), lower, upper


def _sorted(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return sorted(rows, key=lambda r: tuple((v is None, v or 0) for v in r))


@pytest.mark.parametrize("how", list(JoinType))
@settings(max_examples=30, deadline=None)
@given(stream=join_streams())
def test_interval_join_equals_pandas_through_crashes_and_rescales(
    how: JoinType, stream: tuple[list[Batch], int | None, int, int, int, int]
) -> None:
    batches, crash, before, after, lower, upper = stream
    job = JoinJob(lower, upper, how, before)
    run(job, batches, crash, after)
    assert _sorted(job.output()) == oracle(batches, lower, upper, how)


def test_buffered_rows_leave_the_state_once_the_watermark_passes_their_last_match() -> None:
    """Rows far behind the final watermark are all gone from both buffers; only rows that a
    future row could still match remain."""
    batches = [
        Batch({0: [(1, 10_000)], 2: [(1, 10_500)], 1: [(2, 11_000)], 3: [(2, 20_000)]}, {}, True),
        Batch({c: [(3, 60_000)] for c in CHANNELS}, {}, True),
    ]
    job = JoinJob(-1000, 1000, JoinType.INNER, 2)
    run(job, batches, None, 2)
    out = job.output()
    assert out[0] == (1, 10_000, 0, 10_500, 200_000)
    assert len(out) == 5 and all(r[0] == 3 for r in out[1:])  # 2 x 2 pairs at 60 s
    buffered = {"left": 0, "right": 0}
    for task in job.tasks:
        backend = task.backends["interval-join-left-right"]
        for name in buffered:
            if name in backend.tables:
                values = backend.to_table(name).column("value").to_pylist()
                buffered[name] += sum(len(v) for v in values if v)
    assert buffered == {"left": 2, "right": 2}  # the rows at 60 s only


def test_join_refuses_an_interval_upside_down() -> None:
    with pytest.raises(ConfigError, match="at most upper"):
        IntervalJoin("a", "b", key="k", lower=1000, upper=0, time="ts")
    with pytest.raises(ConfigError, match="inner or left_outer or right_outer"):
        IntervalJoin("a", "b", key="k", lower=0, upper=0, time="ts", how="full")


# -- barriers anywhere in a micro-batch ---------------------------------------------------------


@dataclass
class Planned:
    """One micro-batch of a log of rows per channel: each channel read up to *ends*, and a
    checkpoint barrier at *barrier* positions (within the batch's rows; None: none)."""

    ends: dict[int, int]
    barrier: dict[int, int] | None


@st.composite
def logs(
    draw: st.DrawFn,
) -> tuple[dict[int, list[tuple[int, int]]], list[Planned], int | None, int, int]:
    """Per channel up to 12 rows of keys 0..3, each at most its input's bound behind the
    channel's latest (so no row is ever late, whatever the micro-batches); 2 to 6
    micro-batches cutting the logs anywhere, each with a barrier at random positions in it
    or none, the last one's at its end; a crash after any batch but the last, or none."""
    log: dict[int, list[tuple[int, int]]] = {}
    for c in CHANNELS:
        bound = BOUNDS[SIDE[c]]
        top, rows = 10_000, []
        for _ in range(draw(st.integers(0, 12))):
            top += draw(st.integers(0, 800))
            rows.append((draw(st.integers(0, 3)), top - draw(st.integers(0, bound))))
        log[c] = rows
    n = draw(st.integers(2, 6))
    planned = []
    cursor = dict.fromkeys(CHANNELS, 0)
    for i in range(n):
        last = i == n - 1
        ends = {
            c: len(log[c]) if last else draw(st.integers(cursor[c], len(log[c]))) for c in CHANNELS
        }
        barrier = None
        if last:
            barrier = dict(ends)
        elif draw(st.booleans()):
            barrier = {c: draw(st.integers(cursor[c], ends[c])) for c in CHANNELS}
        planned.append(Planned(ends, barrier))
        cursor = ends
    crash = draw(st.one_of(st.none(), st.integers(0, n - 2)))
    return log, planned, crash, draw(st.integers(1, 3)), draw(st.integers(1, 3))


def _feed_log(
    job: JoinJob,
    index: int,
    log: dict[int, list[tuple[int, int]]],
    cursor: dict[int, int],
    plan: Planned,
) -> None:
    cid = 1000 + index  # ids only grow, across restores too
    pieces = []
    for channel in CHANNELS:
        start, end = cursor[channel], max(cursor[channel], plan.ends[channel])
        rows = log[channel][start:end]
        schema = LEFT if SIDE[channel] == "left" else RIGHT
        own = pa.table(
            [
                pa.array([k for k, _ in rows], pa.int64()),
                pa.array([t for _, t in rows], TS),
                pa.array([value(channel, start + i) for i in range(len(rows))], pa.int64()),
            ],
            schema=schema,
        )
        marks = []
        if plan.barrier is not None:
            marks = [(min(max(plan.barrier[channel], start), end), CheckpointBarrier(cid, cid))]
        progress = ChannelProgress(1000 * (index + 1), False)
        user = INPUTS.wrap(SIDE[channel], own, UNION)
        pieces.append(channel_rows(user, SCHEMA, channel, start, marks, progress=progress))
        cursor[channel] = end
    table, _ = fill_progress(pa.concat_tables(pieces), INPUT_TIME)
    control = pc.not_equal(table.column(KIND), RecordKind.DATA.code).to_numpy(zero_copy_only=False)
    owner = subtasks_for_keys(
        pc.fill_null(table.column(INPUT_KEY), 0), MAX_PARALLELISM, job.parallelism
    ).to_numpy()
    for s, task in enumerate(job.tasks):
        task.process(table.filter(pa.array(control | (owner == s))))
    if plan.barrier is not None:
        mine = [a for a in job.acks if a.checkpoint_id == cid]
        assert len(mine) == len(job.tasks)  # aligned within the micro-batch
        cp = CompletedCheckpoint(
            cid, SnapshotType.CHECKPOINT, tuple(a.state for a in mine), CheckpointStats(cid, cid)
        )
        job.store.commit(job.store.acquire(), cp)
        commit_checkpoint(job.sink.committer, cp, job.store)
        for task in job.tasks:
            task.notify_complete(cid)
        job.completed = cp
        job.batch_of[cid] = index


@pytest.mark.parametrize("how", [JoinType.INNER, JoinType.LEFT_OUTER])
@settings(max_examples=30, deadline=None)
@given(drawn=logs())
def test_barriers_anywhere_in_a_batch_of_two_inputs_keep_the_join_exactly_once(
    how: JoinType,
    drawn: tuple[dict[int, list[tuple[int, int]]], list[Planned], int | None, int, int],
) -> None:
    """Barrier handling with several inputs: barriers at random positions of each input's
    channels, aligned across the four channels in the micro-batch, a crash past the last
    checkpoint and a restore from its barrier positions at another parallelism. The output
    equals pandas' join of the whole log (no row is late, by construction)."""
    log, planned, crash, before, after = drawn
    job = JoinJob(-1500, 700, how, before)
    job.start(before)
    cursor = dict.fromkeys(CHANNELS, 0)
    index, crashed = 0, False
    while index < len(planned):
        _feed_log(job, index, log, cursor, planned[index])
        if crash is not None and index == crash and not crashed:
            crashed = True
            job.crash()
            cp = job.completed
            offsets = {} if cp is None else {c: o for (_, c), o in cp.offsets().items()}
            cursor = {c: offsets.get(c, 0) for c in CHANNELS}
            index = 0 if cp is None else job.batch_of[cp.checkpoint_id] + 1
            job.start(after)
            continue
        index += 1
    batches = [Batch({c: log[c]}, {}, False) for c in CHANNELS]  # the whole log, in any order
    assert _sorted(job.output()) == oracle(batches, -1500, 700, how)

"""Event time in the core: the watermark strategy's options, the progress a channel's rows fill
in, the watermark valve, and a task that drops rows late beyond the allowed lateness, counts
them and checkpoints its watermark. Oracles are plain loops over the input."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import ConfigError, ProtocolError
from spark_ckpt.protocol.barrier import (
    BARRIER_OPTIONS,
    KIND,
    ChannelProgress,
    CheckpointBarrier,
    RecordKind,
    SnapshotType,
)
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import AcknowledgeCheckpoint, TaskId
from spark_ckpt.runtime.event_time import WatermarkStrategy, WatermarkValve, fill_progress
from spark_ckpt.runtime.operator import KeyedOperator
from spark_ckpt.runtime.task import EVENT_TIME, OperatorTask, commit_checkpoint
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.sources.channel_batch import channel_rows, stream_schema
from spark_ckpt.state.context import StateContext
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
USER = pa.schema([("k", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
SCHEMA = stream_schema(USER)


def us(seconds: float) -> int:
    return round((EPOCH + dt.timedelta(seconds=seconds)).timestamp() * 1_000_000)


def rows(channel: int, start: int, times: Sequence[float], progress: ChannelProgress | None):
    user = pa.table(
        {
            "k": pa.array(range(start, start + len(times)), pa.int64()),
            "ts": pa.array([us(t) for t in times], pa.timestamp("us", tz="UTC")),
        },
        schema=USER,
    )
    return channel_rows(user, SCHEMA, channel, start, progress=progress)


# -- the strategy ---------------------------------------------------------------------------


def test_a_strategy_round_trips_through_the_source_options() -> None:
    s = (
        WatermarkStrategy.for_bounded_out_of_orderness("ts", "2s")
        .with_idleness(dt.timedelta(seconds=30))
        .with_allowed_lateness(500)
    )
    assert (s.out_of_orderness_ms, s.idleness_ms, s.allowed_lateness_ms) == (2000, 30_000, 500)
    assert WatermarkStrategy.from_options(s.to_options()) == s
    assert WatermarkStrategy.from_options({"WATERMARK.COLUMN": "ts"}) == WatermarkStrategy("ts")
    assert WatermarkStrategy.from_options({}) is None
    with pytest.raises(ConfigError, match=r"watermark\.column"):
        WatermarkStrategy.from_options({"watermark.outOfOrderness": "1s"})
    with pytest.raises(ConfigError, match=r"watermark\.outOfOrderness"):
        WatermarkStrategy.for_bounded_out_of_orderness("ts", "soon")
    with pytest.raises(ConfigError, match=r"watermark\.idleness"):
        WatermarkStrategy("ts").with_idleness(0)
    with pytest.raises(ConfigError, match=r"watermark\.column"):
        WatermarkStrategy("")


def test_the_event_time_column_must_be_a_timestamp() -> None:
    s = WatermarkStrategy.for_monotonous_timestamps("ts")
    s.check_schema(USER)
    with pytest.raises(ConfigError, match="an event-time column of the rows"):
        s.check_schema(pa.schema([("k", pa.int64())]))
    with pytest.raises(ConfigError, match=r"a timestamp column \(it is int64\)"):
        s.check_schema(pa.schema([("ts", pa.int64())]))


# -- progress filled in from the rows ---------------------------------------------------------


def test_progress_rows_follow_the_data_and_precede_the_barriers() -> None:
    barrier = CheckpointBarrier(7, 1)
    user = pa.table({"k": [1, 2], "ts": pa.array([us(1), us(2)], USER.field("ts").type)})
    t = channel_rows(user, SCHEMA, 0, 10, [(12, barrier)], progress=ChannelProgress(99))
    assert t.column(KIND).to_pylist() == [0, 0, RecordKind.PROGRESS.code, 1]
    assert t.column("_ckpt_offset").to_pylist() == [10, 11, 12, 12]


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.lists(st.integers(0, 1000), max_size=6), st.booleans()),
        max_size=6,
    )
)
def test_fill_progress_sets_each_channels_largest_event_time(
    slices: list[tuple[int, list[int], bool]],
) -> None:
    """Slices of channels (in any interleaving, each channel's in order), each maybe ending
    with a progress row; one call or the rows split in two with the carry: a progress row
    holds the largest event time of its channel's rows since its previous progress row."""
    offsets: dict[int, int] = {}
    tables: list[pa.Table] = []
    expected: list[int | None] = []
    since: dict[int, list[int]] = {}  # per channel: the event times no progress row covered
    for channel, times, with_progress in slices:
        start = offsets.get(channel, 0)
        offsets[channel] = start + len(times)
        progress = ChannelProgress(1) if with_progress else None
        tables.append(rows(channel, start, times, progress))
        pending = since.setdefault(channel, [])
        pending.extend(times)
        if with_progress:
            expected.append(us(max(pending)) if pending else None)
            pending.clear()
    if not tables:
        return
    table = pa.concat_tables(tables)
    filled, _ = fill_progress(table, "ts")
    for split in range(table.num_rows + 1):
        first, carry = fill_progress(table.slice(0, split), "ts")
        second, _ = fill_progress(table.slice(split), "ts", carry)
        assert _maxima(pa.concat_tables([first, second])) == _maxima(filled)
    assert _maxima(filled) == expected


def _maxima(table: pa.Table) -> list[int | None]:
    kinds = table.column(KIND).to_pylist()
    options = table.column(BARRIER_OPTIONS).to_pylist()
    return [
        json.loads(o)["max"]
        for k, o in zip(kinds, options, strict=True)
        if k == RecordKind.PROGRESS.code
    ]


# -- the valve ---------------------------------------------------------------------------------


@settings(max_examples=200)
@given(
    st.integers(1, 3),
    st.integers(0, 50),
    st.lists(
        st.lists(
            st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 500)), st.booleans()),
            max_size=4,
        ),
        max_size=8,
    ),
)
def test_the_valve_matches_a_plain_model(
    channels: int, bound: int, batches: list[list[tuple[int, int | None, bool]]]
) -> None:
    """Per batch, progress of some channels (largest event time or none, idle or not); the
    watermark after each batch is the model's: per channel the largest event time so far,
    the minimum over channels not idle less the bound and 1 ms once they all have one (Flink's
    ``max - bound - 1``), never back."""
    valve = WatermarkValve(range(channels), bound)
    top: dict[int, int | None] = dict.fromkeys(range(channels))
    idle: dict[int, bool] = dict.fromkeys(range(channels), False)
    mark: int | None = None
    for batch in batches:
        for channel, value, is_idle in batch:
            channel %= channels
            valve.observe(channel, ChannelProgress(1, is_idle, value))
            if value is not None:
                top[channel] = value if top[channel] is None else max(top[channel], value)
            idle[channel] = is_idle
        active = [c for c in range(channels) if not idle[c]]
        if active and all(top[c] is not None for c in active):
            low = min(top[c] for c in active if top[c] is not None) - bound - 1000
            mark = low if mark is None else max(mark, low)
        assert valve.advance() == mark


def test_the_valve_restores_from_every_subtask_of_a_checkpoint() -> None:
    a, b = WatermarkValve([0, 1], 10), WatermarkValve([0, 1], 10)
    a.observe(0, ChannelProgress(5, max_event_time_us=100))
    a.observe(1, ChannelProgress(5, max_event_time_us=50))
    b.observe(0, ChannelProgress(6, max_event_time_us=120))
    a.advance(), b.advance()
    restored = WatermarkValve([0, 1, 2], 10)
    restored.restore([a.to_table(), b.to_table()])
    assert restored.channel_maxima() == {0: 120, 1: 50, 2: None}
    assert restored.watermark_us == 50 - 10 - 1000 and restored.processing_ms == 6
    copy = WatermarkValve([], 10)
    copy.load_state_dict(json.loads(json.dumps(restored.state_dict())))
    assert copy.state_dict() == restored.state_dict()
    with pytest.raises(ProtocolError):
        copy.load_state_dict({"channels": [["x", 1, False]]})


# -- a task that keeps event time -------------------------------------------------------------


class Passing(KeyedOperator):
    """Forwards what it receives (the rows the task did not drop)."""

    def __init__(self) -> None:
        super().__init__("pass", "k", pa.int64())
        self.seen: list[int] = []

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        self.seen.extend(batch.column("k").to_pylist())
        return None


def fill(table: pa.Table) -> pa.Table:
    return fill_progress(table, "ts")[0]


def make_task(
    strategy: WatermarkStrategy,
    store: InMemoryCheckpointStore,
    subtask: int = 0,
    parallelism: int = 1,
):
    acks: list[AcknowledgeCheckpoint] = []
    op = Passing()
    task = OperatorTask(
        TaskId("chain", subtask),
        channels=[0, 1],
        operators=[op],
        parallelism=parallelism,
        store=store,
        respond=acks.append,  # type: ignore[arg-type]
        clock=ManualClock(0),
        watermark=strategy,
    )
    return task, op, acks


def test_a_task_drops_rows_late_beyond_the_allowed_lateness_and_counts_them() -> None:
    """Batch 1 moves the watermark to min(20, 30) - 5 s - 1 ms = 14.999 s; batch 2's rows at
    or below it are late (a row at 15 s, exactly the bound behind, is not), those more than
    2 s below it (at or below 12.999 s) dropped; the checkpoint records the watermark and
    the counts, and a task restored from it resumes there."""
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("ts", "5s").with_allowed_lateness(
        "2s"
    )
    store = InMemoryCheckpointStore()
    task, op, acks = make_task(strategy, store)
    p = ChannelProgress(1000)
    # the progress rows get their event times where the rows are routed (fill_progress)
    task.process(fill(pa.concat_tables([rows(0, 0, [10, 20], p), rows(1, 0, [30], p)])))
    assert task.watermark_ms == us(15) // 1000 - 1
    assert op.seen == [0, 1, 0]
    times = [12, 12.999, 13, 14.999, 15, 16]  # late: 12..14.999; dropped: 12, 12.999
    barrier = CheckpointBarrier(1, 1)
    batch = pa.concat_tables(
        [
            channel_rows(
                pa.table(
                    {
                        "k": pa.array(range(2, 8), pa.int64()),
                        "ts": pa.array([us(t) for t in times], USER.field("ts").type),
                    }
                ),
                SCHEMA,
                0,
                2,
                [(8, barrier)],
                progress=ChannelProgress(2000),
            ),
            channel_rows(
                USER.empty_table(), SCHEMA, 1, 1, [(1, barrier)], progress=ChannelProgress(2000)
            ),
        ]
    )
    task.process(fill(batch))
    assert op.seen == [0, 1, 0, 4, 5, 6, 7]
    [ack] = acks
    assert ack.time is not None
    assert (ack.time.late_rows, ack.time.dropped_rows) == (4, 2)
    assert ack.time.watermark_ms == us(15) // 1000 - 1 and ack.time.processing_ms == 2000
    assert [b.state_name for b in ack.state.blobs if b.state_name == EVENT_TIME] == [EVENT_TIME]

    lease = store.acquire()
    cp = CompletedCheckpoint(1, SnapshotType.CHECKPOINT, (ack.state,), CheckpointStats(1, 2))
    store.commit(lease, cp)
    for subtask in (0, 1, 2):  # any subtask of any parallelism resumes the same watermark
        restored, _, _ = make_task(strategy, store, subtask, parallelism=3)
        restored.restore(cp)
        assert restored.watermark_ms == us(15) // 1000 - 1
        assert restored.time is not None and restored.time.valve.channel_maxima() == {
            0: us(20),
            1: us(30),
        }


def test_a_row_exactly_the_bound_behind_is_on_time() -> None:
    """A 2 s bound and rows up to 2 s out of order: none is late (Flink's ``max - bound - 1``
    watermark); a row 2 s and 1 ms behind is."""
    valve = WatermarkValve([0], 2_000_000)
    valve.observe(0, ChannelProgress(1, max_event_time_us=us(10)))
    valve.advance()
    assert valve.watermark_us == us(8) - 1000
    column = pa.array([us(8), us(8.001), us(7.999), us(7)], pa.timestamp("us", tz="UTC"))
    assert valve.late(column).to_pylist() == [False, False, True, True]


def test_a_watermark_restored_from_before_the_rule_changed_never_goes_back() -> None:
    """A checkpoint taken when the watermark was ``max - bound`` (no 1 ms below it): the
    restored valve keeps that watermark, which the new rule gives only once the largest
    event time moved on by more than 1 ms."""
    old = WatermarkValve([0], 2_000_000)
    old.observe(0, ChannelProgress(1, max_event_time_us=us(10)))
    old.advance()
    table = old.to_table()
    meta = dict(table.schema.metadata)
    meta[b"watermark_us"] = str(us(8)).encode()  # what the old rule stored
    restored = WatermarkValve([0], 2_000_000)
    restored.restore([table.replace_schema_metadata(meta)])
    assert restored.watermark_us == us(8)
    restored.observe(0, ChannelProgress(2, max_event_time_us=us(10.0005)))
    assert restored.advance() == us(8)
    restored.observe(0, ChannelProgress(3, max_event_time_us=us(10.5)))
    assert restored.advance() == us(8.5) - 1000


class Judging(KeyedOperator):
    """Receives late rows (``receives_late_rows``), as a ``KeyedProcessFunction`` sees
    every element: keeps the rows marked late whose key is even, drops the odd ones into the
    late output, and remembers the marks it saw."""

    receives_late_rows = True

    def __init__(self, uid: str = "judge") -> None:
        super().__init__(uid, "k", pa.int64())
        self.seen: list[tuple[int, bool, bool]] = []  # key, late, late beyond the lateness

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        behind = state.late_rows(batch, 0).to_pylist()
        beyond = state.late_rows(batch).to_pylist()
        keys = batch.column("k").to_pylist()
        self.seen.extend(zip(keys, behind, beyond, strict=True))
        odd = pc.equal(pc.bit_wise_and(batch.column("k"), 1), 1)
        state.output_late(batch.filter(pc.and_(pa.array(beyond), odd)))
        return batch.select(["k"])


def test_an_operator_that_receives_late_rows_sees_them_marked_and_drops_what_it_chooses() -> None:
    """The same input as the task test above (watermark 14.999 s, 2 s of allowed lateness)
    with an operator that receives late rows: it gets every row, each marked late (behind
    the watermark) and late beyond the allowed lateness; the rows it drops go to the late
    output with their own columns and count as dropped; the statistics count the late rows
    as before. An operator further down the chain receives only what the first emits."""
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("ts", "5s").with_allowed_lateness(
        "2s"
    )
    acks: list[AcknowledgeCheckpoint] = []
    judge, after = Judging(), Passing()
    late, store = MemorySink("late"), InMemoryCheckpointStore()
    task = OperatorTask(
        TaskId("chain", 0),
        channels=[0, 1],
        operators=[judge, after],
        parallelism=1,
        store=store,
        respond=acks.append,  # type: ignore[arg-type]
        clock=ManualClock(0),
        watermark=strategy,
        late_sink=late,
    )
    p = ChannelProgress(1000)
    task.process(fill(pa.concat_tables([rows(0, 0, [10, 20], p), rows(1, 0, [30], p)])))
    assert judge.seen == [(0, False, False), (1, False, False), (0, False, False)]
    barrier = CheckpointBarrier(1, 1)
    times = [12, 12.999, 13, 14.999, 15, 16]  # keys 2..7
    user = pa.table(
        {"k": pa.array(range(2, 8), pa.int64()), "ts": pa.array([us(t) for t in times])},
        schema=USER,
    )
    batch = pa.concat_tables(
        [
            channel_rows(user, SCHEMA, 0, 2, [(8, barrier)], progress=ChannelProgress(2000)),
            channel_rows(
                USER.empty_table(), SCHEMA, 1, 1, [(1, barrier)], progress=ChannelProgress(2000)
            ),
        ]
    )
    task.process(fill(batch))
    assert judge.seen[3:] == [
        (2, True, True),
        (3, True, True),
        (4, True, False),
        (5, True, False),
        (6, False, False),
        (7, False, False),
    ]
    assert after.seen == [0, 1, 0, 2, 3, 4, 5, 6, 7]  # the first operator's output, all of it
    [ack] = acks
    assert ack.time is not None
    assert (ack.time.late_rows, ack.time.dropped_rows) == (4, 1)  # key 3 dropped, by the judge
    cp = CompletedCheckpoint(1, SnapshotType.CHECKPOINT, (ack.state,), CheckpointStats(1, 1))
    store.commit(store.acquire(), cp)
    commit_checkpoint(late.committer, cp, store, legacy=False)
    out = late.committer.output()
    assert out is not None and out.column_names == ["k", "ts"] and out["k"].to_pylist() == [3]


def test_a_null_event_time_is_never_late() -> None:
    valve = WatermarkValve([0], 0)
    valve.observe(0, ChannelProgress(1, max_event_time_us=us(100)))
    valve.advance()
    column = pa.array([None, us(1), us(200)], pa.timestamp("us", tz="UTC"))
    assert valve.late(column).to_pylist() == [False, True, False]
    assert pc.sum(valve.late(column, 10**9)).as_py() == 0

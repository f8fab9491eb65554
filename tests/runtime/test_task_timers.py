"""Timers in operator tasks: event-time timers fire when the watermark passes them,
processing-time timers when a micro-batch's processing time does (rows or not), their output
goes through the two-phase-commit sink, and a crash past the last checkpoint with a restore
at another parallelism neither loses nor repeats a timer.

The oracle is a plain loop over the input applying the documented rules (``docs/time.md``):
after each micro-batch a channel's watermark is the largest event time it has seen less the
bound and 1 ms, the subtask's the minimum over channels not idle, never decreasing; rows at or below
the watermark the previous batches left are late (dropped: no allowed lateness)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import example, given, settings
from hypothesis import strategies as st
from timed_jobs import CHANNELS, Batch, Job, batch_ms, run, streams, watermarks

from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.runtime.operator import KeyedOperator, RecordOperator
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import ValueStateDescriptor
from spark_ckpt.testing.state_backends import examples

OUT = pa.schema([("k", pa.int64()), ("timestamp", pa.int64()), ("domain", pa.string())])
BOUND_MS = 3000
GAP_MS = 5000  # a key is silent once the watermark passes its last event time + GAP_MS
FOLLOW_UP_MS = 1500  # a processing-time timer this long after a key is first seen
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
STRATEGY = WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS)


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


def oracle(batches: list[Batch]) -> list[tuple[int, int, str]]:
    """The timers a plain loop fires over *batches* (see the module docstring)."""
    marks = watermarks(batches, BOUND_MS)
    last: dict[int, int] = {}
    seen: set[int] = set()
    follow_ups: list[tuple[int, int]] = []
    fired: list[tuple[int, int, str]] = []
    for index, batch in enumerate(batches):
        now = batch_ms(index)
        before = marks[index - 1] if index else None
        for rows in batch.rows.values():
            for k, t in rows:
                if before is not None and t <= before:
                    continue  # late: dropped
                last[k] = max(last.get(k, t), t)
                if k not in seen:
                    seen.add(k)
                    follow_ups.append((k, now + FOLLOW_UP_MS))
        mark = marks[index]
        if mark is not None:
            for k in [k for k, t in last.items() if t + GAP_MS <= mark]:
                fired.append((k, last.pop(k) + GAP_MS, "event"))
        for k, at in [f for f in follow_ups if f[1] <= now]:
            fired.append((k, at, "processing"))
        follow_ups = [f for f in follow_ups if f[1] > now]
    return sorted(fired)


STREAMS = streams(batches=9, clock=0, step=4000, keys=7, behind=5000, ahead=1000)


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


def test_timers_fire_once_through_crashes_and_rescales(state_backend: str) -> None:
    """A crash after batch *crash* (rows processed past the last checkpoint), then a restore
    of the last completed checkpoint at another parallelism and a replay: the committed
    output holds every timer the oracle fires, once — subtasks kept alive, or rebuilt every
    micro-batch from their images as on the executors. (Fewer examples on ``rocksdb``:
    :func:`~spark_ckpt.testing.state_backends.examples`.)"""

    @settings(max_examples=examples(120, state_backend))
    @given(STREAMS, st.sampled_from([None, "image", "changelog", "workers"]))
    @example(CATCH_UP, "workers")
    def check(case: tuple[list[Batch], int | None, int, int], rebuild: str | None) -> None:
        batches, crash, parallelism, new_parallelism = case
        job = Job(Silence, STRATEGY, parallelism, rebuild=rebuild)
        run(job, batches, crash, new_parallelism)
        assert job.output() == oracle(batches)

    check()


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
    job = Job(Reminder, STRATEGY, 1)
    job.start(1)
    positions = dict.fromkeys(CHANNELS, 0)
    job.feed(0, Batch({0: [(4, 100), (4, 200)], 1: [(5, 100)]}, {}, False), positions)
    job.feed(1, Batch({}, {}, False), positions)
    assert job.tasks[0].time is not None and job.tasks[0].time.processing_ms == 2000
    job.feed(2, Batch({}, {}, True), positions)
    assert job.output() == [(4, 2, 3000), (5, 1, 3000)]


def late_oracle(batches: list[Batch]) -> list[tuple[int, int]]:
    """The (key, event time) of every row a plain loop finds late: at or below the watermark
    the batches before it left."""
    marks = watermarks(batches, BOUND_MS)
    late = []
    for index, batch in enumerate(batches):
        before = marks[index - 1] if index else None
        for rows in batch.rows.values():
            late += [(k, t) for k, t in rows if before is not None and t <= before]
    return sorted(late)


def test_late_rows_reach_the_late_output_exactly_once(state_backend: str) -> None:
    """The rows dropped as late go to their own two-phase-commit sink: through crashes,
    restores at another parallelism and subtasks rebuilt from images, it holds exactly the
    late rows of the loop, once each, with their own columns only."""
    settings(max_examples=examples(100, state_backend))(
        given(STREAMS, st.sampled_from([None, "image", "workers"]))(_check_late_rows)
    )()


def _check_late_rows(case: tuple[list[Batch], int | None, int, int], rebuild: str | None) -> None:
    batches, crash, parallelism, new_parallelism = case
    job = Job(Silence, STRATEGY, parallelism, rebuild=rebuild, late=MemorySink("late"))
    run(job, batches, crash, new_parallelism)
    assert job.late is not None
    out = job.late.committer.output()
    got = (
        []
        if out is None
        else sorted(
            (r["k"], (r["ts"] - EPOCH) // dt.timedelta(milliseconds=1)) for r in out.to_pylist()
        )
    )
    assert got == late_oracle(batches)
    if out is not None:
        assert out.column_names == ["k", "ts", "v"]
    assert job.output() == oracle(batches)  # the output is untouched by it

"""Timers on real Spark: event-time timers that end per-key sessions fire when the watermark
passes them, processing-time timers fire with the source's ticks while no rows arrive, both
placements, through a savepoint and a restore at another parallelism; the timers are keyed
state that the offline reader lists.

The oracle is a plain loop over the input: the micro-batches from Spark's own offset logs
(which rows of which channel, and the batch's processing time), the generator's rows made
again from its spec, the transform's event time computed in Python, and the documented rules
(``docs/time.md``): a row at or below the watermark its previous micro-batches left is late
and dropped; after each micro-batch the watermark is the lowest over the channels of their
largest event time less the bound, never decreasing, and the timers at or below it fire.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import LoggedBatch, logged_batches, stop_with_savepoint

from spark_ckpt import (
    CheckpointConfig,
    KeyedOperator,
    Pipeline,
    RestoreSettings,
    StateContext,
    ValueStateDescriptor,
    WatermarkStrategy,
)
from spark_ckpt.errors import ConfigError
from spark_ckpt.offline import StateReader
from spark_ckpt.sources.generator import GeneratorSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

SEED, CHANNELS, KEYS, PER_BATCH = 9, 2, 400, 200
#: each row's event time is the generator's less (amount % 50) tenths of a second
JITTER_US, BOUND_MS = 100_000, 1000
#: a session ends once the watermark passes its last event time + GAP_MS
GAP_MS = 300
OUT = pa.schema([("user_id", pa.int64()), ("session_end", pa.int64()), ("rows", pa.int64())])


def transform(df):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    jitter = (F.col("amount") % 50) * JITTER_US
    return df.withColumn("ts", F.timestamp_micros(F.unix_micros("event_ts") - jitter))


class SessionEnds(KeyedOperator):
    """Per user, an event-time timer at the last event time + GAP_MS (moved as rows come);
    when it fires, the session's end and its row count."""

    LAST = ValueStateDescriptor("last", pa.int64())
    ROWS = ValueStateDescriptor("rows", pa.int64())

    def __init__(self) -> None:
        super().__init__("sessions", "user_id", pa.int64())

    @property
    def output_schema(self) -> pa.Schema:
        return OUT

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        ms = pc.divide(pc.cast(batch.column("ts"), pa.int64()), 1000)
        grouped = (
            batch.select(["user_id"])
            .append_column("ms", ms)
            .group_by("user_id")
            .aggregate([("ms", "max"), ("ms", "count")])
        )
        keys, newest = grouped.column("user_id"), grouped.column("ms_max")
        old = state.get_values(self.LAST, keys)
        rows = state.get_values(self.ROWS, keys)
        moved = pc.fill_null(pc.greater(newest, old), True)
        had = pc.and_(moved, pc.is_valid(old))
        state.delete_event_time_timers(keys.filter(had), pc.add(old.filter(had), GAP_MS))
        state.register_event_time_timers(keys.filter(moved), pc.add(newest.filter(moved), GAP_MS))
        state.put_values(self.LAST, keys.filter(moved), newest.filter(moved))
        state.put_values(self.ROWS, keys, pc.add(pc.fill_null(rows, 0), grouped.column("ms_count")))
        return None

    def on_timers(self, timers: pa.Table, state: StateContext) -> pa.Table | None:
        keys = timers.column("user_id")
        rows = state.get_values(self.ROWS, keys)
        state.clear_values(self.LAST, keys)
        state.clear_values(self.ROWS, keys)
        return pa.table([keys, timers.column("timestamp"), rows], schema=OUT)


def source(backlog: int, keys: int = KEYS) -> dict[str, object]:
    return {
        "source": "generator",
        "seed": SEED,
        "channels": CHANNELS,
        "rate": 0,
        "backlog": backlog,
        "keys": keys,
        "maxRowsPerTrigger": PER_BATCH * CHANNELS,
    }


def session_oracle(runs: list[tuple[int, list[LoggedBatch]]]) -> Counter[tuple[int, int, int]]:
    """The sessions a plain loop ends over runs of the generator with their backlogs."""
    top: dict[int, int] = {}
    watermark: int | None = None  # µs, as the rows' event times
    last: dict[int, int] = {}  # ms
    rows: Counter[int] = Counter()
    ended: Counter[tuple[int, int, int]] = Counter()
    for backlog, batch in ((b, batch) for b, run in runs for batch in run):
        spec = GeneratorSpec(SEED, CHANNELS, 0.0, backlog, KEYS)
        for channel, (start, end) in enumerate(batch.slices):
            table = spec.rows(channel, start, end)
            micros = pc.subtract(
                pc.cast(table.column("event_ts"), "int64"),
                pc.multiply(pc.remainder(table.column("amount"), 50), JITTER_US),
            ).to_pylist()
            for key, us in zip(table.column("user_id").to_pylist(), micros, strict=True):
                top[channel] = max(top.get(channel, us), us)
                if watermark is not None and us <= watermark:
                    continue  # late: dropped
                last[key] = max(last.get(key, us // 1000), us // 1000)
                rows[key] += 1
        if len(top) == CHANNELS:
            candidate = min(top.values()) - BOUND_MS * 1000 - 1000  # max - bound - 1 ms
            watermark = candidate if watermark is None else max(watermark, candidate)
            # timers are whole ms: they fire once the watermark's ms reach them
            for key in [k for k, t in last.items() if t + GAP_MS <= watermark // 1000]:
                ended[(key, last.pop(key) + GAP_MS, rows.pop(key))] += 1
    return ended


def sessions(path: Path) -> Counter[tuple[int, int, int]]:
    return Counter(pl.read_delta(str(path)).select("user_id", "session_end", "rows").iter_rows())


def timer_counts(p: Pipeline) -> tuple[int, int]:
    stats = [r.stats for r in p.client.history() if r.stats is not None]
    return sum(s.timers_registered for s in stats), sum(s.timers_fired for s in stats)


@pytest.mark.parametrize("placement", ["executors", "driver"])
def test_event_time_timers_end_sessions_exactly(
    spark: SparkSession, tmp_path: Path, placement: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = CheckpointConfig.from_options({"checkpoint.interval": "300ms"})
    p = Pipeline(spark, "sessions", config=config, root=str(tmp_path / "root"))
    out = tmp_path / "out"
    result = p.run(
        source(1200),
        SessionEnds(),
        output=str(out),
        available_now=True,
        transform=transform,
        placement=placement,
        watermark=WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS),
    )
    assert result.restarts == 0 and not result.failures
    [run] = logged_batches(p.root, CHANNELS)
    expected = session_oracle([(1200, run)])
    assert sum(expected.values()) > 100  # the test means something
    assert sessions(out) == expected
    registered, fired = timer_counts(p)
    assert fired == sum(expected.values()) and registered >= fired
    from spark_ckpt.cli import main

    assert main(["stats", "--root", p.root, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sum(r.get("timers_fired", 0) for r in records) == fired


def test_timers_survive_a_savepoint_and_a_restore_at_another_parallelism(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A savepoint with sessions still open (their timers pending, listed offline), then a
    restore at parallelism 3: every session ends once, as the loop over both runs says."""
    config = CheckpointConfig.from_options(
        {"checkpoint.interval": "300ms", "savepoint.dir": str(tmp_path / "sp")}
    )
    p = Pipeline(spark, "rescale", config=config, root=str(tmp_path / "root"))
    out = tmp_path / "out"
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS)
    run = p.start(
        source(600),
        SessionEnds(),
        output=str(out),
        transform=transform,
        watermark=strategy,
        trigger_s=0.3,
        parallelism=2,
    )
    sp = stop_with_savepoint(run, tmp_path / "sp")
    reader = StateReader.open(sp.path)
    assert "_event_timers" in reader.state_names("sessions")
    pending = reader.keyed("sessions", "_event_timers")
    open_sessions = reader.keyed("sessions", "last")
    assert pending.num_rows == open_sessions.num_rows > 0
    p.run(
        source(1200),
        SessionEnds(),
        output=str(out),
        available_now=True,
        transform=transform,
        watermark=strategy,
        parallelism=3,
        restore=RestoreSettings.savepoint(sp.path),
    )
    first, second = logged_batches(p.root, CHANNELS)
    assert sessions(out) == session_oracle([(600, first), (1200, second)])


class FollowUp(KeyedOperator):
    """A processing-time timer FOLLOW_UP_MS after the micro-batch a user is first seen in;
    when it fires, the user and the timer's time."""

    SEEN = ValueStateDescriptor("seen", pa.bool_())
    FOLLOW_UP_MS = 1500

    def __init__(self) -> None:
        super().__init__("follow_up", "user_id", pa.int64())

    @property
    def output_schema(self) -> pa.Schema:
        return pa.schema([("user_id", pa.int64()), ("at", pa.int64())])

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        keys = pc.unique(batch.column("user_id"))
        new = keys.filter(pc.is_null(state.get_values(self.SEEN, keys)))
        at = state.current_processing_time + self.FOLLOW_UP_MS
        state.register_processing_time_timers(new, pa.array([at] * len(new), pa.int64()))
        state.put_values(self.SEEN, new, pa.array([True] * len(new)))
        return None

    def on_timers(self, timers: pa.Table, state: StateContext) -> pa.Table | None:
        return pa.table(
            [timers.column("user_id"), timers.column("timestamp")], schema=self.output_schema
        )


@pytest.mark.parametrize("placement", ["executors", "driver"])
def test_processing_time_timers_fire_while_no_rows_arrive(
    spark: SparkSession, tmp_path: Path, placement: str
) -> None:
    """All rows arrive in the first micro-batches; the timers 1.5 s later fire with the
    batches the source's ticks make afterwards (no rows in them), each once, at the time the
    oracle computes from the logged batch times."""
    p = Pipeline(spark, "follow", root=str(tmp_path / "root"))
    out = tmp_path / "out"
    run = p.start(
        source(60, keys=20),
        FollowUp(),
        output=str(out),
        watermark=WatermarkStrategy.no_watermarks(),
        trigger_s=0.2,
        placement=placement,
    )
    users = set(
        GeneratorSpec(SEED, CHANNELS, 0.0, 60, 20).rows(0, 0, 60).column("user_id").to_pylist()
    )
    users |= set(
        GeneratorSpec(SEED, CHANNELS, 0.0, 60, 20).rows(1, 0, 60).column("user_id").to_pylist()
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # a wait, not a timed assertion
            done = (out / "_delta_log").exists() and pl.read_delta(str(out)).height >= len(users)
            if done:
                break
            time.sleep(0.5)
        run.stop(timeout_s=120)
    finally:
        if run.query.isActive:
            run.query.stop()
    [logged] = logged_batches(p.root, CHANNELS)
    spec = GeneratorSpec(SEED, CHANNELS, 0.0, 60, 20)
    expected: dict[int, int] = {}
    for batch in logged:
        for channel, (start, end) in enumerate(batch.slices):
            for user in spec.rows(channel, start, end).column("user_id").to_pylist():
                expected.setdefault(user, batch.batch_ms + FollowUp.FOLLOW_UP_MS)
    got = Counter(pl.read_delta(str(out)).select("user_id", "at").iter_rows())
    assert got == Counter(expected.items())
    # the timers fired in batches after the rows: the source ticked while idle
    last_rows = max(i for i, b in enumerate(logged) if any(e > s for s, e in b.slices))
    assert max(expected.values()) > logged[last_rows].batch_ms


def test_timers_without_a_time_keeping_pipeline_are_refused_before_anything_runs(
    spark: SparkSession, tmp_path: Path
) -> None:
    p = Pipeline(spark, "untimed", root=str(tmp_path / "root"))
    with pytest.raises(ConfigError, match="handles timers"):
        p.run(source(10), SessionEnds(), output=str(tmp_path / "out"), available_now=True)
    assert not (tmp_path / "out").exists()

"""Event-time windows on real Spark, exactly once into Delta: tumbling window aggregates equal
pandas' over the input (disorder within the bound, so no row is late), in both placements;
session windows through a savepoint and a restore at another parallelism equal a plain loop
over the micro-batches Spark logged.

The input is the generator's rows with event times jittered by up to 1.9 s (a function of
each row's amount), computed by the transform; the oracles compute the same in Python.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import polars as pl
import pyarrow.compute as pc
import pytest
from conftest import LoggedBatch, logged_batches

from spark_ckpt import (
    Agg,
    CheckpointConfig,
    Pipeline,
    RestoreSettings,
    WatermarkStrategy,
    WindowAggregate,
    Windows,
    list_savepoints,
)
from spark_ckpt.sources.generator import GeneratorSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

SEED, CHANNELS, PER_BATCH = 21, 2, 250
JITTER_US, BOUND_MS = 100_000, 2000  # jitter (amount % 20) tenths of a second: under the bound
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def transform(df):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    jitter = (F.col("amount") % 20) * JITTER_US
    return df.withColumn("ts", F.timestamp_micros(F.unix_micros("event_ts") - jitter))


def source(backlog: int, keys: int) -> dict[str, object]:
    return {
        "source": "generator",
        "seed": SEED,
        "channels": CHANNELS,
        "rate": 0,
        "backlog": backlog,
        "keys": keys,
        "maxRowsPerTrigger": PER_BATCH * CHANNELS,
    }


def rows_of(spec: GeneratorSpec, channel: int, start: int, end: int) -> pd.DataFrame:
    table = spec.rows(channel, start, end)
    micros = pc.subtract(
        pc.cast(table.column("event_ts"), "int64"),
        pc.multiply(pc.remainder(table.column("amount"), 20), JITTER_US),
    )
    return pd.DataFrame(
        {
            "user_id": table.column("user_id").to_pylist(),
            "amount": table.column("amount").to_pylist(),
            "ms": [m // 1000 for m in micros.to_pylist()],
            "us": micros.to_pylist(),
        }
    )


def final_watermark(spec: GeneratorSpec, batches: list[LoggedBatch]) -> int:
    """The watermark (µs) after the last batch: per channel its largest event time less the
    bound and 1 ms, the lowest over the channels."""
    top = [max(rows_of(spec, c, 0, batches[-1].slices[c][1]).us) for c in range(CHANNELS)]
    return min(top) - BOUND_MS * 1000 - 1000


def millis(when: dt.datetime) -> int:
    return (when - EPOCH) // dt.timedelta(milliseconds=1)


@pytest.mark.parametrize("placement", ["executors", "driver"])
def test_tumbling_windows_equal_pandas_aggregates(
    spark: SparkSession, tmp_path: Path, placement: str
) -> None:
    size = 200
    keys = 40
    config = CheckpointConfig.from_options({"checkpoint.interval": "300ms"})
    p = Pipeline(spark, "tumbling", config=config, root=str(tmp_path / "root"))
    out = tmp_path / "out"
    p.run(
        source(1500, keys),
        WindowAggregate(
            "per_user",
            "user_id",
            Windows.tumbling(size),
            [Agg.count(), Agg.sum("amount"), Agg.mean("amount")],
        ),
        output=str(out),
        available_now=True,
        transform=transform,
        placement=placement,
        watermark=WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS),
    )
    spec = GeneratorSpec(SEED, CHANNELS, 0.0, 1500, keys)
    [run] = logged_batches(p.root, CHANNELS)
    stats = [r.stats for r in p.client.history() if r.stats is not None]
    assert sum(s.late_rows for s in stats) == 0  # disorder within the bound
    frame = pd.concat(rows_of(spec, c, 0, run[-1].slices[c][1]) for c in range(CHANNELS))
    frame["start"] = frame.ms - frame.ms % size
    grouped = frame.groupby(["user_id", "start"]).amount.agg(["count", "sum", "mean"])
    mark_ms = final_watermark(spec, run) // 1000
    expected = sorted(
        (k, s, s + size, int(r["count"]), int(r["sum"]), round(float(r["mean"]), 9))
        for (k, s), r in grouped.iterrows()
        if s + size - 1 <= mark_ms
    )
    table = pl.read_delta(str(out)).to_arrow().to_pylist()
    got = sorted(
        (
            r["user_id"],
            millis(r["window_start"]),
            millis(r["window_end"]),
            r["count"],
            r["sum_amount"],
            round(r["mean_amount"], 9),
        )
        for r in table
    )
    assert len(expected) > 200  # the test means something
    assert got == expected


def session_oracle(
    runs: list[tuple[int, list[LoggedBatch]]], keys: int, gap: int
) -> list[tuple[int, int, int, int]]:
    """Sessions a plain loop emits: per batch the rows join their key's session (or open
    one) when less than a gap apart; after each batch the watermark moves and the sessions
    whose end - 1 it reached are emitted (no row is late: disorder within the bound)."""
    top: dict[int, int] = {}
    sessions: dict[int, list[list[int]]] = defaultdict(list)  # key -> [[start, end, rows]]
    out: list[tuple[int, int, int, int]] = []
    for backlog, batch in ((b, batch) for b, run in runs for batch in run):
        spec = GeneratorSpec(SEED, CHANNELS, 0.0, backlog, keys)
        for channel, (start, end) in enumerate(batch.slices):
            rows = rows_of(spec, channel, start, end)
            for key, ms, us in zip(rows.user_id, rows.ms, rows.us, strict=True):
                top[channel] = max(top.get(channel, us), us)
                mine = sessions[key]
                touching = [w for w in mine if w[0] <= ms + gap and ms <= w[1]]
                merged = [
                    min([ms, *(w[0] for w in touching)]),
                    max([ms + gap, *(w[1] for w in touching)]),
                    1 + sum(w[2] for w in touching),
                ]
                for w in touching:
                    mine.remove(w)
                mine.append(merged)
        if len(top) == CHANNELS:
            mark = (min(top.values()) - BOUND_MS * 1000 - 1000) // 1000
            for key, mine in sessions.items():
                for w in [w for w in mine if w[1] - 1 <= mark]:
                    out.append((key, w[0], w[1], w[2]))
                    mine.remove(w)
    return sorted(out)


def test_session_windows_survive_a_savepoint_and_a_restore_at_another_parallelism(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A savepoint taken while sessions are open, the run going on past it, then the
    pipeline restored from the savepoint at parallelism 3: the output holds each session of
    the loop over the batches up to the savepoint and those after the restore, once."""
    keys, gap, backlog = 300, 60, 2000
    config = CheckpointConfig.from_options(
        {"checkpoint.interval": "300ms", "savepoint.dir": str(tmp_path / "sp")}
    )
    p = Pipeline(spark, "sessions", config=config, root=str(tmp_path / "root"))
    out = tmp_path / "out"
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS)

    def sessions() -> WindowAggregate:
        return WindowAggregate("sessions", "user_id", Windows.session(gap), [Agg.count("clicks")])

    run = p.start(
        source(backlog, keys),
        sessions(),
        output=str(out),
        transform=transform,
        watermark=strategy,
        trigger_s=0.5,
        parallelism=2,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # a wait: some sessions out, some still open
            if (out / "_delta_log").exists() and pl.read_delta(str(out)).height > 50:
                break
            time.sleep(0.2)
        saved = p.client.savepoint()
        run.stop(timeout_s=120)
    finally:
        if run.query.isActive:
            run.query.stop()
    [sp] = [
        s
        for s in list_savepoints(str(tmp_path / "sp"))
        if s.checkpoint.checkpoint_id == saved.checkpoint_id
    ]
    at = [saved.offsets()[("source", c)] for c in range(CHANNELS)]
    assert 0 < sum(at) < backlog * CHANNELS  # the savepoint fell inside the input
    p.run(
        source(backlog, keys),
        sessions(),
        output=str(out),
        available_now=True,
        transform=transform,
        watermark=strategy,
        parallelism=3,
        restore=RestoreSettings.savepoint(sp.path),
    )
    first, second = logged_batches(p.root, CHANNELS)
    before = [b for b in first if all(end <= a for (_, end), a in zip(b.slices, at, strict=True))]
    assert [end for _, end in before[-1].slices] == at  # savepoints fall between batches
    # the restored run starts at the savepoint's positions, not where the first run ended
    head = second[0]
    restart = LoggedBatch(
        [(a, e) for (_, e), a in zip(head.slices, at, strict=True)], head.batch_ms
    )
    after = [restart, *second[1:]]
    expected = session_oracle([(backlog, before + after)], keys, gap)
    got = sorted(
        (r["user_id"], millis(r["window_start"]), millis(r["window_end"]), r["clicks"])
        for r in pl.read_delta(str(out)).to_arrow().to_pylist()
    )
    assert len(expected) > 300
    assert got == expected

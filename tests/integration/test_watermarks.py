"""Event time on real Spark: a pipeline with a watermark strategy drops the rows that arrive
late, counts them in its checkpoint statistics, and keeps its watermark through a restore.

The oracle is a plain loop over the input, independent of the engine: the micro-batches are
read back from Spark's own offset log (which rows of which channel each batch read); the
generator's rows are made again from its spec and the transform's event time computed in
Python; then the documented rule — a row is late when its event time is at or below the
watermark its previous micro-batches left, the watermark being the lowest over the channels
of their largest event time less the bound, never decreasing — finds the late rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow.compute as pc
import pytest
from conftest import logged_batches, running_count_rows, stop_with_savepoint

from spark_ckpt import (
    CheckpointConfig,
    Pipeline,
    RestoreSettings,
    RunningCount,
)
from spark_ckpt.errors import ConfigError
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.sources.generator import GeneratorSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

SEED, CHANNELS, KEYS, PER_BATCH = 5, 2, 30, 300
#: each row's event time is the generator's less (amount % 50) tenths of a second: disorder
#: of up to 4.9 s against a bound of 1 s
JITTER_US, BOUND, BOUND_US = 100_000, "1s", 1_000_000
#: the rows per channel of the late-output runs
BACKLOG = 1500


def transform(df):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    jitter = (F.col("amount") % 50) * JITTER_US
    return df.withColumn("ts", F.timestamp_micros(F.unix_micros("event_ts") - jitter))


def source(backlog: int) -> dict[str, object]:
    return {
        "source": "generator",
        "seed": SEED,
        "channels": CHANNELS,
        "rate": 0,
        "backlog": backlog,
        "keys": KEYS,
        "maxRowsPerTrigger": PER_BATCH * CHANNELS,
    }


Slices = list[list[tuple[int, int]]]


def batches(root: str) -> list[Slices]:
    """Per run, in run order, each micro-batch's rows per channel ``[start, end)``."""
    return [[b.slices for b in run] for run in logged_batches(root, CHANNELS)]


def oracle(runs: list[tuple[int, Slices]], bound_us: int) -> tuple[int, Counter[int]]:
    """The late rows and the rows per key a running count sees, by the documented rule, over
    runs of the generator with their backlogs (its event times depend on the backlog)."""
    late, kept = late_and_kept(runs, bound_us)
    return sum(late.values()), kept


def late_and_kept(
    runs: list[tuple[int, Slices]], bound_us: int
) -> tuple[Counter[tuple[int, int, int]], Counter[int]]:
    """The late rows, as (user_id, amount, event time in µs), and the rows per key a running
    count sees (see :func:`oracle`)."""
    top: dict[int, int] = {}
    watermark: int | None = None
    late, kept = Counter[tuple[int, int, int]](), Counter[int]()
    for backlog, batch in ((b, batch) for b, run in runs for batch in run):
        spec = GeneratorSpec(SEED, CHANNELS, 0.0, backlog, KEYS)
        seen: dict[int, int] = {}
        for channel, (start, end) in enumerate(batch):
            rows = spec.rows(channel, start, end)
            times = pc.subtract(
                pc.cast(rows.column("event_ts"), "int64"),
                pc.multiply(pc.remainder(rows.column("amount"), 50), JITTER_US),
            ).to_pylist()
            amounts = rows.column("amount").to_pylist()
            for key, amount, ts in zip(
                rows.column("user_id").to_pylist(), amounts, times, strict=True
            ):
                if watermark is not None and ts <= watermark:
                    late[(key, amount, ts)] += 1
                else:
                    kept[key] += 1
            if times:
                seen[channel] = max(times)
        for channel, t in seen.items():
            top[channel] = max(top.get(channel, t), t)
        if len(top) == CHANNELS:
            candidate = min(top.values()) - bound_us - 1000  # Flink's max - bound - 1 ms
            watermark = candidate if watermark is None else max(watermark, candidate)
    return late, kept


def late_rows(p: Pipeline) -> int:
    return sum(r.stats.late_rows for r in p.client.history() if r.stats is not None)


def output(path: Path) -> Counter[tuple[int, int]]:
    return Counter(pl.read_delta(str(path)).select("user_id", "count").iter_rows())


def check_late_output(root: str, out: Path, late_out: Path) -> int:
    """The late-output table holds exactly the rows the loop finds late (their own columns,
    each once), the output the running counts of the rest; returns how many were late."""
    [run] = batches(root)
    late, kept = late_and_kept([(BACKLOG, run)], BOUND_US)
    assert sum(late.values()) > 0  # the test means something
    table = pl.read_delta(str(late_out))
    assert table.columns == ["user_id", "amount", "event_ts", "ts"]
    micros = table.select(pl.col("ts").dt.epoch("us")).to_series().to_list()
    got = Counter(zip(table["user_id"].to_list(), table["amount"].to_list(), micros, strict=True))
    assert got == late
    assert output(out) == running_count_rows(kept)
    return sum(late.values())


@pytest.mark.parametrize("placement", ["executors", "driver"])
def test_late_rows_are_dropped_and_counted_exactly(
    spark: SparkSession, tmp_path: Path, placement: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = CheckpointConfig.from_options({"checkpoint.interval": "300ms"})
    p = Pipeline(spark, "late", config=config, root=str(tmp_path / "root"))
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND)
    out, late_out = tmp_path / "out", tmp_path / "late"
    result = p.run(
        source(BACKLOG),
        RunningCount("counter", "user_id"),
        output=str(out),
        available_now=True,
        transform=transform,
        placement=placement,
        watermark=strategy,
        late_output=str(late_out),
    )
    assert result.restarts == 0 and not result.failures and strategy.bound_us == BOUND_US
    expected_late = check_late_output(p.root, out, late_out)
    assert late_rows(p) == expected_late
    last = p.client.latest()
    assert last is not None and last.stats.watermark_ms is not None
    # spark-ckpt stats shows the watermark and the late rows of every checkpoint
    from spark_ckpt.cli import main

    assert main(["stats", "--root", p.root, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sum(r.get("late_rows", 0) for r in records) == expected_late
    assert main(["stats", "--root", p.root]) == 0
    table = capsys.readouterr().out
    assert "watermark" in table and "late_rows" in table


@pytest.mark.slow
def test_late_rows_go_to_their_table_under_spark_connect(tmp_path: Path) -> None:
    """The same job under Spark Connect (its script starts a local Connect server in its own
    process; the subtasks on the executors): the late rows exactly once in their table."""
    root, out, late_out = tmp_path / "root", tmp_path / "out", tmp_path / "late"
    script = Path(__file__).with_name("late_connect_job.py")
    args = [str(root), str(out), str(late_out), "executors"]
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=420
    )
    assert done.returncode == 0, done.stderr[-4000:]
    check_late_output(str(root), out, late_out)


def test_a_restore_resumes_the_watermark(spark: SparkSession, tmp_path: Path) -> None:
    """A savepoint at 600 rows per channel, then the pipeline restored from it at another
    parallelism (2 → 3): the first batches after the restore are judged against the
    watermark the savepoint recorded, not against none."""
    config = CheckpointConfig.from_options(
        {"checkpoint.interval": "300ms", "savepoint.dir": str(tmp_path / "sp")}
    )
    p = Pipeline(spark, "resume", config=config, root=str(tmp_path / "root"))
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND)
    out = tmp_path / "out"
    run = p.start(
        source(600),
        RunningCount("counter", "user_id"),
        output=str(out),
        late_output=str(tmp_path / "late"),
        transform=transform,
        watermark=strategy,
        trigger_s=0.3,
    )
    sp = stop_with_savepoint(run, tmp_path / "sp")
    saved_watermark = sp.checkpoint.stats.watermark_ms
    assert saved_watermark is not None
    p.run(
        source(1200),
        RunningCount("counter", "user_id"),
        output=str(out),
        late_output=str(tmp_path / "late"),
        available_now=True,
        transform=transform,
        watermark=strategy,
        parallelism=3,
        restore=RestoreSettings.savepoint(sp.path),
    )
    # the restore point records the watermark it resumes from
    [point] = [r for r in p.client.history() if "restored_from" in r.properties]
    assert point.stats is not None and point.stats.watermark_ms == saved_watermark
    first, second = batches(p.root)
    late, kept = late_and_kept([(600, first), (1200, second)], strategy.bound_us)
    assert late_rows(p) == sum(late.values())
    table = pl.read_delta(str(tmp_path / "late"))  # across both runs, exactly once
    micros = table.select(pl.col("ts").dt.epoch("us")).to_series().to_list()
    assert (
        Counter(zip(table["user_id"].to_list(), table["amount"].to_list(), micros, strict=True))
        == late
    )
    assert output(out) == running_count_rows(kept)


def test_a_bad_event_time_column_is_refused_before_anything_runs(
    spark: SparkSession, tmp_path: Path
) -> None:
    p = Pipeline(spark, "bad", root=str(tmp_path / "root"))
    for column, message in (("nope", "an event-time column"), ("amount", "a timestamp column")):
        with pytest.raises(ConfigError, match=message):
            p.run(
                source(10),
                RunningCount("counter", "user_id"),
                output=str(tmp_path / "out"),
                available_now=True,
                watermark=WatermarkStrategy.for_monotonous_timestamps(column),
            )
    with pytest.raises(ConfigError, match="only it has late rows"):  # no event time
        p.run(
            source(10),
            RunningCount("counter", "user_id"),
            output=str(tmp_path / "out"),
            available_now=True,
            late_output=str(tmp_path / "late"),
        )
    with pytest.raises(ConfigError, match="another table than the output"):
        p.run(
            source(10),
            RunningCount("counter", "user_id"),
            output=str(tmp_path / "out"),
            available_now=True,
            watermark=WatermarkStrategy.for_monotonous_timestamps("event_ts"),
            late_output=str(tmp_path / "out"),
        )
    assert not (tmp_path / "out").exists() and not (tmp_path / "late").exists()

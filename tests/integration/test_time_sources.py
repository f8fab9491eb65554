"""Event time from the sources' own columns: Kafka's record ``timestamp`` and a timestamp
column of a Delta table read with ``source=delta`` (the generator's ``event_ts``, a files
column and a column computed by the transform are covered by the other tests of time).

Each runs tumbling windows over the source's event-time column; the oracle is pandas over
what the test wrote, for every window the final watermark passed: the lowest channel's
largest event time (the bound is 0: each channel's times only grow)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from spark_ckpt import Agg, CheckpointConfig, Pipeline, WatermarkStrategy, WindowAggregate, Windows
from spark_ckpt.testing.broker import Broker, produce, running_broker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

T0 = 1_795_000_000_000  # ms
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
SIZE = 1000


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with running_broker() as b:
        yield b


def windows(rows: pd.DataFrame, key: str, mark: int) -> list[tuple[object, int, int]]:
    """(key, window start, rows) of every window whose end - 1 is at or below *mark*."""
    rows = rows.assign(start=rows.ms - rows.ms % SIZE)
    counts = rows.groupby([key, "start"]).size()
    return sorted((k, int(s), int(n)) for (k, s), n in counts.items() if s + SIZE - 1 <= mark)


def emitted(path: Path, key: str) -> list[tuple[object, int, int]]:
    table = pl.read_delta(str(path)).to_arrow().to_pylist()
    return sorted(
        (r[key], (r["window_start"] - EPOCH) // dt.timedelta(milliseconds=1), r["count"])
        for r in table
    )


def run_windows(
    spark: SparkSession, tmp_path: Path, source: dict, key: str, key_type: pa.DataType, column: str
) -> Path:
    p = Pipeline(
        spark,
        f"time-{uuid.uuid4().hex[:6]}",
        config=CheckpointConfig(interval_ms=500),
        root=str(tmp_path / "root"),
    )
    out = tmp_path / "out"
    late = tmp_path / "late"
    result = p.run(
        source,
        WindowAggregate("per_key", key, Windows.tumbling(SIZE), [Agg.count()], key_type=key_type),
        output=str(out),
        available_now=True,
        watermark=WatermarkStrategy.for_monotonous_timestamps(column),
        late_output=str(late),
    )
    assert result.failures == ()
    # nothing is late: the late-output table exists, empty, its commits up to the last one
    assert pl.read_delta(str(late)).height == 0
    return out


def test_windows_over_kafka_record_timestamps(
    spark: SparkSession, broker: Broker, tmp_path: Path
) -> None:
    topic = f"clicks-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, 2)
    produced = []
    for partition in range(2):
        times = [T0 + partition * 700 + i * 130 for i in range(60)]
        keys = [f"u{(i * 7 + partition) % 5}".encode() for i in range(60)]
        produce(
            broker.bootstrap,
            topic,
            [(k, b"{}") for k in keys],
            partition=partition,
            timestamps=times,
        )
        produced += [(k, t, partition) for k, t in zip(keys, times, strict=True)]
    frame = pd.DataFrame(produced, columns=["key", "ms", "partition"])
    mark = int(frame.groupby("partition").ms.max().min())
    source = {
        "source": "kafka",
        "kafka.bootstrap.servers": broker.bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "30",
    }
    out = run_windows(spark, tmp_path, source, "key", pa.binary(), "timestamp")
    expected = windows(frame, "key", mark)
    assert len(expected) > 20
    assert emitted(out, "key") == expected


def test_windows_over_a_delta_tables_timestamp_column(spark: SparkSession, tmp_path: Path) -> None:
    from deltalake import write_deltalake

    table = tmp_path / "clicks"
    frames = []
    for version in range(4):  # four commits, their times growing
        ms = [T0 + version * 2000 + i * 37 for i in range(50)]
        part = pd.DataFrame({"user_id": [(i * 3 + version) % 6 for i in range(50)], "ms": ms})
        frames.append(part)
        data = pa.table(
            {
                "user_id": pa.array(part.user_id, pa.int64()),
                "ts": pa.array(part.ms, pa.timestamp("ms")).cast(pa.timestamp("us", tz="UTC")),
            }
        )
        write_deltalake(str(table), data, mode="append")
    frame = pd.concat(frames)
    # one channel: its largest time is the watermark
    mark = int(frame.ms.max())
    source = {"source": "delta", "path": str(table), "channels": 1}
    out = run_windows(spark, tmp_path, source, "user_id", pa.int64(), "ts")
    expected = windows(frame, "user_id", mark)
    assert len(expected) > 10
    assert emitted(out, "user_id") == expected

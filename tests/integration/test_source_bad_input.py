"""Bad input and unreachable systems, end to end under Spark: each is a clear error from
spark-ckpt's hierarchy, restarts follow the restart strategy, and nothing is lost.

* Kafka's broker goes away mid-run: the run fails within ``kafkaConsumer.pollTimeoutMs``,
  the restarts fail alike until the strategy gives up with a ``PipelineFailedError`` naming
  the broker; the output holds exactly the records up to the last completed checkpoint.
* A malformed JSON line or CSV row fails the run naming the file and the line; run again
  with ``badRecordsPath``, the record is set aside and every other row is counted once.
* A Parquet file whose column does not fit the schema fails the run naming the file and the
  column.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import output_rows, read_delta, running_count_rows

from spark_ckpt import CheckpointConfig, Pipeline, RestartStrategies, RunningCount
from spark_ckpt.errors import PipelineFailedError
from spark_ckpt.testing.broker import produce, start_broker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def config() -> CheckpointConfig:
    return CheckpointConfig(
        interval_ms=300, restart_strategy=RestartStrategies.fixed_delay_restart(1, 100)
    )


def test_a_broker_lost_mid_run_fails_per_the_restart_strategy_and_loses_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    broker = start_broker()
    try:
        broker.create_topic("orders", 2)
        keys = [f"k{i % 9}".encode() for i in range(200)]
        for p in range(2):
            produce(broker.bootstrap, "orders", [(k, b"") for k in keys], partition=p)
        pipeline = Pipeline(spark, "broker-lost", config=config(), root=str(tmp_path / "root"))
        source = {
            "source": "kafka",
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": "orders",
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": "40",
            "kafkaConsumer.pollTimeoutMs": "2000",
        }

        def lose_the_broker(_checkpoint: object) -> None:
            broker.stop()  # after the first completed checkpoint

        with pytest.raises(PipelineFailedError, match=f"Kafka at {broker.bootstrap}"):
            pipeline.run(
                source,
                RunningCount("counter", "key", key_type=pa.binary()),
                output=str(tmp_path / "out"),
                duration_s=120,
                on_checkpoint=lose_the_broker,
            )
    finally:
        broker.stop()
    last = pipeline.client.latest()
    assert last is not None
    ends = {c: o for (_, c), o in last.offsets().items()}
    expected: Counter[bytes] = Counter()
    for p in range(2):
        expected.update(keys[: ends[p]])
    assert output_rows(read_delta(tmp_path / "out"), "key") == running_count_rows(expected)


def land(directory: Path, name: str, text: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f".{name}").write_text(text)
    os.replace(directory / f".{name}", directory / name)


MALFORMED = {
    # format: (a good file, a file whose line 2 is malformed, the malformed line's number)
    "json": (
        "".join(json.dumps({"user_id": u}) + "\n" for u in range(10)),
        '{"user_id": 1}\n{"user_id": }\n{"user_id": 2}\n',
        2,
    ),
    "csv": (
        "user_id\n" + "".join(f"{u}\n" for u in range(10)),
        "user_id\n1\nnot-a-number\n2\n",
        3,  # the header is line 1
    ),
}


@pytest.mark.parametrize("fmt", sorted(MALFORMED))
def test_a_malformed_record_fails_the_run_then_is_set_aside_and_nothing_is_lost(
    spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    good, bad_text, bad_line = MALFORMED[fmt]
    landing = tmp_path / "landing"
    land(landing, f"a.{fmt}", good)
    land(landing, f"b.{fmt}", bad_text)
    pipeline = Pipeline(spark, "malformed", config=config(), root=str(tmp_path / "root"))
    source = {"source": "files", "path": str(landing), "format": fmt, "schema": "user_id long"}
    out = str(tmp_path / "out")
    with pytest.raises(PipelineFailedError, match=rf"b\.{fmt}, line {bad_line}"):
        pipeline.run(source, RunningCount(), output=out, available_now=True)
    bad = tmp_path / "bad"
    pipeline.run(
        {**source, "badRecordsPath": str(bad)}, RunningCount(), output=out, available_now=True
    )
    expected = running_count_rows(Counter([*range(10), 1, 2]))
    assert output_rows(read_delta(tmp_path / "out")) == expected
    assert pq.read_table(bad).column("line").to_pylist() == [bad_line]


def test_a_parquet_file_that_does_not_fit_the_schema_fails_the_run_naming_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    pq.write_table(pa.table({"user_id": [1, 2]}), landing / "good.parquet")
    os.utime(landing / "good.parquet", (1, 1))  # listed first
    pq.write_table(pa.table({"user_id": ["x"]}), landing / "wrong.parquet")
    pipeline = Pipeline(spark, "mismatch", config=config(), root=str(tmp_path / "root"))
    source = {"source": "files", "path": str(landing), "format": "parquet"}
    with pytest.raises(PipelineFailedError, match=r"wrong\.parquet: column 'user_id' is string"):
        pipeline.run(source, RunningCount(), output=str(tmp_path / "out"), available_now=True)

"""``source=kafka`` end to end under Spark, against a real broker (tansu): a keyed running
count over the records of several partitions, exactly once across runs that resume by
partition name, and a topic that appears mid-run (``subscribePattern``) read after the run
restarts for it. The oracle is a plain fold over what was produced."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from conftest import output_rows, read_delta, running_count_rows

from spark_ckpt import CheckpointConfig, Pipeline, RunningCount
from spark_ckpt.sources.kafka_options import CHANNEL_NAMES
from spark_ckpt.testing.broker import Broker, committed, produce, running_broker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEYS = [f"k{i}".encode() for i in range(7)]


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with running_broker() as b:
        yield b


def produce_keys(broker: Broker, topic: str, partition: int, start: int, n: int) -> list[bytes]:
    """Records ``start .. start+n`` of a partition: key ``KEYS[(i * 3 + partition) % 7]``."""
    keys = [KEYS[(i * 3 + partition) % len(KEYS)] for i in range(start, start + n)]
    produce(broker.bootstrap, topic, [(k, b"{}") for k in keys], partition=partition)
    return keys


def counter() -> RunningCount:
    return RunningCount("counter", "key", key_type=pa.binary())


def test_a_count_over_partitions_is_exactly_once_across_runs(
    spark: SparkSession, broker: Broker, tmp_path: Path
) -> None:
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, 3)
    produced: Counter[bytes] = Counter()
    for p in range(3):
        produced.update(produce_keys(broker, topic, p, 0, 40 + 10 * p))
    pipeline = Pipeline(
        spark, "kafka-runs", config=CheckpointConfig(interval_ms=500), root=str(tmp_path / "root")
    )
    source = {
        "source": "kafka",
        "kafka.bootstrap.servers": broker.bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "40",
        "kafka.group.id": f"lag-{topic}",  # each completed checkpoint commits its offsets
    }
    out = tmp_path / "out"
    first = pipeline.run(source, counter(), output=str(out), available_now=True)
    assert first.failures == ()
    assert output_rows(read_delta(out), "key") == running_count_rows(produced)
    last = first.last_checkpoint
    assert last is not None
    names = json.loads(last.properties[CHANNEL_NAMES])
    assert names == [f"{topic}:{p}" for p in range(3)]
    assert {c: o for (_, c), o in last.offsets().items()} == {0: 40, 1: 50, 2: 60}
    assert committed(broker.bootstrap, f"lag-{topic}", [(topic, p) for p in range(3)]) == [
        40,
        50,
        60,
    ]
    # more records; the next run resumes every partition where the checkpoint left it
    for p in range(3):
        produced.update(produce_keys(broker, topic, p, 40 + 10 * p, 15))
    second = pipeline.run(source, counter(), output=str(out), available_now=True)
    assert second.restored_from[0] == last.checkpoint_id
    assert output_rows(read_delta(out), "key") == running_count_rows(produced)


def test_a_topic_that_appears_mid_run_is_read_after_a_restart(
    spark: SparkSession, broker: Broker, tmp_path: Path
) -> None:
    prefix = f"events-{uuid.uuid4().hex[:6]}"
    first_topic, later_topic = f"{prefix}-a", f"{prefix}-b"
    broker.create_topic(first_topic, 2)
    produced: Counter[bytes] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def producer() -> None:
        n = 0
        while not stop.is_set():
            for p in range(2):
                keys = produce_keys(broker, first_topic, p, n, 5)
                with lock:
                    produced.update(keys)
            if n == 20:  # a few seconds in: a new topic the pattern matches
                broker.create_topic(later_topic, 1)
            if n >= 20:
                keys = produce_keys(broker, later_topic, 0, n - 20, 5)
                with lock:
                    produced.update(keys)
            n += 5
            time.sleep(0.2)

    pipeline = Pipeline(
        spark,
        "kafka-discovery",
        config=CheckpointConfig(interval_ms=500),
        root=str(tmp_path / "root"),
    )
    source = {
        "source": "kafka",
        "kafka.bootstrap.servers": broker.bootstrap,
        "subscribePattern": f"{prefix}-.*",
        "startingOffsets": "earliest",
        "partitionDiscoveryIntervalMs": "1000",
    }
    out = tmp_path / "out"
    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    try:
        result = pipeline.run(source, counter(), output=str(out), duration_s=25)
    finally:
        stop.set()
        thread.join(30)
    assert result.failures == ()
    assert result.restarts >= 1  # the run that found the new topic ended for a restart
    names = json.loads(pipeline.client.latest().properties[CHANNEL_NAMES])  # type: ignore[union-attr]
    assert f"{later_topic}:0" in names
    # drain what was produced after the stop, then compare with the fold
    pipeline.run(source, counter(), output=str(out), available_now=True)
    with lock:
        expected = running_count_rows(produced)
    assert output_rows(read_delta(out), "key") == expected

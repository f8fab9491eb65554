"""The Kafka adapter against a real broker: partitions of a subscription, watermarks,
starting offsets, reading offset ranges with Spark's columns, data loss and an unreachable
broker."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from spark_ckpt.errors import DataLossError, SourceError
from spark_ckpt.kafka.kafka_client import KafkaMetadata, Watermarks, read_range, record_schema
from spark_ckpt.kafka.kafka_source import DATA_LOSS_DIR, KafkaChannelSource, KafkaReadPlan
from spark_ckpt.locations.uris import filesystem
from spark_ckpt.sources.kafka_options import KafkaOptions
from spark_ckpt.testing.broker import Broker, committed, produce
from spark_ckpt.testing.s3_endpoint import running_s3_endpoint


def topic(broker: Broker, partitions: int = 1) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    broker.create_topic(name, partitions)
    return name


def options(broker: Broker, **more: str) -> KafkaOptions:
    return KafkaOptions.parse({"kafka.bootstrap.servers": broker.bootstrap, **more})


def test_partitions_watermarks_and_starting_offsets(broker: Broker) -> None:
    a, b = topic(broker, 3), topic(broker, 1)
    produce(broker.bootstrap, a, [(None, b"x")] * 5, partition=1)
    meta = KafkaMetadata(options(broker, subscribe=f"{a},{b},not-yet"))
    try:
        parts = meta.partitions()
        assert parts == sorted([(a, 0), (a, 1), (a, 2), (b, 0)])
        assert meta.watermarks([(a, 1), (a, 0)]) == [Watermarks(0, 5), Watermarks(0, 0)]
        assert meta.starting_offsets([(a, 1)]) == [5]  # latest, by default
    finally:
        meta.close()
    pattern = KafkaMetadata(
        options(broker, subscribePattern=a[:6] + ".*", startingOffsets="earliest")
    )
    try:
        assert (a, 2) in pattern.partitions() and pattern.starting_offsets([(a, 1)]) == [0]
    finally:
        pattern.close()
    specific = KafkaMetadata(
        options(broker, assign=f'{{"{a}": [1]}}', startingOffsets=f'{{"{a}": {{"1": 3}}}}')
    )
    try:
        assert specific.partitions() == [(a, 1)]
        assert specific.starting_offsets([(a, 1)]) == [3]
    finally:
        specific.close()
    beyond = KafkaMetadata(
        options(broker, assign=f'{{"{a}": [1]}}', startingOffsets=f'{{"{a}": {{"1": 9}}}}')
    )
    try:
        with pytest.raises(SourceError, match="beyond its latest offset 5"):
            beyond.starting_offsets([(a, 1)])
    finally:
        beyond.close()
    missing = KafkaMetadata(options(broker, assign=f'{{"{a}": [7]}}'))
    try:
        with pytest.raises(SourceError, match=f"{a}-7"):
            missing.partitions()
    finally:
        missing.close()


def test_a_range_reads_exactly_its_records_with_spark_s_columns(broker: Broker) -> None:
    t = topic(broker, 2)
    records = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20)]
    before = time.time()
    produce(broker.bootstrap, t, records, partition=1, headers={"origin": b"test"})
    o = options(broker, subscribe=t, includeHeaders="true")
    got = read_range(o, t, 1, 5, 12)
    assert got.lost is None
    table = got.table
    assert table.schema == record_schema(True)
    assert table.column("offset").to_pylist() == list(range(5, 12))
    assert table.column("key").to_pylist() == [k for k, _ in records[5:12]]
    assert table.column("value").to_pylist() == [v for _, v in records[5:12]]
    assert set(table.column("topic").to_pylist()) == {t}
    assert set(table.column("partition").to_pylist()) == {1}
    assert set(table.column("timestampType").to_pylist()) == {0}  # CreateTime
    stamps = [s.timestamp() for s in table.column("timestamp").to_pylist()]
    assert all(before - 5 <= s <= time.time() + 5 for s in stamps)
    assert table.column("headers").to_pylist()[0] == [{"key": "origin", "value": b"test"}]
    # without headers: Spark's seven columns; an empty range reads nothing
    plain = read_range(options(broker, subscribe=t), t, 1, 0, 20).table
    assert plain.schema == record_schema(False) and plain.num_rows == 20
    assert read_range(o, t, 1, 7, 7).table.num_rows == 0
    assert read_range(o, t, 0, 0, 0).table.schema == record_schema(True)


def test_deleted_offsets_fail_or_are_skipped_as_failOnDataLoss_says(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Retention deleted offsets [0, 4) (the low watermark moved to 4: tansu keeps
    everything, so the adapter's watermark read is what the test changes)."""
    t = topic(broker)
    produce(broker.bootstrap, t, [(None, str(i).encode()) for i in range(10)])
    import confluent_kafka

    real = confluent_kafka.Consumer

    class Retained(real):  # type: ignore[misc, valid-type]
        def get_watermark_offsets(self, *args: object, **kwargs: object) -> tuple[int, int]:
            _low, high = super().get_watermark_offsets(*args, **kwargs)
            return 4, high

    monkeypatch.setattr(confluent_kafka, "Consumer", Retained)
    with pytest.raises(DataLossError, match=rf"{t}-0 offsets \[2, 8\).*\[2, 4\) were deleted"):
        read_range(options(broker, subscribe=t), t, 0, 2, 8)
    skipped = read_range(options(broker, subscribe=t, failOnDataLoss="false"), t, 0, 2, 8)
    assert skipped.lost == (2, 4)
    assert skipped.table.column("offset").to_pylist() == [4, 5, 6, 7]
    gone = read_range(options(broker, subscribe=t, failOnDataLoss="false"), t, 0, 0, 3)
    assert gone.lost == (0, 3) and gone.table.num_rows == 0
    # the source records what it skipped under the pipeline root (a replay: the same file)
    lenient = options(broker, subscribe=t, failOnDataLoss="false")
    plan = KafkaReadPlan(lenient, t, 0, 0, 2, 8, root=str(tmp_path))
    for _ in range(2):
        assert plan.read().column("offset").to_pylist() == [4, 5, 6, 7]
    [record] = list((tmp_path / DATA_LOSS_DIR).iterdir())
    assert json.loads(record.read_text()) == {"topic": t, "partition": 0, "from": 2, "to": 4}
    # and under a root on object storage: one object per range, written whole
    with running_s3_endpoint() as s3:
        s3.create_bucket("lake")
        for key, value in s3.environment().items():
            monkeypatch.setenv(key, value)
        on_s3 = KafkaReadPlan(lenient, t, 0, 0, 2, 8, root="s3://lake/root")
        assert on_s3.read().column("offset").to_pylist() == [4, 5, 6, 7]
        fs, base = filesystem(f"s3://lake/root/{DATA_LOSS_DIR}")
        [stored] = fs.get_file_info(pafs.FileSelector(base))
        with fs.open_input_stream(stored.path) as f:
            assert json.loads(f.read()) == {"topic": t, "partition": 0, "from": 2, "to": 4}


def test_completed_checkpoints_commit_the_group_s_offsets_only_with_a_group_id(
    broker: Broker,
) -> None:
    a = topic(broker, 2)
    group = f"g-{uuid.uuid4().hex[:6]}"
    source = KafkaChannelSource(options(broker, subscribe=a, **{"kafka.group.id": group}))
    try:
        source.checkpoint_completed(3, [7, 2])
        assert committed(broker.bootstrap, group, [(a, 0), (a, 1)]) == [7, 2]
        source.checkpoint_completed(4, [9, 2])  # a later checkpoint moves them on
        assert committed(broker.bootstrap, group, [(a, 0), (a, 1)]) == [9, 2]
    finally:
        source.close()
    anonymous = KafkaChannelSource(options(broker, subscribe=a))
    try:
        anonymous.checkpoint_completed(5, [11, 11])  # no group: nothing is committed
    finally:
        anonymous.close()
    assert committed(broker.bootstrap, group, [(a, 0), (a, 1)]) == [9, 2]


def test_an_unreachable_broker_is_a_clear_error_within_the_timeout() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    o = KafkaOptions.parse({"kafka.bootstrap.servers": f"127.0.0.1:{port}", "subscribe": "t"})
    meta = KafkaMetadata(o, timeout_s=1)
    try:
        with pytest.raises(SourceError, match=f"127.0.0.1:{port}.*within 1 s"):
            meta.partitions()
    finally:
        meta.close()
    with pytest.raises(SourceError, match=f"127.0.0.1:{port}"):
        read_range(o, "t", 0, 0, 5, timeout_s=1)


def test_record_schema_is_spark_s() -> None:
    assert record_schema(False).names == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]
    assert record_schema(True).field("headers").type == pa.list_(
        pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    )

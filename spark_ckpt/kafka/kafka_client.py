"""Kafka through ``confluent-kafka``: what partitions a subscription reads and their
watermarks (driver side, :class:`KafkaMetadata`), and the records of an offset range of one
partition as an Arrow table with Spark's Kafka columns (executors, :func:`read_range`).

Positions are Kafka offsets. A micro-batch plans offsets ``[start, end)`` of a partition with
``end`` at most the high watermark seen by the driver; :func:`read_range` assigns the
partition at ``start`` (no consumer group is joined, nothing is committed) and reads until
its position reaches ``end``. A range may hold fewer records than ``end - start``: offsets of
transaction markers and of records removed by compaction are skipped. Offsets below the
partition's low watermark were deleted before they were read: a :class:`DataLossError`, or
with ``failOnDataLoss=false`` the range starts at the low watermark and the skipped range is
reported.

Every Kafka error leaves as :class:`~spark_ckpt.errors.SourceError` naming the brokers and
the partition; an unreachable broker fails within ``kafkaConsumer.pollTimeoutMs``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from spark_ckpt.errors import DataLossError, EnvironmentSetupError, SourceError
from spark_ckpt.sources.kafka_options import EARLIEST, LATEST, KafkaOptions

log = logging.getLogger(__name__)

#: Records asked for per ``consume`` call.
CONSUME_BATCH: Final = 10_000

_HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])


def record_schema(include_headers: bool) -> pa.Schema:
    """Spark's Kafka source columns (``headers`` with ``includeHeaders``)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(_HEADER)))
    return pa.schema(fields)


def _kafka() -> Any:
    try:
        import confluent_kafka
    except ImportError as e:
        raise EnvironmentSetupError(
            "source=kafka needs confluent-kafka: pip install 'spark-ckpt[kafka]'"
        ) from e
    return confluent_kafka


def _consumer(options: KafkaOptions, timeout_s: float) -> Any:
    """A consumer that never commits on its own and joins no group (``assign`` only)."""
    config: dict[str, Any] = {
        "group.id": f"spark-ckpt-{uuid.uuid4().hex[:12]}",
        **options.client,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "socket.connection.setup.timeout.ms": int(timeout_s * 1000),
    }
    try:
        return _kafka().Consumer(config)
    except (_kafka().KafkaException, ValueError, TypeError) as e:
        raise SourceError(f"Kafka client options {sorted(options.client)}: {e}") from e


@dataclass(frozen=True)
class Watermarks:
    """A partition's low watermark (its oldest offset) and high watermark (the next offset
    to be written)."""

    low: int
    high: int


class KafkaMetadata:
    """Driver side: the partitions the subscription reads, their watermarks, and where a
    partition starts. One consumer, kept open; :meth:`close` it."""

    def __init__(self, options: KafkaOptions, *, timeout_s: float | None = None) -> None:
        self.options = options
        self.timeout_s = options.timeout_ms / 1000 if timeout_s is None else timeout_s
        self._consumer = _consumer(options, self.timeout_s)

    def close(self) -> None:
        self._consumer.close()

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except _kafka().KafkaException as e:
            raise SourceError(
                f"Kafka at {self.options.bootstrap_servers}: {what} failed within "
                f"{self.timeout_s:g} s: {e.args[0] if e.args else e}"
            ) from e

    def partitions(self) -> list[tuple[str, int]]:
        """The (topic, partition)s the subscription reads now, sorted; an assigned partition
        that does not exist is an error, a subscribed topic that does not exist yet has
        none."""
        sub = self.options.subscription
        metadata = self._call("listing topics", self._consumer.list_topics, timeout=self.timeout_s)
        found = {
            (name, p)
            for name, topic in metadata.topics.items()
            if topic.error is None and sub.matches(name)
            for p in topic.partitions
        }
        if sub.assigned:
            missing = sorted(set(sub.assigned) - found)
            if missing:
                raise SourceError(
                    f"Kafka at {self.options.bootstrap_servers}: assigned partitions "
                    f"{[f'{t}-{p}' for t, p in missing]} do not exist"
                )
            return list(sub.assigned)
        return sorted(found)

    def watermarks(self, partitions: Sequence[tuple[str, int]]) -> list[Watermarks]:
        """The watermarks of each partition, in order."""
        tp = _kafka().TopicPartition
        out = []
        for topic, partition in partitions:
            low, high = self._call(
                f"reading the watermarks of {topic}-{partition}",
                self._consumer.get_watermark_offsets,
                tp(topic, partition),
                timeout=self.timeout_s,
                cached=False,
            )
            out.append(Watermarks(int(low), int(high)))
        return out

    def commit(self, partitions: Sequence[tuple[str, int]], offsets: Sequence[int]) -> None:
        """Commit *offsets* (the next offset to read, per partition) under ``kafka.group.id``,
        synchronously. For monitoring only: nothing reads them back."""
        tp = _kafka().TopicPartition
        self._call(
            f"committing offsets for group {self.options.group_id!r}",
            self._consumer.commit,
            offsets=[tp(t, p, o) for (t, p), o in zip(partitions, offsets, strict=True)],
            asynchronous=False,
        )

    def starting_offsets(self, partitions: Sequence[tuple[str, int]]) -> list[int]:
        """Where each partition starts without a checkpoint (``startingOffsets``): earliest
        is the low watermark, latest the high watermark, an offset itself (an offset beyond
        the high watermark is an error, as in Spark)."""
        marks = self.watermarks(partitions)
        out = []
        for (topic, partition), mark in zip(partitions, marks, strict=True):
            start = self.options.starting.for_partition(topic, partition)
            if start == EARLIEST:
                out.append(mark.low)
            elif start == LATEST:
                out.append(mark.high)
            elif start > mark.high:
                raise SourceError(
                    f"startingOffsets for {topic}-{partition} is {start}, beyond its latest "
                    f"offset {mark.high}"
                )
            else:
                out.append(start)
        return out


@dataclass(frozen=True)
class RangeRead:
    """The records of one range, and the offsets the source skipped because they were
    deleted before they were read (``failOnDataLoss=false``; empty otherwise)."""

    table: pa.Table
    lost: tuple[int, int] | None = None  # [from, to) of offsets deleted before being read


def read_range(
    options: KafkaOptions,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    timeout_s: float | None = None,
) -> RangeRead:
    """Executor side: the records of offsets ``[start, end)`` of *topic*-*partition*, in
    offset order, as a table of :func:`record_schema` (see the module docstring)."""
    schema = record_schema(options.include_headers)
    if end <= start:
        return RangeRead(schema.empty_table())
    if timeout_s is None:
        timeout_s = options.timeout_ms / 1000
    kafka = _kafka()
    consumer = _consumer(options, timeout_s)
    where = f"{topic}-{partition} offsets [{start}, {end})"
    try:
        low, _high = consumer.get_watermark_offsets(
            kafka.TopicPartition(topic, partition), timeout=timeout_s, cached=False
        )
        lost: tuple[int, int] | None = None
        if start < low:
            if options.fail_on_data_loss:
                raise DataLossError(
                    f"Kafka {where}: offsets [{start}, {min(low, end)}) were deleted (retention "
                    "or compaction) before they were read; set failOnDataLoss=false to skip them"
                )
            lost = (start, min(low, end))
            log.warning("Kafka %s: skipping offsets [%d, %d), deleted", where, *lost)
            start = min(low, end)
            if start >= end:
                return RangeRead(schema.empty_table(), lost)
        consumer.assign([kafka.TopicPartition(topic, partition, start)])
        columns = _Columns(topic, partition, options.include_headers)
        position = start
        idle_since = time.monotonic()
        while position < end:
            messages = consumer.consume(min(CONSUME_BATCH, end - position), timeout=1.0)
            if not messages:
                [tp] = consumer.position([kafka.TopicPartition(topic, partition)])
                if tp.offset >= end:
                    break  # the rest of the range holds no record (markers, compaction)
                if time.monotonic() - idle_since > timeout_s:
                    raise SourceError(
                        f"Kafka at {options.bootstrap_servers}: {where}: no record after offset "
                        f"{position - 1} within {timeout_s:g} s"
                    )
                continue
            idle_since = time.monotonic()
            for m in messages:
                error = m.error()
                if error is not None:
                    raise SourceError(f"Kafka {where}: {error.str()}")
                offset = m.offset()
                if offset >= end:
                    position = end
                    break
                columns.add(m)
                position = offset + 1
        return RangeRead(columns.table(schema), lost)
    except kafka.KafkaException as e:
        raise SourceError(
            f"Kafka at {options.bootstrap_servers}: reading {where}: {e.args[0] if e.args else e}"
        ) from e
    finally:
        consumer.close()


#: confluent-kafka's timestamp types -> Spark's ``timestampType`` (0 create, 1 log append).
_TIMESTAMP_TYPES: Final = {1: 0, 2: 1}


class _Columns:
    """The columns of the records read, appended one message at a time (the client hands
    out one object per record; nothing per row happens after this)."""

    def __init__(self, topic: str, partition: int, headers: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.headers = headers
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.types: list[int] = []
        self.header_lists: list[list[dict[str, Any]] | None] = []

    def add(self, m: Any) -> None:
        self.keys.append(m.key())
        self.values.append(m.value())
        self.offsets.append(m.offset())
        kind, ms = m.timestamp()
        self.timestamps.append(ms * 1000 if kind in _TIMESTAMP_TYPES else None)
        self.types.append(_TIMESTAMP_TYPES.get(kind, -1))
        if self.headers:
            h = m.headers()
            self.header_lists.append(None if h is None else [{"key": k, "value": v} for k, v in h])

    def table(self, schema: pa.Schema) -> pa.Table:
        n = len(self.offsets)
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array(self.types, pa.int32()),
        ]
        if self.headers:
            arrays.append(pa.array(self.header_lists, pa.list_(_HEADER)))
        return pa.Table.from_arrays(arrays, schema=schema)

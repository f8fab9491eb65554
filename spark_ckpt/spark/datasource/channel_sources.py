"""The inner source a ``ckpt-source`` reads, opened from its options: the generator, the tail
of a Delta table, Kafka partitions or files. Opened in the source runner (offsets, plans)
and on a planner worker (the schema); its rows are read on the executors."""

from __future__ import annotations

import pyarrow as pa

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.clock import SystemClock
from spark_ckpt.sources.channel_batch import stream_schema
from spark_ckpt.sources.channel_source import ChannelSource
from spark_ckpt.spark.datasource.source_options import SourceOptions
from spark_ckpt.spark.executors.routing import ROUTE_KEY, ROUTED_SCHEMA


def open_channel_source(options: SourceOptions) -> ChannelSource:
    """The inner source named by the options (driver side), as the job's components hand it
    on (:mod:`spark_ckpt.runtime.components`)."""
    return options.components.source(_channel_source(options), options.root)


def _channel_source(options: SourceOptions) -> ChannelSource:
    if options.inputs is not None:
        from spark_ckpt.sources.inputs_source import InputsSource

        return InputsSource(options.inputs, [_channel_source(o) for o in options.input_options])
    if options.source == "delta":
        from spark_ckpt.delta.tail_driver import DeltaTailSource

        return DeltaTailSource.from_options(options.delta)
    if options.source == "kafka":
        from spark_ckpt.kafka.kafka_source import KafkaChannelSource

        return KafkaChannelSource.from_options(options.kafka, options.root)
    if options.source == "files":
        from spark_ckpt.sources.files.files_options import FilesSpec
        from spark_ckpt.sources.files.files_source import FilesChannelSource

        return FilesChannelSource(FilesSpec.from_options(options.files), options.root)
    from spark_ckpt.sources.generator import GeneratorSource

    assert options.generator is not None
    return GeneratorSource(options.generator, SystemClock().now_ms)


def user_schema(options: SourceOptions) -> pa.Schema:
    """The inner source's own columns. Kafka's are Spark's Kafka columns: no broker to ask.
    Several inputs: their union form (:mod:`spark_ckpt.sources.inputs`)."""
    if options.inputs is not None:
        from spark_ckpt.sources.inputs_source import key_type

        own = [user_schema(o) for o in options.input_options]
        return options.inputs.union_schema(
            dict(zip(options.inputs.names, own, strict=True)), key_type(options.inputs, own)
        )
    if options.source == "kafka":
        from spark_ckpt.kafka.kafka_client import record_schema
        from spark_ckpt.sources.kafka_options import KafkaOptions

        return record_schema(KafkaOptions.parse(options.kafka).include_headers)
    return open_channel_source(options).schema


def read_schema(options: SourceOptions, user: pa.Schema) -> pa.Schema:
    """The rows a ``ckpt-source`` query reads: the source's columns and the barrier columns,
    or the routed rows when the pipeline routes them to the subtasks (``route.*``,
    :mod:`spark_ckpt.spark.executors.routing`)."""
    router = options.router
    if router is None:
        return stream_schema(user)
    if router.key_column not in user.names:
        raise ConfigError(ROUTE_KEY, router.key_column, f"a column of the source: {user.names}")
    return ROUTED_SCHEMA

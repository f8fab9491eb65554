"""``ckpt-sink``: a stream writer with two-phase commit into a Delta table.

``df.writeStream.format("ckpt-sink").option("pipeline", ...).option("path", ...)`` where *df*
still carries the barrier columns of ``ckpt-source``. Each hook calls
:mod:`spark_ckpt.spark.datasource.sink_runner` (the protocol, and where each step runs).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from spark_ckpt.spark.datasource.formats import SINK_FORMAT
from spark_ckpt.spark.datasource.sink_runner import SinkOptions, SinkRunner


@dataclass
class SinkMessage(WriterCommitMessage):  # type: ignore[misc]
    events: tuple[str, ...]  # SinkEvent JSON


class CkptSinkWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    """``write`` on the executors; ``commit`` in a fresh driver-side process per batch."""

    def __init__(self, options: SinkOptions) -> None:
        self.runner = SinkRunner(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkMessage:
        return SinkMessage(self.runner.write(iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        events = [m.events for m in messages if isinstance(m, SinkMessage)]
        self.runner.commit(events, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The batch failed: its staged files are never referenced; recovery deletes them."""


class CkptSink(DataSource):  # type: ignore[misc]
    """``writeStream.format("ckpt-sink")``; options ``pipeline``, ``path``, ``store``, ``uid``."""

    @classmethod
    def name(cls) -> str:
        return SINK_FORMAT

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = SinkOptions.parse(options)
        self.parsed.storage.install()  # in each process that creates or unpickles it

    def streamWriter(self, schema: StructType, overwrite: bool) -> CkptSinkWriter:
        self.parsed.storage.install()
        self.parsed.install_topology()
        return CkptSinkWriter(self.parsed)

"""``ckpt-source``: a Python streaming DataSource whose rows carry checkpoint barriers.

Each hook calls :mod:`spark_ckpt.spark.datasource` (the work, and where it runs: see
:mod:`spark_ckpt.spark.datasource.source_runner` and ``docs/spark-notes.md``). Spark imports
this module in every Python worker that looks up, creates or reads a data source: the
coordinator and the Delta store are imported where they run, in the source runner.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from spark_ckpt.spark.datasource.channel_sources import read_schema, user_schema
from spark_ckpt.spark.datasource.formats import SOURCE_FORMAT
from spark_ckpt.spark.datasource.source_options import SourceOptions
from spark_ckpt.spark.datasource.source_runner import SourceRunner, read_partition
from spark_ckpt.spark.session.environment import ensure_small_delta_runtime


class CkptStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Offsets, partitions and ``stop`` in the source runner; ``read`` on the executors."""

    def __init__(self, options: SourceOptions, schema: pa.Schema) -> None:
        self.runner = SourceRunner(options, schema)

    def initialOffset(self) -> dict[str, Any]:
        return self.runner.initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        return self.runner.default_read_limit()

    def prepareForTriggerAvailableNow(self) -> None:
        self.runner.prepare_for_trigger_available_now()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        return self.runner.latest_offset(start, limit)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self.runner.report_latest_offset()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return self.runner.partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: positions are committed by checkpoints, not by Spark batches."""

    def stop(self) -> None:
        self.runner.stop()


class CkptSource(DataSource):  # type: ignore[misc]
    """``spark.readStream.format("ckpt-source")``; options:
    :mod:`spark_ckpt.spark.datasource.source_options`."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_FORMAT

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = SourceOptions.parse(options)
        self.parsed.storage.install()  # in each process that creates or unpickles it

    def schema(self) -> StructType:
        self.parsed.storage.install()
        return from_arrow_schema(read_schema(self.parsed, user_schema(self.parsed)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The source runner (before any Delta call there): its coordinator's commits run on
        a one-worker delta-rs runtime (:func:`ensure_small_delta_runtime`)."""
        ensure_small_delta_runtime()
        self.parsed.storage.install()
        return CkptStreamReader(self.parsed, user_schema(self.parsed))

"""``ckpt-state``: a batch Python DataSource reading the keyed or operator state of a
checkpoint or savepoint (options and row layout: :mod:`spark_ckpt.spark.datasource.state_frames`).

Where the hooks run: ``__init__``/``schema`` on a planner worker at ``load()`` (options are
validated and the checkpoint is pinned there: a
:class:`~spark_ckpt.errors.ConfigError` or a missing store or state surfaces as an
``AnalysisException``); ``reader``/``partitions`` on the planner; ``read`` on executors, one
partition per key-group range, yielding Arrow record batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from spark_ckpt.spark.datasource.formats import STATE_FORMAT

if TYPE_CHECKING:
    from spark_ckpt.spark.datasource.state_frames import StateReadPlan

# Spark imports this module in every Python worker that looks up a data source, so the state
# readers (and the Delta store) are imported by the hooks that use them.


@dataclass(frozen=True)
class KeyGroupPartition(InputPartition):  # type: ignore[misc]
    """The key groups ``key_group_range`` (inclusive; ``None``: all) of the state."""

    key_group_range: tuple[int, int] | None


class CkptStateReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, plan: StateReadPlan) -> None:
        self.plan = plan

    def partitions(self) -> list[InputPartition]:
        return [KeyGroupPartition(r) for r in self.plan.ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from spark_ckpt.spark.datasource.state_frames import state_batches

        assert isinstance(partition, KeyGroupPartition)
        yield from state_batches(self.plan, partition.key_group_range)


class CkptStateSource(DataSource):  # type: ignore[misc]
    """``spark.read.format("ckpt-state")``; see :mod:`spark_ckpt.spark.datasource.state_frames`."""

    @classmethod
    def name(cls) -> str:
        return STATE_FORMAT

    def __init__(self, options: dict[str, str]) -> None:
        from spark_ckpt.spark.datasource.state_frames import StateSourceOptions, plan_state_read

        super().__init__(options)
        self.plan = plan_state_read(StateSourceOptions.parse(options))

    def schema(self) -> StructType:
        return from_arrow_schema(self.plan.schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return CkptStateReader(self.plan)

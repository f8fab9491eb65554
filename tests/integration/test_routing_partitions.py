"""The subtasks' group keys land on distinct partitions of Spark's shuffle. Oracle: Spark's
own hash partitioning, observed on a grouped DataFrame (``spark_partition_id`` after a
``groupBy`` into ``spark.sql.shuffle.partitions`` partitions)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from spark_ckpt.spark.executors.routing import group_keys

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(("parallelism", "partitions"), [(2, 2), (3, 2), (4, 4), (6, 3)])
def test_subtask_s_runs_in_partition_s_mod_partitions(
    spark: SparkSession, parallelism: int, partitions: int
) -> None:
    from pyspark.sql import functions as F

    keys = group_keys(parallelism, partitions)
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    adaptive = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # no coalescing: the raw shuffle
    try:
        df = spark.createDataFrame([(k, s) for s, k in enumerate(keys)], "g int, subtask int")
        placed = (
            df.groupBy("g")
            .agg(F.first("subtask").alias("subtask"))
            .select("subtask", F.spark_partition_id().alias("partition"))
            .collect()
        )
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", str(previous))
        spark.conf.set("spark.sql.adaptive.enabled", str(adaptive))
    assert {r["subtask"]: r["partition"] for r in placed} == {
        s: s % partitions for s in range(parallelism)
    }

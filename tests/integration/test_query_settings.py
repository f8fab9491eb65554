"""SQL settings for one streaming query (:mod:`spark_ckpt.spark.session.query_settings`): a
setting made around ``start()`` holds for that query's micro-batches, and the session is as
it was right after; a pipeline that routes transformed rows starts its query so."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_ckpt import Pipeline, RunningCount
from spark_ckpt.spark.session.query_settings import ROUTING_SETTINGS, query_settings

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark]

RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"


def test_a_setting_made_around_start_holds_for_that_query_only(
    spark: SparkSession, tmp_path: Path
) -> None:
    def batch_sizes(batches: Iterator[Any]) -> Iterator[Any]:  # local: pickled by value
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"n": [batch.num_rows]})

    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(pa.table({"x": list(range(6))}), source / "part.parquet")
    before = spark.conf.get(RECORDS, None)
    writer = (
        spark.readStream.schema("x long")
        .parquet(str(source))
        .mapInArrow(batch_sizes, "n long")
        .writeStream.format("memory")
        .queryName("batch_sizes")
        .option("checkpointLocation", str(tmp_path / "spark"))
        .trigger(availableNow=True)
    )
    with query_settings(spark, {RECORDS: "2"}):
        query = writer.start()
    assert spark.conf.get(RECORDS, None) == before  # the session is as it was
    query.awaitTermination()
    sizes = [row.n for row in spark.table("batch_sizes").collect()]
    assert sorted(sizes) == [2, 2, 2]  # the query ran with the setting


def test_a_pipeline_routing_transformed_rows_sets_them_for_its_query_only(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = {"source": "generator", "channels": 1, "rate": 0.0, "backlog": "10"}
    counter = RunningCount("counter", "user_id")
    out = str(tmp_path / "out")

    def prepared(name: str, **options: Any) -> Any:
        pipeline = Pipeline(spark, name, root=str(tmp_path / name))
        return pipeline.prepare(source, counter, output=out, **options).settings

    assert prepared("routed", transform=lambda df: df) == ROUTING_SETTINGS
    assert prepared("untransformed") == {}
    assert prepared("driver", transform=lambda df: df, placement="driver") == {}
    pipeline = Pipeline(spark, "settings", root=str(tmp_path / "root"))
    before = spark.conf.get(BYTES, None)
    result = pipeline.run(source, counter, output=out, transform=lambda df: df, available_now=True)
    assert result.failures == ()
    assert spark.conf.get(BYTES, None) == before

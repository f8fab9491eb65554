"""Spark SQL before the keyed operators (``Pipeline.run(..., transform=...)``): a projection
and a ``where`` whose predicate is null on barrier rows keep every barrier, so checkpoints
complete and the count is exactly the fold over the filtered input, on the executors and in
the driver; operations that would move or drop barrier rows are refused before anything
runs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import output_rows, read_delta, running_count_rows

from spark_ckpt import CheckpointConfig, Pipeline, RunningCount
from spark_ckpt.errors import ConfigError
from spark_ckpt.sources.generator import GeneratorSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SOURCE = {"source": "generator", "channels": 2, "rate": 0.0, "backlog": "3000", "keys": 1000}


def bucketed(df: Any) -> Any:
    return (
        df.withColumn("bucket", df["user_id"] % 7)
        .where("amount > 400")  # null on barrier rows: they must pass anyway
        .select("bucket", "amount")
    )


@pytest.mark.parametrize("placement", ["executors", "driver"])
def test_a_filtered_projection_keeps_the_barriers_and_counts_exactly_once(
    spark: SparkSession, tmp_path: Path, placement: str
) -> None:
    pipeline = Pipeline(
        spark,
        f"transform-{placement}",
        config=CheckpointConfig(interval_ms=300),
        root=str(tmp_path / "root"),
    )
    out = tmp_path / "out"
    result = pipeline.run(
        SOURCE,
        RunningCount("per_bucket", "bucket"),
        output=str(out),
        placement=placement,
        available_now=True,
        transform=bucketed,
    )
    assert result.failures == () and result.checkpoints_completed >= 1
    spec = GeneratorSpec.from_options({k: str(v) for k, v in SOURCE.items() if k != "source"})
    expected: Counter[int] = Counter()
    for channel in range(2):
        rows = spec.rows(channel, 0, 3000)
        for user, amount in zip(
            rows.column("user_id").to_pylist(), rows.column("amount").to_pylist(), strict=True
        ):
            if amount > 400:
                expected[user % 7] += 1
    assert output_rows(read_delta(out), "bucket") == running_count_rows(expected)


@pytest.mark.parametrize(
    ("transform", "named"),
    [
        (lambda df: df.groupBy("user_id").count(), "groupBy"),
        (lambda df: df.repartition(4), "repartition"),
        (lambda df: df.orderBy("amount"), "orderBy"),
        (lambda df: df.dropna(), "dropna"),
        (lambda df: df.drop("_ckpt_kind"), "_ckpt_kind"),
        (lambda df: df.withColumn("_ckpt_offset", df["amount"]), "_ckpt_offset"),
        (lambda df: df.frame.select("user_id"), "DataFrame"),
        (lambda df: df.select("amount"), "key column 'user_id'"),
    ],
)
def test_what_cannot_keep_the_barriers_is_refused(
    spark: SparkSession, tmp_path: Path, transform: Any, named: str
) -> None:
    pipeline = Pipeline(spark, "transform-refused", root=str(tmp_path / "root"))
    with pytest.raises(ConfigError, match=named):
        pipeline.run(SOURCE, RunningCount(), output=str(tmp_path / "out"), transform=transform)

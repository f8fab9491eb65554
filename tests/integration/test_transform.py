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


@pytest.mark.parametrize("placement", ["executors"])
def test_a_transform_per_input_makes_the_key_of_its_own_input(
    spark: SparkSession, tmp_path: Path, placement: str
) -> None:
    """Two Delta inputs: ``orders`` with the user in a string column ``who`` and big amounts
    only wanted, ``refunds`` as they are. Each input's transform makes its own ``user_id``;
    a running count reads their union. The count is the fold over the filtered inputs. (The
    transform is in the query, the same for both placements.)"""
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    rng = np.random.default_rng(8)
    n = 600
    orders = pa.table(
        {
            "who": pa.array([f"u{u}" for u in rng.integers(0, 30, n)]),
            "amount": pa.array(rng.integers(0, 100, n), pa.int64()),
        }
    )
    refunds = pa.table(
        {
            "user_id": pa.array(rng.integers(0, 30, n), pa.int64()),
            "amount": pa.array(rng.integers(0, 100, n), pa.int64()),
        }
    )
    write_deltalake(str(tmp_path / "orders"), orders)
    write_deltalake(str(tmp_path / "refunds"), refunds)

    def parse_orders(df: Any) -> Any:
        return (
            df.withColumn("user_id", df["who"].substr(2, 9).cast("long"))
            .where("amount >= 50")
            .select("user_id", "amount")
        )

    pipeline = Pipeline(
        spark,
        f"transform-inputs-{placement}",
        config=CheckpointConfig(interval_ms=300),
        root=str(tmp_path / "root"),
    )
    out = tmp_path / "out"
    delta = {"source": "delta", "channels": 2, "maxRowsPerTrigger": 300}
    result = pipeline.run(
        sources={
            "orders": {**delta, "path": str(tmp_path / "orders")},
            "refunds": {**delta, "path": str(tmp_path / "refunds")},
        },
        operators=RunningCount("per_user", "user_id"),
        output=str(out),
        placement=placement,
        available_now=True,
        transform={"orders": parse_orders},
    )
    assert result.failures == () and result.checkpoints_completed >= 1
    expected: Counter[int] = Counter(
        int(who[1:])
        for who, amount in zip(orders["who"].to_pylist(), orders["amount"].to_pylist(), strict=True)
        if amount >= 50
    )
    expected.update(refunds["user_id"].to_pylist())
    assert output_rows(read_delta(out)) == running_count_rows(expected)


def test_bad_transforms_of_several_inputs_are_refused(spark: SparkSession, tmp_path: Path) -> None:
    pipeline = Pipeline(spark, "bad-transforms", root=str(tmp_path / "root"))
    gen = {"source": "generator", "channels": 1, "rate": 0.0, "backlog": "10"}
    sources = {"a": gen, "b": {**gen, "seed": 3}}
    run = {"sources": sources, "operators": RunningCount("c", "user_id")}
    with pytest.raises(ConfigError, match="a function per input name"):
        pipeline.run(**run, output=str(tmp_path / "o"), transform=lambda df: df)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="an input of sources"):
        pipeline.run(**run, output=str(tmp_path / "o"), transform={"c": lambda df: df})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="key column 'user_id'"):
        pipeline.run(
            **run,  # type: ignore[arg-type]
            output=str(tmp_path / "o"),
            transform={"a": lambda df: df.select("amount")},
            available_now=True,
        )

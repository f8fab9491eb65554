"""Named outputs (Flink's side outputs): an operator's rows for ``StateContext.output(name,
rows)`` land in a Delta table of their own, committed exactly once with the same checkpoint as
the main output, and rolled back with it when an earlier checkpoint is restored.

The oracle is a plain fold over the input table: the running count per user (the main
output), the counts that reach a multiple of 5 (``milestones``) and the rows with an amount
of 90 or more (``big``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pytest
from conftest import read_delta
from deltalake import write_deltalake

from spark_ckpt import (
    CheckpointConfig,
    KeyedOperator,
    Pipeline,
    RestoreSettings,
    StateContext,
    ValueStateDescriptor,
)
from spark_ckpt.errors import ConfigError
from spark_ckpt.runtime.operator import rank_within_key

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

COUNTS = pa.schema([("user_id", pa.int64()), ("count", pa.int64())])
BIG = pa.schema([("user_id", pa.int64()), ("amount", pa.int64())])
ROWS = 1200


class CountWithSides(KeyedOperator):
    """The running count, with two named outputs: milestones and big amounts."""

    COUNT = ValueStateDescriptor("count", pa.int64())

    def __init__(self) -> None:
        super().__init__("counter", "user_id", pa.int64())

    @property
    def output_schema(self) -> pa.Schema:
        return COUNTS

    @property
    def side_outputs(self) -> dict[str, pa.Schema]:
        return {"milestones": COUNTS, "big": BIG}

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        keys = batch.column("user_id")
        distinct, codes, rank = rank_within_key(keys)
        before = state.get_values(self.COUNT, distinct).fill_null(0).to_numpy(zero_copy_only=False)
        state.put_values(
            self.COUNT, distinct, pa.array(before + np.bincount(codes, minlength=len(distinct)))
        )
        counts = pa.array(before[codes] + rank + 1, pa.int64())
        out = pa.table([keys.cast(pa.int64()), counts], schema=COUNTS)
        state.output("milestones", out.filter(pa.array(counts.to_numpy() % 5 == 0)))
        amounts = batch.column("amount").to_numpy()
        big = batch.select(["user_id", "amount"]).cast(BIG).filter(pa.array(amounts >= 90))
        state.output("big", big)
        return out


def _input(path: Path) -> pa.Table:
    rng = np.random.default_rng(5)
    table = pa.table(
        {
            "user_id": pa.array(rng.integers(0, 40, ROWS), pa.int64()),
            "amount": pa.array(rng.integers(0, 100, ROWS), pa.int64()),
        }
    )
    write_deltalake(str(path), table)
    return table


def _expected(table: pa.Table) -> tuple[Counter[tuple[int, int]], ...]:
    seen: Counter[int] = Counter()
    counts, milestones, big = Counter(), Counter(), Counter()
    for user, amount in zip(table["user_id"].to_pylist(), table["amount"].to_pylist(), strict=True):
        seen[user] += 1
        counts[(user, seen[user])] += 1
        if seen[user] % 5 == 0:
            milestones[(user, seen[user])] += 1
        if amount >= 90:
            big[(user, amount)] += 1
    return counts, milestones, big


def _pairs(path: Path, second: str) -> Counter[tuple[int, int]]:
    t = read_delta(path)
    return Counter(zip(t["user_id"].to_pylist(), t[second].to_pylist(), strict=True))


@pytest.mark.parametrize("placement", ["executors", "driver"])
def test_named_outputs_are_exactly_once_and_roll_back_with_the_output(
    spark: SparkSession, tmp_path: Path, placement: str
) -> None:
    """A run in several checkpoints; then a restore of its first checkpoint, which rolls
    every table back to it and replays the rest: each table holds its fold exactly once."""
    table = _input(tmp_path / "in")
    lake = tmp_path / "lake"
    outputs = {"milestones": str(lake / "milestones"), "big": str(lake / "big")}
    source = {
        "source": "delta",
        "path": str(tmp_path / "in"),
        "channels": 2,
        "maxRowsPerTrigger": 200,
    }
    p = Pipeline(
        spark,
        "sides",
        config=CheckpointConfig(interval_ms=200, retained_checkpoints=50),
        root=str(tmp_path / "root"),
    )
    job = {"output": str(lake / "counts"), "outputs": outputs, "placement": placement}
    p.run(source, CountWithSides(), available_now=True, **job)  # type: ignore[arg-type]
    counts, milestones, big = _expected(table)
    assert _pairs(lake / "counts", "count") == counts
    assert _pairs(lake / "milestones", "count") == milestones and milestones
    assert _pairs(lake / "big", "amount") == big and big

    first = min(c.checkpoint_id for c in p.client.checkpoints())
    assert first < max(c.checkpoint_id for c in p.client.checkpoints())
    p.run(
        source,
        CountWithSides(),
        available_now=True,
        restore=RestoreSettings.checkpoint(first),
        **job,  # type: ignore[arg-type]
    )
    assert _pairs(lake / "counts", "count") == counts
    assert _pairs(lake / "milestones", "count") == milestones
    assert _pairs(lake / "big", "amount") == big


def test_bad_named_outputs_are_refused_before_anything_runs(
    spark: SparkSession, tmp_path: Path
) -> None:
    p = Pipeline(spark, "bad-sides", root=str(tmp_path / "root"))
    source = {"source": "delta", "path": str(tmp_path / "in")}
    _input(tmp_path / "in")
    out = str(tmp_path / "out")
    with pytest.raises(ConfigError, match="an operator declares"):
        p.run(source, CountWithSides(), output=out, outputs={"other": str(tmp_path / "o")})
    with pytest.raises(ConfigError, match="another table than the output"):
        p.run(source, CountWithSides(), output=out, outputs={"big": out})
    with pytest.raises(ConfigError, match="another table than output 'big'"):
        p.run(
            source,
            CountWithSides(),
            output=out,
            outputs={"big": str(tmp_path / "x"), "milestones": str(tmp_path / "x")},
        )


def test_late_rows_of_several_inputs_go_to_one_late_table_naming_their_input(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two Delta inputs of one schema, counted as their union; the last rows of ``a`` are
    from 1970, far behind the watermark when they arrive: they land in the late-output table,
    each once, with ``input = 'a'`` and their own columns in ``a``'s struct; the count is the
    fold over every other row. (The task writes the late rows alike in both placements.)"""
    placement = "executors"
    from datetime import UTC, datetime, timedelta

    from spark_ckpt import WatermarkStrategy

    start = datetime(2024, 1, 1, tzinfo=UTC)
    rng = np.random.default_rng(21)

    def rows(n: int, late: int) -> pa.Table:
        times = [start + timedelta(milliseconds=50 * i) for i in range(n)]
        times += [datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=i) for i in range(late)]
        return pa.table(
            {
                "user_id": pa.array(rng.integers(0, 20, n + late), pa.int64()),
                "amount": pa.array(rng.integers(0, 100, n + late), pa.int64()),
                "event_ts": pa.array(times, pa.timestamp("us", tz="UTC")),
            }
        )

    a, b = rows(300, 5), rows(300, 0)
    write_deltalake(str(tmp_path / "a"), a)
    write_deltalake(str(tmp_path / "b"), b)
    delta = {"source": "delta", "channels": 1, "maxRowsPerTrigger": 100}
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("event_ts", "1s")
    p = Pipeline(spark, f"late-inputs-{placement}", root=str(tmp_path / "root"))
    p.run(
        sources={
            "a": {**delta, "path": str(tmp_path / "a")},
            "b": {**delta, "path": str(tmp_path / "b")},
        },
        operators=CountWithSides(),
        watermark=strategy,
        output=str(tmp_path / "counts"),
        late_output=str(tmp_path / "late"),
        placement=placement,
        available_now=True,
    )
    late = read_delta(tmp_path / "late")
    assert late["input"].to_pylist() == ["a"] * 5
    assert sorted(r["user_id"] for r in late["a"].to_pylist()) == sorted(
        a["user_id"].to_pylist()[300:]
    )
    assert late["b"].null_count == 5
    on_time = pa.concat_tables([a.slice(0, 300), b])
    counts, _, _ = _expected(on_time)
    assert _pairs(tmp_path / "counts", "count") == counts

"""The lookup join against a Delta table that changes while the job runs.

Each version *k* of the table gives every user the tier *k*, so an output row's tier says
which version it joined with. The oracle is Spark's own offset log: per micro-batch the rows
it read of each channel and the table version the source recorded for it; each row of the
generator (re-read from its spec) must be in the output once, with the tier of its batch's
version, and the versions written while the job ran must show up."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from conftest import read_delta
from deltalake import write_deltalake

from spark_ckpt import CheckpointConfig, LookupJoin, Pipeline
from spark_ckpt.errors import ConfigError
from spark_ckpt.sources.generator import GeneratorSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

USERS = 20
SOURCE = {"source": "generator", "channels": 2, "rate": 40, "backlog": 100, "keys": USERS}


def _write_version(path: Path, tier: int, users: int = USERS) -> None:
    table = pa.table(
        {
            "user_id": pa.array(range(users), pa.int64()),
            "tier": pa.array([tier] * users, pa.int64()),
        }
    )
    write_deltalake(str(path), table, mode="overwrite")


def _logged(root: Path) -> list[tuple[list[tuple[int, int]], int]]:
    """Per micro-batch of the run: each channel's rows ``[start, end)`` and the lookup
    table's version its offsets record."""
    [run] = list((root / "_spark").iterdir())
    files = sorted((run / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    begin = [0, 0]
    out = []
    for f in files:
        offset = json.loads(f.read_text().splitlines()[2])
        end = offset["positions"]
        [version] = offset["lookups"].values()
        out.append((list(zip(begin, end, strict=True)), int(version)))
        begin = end
    return out


# executors only: the versions reach the subtasks in the progress rows, which the driver's
# subtasks read alike (test_side_outputs.py and the doc tests run the driver placement)
@pytest.mark.parametrize("placement", ["executors"])
def test_each_batch_joins_the_version_its_offsets_record(
    spark: SparkSession, tmp_path: Path, placement: str
) -> None:
    table = tmp_path / "tiers"
    _write_version(table, 0)
    pipeline = Pipeline(
        spark, "lookup", config=CheckpointConfig(interval_ms=500), root=str(tmp_path / "root")
    )
    run = pipeline.start(
        SOURCE,
        LookupJoin(str(table), key="user_id"),
        output=str(tmp_path / "out"),
        placement=placement,
        trigger_s=0.3,
    )
    try:
        for tier in (1, 2, 3):
            deadline = time.monotonic() + 120
            while not [c for c in pipeline.client.checkpoints()] and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.5)
            _write_version(table, tier)
        time.sleep(2.0)
    finally:
        run.stop(timeout_s=120)
    spec = GeneratorSpec.from_options({k: str(v) for k, v in SOURCE.items() if k != "source"})
    final = pipeline.client.latest()
    assert final is not None
    ends = [final.offsets()[("source", c)] for c in range(2)]
    expected: Counter[tuple[int, int, int]] = Counter()
    seen_versions = set()
    for slices, version in _logged(tmp_path / "root"):
        for channel, (start, end) in enumerate(slices):
            end = min(end, ends[channel])  # the final checkpoint's positions
            if end <= start:
                continue
            seen_versions.add(version)
            rows = spec.rows(channel, start, end)
            for user, amount in zip(
                rows["user_id"].to_pylist(), rows["amount"].to_pylist(), strict=True
            ):
                expected[(user, amount, version)] += 1
    out = read_delta(tmp_path / "out")
    assert out.column_names == ["user_id", "amount", "event_ts", "tier"]
    actual = Counter(
        zip(
            out["user_id"].to_pylist(),
            out["amount"].to_pylist(),
            out["tier"].to_pylist(),
            strict=True,
        )
    )
    assert actual == expected
    assert {0, 3} <= seen_versions  # the first version, and the last one written meanwhile


def test_a_left_outer_lookup_keeps_rows_without_a_match(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Only users 0..9 are in the table: the others' rows come with a null tier."""
    table = tmp_path / "tiers"
    _write_version(table, 7, users=10)
    pipeline = Pipeline(spark, "lookup-outer", root=str(tmp_path / "root"))
    source = {"source": "generator", "channels": 2, "rate": 0, "backlog": 200, "keys": USERS}
    pipeline.run(
        source,
        LookupJoin(str(table), key="user_id", how="left_outer"),
        output=str(tmp_path / "out"),
        available_now=True,
    )
    out = read_delta(tmp_path / "out")
    assert out.num_rows == 400
    tiers = dict(zip(out["user_id"].to_pylist(), out["tier"].to_pylist(), strict=False))
    assert all((tiers[u] == 7) == (u < 10) for u in tiers) and len(tiers) == USERS


def test_a_missing_lookup_table_is_refused_before_anything_runs(
    spark: SparkSession, tmp_path: Path
) -> None:
    pipeline = Pipeline(spark, "lookup-missing", root=str(tmp_path / "root"))
    with pytest.raises(ConfigError, match="an existing Delta table"):
        pipeline.run(
            SOURCE, LookupJoin(str(tmp_path / "nope"), key="user_id"), output=str(tmp_path / "o")
        )
    _write_version(tmp_path / "tiers", 0)
    with pytest.raises(ConfigError, match="a column of the table"):
        pipeline.run(
            SOURCE,
            LookupJoin(str(tmp_path / "tiers"), key=("user_id", "uid")),
            output=str(tmp_path / "o"),
        )

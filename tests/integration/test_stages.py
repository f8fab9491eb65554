"""Keyed stages, re-keyed between them (``operators=[Stage(...), Stage(...)]``): per-user running
totals, then per-country running counts (``spark-ckpt demo --job stages``), in one query and
one checkpoint, on the executors and in the driver.

The oracle is a plain fold over the input table (:mod:`stage_jobs`). Each run covers several
checkpoints; a restore of the first checkpoint at another parallelism per stage (2 → 3 for
one, 3 → 2 for the other) rolls both stages' tables back and replays the rest, exactly once;
a savepoint of a job of one stage restores into a job with one more stage."""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pytest
from conftest import read_delta, stop_with_savepoint
from deltalake import write_deltalake
from stage_jobs import expected, two_stages

from spark_ckpt import CheckpointConfig, Pipeline, RestoreSettings, RunningCount, Stage, StateReader
from spark_ckpt.cli import main
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.demo import COUNTRIES, UserTotals
from spark_ckpt.errors import ConfigError
from spark_ckpt.monitoring.documents import details
from spark_ckpt.monitoring.root_view import RootReader

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS = 1000


def _input(path: Path, rows: int = ROWS, seed: int = 11) -> pa.Table:
    rng = np.random.default_rng(seed)
    table = pa.table(
        {
            "user_id": pa.array(rng.integers(0, 40, rows), pa.int64()),
            "amount": pa.array(rng.integers(0, 100, rows), pa.int64()),
        }
    )
    write_deltalake(str(path), table, mode="append")
    return table


def _pairs(path: Path, key: str, value: str) -> Counter[tuple[int, int]]:
    t = read_delta(path)
    return Counter(zip(t[key].to_pylist(), t[value].to_pylist(), strict=True))


def _source(path: Path) -> dict[str, object]:
    return {"source": "delta", "path": str(path), "channels": 2, "maxRowsPerTrigger": 250}


@pytest.mark.parametrize("placement", ["executors", "driver"])
def test_two_stages_are_exactly_once_and_restore_each_at_another_parallelism(
    spark: SparkSession, tmp_path: Path, placement: str
) -> None:
    """Users on 2 subtasks, countries on 3, each stage into a table of its own; then the first
    checkpoint restored with users on 3 and countries on 2: both tables hold their fold exactly
    once, and every checkpoint was acknowledged by every subtask of both stages."""
    table = _input(tmp_path / "in")
    users_out, countries_out = tmp_path / "lake" / "users", tmp_path / "lake" / "countries"
    p = Pipeline(
        spark,
        f"stages-{placement}",
        config=CheckpointConfig(interval_ms=200, retained_checkpoints=50),
        root=str(tmp_path / "root"),
    )
    users, countries = expected(table["user_id"].to_pylist(), table["amount"].to_pylist())
    job = {"output": str(countries_out), "placement": placement, "available_now": True}
    p.run(_source(tmp_path / "in"), two_stages(2, 3, output=str(users_out)), **job)  # type: ignore[arg-type]
    assert _pairs(users_out, "user_id", "total") == users
    assert _pairs(countries_out, "country", "count") == countries
    checkpoints = p.client.checkpoints()
    assert len(checkpoints) > 2
    for cp in checkpoints:
        tasks = sorted((t.task.vertex, t.task.subtask) for t in cp.tasks)
        assert tasks == [("chain", 0), ("chain", 1)] + [("stage:countries", s) for s in range(3)]

    first = min(c.checkpoint_id for c in checkpoints)
    p.run(
        _source(tmp_path / "in"),
        two_stages(3, 2, output=str(users_out)),
        restore=RestoreSettings.checkpoint(first),
        **job,  # type: ignore[arg-type]
    )
    assert _pairs(users_out, "user_id", "total") == users
    assert _pairs(countries_out, "country", "count") == countries
    last = p.client.checkpoints()[-1]
    assert Counter(t.task.vertex for t in last.tasks) == {"chain": 3, "stage:countries": 2}
    _shows_the_stages(tmp_path / "root", last.checkpoint_id, {"users": 3, "countries": 2})
    # the offline reader sees both stages' operators
    reader = StateReader.open(str(tmp_path / "root"))
    assert [(s["stage"], s["subtasks"], s["operators"]) for s in reader.stages()] == [
        ("users", 3, ["users"]),
        ("countries", 2, ["countries"]),
    ]
    assert reader.keyed_info("countries", "count").max_parallelism == 32
    assert reader.keyed_info("users", "total").max_parallelism == 128
    state = reader.keyed("countries", "count")
    per_country = dict(zip(state["key"].to_pylist(), state["value"].to_pylist(), strict=True))
    assert per_country == Counter(u % COUNTRIES for u in table["user_id"].to_pylist())


def _shows_the_stages(root: Path, checkpoint_id: int, subtasks: dict[str, int]) -> None:
    """``spark-ckpt checkpoints show`` and the checkpoint page's details name the stages and
    count their subtasks."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["checkpoints", "show", str(checkpoint_id), "--root", str(root), "--json"]) == 0
    [detail] = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    assert {s["stage"]: s["subtasks"] for s in detail["stages"]} == subtasks
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["checkpoints", "show", str(checkpoint_id), "--root", str(root)]) == 0
    assert "stages" in out.getvalue() and "stage:countries" in out.getvalue()
    view = RootReader(str(root), DeltaCheckpointStore(str(root))).read()
    page = details(view, checkpoint_id)
    assert page is not None
    assert [(s["stage"], s["subtasks"]) for s in page["stages"]] == list(subtasks.items())


def test_a_savepoint_of_one_stage_restores_into_a_job_with_one_more(
    spark: SparkSession, tmp_path: Path
) -> None:
    """v1: the users stage alone into the users table, stopped with a savepoint part-way; v2,
    from the savepoint: users (into the same table) then countries. The users table holds
    every running total once; the countries table counts, per country, the rows v2 read."""
    first = _input(tmp_path / "in")
    p = Pipeline(
        spark,
        "add-stage",
        config=CheckpointConfig(interval_ms=300, savepoint_dir=str(tmp_path / "savepoints")),
        root=str(tmp_path / "root"),
    )
    users_out, countries_out = tmp_path / "lake" / "users", tmp_path / "lake" / "countries"
    source = {**_source(tmp_path / "in"), "maxRowsPerTrigger": 100}
    run = p.start(source, UserTotals(), output=str(users_out))
    deadline = time.monotonic() + 240
    while not p.client.checkpoints():
        assert time.monotonic() < deadline and run.query.isActive, "no checkpoint"
        time.sleep(0.2)
    savepoint = stop_with_savepoint(run, tmp_path / "savepoints")
    before = Counter(u % COUNTRIES for u in read_delta(users_out)["user_id"].to_pylist())
    second = _input(tmp_path / "in", 600, seed=12)
    p.run(
        source,
        two_stages(2, 3, output=str(users_out)),
        output=str(countries_out),
        restore=RestoreSettings.savepoint(savepoint.path),
        available_now=True,
    )
    rows = pa.concat_tables([first, second])
    users, _ = expected(rows["user_id"].to_pylist(), rows["amount"].to_pylist())
    assert _pairs(users_out, "user_id", "total") == users
    totals = Counter(u % COUNTRIES for u in rows["user_id"].to_pylist())
    after = {c: totals[c] - before[c] for c in totals}
    assert sum(after.values()) > 0
    assert _pairs(countries_out, "country", "count") == Counter(
        (c, k) for c, n in after.items() for k in range(1, n + 1)
    )


def test_bad_stages_are_refused_before_anything_runs(spark: SparkSession, tmp_path: Path) -> None:
    p = Pipeline(spark, "bad-stages", root=str(tmp_path / "root"))
    _input(tmp_path / "in", 10)
    source = _source(tmp_path / "in")
    out = str(tmp_path / "out")
    with pytest.raises(ConfigError, match="key column of the rows the stage before it emits"):
        p.run(source, [Stage(UserTotals()), Stage(RunningCount("c", "region"))], output=out)
    with pytest.raises(ConfigError, match="distinct names"):
        p.run(
            source,
            [Stage(UserTotals(), name="a"), Stage(RunningCount("c", "country"), name="a")],
            output=out,
        )
    with pytest.raises(ConfigError, match="distinct uids"):
        p.run(source, [Stage(UserTotals("x")), Stage(RunningCount("x", "country"))], output=out)
    with pytest.raises(ConfigError, match="last stage's output goes to the job's output"):
        p.run(
            source,
            [Stage(UserTotals()), Stage(RunningCount("c", "country"), output=out + "2")],
            output=out,
        )
    with pytest.raises(ConfigError, match="another table than the output"):
        p.run(
            source,
            [Stage(UserTotals(), output=out), Stage(RunningCount("c", "country"))],
            output=out,
        )
    with pytest.raises(ConfigError, match="operators, or stages"):
        p.run(source, [Stage(UserTotals()), RunningCount("c", "country")], output=out)  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="keyed by one column"):
        Stage([UserTotals(), RunningCount("c", "country")])

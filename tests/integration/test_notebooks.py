"""The five notebooks (Databricks source format) run as written: their code cells, in order,
in one namespace with the test session's ``spark`` and small parameters. Each notebook ends
with its own checks against simple oracles (every input row counted once, gapless running
counts, drained savepoint positions, counts from 1 again when state is dropped, an expired
checkpoint on record, the restored positions, sessions equal to a plain-Python
sessionization); here we also check what they leave behind (the plot file, the sessions
table, the savepoint, the open sessions' timers)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from spark_ckpt import StorageOptions
from spark_ckpt.locations.uris import filesystem
from spark_ckpt.testing.s3_endpoint import S3Endpoint

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SEPARATOR = "# COMMAND ----------"
HEADER = "# Databricks notebook source"


def cells(path: Path) -> list[tuple[str, str]]:
    """(kind, source) of each cell: ``md`` for ``# MAGIC %md`` cells, else ``code``."""
    text = path.read_text()
    assert text.startswith(HEADER + "\n"), path
    out = []
    for chunk in text[len(HEADER) :].split(SEPARATOR):
        body = chunk.strip("\n")
        if not body.strip():
            continue
        kind = "md" if body.lstrip().startswith("# MAGIC %md") else "code"
        out.append((kind, body))
    return out


def run(path: Path, spark: Any, params: dict[str, Any]) -> dict[str, Any]:
    namespace: dict[str, Any] = {"spark": spark, "__name__": "__notebook__"}
    code = [body for kind, body in cells(path) if kind == "code"]
    for i, body in enumerate(code):
        exec(compile(body, f"{path.name}[{i}]", "exec"), namespace)
        if i == 0:  # the parameter cell
            assert set(params) <= namespace.keys(), set(params) - namespace.keys()
            namespace.update(params)
    return namespace


@pytest.mark.parametrize(
    "name",
    [
        "01_quickstart.py",
        "02_savepoint_and_upgrade.py",
        "03_monitoring.py",
        "04_sessionization.py",
        "05_attribution.py",
    ],
)
def test_notebooks_are_in_databricks_source_format(name: str) -> None:
    parsed = cells(NOTEBOOKS / name)
    kinds = [k for k, _ in parsed]
    assert kinds[0] == "md" and "code" in kinds and len(parsed) >= 6
    for kind, body in parsed:
        if kind == "md":
            assert all(line.startswith("# MAGIC") for line in body.splitlines()), body
    compile((NOTEBOOKS / name).read_text(), name, "exec")  # also plain Python


@dataclass(frozen=True)
class Where:
    """Where a notebook runs: its ``BASE`` and ``STORAGE_OPTIONS`` parameters."""

    base: str
    storage_options: dict[str, str] | None

    def params(self, **more: Any) -> dict[str, Any]:
        return {"BASE": self.base, "STORAGE_OPTIONS": self.storage_options, **more}

    def exists(self, location: str) -> bool:
        fs, path = filesystem(location)
        return bool(fs.get_file_info(path).type is not pafs.FileType.NotFound)


BUCKET = "notebooks"


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    """A local ``BASE``, or one on a real S3 endpoint with the credentials given only as
    ``STORAGE_OPTIONS``: no ``AWS_*`` variable in this process, nor in the session's
    workers. Nothing may land in a local folder named ``s3:``."""
    if request.param == "local":
        yield Where(str(tmp_path), None)
        return
    endpoint: S3Endpoint = request.getfixturevalue("s3")
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    StorageOptions.of(endpoint.storage_options(), ["s3://notebooks"]).install()  # for checks
    yield Where(f"s3://notebooks/{tmp_path.name}", endpoint.storage_options())
    assert not Path("s3:").exists() and not (tmp_path / "s3:").exists()


@pytest.mark.spark
@pytest.mark.slow
def test_quickstart_notebook(spark: Any, where: Where) -> None:
    ns = run(NOTEBOOKS / "01_quickstart.py", spark, where.params(ROWS=300))
    assert len(ns["out"]) == 600 and len(ns["copied"]) == 600
    for name in ("copy_root", "copy_out", "counts_root", "counts_out", "landed_out"):
        assert where.exists(f"{where.base}/{name}"), name


@pytest.mark.spark
@pytest.mark.slow
# a local BASE only: savepoints on S3, and moved between S3 and a local root, run in
# test_object_store.py (each run of a notebook starts several pipelines)
@pytest.mark.parametrize("where", ["local"], indirect=True)
def test_savepoint_and_upgrade_notebook(spark: Any, where: Where) -> None:
    ns = run(
        NOTEBOOKS / "02_savepoint_and_upgrade.py",
        spark,
        where.params(FIRST_ROWS=300, MORE_ROWS=700),
    )
    assert "'counter'" in ns["refused"]
    assert where.exists(ns["upgraded"]) and where.exists(ns["savepoint"].path)
    assert len(ns["out"]) == 1400
    # allow_non_restored_state: the rows after the savepoint, counted from 1 again
    assert len(ns["out_dropped"]) == 800 and ns["out_dropped"]["count"].min() == 1


@pytest.mark.spark
@pytest.mark.slow
# on S3 only: the statistics, the plot and the page read from the store there, and the
# notebook's code is the same on a local BASE
@pytest.mark.parametrize("where", ["s3"], indirect=True)
def test_monitoring_notebook(spark: Any, where: Where, tmp_path: Path) -> None:
    plot = tmp_path / "checkpoints.png"
    ns = run(
        NOTEBOOKS / "03_monitoring.py",
        spark,
        # on the S3 endpoint a checkpoint takes most of a second: a longer timeout, still
        # shorter than the first run's stalls
        where.params(
            BATCHES=[300, 600, 900],
            PLOT=str(plot),
            TIMEOUT_S=3,
        ),
    )
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert len(ns["out"]) == 1800
    # the stalled first run's checkpoint expired, and is on record
    assert "expired" in {f.reason for f in ns["failures"]}, ns["failures"]
    assert ns["summary"].failures.get("expired", 0) >= 1
    # the overview in the notebook and the page's /metrics count what the client counts
    summary = ns["summary"]
    assert ns["overview"].count("<svg") == 2 and "expired" in ns["overview"]
    failed = 'numberOfFailedCheckpoints{pipeline="monitored"'
    line = next(x for x in ns["metrics"].splitlines() if x.startswith("spark_ckpt_" + failed))
    assert float(line.rsplit(" ", 1)[1]) == summary.failed + summary.aborted


@pytest.mark.spark
@pytest.mark.slow
def test_sessionization_notebook(spark: Any, where: Where) -> None:
    ns = run(
        NOTEBOOKS / "04_sessionization.py",
        spark,
        where.params(USERS=5, MINUTES=6, FILES=(3, 3)),
    )
    import polars as pl

    sessions = pl.read_delta(f"{where.base}/sessions", storage_options=where.storage_options)
    assert sessions.columns == [
        "user",
        "window_start",
        "window_end",
        "clicks",
        "last_click",
        "checkouts",
    ]
    # every click is in one session, emitted or still open; the final run read them all
    open_clicks = sum(n for _, _, _, n, _ in ns["still_open"])
    assert sessions["clicks"].sum() + open_clicks == len(ns["clicks"])
    assert sessions.height == len(ns["expected"]) > len(ns["expected_before"]) > 0
    assert ns["still_open"] and len(ns["timers"]) == len(ns["still_open"])
    assert ns["spanning"]
    assert where.exists(ns["savepoint_path"]) and ns["savepoint"].is_savepoint
    # the second run restored the savepoint: its restore point is on record, naming it
    restored = [r for r in ns["p"].client.history() if "restored_from" in r.properties]
    assert [r.properties["restored_from"] for r in restored] == [
        f"savepoint {ns['savepoint_path']}"
    ]
    assert ns["result"].restored_from == (restored[0].checkpoint_id,)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("where", ["local"], indirect=True)
def test_attribution_notebook(spark: Any, where: Where) -> None:
    """Two inputs, an interval join, a savepoint, a restore into a job with one more stage
    (the join at another parallelism, then its pairs re-keyed by impression; the notebook
    checks its tables against pandas and a plain fold)."""
    ns = run(NOTEBOOKS / "05_attribution.py", spark, where.params(ADS=5, MINUTES=4))
    assert ns["savepoint"].checkpoint.is_savepoint and ns["spanning"]
    assert ns["v2"].restored_from[0] is not None
    assert where.exists(f"{where.base}/clicks_per_impression")
    assert len(ns["after"]) > 0 and sum(ns["got"].values()) == len(ns["after"])
    # every subtask of both stages acknowledged the last checkpoint: 3 + 2
    acks = sorted((ack.task.vertex, ack.task.subtask) for ack in ns["last"].tasks)
    assert acks == [("chain", s) for s in range(3)] + [("stage:impressions", s) for s in range(2)]

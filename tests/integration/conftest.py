"""Shared fixtures and helpers of the Spark integration tests.

* ``spark`` — one local SparkSession for the whole test session
  (:func:`spark_ckpt.spark.session.builders.local_session`: ``local[2]``, 2 shuffle partitions, UI
  off).
* ``demo`` — runs the main job (``python -m spark_ckpt.demo``) in subprocesses, each in a
  session of its own so that a kill takes its JVM and Spark's Python workers along; at
  teardown every such process must be gone (no orphaned JVMs).
* Oracles independent of the code under test: :func:`generated_keys` (the generator's input,
  re-read from :class:`~spark_ckpt.sources.generator.GeneratorSpec`), :func:`running_count_rows` (a
  plain fold), and :func:`read_delta` (a second Delta reader: a replay of ``_delta_log``
  with pyarrow, neither deltalake nor spark-ckpt).
"""

from __future__ import annotations

import json
import urllib.parse
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_ckpt.sources.generator import GeneratorSpec
from spark_ckpt.testing.jobs import (  # noqa: F401 - re-exported for the tests
    DemoArgs,
    DemoLauncher,
    DemoRun,
)
from spark_ckpt.testing.processes import (  # noqa: F401 - re-exported for the tests
    kill_session,
    session_processes,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def shared_session() -> SparkSession:
    """The test process's local SparkSession (``local[2]``, 2 shuffle partitions, UI off),
    started on first use: the ``spark`` fixture's, and where a crash test's final run
    restores what its killed jobs left (:func:`test_crash._finish`)."""
    from spark_ckpt.spark.session.builders import local_session

    return local_session("spark-ckpt-tests", log_level="ERROR")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """:func:`shared_session`, for the whole test session; stopped at the end."""
    session = shared_session()
    yield session
    session.stop()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[DemoLauncher]:
    """Launch ``spark_ckpt.demo`` subprocesses in *tmp_path*; teardown asserts that none of
    their processes (job, JVM, Python workers) outlives the test."""
    launcher = DemoLauncher(tmp_path)
    yield launcher
    survivors = launcher.cleanup()
    assert not survivors, f"orphaned processes after the test: {survivors}"


# -- oracles ---------------------------------------------------------------------------------


def generated_keys(
    spec: GeneratorSpec, ends: Sequence[int], key_column: str = "user_id"
) -> Counter[int]:
    """How many input rows each key has in rows ``[0, ends[c])`` of every channel *c*."""
    counts: Counter[int] = Counter()
    for channel, end in enumerate(ends):
        counts.update(spec.rows(channel, 0, end).column(key_column).to_pylist())
    return counts


def running_count_rows(key_counts: Counter[int]) -> Counter[tuple[int, int]]:
    """The output of a keyed running count over input with *key_counts* rows per key: every
    ``(key, i)`` for ``1 <= i <= n_key`` once (a plain fold, order-free)."""
    return Counter((key, i) for key, n in key_counts.items() for i in range(1, n + 1))


def read_delta(path: Path, version: int | None = None) -> pa.Table:
    """The current version (or *version*) of the Delta table at *path*: replays the JSON
    commits of ``_delta_log`` (add/remove actions) and reads the live Parquet files with
    pyarrow. Empty table when there is no log. Deliberately independent of deltalake."""
    log = path / "_delta_log"
    commits = sorted(log.glob("*.json")) if log.exists() else []
    if not commits:
        return pa.table({})
    assert commits[0].name == f"{0:020d}.json", "log starts at a checkpoint: not supported"
    live: dict[str, None] = {}
    for commit in commits[: None if version is None else version + 1]:
        for line in commit.read_text().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "add" in action:
                live[urllib.parse.unquote(action["add"]["path"])] = None
            elif "remove" in action:
                live.pop(urllib.parse.unquote(action["remove"]["path"]), None)
    tables = [pq.read_table(path / rel) for rel in live]
    return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})


def delta_txn_versions(path: Path) -> list[tuple[str, int]]:
    """The app transactions (``txn`` actions: appId, version) of the Delta table at *path*,
    in commit order."""
    out: list[tuple[str, int]] = []
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            if line.strip():
                txn = json.loads(line).get("txn")
                if txn:
                    out.append((str(txn["appId"]), int(txn["version"])))
    return out


@dataclass(frozen=True)
class LoggedBatch:
    """One micro-batch as Spark's offset log recorded it: per channel its rows
    ``[start, end)``, and its processing time (ms; 0 when the source kept no time)."""

    slices: list[tuple[int, int]]
    batch_ms: int


def logged_batches(root: str, channels: int) -> list[list[LoggedBatch]]:
    """Per run of the pipeline at *root*, in run order, its micro-batches from Spark's
    offset logs (a run starts where the previous one ended: tests that use this restore from
    the last checkpoint or savepoint of the run before)."""
    runs = sorted(Path(root, "_spark").iterdir(), key=lambda p: p.stat().st_mtime)
    out: list[list[LoggedBatch]] = []
    begin = [0] * channels
    for directory in runs:
        logged = sorted((directory / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
        run: list[LoggedBatch] = []
        for f in logged:
            offset = json.loads(f.read_text().splitlines()[2])
            end = offset["positions"]
            run.append(LoggedBatch(list(zip(begin, end, strict=True)), int(offset.get("time", 0))))
            begin = end
        out.append(run)
    return out


def stop_with_savepoint(run: Any, directory: Path) -> Any:
    """Stop *run* (a started :class:`~spark_ckpt.pipeline.pipeline_run.PipelineRun`) with a
    drained savepoint into *directory* (the pipeline's ``savepoint.dir``); returns that
    :class:`~spark_ckpt.delta.savepoint.Savepoint`. The query is stopped whatever happens."""
    from spark_ckpt import list_savepoints

    try:
        final = run.stop(savepoint=True, drain=True, timeout_s=240)
    finally:
        if run.query.isActive:
            run.query.stop()
    assert final is not None and final.is_savepoint
    [savepoint] = [
        s
        for s in list_savepoints(str(directory))
        if s.checkpoint.checkpoint_id == final.checkpoint_id
    ]
    return savepoint


def newest_segment_meta(root: Path | str) -> dict[str, Any] | None:
    """The metadata of the newest changelog segment of any subtask under the local pipeline
    root *root* (None: none). The product folds and evicts segments while a job runs, so a
    segment listed here may be gone by the time it is read: such a one is passed over for
    the next newest, never an error."""
    stamped = []
    for meta in Path(root).glob("_changelog/*/*/b*/meta.json"):
        try:
            stamped.append((meta.stat().st_mtime, meta))
        except FileNotFoundError:
            continue  # evicted between the listing and the stat
    for _, meta in sorted(stamped, key=lambda s: s[0], reverse=True):
        try:
            return dict(json.loads(meta.read_text())["meta"])
        except FileNotFoundError:
            continue  # evicted between the stat and the read
    return None


def output_rows(table: pa.Table, key_column: str = "user_id") -> Counter[tuple[int, int]]:
    """The ``(key, count)`` rows of a running-count output table, as a multiset."""
    if table.num_rows == 0:
        return Counter()
    return Counter(
        zip(table.column(key_column).to_pylist(), table.column("count").to_pylist(), strict=True)
    )

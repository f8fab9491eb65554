"""Subtasks on executors (``placement="executors"``): the operator chain runs in Spark tasks
next to its state, under a real local SparkSession, into a real Delta table.

Oracle: a plain fold over the generator's input (per key, the running count at every row),
up to the final checkpoint's source positions."""

from __future__ import annotations

import os
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import (
    DemoLauncher,
    delta_txn_versions,
    generated_keys,
    newest_segment_meta,
    output_rows,
    read_delta,
    running_count_rows,
)
from test_crash import LAGGING_BACKLOG, _args, _diff, _final_positions, _finish, _kill_repeatedly

from spark_ckpt.coordination.runs import Runs
from spark_ckpt.pipeline.pipeline import Pipeline
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.runtime.config import CheckpointConfig, CheckpointingMode, RestartStrategies
from spark_ckpt.runtime.operator import KeyedOperator, RunningCount
from spark_ckpt.runtime.restore_settings import RestoreSettings
from spark_ckpt.sources.generator import GeneratorSpec
from spark_ckpt.spark.executors.executor_cache import CacheKey
from spark_ckpt.spark.executors.subtask_host import host_address
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.state_restore import restore_backends

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BACKLOG = (1500, 300, 300)  # channel 0 lags: with head placement it holds the others
KEYS = 30
SEED = 5


class FailOnce(KeyedOperator):
    """*inner* that raises once, in the first batch holding row *offset* of channel 0 or a
    later one (after rows were processed past the last checkpoint), claiming *marker* so no
    later attempt fails again. Handed in by the test, pickled with it by value."""

    def __init__(self, inner: KeyedOperator, marker: str, offset: int) -> None:
        super().__init__(inner.uid, inner.key_column, inner.key_type)
        self.inner, self.marker, self.offset = inner, marker, offset

    @property
    def output_schema(self) -> pa.Schema | None:
        return self.inner.output_schema

    def open(self, state: StateContext) -> None:
        self.inner.open(state)

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        late = pc.and_(
            pc.equal(batch.column("_ckpt_channel"), 0),
            pc.greater_equal(batch.column("_ckpt_offset"), self.offset),
        )
        if pc.any(late).as_py():
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                raise RuntimeError("injected operator failure")
        return self.inner.process_batch(batch, state)


def _by_value() -> None:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ClosingCount(RunningCount):
    """A running count whose close() leaves a file in *closed* (one per call)."""

    def __init__(self, closed: str) -> None:
        super().__init__("counter", "user_id")
        self.closed = closed

    def close(self) -> None:
        Path(self.closed, f"{os.getpid()}-{uuid.uuid4().hex}").touch()


def closes(closed: Path, expected: int) -> list[Path]:
    """The close() calls recorded in *closed*, once there are *expected* (60 s at most: a
    host checks every 5 s whether its run is over)."""
    deadline = time.monotonic() + 60
    while len(list(closed.iterdir())) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return sorted(closed.iterdir())


def pipeline(spark: SparkSession, root: Path, **config: object) -> Pipeline:
    cfg = CheckpointConfig(interval_ms=300, **config)  # type: ignore[arg-type]
    return Pipeline(spark, "executors", config=cfg, root=str(root))


def source(**options: object) -> dict[str, object]:
    return {
        "source": "generator",
        "channels": len(BACKLOG),
        "rate": 0,
        "backlog": ",".join(map(str, BACKLOG)),
        "keys": KEYS,
        "seed": SEED,
        **options,
    }


def check_exactly_once(p: Pipeline, output: Path) -> None:
    """The output and the final checkpoint's state are the fold over the input up to the
    final checkpoint's positions, through two readers, every commit under one app id."""
    latest = p.store.latest_completed()
    assert latest is not None
    ends = [latest.offsets()[("source", c)] for c in range(len(BACKLOG))]
    assert ends == list(BACKLOG)
    spec = GeneratorSpec(SEED, len(BACKLOG), 0.0, BACKLOG, KEYS)
    folded = generated_keys(spec, ends)
    assert output_rows(read_delta(output)) == running_count_rows(folded)
    assert pl.read_delta(str(output)).height == sum(folded.values())
    assert {app for app, _ in delta_txn_versions(output)} == {"spark-ckpt/executors"}
    [backend] = restore_backends(
        "counter",
        pa.int64(),
        1,
        latest.operator_blobs("counter"),
        p.store.read_blob,
        max_parallelism=p.config.max_parallelism,
    )
    counts = backend.to_table("count")
    assert dict(zip(counts.column(1).to_pylist(), counts.column(2).to_pylist(), strict=True)) == (
        dict(folded)
    )


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"unaligned": True},
        {"unaligned": True, "aligned_checkpoint_timeout_ms": 1},
        {"mode": CheckpointingMode.AT_LEAST_ONCE},
        {"state_backend": "rocksdb"},
    ],
    ids=["aligned", "unaligned", "aligned-timeout", "at-least-once", "rocksdb"],
)
def test_subtasks_on_executors_are_exactly_once(
    spark: SparkSession, tmp_path: Path, config: dict[str, object]
) -> None:
    p = pipeline(spark, tmp_path / "root", **config)
    completed: list[CompletedCheckpoint] = []
    result = p.run(
        source(maxRowsPerTrigger=300, barrierPlacement="head"),
        RunningCount("counter", "user_id"),
        output=str(tmp_path / "out"),
        available_now=True,
        placement="executors",
        on_checkpoint=completed.append,
    )
    assert result.restarts == 0 and result.checkpoints_completed >= 2, result
    check_exactly_once(p, tmp_path / "out")
    # the statistics say where each subtask found its state: restored from the run's (empty)
    # restore point in its first micro-batch, then always in its host, whichever of the
    # executor's two Python workers ran the micro-batch's task
    assert result.last_checkpoint is not None and completed[-1] == result.last_checkpoint
    history = [r.stats for r in p.client.history() if r.stats is not None]
    assert len(history) == result.checkpoints_completed  # every one counted, even subsumed
    caches = [s.task_cache for s in history]
    assert all(set(cache) == {"chain#0", "chain#1"} for cache in caches), caches
    for t in ("chain#0", "chain#1"):
        hits = sum(cache[t].hits for cache in caches)
        rebuilds = sum(cache[t].rebuilds for cache in caches)
        assert rebuilds == 1 and hits >= 1, caches
    # each subtask reports its state backend and what it holds
    backend = str(config.get("state_backend", "hashmap"))
    storage = history[-1].task_storage
    assert {m.backend for m in storage.values()} == {backend}, storage
    spec = GeneratorSpec(SEED, len(BACKLOG), 0.0, BACKLOG, KEYS)
    assert sum(m.entries for m in storage.values()) == len(generated_keys(spec, list(BACKLOG)))


def _host_locks(root: str, run_id: str) -> list[Path]:
    """The lock files of the subtask hosts of *run_id* on the executor that wrote the
    newest changelog segment (a host holds its lock file while it lives)."""
    meta = newest_segment_meta(root)
    assert meta is not None, "no changelog segment yet"
    executor = meta["changelog"]["executor"]
    return [
        host_address(CacheKey(root, run_id, subtask), executor).with_suffix(".lock")
        for subtask in (0, 1)
    ]


def test_the_subtask_hosts_of_a_run_end_with_it(spark: SparkSession, tmp_path: Path) -> None:
    """While a run goes on its subtasks live in their hosts; once the run is over (its driver
    recorded it) its hosts end, long before their idle time."""
    p = pipeline(spark, tmp_path / "root")
    alive: list[bool] = []
    locks: list[Path] = []

    def run_id() -> str:
        [only] = Runs(p.root).ids()
        return only

    def check(c: CompletedCheckpoint) -> None:
        locks[:] = _host_locks(p.root, run_id())  # the run's changelog goes with it
        alive.append(all(lock.exists() for lock in locks))

    _by_value()
    closed = tmp_path / "closed"
    closed.mkdir()
    result = p.run(
        source(maxRowsPerTrigger=300),
        ClosingCount(str(closed)),
        output=str(tmp_path / "out"),
        available_now=True,
        placement="executors",
        on_checkpoint=check,
    )
    assert result.checkpoints_completed >= 2 and alive and all(alive), alive
    deadline = time.monotonic() + 60  # the idle time is 120 s; a host checks every 5 s
    while any(lock.exists() for lock in locks):
        assert time.monotonic() < deadline, "the hosts of an ended run are still alive"
        time.sleep(0.2)
    check_exactly_once(p, tmp_path / "out")
    # each subtask's operator was closed once, in its host, as the host ended
    done = closes(closed, 2)
    assert len(done) == 2 and len({f.name.split("-")[0] for f in done}) == 2, done


def test_operators_are_closed_when_a_driver_run_ends(spark: SparkSession, tmp_path: Path) -> None:
    _by_value()
    closed = tmp_path / "closed"
    closed.mkdir()
    p = pipeline(spark, tmp_path / "root")
    result = p.run(
        source(maxRowsPerTrigger=300),
        ClosingCount(str(closed)),
        output=str(tmp_path / "out"),
        available_now=True,
        placement="driver",
    )
    assert result.checkpoints_completed >= 1
    assert len(closes(closed, 2)) == 2  # one task per subtask, closed once each
    check_exactly_once(p, tmp_path / "out")


def test_a_failure_after_rows_past_the_checkpoint_restarts_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The operator fails on an executor once channel 0 reached row 900 (checkpoints have
    completed; rows after the last one were processed and staged): the run restarts from the
    latest completed checkpoint and the output stays exactly-once."""
    _by_value()
    marker = tmp_path / "failed-once"
    p = pipeline(
        spark,
        tmp_path / "root",
        restart_strategy=RestartStrategies.fixed_delay_restart(2, 100),
    )
    result = p.run(
        source(maxRowsPerTrigger=300),
        FailOnce(RunningCount("counter", "user_id"), str(marker), 900),
        output=str(tmp_path / "out"),
        available_now=True,
        placement="executors",
    )
    assert marker.exists()
    assert result.restarts == 1, result
    assert result.restored_from[1] is not None, result  # it restored a completed checkpoint
    assert "injected operator failure" in result.failures[0]
    check_exactly_once(p, tmp_path / "out")


@pytest.mark.parametrize(
    ("before", "after"),
    # the other direction, with executor JVM kills: test_executor_faults.py
    [("hashmap", "rocksdb")],
    ids=["hashmap-to-rocksdb"],
)
def test_a_savepoint_restores_on_executors_at_another_parallelism(
    spark: SparkSession, tmp_path: Path, before: str, after: str
) -> None:
    """Run on 2 subtasks until the source's rows are half read, stop with a savepoint; a new
    pipeline restores it on 3 subtasks and finishes: the output is the fold. A savepoint's
    format does not depend on the state backend: it restores on the other one too."""
    p = pipeline(spark, tmp_path / "root", state_backend=before)
    run = p.start(
        source(maxRowsPerTrigger=30),
        RunningCount("counter", "user_id"),
        output=str(tmp_path / "out"),
        parallelism=2,
        placement="executors",
    )
    try:
        deadline = time.monotonic() + 240
        while (latest := p.client.latest()) is None or latest.checkpoint_id < 3:
            assert run.query.isActive and time.monotonic() < deadline
            time.sleep(0.2)
        savepoint = run.stop(savepoint=True)
    finally:
        run.query.stop()
        run.retire()
    assert savepoint is not None and savepoint.is_savepoint
    assert savepoint.offsets()[("source", 0)] < BACKLOG[0]  # stopped mid-input
    target = p.client.savepoint_path(savepoint)
    again = pipeline(spark, tmp_path / "root2", state_backend=after)
    again.run(
        source(maxRowsPerTrigger=600),
        RunningCount("counter", "user_id"),
        output=str(tmp_path / "out"),
        parallelism=3,
        available_now=True,
        placement="executors",
        restore=RestoreSettings.savepoint(target),
    )
    check_exactly_once(again, tmp_path / "out")


@pytest.mark.compat
def test_exactly_once_under_repeated_sigkill_on_executors_under_connect(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    """SIGKILLs of the whole job under Spark Connect (client, local Connect server, JVM,
    source runner, executors' Python workers) at random moments with a lagging channel and
    subtasks on the executors, then a final ``--available-now`` run: every
    ``(user_id, count)`` row exactly once. (Classic Spark: ``test_crash.py``, whose jobs'
    subtasks are on the executors too.)"""
    args = replace(_args(tmp_path, "aligned"), placement="executors", remote="local[2]")
    story = _kill_repeatedly(demo, args, 2, seed=41)
    final = _finish(demo, args)
    positions = _final_positions(final, LAGGING_BACKLOG)
    expected = running_count_rows(generated_keys(args.spec(), positions))
    actual = output_rows(read_delta(args.output))
    assert actual == expected, f"{_diff(actual, expected)}\n" + "\n".join(story)

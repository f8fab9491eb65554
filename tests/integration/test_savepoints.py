"""Savepoints and restores on a real local Spark and real Delta tables.

Input is the deterministic generator with a finite backlog (``rate 0``): the oracles are
plain folds over ``GeneratorSpec(...).rows(...)`` and outputs are read with polars. Covered:
a self-contained savepoint (stop with savepoint, the root deleted, restored into a new root
at another parallelism, the savepoint unchanged), restore from a checkpoint by id and as of
a time (output rolled back to it, then exactly-once), uid matching with and without
allow-non-restored-state, refused restores (channel count, max parallelism, another
pipeline's savepoint, missing sources), listing and disposing savepoints.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow.compute as pc
import pytest

from spark_ckpt import (
    CheckpointConfig,
    Pipeline,
    RunningCount,
    RunResult,
    SavepointWriter,
    StateReader,
)
from spark_ckpt.delta.savepoint import dispose_savepoint, list_savepoints, open_savepoint
from spark_ckpt.errors import RestoreError
from spark_ckpt.runtime.restore_settings import RESTORED_FROM, RestoreSettings
from spark_ckpt.sources.generator import GeneratorSpec
from spark_ckpt.testing.jobs import DemoArgs, DemoLauncher

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

RUN_TIMEOUT_S = 240
SEED, KEYS = 7, 25


def key_counts(spec: GeneratorSpec, starts: Sequence[int], ends: Sequence[int]) -> Counter[int]:
    counts: Counter[int] = Counter()
    for channel, (start, end) in enumerate(zip(starts, ends, strict=True)):
        counts.update(spec.rows(channel, start, end).column("user_id").to_pylist())
    return counts


def running_counts(counts: Counter[int]) -> Counter[tuple[int, int]]:
    return Counter((k, i) for k, n in counts.items() for i in range(1, n + 1))


def output(path: Path) -> Counter[tuple[int, int]]:
    return Counter(pl.read_delta(str(path)).select("user_id", "count").iter_rows())


def source(backlog: int, channels: int = 2) -> dict[str, object]:
    return {
        "source": "generator",
        "seed": SEED,
        "channels": channels,
        "rate": 0,
        "backlog": backlog,
        "keys": KEYS,
    }


def spec(backlog: int, channels: int = 2) -> GeneratorSpec:
    return GeneratorSpec(SEED, channels, 0.0, backlog, KEYS)


def pipeline(spark: SparkSession, root: Path, name: str = "counts", **options: str) -> Pipeline:
    cfg = CheckpointConfig.from_options({"checkpoint.interval": "300ms", **options})
    return Pipeline(spark, name, config=cfg, root=str(root))


def bounded_run(
    p: Pipeline,
    backlog: int,
    out: Path,
    *,
    uid: str = "counter",
    parallelism: int = 2,
    restore: RestoreSettings | None = None,
) -> RunResult:
    result = p.run(
        source(backlog),
        RunningCount(uid, "user_id"),
        output=str(out),
        parallelism=parallelism,
        available_now=True,
        restore=restore,
    )
    assert result.restarts == 0 and not result.failures, result
    return result


def tree_digest(path: Path) -> dict[str, str]:
    return {
        str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.rglob("*"))
        if f.is_file()
    }


@pytest.fixture(scope="module")
def savepoint_dir(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pipeline that ran over 120 rows per channel, then was stopped with a savepoint into
    a directory outside its root; the root is deleted afterwards. Returns the savepoint."""
    base = tmp_path_factory.mktemp("savepointed")
    target = base / "savepoints"
    p = pipeline(
        spark, base / "root", **{"checkpoint.retained": "1", "savepoint.dir": str(base / "sp")}
    )
    bounded_run(p, 120, base / "out")
    run = p.start(
        source(120), RunningCount("counter", "user_id"), output=str(base / "out"), trigger_s=0.3
    )
    try:
        p.client.checkpoint(timeout_s=RUN_TIMEOUT_S)
        sp = p.client.savepoint(str(target), timeout_s=RUN_TIMEOUT_S)
        for _ in range(2):  # retention (1 retained) moves on past the savepoint
            p.client.checkpoint(timeout_s=RUN_TIMEOUT_S)
        final = run.stop(savepoint=True, timeout_s=RUN_TIMEOUT_S)
    finally:
        if run.query.isActive:
            run.query.stop()
    assert final is not None and final.is_savepoint
    found = list_savepoints(str(target))
    assert [s.checkpoint.checkpoint_id for s in found] == [sp.checkpoint_id]
    assert all(s.pipeline == "counts" for s in found)
    # the stop's savepoint went to savepoint.dir (no target named)
    assert [s.checkpoint.checkpoint_id for s in list_savepoints(str(base / "sp"))] == [
        final.checkpoint_id
    ]
    shutil.rmtree(base / "root")  # nothing of the savepoint lives there
    return Path(list_savepoints(str(base / "sp"))[0].path)


def test_a_savepoint_restores_after_its_root_is_gone_at_another_parallelism(
    spark: SparkSession, savepoint_dir: Path, tmp_path: Path
) -> None:
    _, sp = open_savepoint(str(savepoint_dir))
    assert [o.offset for o in sp.checkpoint.source_offsets()] == [120, 120]
    before = tree_digest(savepoint_dir)
    out = savepoint_dir.parent.parent / "out"  # the original output table
    expected_before = running_counts(key_counts(spec(120), [0, 0], [120, 120]))
    assert output(out) == expected_before
    p = pipeline(spark, tmp_path / "new-root")
    result = bounded_run(
        p, 300, out, parallelism=3, restore=RestoreSettings.savepoint(str(savepoint_dir))
    )
    assert output(out) == running_counts(key_counts(spec(300), [0, 0], [300, 300]))
    assert tree_digest(savepoint_dir) == before  # NO_CLAIM: never modified
    first = result.restored_from[0]
    assert first is not None and first > sp.checkpoint.checkpoint_id


def test_state_no_operator_claims_is_refused_unless_allowed(
    spark: SparkSession, savepoint_dir: Path, tmp_path: Path
) -> None:
    p = pipeline(spark, tmp_path / "root")
    with pytest.raises(RestoreError, match=r"'counter'.*allow_non_restored_state"):
        bounded_run(
            p,
            200,
            tmp_path / "out",
            uid="renamed",
            restore=RestoreSettings.savepoint(str(savepoint_dir)),
        )
    assert not (tmp_path / "out").exists()  # refused before anything ran
    bounded_run(
        p,
        200,
        tmp_path / "out",
        uid="renamed",
        restore=RestoreSettings.savepoint(str(savepoint_dir), allow_non_restored_state=True),
    )
    # the new operator started empty; the sources resumed at the savepoint's positions
    assert output(tmp_path / "out") == running_counts(key_counts(spec(200), [120, 120], [200, 200]))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("channels", "had 2 channels"),
        ("max_parallelism", "max parallelism 128"),
        ("pipeline", "belongs to pipeline 'counts'"),
        ("missing", "does not exist"),
    ],
)
def test_a_restore_that_does_not_fit_is_refused_with_a_clear_error(
    spark: SparkSession, savepoint_dir: Path, tmp_path: Path, change: str, message: str
) -> None:
    name = "other" if change == "pipeline" else "counts"
    options = {"state.max-parallelism": "64"} if change == "max_parallelism" else {}
    p = pipeline(spark, tmp_path / "root", name, **options)
    path = str(tmp_path / "nowhere") if change == "missing" else str(savepoint_dir)
    with pytest.raises(RestoreError, match=message):
        p.run(
            source(200, channels=3 if change == "channels" else 2),
            RunningCount("counter", "user_id"),
            output=str(tmp_path / "out"),
            available_now=True,
            restore=RestoreSettings.savepoint(path),
        )
    assert not (tmp_path / "out").exists()
    if change == "pipeline":  # forced, it is adopted
        bounded_run_forced = p.run(
            source(200),
            RunningCount("counter", "user_id"),
            output=str(tmp_path / "out"),
            available_now=True,
            restore=RestoreSettings.savepoint(path, force=True),
        )
        assert not bounded_run_forced.failures


def test_restore_an_older_checkpoint_by_id_and_as_of_a_time(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Three bounded runs (100, 200, 300 rows per channel); restoring the first run's final
    checkpoint rolls the output back to it, then the job goes on exactly-once."""
    p = pipeline(spark, tmp_path / "root", **{"checkpoint.retained": "100"})
    out = tmp_path / "out"
    bounded_run(p, 100, out)
    first = p.client.latest()
    assert first is not None
    time.sleep(1.1)  # Delta commit timestamps have millisecond resolution; keep T apart
    between = datetime.now(UTC)
    time.sleep(1.1)
    bounded_run(p, 200, out)
    bounded_run(p, 300, out)
    assert output(out) == running_counts(key_counts(spec(300), [0, 0], [300, 300]))

    bounded_run(p, 300, out, restore=RestoreSettings.as_of(between))
    assert output(out) == running_counts(key_counts(spec(300), [0, 0], [300, 300]))
    restored = [c for c in p.client.checkpoints() if RESTORED_FROM in c.properties]
    assert restored and restored[-1].offsets() == first.offsets()

    bounded_run(p, 300, out, restore=RestoreSettings.checkpoint(first.checkpoint_id))
    assert output(out) == running_counts(key_counts(spec(300), [0, 0], [300, 300]))
    # the same checkpoint of this root, restored into another root by its path and id
    other = pipeline(spark, tmp_path / "other-root")
    bounded_run(
        other, 300, out, restore=RestoreSettings.checkpoint(first.checkpoint_id, str(p.root))
    )
    assert output(out) == running_counts(key_counts(spec(300), [0, 0], [300, 300]))
    with pytest.raises(RestoreError, match="no checkpoint"):
        bounded_run(p, 300, out, restore=RestoreSettings.as_of(datetime(2000, 1, 1, tzinfo=UTC)))
    with pytest.raises(RestoreError, match="not retained"):
        bounded_run(p, 300, out, restore=RestoreSettings.checkpoint(999_999))


def test_dispose_deletes_a_savepoint_and_refuses_anything_else(tmp_path: Path) -> None:
    (tmp_path / "not-a-savepoint").mkdir()
    with pytest.raises(RestoreError, match="not a savepoint"):
        dispose_savepoint(str(tmp_path / "not-a-savepoint"))
    assert (tmp_path / "not-a-savepoint").exists()


# -- stop with a savepoint, with and without drain (the demo job in a subprocess) -------------


#: rows per channel: 40 micro-batches of 50 (a stop without drain comes after the first few)
BACKLOG = 2000


@pytest.mark.slow
@pytest.mark.parametrize("drain", [False, True], ids=["no-drain", "drain"])
def test_stop_with_savepoint_with_and_without_drain(tmp_path: Path, drain: bool) -> None:
    """``spark-ckpt savepoint stop [--drain]`` on a job reading a 2000-row backlog per channel
    100 rows per micro-batch: with drain the final savepoint is at the end of the input,
    without it wherever the stop found the channels. Either way the output is exactly the
    running count over the input before the savepoint's positions, and the savepoint is in
    the configured ``savepoint.dir``."""
    launcher = DemoLauncher(tmp_path)
    args = DemoArgs(
        root=tmp_path / "root",
        output=tmp_path / "out",
        pipeline="drain",
        backlog=str(BACKLOG),
        channels=2,
        keys=20,
        interval="500ms",
        max_rows_per_trigger=100,
        savepoint_dir=tmp_path / "savepoints",
    )
    run = launcher.start(args)
    try:
        launcher.wait_until(
            run, lambda: "checkpoint " in run.tail(5), RUN_TIMEOUT_S, "a first checkpoint"
        )
        done = cli(
            "savepoint",
            "stop",
            "--root",
            str(args.root),
            "--timeout",
            "240",
            "--json",
            *(["--drain"] if drain else []),
        )
        assert done.returncode == 0, done.stderr + run.tail()
        assert run.wait(120) == 0, run.tail()
    finally:
        assert launcher.cleanup() == []
    [answer] = [json.loads(line) for line in done.stdout.splitlines()]
    ends = [answer["offsets"][f"source/{c}"] for c in range(2)]
    if drain:
        assert ends == [BACKLOG, BACKLOG], ends
    else:
        assert all(e < BACKLOG for e in ends), ends
    assert answer["type"] == "savepoint"
    assert Path(answer["path"]).parent == tmp_path / "savepoints"
    _, sp = open_savepoint(answer["path"])
    assert [o.offset for o in sp.checkpoint.source_offsets()] == ends
    expected = running_counts(key_counts(args.spec(), [0, 0], ends))
    assert output(tmp_path / "out") == expected
    if not drain:
        return
    # the demo's --restore-savepoint: a new root, more input, the same output table
    more = replace(
        args, root=tmp_path / "root2", backlog="5000", available_now=True, max_rows_per_trigger=None
    )
    restored_run = launcher.start(replace(more, extra=("--restore-savepoint", answer["path"])))
    try:
        assert restored_run.wait(RUN_TIMEOUT_S) == 0, restored_run.tail()
    finally:
        assert launcher.cleanup() == []
    restored_from = re.search(r"restored from: (\d+)", restored_run.tail())
    assert restored_from and int(restored_from.group(1)) > answer["id"], restored_run.tail()
    assert output(tmp_path / "out") == running_counts(key_counts(more.spec(), [0, 0], [5000, 5000]))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "spark-ckpt"
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=600, check=False
    )


# -- offline state changes round-trip through a restore -------------------------------------


def continued_counts(
    counts_before: Counter[int], rows_after: Counter[int], offset: int = 0
) -> Counter[tuple[int, int]]:
    """Output of a running count that starts from *counts_before* (+ *offset*) per key and
    then sees *rows_after*: ``(key, before + i)`` for ``i`` in ``1..after``."""
    return Counter(
        (k, counts_before.get(k, 0) + offset + i)
        for k, n in rows_after.items()
        for i in range(1, n + 1)
    )


@pytest.mark.parametrize("change", ["rename", "edit", "max-parallelism", "drop", "bootstrap"])
def test_an_offline_state_change_round_trips_through_a_restore(
    spark: SparkSession, savepoint_dir: Path, tmp_path: Path, change: str
) -> None:
    """Read the savepoint's state, change it offline into a new savepoint, restore a pipeline
    from that and run it over more input: the output continues from the changed state."""
    before = key_counts(spec(120), [0, 0], [120, 120])
    after = key_counts(spec(300), [120, 120], [300, 300])
    reader = StateReader.open(str(savepoint_dir))
    state = reader.keyed("counter", "count")
    assert dict(zip(state["key"].to_pylist(), state["value"].to_pylist(), strict=True)) == before
    uid, options, offset, counts_before = "counter", {}, 0, before
    writer = SavepointWriter.from_existing(str(savepoint_dir))
    if change == "rename":
        uid = "counter_v2"
        writer = writer.rename_operator("counter", uid)
    elif change == "edit":
        writer = writer.map_values(
            "counter", "count", lambda t: t.set_column(1, "value", pc.add(t["value"], 1000))
        )
        offset = 1000
    elif change == "max-parallelism":
        writer = writer.with_max_parallelism(64)
        options = {"state.max-parallelism": "64"}
    elif change == "drop":
        writer = writer.remove_operator("counter")
        counts_before = Counter()
    else:  # a new pipeline's state, bootstrapped from a table: every key starts at 5
        writer = (
            SavepointWriter.new("counts", max_parallelism=128, parallelism=2)
            .with_keyed_state("counter", "count", {"key": list(range(KEYS)), "value": [5] * KEYS})
            .with_source_offsets({("source", 0): 120, ("source", 1): 120})
        )
        counts_before = Counter(dict.fromkeys(range(KEYS), 5))
    changed = tmp_path / "changed"
    writer.write(str(changed))
    p = pipeline(spark, tmp_path / "root", **options)
    bounded_run(p, 300, tmp_path / "out", uid=uid, restore=RestoreSettings.savepoint(str(changed)))
    expected = continued_counts(counts_before, after, offset)
    assert output(tmp_path / "out") == expected
    final = StateReader.open(str(tmp_path / "root"))
    restored = final.keyed(uid, "count")
    got = dict(zip(restored["key"].to_pylist(), restored["value"].to_pylist(), strict=True))
    totals = Counter(counts_before)
    for k in totals:
        totals[k] += offset
    totals.update(after)
    assert got == dict(totals)

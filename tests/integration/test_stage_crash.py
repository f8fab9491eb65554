"""Crash tests of a job of two keyed stages: ``spark-ckpt demo --job stages`` (per-user running
totals, then, re-keyed by country, per-country running counts), with both stages' state on
the executors, under repeated SIGKILL of the driver and of executor JVMs (``local-cluster``),
and under Spark Connect.

The oracle is a plain fold over the generator's rows (``GeneratorSpec.rows``) up to the final
checkpoint's positions: per country, the running counts 1..n of its rows, each exactly once.
The final run restores each stage at another parallelism than the killed runs had."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import DemoLauncher, read_delta
from test_crash import _args, _completes_after, _finish, _kill_repeatedly, _latest_id
from test_executor_faults import (
    _kill,
    _wait,
    block_managers,
    cluster_args,
    executor_jvms,
    finish_locally,
    newest_segment_executor,
)

from spark_ckpt.demo import COUNTRIES
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.testing.jobs import DemoArgs

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def stage_args(args: DemoArgs) -> DemoArgs:
    return replace(args, job="stages", keys=30, stage_parallelism=3)


def expected_counts(args: DemoArgs, final: CompletedCheckpoint) -> Counter[tuple[int, int]]:
    """Per country, its running counts over the generator's rows before the final positions."""
    offsets = final.offsets()
    spec = args.spec()
    rows: Counter[int] = Counter()
    for c in range(args.channels):
        users = spec.rows(c, 0, offsets[("source", c)]).column("user_id").to_pylist()
        rows.update(u % COUNTRIES for u in users)
    return Counter((country, k) for country, n in rows.items() for k in range(1, n + 1))


def _check(args: DemoArgs, final: CompletedCheckpoint, story: str) -> None:
    expected = expected_counts(args, final)
    out = read_delta(Path(args.output))
    actual = Counter(zip(out["country"].to_pylist(), out["count"].to_pylist(), strict=True))
    missing, extra = expected - actual, actual - expected
    assert sum(expected.values()) > 0
    assert not missing and not extra, (
        f"{sum(actual.values())} rows, expected {sum(expected.values())}; missing "
        f"{sum(missing.values())} {list(missing)[:5]}, extra {sum(extra.values())} "
        f"{list(extra)[:5]}\n{story}"
    )
    vertices = Counter(t.task.vertex for t in final.tasks)
    assert set(vertices) == {"chain", "stage:countries"}, vertices


def test_two_stages_are_exactly_once_under_driver_sigkill(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    """Two SIGKILLs of the whole job at random moments, then a final run with the first stage
    on 3 subtasks and the second on 2 (the killed runs had 2 and 3)."""
    args = stage_args(_args(tmp_path, "aligned"))
    story = "\n".join(_kill_repeatedly(demo, args, 2, seed=57))
    final = _finish(demo, replace(args, parallelism=3, stage_parallelism=2))
    _check(args, final, story)
    assert Counter(t.task.vertex for t in final.tasks) == {"chain": 3, "stage:countries": 2}


def test_two_stages_are_exactly_once_when_executor_jvms_are_killed(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    """On ``local-cluster[2,1,1024]``: twice, SIGKILL the executor JVM where a subtask ran
    last and wait for a checkpoint after it; then a final run."""
    args = stage_args(cluster_args(tmp_path))
    run = demo.start(args)
    _wait(demo, run, "a first checkpoint", _completes_after(args.root, 0))
    for _ in range(2):
        deadline = time.monotonic() + 240
        victims: list[int] = []
        while not victims:
            assert time.monotonic() < deadline and run.alive(), f"no victim\n{run.tail()}"
            ran = newest_segment_executor(args.root)
            victims = [p for p in executor_jvms(run) if ran in block_managers(p)]
            time.sleep(0.2)
        _kill(victims)
        latest = _latest_id(args.root)
        _wait(demo, run, "a checkpoint after a kill", _completes_after(args.root, latest + 1))
    run.kill()
    final = finish_locally(demo, args)
    _check(args, final, run.tail())


def test_two_stages_on_the_executors_under_spark_connect(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    """Under Spark Connect, the stages' subtasks on the executors (in the driver, the stages
    run in the same aligner as under classic Spark: test_stages.py)."""
    args = replace(stage_args(_args(tmp_path, "aligned")), remote="local[2]")
    final = _finish(demo, args)
    _check(args, final, "")

"""Crash tests of a pipeline with two inputs: the interval join of ``spark-ckpt demo --job
join`` (two generated inputs, clicks and impressions, joined by user within
``--join-interval`` on ``event_ts``), with its state on the executors, under repeated SIGKILL
of the driver, of executor JVMs (``local-cluster``), and under Spark Connect with the subtasks
in the driver.

The oracle is pandas over the generator's rows (``GeneratorSpec.rows``) up to the final
checkpoint's positions of each input's channels: each channel's event times only grow, so no
row is late, and the output is pandas' join on the user with the time condition, each pair
exactly once. After the final run no buffered row is left in the state (read offline with
``StateReader``) whose last possible match the final watermark has passed.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pyarrow.compute as pc
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

from spark_ckpt import StateReader
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.sources.generator import GeneratorSpec
from spark_ckpt.testing.jobs import DemoArgs

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REACH_MS, BOUND_MS = 300, 200
UID = "interval-join-clicks-impressions"
Row = tuple[int, int, int, int, int]


def join_args(args: DemoArgs) -> DemoArgs:
    return replace(
        args,
        job="join",
        join_interval=f"{REACH_MS}ms",
        out_of_orderness=f"{BOUND_MS}ms",
        keys=20,
        max_rows_per_trigger=None,
        barrier_placement="read",
    )


def _inputs(args: DemoArgs, final: CompletedCheckpoint) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each input's rows up to the final checkpoint's positions (clicks: channels 0..n-1,
    impressions: n..2n-1), from the generator's spec, not from the job."""
    offsets = final.offsets()
    n = args.channels
    frames = []
    for i, seed in enumerate((args.seed, args.seed + 1)):
        spec = replace(args, seed=seed).spec()
        parts = [spec.rows(c, 0, offsets[("source", i * n + c)]) for c in range(n)]
        frames.append(pd.concat([p.to_pandas() for p in parts], ignore_index=True))
    return frames[0], frames[1]


def expected_pairs(args: DemoArgs, final: CompletedCheckpoint) -> Counter[Row]:
    clicks, shown = _inputs(args, final)
    pairs = clicks.merge(shown, on="user_id", suffixes=("", "_i"))
    reach = pd.Timedelta(milliseconds=REACH_MS)
    pairs = pairs[
        (pairs.event_ts_i >= pairs.event_ts - reach) & (pairs.event_ts_i <= pairs.event_ts + reach)
    ]
    return _rows(pairs.user_id, pairs.amount, pairs.event_ts, pairs.amount_i, pairs.event_ts_i)


def emitted_pairs(args: DemoArgs) -> Counter[Row]:
    out = read_delta(Path(args.output)).to_pandas()
    return _rows(
        out.user_id, out.amount, out.event_ts, out.impressions_amount, out.impressions_event_ts
    )


def _rows(*columns: pd.Series) -> Counter[Row]:
    values = [
        c.astype("int64") // 1000 if str(c.dtype).startswith("datetime") else c.astype("int64")
        for c in columns
    ]
    return Counter(zip(*(v.tolist() for v in values), strict=True))


def check_state_is_bounded(args: DemoArgs, final: CompletedCheckpoint) -> None:
    """No buffered row whose cleanup time (event time + reach) the final watermark passed:
    the watermark is the lowest over the channels of their last event time, less the bound
    and 1 ms."""
    n = args.channels
    tops = []
    for seed in (args.seed, args.seed + 1):
        spec = replace(args, seed=seed).spec()
        offsets = final.offsets()
        base = 0 if seed == args.seed else n
        for c in range(n):
            end = offsets[("source", base + c)]
            if end:
                tops.append(spec.rows(c, end - 1, end).column("event_ts")[0].value // 1000)
    watermark_ms = min(tops) - BOUND_MS - 1
    reader = StateReader.open(str(args.root))
    for side in ("left", "right"):
        values = reader.keyed(UID, side).column("value")
        flat = pc.list_flatten(values.combine_chunks())
        times = flat.field("_time_us").to_numpy(zero_copy_only=False)
        assert len(times) > 0  # rows within reach of the watermark still wait
        # the timers are in ms and the watermark they fire at is whole ms: a row stays until
        # its cleanup time (event time + reach, in µs) is at or below the watermark's ms
        cleanup_us = times + REACH_MS * 1000
        assert (cleanup_us > watermark_ms * 1000).all(), (side, watermark_ms, times.min())


def _check(args: DemoArgs, final: CompletedCheckpoint, story: str) -> None:
    expected = expected_pairs(args, final)
    actual = emitted_pairs(args)
    assert sum(expected.values()) > 0
    missing, extra = expected - actual, actual - expected
    assert not missing and not extra, (
        f"{sum(actual.values())} pairs, expected {sum(expected.values())}; missing "
        f"{sum(missing.values())} {list(missing)[:5]}, extra {sum(extra.values())} "
        f"{list(extra)[:5]}\n{story}"
    )
    check_state_is_bounded(args, final)


def test_an_interval_join_is_exactly_once_under_driver_sigkill(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    """Two SIGKILLs of the whole job at random moments (one after a completed checkpoint, one
    anywhere from the start), then a final run restoring at parallelism 3 (the killed runs
    had 2): every pair exactly once, the state bounded."""
    args = join_args(_args(tmp_path, "aligned"))
    story = "\n".join(_kill_repeatedly(demo, args, 2, seed=51))
    final = _finish(demo, replace(args, parallelism=3))
    _check(args, final, story)


def test_an_interval_join_is_exactly_once_when_executor_jvms_are_killed(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    """On ``local-cluster[2,1,1024]``: twice, SIGKILL the executor JVM where the subtasks ran
    last and wait for a checkpoint after it; then a final run. Every pair exactly once."""
    args = join_args(cluster_args(tmp_path))
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


def test_an_interval_join_in_the_driver_under_spark_connect(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    """Under Spark Connect, the subtasks in the server's foreachBatch process: one run of
    the input available (SIGKILLs under Connect: test_time_crash.py). Every pair exactly
    once."""
    args = replace(join_args(_args(tmp_path, "aligned")), remote="local[2]", placement="driver")
    final = _finish(demo, args)
    _check(args, final, "")


def test_generator_event_times_only_grow() -> None:
    """The oracle's premise: each channel's event times only grow, so no row is late."""
    spec = GeneratorSpec.from_options({"channels": "2", "rate": "30", "backlog": "100"})
    for c in range(2):
        ts = spec.rows(c, 0, 300).column("event_ts").to_numpy()
        assert (ts[1:] >= ts[:-1]).all()

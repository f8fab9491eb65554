"""Crash tests of time: event-time windows and processing-time timers under repeated SIGKILL
of the driver (the job, its JVM and Spark's Python workers at once) and of executor JVMs on
a multi-process cluster (``local-cluster``), as :mod:`test_crash` and
:mod:`test_executor_faults` do for the running count.

The job is ``python -m spark_ckpt.demo`` (through its fault-injecting wrapper) with
``--window`` (per user, count and sum of amount in 2 s event-time tumbling windows on the
generator's ``event_ts``, 1 s out of order) or ``--follow-up`` (a processing-time timer per
user, 300 ms after the micro-batch it first appears in). Oracles, independent of the code:

* windows — each channel's event times only grow, so no row is late: the output is pandas'
  per-(user, window) count and sum of the generator's rows up to the final checkpoint's
  positions, for every window the final watermark (the lowest channel's last event time
  less the bound) passed — each exactly once;
* follow-ups — every user of those rows fired once, or still has its timer pending in the
  final checkpoint (listed offline), never both.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from conftest import DemoLauncher, generated_keys, read_delta
from test_crash import (
    LAGGING_BACKLOG,
    _args,
    _completes_after,
    _final_positions,
    _finish,
    _kill_repeatedly,
    _latest_id,
)
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
from spark_ckpt.testing.jobs import DemoArgs

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DEMO_UID = "counter"  # the demo's default --uid
WINDOW_MS, BOUND_MS = 2000, 1000


def windows_expected(
    args: DemoArgs, final: CompletedCheckpoint
) -> Counter[tuple[int, int, int, int]]:
    """(user, window start, count, sum of amount) of every window the final watermark passed."""
    positions = _final_positions(final, LAGGING_BACKLOG)
    spec = args.spec()
    frames, tops = [], []
    for channel, end in enumerate(positions):
        rows = spec.rows(channel, 0, end)
        ms = [t // 1000 for t in rows.column("event_ts").cast("int64").to_pylist()]
        frames.append(
            pd.DataFrame(
                {
                    "user": rows.column("user_id").to_pylist(),
                    "amount": rows.column("amount").to_pylist(),
                    "ms": ms,
                }
            )
        )
        tops.append(max(ms))
    frame = pd.concat(frames)
    frame["start"] = frame.ms - frame.ms % WINDOW_MS
    mark = min(tops) - BOUND_MS - 1  # the watermark: max - bound - 1 ms, in whole ms
    grouped = frame.groupby(["user", "start"]).amount.agg(["count", "sum"])
    return Counter(
        (int(user), int(start), int(r["count"]), int(r["sum"]))
        for (user, start), r in grouped.iterrows()
        if start + WINDOW_MS - 1 <= mark
    )


def windows_emitted(args: DemoArgs) -> Counter[tuple[int, int, int, int]]:
    table = read_delta(args.output)
    starts = table.column("window_start").cast("int64").to_pylist()  # µs or ms, by the writer
    unit = 1000 if table.schema.field("window_start").type.unit == "us" else 1
    return Counter(
        zip(
            table.column("user_id").to_pylist(),
            [s // unit for s in starts],
            table.column("count").to_pylist(),
            table.column("sum_amount").to_pylist(),
            strict=True,
        )
    )


def window_args(tmp_path: Path, **overrides: object) -> DemoArgs:
    return replace(
        _args(tmp_path, "aligned"),
        window=f"{WINDOW_MS}ms",
        out_of_orderness=f"{BOUND_MS}ms",
        **overrides,
    )  # type: ignore[arg-type]


def test_windows_are_exactly_once_under_repeated_sigkill_of_the_driver(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    args = window_args(tmp_path)
    story = _kill_repeatedly(demo, args, 2, seed=31)
    final = _finish(demo, args)
    expected = windows_expected(args, final)
    assert len(expected) > 50  # the test means something
    assert windows_emitted(args) == expected, "\n".join(story)


def test_follow_up_timers_fire_once_under_repeated_sigkill_of_the_driver(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    args = replace(_args(tmp_path, "aligned"), follow_up="300ms")
    story = _kill_repeatedly(demo, args, 2, seed=32)
    final = _finish(demo, args)
    check_follow_ups(args, final, "\n".join(story))


def check_follow_ups(args: DemoArgs, final: CompletedCheckpoint, story: str) -> None:
    """Every user fired once or is still pending in *final*, never both."""
    users = set(generated_keys(args.spec(), _final_positions(final, LAGGING_BACKLOG)))
    fired = Counter(read_delta(args.output).column("user_id").to_pylist())
    pending = StateReader.open(str(args.root), final.checkpoint_id).timers(DEMO_UID)
    waiting = Counter(pending.column("key").to_pylist())
    assert all(n == 1 for n in fired.values()), [u for u, n in fired.items() if n > 1]
    assert all(n == 1 for n in waiting.values())
    assert not set(fired) & set(waiting), story
    assert set(fired) | set(waiting) == users, story
    assert len(fired) > len(users) // 2  # most timers fired before the end


# windows only: follow-up timers under SIGKILL run in the driver-kill and Connect tests
# above and below, executor JVM kills in test_executor_faults.py
@pytest.mark.parametrize("job", ["window"])
def test_time_is_exactly_once_when_executor_jvms_are_killed(
    demo: DemoLauncher, tmp_path: Path, job: str
) -> None:
    """On ``local-cluster[2,1,1024]`` with the subtasks on the executors: twice, SIGKILL the
    executor JVM where the subtasks ran last, wait for a checkpoint after it; then a final
    run. The windows are exactly once; every follow-up timer fires once."""
    timed = (
        {"window": f"{WINDOW_MS}ms", "out_of_orderness": f"{BOUND_MS}ms"}
        if job == "window"
        else {"follow_up": "300ms"}
    )
    args = replace(cluster_args(tmp_path), **timed)  # type: ignore[arg-type]
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
    assert "SubtaskStateLostError" not in run.tail(400), run.tail(400)
    final = finish_locally(demo, args)
    if job == "window":
        assert windows_emitted(args) == windows_expected(args, final)
    else:
        check_follow_ups(args, final, run.tail())


@pytest.mark.parametrize(
    ("job", "placement"),
    [
        pytest.param("window", "driver", marks=pytest.mark.compat),  # Connect's foreachBatch
        ("follow-up", "executors"),
    ],
)
def test_time_is_exactly_once_under_sigkill_with_spark_connect(
    demo: DemoLauncher, tmp_path: Path, job: str, placement: str
) -> None:
    """The same jobs under Spark Connect (``--remote local[2]``: the foreachBatch function runs
    in a server-side Python process), killed twice, then a final run: the windows exactly
    once, every follow-up timer once."""
    timed = (
        {"window": f"{WINDOW_MS}ms", "out_of_orderness": f"{BOUND_MS}ms"}
        if job == "window"
        else {"follow_up": "300ms"}
    )
    args = replace(_args(tmp_path, "aligned"), remote="local[2]", placement=placement, **timed)  # type: ignore[arg-type]
    story = "\n".join(_kill_repeatedly(demo, args, 2, seed=41))
    final = _finish(demo, args)
    if job == "window":
        assert windows_emitted(args) == windows_expected(args, final), story
    else:
        check_follow_ups(args, final, story)

"""Crash tests of the main job: exactly-once output survives SIGKILL at random moments.

Each test runs ``python -m spark_ckpt.demo`` (generator → keyed RunningCount → Delta) in
subprocesses and kills them — the job, its JVM and Spark's Python workers, at once — at
random moments, restarts, and finally lets a run stop gracefully with a final checkpoint.
The output table is then compared with an oracle that does not involve the code under test:
a plain fold over the generator's rows (``GeneratorSpec.rows``) up to the final checkpoint's
source positions, read back through a Delta log replay of our own.

Why ``--rate > 0``: ``ckpt-source`` places a barrier at every channel's *head* (the last row
produced), so with a finite input (``--rate 0``) every barrier lies at the end of the input
and an aligned checkpoint completes only once all of it is consumed. Production at a modest rate
keeps the heads just ahead of the readers, so checkpoints complete every few micro-batches
and kills land before, between and after them. The input of a run is therefore not known up
front; the oracle uses the positions of the final checkpoint, which the comparison also
checks: output for a shorter or longer prefix than the recorded positions would not match.

Lagging channel: with ``--max-rows-per-trigger M`` each of the 3 channels takes ``M // 3``
rows per micro-batch (``stream_offset.fair_limits``). Channel 0's backlog exceeds the others'
by at least ``3 * (M // 3)`` rows, so at the first barrier (placed at the heads, which are at
least the backlogs) channel 0 arrives at least 3 micro-batches after channels 1 and 2; later
barriers lag while channel 0 still works off its backlog.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from conftest import (
    DemoArgs,
    DemoLauncher,
    DemoRun,
    delta_txn_versions,
    generated_keys,
    output_rows,
    read_delta,
    running_count_rows,
    shared_session,
)

from spark_ckpt.coordination.requests import STOP
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.locations.uris import filesystem
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.testing import faults

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CHANNELS = 3
MAX_ROWS_PER_TRIGGER = 300  # 100 rows per channel and micro-batch
SHARE = MAX_ROWS_PER_TRIGGER // CHANNELS
#: Channel 0 lags: its backlog is 7 micro-batches longer than the others'.
LAGGING_BACKLOG = (800, 100, 100)
RATE = 30.0  # rows/s per channel: below what a micro-batch takes, so heads stay close
#: SIGKILLs of the aligned scenario; the other modes share its code paths up to the aligner
#: and take fewer (each kill is a job start, the suite's largest cost)
KILLS = 4
OTHER_MODE_KILLS = 2
AT_LEAST_ONCE_KILLS = 2
#: Liveness bounds (never part of an assertion about speed).
FIRST_CHECKPOINT_TIMEOUT_S = 240.0
FINAL_RUN_TIMEOUT_S = 300.0

assert LAGGING_BACKLOG[0] - max(LAGGING_BACKLOG[1:]) >= 3 * SHARE


def _args(tmp_path: Path, mode: str, **overrides: object) -> DemoArgs:
    args = DemoArgs(
        root=tmp_path / "root",
        output=tmp_path / "out",
        mode=mode,
        rate=RATE,
        backlog=",".join(str(b) for b in LAGGING_BACKLOG),
        channels=CHANNELS,
        keys=50,
        interval="300ms",
        aligned_timeout="1ms",
        max_rows_per_trigger=MAX_ROWS_PER_TRIGGER,
        barrier_placement="head",  # so channel 0 really lags (see LAGGING_BACKLOG)
    )
    return replace(args, **overrides)  # type: ignore[arg-type]


def _latest(root: Path | str) -> CompletedCheckpoint | None:
    fs, path = filesystem(str(root))
    if fs.get_file_info(f"{path}/checkpoints").type == pafs.FileType.NotFound:
        return None
    return DeltaCheckpointStore(str(root)).latest_completed()


def _latest_id(root: Path | str) -> int:
    latest = _latest(root)
    return latest.checkpoint_id if latest else 0


def _completes_after(root: Path | str, checkpoint_id: int) -> Callable[[], bool]:
    """Whether a checkpoint newer than *checkpoint_id* has completed."""
    return lambda: _latest_id(root) > checkpoint_id


def _sleep_while_alive(run: DemoRun, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not run.alive():
            raise AssertionError(f"job exited ({run.popen.returncode}) on its own\n{run.tail()}")
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _kill_repeatedly(demo: DemoLauncher, args: DemoArgs, kills: int, seed: int) -> list[str]:
    """Start, kill, restart *kills* times. Even kills wait until this run completed a
    checkpoint and then strike 0-1.5 s later (right after completion, around the sink commit,
    or mid-batch); odd kills strike 2-15 s after the start (JVM start-up, the first batch,
    or anywhere later). Returns what each kill interrupted, for the failure message."""
    rng = random.Random(seed)
    story = []
    for i in range(kills):
        before = _latest_id(args.root)
        run = demo.start(args)
        if i % 2 == 0:
            demo.wait_until(
                run,
                _completes_after(args.root, before),
                FIRST_CHECKPOINT_TIMEOUT_S,
                f"completed checkpoint in run {i}",
            )
            _sleep_while_alive(run, rng.uniform(0.0, 1.5))
        else:
            _sleep_while_alive(run, rng.uniform(2.0, 15.0))
        run.kill()
        story.append(f"kill {i}: latest checkpoint {before} -> {_latest_id(args.root)}")
    return story


def _finish(demo: DemoLauncher, args: DemoArgs) -> CompletedCheckpoint:
    """A final ``--available-now`` run: it restores, processes what is available and ends
    with a final checkpoint whose output is committed; returns that checkpoint. The faults
    are behind it: it runs in this test process's own Spark session (another driver than
    the killed ones, as a job restarted elsewhere, with no JVM to start) when the job needs
    nothing of a process of its own (:attr:`DemoArgs.runs_in_a_shared_session`; a job
    on a local cluster finishes on ``local[2]``), in a process of its own otherwise."""
    final_args = replace(args, available_now=True)
    if final_args.runs_in_a_shared_session:
        code = final_args.run_in(shared_session())
        assert code == 0, f"final run failed ({code})"
    else:
        run = demo.start(final_args)
        code = run.wait(FINAL_RUN_TIMEOUT_S)
        assert code == 0, f"final run failed ({code})\n{run.tail()}"
    final = _latest(args.root)
    assert final is not None and STOP in final.properties, final
    return final


def _final_positions(final: CompletedCheckpoint, backlog: tuple[int, ...]) -> list[int]:
    offsets = final.offsets()
    positions = [offsets[("source", c)] for c in range(len(backlog))]
    # every checkpoint lies at or beyond the heads at its trigger, which include the backlog
    assert all(p >= b for p, b in zip(positions, backlog, strict=True)), positions
    return positions


def _diff(actual: Counter[tuple[int, int]], expected: Counter[tuple[int, int]]) -> str:
    missing = expected - actual
    extra = actual - expected
    return (
        f"{sum(actual.values())} rows, expected {sum(expected.values())}; "
        f"missing {sorted(missing.items())[:10]} ({sum(missing.values())}), "
        f"extra {sorted(extra.items())[:10]} ({sum(extra.values())})"
    )


@pytest.mark.parametrize(
    ("mode", "seed"), [("aligned", 11), ("unaligned", 12), ("aligned-timeout", 13)]
)
def test_exactly_once_under_repeated_sigkill(
    demo: DemoLauncher, tmp_path: Path, mode: str, seed: int
) -> None:
    """(a)/(b): SIGKILLs at random moments (4 aligned, 2 in each other mode: even ones
    after a completed checkpoint, odd ones anywhere from the start), with a lagging channel;
    afterwards the output holds every expected ``(user_id, count)`` row exactly once — so
    every keyed count equals the failure-free running count — and every checkpoint's output
    is committed."""
    args = _args(tmp_path, mode)
    story = _kill_repeatedly(demo, args, KILLS if mode == "aligned" else OTHER_MODE_KILLS, seed)
    final = _finish(demo, args)
    positions = _final_positions(final, LAGGING_BACKLOG)

    expected_keys = generated_keys(args.spec(), positions)
    expected = running_count_rows(expected_keys)
    actual = output_rows(read_delta(args.output))
    assert actual == expected, f"{_diff(actual, expected)}\n" + "\n".join(story)
    versions = [v for _, v in delta_txn_versions(args.output)]
    assert versions and max(versions) >= final.checkpoint_id, versions


def test_at_least_once_loses_nothing(demo: DemoLauncher, tmp_path: Path) -> None:
    """(c): at-least-once mode under SIGKILLs: every expected ``(user_id, i)`` row is in the
    output (duplicates allowed), and each key's largest count reaches its input count."""
    args = _args(tmp_path, "at-least-once")
    story = _kill_repeatedly(demo, args, AT_LEAST_ONCE_KILLS, seed=21)
    final = _finish(demo, args)
    positions = _final_positions(final, LAGGING_BACKLOG)

    expected_keys = generated_keys(args.spec(), positions)
    expected = running_count_rows(expected_keys)
    actual = output_rows(read_delta(args.output))
    missing = set(expected) - set(actual)
    assert not missing, f"lost {len(missing)} rows, e.g. {sorted(missing)[:10]}\n" + "\n".join(
        story
    )
    top: dict[int, int] = {}
    for key, count in actual:
        top[key] = max(top.get(key, 0), count)
    short = {k: (top.get(k, 0), n) for k, n in expected_keys.items() if top.get(k, 0) < n}
    assert not short, short


def test_crash_after_completion_before_sink_commit(demo: DemoLauncher, tmp_path: Path) -> None:
    """(d): the coordinator dies (fail point) after a checkpoint completed in the store but
    before its output was committed; the restarted query's recover-and-commit commits it,
    exactly once. Finite input (``--rate 0``): the whole input is known up front."""
    backlog = (1000, 1000, 1000)
    args = _args(
        tmp_path,
        "aligned",
        rate=0.0,
        backlog=",".join(map(str, backlog)),
        available_now=True,
    )
    faults.arm(str(args.root), faults.Fault.BEFORE_SINK_COMMIT)

    run = demo.start(args)  # the demo's restart strategy restarts the failed query
    code = run.wait(FINAL_RUN_TIMEOUT_S)
    assert code == 0, f"run failed ({code})\n{run.tail()}"

    # the fail point fired: checkpoint n was complete, its output not committed
    [hit] = faults.hits(str(args.root), faults.Fault.BEFORE_SINK_COMMIT)
    crashed = int(hit["checkpoint_id"])
    assert hit["sink_committed"] < crashed
    restarts = re.search(r"(\d+) restarts", run.tail())
    assert restarts and int(restarts.group(1)) >= 1, run.tail()
    final = _latest(args.root)
    assert final is not None and final.checkpoint_id > crashed
    # the restarted query's recover-and-commit committed checkpoint n's transactions
    versions = [v for _, v in delta_txn_versions(args.output)]
    assert crashed in versions and max(versions) >= final.checkpoint_id, versions

    # ... and its output is in the table exactly once, as is everything else
    expected = running_count_rows(generated_keys(args.spec(), backlog))
    actual = output_rows(read_delta(args.output))
    assert actual == expected, _diff(actual, expected)


def test_available_now_after_restore_requests_final_checkpoint(tmp_path: Path) -> None:
    """A ``Trigger.AvailableNow`` run restored from a checkpoint taken after the generator had
    produced more than its backlog (any earlier run with ``--rate > 0``) must still end with
    a final checkpoint: its barrier is placed once the available input is admitted. Drives
    the stream reader the way Spark's source runner does, without Spark."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from datasources.ckpt_source import CkptSource, CkptStreamReader
    from spark_ckpt.coordination.topology import Topology, write_topology
    from spark_ckpt.protocol.barrier import SnapshotType
    from spark_ckpt.protocol.checkpoint import CheckpointStats
    from spark_ckpt.protocol.state_handles import SourceOffset, TaskId, TaskSnapshot
    from spark_ckpt.sources.stream_offset import StreamOffset

    root = str(tmp_path / "root")
    store = DeltaCheckpointStore(root)
    lease = store.acquire()
    restored = (900, 200, 200)  # beyond the backlog (800, 100, 100)
    handle = store.write_task_state(
        lease.first_id,
        TaskSnapshot(
            TaskId("counter", 0),
            (),
            (),
            tuple(SourceOffset("source", c, p) for c, p in enumerate(restored)),
        ),
    )
    store.commit(
        lease,
        CompletedCheckpoint(
            lease.first_id, SnapshotType.CHECKPOINT, (handle,), CheckpointStats(0, 1)
        ),
    )
    write_topology(root, Topology("counter", 1, None, "run"))
    source = CkptSource(
        {
            "pipeline": "p",
            "store": root,
            "rate": "0",
            "backlog": "800,100,100",
            "channels": "3",
            "keys": "50",
            "checkpoint.interval": "1h",  # no periodic barrier: only the final one
        }
    )
    reader = source.streamReader(source.schema())
    assert isinstance(reader, CkptStreamReader)
    reader.prepareForTriggerAvailableNow()  # Spark's order: before initialOffset
    start = reader.initialOffset()
    assert StreamOffset.from_dict(start).positions == restored
    end = StreamOffset.from_dict(start)
    for _ in range(3):  # nothing left to read: the final checkpoint's barrier must come
        end = StreamOffset.from_dict(reader.latestOffset(end.to_dict(), ReadMaxRows(300)))
        if end.last_barrier_id > lease.first_id:
            break  # placed (the next call would wait for the checkpoint to complete)
    assert end.last_barrier_id > lease.first_id, end

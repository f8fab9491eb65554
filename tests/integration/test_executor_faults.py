"""Executor faults on a real multi-process cluster: ``local-cluster[2,1,1024]`` (two executor
JVMs, each with its own Python workers) with the subtasks on the executors.

Each test runs the demo job in a subprocess, kills processes of the cluster from the test
while it runs (a killer in the test, no fail point in the job), lets it recover, then ends
with a final ``--available-now`` run (under ``local[2]``: :func:`finish_locally`). Oracle:
a plain fold over the generator's rows up to the final checkpoint's positions: every
``(user_id, count)`` row exactly once."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from conftest import (
    DemoLauncher,
    generated_keys,
    newest_segment_meta,
    output_rows,
    read_delta,
    running_count_rows,
)
from test_crash import (
    FIRST_CHECKPOINT_TIMEOUT_S,
    LAGGING_BACKLOG,
    _args,
    _completes_after,
    _diff,
    _final_positions,
    _finish,
    _latest_id,
)

from spark_ckpt.client.pipeline_client import PipelineClient
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.spark.session.spark_home import spark_home
from spark_ckpt.testing import faults
from spark_ckpt.testing.jobs import DemoArgs, DemoRun
from spark_ckpt.testing.processes import session_processes
from spark_ckpt.testing.s3_endpoint import S3Endpoint, running_s3_endpoint

#: one xdist worker runs them all, one after the other: see tests/conftest.py
pytestmark = [pytest.mark.spark, pytest.mark.slow]

CLUSTER = "local-cluster[2,1,1024]"
EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def executor_jvms(run: DemoRun) -> list[int]:
    return [p for p in session_processes(run.sid) if EXECUTOR_MAIN in _cmdline(p)]


def block_managers(executor: int) -> set[str]:
    """The block manager directories (``blockmgr-<uuid>``: the executor identity a changelog
    segment records) of executor JVM *executor*, in its local directories
    (``SPARK_EXECUTOR_DIRS``, set by the standalone worker)."""
    try:
        with open(f"/proc/{executor}/environ", "rb") as f:
            env = dict(line.split(b"=", 1) for line in f.read().split(b"\0") if b"=" in line)
    except OSError:
        return set()
    dirs = [d for d in env.get(b"SPARK_EXECUTOR_DIRS", b"").decode().split(":") if d]
    return {e.name for d in dirs for e in Path(d).glob("blockmgr-*")}


def newest_segment_executor(root: Path) -> str | None:
    """The executor that wrote the newest changelog segment of any subtask (None: none)."""
    meta = newest_segment_meta(root)
    try:
        return None if meta is None else str(meta["changelog"]["executor"])
    except (KeyError, TypeError):
        return None


def rebuilds(root: Path | str) -> int:
    """Rebuilds of subtask state so far, by the statistics of every completed checkpoint
    (each subtask's first micro-batch restores: one each)."""
    stats = [c.stats.task_cache for c in DeltaCheckpointStore(str(root)).list_completed()]
    return sum(m.rebuilds for cache in stats for m in cache.values())


def python_workers(run: DemoRun, executor: int) -> list[int]:
    """The Python processes of executor JVM *executor* that run its tasks: the workers forked
    by its daemon (not the daemon), and the subtask hosts they started."""
    pids = session_processes(run.sid)
    daemons = [p for p in pids if _parent(p) == executor and "pyspark.daemon" in _cmdline(p)]
    workers = [p for p in pids if _parent(p) in daemons]
    return workers + [p for p in pids if _parent(p) in workers]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "R"
    except OSError:
        return False


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait(demo: DemoLauncher, run: DemoRun, what: str, condition: Callable[[], bool]) -> None:
    demo.wait_until(run, condition, FIRST_CHECKPOINT_TIMEOUT_S, what)


def cluster_args(tmp_path: Path) -> DemoArgs:
    return replace(
        _args(tmp_path, "aligned"),
        placement="executors",
        master=CLUSTER,
        restarts=5,
        retained=1000,  # every checkpoint's statistics stay readable
    )


@pytest.mark.parametrize("victim", ["executor-jvm", "python-workers"])
def test_a_killed_executor_process_keeps_the_output_exactly_once(
    demo: DemoLauncher, tmp_path: Path, victim: str
) -> None:
    """After a checkpoint completed and while micro-batches run, SIGKILL either the executor
    JVM where the subtasks run (its tasks, Python workers, subtask hosts and their state go
    with it: Spark runs the subtasks on the other executor, where they rebuild their state
    from the changelog) or the busy Python processes of that executor — workers reading the
    source or waiting for a subtask, subtask hosts in the middle of a micro-batch (Spark
    retries their tasks, which find the subtask's state in its host or, the host killed,
    rebuild it from the changelog in a new one). The job goes on checkpointing
    without a restart; after a final run every row is in the output exactly once."""
    args = cluster_args(tmp_path)
    started = time.time()
    run = demo.start(args)
    _wait(demo, run, "a first checkpoint", _completes_after(args.root, 0))
    executors = executor_jvms(run)
    # two executors, or more: on a loaded machine the standalone worker may have replaced
    # one that failed to start (its JVM can still be on its way out)
    assert len(executors) >= 2, [(p, _cmdline(p)[:120]) for p in session_processes(run.sid)]
    before = _latest_id(args.root)
    if victim == "executor-jvm":  # the one where the subtasks ran last, until the
        # subtasks went on on another executor, rebuilding their state there (Spark may
        # have moved them before the kill; the standalone worker starts a new executor
        # after each kill)
        deadline = time.monotonic() + 240
        moved = False
        while not moved:
            assert time.monotonic() < deadline and run.alive(), f"no move\n{run.tail()}"
            ran, rebuilt = newest_segment_executor(args.root), rebuilds(args.root)
            victims = [p for p in executor_jvms(run) if ran in block_managers(p)]
            _kill(victims)
            latest = _latest_id(args.root)
            _wait(demo, run, "a checkpoint after a kill", _completes_after(args.root, latest))
            now = newest_segment_executor(args.root)
            moved = bool(victims) and now not in (None, ran) and rebuilds(args.root) > rebuilt
    else:  # workers running a task (mid-subtask, or reading the source for one), until
        # one of them was: Spark logs another attempt of its task
        deadline = time.monotonic() + 180
        while not retried_tasks(started, remove=False):
            assert time.monotonic() < deadline and run.alive(), f"no task retried\n{run.tail()}"
            busy = [w for e in executors for w in python_workers(run, e) if _running(w)]
            _kill(busy)
            time.sleep(1.0 if busy else 0.005)
    # the job recovers (a restart, or Spark's own task retry) and checkpoints again
    _wait(demo, run, "a checkpoint after the kill", _completes_after(args.root, before + 1))
    run.kill()
    # no subtask lost its state (that would have failed the run); a subtask moved off the
    # killed executor rebuilt its state from the changelog, as the statistics say, and a
    # killed Python worker failed a task in flight, which Spark ran again
    assert "SubtaskStateLostError" not in run.tail(400), run.tail(400)
    retried_tasks(started)  # removes the executors' logs
    final = finish_locally(demo, args)
    positions = _final_positions(final, LAGGING_BACKLOG)
    expected = running_count_rows(generated_keys(args.spec(), positions))
    actual = output_rows(read_delta(args.output))
    assert actual == expected, f"{_diff(actual, expected)}\n{run.tail()}"


def test_a_task_failing_after_it_staged_output_is_retried_exactly_once(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    """A faulty checkpoint store kills the Python worker in a subtask's state write, once:
    the write comes after the subtask sealed the checkpoint's output into staged files.
    Spark retries the task; the retry stages the same rows again under other names, and
    only one attempt's output is ever committed. Python workers are not reused here, so the
    write runs in the task (in a reused worker it runs after it: the next test)."""
    args = replace(
        cluster_args(tmp_path),
        rate=0.0,
        backlog="900,300,300",
        available_now=True,
        conf=("spark.python.worker.reuse=false",),
    )
    faults.arm(str(args.root), faults.Fault.STORE_WRITE, faults.Action.KILL)
    started = time.time()
    run = demo.start(args)
    assert run.wait(300) == 0, run.tail()
    assert len(faults.hits(str(args.root), faults.Fault.STORE_WRITE)) == 1
    assert retried_tasks(started), run.tail()
    final = finish_locally(demo, args)
    assert [final.offsets()[("source", c)] for c in range(3)] == [900, 300, 300]
    expected = running_count_rows(generated_keys(args.spec(), [900, 300, 300]))
    actual = output_rows(read_delta(args.output))
    assert actual == expected, f"{_diff(actual, expected)}\n{run.tail()}"


def test_a_worker_lost_while_writing_the_final_checkpoint_ends_the_run_exactly_once(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    """The only checkpoint of a ``Trigger.AvailableNow`` run is its final one, written by
    reused Python workers after their tasks ended; the faulty store kills one of them in that
    write. No micro-batch follows to notice: the driver finds the lost writer, the final
    checkpoint is declined and taken again, and the run ends well before the checkpoint's
    timeout (10 minutes) with every row exactly once."""
    args = replace(
        cluster_args(tmp_path),
        rate=0.0,
        backlog="900,300,300",
        available_now=True,
        interval="600s",  # no periodic checkpoint: the final one is the first
    )
    faults.arm(str(args.root), faults.Fault.STORE_WRITE, faults.Action.KILL)
    started = time.time()
    run = demo.start(args)
    assert run.wait(300) == 0, run.tail()
    assert len(faults.hits(str(args.root), faults.Fault.STORE_WRITE)) == 1
    history = DeltaCheckpointStore(str(args.root)).list_history()
    failed = [r.failure for r in history if r.failure is not None]
    # the kill landed after the tasks (declined, taken again) or in a later task (retried)
    lost = [f for f in failed if "was lost before it acknowledged" in f.message]
    assert lost or retried_tasks(started, remove=False), f"{failed}\n{run.tail()}"
    retried_tasks(started)
    completed = [r for r in history if r.failure is None]
    assert len(completed) == 1, history
    assert all(completed[0].checkpoint_id > f.checkpoint_id for f in failed), history
    final = finish_locally(demo, args)
    assert [final.offsets()[("source", c)] for c in range(3)] == [900, 300, 300]
    expected = running_count_rows(generated_keys(args.spec(), [900, 300, 300]))
    actual = output_rows(read_delta(args.output))
    assert actual == expected, f"{_diff(actual, expected)}\n{run.tail()}"


def finish_locally(demo: DemoLauncher, args: DemoArgs) -> CompletedCheckpoint:
    """The final ``--available-now`` run (:func:`test_crash._finish`) under ``local[2]``: the
    faults are behind it, and what it adds (the rest of the input, the final checkpoint the
    oracle reads) needs no cluster, whose three JVMs take longest to start. It restores the
    cluster's checkpoint into one JVM, as a job moved to another cluster would."""
    return _finish(demo, replace(args, master="local[2]"))


def retried_tasks(since: float, *, remove: bool = True) -> list[str]:
    """The executors' log lines of task attempts after the first (``Running task 3.1``) of
    the applications started since *since*. A local cluster's workers keep the executors'
    logs under ``$SPARK_HOME/work/<app>/<executor>/stderr`` (the jobs' Spark home:
    :func:`~spark_ckpt.spark.session.spark_home.spark_home`); *remove*: delete them."""
    work = spark_home() / "work"
    apps = [a for a in work.glob("app-*") if a.stat().st_mtime >= since - 1]
    lines = [
        line
        for app in apps
        for log in app.glob("*/stderr")
        for line in log.read_text(errors="replace").splitlines()
        if re.search(r"Running task \d+\.[1-9]", line)
    ]
    if remove:
        for app in apps:
            shutil.rmtree(app, ignore_errors=True)
    return lines


@pytest.fixture
def on_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Endpoint]:
    """An S3 endpoint of this test, this process's environment (and so the job's, its JVMs'
    and their Python workers') pointed at it."""
    with running_s3_endpoint() as endpoint:
        endpoint.create_bucket("lake")
        for key, value in endpoint.environment().items():
            monkeypatch.setenv(key, value)
        yield endpoint


def test_a_killed_executor_jvm_with_the_root_on_s3_keeps_the_output_exactly_once(
    demo: DemoLauncher, tmp_path: Path, on_s3: S3Endpoint
) -> None:
    """The pipeline root and the output on the endpoint, the subtasks on a two-executor
    cluster. Every executor JVM is SIGKILLed: the subtasks' hosts and their state go with
    them, and the subtasks rebuild their state on the new executors from the changelog on
    the endpoint, without a restart of the run; checkpoints go on. After a final run the
    output, read back by polars from the endpoint, holds every row exactly once."""
    args = replace(
        cluster_args(tmp_path), root="s3://lake/cluster/root", output="s3://lake/cluster/out"
    )
    run = demo.start(args)
    _wait(demo, run, "a first checkpoint", _completes_after(args.root, 0))
    executors = executor_jvms(run)
    assert len(executors) >= 2, [(p, _cmdline(p)[:120]) for p in session_processes(run.sid)]
    before, rebuilt = _latest_id(args.root), rebuilds(args.root)
    _kill(executors)  # every executor: the subtasks' state is gone wherever it was
    _wait(demo, run, "a checkpoint after the kill", _completes_after(args.root, before + 1))
    deadline = time.monotonic() + 240
    while rebuilds(args.root) <= rebuilt:  # the statistics of a checkpoint after the rebuild
        assert time.monotonic() < deadline and run.alive(), f"no rebuild\n{run.tail()}"
        time.sleep(0.5)
    run.kill()
    log = run.tail(400)
    assert "SubtaskStateLostError" not in log and "run 1 failed" not in log, log
    retried_tasks(0.0)  # removes the executors' logs
    final = finish_locally(demo, args)
    positions = _final_positions(final, LAGGING_BACKLOG)
    expected = running_count_rows(generated_keys(args.spec(), positions))
    frame = pl.read_delta(str(args.output), storage_options=on_s3.storage_options())
    actual = Counter(zip(frame["user_id"].to_list(), frame["count"].to_list(), strict=True))
    assert actual == expected, f"{_diff(actual, expected)}\n{run.tail()}"


def _kill_subtask_executor(demo: DemoLauncher, run: DemoRun, root: Path) -> None:
    """SIGKILL the executor JVM where the subtasks ran last, then wait for a checkpoint
    completed after it (on the other executor, or on the one the worker starts anew)."""
    deadline = time.monotonic() + 240
    while True:  # the newest changelog segment names the executor; its JVM may be starting
        ran = newest_segment_executor(root)
        victims = [p for p in executor_jvms(run) if ran in block_managers(p)]
        if victims:
            break
        assert time.monotonic() < deadline and run.alive(), f"no executor found\n{run.tail()}"
        time.sleep(0.5)
    latest = _latest_id(root)
    _kill(victims)
    _wait(demo, run, "a checkpoint after the kill", _completes_after(root, latest))


def test_savepoints_restore_across_state_backends_through_executor_jvm_kills(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    """A run on ``hashmap`` loses an executor JVM, takes a savepoint, goes on past it and is
    killed; a run on ``rocksdb`` restores that savepoint (withdrawing what the first one
    committed after it), loses an executor JVM, takes a savepoint of its own, goes on and
    is killed; a run back on ``hashmap`` restores the second savepoint and finishes the
    input. Every row is in the output exactly once: a savepoint's format does not depend on
    the backend that wrote it, in either direction."""
    args = cluster_args(tmp_path)
    root = Path(args.root)
    client = PipelineClient(str(root))
    path: str | None = None
    for backend in ("hashmap", "rocksdb"):
        extra = () if path is None else ("--restore-savepoint", path)
        run = demo.start(replace(args, state_backend=backend, extra=extra))
        _wait(demo, run, "a first checkpoint", _completes_after(root, _latest_id(root)))
        _kill_subtask_executor(demo, run, root)
        savepoint = client.savepoint()
        path = client.savepoint_path(savepoint)
        _wait(
            demo,
            run,
            "a checkpoint after the savepoint",
            _completes_after(root, savepoint.checkpoint_id),
        )
        run.kill()
        assert "SubtaskStateLostError" not in run.tail(400), run.tail(400)
    retried_tasks(0.0)  # removes the executors' logs
    assert path is not None
    final = finish_locally(
        demo, replace(args, state_backend="hashmap", extra=("--restore-savepoint", path))
    )
    positions = _final_positions(final, LAGGING_BACKLOG)
    expected = running_count_rows(generated_keys(args.spec(), positions))
    actual = output_rows(read_delta(args.output))
    assert actual == expected, _diff(actual, expected)

"""The fault matrix: every kind of failure keeps the output exactly-once, on real Spark and
real Delta, with faults that land after rows were processed past the last completed
checkpoint.

Every test runs the main job (``python -m spark_ckpt.demo``: Delta input table → keyed
running count → Delta output) in a subprocess, on an input table that the test itself writes
while the job runs, with a checkpoint interval of seconds: before a fault is injected the test
waits until the job has staged output that no completed checkpoint covers yet (uncommitted
part files in the output table), i.e. until rows were processed past the last checkpoint.
Faults come from the fail points of :mod:`spark_ckpt.testing.faults` (armed for the job's
root) or from outside (SIGKILL, a second driver, damaged files). Every test ends the job with
``spark-ckpt stop`` and drains the rest with an ``--available-now`` run, then compares the
output with the oracle: for a key with *n* input rows — rows the test wrote — the rows
``(key, 1) .. (key, n)``, each exactly once (a plain fold over the input).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import output_rows, read_delta, running_count_rows, shared_session
from deltalake import write_deltalake

from spark_ckpt.client.pipeline_client import PipelineClient
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.testing import faults
from spark_ckpt.testing.jobs import DemoArgs, DemoLauncher, DemoRun

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEYS = 40
#: Liveness bounds (never assertions about speed).
STEP_TIMEOUT_S = 240.0
FINAL_RUN_TIMEOUT_S = 300.0


@dataclass
class Feed:
    """The job's input table, written by the test: the oracle's only source."""

    path: Path
    rng: random.Random
    written: Counter[int] = field(default_factory=Counter)

    def append(self, rows: int) -> None:
        keys = [self.rng.randrange(KEYS) for _ in range(rows)]
        write_deltalake(
            str(self.path), pa.table({"user_id": pa.array(keys, pa.int64())}), mode="append"
        )
        self.written.update(keys)

    def expected(self) -> Counter[tuple[int, int]]:
        return running_count_rows(self.written)


@dataclass
class Job:
    """One scenario: the job's options, its input, and the launcher."""

    demo: DemoLauncher
    args: DemoArgs
    feed: Feed

    @property
    def root(self) -> str:
        return str(self.args.root)

    def start(self, **overrides: object) -> DemoRun:
        return self.demo.start(replace(self.args, **overrides))  # type: ignore[arg-type]

    def latest_id(self) -> int:
        if not (self.args.root / "checkpoints").exists():
            return 0
        latest = DeltaCheckpointStore(self.root).latest_completed()
        return latest.checkpoint_id if latest else 0

    def wait(self, run: DemoRun, what: str, predicate: object) -> None:
        self.demo.wait_until(run, predicate, STEP_TIMEOUT_S, what)  # type: ignore[arg-type]

    def wait_checkpoint_after(self, run: DemoRun, checkpoint_id: int) -> None:
        self.wait(
            run, f"a checkpoint after {checkpoint_id}", lambda: self.latest_id() > checkpoint_id
        )

    def wait_processed_past_checkpoint(self, run: DemoRun) -> int:
        """Feed rows until the job staged output no completed checkpoint covers; returns the
        latest completed checkpoint id at that moment."""
        self.wait_checkpoint_after(run, 0)
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not uncommitted_output(self.args.output):
            assert run.alive(), run.tail()
            assert time.monotonic() < deadline, "no output staged past the last checkpoint"
            self.feed.append(200)
            time.sleep(0.5)
        return self.latest_id()

    def wait_hits(self, run: DemoRun, fault: faults.Fault, n: int = 1) -> None:
        """Feed input until *fault* was hit *n* times (a fault in the data path needs data)."""
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while len(faults.hits(self.root, fault)) < n:
            assert run.alive(), f"job exited before {fault} was hit {n} times\n{run.tail()}"
            assert time.monotonic() < deadline, f"{fault} not hit {n} times\n{run.tail()}"
            self.feed.append(50)
            time.sleep(0.5)

    def wait_restarted(self, run: DemoRun, restarts: int) -> None:
        """Wait until the job reported its *restarts*-th failed run and a checkpoint of the
        next run completed: the fault's consequences are over."""
        self.wait(run, f"failed run {restarts}", lambda: f"run {restarts} failed" in run.tail(400))
        self.wait_checkpoint_after(run, self.latest_id())

    def feed_until_exit(self, run: DemoRun) -> int:
        """Feed input until the job exits on its own; returns its exit status."""
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while run.alive():
            assert time.monotonic() < deadline, f"job did not exit\n{run.tail()}"
            self.feed.append(50)
            time.sleep(0.5)
        return run.wait(10)

    def stop(self, run: DemoRun) -> subprocess.CompletedProcess[str]:
        """``spark-ckpt stop`` through the installed console script; the job must exit, and
        stopping must print no stack trace (failures before it may have)."""
        since = run.log.stat().st_size
        done = cli("stop", "--root", self.root, "--timeout", "180")
        assert done.returncode == 0, done.stderr + run.tail()
        assert run.wait(120) == 0, run.tail()
        assert "stopped (stop)" in run.tail(), run.tail()
        assert_no_trace(run, since)
        return done

    def drain_and_check(self) -> None:
        """An ``--available-now`` run reads the rest; then the output must be exactly the
        running count over every row the test wrote."""
        final = replace(self.args, available_now=True)
        if final.runs_in_a_shared_session:  # another driver, with no JVM to start
            assert final.run_in(shared_session()) == 0
        else:
            run = self.start(available_now=True)
            assert run.wait(FINAL_RUN_TIMEOUT_S) == 0, run.tail()
        actual = output_rows(read_delta(self.args.output))
        expected = self.feed.expected()
        assert actual == expected, diff(actual, expected)


#: What a stack trace of the JVM or of Python leaves in a console.
TRACE_MARKERS = (
    "Traceback (most recent call last)",
    "Exception in thread",
    "\tat org.apache",
    "Error:",
)


def assert_no_trace(run: DemoRun, since: int = 0) -> None:
    """No stack trace in the job's console from byte *since* on."""
    text = run.log.read_bytes()[since:].decode(errors="replace")
    found = [m for m in TRACE_MARKERS if m in text]
    assert not found, f"{found} in the job's console:\n{run.tail(80)}"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "spark-ckpt"
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=600, check=False
    )


def uncommitted_output(output: Path) -> list[str]:
    """Staged part files of the sink that the output table's log does not reference."""
    if not output.exists():
        return []
    committed = set()
    for commit in sorted((output / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            if '"add"' in line:
                committed.add(line.split('"path":"', 1)[1].split('"', 1)[0])
    return [p.name for p in output.glob("part-*-ckpt-*.parquet") if p.name not in committed]


def diff(actual: Counter[tuple[int, int]], expected: Counter[tuple[int, int]]) -> str:
    missing, extra = expected - actual, actual - expected
    return (
        f"{sum(actual.values())} rows, expected {sum(expected.values())}; "
        f"missing {sorted(missing.items())[:8]} ({sum(missing.values())}), "
        f"extra {sorted(extra.items())[:8]} ({sum(extra.values())})"
    )


@pytest.fixture
def job(demo: DemoLauncher, tmp_path: Path) -> Job:
    feed = Feed(tmp_path / "input", random.Random(tmp_path.name))
    feed.append(300)  # the table must exist before the job starts
    args = DemoArgs(
        root=tmp_path / "root",
        output=tmp_path / "out",
        input=feed.path,
        channels=3,
        interval="2s",  # several micro-batches apart: faults land after rows were processed
        # past a checkpoint (each test waits for output staged past it before the fault)
        restarts=3,
        restart_delay="500ms",
        retained=3,
        tolerable_failures=3,
        seconds=900.0,
    )
    return Job(demo, args, feed)


def restarts_of(run: DemoRun) -> int:
    line = next(line for line in run.tail(5).splitlines() if "restarts" in line)
    return int(line.split(" restarts")[0].rsplit(" ", 1)[1])


# -- processes dying -------------------------------------------------------------------------


@pytest.mark.compat
def test_killed_source_runner_and_python_worker_restart_from_the_checkpoint(job: Job) -> None:
    """The Python streaming source runner (``latestOffset``) dies, and later a Python worker
    running ``read()``: each time the query fails and the pipeline restarts it in-process
    from the latest completed checkpoint — operator state, channel positions, sink —
    although the dead run had processed rows past it."""
    run = job.start()
    kills = (faults.Fault.SOURCE_RUNNER, faults.Fault.SOURCE_READ)
    for restarts, fault in enumerate(kills, 1):
        job.wait_processed_past_checkpoint(run)
        faults.arm(job.root, fault, faults.Action.KILL)
        job.wait_hits(run, fault, 1)
        job.feed.append(300)
        job.wait_restarted(run, restarts)
    job.feed.append(300)
    job.stop(run)
    assert restarts_of(run) == len(kills), run.tail()
    # the restart's reason names what died, not only the query
    assert "Python source runner (the process running" in run.log.read_text(), run.tail()
    job.drain_and_check()


# -- failures raised in the job ----------------------------------------------------------------


def test_a_failure_once_is_mended_by_one_restart(job: Job) -> None:
    """A user operator raises once, and later the coordinator's thread fails once (its global
    Delta commit raises after the checkpoint completed): one restart each, exactly-once."""
    run = job.start()
    cases = ((faults.Fault.OPERATOR, "operator"), (faults.Fault.SINK_COMMIT, "store"))
    for restarts, (fault, error) in enumerate(cases, 1):
        job.wait_processed_past_checkpoint(run)
        faults.arm(job.root, fault, faults.Action.RAISE, error=error)
        job.wait_hits(run, fault, 1)
        job.feed.append(300)
        job.wait_restarted(run, restarts)
    job.stop(run)
    assert restarts_of(run) == len(cases), run.tail()
    job.drain_and_check()


# an operator's failure: a failing sink commit takes the same way through the restart
# strategy (test_a_failure_once_is_mended_by_one_restart injects both kinds)
@pytest.mark.parametrize(
    ("fault", "error", "named"),
    [(faults.Fault.OPERATOR, "operator", "InjectedFault: injected fault operator")],
)
def test_a_failure_always_exhausts_the_restart_strategy(
    job: Job, fault: faults.Fault, error: str, named: str
) -> None:
    """The same failure on every attempt: the strategy's 3 restarts are used up, the job
    fails with ``PipelineFailedError`` naming the cause, and nothing of the failed attempts
    is visible in the output: the drain run afterwards, which restores the latest completed
    checkpoint, must end with every row exactly once."""
    run = job.start()
    job.wait_processed_past_checkpoint(run)
    faults.arm(job.root, fault, faults.Action.RAISE, times=faults.ALWAYS, error=error)
    assert job.feed_until_exit(run) == 1, run.tail()
    log = run.tail(60)
    assert "PipelineFailedError" not in log  # no traceback: one clear line
    assert "error: pipeline 'crash' failed: " in log and named in log, log
    assert len(faults.hits(job.root, fault)) >= 4  # the first attempt and 3 restarts
    faults.disarm(job.root, fault)
    job.drain_and_check()


def test_storage_failing_for_a_while_is_tolerated(job: Job) -> None:
    """Checkpoint storage refuses writes (ENOSPC) for two checkpoints: they are declined and
    counted against the 3 tolerable failures; storage returns, checkpoints complete again,
    with no restart."""
    run = job.start()
    before = job.wait_processed_past_checkpoint(run)
    faults.arm(job.root, faults.Fault.STORE_WRITE, faults.Action.RAISE, times=2, error="enospc")
    job.wait_hits(run, faults.Fault.STORE_WRITE, 2)
    refused = job.latest_id()
    job.feed.append(300)
    job.wait_checkpoint_after(run, max(before, refused))
    job.stop(run)
    assert restarts_of(run) == 0, run.tail()
    # the declined checkpoints are on record after the job, with their reason, for any
    # client and for ``spark-ckpt stats``
    declined = [f for f in PipelineClient(str(job.root)).failures() if f.reason == "declined"]
    # (two refused writes: one or two declined checkpoints, as the subtasks meet them)
    assert declined and all(f.checkpoint_id > before for f in declined), declined
    assert all("No space left on device" in f.message for f in declined), declined
    stats = cli("stats", "--root", str(job.root), "--json")
    assert stats.returncode == 0, stats.stderr
    rows = [json.loads(line) for line in stats.stdout.splitlines()]
    failed_ids = {r["checkpoint_id"] for r in rows if r["status"] == "failed"}
    assert {f.checkpoint_id for f in declined} <= failed_ids
    job.drain_and_check()


def test_storage_failing_beyond_tolerance_fails_the_job_with_the_reason(job: Job) -> None:
    run = job.start(tolerable_failures=1, restarts=1)
    job.wait_processed_past_checkpoint(run)
    faults.arm(
        job.root,
        faults.Fault.STORE_WRITE,
        faults.Action.RAISE,
        times=faults.ALWAYS,
        error="enospc",
    )
    assert job.feed_until_exit(run) == 1, run.tail()
    log = run.tail(60)
    assert "error: pipeline 'crash' failed" in log and "No space left on device" in log, log
    faults.disarm(job.root, faults.Fault.STORE_WRITE)
    job.drain_and_check()


# -- the mailbox -------------------------------------------------------------------------------


def test_malformed_mailbox_files_are_set_aside_and_never_fail_a_restart(job: Job) -> None:
    """Garbage in the mailbox (not JSON, an unknown message type, a request without its
    fields) is reported and moved aside; the job goes on, and so does a restarted run."""
    run = job.start()
    before = job.wait_processed_past_checkpoint(run)
    mailbox = job.args.root / "_mailbox"
    (mailbox / "00000000000000000001-garbage.json").write_text("{not json")
    (mailbox / "00000000000000000002-unknown.json").write_text('{"type": "hello"}')
    (mailbox / "00000000000000000003-request.json").write_text('{"type": "request"}')
    job.wait_checkpoint_after(run, before)
    rejected = sorted(p.name for p in (mailbox / "_rejected").iterdir())
    assert rejected == [
        "00000000000000000001-garbage.json",
        "00000000000000000002-unknown.json",
        "00000000000000000003-request.json",
    ]
    (mailbox / "00000000000000000004-again.json").write_text("[1, 2")
    faults.arm(job.root, faults.Fault.SOURCE_RUNNER, faults.Action.KILL)  # a restart
    job.wait_hits(run, faults.Fault.SOURCE_RUNNER)
    job.wait_restarted(run, 1)
    assert "00000000000000000004-again.json" in {p.name for p in (mailbox / "_rejected").iterdir()}
    job.stop(run)
    assert restarts_of(run) == 1, run.tail()
    assert "set aside malformed message" in run.log.read_text()
    job.drain_and_check()


def test_a_stop_whose_client_gave_up_is_not_executed_by_a_later_run(job: Job) -> None:
    """``spark-ckpt stop`` while no pipeline runs fails at once with one clear line and posts
    nothing; a request left behind anyway (its client was killed) has expired: a run started
    later does not act on it."""
    gave_up = cli("stop", "--root", job.root, "--timeout", "3600")
    assert gave_up.returncode == 1 and gave_up.stderr.count("\n") == 1, gave_up.stderr
    assert "error: no live run of the pipeline" in gave_up.stderr
    assert not list((job.args.root / "_mailbox").glob("*.json"))  # nothing was posted
    from spark_ckpt.coordination.mailbox import Mailbox
    from spark_ckpt.coordination.messages import Request, RequestKind

    Mailbox(job.root).post(Request("left-behind", RequestKind.STOP, expires_ms=1))
    run = job.start()
    first = job.wait_processed_past_checkpoint(run)
    job.wait_checkpoint_after(run, first + 2)  # several checkpoints later: still running
    assert run.alive()
    job.stop(run)
    assert not list((job.args.root / "_mailbox").glob("*.json"))
    job.drain_and_check()


# -- a second driver ---------------------------------------------------------------------------


def test_a_second_driver_fences_the_first_and_output_stays_exactly_once(job: Job) -> None:
    """A second driver starts on the same pipeline root while the first runs: its coordinator
    takes the lease, the first fails with a clear error (no restart, which would fence the
    second in turn), and the second goes on exactly-once."""
    first = job.start()
    job.wait_processed_past_checkpoint(first)
    second = job.start()
    assert job.feed_until_exit(first) == 1, first.tail()
    last = first.tail(1)
    assert last.startswith("error: ") and "taken over by another driver" in last, first.tail()
    job.wait_checkpoint_after(second, job.latest_id())
    job.feed.append(300)
    job.wait_checkpoint_after(second, job.latest_id())
    job.stop(second)
    job.drain_and_check()


# -- stopping ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retention", "savepoint", "kept"),
    [("RETAIN_ON_CANCELLATION", False, True), ("DELETE_ON_CANCELLATION", True, False)],
)
def test_cli_stop_ends_the_job_and_applies_externalized_retention(
    job: Job, retention: str, savepoint: bool, kept: bool
) -> None:
    """``spark-ckpt stop [--savepoint]`` stops the running pipeline (the job exits) with a
    final checkpoint or savepoint; externalized retention then keeps or discards the
    checkpoints (never a savepoint)."""
    run = job.start(retention=retention)
    job.wait_processed_past_checkpoint(run)
    done = cli(
        "stop",
        "--root",
        job.root,
        "--timeout",
        "180",
        "--json",
        *(["--savepoint"] if savepoint else []),
    )
    assert done.returncode == 0, done.stderr + run.tail()
    assert run.wait(120) == 0 and "stopped (stop)" in run.tail(), run.tail()
    answer = json.loads(done.stdout)
    assert answer["type"] == ("savepoint" if savepoint else "checkpoint"), answer
    left = DeltaCheckpointStore(job.root).list_completed()
    checkpoints = [c for c in left if not c.is_savepoint]
    assert bool(checkpoints) is kept, [c.checkpoint_id for c in left]
    if savepoint:
        assert [c.checkpoint_id for c in left if c.is_savepoint] == [answer["id"]]
    if kept or savepoint:  # a restart resumes from what is left, exactly-once
        job.drain_and_check()


def test_a_stop_whose_final_checkpoint_fails_leaves_the_pipeline_running(job: Job) -> None:
    """Every state write fails while ``spark-ckpt stop`` runs: a task declines the final
    checkpoint. The CLI ends in one ``error:`` line naming the failure as soon as it is on
    record (not at its timeout); the pipeline goes on, as Flink's after a failed
    stop-with-savepoint: it reads on and its periodic checkpoints complete again. A second
    stop ends it, and the output is exactly once."""
    run = job.start()
    job.wait_processed_past_checkpoint(run)
    faults.arm(job.root, faults.Fault.STORE_WRITE, faults.Action.RAISE, times=faults.ALWAYS)
    failed = cli("stop", "--root", job.root, "--timeout", "180")
    faults.disarm(job.root, faults.Fault.STORE_WRITE)
    assert failed.returncode == 1 and failed.stderr.count("\n") == 1, failed.stderr
    assert failed.stderr.startswith("error: the stop request failed: checkpoint"), failed.stderr
    assert "injected fault store-write" in failed.stderr, failed.stderr
    assert run.alive(), run.tail()
    after = job.latest_id()
    job.feed.append(300)
    job.wait_checkpoint_after(run, after)  # a periodic one: nobody requested it
    assert run.alive(), run.tail()
    job.stop(run)
    job.drain_and_check()


# -- damaged checkpoint data -------------------------------------------------------------------


def damage_blob_of(root: Path, checkpoint_id: int, how: str) -> str:
    """Damage a state blob written by checkpoint *checkpoint_id* on disk: ``flip`` one byte
    of its payload, or ``delete`` the data file holding it. Returns the file."""
    table_dir = root / "operator_state"
    for path in sorted(table_dir.glob("*.parquet")):
        table = pq.read_table(path)
        rows = [
            i for i, c in enumerate(table.column("checkpoint_id").to_pylist()) if c == checkpoint_id
        ]
        if not rows:
            continue
        if how == "delete":
            path.unlink()
            return path.name
        payloads = table.column("payload").to_pylist()
        data = bytearray(payloads[rows[0]])
        data[len(data) // 2] ^= 0x01
        payloads[rows[0]] = bytes(data)
        column = table.schema.get_field_index("payload")
        table = table.set_column(
            column, table.schema.field(column), pa.array(payloads, pa.binary())
        )
        pq.write_table(table, path)
        return path.name
    raise AssertionError(f"no blob of checkpoint {checkpoint_id} under {table_dir}")


def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(job: Job) -> None:
    """The latest checkpoint's state is damaged after the job stopped: the next run reports
    it by id, restores the previous retained checkpoint, rolls the output back to it (its
    output was committed) and replays: exactly-once."""
    run = job.start()
    job.wait_processed_past_checkpoint(run)
    job.wait_checkpoint_after(run, job.latest_id())
    job.stop(run)
    store = DeltaCheckpointStore(job.root)
    *_, previous, latest = store.list_completed()
    damage_blob_of(job.args.root, latest.checkpoint_id, "flip")  # a missing file: store tests
    job.feed.append(300)
    resumed = job.start(available_now=True)
    assert resumed.wait(FINAL_RUN_TIMEOUT_S) == 0, resumed.tail()
    log = resumed.log.read_text()
    assert f"skipping damaged checkpoint {latest.checkpoint_id}" in log, log
    assert f"restored from: {previous.checkpoint_id})" in resumed.tail(3), resumed.tail()
    actual = output_rows(read_delta(job.args.output))
    assert actual == job.feed.expected(), diff(actual, job.feed.expected())


def test_no_intact_checkpoint_is_a_clear_error_and_changes_nothing(job: Job) -> None:
    run = job.start(retained=1)
    job.wait_processed_past_checkpoint(run)
    job.stop(run)
    [latest] = DeltaCheckpointStore(job.root).list_completed()
    damage_blob_of(job.args.root, latest.checkpoint_id, "flip")
    before = read_delta(job.args.output)
    failed = job.start(available_now=True)
    assert failed.wait(FINAL_RUN_TIMEOUT_S) == 1, failed.tail()
    last = failed.tail(1)
    assert last.startswith("error: ") and "no restorable checkpoint" in last, failed.tail()
    assert f"checkpoint {latest.checkpoint_id}" in last
    assert read_delta(job.args.output).equals(before)


def test_the_end_of_seconds_stops_with_no_stack_trace(job: Job) -> None:
    """The end of ``--seconds`` while micro-batches run: the job stops with a final
    checkpoint and its console shows no Java or Python stack trace. (Ctrl-C's console,
    stack traces included: ``test_console.py``.) Rows are fed from the start to the end, so
    micro-batches run whenever the duration ends, however slow the machine is."""
    run = job.start(seconds=15.0)
    while run.alive():
        job.feed.append(200)
        time.sleep(0.3)
    assert run.wait(180) == 0, run.tail()
    assert "stopped (duration)" in run.tail(3)
    assert_no_trace(run)
    job.drain_and_check()

"""Chaos benchmark: 100+ random faults against the main job, exactly-once checked from outside.

For each mode (aligned, unaligned, at-least-once by default) the main job
(``python -m spark_ckpt.testing.faulty_job``, the demo with fail points in its components:
Delta input table → keyed running count → Delta output) runs
in a subprocess on an input table that this script writes while the job runs: small batches
of random keys at a steady pace, every row recorded. That record is the oracle, and the only
one: for a key with *n* input rows the exactly-once output is the rows ``(key, 1) .. (key, n)``,
once each. Nothing the code under test computes enters it.

Faults are injected one after another, each only after the job recovered from the previous one
(a checkpoint completed after it) and a random pause:

==========================  ===========================================================
``driver-kill``             SIGKILL of the job, its JVM and Python workers; a new job
                            starts on the same root, output and input
``source-runner-kill``      the ``source-runner`` fail point kills Spark's Python streaming
                            source runner (the coordinator's process)
``worker-kill``             the ``source-read`` fail point kills a Python worker in ``read()``
``sink-commit-error``       the ``sink-commit`` fail point raises once: the coordinator's
                            thread fails, the query restarts
``store-commit-error``      the ``store-commit`` fail point raises once: one checkpoint fails
``storage-enospc``          the ``store-write`` fail point raises ENOSPC twice: checkpoints
                            are declined until storage "returns"
==========================  ===========================================================

Per fault: whether it hit (within ``hit_timeout_s``; otherwise it is disarmed and counted as
not hit), and the time from the fault (its hit record's ``time_ms``, or the kill) to the
completion (``CheckpointStats.completed_ms``) of the first checkpoint newer than the latest one
before the fault. After the faults the job is stopped (``spark-ckpt stop``), an
``--available-now`` run drains the rest of the input, and the output — read with ``deltalake``,
not with spark-ckpt — is compared with the oracle: rows lost (expected, missing), duplicated
(present more often than once) and wrong (cannot appear at all: an unknown key or a count
outside ``1 .. n``). Targets: nothing lost in any mode, nothing duplicated or wrong in the
exactly-once modes, and every job recovers by itself; the exit status is 1 when one is missed.

    .venv/bin/python bench/chaos.py          # 100 faults, writes bench/results/chaos.json
    .venv/bin/python bench/chaos.py --faults 6 --out /tmp/chaos.json
    .venv/bin/python bench/chaos.py --modes aligned --faults 10 --seed 3 --keep
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from spark_ckpt.coordination.runs import Runs
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.errors import SparkCkptError
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.storage.checkpoint_store import CompletedCheckpoints
from spark_ckpt.testing import faults
from spark_ckpt.testing.jobs import DemoArgs, DemoLauncher, DemoRun

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "chaos.json"
KINDS = (
    "driver-kill",
    "source-runner-kill",
    "worker-kill",
    "sink-commit-error",
    "store-commit-error",
    "storage-enospc",
)
MODES = ("aligned", "unaligned", "at-least-once")
EXACTLY_ONCE_MODES = ("aligned", "unaligned", "aligned-timeout")
#: Faults after which the job's restart strategy restarts the query once (the store faults
#: only fail or decline a checkpoint; a driver kill is followed by a new job).
RESTARTING = ("source-runner-kill", "worker-kill", "sink-commit-error")


@dataclass(frozen=True)
class Armed:
    """A fault injected through a fail point of :mod:`spark_ckpt.testing.faults`."""

    fault: faults.Fault
    action: faults.Action
    times: int = 1
    error: str = "store"


ARMED: dict[str, Armed] = {
    "source-runner-kill": Armed(faults.Fault.SOURCE_RUNNER, faults.Action.KILL),
    "worker-kill": Armed(faults.Fault.SOURCE_READ, faults.Action.KILL),
    "sink-commit-error": Armed(faults.Fault.SINK_COMMIT, faults.Action.RAISE),
    "store-commit-error": Armed(faults.Fault.STORE_COMMIT, faults.Action.RAISE),
    "storage-enospc": Armed(faults.Fault.STORE_WRITE, faults.Action.RAISE, 2, "enospc"),
}


@dataclass(frozen=True)
class Settings:
    """What a chaos run does (``--faults``, ``--modes``, ``--seed``, ``--interval``)."""

    faults: int = 100
    modes: tuple[str, ...] = MODES
    seed: int = 1
    keys: int = 300
    #: input: ``batch_rows`` random keys appended every ``pace_s``
    batch_rows: int = 20
    pace_s: float = 1.0
    #: checkpoint interval: long enough that faults land after rows were processed past the
    #: last completed checkpoint
    interval: str = "3s"
    #: random pause between a recovery and the next fault
    gap_s: tuple[float, float] = (0.5, 4.0)
    #: liveness bounds (not measurements)
    hit_timeout_s: float = 60.0
    recovery_timeout_s: float = 240.0
    stop_timeout_s: float = 180.0
    drain_timeout_s: float = 300.0
    #: a job's own time limit (``--seconds``): it never outlives an interrupted benchmark long
    job_limit_s: float = 3 * 3600.0


# -- results -------------------------------------------------------------------------------------


@dataclass
class FaultResult:
    """One injected fault and the job's recovery from it."""

    mode: str
    kind: str
    hit: bool
    hits: int
    #: wall clock (ms since the epoch) of the fault: the first hit record, or the kill
    fault_ms: int | None
    #: the latest completed checkpoint before the fault, and the first one after it
    before_id: int
    recovered_id: int | None = None
    #: fault → completion of the first checkpoint newer than ``before_id``
    recovery_ms: int | None = None
    #: sink output files written after the last checkpoint before the fault completed and not
    #: committed yet, at the fault: > 0 means rows were processed past that checkpoint
    staged_files: int | None = None
    #: the job's log (DemoLauncher's workdir) when the fault was injected
    log: str = ""


@dataclass
class Failure:
    """Something the product did that it should not have: a job that exited by itself, did
    not recover, did not stop, or whose drain run failed."""

    mode: str
    what: str
    after: str  # the fault kind in progress, or the phase
    log: str
    tail: str


@dataclass
class ModeResult:
    """One mode's run: its faults, failures, restarts and the comparison with the oracle."""

    mode: str
    faults: list[FaultResult] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    rows_in: int = 0
    rows_out: int = 0
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    examples: dict[str, list[list[int]]] = field(default_factory=dict)
    #: in-process restarts (the pipelines' restart strategy) and new jobs after a kill
    restarts: int = 0
    driver_kills: int = 0
    logs: list[str] = field(default_factory=list)
    #: every input row this script wrote, per key (the oracle)
    written: Counter[int] = field(default_factory=Counter)
    output: str = ""

    @property
    def exactly_once(self) -> bool:
        return self.mode in EXACTLY_ONCE_MODES

    def misses(self) -> list[str]:
        """The targets this mode missed."""
        out = [f"{self.mode}: {f.what} (after {f.after})" for f in self.failures]
        if self.lost:
            out.append(f"{self.mode}: {self.lost} rows lost")
        if self.exactly_once and self.duplicated:
            out.append(f"{self.mode}: {self.duplicated} rows duplicated")
        if self.exactly_once and self.wrong:
            out.append(f"{self.mode}: {self.wrong} wrong rows")
        return out


@dataclass
class ChaosResult:
    settings: Settings
    modes: list[ModeResult]

    def misses(self) -> list[str]:
        return [m for r in self.modes for m in r.misses()]


# -- the input: written by this script, recorded for the oracle ----------------------------------


class Feeder:
    """Appends ``batch_rows`` random keys to the input table every ``pace_s`` on a thread of
    its own, and counts every row it wrote."""

    def __init__(self, path: Path, s: Settings, rng: random.Random) -> None:
        self.path = path
        self.s = s
        self.rng = rng
        self.written: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-feeder", daemon=True)
        self._error: BaseException | None = None

    def append(self, rows: int) -> None:
        keys = [self.rng.randrange(self.s.keys) for _ in range(rows)]
        table = pa.table({"user_id": pa.array(keys, pa.int64())})
        write_deltalake(str(self.path), table, mode="append")
        self.written.update(keys)  # only once the commit succeeded

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.s.pace_s):
                self.append(self.s.batch_rows)
        except BaseException as e:  # surfaced by stop()
            self._error = e

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"appending input failed: {self._error!r}") from self._error


# -- one mode's job ------------------------------------------------------------------------------


class JobExited(Exception):
    """The job exited by itself."""


class Job:
    """The demo job of one mode, across driver kills: the current run and its checkpoints."""

    def __init__(self, launcher: DemoLauncher, args: DemoArgs) -> None:
        self.launcher = launcher
        self.args = args
        self.runs: list[DemoRun] = []
        self._store: CompletedCheckpoints | None = None

    @property
    def root(self) -> str:
        return str(self.args.root)

    @property
    def run(self) -> DemoRun:
        return self.runs[-1]

    def start(self, **overrides: Any) -> DemoRun:
        run = self.launcher.start(replace(self.args, **overrides))
        self.runs.append(run)
        return run

    def completed(self) -> list[CompletedCheckpoint]:
        """The completed checkpoints the store retains (empty before the first, and when the
        store cannot be read at this moment: the caller polls again)."""
        if self._store is None:
            if not (self.args.root / "checkpoints").exists():
                return []
            self._store = DeltaCheckpointStore(self.root)
        try:
            return self._store.list_completed()
        except (SparkCkptError, OSError):
            return []

    def latest_id(self) -> int:
        return max((c.checkpoint_id for c in self.completed()), default=0)

    def first_after(self, checkpoint_id: int, since_ms: int) -> CompletedCheckpoint | None:
        """The first checkpoint newer than *checkpoint_id* that completed at *since_ms* or
        later."""
        newer = [
            c
            for c in self.completed()
            if c.checkpoint_id > checkpoint_id and c.stats.completed_ms >= since_ms
        ]
        return min(newer, key=lambda c: c.checkpoint_id, default=None)

    def staged_files(self, fault_ms: int) -> int:
        """Parquet files in the output directory that the output table does not reference and
        that were written after the last checkpoint completed before *fault_ms*."""
        done = [c.stats.completed_ms for c in self.completed() if c.stats.completed_ms <= fault_ms]
        since_s = max(done, default=0) / 1000
        output = self.args.output
        if not DeltaTable.is_deltatable(str(output)):
            return 0
        committed = {uri.rsplit("/", 1)[-1] for uri in DeltaTable(str(output)).file_uris()}
        staged = 0
        for path in output.glob("*.parquet"):
            with contextlib.suppress(FileNotFoundError):
                staged += path.name not in committed and path.stat().st_mtime > since_s
        return staged

    def check_alive(self) -> None:
        if not self.run.alive():
            raise JobExited(f"job exited with status {self.run.popen.returncode}")

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.check_alive()
            time.sleep(min(0.2, left))

    def poll(self, found: Callable[[], Any], timeout_s: float) -> Any:
        """*found()* once it is truthy, polled while the job lives; None after *timeout_s*."""
        deadline = time.monotonic() + timeout_s
        while not (value := found()):
            self.check_alive()
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)
        return value


# -- faults --------------------------------------------------------------------------------------


def schedule(s: Settings, rng: random.Random) -> dict[str, list[str]]:
    """``s.faults`` kinds in shuffled rounds of every kind (so every kind occurs once there are
    at least as many faults as kinds), split evenly over the modes in order."""
    kinds: list[str] = []
    while len(kinds) < s.faults:
        round_ = list(KINDS)
        rng.shuffle(round_)
        kinds += round_
    out, start = {}, 0
    for i, mode in enumerate(s.modes):
        n = s.faults // len(s.modes) + (i < s.faults % len(s.modes))
        out[mode] = kinds[start : start + n]
        start += n
    return out


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class NotRecovered(Exception):
    """No checkpoint completed within the recovery bound."""


def first_hit_ms(job: Job, armed: Armed, s: Settings) -> int | None:
    """Wall clock of *armed*'s first hit, or None if it did not hit within the bound."""
    records = job.poll(lambda: faults.hits(job.root, armed.fault), s.hit_timeout_s)
    if not records:
        return None
    if "time_ms" not in records[0]:  # claimed, record not written yet
        time.sleep(0.2)
        records = faults.hits(job.root, armed.fault)
    return int(records[0].get("time_ms") or now_ms())


def strike(job: Job, fault: FaultResult, s: Settings) -> None:
    """Inject *fault*: kill the job and start a new one, or arm a fail point and wait for its
    first hit (at most ``s.hit_timeout_s``). Records when it struck, if it did."""
    armed = ARMED.get(fault.kind)
    if armed is None:  # driver-kill
        fault.fault_ms = now_ms()
        fault.staged_files = job.staged_files(fault.fault_ms)
        job.run.kill()
        job.start()
        fault.hit = True
        fault.hits = 1
        return
    faults.arm(job.root, armed.fault, armed.action, times=armed.times, error=armed.error)
    fault.fault_ms = first_hit_ms(job, armed, s)
    if fault.fault_ms is not None:
        fault.hit = True
        fault.staged_files = job.staged_files(fault.fault_ms)


def await_recovery(job: Job, fault: FaultResult, s: Settings) -> None:
    """Wait for the first checkpoint newer than ``fault.before_id`` completed after the
    fault; record it and the time from the fault to its completion."""
    since = fault.fault_ms or 0
    recovered: CompletedCheckpoint | None = job.poll(
        lambda: job.first_after(fault.before_id, since), s.recovery_timeout_s
    )
    if recovered is None:
        raise NotRecovered(
            f"no checkpoint after {fault.before_id} within {s.recovery_timeout_s:.0f} s"
        )
    fault.recovered_id = recovered.checkpoint_id
    fault.recovery_ms = recovered.stats.completed_ms - since


def retire(root: str, fault: faults.Fault) -> None:
    """Take *fault*'s marker away but keep its hit records, so that it cannot fire again.
    (``faults.disarm`` deletes the records too: a process that read the marker just before
    could then claim a hit anew — seen once in 100 faults as a source runner killed again
    right after recovery. The next ``arm`` clears the records, with no marker present.)"""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(root, faults.FAULTS_DIR, f"{fault.value}.json"))


def inject(job: Job, fault: FaultResult, s: Settings) -> None:
    """Inject *fault* (filled in as it goes) and wait until the job recovered from it; the
    fail point is retired afterwards, hit or not."""
    fault.before_id = job.latest_id()
    fault.log = job.run.log.name
    armed = ARMED.get(fault.kind)
    try:
        strike(job, fault, s)
        if fault.hit:
            await_recovery(job, fault, s)
    finally:
        if armed is not None:
            retire(job.root, armed.fault)
            fault.hits = len(faults.hits(job.root, armed.fault))


def replace_job(job: Job, s: Settings) -> None:
    """After a job exited or hung: kill what is left of it, start a new one and wait for its
    first checkpoint (raises JobExited / NotRecovered if that fails too)."""
    job.run.kill()
    before = job.latest_id()
    job.start()
    if job.poll(lambda: job.latest_id() > before, s.recovery_timeout_s) is None:
        raise NotRecovered(f"a new job completed no checkpoint within {s.recovery_timeout_s} s")


def failure(job: Job, mode: str, what: str, after: str) -> Failure:
    run = job.run
    return Failure(mode, what, after, str(run.log), run.tail(60))


def fault_loop(
    job: Job,
    res: ModeResult,
    kinds: Sequence[str],
    s: Settings,
    rng: random.Random,
    log: Callable[[str], None],
) -> None:
    """Start the job, then inject *kinds* one after another; a job that exits or does not
    recover is recorded as a failure and replaced."""

    def replace_after(error: Exception, after: str) -> None:
        res.failures.append(failure(job, res.mode, str(error), after))
        log(f"  {res.mode}: FAILURE after {after}: {error} (log {job.run.log})")
        replace_job(job, s)

    job.start()
    try:
        if job.poll(lambda: job.latest_id() > 0, s.recovery_timeout_s) is None:
            raise NotRecovered(f"no first checkpoint within {s.recovery_timeout_s:.0f} s")
    except (JobExited, NotRecovered) as e:
        replace_after(e, "start")
    after = "start"
    for i, kind in enumerate(kinds):
        try:
            job.sleep(rng.uniform(*s.gap_s))
        except JobExited as e:
            replace_after(e, f"{after} (between faults)")
        fault = FaultResult(res.mode, kind, hit=False, hits=0, fault_ms=None, before_id=0)
        res.faults.append(fault)
        after = kind
        try:
            inject(job, fault, s)
        except (JobExited, NotRecovered) as e:
            replace_after(e, kind)
            continue
        log(f"  [{res.mode} {i + 1}/{len(kinds)}] {describe(fault)}")


def describe(f: FaultResult) -> str:
    if not f.hit:
        return f"{f.kind}: not hit"
    return (
        f"{f.kind}: hit {f.hits}x, {f.staged_files} staged files, checkpoint {f.before_id} -> "
        f"{f.recovered_id} {f.recovery_ms} ms after the fault"
    )


def stop(job: Job, res: ModeResult, s: Settings) -> None:
    """``spark-ckpt stop`` from a subprocess; the job must stop with a final checkpoint."""
    if not job.run.alive():
        res.failures.append(failure(job, res.mode, "job not running at the stop", "stop"))
        return
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_ckpt.cli",
            "stop",
            "--root",
            job.root,
            "--timeout",
            str(s.stop_timeout_s),
        ],
        capture_output=True,
        text=True,
        timeout=s.stop_timeout_s + 60,
        check=False,
    )
    try:
        code = job.run.popen.wait(120 if done.returncode == 0 else 1)
    except subprocess.TimeoutExpired:
        code = None
    if done.returncode != 0 or code != 0 or "stopped (stop)" not in job.run.tail(5):
        what = f"stop: cli status {done.returncode} ({done.stderr.strip()}), job status {code}"
        res.failures.append(failure(job, res.mode, what, "stop"))
    job.run.kill()  # no-op when it stopped


def drain(job: Job, res: ModeResult, s: Settings) -> None:
    """An ``--available-now`` run reads the rest of the input and ends with a final
    checkpoint."""
    run = job.start(available_now=True)
    try:
        code = run.wait(s.drain_timeout_s)
    except AssertionError:
        code = None
    if code != 0:
        res.failures.append(failure(job, res.mode, f"drain run status {code}", "drain"))


# -- the oracle ----------------------------------------------------------------------------------


def read_output(path: str) -> Counter[tuple[int, int]]:
    """The ``(user_id, count)`` rows of the output table, read with deltalake (not spark-ckpt)."""
    if not DeltaTable.is_deltatable(path):
        return Counter()
    table = DeltaTable(path).to_pyarrow_table(columns=["user_id", "count"])
    keys, counts = table.column("user_id").to_pylist(), table.column("count").to_pylist()
    return Counter(zip(keys, counts, strict=True))


def compare(res: ModeResult) -> None:
    """Rows in/out, lost, duplicated and wrong against the running count over the input."""
    actual = read_output(res.output)
    written = res.written

    def valid(row: tuple[Any, Any]) -> bool:
        key, count = row
        return isinstance(count, int) and 1 <= count <= written.get(key, 0)

    lost = [[k, i] for k, n in written.items() for i in range(1, n + 1) if actual[(k, i)] == 0]
    duplicated = [[*row, c] for row, c in actual.items() if valid(row) and c > 1]
    wrong = [[*row, c] for row, c in actual.items() if not valid(row)]
    res.rows_in, res.rows_out = written.total(), actual.total()
    res.lost = len(lost)
    res.duplicated = sum(c - 1 for *_, c in duplicated)
    res.wrong = sum(c for *_, c in wrong)
    res.examples = {
        "lost": sorted(lost)[:10],
        "duplicated": sorted(duplicated)[:10],
        "wrong": sorted(wrong)[:10],
    }


def count_restarts(res: ModeResult, job: Job) -> None:
    """In-process restarts: the runs (``_runs/*/status.json``) a job's restart strategy
    started, i.e. every attempt after the first; driver kills: new jobs after a kill."""
    res.logs = [str(r.log) for r in job.runs]
    res.restarts = sum(status.attempt > 1 for status in Runs(job.root).statuses())
    res.driver_kills = sum(f.kind == "driver-kill" and f.hit for f in res.faults)


# -- one mode, all modes -------------------------------------------------------------------------


def run_mode(
    mode: str,
    kinds: Sequence[str],
    s: Settings,
    launcher: DemoLauncher,
    rng: random.Random,
    log: Callable[[str], None],
) -> ModeResult:
    base = launcher.workdir / mode
    base.mkdir(parents=True, exist_ok=True)
    res = ModeResult(mode, output=str(base / "output"))
    feeder = Feeder(base / "input", s, random.Random(rng.random()))
    feeder.append(5 * s.batch_rows)  # the input table must exist before the job starts
    args = DemoArgs(
        root=base / "root",
        output=base / "output",
        mode=mode,
        pipeline="chaos",
        input=base / "input",
        channels=3,
        interval=s.interval,
        restarts=1_000_000,
        restart_delay="500ms",
        retained=3,
        tolerable_failures=1_000_000,
        seconds=s.job_limit_s,
    )
    job = Job(launcher, args)
    log(f"{mode}: {len(kinds)} faults, work in {base}")
    feeder.start()
    try:
        try:
            fault_loop(job, res, kinds, s, rng, log)
        except (JobExited, NotRecovered) as e:  # a replacement job failed too: give up
            res.failures.append(failure(job, mode, f"mode aborted: {e}", "replacing a job"))
        stop(job, res, s)
    finally:
        feeder.stop()
    drain(job, res, s)
    res.written = feeder.written
    compare(res)
    count_restarts(res, job)
    return res


def run_chaos(
    s: Settings,
    launcher: DemoLauncher,
    log: Callable[[str], None] = print,
    after_mode: Callable[[ChaosResult], object] | None = None,
) -> ChaosResult:
    """The chaos run: every mode of *s* in turn, jobs started by *launcher* (whose workdir
    holds the tables and the jobs' logs); *after_mode* sees the result so far after each
    mode. The caller cleans the launcher up."""
    rng = random.Random(s.seed)
    plan = schedule(s, rng)
    result = ChaosResult(s, [])
    for mode in s.modes:
        result.modes.append(run_mode(mode, plan[mode], s, launcher, rng, log))
        if after_mode is not None:
            after_mode(result)
    return result


# -- report --------------------------------------------------------------------------------------


def percentile(values: Sequence[int], q: float) -> int | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def fault_stats(fs: Sequence[FaultResult]) -> dict[str, Any]:
    recovery = [f.recovery_ms for f in fs if f.recovery_ms is not None]
    return {
        "injected": len(fs),
        "hit": sum(f.hit for f in fs),
        "staged": sum(bool(f.staged_files) for f in fs),
        "recovery_ms_p50": percentile(recovery, 0.5),
        "recovery_ms_p95": percentile(recovery, 0.95),
        "recovery_ms_max": max(recovery, default=None),
    }


def summary(modes: Sequence[ModeResult]) -> dict[str, Any]:
    fs = [f for m in modes for f in m.faults]
    return {
        **fault_stats(fs),
        "by_kind": {k: fault_stats([f for f in fs if f.kind == k]) for k in KINDS},
        "rows_in": sum(m.rows_in for m in modes),
        "rows_out": sum(m.rows_out for m in modes),
        "lost": sum(m.lost for m in modes),
        "duplicated": sum(m.duplicated for m in modes),
        "wrong": sum(m.wrong for m in modes),
        "restarts": sum(m.restarts for m in modes),
        "expected_restarts": sum(f.hit and f.kind in RESTARTING for f in fs),
        "driver_kills": sum(m.driver_kills for m in modes),
        "failures": sum(len(m.failures) for m in modes),
    }


def report(result: ChaosResult) -> dict[str, Any]:
    """The JSON report (without machine info and timing)."""
    return {
        "settings": asdict(result.settings),
        "modes": {
            m.mode: {**summary([m]), "examples": m.examples, "logs": m.logs} for m in result.modes
        },
        "totals": summary(result.modes),
        "faults": [asdict(f) for m in result.modes for f in m.faults],
        "failures": [asdict(f) for m in result.modes for f in m.failures],
        "misses": result.misses(),
    }


def _ms(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def render(rep: dict[str, Any]) -> str:
    s = rep["settings"]
    rows = {**rep["modes"], "total": rep["totals"]}
    lines = [
        f"Chaos: {s['faults']} faults over {', '.join(s['modes'])} (seed {s['seed']}); input "
        f"{s['batch_rows']} rows every {s['pace_s']} s over {s['keys']} keys; checkpoints "
        f"every {s['interval']}",
        "",
        f"{'mode':<14}{'faults':>7}{'hit':>5}{'rows in':>9}{'rows out':>10}{'lost':>6}"
        f"{'dup':>6}{'wrong':>7}{'restarts/exp':>14}{'kills':>7}{'staged':>8}"
        f"{'fault->ckpt p50':>17}{'p95 ms':>9}",
    ]
    for name, r in rows.items():
        restarts = f"{r['restarts']}/{r['expected_restarts']}"
        lines.append(
            f"{name:<14}{r['injected']:>7}{r['hit']:>5}{r['rows_in']:>9,}{r['rows_out']:>10,}"
            f"{r['lost']:>6}{r['duplicated']:>6}{r['wrong']:>7}{restarts:>14}"
            f"{r['driver_kills']:>7}{r['staged']:>8}{_ms(r['recovery_ms_p50']):>17}"
            f"{_ms(r['recovery_ms_p95']):>9}"
        )
    lines += [
        "",
        f"{'fault (injected/hit)':<22}"
        + "".join(f"{n:>15}" for n in rows)
        + f"{'fault->ckpt p50':>17}{'p95 ms':>9}",
    ]
    for kind in KINDS:
        cells = "".join(
            f"{r['by_kind'][kind]['injected']}/{r['by_kind'][kind]['hit']}".rjust(15)
            for r in rows.values()
        )
        k = rep["totals"]["by_kind"][kind]
        lines.append(
            f"{kind:<22}{cells}{_ms(k['recovery_ms_p50']):>17}{_ms(k['recovery_ms_p95']):>9}"
        )
    lines += [
        "",
        "restarts/exp: in-process restarts by the job's restart strategy / expected (one per",
        f"  {', '.join(RESTARTING)} that hit)",
        "kills: driver kills, each followed by a new job",
        "staged: faults that struck while the sink had staged output written after the last",
        "  completed checkpoint (rows processed past it)",
    ]
    for f in rep["failures"]:
        lines.append(f"FAILURE {f['mode']} after {f['after']}: {f['what']} (log {f['log']})")
    lines += [f"MISSED {m}" for m in rep["misses"]] or ["all targets met"]
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    """The machine info of the Spark benches (:func:`benchcommon.spark_machine_info`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchcommon import spark_machine_info

    return spark_machine_info()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", type=int, default=Settings.faults, help="total, over all modes")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated demo modes")
    p.add_argument("--seed", type=int, default=Settings.seed)
    p.add_argument("--interval", default=Settings.interval, help="checkpoint interval")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    p.add_argument("--workdir", type=Path, help="tables and job logs (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the workdir even when all is well")
    args = p.parse_args(argv)
    s = Settings(
        faults=args.faults,
        modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
        seed=args.seed,
        interval=args.interval,
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spark-ckpt-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    started = time.monotonic()
    loadavg_start = os.getloadavg()

    def write(result: ChaosResult, complete: bool, survivors: Sequence[int] = ()) -> dict[str, Any]:
        """The JSON report, rewritten after every mode (a cut-short run keeps its modes)."""
        rep: dict[str, Any] = {
            "complete": complete,
            "machine": machine_info(),
            "loadavg_start": loadavg_start,
            "loadavg_end": os.getloadavg(),
            "elapsed_s": round(time.monotonic() - started, 1),
            "workdir": str(workdir),
            **report(result),
        }
        if survivors:
            rep["misses"].append(f"processes outlived their jobs: {list(survivors)}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rep, indent=2) + "\n")
        return rep

    # SIGTERM ends the run through the finally below: no job outlives it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    launcher = DemoLauncher(workdir.resolve())
    try:
        result = run_chaos(s, launcher, log, after_mode=lambda r: write(r, complete=False))
    finally:
        survivors = launcher.cleanup()
    rep = write(result, complete=True, survivors=survivors)
    print(render(rep))
    print(f"wrote {args.out} in {rep['elapsed_s']:.0f} s")
    if rep["misses"] or args.keep:
        print(f"job logs and tables kept in {workdir}")
    elif args.workdir is None:
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)
    return 1 if rep["misses"] else 0


if __name__ == "__main__":
    sys.exit(main())

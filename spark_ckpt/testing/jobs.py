"""The main job in subprocesses, for crash tests and the chaos benchmark: start it with options
(:class:`DemoArgs`), kill it the way a machine crash does (the job, its JVM and Spark's Python
workers at once), wait for it, and make sure nothing of it outlives its test
(:meth:`DemoLauncher.cleanup`).

Each job is :mod:`spark_ckpt.demo` with the faulty components of
:mod:`spark_ckpt.testing.faults` (``python -m spark_ckpt.testing.faulty_job``), in a session
of its own, so a test or benchmark can arm them for the job's root
(:func:`spark_ckpt.testing.faults.arm`); its JVMs get the options of
:mod:`spark_ckpt.testing.jvm`. Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from spark_ckpt.sources.generator import GeneratorSpec
from spark_ckpt.testing.jvm import jvm_options
from spark_ckpt.testing.processes import kill_session, processes_under, session_processes

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# -- the demo job in a subprocess ----------------------------------------------------------


@dataclass(frozen=True)
class DemoArgs:
    """Command-line options of ``python -m spark_ckpt.demo`` (see :mod:`spark_ckpt.demo`)."""

    #: a local path, or an object-store URI (``s3://...``: the job's environment must point
    #: at the store, as the launcher's does when the test sets it)
    root: Path | str
    output: Path | str
    mode: str = "aligned"
    pipeline: str = "crash"
    rate: float = 0.0
    backlog: str = "1000"
    channels: int = 3
    keys: int = 50
    seed: int = 7
    interval: str = "300ms"
    aligned_timeout: str = "200ms"
    max_rows_per_trigger: int | None = None
    barrier_placement: str = "read"
    available_now: bool = False
    seconds: float = 600.0
    #: tail this Delta table instead of the generator (``--input``)
    input: Path | None = None
    restarts: int = 3
    restart_delay: str = "1s"
    retained: int = 2
    tolerable_failures: int = 3
    retention: str = "RETAIN_ON_CANCELLATION"
    parallelism: int = 2
    #: where the subtasks run (``--placement``): ``driver`` or ``executors``
    placement: str = "executors"
    #: classic Spark's master (``--master``) and further Spark settings (``--conf``)
    master: str = "local[2]"
    conf: tuple[str, ...] = ()
    #: run under Spark Connect (``--remote``), e.g. ``"local[2]"``; None: classic Spark
    remote: str | None = None
    #: default directory of savepoints (``--savepoint-dir``)
    savepoint_dir: Path | None = None
    #: read Kafka at these brokers (``--kafka``) instead of the generator, the topics
    #: matching ``kafka_pattern`` (``--subscribe-pattern``)
    kafka: str | None = None
    kafka_pattern: str = ".*"
    #: the Kafka values are JSON with a ``user_id`` (``--kafka-json``)
    kafka_json: bool = False
    #: read JSON-lines files landing in this directory (``--files``), archiving each into
    #: ``files_archive`` once a checkpoint covers it (``--files-archive``)
    files: Path | None = None
    files_archive: Path | None = None
    #: event-time tumbling windows of this size instead of the running count (``--window``)
    window: str | None = None
    out_of_orderness: str = "1s"
    #: processing-time follow-ups this long after a user's first row (``--follow-up``)
    follow_up: str | None = None
    #: ``"join"``: the interval join of two generated inputs (``--job``, ``--join-interval``)
    job: str = "count"
    join_interval: str = "1s"
    #: ``job="stages"``: the second stage's parallelism (None: ``parallelism``)
    stage_parallelism: int | None = None
    #: where the subtasks keep their keyed state (``--state-backend``)
    state_backend: str = "hashmap"
    #: further command-line arguments (e.g. ``("--restore-savepoint", path)``)
    extra: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The job's command line: the faulty job with :meth:`options`."""
        return [sys.executable, "-m", "spark_ckpt.testing.faulty_job", *self.options()]

    def options(self) -> list[str]:
        """The job's options, as the demo takes them."""
        args = [
            "--pipeline",
            self.pipeline,
            "--root",
            str(self.root),
            "--output",
            str(self.output),
            "--mode",
            self.mode,
            "--rate",
            repr(self.rate),
            "--backlog",
            self.backlog,
            "--channels",
            str(self.channels),
            "--keys",
            str(self.keys),
            "--seed",
            str(self.seed),
            "--interval",
            self.interval,
            "--aligned-timeout",
            self.aligned_timeout,
        ]
        args += [
            "--state-backend",
            self.state_backend,
            "--restarts",
            str(self.restarts),
            "--restart-delay",
            self.restart_delay,
            "--retained",
            str(self.retained),
            "--tolerable-failures",
            str(self.tolerable_failures),
            "--retention",
            self.retention,
            "--parallelism",
            str(self.parallelism),
            "--placement",
            self.placement,
            "--master",
            self.master,
        ]
        for setting in self.conf:
            args += ["--conf", setting]
        if self.input is not None:
            args += ["--input", str(self.input)]
        if self.kafka is not None:
            args += ["--kafka", self.kafka, "--subscribe-pattern", self.kafka_pattern]
            if self.kafka_json:
                args.append("--kafka-json")
        if self.files is not None:
            args += ["--files", str(self.files)]
        if self.files_archive is not None:
            args += ["--files-archive", str(self.files_archive)]
        if self.remote is not None:
            args += ["--remote", self.remote]
        if self.window is not None:
            args += ["--window", self.window, "--out-of-orderness", self.out_of_orderness]
        if self.follow_up is not None:
            args += ["--follow-up", self.follow_up]
        if self.job != "count":
            args += ["--job", self.job, "--join-interval", self.join_interval]
            args += ["--out-of-orderness", self.out_of_orderness]
        if self.stage_parallelism is not None:
            args += ["--stage-parallelism", str(self.stage_parallelism)]
        if self.savepoint_dir is not None:
            args += ["--savepoint-dir", str(self.savepoint_dir)]
        if self.max_rows_per_trigger is not None:
            args += ["--max-rows-per-trigger", str(self.max_rows_per_trigger)]
            args += ["--barrier-placement", self.barrier_placement]
        if self.available_now:
            args.append("--available-now")
        else:
            args += ["--seconds", repr(self.seconds)]
        return args + list(self.extra)

    @property
    def runs_in_a_shared_session(self) -> bool:
        """Whether :meth:`run_in` can run this job in a session of the caller's: classic
        Spark with no settings of its own, the root and output local (an object store's
        credentials are in a job's own environment, not in a running session's workers)."""
        remote_paths = "://" in str(self.root) or "://" in str(self.output)
        return self.remote is None and not self.conf and not remote_paths

    def run_in(self, spark: SparkSession) -> int:
        """The job (with the fail points of :mod:`spark_ckpt.testing.faults`, armed or not)
        on *spark*, a classic session of the calling process, instead of in a process of its
        own; returns the job's exit status. For the final run of a crash test: a driver
        other than the killed ones restores what they left, without a JVM to start. Only
        when :attr:`runs_in_a_shared_session`; the session's master is the job's."""
        from spark_ckpt.demo import run_in
        from spark_ckpt.testing.faults import COMPONENTS

        if not self.runs_in_a_shared_session:
            raise ValueError("this job needs a process of its own (see runs_in_a_shared_session)")
        return run_in(spark, self.options(), COMPONENTS)

    def spec(self) -> GeneratorSpec:
        """The generator behind the job's input (same parsing rules as the job's options)."""
        return GeneratorSpec.from_options(
            {
                "seed": str(self.seed),
                "channels": str(self.channels),
                "rate": repr(self.rate),
                "backlog": self.backlog,
                "keys": str(self.keys),
            }
        )


@dataclass
class DemoRun:
    """One started job: its process (a session leader) and its combined output log."""

    args: DemoArgs
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def sid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group at once (as a machine crash would), then sweep
        the rest of the session; waits until all of it is gone."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.sid, signal.SIGKILL)
        self.popen.wait()
        kill_session(self.sid)

    def wait(self, timeout_s: float) -> int:
        """Wait for a normal exit; on timeout kill it and fail with the log's tail."""
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired as e:
            self.kill()
            raise AssertionError(f"job did not finish within {timeout_s} s\n{self.tail()}") from e

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class DemoLauncher:
    """Starts jobs under *workdir*; remembers every session for the teardown check."""

    workdir: Path
    runs: list[DemoRun] = field(default_factory=list)

    def start(self, args: DemoArgs) -> DemoRun:
        log = self.workdir / f"run-{len(self.runs)}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                args.argv(),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={
                    **os.environ,
                    "PYTHONUNBUFFERED": "1",
                    "JAVA_TOOL_OPTIONS": jvm_options(),
                },
            )
        run = DemoRun(args, popen, log)
        self.runs.append(run)
        return run

    def wait_until(
        self, run: DemoRun, predicate: Callable[[], bool], timeout_s: float, what: str
    ) -> None:
        """Poll *predicate* while *run* is alive; fail (with the log) if the run exits or
        *timeout_s* passes first. A liveness bound, not a timing assertion."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if not run.alive():
                raise AssertionError(
                    f"job exited ({run.popen.returncode}) before {what}\n{run.tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout_s} s\n{run.tail()}")
            time.sleep(0.5)

    def cleanup(self) -> list[int]:
        """Kill what is still running; return the pids that survive (should be none)."""
        for run in self.runs:
            if run.alive():
                run.kill()
        survivors = []
        for run in self.runs:
            try:
                kill_session(run.sid)
            except AssertionError:
                survivors.extend(session_processes(run.sid))
        return survivors + [p for p in processes_under(self.workdir) if p not in survivors]

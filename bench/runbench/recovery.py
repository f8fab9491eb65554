"""The recovery bench (``bench/recovery.py``, #16 "Recovery"): from a SIGKILL to the next
completed checkpoint, with a state of 10M keys.

One process: a savepoint of ``state_keys`` keys of the running count's state (as in
:mod:`runbench.state_size`) is restored into the keyed running count on the executors
(``Pipeline.run``, ``placement="executors"``, ``master``, exactly-once checkpoints every
``interval_ms``), fed by the generator at ``rate`` rows/s over ``hot_keys`` keys. After
``warmup_checkpoints`` completed checkpoints a killer thread (the bench's, not the product's)
SIGKILLs the executor's Python workers (the children of PySpark's worker daemon: the
processes that run the source's ``read()`` and hand the subtasks' rows to the subtask hosts,
which are not killed), at a moment one of them is
running a task (its CPU time advancing), ``kills`` times, each after the
run completed ``between`` checkpoints triggered after the previous kill. A kill fails the
micro-batch in flight (Spark fails the query: a local master does not retry tasks);
``Pipeline.run`` restarts the run from the latest completed checkpoint (a fixed-delay
restart strategy without delay; the subtasks restore their key groups of the 10M keys).

**Recovery** of a kill: from the kill to the completion of the first checkpoint *triggered*
after it (a consistent cut that includes work done after the failure). Reported: every kill
(time, processes killed, recovery ms), p50 / min / max, the run's restarts and failures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchcommon import PIPELINE, git_info, spark_machine_info

from runbench.procstat import cmdline, descendants, parent, process_cpu_s
from runbench.state_size import hot_set_source, write_state
from spark_ckpt.protocol.barrier import SnapshotType

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results" / "recovery.json"


@dataclass(frozen=True)
class RecoverySettings:
    state_keys: int
    hot_keys: int
    rate: int  # input rows per second, over all channels
    channels: int
    parallelism: int
    master: str
    interval_ms: int
    warmup_checkpoints: int
    kills: int
    between: int  # checkpoints triggered after a kill's recovery before the next kill
    timeout_s: float


FULL = RecoverySettings(
    state_keys=10_000_000,
    hot_keys=100_000,
    rate=100_000,
    channels=2,
    parallelism=2,
    master="local[2]",
    interval_ms=1000,
    warmup_checkpoints=3,
    kills=5,
    between=2,
    timeout_s=1800.0,
)
QUICK = replace(FULL, state_keys=1_000_000, kills=2, timeout_s=600.0)


def python_workers(jvm_pid: int) -> list[int]:
    """The Python workers the executor forked: children of PySpark's worker daemon."""
    below = descendants(jvm_pid)
    daemons = {p for p in below if "pyspark.daemon" in cmdline(p) and parent(p) == jvm_pid}
    return [p for p in below if parent(p) in daemons]


class Killer(threading.Thread):
    """The bench's fault injector: SIGKILLs the Python workers at the times the module
    docstring says, and records each kill and its recovery."""

    def __init__(self, s: RecoverySettings, pipeline: Any, jvm_pid: int, started_ms: float):
        super().__init__(name="recovery-killer", daemon=True)
        self.s = s
        self.pipeline = pipeline
        self.jvm_pid = jvm_pid
        self.started_ms = started_ms
        self.kills: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def _completed(self) -> list[Any]:
        return [
            r
            for r in self.pipeline.client.history()
            if r.stats is not None
            and r.snapshot_type is SnapshotType.CHECKPOINT
            and r.stats.trigger_ms >= self.started_ms
        ]

    def _wait(self, count: int, after_ms: float, deadline: float) -> Any:
        """The *count*-th completed checkpoint triggered after *after_ms* (epoch ms)."""
        while time.monotonic() < deadline:
            done = sorted(
                (r for r in self._completed() if r.stats.trigger_ms >= after_ms),
                key=lambda r: r.stats.trigger_ms,
            )
            if len(done) >= count:
                return done[count - 1]
            time.sleep(0.1)
        raise TimeoutError(f"no {count} checkpoints after {after_ms}")

    def _in_flight(self, deadline: float) -> tuple[list[int], int]:
        """The Python workers, once at least one of them is running a task (its CPU time
        advanced over 20 ms: a kill then lands in the middle of a micro-batch), and how
        many were."""
        while time.monotonic() < deadline:
            workers = python_workers(self.jvm_pid)
            before = {p: process_cpu_s(p) for p in workers}
            time.sleep(0.02)
            busy = [p for p in workers if process_cpu_s(p) > before[p]]
            if busy:
                return workers, len(busy)
        raise TimeoutError("no Python worker ran a task")

    def run(self) -> None:
        deadline = time.monotonic() + self.s.timeout_s
        try:
            self._wait(self.s.warmup_checkpoints, self.started_ms, deadline)
            for _ in range(self.s.kills):
                victims, busy = self._in_flight(deadline)
                kill_ms = time.time() * 1000
                for pid in victims:
                    with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                        os.kill(pid, signal.SIGKILL)
                first = self._wait(1, kill_ms, deadline)
                recovery_ms = first.stats.completed_ms - kill_ms
                self.kills.append(
                    {
                        "kill_ms": kill_ms,
                        "killed": len(victims),
                        "busy": busy,
                        "checkpoint": first.checkpoint_id,
                        "recovery_ms": recovery_ms,
                    }
                )
                print(
                    f"  kill {len(self.kills)}: {len(victims)} Python workers; checkpoint "
                    f"{first.checkpoint_id} completed {recovery_ms:,.0f} ms later",
                    file=sys.stderr,
                    flush=True,
                )
                self._wait(self.s.between, first.stats.completed_ms, deadline)
        except BaseException as e:  # reported by the bench's main thread
            self.error = e
        finally:
            try:
                self.pipeline.client.stop(timeout_s=300)
            except Exception as e:  # the run may have ended already
                print(f"  stop: {e}", file=sys.stderr, flush=True)


def run_bench(s: RecoverySettings) -> dict[str, Any]:
    from runbench.procstat import jvm_pid
    from spark_ckpt.pipeline.pipeline import Pipeline
    from spark_ckpt.runtime.config import CheckpointConfig
    from spark_ckpt.runtime.operator import RunningCount
    from spark_ckpt.runtime.restart import FixedDelayRestart
    from spark_ckpt.runtime.restore_settings import RestoreSettings
    from spark_ckpt.spark.session.builders import local_session

    root = tempfile.mkdtemp(prefix="recovery-")
    savepoint = os.path.join(root, "savepoint")
    write_s = write_state(savepoint, s.state_keys, s.parallelism)
    spark = local_session(
        "spark-ckpt-recovery", master=s.master, shuffle_partitions=s.parallelism, log_level="ERROR"
    )
    pid = jvm_pid()
    if pid is None:
        raise RuntimeError("the recovery bench needs classic Spark (a JVM it started)")
    pipeline = Pipeline(
        spark,
        PIPELINE,
        config=CheckpointConfig(
            interval_ms=s.interval_ms,
            retained_checkpoints=2,
            restart_strategy=FixedDelayRestart(attempts=s.kills + 2, delay_ms=0),
        ),
        root=os.path.join(root, "pipeline"),
    )
    source = hot_set_source(s.channels, s.rate, s.hot_keys)
    started_ms = time.time() * 1000
    killer = Killer(s, pipeline, pid, started_ms)
    killer.start()
    try:
        result = pipeline.run(
            source,
            RunningCount("counter", "user_id"),
            output=os.path.join(root, "out"),
            parallelism=s.parallelism,
            placement="executors",
            restore=RestoreSettings.savepoint(savepoint),
            duration_s=s.timeout_s,
        )
    finally:
        killer.join(timeout=60)
        spark.stop()
    if killer.error is not None:
        raise killer.error
    recoveries = [k["recovery_ms"] for k in killer.kills]
    return {
        "savepoint_write_s": write_s,
        "kills": killer.kills,
        "recovery_ms_p50": statistics.median(recoveries),
        "recovery_ms_min": min(recoveries),
        "recovery_ms_max": max(recoveries),
        "restarts": result.restarts,
        "failures": list(result.failures),
        "checkpoints_completed": result.checkpoints_completed,
        "checkpoints_failed": result.checkpoints_failed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--kills", type=int, default=None)
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    if args.kills is not None:
        s = replace(s, kills=args.kills)
    out = args.out or (Path("/tmp/recovery_quick.json") if args.quick else DEFAULT_OUT)
    started = time.monotonic()
    bench = run_bench(s)
    result = {
        "quick": args.quick,
        "machine": spark_machine_info(),
        "git": git_info(),
        "settings": asdict(s),
        "elapsed_s": round(time.monotonic() - started, 1),
        **bench,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"recovery from SIGKILL of the Python workers, {s.state_keys:,} keys: p50 "
        f"{bench['recovery_ms_p50']:,.0f} ms (min {bench['recovery_ms_min']:,.0f}, max "
        f"{bench['recovery_ms_max']:,.0f}) over {len(bench['kills'])} kills; "
        f"{bench['restarts']} restarts"
    )
    print(f"written: {out}")
    return 0

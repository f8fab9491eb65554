"""The state-size bench (``bench/state_size.py``, #16 "State size"): does a checkpoint cost
follow the change or the state, and does the driver's memory grow with the state?

One **cell** per state size, each in a subprocess of its own (its own SparkSession, so its
driver's RSS is its own): a savepoint holding ``state_keys`` keys of the running count's
state (written offline, :class:`~spark_ckpt.offline.SavepointWriter`) is restored into the
keyed running count on the executors (``placement="executors"``, ``parallelism`` subtasks,
``master``), exactly-once checkpoints every ``interval_ms``; the input is the generator at
``rate`` rows/s over a hot set of ``hot_keys`` keys (keys ``0 .. hot_keys - 1``, all in the
restored state), so every cell makes the same updates between checkpoints whatever its
state's size. After ``warmup_checkpoints`` completed checkpoints of the run (the restore's
first, full, snapshot among them: a restore from a savepoint never builds on its blobs),
the next ``checkpoints`` checkpoints are measured:

* their duration (trigger to completion), and the bytes they wrote (``bytes_written``:
  what the checkpoint uploaded; the state it references is ``state_bytes``);
* the driver's RSS (this cell's Python process, which runs ``Pipeline.start``, and Spark's
  JVM, which in local mode also hosts the executor: its heap holds only the subtasks'
  fences) at the start of the window and its peak over it; the executors' Python workers'
  RSS (where the state lives) for comparison.

Cells alternate (``100k, 10M, 100k, 10M, ...``, ``reps`` times each). Reported: per cell the
median and mean checkpoint duration and bytes, and the ratios of the largest state to the
smallest (median over repetitions, min-max); the driver's RSS at each size and the
difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchcommon import PIPELINE, git_info, spark_machine_info

from runbench.procstat import cmdline, descendants, rss_mb
from spark_ckpt.protocol.barrier import SnapshotType

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results" / "state_size.json"
ENTRY = Path(__file__).resolve().parent.parent / "state_size.py"


@dataclass(frozen=True)
class StateSizeSettings:
    states: tuple[int, ...]  # keys in the restored state, one cell each
    hot_keys: int  # the keys the input updates (a prefix of every state)
    rate: int  # input rows per second, over all channels
    channels: int
    parallelism: int
    master: str
    interval_ms: int
    warmup_checkpoints: int  # completed checkpoints before the window
    checkpoints: int  # measured checkpoints per cell
    reps: int
    timeout_s: float
    state_backend: str = "hashmap"  # state.backend.type of the pipeline

    def __post_init__(self) -> None:
        if self.hot_keys > min(self.states):
            raise ValueError("the hot set must be part of every state")


FULL = StateSizeSettings(
    states=(100_000, 10_000_000),
    hot_keys=100_000,
    rate=100_000,
    channels=2,
    parallelism=2,
    master="local[2]",
    interval_ms=1000,
    warmup_checkpoints=5,
    checkpoints=30,
    reps=2,
    timeout_s=1200.0,
)
QUICK = replace(
    FULL, states=(100_000, 1_000_000), checkpoints=8, warmup_checkpoints=4, reps=1, timeout_s=600
)


def write_state(path: str, keys: int, parallelism: int) -> float:
    """A savepoint of the running count's state: *keys* keys, count 1 each. Returns the
    seconds it took."""
    import numpy as np
    import pyarrow as pa

    from spark_ckpt.offline import SavepointWriter

    started = time.perf_counter()
    table = pa.table({"key": np.arange(keys, dtype=np.int64), "value": np.ones(keys, np.int64)})
    SavepointWriter.new(PIPELINE, max_parallelism=128, parallelism=parallelism).with_keyed_state(
        "counter", "count", table
    ).write(path)
    return time.perf_counter() - started


def write_state_apart(path: str, keys: int, parallelism: int) -> float:
    """:func:`write_state` in a process of its own, so that its memory is not this cell's
    driver's. Returns the seconds the writing took."""
    cmd = [sys.executable, str(ENTRY), "--write-savepoint", path, "--keys", str(keys)]
    done = subprocess.run(
        [*cmd, "--parallelism", str(parallelism)], check=True, capture_output=True, text=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def hot_set_source(channels: int, rate: int, hot_keys: int) -> dict[str, object]:
    """The generator's ``ckpt-source`` options: *rate* rows/s over *channels*, keys
    ``0 .. hot_keys - 1``."""
    return {
        "source": "generator",
        "channels": channels,
        "rate": rate / channels,
        "keys": hot_keys,
        "seed": 7,
    }


class Rss:
    """The driver's (this process's), the JVM's and the Python workers' RSS, sampled."""

    def __init__(self, jvm_pid: int | None) -> None:
        self.jvm_pid = jvm_pid

    def now(self) -> dict[str, float]:
        workers = [] if self.jvm_pid is None else descendants(self.jvm_pid)[1:]  # not the JVM
        hosts = [p for p in workers if "subtask_host" in cmdline(p)]
        return {
            "driver": rss_mb(os.getpid()) or 0.0,
            "jvm": 0.0 if self.jvm_pid is None else rss_mb(self.jvm_pid) or 0.0,
            "python_workers": sum(rss_mb(p) or 0.0 for p in workers),
            # the processes that hold the keyed state (spark_ckpt.spark.executors.subtask_host)
            "subtask_hosts": sum(rss_mb(p) or 0.0 for p in hosts),
        }


def run_cell(s: StateSizeSettings, keys: int, log: Any) -> dict[str, Any]:
    """One state size (see the module docstring)."""
    from runbench.procstat import jvm_pid
    from spark_ckpt.pipeline.pipeline import Pipeline
    from spark_ckpt.runtime.config import CheckpointConfig
    from spark_ckpt.runtime.operator import RunningCount
    from spark_ckpt.runtime.restore_settings import RestoreSettings
    from spark_ckpt.spark.session.builders import local_session

    root = tempfile.mkdtemp(prefix=f"state-size-{keys}-")
    savepoint = os.path.join(root, "savepoint")
    write_s = write_state_apart(savepoint, keys, s.parallelism)
    log(f"  [{keys:,} keys] savepoint written in {write_s:.1f} s")
    spark = local_session(
        "spark-ckpt-state-size",
        master=s.master,
        shuffle_partitions=s.parallelism,
        log_level="ERROR",
    )
    rss = Rss(jvm_pid())
    pipeline = Pipeline(
        spark,
        PIPELINE,
        config=CheckpointConfig(
            interval_ms=s.interval_ms, retained_checkpoints=2, state_backend=s.state_backend
        ),
        root=os.path.join(root, "pipeline"),
    )
    source = hot_set_source(s.channels, s.rate, s.hot_keys)
    started = time.monotonic()
    started_ms = time.time() * 1000  # checkpoints of this run: triggered after this
    run = pipeline.start(
        source,
        RunningCount("counter", "user_id"),
        output=os.path.join(root, "out"),
        parallelism=s.parallelism,
        placement="executors",
        restore=RestoreSettings.savepoint(savepoint),
    )
    start_rss: dict[str, float] | None = None
    peak: dict[str, float] = {}
    first: int | None = None
    try:
        while True:
            if time.monotonic() - started > s.timeout_s:
                raise TimeoutError(f"{keys:,} keys: no {s.checkpoints} checkpoints in time")
            if run.query.exception() is not None:
                raise RuntimeError(f"the query failed: {run.query.exception()}")
            done = [
                r
                for r in pipeline.client.history()
                if r.stats is not None
                and r.snapshot_type is SnapshotType.CHECKPOINT
                and r.stats.trigger_ms >= started_ms
            ]
            ids = sorted(r.checkpoint_id for r in done)
            warm = ids[s.warmup_checkpoints :]  # this run's checkpoints after the warm-up
            if warm and first is None:
                first = warm[0]
            if warm and start_rss is None:
                start_rss = rss.now()
                peak = dict(start_rss)
            if start_rss is not None:
                for k, v in rss.now().items():
                    peak[k] = max(peak[k], v)
            if len(warm) >= s.checkpoints:
                break
            time.sleep(0.5)
    finally:
        run.stop()
        history = pipeline.client.history()
        spark.stop()
    assert first is not None and start_rss is not None
    window = sorted(
        (
            r
            for r in history
            if r.stats is not None
            and r.snapshot_type is SnapshotType.CHECKPOINT
            and r.checkpoint_id >= first
        ),
        key=lambda r: r.checkpoint_id,
    )[: s.checkpoints]
    failed = [
        r.checkpoint_id
        for r in history
        if r.failure is not None and r.failure.trigger_ms >= started_ms
    ]
    cps = [
        {
            "id": r.checkpoint_id,
            "duration_ms": r.stats.completed_ms - r.stats.trigger_ms,
            "bytes_written": r.stats.bytes_written,
            "state_bytes": r.stats.state_bytes,
            "async_ms_max": max((m.async_ms for m in r.stats.task_metrics.values()), default=0),
            "sync_ms_max": max((m.sync_ms for m in r.stats.task_metrics.values()), default=0),
        }
        for r in window
        if r.stats is not None
    ]
    durations = [c["duration_ms"] for c in cps]
    written = [c["bytes_written"] for c in cps]
    log(
        f"  [{keys:,} keys] {len(cps)} checkpoints: duration p50 "
        f"{statistics.median(durations):,.0f} ms, mean {statistics.fmean(durations):,.0f} ms; "
        f"written p50 {statistics.median(written):,.0f} B, mean {statistics.fmean(written):,.0f} B"
        f"; driver RSS {start_rss['driver']:,.0f} -> peak {peak['driver']:,.0f} MB, JVM "
        f"{peak['jvm']:,.0f} MB, Python workers {peak['python_workers']:,.0f} MB, of which subtask "
        f"hosts {peak['subtask_hosts']:,.0f} MB"
    )
    return {
        "keys": keys,
        "savepoint_write_s": write_s,
        "checkpoints": cps,
        "failed_checkpoints": failed,
        "duration_ms_p50": statistics.median(durations),
        "duration_ms_mean": statistics.fmean(durations),
        "bytes_written_p50": statistics.median(written),
        "bytes_written_mean": statistics.fmean(written),
        "state_bytes_last": cps[-1]["state_bytes"] if cps else None,
        "rss_mb_window_start": start_rss,
        "rss_mb_window_peak": peak,
    }


def cell_main(args: argparse.Namespace) -> int:
    s = StateSizeSettings(**json.loads(args.settings))
    s = replace(s, states=tuple(s.states))

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    cell = run_cell(s, args.keys, log)
    Path(args.cell_out).write_text(json.dumps(cell) + "\n")
    return 0


def _ratio(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(s: StateSizeSettings, cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Per state size the medians over repetitions; the largest state against the smallest,
    per repetition (a repetition runs every size once)."""
    small, large = min(s.states), max(s.states)
    by: dict[int, list[dict[str, Any]]] = {
        k: [c for c in cells if c["keys"] == k] for k in s.states
    }
    sizes = {
        f"{k:,} keys": {
            metric: statistics.median(c[metric] for c in by[k])
            for metric in (
                "duration_ms_p50",
                "duration_ms_mean",
                "bytes_written_p50",
                "bytes_written_mean",
            )
        }
        | {
            "driver_rss_mb_peak": max(c["rss_mb_window_peak"]["driver"] for c in by[k]),
            "jvm_rss_mb_peak": max(c["rss_mb_window_peak"]["jvm"] for c in by[k]),
            "python_workers_rss_mb_peak": max(
                c["rss_mb_window_peak"]["python_workers"] for c in by[k]
            ),
            "subtask_hosts_rss_mb_peak": max(
                c["rss_mb_window_peak"].get("subtask_hosts", 0.0) for c in by[k]
            ),
            "failed_checkpoints": sum(len(c["failed_checkpoints"]) for c in by[k]),
        }
        for k in s.states
        if by[k]
    }
    pairs = list(zip(by[small], by[large], strict=False))
    ratios = {
        metric: _ratio([b[metric] / a[metric] for a, b in pairs if a[metric]])
        for metric in (
            "duration_ms_p50",
            "duration_ms_mean",
            "bytes_written_p50",
            "bytes_written_mean",
        )
    }
    workers = {k: sizes[f"{k:,} keys"]["subtask_hosts_rss_mb_peak"] for k in s.states if by[k]}
    return {
        "state_backend": s.state_backend,
        "sizes": sizes,
        f"{large:,} / {small:,} keys": ratios,
        # the subtask hosts' memory per key: the difference of their peak RSS over the
        # difference of the keys, between each size and the smallest
        "subtask_hosts_bytes_per_key": {
            f"{k:,} keys": (workers[k] - workers[small]) * 1e6 / (k - small)
            for k in workers
            if k != small
        },
        "subtask_hosts_rss_ratio": {
            f"{k:,} / {b:,} keys": workers[k] / workers[b]
            for b, k in zip(sorted(workers)[1:], sorted(workers)[2:], strict=False)
        },
        "driver_rss_mb_difference": sizes[f"{large:,} keys"]["driver_rss_mb_peak"]
        - sizes[f"{small:,} keys"]["driver_rss_mb_peak"],
        "jvm_rss_mb_difference": sizes[f"{large:,} keys"]["jvm_rss_mb_peak"]
        - sizes[f"{small:,} keys"]["jvm_rss_mb_peak"],
    }


def render(result: dict[str, Any]) -> str:
    summary = result["summary"]
    lines = ["state size | checkpoint p50 | mean | written p50 | mean | driver RSS | JVM | workers"]
    for label, v in summary["sizes"].items():
        lines.append(
            f"{label} | {v['duration_ms_p50']:,.0f} ms | {v['duration_ms_mean']:,.0f} ms | "
            f"{v['bytes_written_p50'] / 1e6:,.2f} MB | {v['bytes_written_mean'] / 1e6:,.2f} MB | "
            f"{v['driver_rss_mb_peak']:,.0f} MB | {v['jvm_rss_mb_peak']:,.0f} MB | "
            f"{v['python_workers_rss_mb_peak']:,.0f} MB"
        )
    for label, ratios in summary.items():
        if label.endswith(" keys") and isinstance(ratios, dict) and "duration_ms_p50" in ratios:
            for metric, r in ratios.items():
                lines.append(f"{label} {metric}: {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})")
    lines.append(f"driver RSS difference: {summary['driver_rss_mb_difference']:+,.0f} MB")
    for label, b in summary.get("subtask_hosts_bytes_per_key", {}).items():
        lines.append(
            f"subtask hosts' memory per key ({summary['state_backend']}), {label}: {b:.0f} B"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--checkpoints", type=int, default=None)
    parser.add_argument(
        "--state-backend", default=None, help="state.backend.type: hashmap (default) or rocksdb"
    )
    parser.add_argument("--states", default=None, help="comma-separated state sizes (keys)")
    parser.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keys", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--cell-out", help=argparse.SUPPRESS)
    parser.add_argument("--write-savepoint", help=argparse.SUPPRESS)
    parser.add_argument("--parallelism", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write_savepoint:
        print(write_state(args.write_savepoint, args.keys, args.parallelism))
        return 0
    if args.cell:
        return cell_main(args)
    s = QUICK if args.quick else FULL
    if args.reps is not None:
        s = replace(s, reps=args.reps)
    if args.checkpoints is not None:
        s = replace(s, checkpoints=args.checkpoints)
    if args.state_backend is not None:
        s = replace(s, state_backend=args.state_backend)
    if args.states is not None:
        s = replace(s, states=tuple(int(k) for k in args.states.split(",")))
    out = args.out or (DEFAULT_OUT if not args.quick else Path("/tmp/state_size_quick.json"))

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    started = time.monotonic()
    cells: list[dict[str, Any]] = []
    for rep in range(s.reps):
        for keys in s.states:
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                cell_out = f.name
            log(f"rep {rep + 1}/{s.reps}: {keys:,} keys")
            cmd = [
                sys.executable,
                str(ENTRY),
                "--cell",
                "--keys",
                str(keys),
                "--settings",
                json.dumps(asdict(s)),
                "--cell-out",
                cell_out,
            ]
            subprocess.run(cmd, check=True)
            cell = json.loads(Path(cell_out).read_text())
            cell["rep"] = rep
            cells.append(cell)
    result = {
        "quick": args.quick,
        "machine": spark_machine_info(),
        "git": git_info(),
        "settings": asdict(s),
        "elapsed_s": round(time.monotonic() - started, 1),
        "cells": cells,
    }
    result["summary"] = summarize(s, cells)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(render(result))
    print(f"written: {out}")
    return 0

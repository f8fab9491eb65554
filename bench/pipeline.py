"""Pipeline benchmark: what exactly-once checkpointing costs a real Spark job, side by side.

The workload is the main job's (:mod:`spark_ckpt.demo`): the generator source (``ckpt-source``,
4 channels, 100k uniform keys) → the foreachBatch aligner (:meth:`Pipeline.prepare
<spark_ckpt.spark.pipeline.Pipeline.prepare>`, parallelism 2) running
:class:`~spark_ckpt.runtime.operator.RunningCount` → a Delta table with two-phase commit
(:class:`~spark_ckpt.delta.sink.DeltaSink`), on ``local[2]``, built with the Pipeline API. One
SparkSession serves every query; every query gets a fresh temporary root (checkpoint store,
mailbox, Spark checkpoint location, output table).

A calibration query runs first (it also absorbs the Python workers' start-up): a backlog
without checkpoints; its rows per busy second is the capacity. The throughput and latency
queries are offered ``utilization`` (50%) of it as a *rate*, with no backlog.

Measurements, all in one run:

0. **The production path** — the aligner as a pipeline run builds it (pipelined),
   checkpoints every ``interval_ms`` against checkpointing off, rows per wall-clock second
   of a window of back-to-back batches (:func:`_pipelined_window`), repetitions in ABBA order
   after an unmeasured warm-up query:

   a. ``sustained`` — offered ``sustained_rate`` rows/s, no read limit (what a job that
      keeps up does);
   b. ``saturated`` — a backlog on every channel, batches of ``saturated_batch_rows``
      (``maxRowsPerTrigger``), barriers at the read position (the default placement): both
      configurations read identical batches as fast as they can, so the ratio is what
      checkpointing costs a job without spare capacity.

1. **Throughput with checkpoints vs without** (``throughput``): exactly-once aligned
   checkpoints every ``interval_ms`` (1 s) vs ``CheckpointConfig(interval_ms=None)`` (no
   checkpoint at all; the 2PC sink still encodes its output into in-progress Parquet files
   but never commits them, like Flink's file sink without checkpoints), with a
   processing-time trigger so that every batch holds the same rows in both.
   Repetitions are interleaved (each runs both configurations, in shuffled order); the ratio
   is the median of per-repetition ratios. **What is measured**: data rows handed to
   ``BatchAligner.process`` in the measured batches ÷ the sum of their Spark
   ``durationMs.triggerExecution`` (busy time: ``latestOffset`` — where the coordinator
   completes checkpoints and commits them and the sink's Delta transaction —, planning,
   ``addBatch`` = the foreachBatch call with ``toArrow``, offset and commit logs). Also
   ``ratio_from_phases``: the baseline's µs/row against baseline + the checkpoint-only work of
   the phase timers (immune to the noise of phases both share), and that work per checkpoint.
2. **Where the time goes**: every ``foreachBatch`` call is instrumented by wrapping methods of
   the aligner, its tasks, operator, sink and store *on the instances* (exclusive wall time
   per phase, :data:`PHASES`); the time outside ``foreachBatch`` comes from Spark's
   ``durationMs``. ``--profile`` adds one checkpointing query under cProfile (inside
   ``foreachBatch`` only). The source's ``read()`` work is also timed without Spark.
3. **Checkpoint duration** (``latency``): default trigger (batches back to back), no read
   limit; p50/p95 of ``CheckpointStats.end_to_end_ms`` of the checkpoints triggered after
   warm-up, next to the micro-batch durations (``triggerExecution``).
4. **Lagging channel, aligned vs unaligned** (``lag``): channel 0 has a backlog of ``lag``
   times its per-channel share of ``maxRowsPerTrigger``, the other channels a small one, all
   at a low rate, with ``barrierPlacement=head``. After ``lag_warmup`` batches the benchmark
   requests one checkpoint (no periodic checkpoints); its barrier is placed at every
   channel's head, so channel 0 delivers it ``lag`` micro-batches after the others.
   Reported per mode and lag: end-to-end duration, alignment time, channel-state bytes, and
   the lag observed in the batches.

Run ``python bench/pipeline.py`` (full, ~8 min) or ``--quick`` (smoke, ~2 min). Writes JSON to
``bench/results/pipeline.json`` unless ``--out`` says otherwise. See ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from spark_ckpt.errors import SparkCkptError
from spark_ckpt.protocol.barrier import CHANNEL, CHECKPOINT_ID
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.operator import RunningCount
from spark_ckpt.spark.batch_aligner import BatchAligner, collect_arrow
from spark_ckpt.spark.foreach_batch import ForeachBatchFunction
from spark_ckpt.spark.mailbox import RequestKind
from spark_ckpt.spark.pipeline import Pipeline, PipelineRun

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "pipeline.json"
PIPELINE = "bench"


@dataclass(frozen=True)
class Settings:
    """Sizes of one benchmark run."""

    channels: int
    keys: int
    parallelism: int
    interval_ms: int  # checkpoint interval of the checkpointing configuration
    calibration_rows: int  # maxRowsPerTrigger of the calibration (and warm-up) query
    calibration_batches: int  # its batches; capacity = rows per busy second after the first
    utilization: float  # offered input rate as a fraction of the calibrated capacity
    rate: float  # throughput queries: rows/s of all channels (set from the calibration)
    trigger_s: float  # throughput queries: processing-time trigger (identical batches)
    warmup_batches: int  # batches with data not measured (the first is Spark's warm-up)
    measured_batches: int  # batches with data measured per query
    reps: int  # throughput: repetitions (each runs both configurations)
    latency_reps: int  # checkpoint duration: queries with the default trigger
    latency_rate: float  # their input rate (rows/s, all channels; set from the calibration)
    lag_batch_rows: int  # maxRowsPerTrigger of the lag queries
    lags: tuple[int, ...]  # channel 0 delivers the barrier this many batches late
    lag_warmup: int  # lag: the checkpoint is requested after this many batches
    lag_rate: float  # lag: rows/s per channel
    lag_reps: int  # lag: repetitions of every (mode, lag) case
    sustained_rate: float  # sustained: rows/s offered (all channels), no read limit
    sustained_warmup: int  # sustained: batches before the measured window
    sustained_measured: int  # sustained: batches processed in the measured window
    sustained_reps: int  # sustained/saturated: repetitions (each runs both configurations)
    saturated_batch_rows: int  # saturated: maxRowsPerTrigger over a backlog (same window)
    pipelined_warmup_batches: int  # sustained/saturated: batches of an unmeasured first query
    query_timeout_s: float

    @property
    def batch_rows(self) -> int:
        """Rows of one throughput micro-batch (all channels): one trigger period's input."""
        return int(self.rate * self.trigger_s)

    @property
    def max_rows_per_trigger(self) -> int:
        """Read limit of the throughput/latency queries: two periods' input, so that the
        rows produced during the slow first batch are absorbed over the warm-up batches."""
        return 2 * self.batch_rows


FULL = Settings(
    channels=4,
    keys=100_000,
    parallelism=2,
    interval_ms=1000,
    calibration_rows=400_000,
    calibration_batches=4,
    utilization=0.5,
    rate=200_000.0,
    trigger_s=2.0,
    warmup_batches=3,
    measured_batches=6,
    reps=3,
    latency_reps=2,
    latency_rate=100_000.0,
    lag_batch_rows=100_000,
    lags=(3, 10, 30),
    lag_warmup=2,
    lag_rate=500.0,
    lag_reps=2,
    sustained_rate=1_200_000.0,
    sustained_warmup=3,
    sustained_measured=12,
    sustained_reps=4,
    saturated_batch_rows=600_000,
    pipelined_warmup_batches=30,
    query_timeout_s=180.0,
)
QUICK = replace(
    FULL,
    calibration_rows=200_000,
    calibration_batches=3,
    trigger_s=1.5,
    warmup_batches=2,
    measured_batches=2,
    reps=1,
    latency_reps=1,
    lags=(3,),
    lag_reps=1,
    sustained_rate=600_000.0,
    sustained_warmup=2,
    sustained_measured=3,
    sustained_reps=1,
    saturated_batch_rows=300_000,
    pipelined_warmup_batches=4,
    query_timeout_s=60.0,
)

#: The two configurations of measurement 1.
CONFIGS = ("checkpoints", "off")


# --- instrumentation ----------------------------------------------------------------------


class PhaseTimer:
    """Exclusive wall time per phase of the current ``foreachBatch`` call.

    :meth:`wrap` replaces a method *on one instance* by a timed one; nested timed calls are
    subtracted from their caller, so the phases add up to the wall time of the call. Phases
    run on the foreachBatch thread (:attr:`owner`, one batch at a time); timed calls on
    other threads (the aligner's snapshot worker) are summed apart, in :attr:`background`:
    they are off the micro-batch's path."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.background: dict[str, float] = defaultdict(float)
        self.owner: int | None = None
        self._stack: list[float] = []  # time spent in timed children, per open call
        self._lock = threading.Lock()

    def reset(self) -> dict[str, float]:
        out = dict(self.totals)
        self.totals.clear()
        return out

    def take_background(self) -> dict[str, float]:
        with self._lock:
            out = dict(self.background)
            self.background.clear()
        return out

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.owner is not None and threading.get_ident() != self.owner:
            start = time.perf_counter()
            try:
                yield
            finally:
                with self._lock:
                    self.background[name] += time.perf_counter() - start
            return
        self._stack.append(0.0)
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            children = self._stack.pop()
            self.totals[name] += elapsed - children
            if self._stack:
                self._stack[-1] += elapsed

    def wrap(self, obj: object, method: str, name: str) -> None:
        inner = getattr(obj, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return inner(*args, **kwargs)

        setattr(obj, method, timed)


#: Phases of a foreachBatch call that only checkpointing causes (or that it makes costlier).
CHECKPOINT_PHASES = (
    "list_completed",
    "committed_checkpoint",
    "notify_other",
    "snapshot_sync",
    "sink_pre_commit",
    "snapshot_async",
    "mailbox",
    "aligner_other",
)

#: Phases of a foreachBatch call, in pipeline order (see :meth:`Probe.instrument`).
PHASES = (
    "toArrow",  # Spark job: source read() on executors + transfer to the driver as Arrow
    "list_completed",  # BatchAligner._notify_completed: completed checkpoints from the store
    "committed_checkpoint",  # OperatorTask.notify_complete: the sink's Delta app version
    "notify_other",  # rest of _notify_completed (incremental base bookkeeping)
    "route",  # BatchAligner._route: rows to subtasks by key group
    "operator",  # RunningCount.process_batch (keyed state get/put)
    "sink_write",  # DeltaSink.write: encoding into the in-progress Parquet file
    "snapshot_sync",  # OperatorTask._snapshot minus pre_commit: state backend snapshot
    "sink_pre_commit",  # DeltaSink.pre_commit: closing the in-progress file, sealing
    "snapshot_async",  # OperatorTask._complete: state + channel state into the Delta store, ack
    "mailbox",  # BatchAligner._flush: acks posted as files
    "aligner_other",  # the rest of BatchAligner.process (barrier alignment, filtering, tick)
)


@dataclass
class BatchRecord:
    batch_id: int
    start: float  # perf_counter at entry
    end: float  # perf_counter at exit
    wall_end_ms: float  # time.time() at exit, in ms (to compare with checkpoint timestamps)
    data_rows: int
    barriers: list[tuple[int, int]]  # (checkpoint id, channel) of barrier rows in the batch
    phases: dict[str, float]


@dataclass
class Probe:
    """Wraps a :class:`BatchAligner` as the ``foreachBatch`` function and records each call.

    ``after_batch(index)`` (optional) runs at the end of the *index*-th call (0-based)."""

    function: ForeachBatchFunction
    after_batch: Callable[[int], None] | None = None
    profiler: cProfile.Profile | None = None
    batches: list[BatchRecord] = field(default_factory=list)
    completed: dict[int, CompletedCheckpoint] = field(default_factory=dict)
    error: BaseException | None = None
    timer: PhaseTimer = field(default_factory=PhaseTimer)
    data_rows: int = 0
    changed: threading.Event = field(default_factory=threading.Event)

    aligner: BatchAligner | None = None  # the run's runtime, instrumented at the first call

    def instrument(self) -> BatchAligner:
        a, t = self.function.runtime(), self.timer
        self.aligner = a
        store = a.store
        list_completed = store.list_completed

        def seen_completed() -> list[CompletedCheckpoint]:
            with t.phase("list_completed"):
                result = list_completed()
            for c in result:
                self.completed.setdefault(c.checkpoint_id, c)
            return result

        store.list_completed = seen_completed  # type: ignore[method-assign]
        t.wrap(a, "_notify_completed", "notify_other")
        t.wrap(a, "_route", "route")
        t.wrap(a, "_flush", "mailbox")
        for op in a.operators:
            t.wrap(op, "process_batch", "operator")
        for task in a.tasks:
            t.wrap(task, "_snapshot", "snapshot_sync")
            t.wrap(task, "_complete", "snapshot_async")
        sink = a.tasks[0].sink
        if sink is not None:
            t.wrap(sink, "write", "sink_write")
            t.wrap(sink, "pre_commit", "sink_pre_commit")
            t.wrap(sink, "committed_checkpoint", "committed_checkpoint")
        return a

    def __call__(self, df: Any, batch_id: int) -> None:
        try:
            self._call(df, batch_id)
        except BaseException as e:  # recorded for the driver loop, then re-raised to Spark
            self.error = e
            self.changed.set()
            raise

    def _call(self, df: Any, batch_id: int) -> None:
        if self.profiler is not None:
            self.profiler.enable()
        self.timer.owner = threading.get_ident()
        aligner = self.aligner or self.instrument()
        start = time.perf_counter()
        with self.timer.phase("toArrow"):
            table = collect_arrow(df)  # a stop interrupting it ends the query quietly
        with self.timer.phase("aligner_other"):
            aligner.submit(table)  # pipelined: waits for the previous batch, hands off
        end = time.perf_counter()
        if self.profiler is not None:
            self.profiler.disable()
        ids = table.column(CHECKPOINT_ID)
        control = pc.is_valid(ids)
        n_control = pc.sum(control).as_py() or 0
        barriers: list[tuple[int, int]] = []
        if n_control:
            rows = table.filter(control).select([CHECKPOINT_ID, CHANNEL]).to_pylist()
            barriers = [(r[CHECKPOINT_ID], r[CHANNEL]) for r in rows]
        data_rows = table.num_rows - n_control
        self.data_rows += data_rows
        self.batches.append(
            BatchRecord(
                batch_id, start, end, time.time() * 1000, data_rows, barriers, self.timer.reset()
            )
        )
        if self.after_batch is not None:
            self.after_batch(len(self.batches) - 1)
        self.changed.set()


# --- running one query ----------------------------------------------------------------------


@dataclass
class QueryRun:
    config: str
    probe: Probe
    progress: list[dict[str, Any]]
    completed: list[CompletedCheckpoint]
    loadavg_start: tuple[float, float, float]
    wall_s: float


def _progress_dicts(query: Any) -> list[dict[str, Any]]:
    return [json.loads(p.json) for p in query.recentProgress]


def run_query(
    spark: Any,
    label: str,
    config: CheckpointConfig,
    source: dict[str, object],
    *,
    done: Callable[[Probe], bool],
    timeout_s: float,
    parallelism: int,
    trigger_s: float | None = None,
    after_batch: Callable[[Pipeline, int], None] | None = None,
    profiler: cProfile.Profile | None = None,
    pipelined: bool = False,
) -> QueryRun:
    """Start one query on a fresh root, run it until ``done(probe)``, stop it (no final
    checkpoint) and collect what it recorded. The root is deleted afterwards."""
    root = tempfile.mkdtemp(prefix=f"spark-ckpt-bench-{label}-")
    try:
        gc.collect()
        load = os.getloadavg()
        pipeline = Pipeline(spark, PIPELINE, config=config, root=os.path.join(root, "pipeline"))
        prepared = pipeline.prepare(
            source,
            RunningCount("counter", "user_id"),
            output=os.path.join(root, "out"),
            parallelism=parallelism,
            pipelined=pipelined,
        )
        hook = None if after_batch is None else (lambda i: after_batch(pipeline, i))
        probe = Probe(prepared.function, after_batch=hook, profiler=profiler)
        started = time.perf_counter()
        writer = prepared.dataframe.writeStream.foreachBatch(probe).option(
            "checkpointLocation", pipeline.spark_checkpoint_location()
        )
        if trigger_s is not None:
            writer = writer.trigger(processingTime=f"{trigger_s} seconds")
        query = writer.start()
        run = PipelineRun(pipeline, prepared.run_id, 1, query, prepared.function, prepared.files)
        try:
            deadline = time.monotonic() + timeout_s
            while not done(probe):
                if probe.error is not None:
                    raise RuntimeError(f"{label}: foreachBatch failed: {probe.error!r}")
                if not query.isActive:
                    raise RuntimeError(f"{label}: query ended early: {query.exception()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{label}: not done within {timeout_s} s")
                probe.changed.wait(0.2)
                probe.changed.clear()
            wall = time.perf_counter() - started
            # a batch's progress is posted after foreachBatch returns (offset commit); batches
            # that start from now on are not measured
            seen = len(probe.batches)
            last = probe.batches[seen - 1].batch_id if seen else -1
            deadline = time.monotonic() + 30
            while True:
                progress = _progress_dicts(query)
                if any(p["batchId"] >= last for p in progress) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        finally:
            stop_quietly(pipeline, run)
        del probe.batches[seen:]
        completed = {c.checkpoint_id: c for c in pipeline.store.list_completed()}
        completed.update(probe.completed)
        return QueryRun(
            label,
            probe,
            progress,
            [completed[k] for k in sorted(completed)],
            (load[0], load[1], load[2]),
            wall,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def stop_quietly(pipeline: Pipeline, run: PipelineRun) -> None:
    """Stop the query the way users do, with a final checkpoint (no micro-batch is
    interrupted, so nothing prints a trace); a query that already failed is just ended."""
    if run.query.isActive and run.query.exception() is None:
        try:
            pipeline.stop(run, timeout_s=120)
            return
        except SparkCkptError as e:
            print(f"  (stop with a final checkpoint failed: {e}; stopping at once)")
    run.query.stop()
    run.retire()


def source_options(
    s: Settings, backlog: Sequence[int], rate_per_channel: float, max_rows: int | None
) -> dict[str, object]:
    options: dict[str, object] = {
        "source": "generator",
        "channels": s.channels,
        "rate": rate_per_channel,
        "backlog": ",".join(str(b) for b in backlog),
        "keys": s.keys,
        "seed": 7,
    }
    if max_rows is not None:
        options["maxRowsPerTrigger"] = max_rows
    return options


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if len(values) else None


# --- 1-3: throughput, phases, checkpoint duration -------------------------------------------

#: Spark's per-batch durations (``StreamingQueryProgress.durationMs``) that are reported.
SPARK_DURATIONS = (
    "triggerExecution",
    "latestOffset",
    "queryPlanning",
    "getBatch",
    "walCommit",
    "addBatch",
    "commitOffsets",
)


def checkpoint_config(s: Settings, name: str) -> CheckpointConfig:
    if name == "checkpoints":
        return CheckpointConfig(interval_ms=s.interval_ms, retained_checkpoints=2)
    return CheckpointConfig(interval_ms=None)


def steady_query(
    spark: Any,
    s: Settings,
    name: str,
    *,
    trigger_s: float | None,
    rate: float,
    max_rows: int | None,
    profiler: cProfile.Profile | None = None,
) -> QueryRun:
    """The generator at *rate* rows/s (no backlog) until ``warmup + measured`` batches with
    data ran. With *trigger_s* (and the input below capacity) every steady-state batch holds
    one period's input; without, batches run back to back."""
    per_channel = rate / s.channels
    need = s.warmup_batches + s.measured_batches
    return run_query(
        spark,
        f"{name}-{'trigger' if trigger_s else 'b2b'}",
        checkpoint_config(s, name),
        source_options(s, [0] * s.channels, per_channel, max_rows),
        done=lambda p: sum(1 for b in p.batches if b.data_rows) >= need,
        timeout_s=s.query_timeout_s,
        parallelism=s.parallelism,
        trigger_s=trigger_s,
        profiler=profiler,
    )


def _checkpoint_dict(c: CompletedCheckpoint) -> dict[str, Any]:
    metrics = c.stats.task_metrics.values()
    return {
        "id": c.checkpoint_id,
        "end_to_end_ms": c.stats.end_to_end_ms,
        "alignment_ms": c.stats.max_alignment_ms,
        "sync_ms": max((m.sync_ms for m in metrics), default=0),
        "async_ms": max((m.async_ms for m in metrics), default=0),
        "state_bytes": c.stats.state_bytes,
        "bytes_written": c.stats.bytes_written,
    }


def summarize(run: QueryRun, s: Settings) -> dict[str, Any]:
    """The measured batches (those after the first ``warmup_batches`` batches with data):
    rows, busy time (Spark's ``triggerExecution``), foreachBatch time and its phases, Spark's
    other durations, and the checkpoints triggered in the measured window."""
    batches = run.probe.batches
    data = [i for i, b in enumerate(batches) if b.data_rows]
    if len(data) <= s.warmup_batches:
        raise RuntimeError(f"{run.config}: only {len(data)} batches with data")
    first, last = data[s.warmup_batches], data[-1]
    measured = batches[first : last + 1]
    rows = sum(b.data_rows for b in measured)
    progress = {p["batchId"]: p for p in run.progress}
    missing = [b.batch_id for b in measured if b.batch_id not in progress]
    if missing:
        raise RuntimeError(f"{run.config}: no progress for batches {missing}")
    durations = [progress[b.batch_id]["durationMs"] for b in measured]
    busy_s = sum(float(d.get("triggerExecution", 0)) for d in durations) / 1000
    in_fb = sum(b.end - b.start for b in measured)
    phases: dict[str, float] = defaultdict(float)
    for b in measured:
        for k, v in b.phases.items():
            phases[k] += v
    spark_s = {k: sum(float(d.get(k, 0)) for d in durations) / 1000 for k in SPARK_DURATIONS}
    window_ms = batches[first - 1].wall_end_ms
    cps = [c for c in run.completed if c.stats.trigger_ms >= window_ms and not c.is_savepoint]
    return {
        "config": run.config,
        "batches": len(measured),
        "rows": rows,
        "batch_rows": [b.data_rows for b in measured],
        "busy_s": busy_s,
        "rows_per_busy_s": rows / busy_s,
        "wall_s": measured[-1].end - batches[first - 1].end,
        "foreach_batch_s": in_fb,
        "rows_per_foreach_batch_s": rows / in_fb,
        "phases_s": {k: phases.get(k, 0.0) for k in PHASES},
        # off the micro-batch path: the aligner's snapshot worker, whole query
        "worker_s": run.probe.timer.take_background(),
        "spark_s": spark_s,
        "batch_ms": [float(d.get("triggerExecution", 0)) for d in durations],
        "checkpoints": [_checkpoint_dict(c) for c in cps],
        "first_batch_ms": _first_batch_ms(run),
        "loadavg_start": run.loadavg_start,
        "query_wall_s": run.wall_s,
    }


def _first_batch_ms(run: QueryRun) -> float | None:
    """Spark's duration of the query's first batch (worker start-up), for reference."""
    if not run.probe.batches:
        return None
    first = run.probe.batches[0].batch_id
    for p in run.progress:
        if p["batchId"] == first:
            return float(p["durationMs"].get("triggerExecution", 0))
    return None


def _per_row_us(runs: Sequence[dict[str, Any]], group: str, key: str) -> float:
    """``run[group][key]`` (seconds) summed over *runs*, in microseconds per measured row."""
    seconds = sum(float(r[group][key]) for r in runs)
    return seconds / sum(int(r["rows"]) for r in runs) * 1e6


def calibrate(spark: Any, s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Warm Spark up (the first query of a session starts the Python workers) and measure the
    capacity of the pipeline without checkpoints: a backlog read in batches of
    ``calibration_rows``; rows per busy second (``triggerExecution``) after the first batch.
    The throughput and latency queries are offered ``utilization`` times that capacity, so
    that their batches stay identical (each holds one trigger period's input) and the source
    builds no backlog (a backlog would delay every barrier, see ``lag``)."""
    share = s.calibration_rows // s.channels
    total = share * s.channels * s.calibration_batches
    run = run_query(
        spark,
        "calibration",
        CheckpointConfig(interval_ms=None),
        source_options(s, [share * s.calibration_batches] * s.channels, 0.0, s.calibration_rows),
        done=lambda p: p.data_rows >= total,
        timeout_s=s.query_timeout_s * 2,
        parallelism=s.parallelism,
    )
    progress = {p["batchId"]: p for p in run.progress}
    later = [b for b in run.probe.batches[1:] if b.data_rows and b.batch_id in progress]
    busy = sum(float(progress[b.batch_id]["durationMs"]["triggerExecution"]) for b in later)
    rows = sum(b.data_rows for b in later)
    capacity = rows / (busy / 1000) if busy else 0.0
    log(
        f"  capacity without checkpoints {capacity:,.0f} rows/s (batches of "
        f"{s.calibration_rows:,}; first batch {_first_batch_ms(run) or 0:.0f} ms)"
    )
    return {
        "rows": rows,
        "busy_s": busy / 1000,
        "capacity_rows_per_s": capacity,
        "first_batch_ms": _first_batch_ms(run),
        "loadavg_start": run.loadavg_start,
    }


def bench_throughput(spark: Any, s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Measurement 1 and 2: both configurations with a processing-time trigger (identical
    batches), repetitions interleaved."""
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    rng = random.Random(1)
    for rep in range(s.reps):
        order = list(CONFIGS)
        rng.shuffle(order)
        for name in order:
            summary = summarize(
                steady_query(
                    spark,
                    s,
                    name,
                    trigger_s=s.trigger_s,
                    rate=s.rate,
                    max_rows=s.max_rows_per_trigger,
                ),
                s,
            )
            runs[name].append(summary)
            log(
                f"  rep {rep + 1}/{s.reps} {name:<11} {summary['rows_per_busy_s']:>10,.0f} rows/s "
                f"busy, {summary['rows_per_foreach_batch_s']:>10,.0f} in foreachBatch "
                f"({summary['batches']} batches of ~{statistics.median(summary['batch_rows']):,.0f}"
                f" rows, {len(summary['checkpoints'])} checkpoints, load "
                f"{summary['loadavg_start'][0]:.1f})"
            )
    pairs = list(zip(runs["checkpoints"], runs["off"], strict=True))
    # the work only checkpointing does, from the phase timers (immune to the noise of the
    # phases both configurations share, toArrow above all): the checkpoint-only phases inside
    # foreachBatch, plus latestOffset (the coordinator completes and commits checkpoints
    # there), each minus the same phase without checkpoints
    ck, off = runs["checkpoints"], runs["off"]
    extra_s = {
        k: sum(r["phases_s"][k] for r in ck)
        - sum(r["phases_s"][k] for r in off)
        * sum(r["rows"] for r in ck)
        / sum(r["rows"] for r in off)
        for k in CHECKPOINT_PHASES
    }
    extra_s["latestOffset"] = sum(r["spark_s"]["latestOffset"] for r in ck) - sum(
        r["spark_s"]["latestOffset"] for r in off
    ) * sum(r["rows"] for r in ck) / sum(r["rows"] for r in off)
    n_checkpoints = sum(len(r["checkpoints"]) for r in ck)
    base_us = _per_row_us(off, "spark_s", "triggerExecution")
    extra_us = sum(extra_s.values()) / sum(r["rows"] for r in ck) * 1e6
    ratios = [c["rows_per_busy_s"] / o["rows_per_busy_s"] for c, o in pairs]
    fb_ratios = [c["rows_per_foreach_batch_s"] / o["rows_per_foreach_batch_s"] for c, o in pairs]
    return {
        "rate": s.rate,
        "trigger_s": s.trigger_s,
        "batch_rows": s.batch_rows,
        "reps": s.reps,
        "rows_per_busy_s": {c: _median([r["rows_per_busy_s"] for r in runs[c]]) for c in CONFIGS},
        "ratio": _median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "rows_per_foreach_batch_s": {
            c: _median([r["rows_per_foreach_batch_s"] for r in runs[c]]) for c in CONFIGS
        },
        "foreach_batch_ratio": _median(fb_ratios),
        "micro_batch_ms_p50": {
            c: _median([ms for r in runs[c] for ms in r["batch_ms"]]) for c in CONFIGS
        },
        "phases_us_per_row": {
            c: {k: _per_row_us(runs[c], "phases_s", k) for k in PHASES} for c in CONFIGS
        },
        "spark_us_per_row": {
            c: {k: _per_row_us(runs[c], "spark_s", k) for k in SPARK_DURATIONS} for c in CONFIGS
        },
        "checkpoints_per_batch": n_checkpoints / sum(r["batches"] for r in ck),
        "checkpoint_cost_ms": {
            k: v / n_checkpoints * 1e3 if n_checkpoints else None for k, v in extra_s.items()
        },
        "checkpoint_cost_ms_total": sum(extra_s.values()) / n_checkpoints * 1e3
        if n_checkpoints
        else None,
        "ratio_from_phases": base_us / (base_us + extra_us),
        "runs": runs,
    }


def _pipelined_window(run: QueryRun, warmup: int, measured: int) -> dict[str, Any]:
    """The measured window of a pipelined query: from the end of the *warmup*-th
    ``foreachBatch`` call with data to the end of the call *measured* later. Each call first
    waits until the previous batch was processed, so the window holds the processing of
    exactly those *measured* batches: their rows per wall-clock second, and the checkpoints
    triggered inside the window."""
    data = [b for b in run.probe.batches if b.data_rows]
    before, last = data[warmup - 1], data[warmup + measured - 1]
    window = data[warmup - 1 : warmup + measured - 1]
    rows = sum(b.data_rows for b in window)
    wall = last.end - before.end
    start_ms, end_ms = before.wall_end_ms, last.wall_end_ms
    cps = [
        c for c in run.completed if start_ms <= c.stats.trigger_ms <= end_ms and not c.is_savepoint
    ]
    return {
        "rows": rows,
        "wall_s": wall,
        "rows_per_s": rows / wall,
        "batch_rows": [b.data_rows for b in window],
        "checkpoints": [_checkpoint_dict(c) for c in cps],
        "loadavg_start": run.loadavg_start,
    }


def _pipelined_pairs(
    spark: Any,
    s: Settings,
    label: str,
    source: dict[str, object],
    warmup: int,
    measured: int,
    reps: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Both configurations on the production path (``pipelined=True``), *reps* interleaved
    repetitions in ABBA order (the JVM's JIT keeps speeding Spark up over the first minutes
    of a session, so a fixed order would favour the later configuration); the ratio is the
    median of the per-repetition ratios. One unmeasured query of ``pipelined_warmup_batches``
    runs first."""
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    need = warmup + measured

    def query(name: str, batches: int) -> QueryRun:
        return run_query(
            spark,
            f"{name}-{label}",
            checkpoint_config(s, name),
            source,
            done=lambda p: sum(1 for b in p.batches if b.data_rows) >= batches,
            timeout_s=s.query_timeout_s,
            parallelism=s.parallelism,
            pipelined=True,
        )

    query("checkpoints", s.pipelined_warmup_batches)
    for rep in range(reps):
        for name in CONFIGS if rep % 2 == 0 else reversed(CONFIGS):
            run = query(name, need)
            summary = _pipelined_window(run, warmup, measured)
            runs[name].append(summary)
            sizes = summary["batch_rows"]
            log(
                f"  rep {rep + 1}/{reps} {name:<11} {summary['rows_per_s']:>12,.0f} "
                f"rows/s ({len(sizes)} batches of {min(sizes):,}-{max(sizes):,} rows in "
                f"{summary['wall_s']:.2f} s, {len(summary['checkpoints'])} checkpoints, load "
                f"{run.loadavg_start[0]:.1f})"
            )
    pairs = list(zip(runs["checkpoints"], runs["off"], strict=True))
    ratios = [c["rows_per_s"] / o["rows_per_s"] for c, o in pairs]
    e2e = [c["end_to_end_ms"] for r in runs["checkpoints"] for c in r["checkpoints"]]
    return {
        "measured_batches": measured,
        "reps": reps,
        "rows_per_s": {c: _median([r["rows_per_s"] for r in runs[c]]) for c in CONFIGS},
        "ratio": _median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "checkpoints_per_s": sum(len(r["checkpoints"]) for r in runs["checkpoints"])
        / sum(r["wall_s"] for r in runs["checkpoints"]),
        "checkpoint_end_to_end_ms": {"p50": _pct(e2e, 50), "p95": _pct(e2e, 95)},
        "batch_rows_median": {
            c: _median([n for r in runs[c] for n in r["batch_rows"]]) for c in CONFIGS
        },
        "runs": runs,
    }


def bench_sustained(spark: Any, s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Measurement 0a: end-to-end throughput of the production path — the aligner as
    a pipeline run builds it (pipelined: Spark reads batch *b + 1* while the
    operators process *b*; asynchronous snapshots) — offered ``sustained_rate`` rows/s, with
    checkpoints every ``interval_ms`` against checkpointing off.

    Batches run back to back without a read limit, so each reads everything produced while
    the previous one ran. A pipeline that keeps up processes the offered rate with bounded
    batches; one that does not falls behind and its batches grow (:func:`_pipelined_window`
    defines the measured window)."""
    result = _pipelined_pairs(
        spark,
        s,
        "sustained",
        source_options(s, [0] * s.channels, s.sustained_rate / s.channels, None),
        s.sustained_warmup,
        s.sustained_measured,
        s.sustained_reps,
        log,
    )
    return {"offered_rows_per_s": s.sustained_rate, **result}


def bench_saturated(spark: Any, s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Measurement 0b: the production path saturated. Every channel starts with a backlog
    longer than the query reads, batches of ``saturated_batch_rows`` (``maxRowsPerTrigger``)
    run back to back, and barriers go at the read position (``barrierPlacement=read``, the
    default), so each checkpoint's barriers are in the batch that takes its trigger. Both
    configurations read identical batches as fast as they can: the ratio of their rows per
    wall-clock second is what checkpointing costs a job that has no spare capacity."""
    share = s.saturated_batch_rows // s.channels
    need = max(s.sustained_warmup + s.sustained_measured, s.pipelined_warmup_batches)
    backlog = share * (need + 8)
    result = _pipelined_pairs(
        spark,
        s,
        "saturated",
        source_options(s, [backlog] * s.channels, 0.0, s.saturated_batch_rows),
        s.sustained_warmup,
        s.sustained_measured,
        s.sustained_reps,
        log,
    )
    return {"batch_rows": s.saturated_batch_rows, "backlog_per_channel": backlog, **result}


def bench_latency(spark: Any, s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Measurement 3: checkpoints every ``interval_ms`` with the default trigger and no read
    limit (batches run back to back, each reading everything produced during the previous
    one, so every barrier is delivered by the batch planned when it was triggered)."""
    runs = []
    for rep in range(s.latency_reps):
        summary = summarize(
            steady_query(
                spark, s, "checkpoints", trigger_s=None, rate=s.latency_rate, max_rows=None
            ),
            s,
        )
        runs.append(summary)
        e2e = [c["end_to_end_ms"] for c in summary["checkpoints"]]
        log(
            f"  rep {rep + 1}/{s.latency_reps}: {len(e2e)} checkpoints, p50 "
            f"{_pct(e2e, 50) or 0:.0f} ms; micro-batch p50 {_median(summary['batch_ms']) or 0:.0f}"
            f" ms ({summary['batches']} batches of ~{statistics.median(summary['batch_rows']):,.0f}"
            f" rows, load {summary['loadavg_start'][0]:.1f})"
        )
    cps = [c for r in runs for c in r["checkpoints"]]
    e2e = [c["end_to_end_ms"] for c in cps]
    batch_ms = [ms for r in runs for ms in r["batch_ms"]]
    return {
        "rate": s.latency_rate,
        "interval_ms": s.interval_ms,
        "reps": s.latency_reps,
        "checkpoints": len(cps),
        "end_to_end_ms": {
            "p50": _pct(e2e, 50),
            "p95": _pct(e2e, 95),
            "max": max(e2e, default=None),
        },
        "micro_batch_ms": {"p50": _median(batch_ms), "p95": _pct(batch_ms, 95)},
        "alignment_ms_p50": _pct([c["alignment_ms"] for c in cps], 50),
        "sync_ms_p50": _pct([c["sync_ms"] for c in cps], 50),
        "async_ms_p50": _pct([c["async_ms"] for c in cps], 50),
        "bytes_written_p50": _pct([c["bytes_written"] for c in cps], 50),
        "runs": runs,
    }


def profile_foreach_batch(spark: Any, s: Settings, top: int = 30) -> dict[str, Any]:
    """One extra checkpointing query with cProfile enabled inside foreachBatch only."""
    profiler = cProfile.Profile()
    run = steady_query(
        spark,
        s,
        "checkpoints",
        trigger_s=s.trigger_s,
        rate=s.rate,
        max_rows=s.max_rows_per_trigger,
        profiler=profiler,
    )
    stats = pstats.Stats(profiler)
    raw: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    entries = [
        {
            "function": f"{Path(filename).parent.name}/{Path(filename).name}:{line}({func})",
            "calls": nc,
            "tottime_s": tt,
            "cumtime_s": ct,
        }
        for (filename, line, func), (_cc, nc, tt, ct, _callers) in raw.items()
    ]
    return {
        "rows": run.probe.data_rows,
        "batches": len(run.probe.batches),
        "profiled_s": sum(b.end - b.start for b in run.probe.batches),
        "top_cumulative": sorted(entries, key=lambda e: -e["cumtime_s"])[:top],
        "top_tottime": sorted(entries, key=lambda e: -e["tottime_s"])[:top],
    }


# --- 4: lagging channel ----------------------------------------------------------------------


def lag_query(spark: Any, s: Settings, mode: str, lag: int) -> dict[str, Any]:
    """One query: channel 0 delivers the barrier of the requested checkpoint *lag* batches
    after the others (see the module docstring)."""
    share = s.lag_batch_rows // s.channels
    # the request is posted at the end of batch lag_warmup - 1, so the latestOffset of batch
    # lag_warmup triggers it and places the barrier at every channel's head: the other
    # channels deliver it in batch lag_warmup, channel 0 (reading `share` rows per batch) in
    # batch lag_warmup + lag, as long as it grew by less than `share` rows until the trigger
    backlog0 = (s.lag_warmup + lag) * share + 1
    others = max(1, share // 4)
    config = CheckpointConfig(interval_ms=None, unaligned=mode == "unaligned")
    requested: dict[str, str] = {}

    def after_batch(pipeline: Pipeline, index: int) -> None:
        if index == s.lag_warmup - 1 and not requested:
            requested["id"] = pipeline.request(RequestKind.CHECKPOINT)

    def done(p: Probe) -> bool:
        return bool(requested) and any(
            c.properties.get("request_id") == requested["id"] for c in p.completed.values()
        )

    run = run_query(
        spark,
        f"lag-{mode}-{lag}",
        config,
        {
            **source_options(
                s, [backlog0] + [others] * (s.channels - 1), s.lag_rate, s.lag_batch_rows
            ),
            "barrierPlacement": "head",  # channel 0's backlog plays in-flight data
        },
        done=done,
        timeout_s=s.query_timeout_s,
        parallelism=s.parallelism,
        after_batch=after_batch,
    )
    cp = next(c for c in run.completed if c.properties.get("request_id") == requested["id"])
    arrival: dict[int, int] = {}
    for i, b in enumerate(run.probe.batches):
        for cid, channel in b.barriers:
            if cid == cp.checkpoint_id:
                arrival.setdefault(channel, i)
    observed = (
        arrival[0] - max(v for c, v in arrival.items() if c != 0)
        if 0 in arrival and len(arrival) == s.channels
        else None
    )
    first = min(arrival.values())
    last = max(arrival.values())
    window = run.probe.batches[first : last + 1]
    prog = {p["batchId"]: p for p in run.progress}
    batch_ms = [
        float(prog[b.batch_id]["durationMs"].get("triggerExecution", 0))
        for b in window
        if b.batch_id in prog
    ]
    one = _checkpoint_dict(cp)
    return {
        "mode": mode,
        "lag": lag,
        "observed_lag_batches": observed,
        "checkpoint_id": one.pop("id"),
        **one,
        "start_delay_ms": cp.stats.max_start_delay_ms,
        "channel_state_bytes": cp.stats.channel_state_bytes,
        "micro_batch_ms_p50": _median(batch_ms),
        "batches_from_first_to_last_barrier": last - first,
        "backlog": [backlog0] + [others] * (s.channels - 1),
        "first_batch_ms": _first_batch_ms(run),
        "loadavg_start": run.loadavg_start,
        "query_wall_s": run.wall_s,
    }


def bench_lag(spark: Any, s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Measurement 4: every (mode, lag) case ``lag_reps`` times, in shuffled order."""
    samples: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    rng = random.Random(2)
    for rep in range(s.lag_reps):
        order = [(m, lag) for lag in s.lags for m in ("aligned", "unaligned")]
        rng.shuffle(order)
        for mode, lag in order:
            r = lag_query(spark, s, mode, lag)
            samples[(mode, lag)].append(r)
            log(
                f"  rep {rep + 1}/{s.lag_reps} lag {lag:>2} {mode:<9} {r['end_to_end_ms']:>7} ms "
                f"(observed lag {r['observed_lag_batches']}, alignment {r['alignment_ms']} ms, "
                f"channel state {r['channel_state_bytes']:,} B, batch p50 "
                f"{r['micro_batch_ms_p50'] or 0:.0f} ms, load {r['loadavg_start'][0]:.1f})"
            )
    cases = []
    for (mode, lag), rs in sorted(samples.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cases.append(
            {
                "mode": mode,
                "lag": lag,
                "observed_lag_batches": [r["observed_lag_batches"] for r in rs],
                "end_to_end_ms": _median([r["end_to_end_ms"] for r in rs]),
                "alignment_ms": _median([r["alignment_ms"] for r in rs]),
                "channel_state_bytes": _median([r["channel_state_bytes"] for r in rs]),
                "micro_batch_ms_p50": _median(
                    [r["micro_batch_ms_p50"] for r in rs if r["micro_batch_ms_p50"] is not None]
                ),
                "samples": rs,
            }
        )
    return {
        "batch_rows": s.lag_batch_rows,
        "rate": s.lag_rate,
        "warmup": s.lag_warmup,
        "lags": list(s.lags),
        "reps": s.lag_reps,
        "cases": cases,
    }


def source_cost(s: Settings, rows: int = 400_000, reps: int = 3) -> dict[str, float]:
    """What the source's ``read()`` costs per row without Spark: the generator's rows plus
    the barrier columns (:func:`~spark_ckpt.sources.channel_batch.channel_rows`), one channel's
    share
    at a time, in this process. Compared with ``toArrow`` it shows how much of that phase is
    generating rows and how much is Spark moving them (executor → JVM → driver)."""
    from spark_ckpt.sources.channel_batch import channel_rows, stream_schema
    from spark_ckpt.sources.generator import GENERATOR_SCHEMA, GeneratorSpec

    spec = GeneratorSpec(7, s.channels, 0.0, rows, key_cardinality=s.keys)
    schema = stream_schema(GENERATOR_SCHEMA)
    share = rows // s.channels
    gen: list[float] = []
    full: list[float] = []
    for rep in range(reps):
        t_gen = t_full = 0.0
        for c in range(s.channels):
            start = rep * share
            t0 = time.perf_counter()
            user = spec.rows(c, start, start + share)
            t1 = time.perf_counter()
            channel_rows(user, schema, c, start, (), s.channels)
            t2 = time.perf_counter()
            t_gen += t1 - t0
            t_full += t2 - t0
        gen.append(t_gen)
        full.append(t_full)
    return {
        "rows": share * s.channels,
        "generate_us_per_row": statistics.median(gen) / (share * s.channels) * 1e6,
        "read_us_per_row": statistics.median(full) / (share * s.channels) * 1e6,
    }


# --- report ----------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """The engine benchmark's machine info, plus Spark's."""
    import pyspark

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from engine import machine_info as engine_machine_info

    return {**engine_machine_info(), "pyspark": pyspark.__version__, "spark_master": "local[2]"}


def render(result: dict[str, Any]) -> str:
    """The human-readable table."""
    s = result["settings"]
    cal = result["calibration"]
    lines = [
        f"Calibration: {cal['capacity_rows_per_s']:,.0f} rows/s without checkpoints (batches of "
        f"{s['calibration_rows']:,}); offered rate {s['rate']:,.0f} rows/s; source read() "
        f"without Spark {cal['source_read']['read_us_per_row']:.2f} us/row (generator "
        f"{cal['source_read']['generate_us_per_row']:.2f})",
        f"Workload: generator, {s['channels']} channels, {s['keys']:,} keys, RunningCount at "
        f"parallelism {s['parallelism']} -> Delta (2PC), local[2]; load average "
        f"{result['loadavg_start'][0]:.1f} at start, {result['loadavg_end'][0]:.1f} at end",
    ]

    def title(section: str, su: dict[str, Any]) -> str:
        if section == "sustained":
            return (
                f"End to end (the production path: pipelined aligner, back-to-back batches, no "
                f"read limit), {su['offered_rows_per_s']:,.0f} rows/s offered, "
                f"{su['measured_batches']} batches measured, median of {su['reps']} "
                f"interleaved reps"
            )
        return (
            f"Saturated (the production path over a backlog: batches of {su['batch_rows']:,} "
            f"rows back to back, barriers at the read position), {su['measured_batches']} "
            f"batches measured, median of {su['reps']} interleaved reps"
        )

    for section in ("sustained", "saturated"):
        su = result.get(section)
        if not su:
            continue
        lines.append(title(section, su))
        for c in CONFIGS:
            lines.append(
                f"  {c:<12} {su['rows_per_s'][c]:>12,.0f} rows/s processed  (batch rows "
                f"median {su['batch_rows_median'][c] or 0:,.0f})"
            )
        lines.append(
            f"  ratio checkpoints/off {su['ratio']:.3f} ({su['ratio_min']:.2f}-"
            f"{su['ratio_max']:.2f}); {su['checkpoints_per_s']:.2f} checkpoints/s; checkpoint "
            f"duration p50 {su['checkpoint_end_to_end_ms']['p50'] or 0:.0f} ms, p95 "
            f"{su['checkpoint_end_to_end_ms']['p95'] or 0:.0f} ms"
        )
    tp = result.get("throughput")
    if tp:
        lines.append(
            f"Synchronous path (aligner inside foreachBatch), where the time goes: "
            f"{tp['rate']:,.0f} rows/s offered, trigger every {tp['trigger_s']} s "
            f"(~{tp['batch_rows']:,} rows per batch), median of {tp['reps']} interleaved reps"
        )
        for c in CONFIGS:
            lines.append(
                f"  {c:<12} {tp['rows_per_busy_s'][c]:>10,.0f} rows/s busy (triggerExecution)  "
                f"{tp['rows_per_foreach_batch_s'][c]:>10,.0f} rows/s in foreachBatch  "
                f"micro-batch p50 {tp['micro_batch_ms_p50'][c]:>5.0f} ms"
            )
        lines.append(
            f"  ratio checkpoints/off {tp['ratio']:.3f} ({tp['ratio_min']:.2f}-"
            f"{tp['ratio_max']:.2f}); foreachBatch only {tp['foreach_batch_ratio']:.3f}; "
            f"{tp['checkpoints_per_batch']:.2f} checkpoints per batch"
        )
        cost = tp["checkpoint_cost_ms"]
        lines.append(
            f"  checkpoint-only work per checkpoint: {tp['checkpoint_cost_ms_total'] or 0:.0f} ms "
            f"(latestOffset/coordinator {cost['latestOffset'] or 0:.0f}, async snapshot "
            f"{cost['snapshot_async'] or 0:.0f}, sink pre-commit {cost['sink_pre_commit'] or 0:.0f}"
            f", sync snapshot {cost['snapshot_sync'] or 0:.0f}, completion polling "
            f"{(cost['list_completed'] or 0) + (cost['committed_checkpoint'] or 0):.0f}); ratio "
            f"from phases {tp['ratio_from_phases']:.3f}"
        )
        lines.append(f"  where the time goes (us per row)      {'checkpoints':>11} {'off':>8}")
        for k in PHASES:
            lines.append(
                f"    foreachBatch: {k:<22} {tp['phases_us_per_row']['checkpoints'][k]:>11.3f} "
                f"{tp['phases_us_per_row']['off'][k]:>8.3f}"
            )
        for k in SPARK_DURATIONS:
            lines.append(
                f"    spark: {k:<29} {tp['spark_us_per_row']['checkpoints'][k]:>11.3f} "
                f"{tp['spark_us_per_row']['off'][k]:>8.3f}"
            )
    la = result.get("latency")
    if la:
        e2e, mb = la["end_to_end_ms"], la["micro_batch_ms"]
        lines.append(
            f"Checkpoint duration (every {la['interval_ms']} ms, default trigger, "
            f"{la['checkpoints']} checkpoints): p50 {e2e['p50'] or 0:.0f} ms, p95 "
            f"{e2e['p95'] or 0:.0f} ms; micro-batch p50 {mb['p50'] or 0:.0f} ms, p95 "
            f"{mb['p95'] or 0:.0f} ms (target: duration <= micro-batch + 50 ms)"
        )
        lines.append(
            f"  per checkpoint p50: alignment {la['alignment_ms_p50'] or 0:.0f} ms, sync "
            f"{la['sync_ms_p50'] or 0:.0f} ms, async {la['async_ms_p50'] or 0:.0f} ms, "
            f"{la['bytes_written_p50'] or 0:,.0f} B written"
        )
    lag = result.get("lag")
    if lag:
        lines.append(
            f"Lagging channel 0 (maxRowsPerTrigger {lag['batch_rows']:,}, "
            f"{lag['rate']:.0f} rows/s per channel, median of {lag['reps']}):"
        )
        lines.append(
            f"  {'lag':>3} {'mode':<9} {'observed':>8} {'duration ms':>11} {'alignment':>9} "
            f"{'channel state B':>15} {'batch p50 ms':>12}"
        )
        for c in lag["cases"]:
            observed = [o for o in c["observed_lag_batches"] if o is not None]
            # None: the lagging channel was cut before its barrier arrived (unaligned)
            seen = min(observed) if observed else "cut"
            lines.append(
                f"  {c['lag']:>3} {c['mode']:<9} {seen!s:>8} "
                f"{c['end_to_end_ms']:>11.0f} {c['alignment_ms']:>9.0f} "
                f"{c['channel_state_bytes']:>15,.0f} {c['micro_batch_ms_p50'] or 0:>12.0f}"
            )
    pr = result.get("profile")
    if pr:
        lines.append(
            f"cProfile of foreachBatch ({pr['rows']:,} rows, {pr['profiled_s']:.1f} s), "
            f"top self time:"
        )
        for e in pr["top_tottime"][:15]:
            lines.append(
                f"  {e['tottime_s']:>7.2f} s self {e['cumtime_s']:>7.2f} s cum  {e['function']}"
            )
    return "\n".join(lines)


#: Section name -> (what the log says, the measurement), in the order they run.
SECTION_RUNS: dict[str, tuple[str, Callable[[Any, Settings, Callable[[str], None]], Any]]] = {
    "sustained": (
        "sustained throughput, pipelined, back to back (checkpoints every 1 s vs off)",
        bench_sustained,
    ),
    "saturated": (
        "saturated throughput, pipelined, backlog (checkpoints every 1 s vs off)",
        bench_saturated,
    ),
    "throughput": ("throughput (checkpoints every 1 s vs off)", bench_throughput),
    "latency": ("checkpoint duration", bench_latency),
    "lag": ("lagging channel, aligned vs unaligned", bench_lag),
}
SECTIONS = tuple(SECTION_RUNS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (< 90 s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument("--reps", type=int, help="override the throughput repetitions")
    parser.add_argument("--profile", action="store_true", help="add a cProfile'd query")
    parser.add_argument("--only", choices=SECTIONS, action="append", help="run only these")
    parser.add_argument(
        "--rate", type=float, help="offered rows/s instead of the calibrated utilization"
    )
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    if args.reps:
        s = replace(s, reps=args.reps)
    sections = [n for n in SECTIONS if n in (args.only or SECTIONS)]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from spark_ckpt.spark.session import local_session

    # no progress bars on stderr (read when the JVM starts)
    os.environ.setdefault(
        "PYSPARK_SUBMIT_ARGS", "--conf spark.ui.showConsoleProgress=false pyspark-shell"
    )
    started = time.perf_counter()
    result: dict[str, Any] = {
        "quick": args.quick,
        "machine": machine_info(),
        "settings": {**asdict(s), "batch_rows": s.batch_rows},
        "loadavg_start": os.getloadavg(),
    }
    spark = local_session("spark-ckpt-bench")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        log("warm-up and calibration ...")
        result["calibration"] = calibrate(spark, s, log)
        result["calibration"]["source_read"] = source_cost(s)
        rate = args.rate or round(s.utilization * result["calibration"]["capacity_rows_per_s"], -4)
        s = replace(s, rate=max(rate, 20_000.0), latency_rate=max(rate, 20_000.0))
        result["settings"] = {**asdict(s), "batch_rows": s.batch_rows}
        for name in sections:
            title, bench = SECTION_RUNS[name]
            log(f"{title} ...")
            result[name] = bench(spark, s, log)
        if args.profile:
            log("cProfile of foreachBatch ...")
            result["profile"] = profile_foreach_batch(spark, s)
    finally:
        spark.stop()
    result["loadavg_end"] = os.getloadavg()
    result["elapsed_s"] = time.perf_counter() - started
    print(render(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=list) + "\n")
    print(f"wrote {args.out} in {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

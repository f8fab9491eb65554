"""Running one benchmark query (:func:`run_query`) and summarizing its measured batches
(:func:`summarize`)."""

from __future__ import annotations

import cProfile
import gc
import json
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchcommon import PIPELINE, stop_quietly

from pipelinebench.probe import Probe
from pipelinebench.settings import Settings, checkpoint_config, source_options
from pipelinebench.timing import PHASES, PhaseTimer
from spark_ckpt.coordination.requests import STOP
from spark_ckpt.pipeline.pipeline import Pipeline
from spark_ckpt.pipeline.pipeline_run import PipelineRun
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.operator import RunningCount

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

#: How often the driver loop reads the completed checkpoints when no batch ended meanwhile.
COMPLETED_POLL_S = 1.0


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
    """Start one query on a fresh root, run it until ``done(probe)``, stop it (with a final
    checkpoint) and collect what it recorded. The root is deleted afterwards.

    The run is prepared with a :class:`PhaseTimer` as its tracer. The completed checkpoints
    are read from the pipeline's store by this (the driver's main) thread after every batch,
    and every :data:`COMPLETED_POLL_S` otherwise, into ``probe.completed``: retention keeps
    only the latest ones, so the ones of the measured window are collected while it runs.
    The final checkpoint of the stop is left out."""
    root = tempfile.mkdtemp(prefix=f"spark-ckpt-bench-{label}-")
    try:
        gc.collect()
        load = os.getloadavg()
        pipeline = Pipeline(spark, PIPELINE, config=config, root=os.path.join(root, "pipeline"))
        timer = PhaseTimer()
        prepared = pipeline.prepare(
            source,
            RunningCount("counter", "user_id"),
            output=os.path.join(root, "out"),
            parallelism=parallelism,
            pipelined=pipelined,
            tracer=timer,
        )
        hook = None if after_batch is None else (lambda i: after_batch(pipeline, i))
        probe = Probe(prepared.function, timer, after_batch=hook, profiler=profiler)

        def watch() -> None:
            for c in pipeline.client.checkpoints():
                probe.completed.setdefault(c.checkpoint_id, c)

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
            polled, batches = 0.0, -1
            while True:
                if len(probe.batches) != batches or time.monotonic() - polled > COMPLETED_POLL_S:
                    batches, polled = len(probe.batches), time.monotonic()
                    watch()
                if done(probe):
                    break
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
            stop_quietly(run)
        del probe.batches[seen:]
        watch()
        # the final checkpoint of the benchmark's own stop is not part of the measurement
        completed = {k: c for k, c in probe.completed.items() if STOP not in c.properties}
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
    data ran, in configuration *name*. With *trigger_s* (and the input below capacity) every
    steady-state batch holds one period's input; without, batches run back to back."""
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


def checkpoint_dict(c: CompletedCheckpoint) -> dict[str, Any]:
    """One checkpoint's figures for the JSON."""
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


def first_batch_ms(run: QueryRun) -> float | None:
    """Spark's duration of the query's first batch (worker start-up), for reference."""
    if not run.probe.batches:
        return None
    first = run.probe.batches[0].batch_id
    for p in run.progress:
        if p["batchId"] == first:
            return float(p["durationMs"].get("triggerExecution", 0))
    return None


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
        "checkpoints": [checkpoint_dict(c) for c in cps],
        "first_batch_ms": first_batch_ms(run),
        "loadavg_start": run.loadavg_start,
        "query_wall_s": run.wall_s,
    }

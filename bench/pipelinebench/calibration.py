"""Warm-up and calibration: the capacity of the pipeline without checkpoints, which sets the
rate offered to the throughput and latency queries; and what the source's ``read()`` costs
without Spark."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from pipelinebench.query import first_batch_ms, run_query
from pipelinebench.settings import Settings, source_options
from spark_ckpt.runtime.config import CheckpointConfig


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
        f"{s.calibration_rows:,}; first batch {first_batch_ms(run) or 0:.0f} ms)"
    )
    return {
        "rows": rows,
        "busy_s": busy / 1000,
        "capacity_rows_per_s": capacity,
        "first_batch_ms": first_batch_ms(run),
        "loadavg_start": run.loadavg_start,
    }


def source_cost(s: Settings, rows: int = 400_000, reps: int = 3) -> dict[str, float]:
    """What the source's ``read()`` costs per row without Spark: the generator's rows plus
    the barrier columns (:func:`~spark_ckpt.sources.channel_batch.channel_rows`), one channel's
    share at a time, in this process. Compared with ``toArrow`` it shows how much of that
    phase is generating rows and how much is Spark moving them (executor → JVM → driver)."""
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

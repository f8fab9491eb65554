"""Sections 1 and 2, ``throughput``: the synchronous path (the aligner inside
``foreachBatch``) with checkpoints every second vs off, and where the time goes."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from typing import Any

from pipelinebench.query import SPARK_DURATIONS, steady_query, summarize
from pipelinebench.settings import CONFIGS, Settings
from pipelinebench.stats import median, per_row_us
from pipelinebench.timing import CHECKPOINT_PHASES, PHASES


def bench_throughput(spark: Any, s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Both configurations with a processing-time trigger (identical batches), repetitions
    interleaved; the phase timers' figures per row, and the work only checkpointing does per
    checkpoint."""
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
    scale = sum(r["rows"] for r in ck) / sum(r["rows"] for r in off)
    extra_s = {
        k: sum(r["phases_s"][k] for r in ck) - sum(r["phases_s"][k] for r in off) * scale
        for k in CHECKPOINT_PHASES
    }
    extra_s["latestOffset"] = (
        sum(r["spark_s"]["latestOffset"] for r in ck)
        - sum(r["spark_s"]["latestOffset"] for r in off) * scale
    )
    n_checkpoints = sum(len(r["checkpoints"]) for r in ck)
    base_us = per_row_us(off, "spark_s", "triggerExecution")
    extra_us = sum(extra_s.values()) / sum(r["rows"] for r in ck) * 1e6
    ratios = [c["rows_per_busy_s"] / o["rows_per_busy_s"] for c, o in pairs]
    fb_ratios = [c["rows_per_foreach_batch_s"] / o["rows_per_foreach_batch_s"] for c, o in pairs]
    return {
        "rate": s.rate,
        "trigger_s": s.trigger_s,
        "batch_rows": s.batch_rows,
        "reps": s.reps,
        "rows_per_busy_s": {c: median([r["rows_per_busy_s"] for r in runs[c]]) for c in CONFIGS},
        "ratio": median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "rows_per_foreach_batch_s": {
            c: median([r["rows_per_foreach_batch_s"] for r in runs[c]]) for c in CONFIGS
        },
        "foreach_batch_ratio": median(fb_ratios),
        "micro_batch_ms_p50": {
            c: median([ms for r in runs[c] for ms in r["batch_ms"]]) for c in CONFIGS
        },
        "phases_us_per_row": {
            c: {k: per_row_us(runs[c], "phases_s", k) for k in PHASES} for c in CONFIGS
        },
        "spark_us_per_row": {
            c: {k: per_row_us(runs[c], "spark_s", k) for k in SPARK_DURATIONS} for c in CONFIGS
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

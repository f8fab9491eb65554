"""Section 3, ``latency``: checkpoint duration next to the micro-batch duration."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from pipelinebench.query import steady_query, summarize
from pipelinebench.settings import Settings
from pipelinebench.stats import median, pct


def bench_latency(spark: Any, s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Checkpoints every ``interval_ms`` with the default trigger and no read limit (batches
    run back to back, each reading everything produced during the previous one, so every
    barrier is delivered by the batch planned when it was triggered)."""
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
            f"{pct(e2e, 50) or 0:.0f} ms; micro-batch p50 {median(summary['batch_ms']) or 0:.0f}"
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
            "p50": pct(e2e, 50),
            "p95": pct(e2e, 95),
            "max": max(e2e, default=None),
        },
        "micro_batch_ms": {"p50": median(batch_ms), "p95": pct(batch_ms, 95)},
        "alignment_ms_p50": pct([c["alignment_ms"] for c in cps], 50),
        "sync_ms_p50": pct([c["sync_ms"] for c in cps], 50),
        "async_ms_p50": pct([c["async_ms"] for c in cps], 50),
        "bytes_written_p50": pct([c["bytes_written"] for c in cps], 50),
        "runs": runs,
    }

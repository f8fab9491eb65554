"""The production path (pipelined aligner), both configurations side by side: what the
``sustained`` and ``saturated`` sections share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipelinebench.query import QueryRun, checkpoint_dict, run_query
from pipelinebench.settings import CONFIGS, Settings, checkpoint_config
from pipelinebench.stats import median, pct


def pipelined_window(run: QueryRun, warmup: int, measured: int) -> dict[str, Any]:
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
        "checkpoints": [checkpoint_dict(c) for c in cps],
        "loadavg_start": run.loadavg_start,
    }


def pipelined_pairs(
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
            summary = pipelined_window(run, warmup, measured)
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
        "rows_per_s": {c: median([r["rows_per_s"] for r in runs[c]]) for c in CONFIGS},
        "ratio": median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "checkpoints_per_s": sum(len(r["checkpoints"]) for r in runs["checkpoints"])
        / sum(r["wall_s"] for r in runs["checkpoints"]),
        "checkpoint_end_to_end_ms": {"p50": pct(e2e, 50), "p95": pct(e2e, 95)},
        "batch_rows_median": {
            c: median([n for r in runs[c] for n in r["batch_rows"]]) for c in CONFIGS
        },
        "runs": runs,
    }

"""The human-readable summary of a result (:func:`render`), printed after a run."""

from __future__ import annotations

from typing import Any

from pipelinebench.query import SPARK_DURATIONS
from pipelinebench.settings import CONFIGS
from pipelinebench.timing import PHASES


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

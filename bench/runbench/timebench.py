"""The time bench (``bench/time.py``, #41's acceptance): event-time windows, timers and state
TTL, each against a baseline measured in the same run (``bench/README.md``, section "Time").

One SparkSession (``local[2]``), exactly-once checkpoints every ``interval_ms`` for every
spark-ckpt query (``CheckpointConfig.from_options``). Two sections, in this order:

**Windows** (:func:`run_windows`). Per key (``keys`` uniform keys, ``channels`` generator
channels) the count of each tumbling event-time window of ``window_ms``, rows out of order
by up to 2 s, a watermark that trails by 2 s (:mod:`runbench.time_variants`). The lines:

* ``spark-ckpt`` — ``WindowAggregate(..., Windows.tumbling(window_ms), [Agg.count()])``, its
  subtasks placed as ``placement`` says, into Delta;
* ``spark-window`` — Spark's own ``withWatermark`` + ``groupBy(window(ts), user_id).count()``
  in append mode, on the ``spark_state_store`` provider, into ``spark_sink``;
* ``tws`` — ``transformWithStateInPandas`` with event-time timers
  (:class:`runbench.tws.WindowCounter`), on RocksDB (the API refuses any other provider),
  into ``spark_sink``;
* ``spark-ckpt/small`` — the ``spark-ckpt`` line with windows of ``small_window_ms``: nearly
  every row opens a window of its own, so the operator registers and fires about one
  event-time timer per row.

Every line reads the same generated rows: a backlog far longer than any run reads (so the
input is faster than the processing: saturated), event time advancing ``event_rate`` rows per
second per channel, ``maxRowsPerTrigger`` of ``batch_rows`` (``tws_batch_rows`` for
``tws``, whose micro-batches of ``batch_rows`` would take minutes). Each line runs once
unmeasured (``warmup_round``), then ``reps`` repetitions run every line once in ABBA order,
each after a bounded wait for a quiet machine (:func:`~runbench.procstat.settle`). A run's
rows/s come from Spark's query progress over a steady window (``window_s``, ``tws_window_s``
for ``tws``: long enough that windows close and timers fire in it) after ``warmup_batches``
batches with data and ``warmup_s`` (:func:`~runbench.steady.steady_window`); spark-ckpt's
timers fired and registered per second, and the late and dropped rows, from the statistics
history of the checkpoints in that window (:func:`~runbench.timestats.rate_between`).
Ratios: per repetition ``spark-ckpt / spark-window``, ``spark-ckpt / tws`` and
``spark-ckpt/small / spark-ckpt``; median with a bootstrap 95% interval
(:func:`~runbench.steady.paired_ratios`).

**TTL** (:func:`run_ttl_section`). Deduplication (:class:`runbench.dedup.Dedup`) of a
generator whose every row has a new key (``ttl_keys`` uniform keys: a key seen twice is
improbable), ``ttl_rate`` rows/s per channel, ``WatermarkStrategy.no_watermarks()``, for
``ttl_duration_s``; first with ``ttl=StateTtlConfig.of(ttl_ms)``, then without a TTL. Every
checkpoint's state bytes, bytes written and keys in the state
(:func:`~runbench.timestats.state_series`), the RSS of the Python workers, whether each
series is flat or growing (:func:`~runbench.timestats.growth`), and the ratio TTL / no TTL
of each at the end of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from benchcommon import PIPELINE, git_info, spark_machine_info, stop_quietly

from runbench.measure import abba, measure_variant
from runbench.procstat import PyGcTimer, settle
from runbench.steady import Window, paired_ratios, spread, steady_window
from runbench.time_variants import (
    SPARK_SINKS,
    STATE_STORES,
    checkpoint_options,
    ckpt_windows,
    spark_windows,
    tws_windows,
)
from runbench.timestats import COUNTERS, Point, growth, rate_between, state_series
from runbench.variants import Started, VariantStart, Workload

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results" / "time.json"
QUICK_OUT = Path("/tmp/time_quick.json")

#: What the JSON says about the baselines' configuration.
NOTES = {
    "tws_state_store": (
        "RocksDBStateStoreProvider: with any other provider (the default "
        "HDFSBackedStateStoreProvider) transformWithStateInPandas fails at the first "
        "micro-batch with UNSUPPORTED_FEATURE.STORE_BACKEND_NOT_SUPPORTED_FOR_TWS"
    ),
    "spark_sinks": (
        "parquet: Spark's file sink, exactly-once through its _spark_metadata log (no Delta "
        "Spark JAR here); noop: nothing written. spark-ckpt writes Delta (two-phase commit)"
    ),
}

#: Rows per channel at the start: far more than any run reads (made on demand).
BACKLOG_PER_CHANNEL = 10**10


@dataclass(frozen=True)
class TimeSettings:
    master: str
    channels: int
    parallelism: int
    interval_ms: int
    placement: str  # where spark-ckpt's subtasks run
    # -- windows
    keys: int
    event_rate: int  # rows per second of event time, per channel
    window_ms: int
    small_window_ms: int  # spark-ckpt/small: about a timer per row
    spark_state_store: str  # spark-window's provider (STATE_STORES); tws always RocksDB
    spark_sink: str  # SPARK_SINKS
    batch_rows: int  # maxRowsPerTrigger
    tws_batch_rows: int
    reps: int
    warmup_round: bool  # every line once, unmeasured, before the repetitions
    warmup_batches: int
    warmup_s: float
    window_s: float
    tws_window_s: float
    warmup_query_s: float  # the unmeasured round's windows
    settle_cores: float
    settle_timeout_s: float
    query_timeout_s: float
    # -- TTL
    ttl_rate: int  # rows per second, per channel: every row a new key
    ttl_keys: int
    ttl_ms: int
    ttl_duration_s: float
    # -- the windows section's lines (None: all of them)
    lines: tuple[str, ...] | None = None


FULL = TimeSettings(
    master="local[2]",
    channels=2,
    parallelism=2,
    interval_ms=1000,
    placement="executors",
    keys=100_000,
    event_rate=5_000,
    window_ms=10_000,
    small_window_ms=100,
    spark_state_store="hdfs",
    spark_sink="parquet",
    batch_rows=300_000,
    tws_batch_rows=20_000,
    reps=4,
    warmup_round=True,
    warmup_batches=3,
    warmup_s=8.0,
    window_s=30.0,
    tws_window_s=60.0,
    warmup_query_s=10.0,
    settle_cores=0.3,
    settle_timeout_s=60.0,
    query_timeout_s=900.0,
    ttl_rate=5_000,
    ttl_keys=10**15,
    ttl_ms=60_000,
    ttl_duration_s=600.0,
)
QUICK = replace(
    FULL,
    batch_rows=200_000,
    tws_batch_rows=10_000,
    reps=1,
    warmup_round=False,
    warmup_batches=2,
    warmup_s=3.0,
    window_s=12.0,  # at least two checkpoints in it, for the timers per second
    tws_window_s=20.0,
    settle_timeout_s=0.0,
    query_timeout_s=300.0,
    ttl_ms=10_000,
    ttl_duration_s=60.0,
)


# -- the windows section ------------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    """A line of the windows section: how to start it, its read limit and its window."""

    name: str
    start: VariantStart
    batch_rows: int
    window_s: float
    spark_ckpt: bool


def window_source(s: TimeSettings, batch_rows: int) -> dict[str, object]:
    """The generator's ``ckpt-source`` options of every line (only the read limit differs)."""
    return {
        "source": "generator",
        "channels": s.channels,
        "rate": s.event_rate,
        "backlog": ",".join([str(BACKLOG_PER_CHANNEL)] * s.channels),
        "keys": s.keys,
        "seed": 7,
        "maxRowsPerTrigger": batch_rows,
    }


def lines(s: TimeSettings) -> list[Line]:
    return [
        Line(
            "spark-ckpt",
            ckpt_windows(s.window_ms, s.placement),
            s.batch_rows,
            s.window_s,
            True,
        ),
        Line(
            "spark-window",
            spark_windows(s.window_ms, s.spark_state_store, s.spark_sink),
            s.batch_rows,
            s.window_s,
            False,
        ),
        Line(
            "tws", tws_windows(s.window_ms, s.spark_sink), s.tws_batch_rows, s.tws_window_s, False
        ),
        Line(
            "spark-ckpt/small",
            ckpt_windows(s.small_window_ms, s.placement),
            s.batch_rows,
            s.window_s,
            True,
        ),
    ]


#: The ratios of the windows section: (numerator line, denominator line).
RATIOS = (
    ("spark-ckpt", "spark-window"),
    ("spark-ckpt", "tws"),
    ("spark-ckpt/small", "spark-ckpt"),
)


def points_of(history: Sequence[Any], rows_before: dict[int, int] | None = None) -> list[Point]:
    """The completed checkpoints (not savepoints, not a stop's final checkpoint) of a
    statistics history as :class:`Point`, by id; *rows_before*: data rows read before each
    checkpoint's barrier, by id, where known."""
    from spark_ckpt.coordination.requests import STOP
    from spark_ckpt.protocol.barrier import SnapshotType

    out = []
    for r in history:
        if r.stats is None or r.snapshot_type is not SnapshotType.CHECKPOINT:
            continue
        if STOP in r.properties:
            continue
        st = r.stats
        out.append(
            Point(
                checkpoint_id=r.checkpoint_id,
                trigger_ms=st.trigger_ms,
                completed_ms=st.completed_ms,
                state_bytes=st.state_bytes,
                bytes_written=st.bytes_written,
                timers_fired=st.timers_fired,
                timers_registered=st.timers_registered,
                ttl_expired=st.ttl_expired,
                late_rows=st.late_rows,
                dropped_rows=st.dropped_rows,
                watermark_ms=st.watermark_ms,
                rows_before=None if rows_before is None else rows_before.get(r.checkpoint_id),
            )
        )
    return sorted(out, key=lambda p: p.checkpoint_id)


def ckpt_extra(started: Started, window: Window, batches: list[dict[str, Any]]) -> dict[str, Any]:
    """A spark-ckpt run's time counters per second over its window (from the statistics
    history, read once the query stopped)."""
    assert started.pipeline is not None
    points = points_of(started.pipeline.client.history())
    start_ms = window.start_s * 1000
    end_ms = start_ms + window.seconds * 1000
    rates = {c: rate_between(points, start_ms, end_ms, c) for c in COUNTERS if c != "ttl_expired"}
    fired = rates["timers_fired"]
    per_row = fired["per_s"] / window.rows_per_s if fired and fired["per_s"] is not None else None
    return {
        "time": rates,
        "timers_fired_per_s": fired["per_s"] if fired else None,
        # a timer fires per window emitted: the lines' emitted windows per row should agree
        "windows_emitted_per_row": per_row,
    }


#: Spark's state operator figures a run sums over its window's batches.
SPARK_SUMMED = ("numRowsUpdated", "numRowsRemoved", "numRowsDroppedByWatermark")


def spark_extra(started: Started, window: Window, batches: list[dict[str, Any]]) -> dict[str, Any]:
    """A Spark run's output rows and state operator figures over its window (from the query
    progress): sums of :data:`SPARK_SUMMED` and of the custom metrics that count timers,
    and the last batch's state rows."""
    inside = [b for b in batches if window.first <= int(b["batchId"]) <= window.last]
    out_rows = [int(b.get("sink", {}).get("numOutputRows", -1)) for b in inside]
    summed: dict[str, int] = {}
    for b in inside:
        for op in b.get("stateOperators") or ():
            for k in SPARK_SUMMED:
                summed[k] = summed.get(k, 0) + int(op.get(k, 0))
            for k, v in (op.get("customMetrics") or {}).items():
                if "imer" in k:  # numRegisteredTimers, numDeletedTimers, timerProcessingTimeMs..
                    summed[k] = summed.get(k, 0) + int(v)
    last = (inside[-1].get("stateOperators") or [{}])[0] if inside else {}
    # a window emitted is a state row removed (groupBy) or a timer that fired and was
    # deleted (transformWithState; its map entry is a removed row too)
    emitted = summed.get("numDeletedTimers", summed.get("numRowsRemoved"))
    return {
        "output_rows": sum(out_rows) if out_rows and min(out_rows) >= 0 else None,
        "state_operator": summed,
        "state_rows_last": last.get("numRowsTotal"),
        "windows_emitted_per_row": emitted / window.rows if emitted is not None else None,
    }


def dropped_rows(run: dict[str, Any]) -> int:
    """The rows a run dropped behind its watermark in its window (none should be: the
    disorder is within the bound)."""
    if "time" in run:
        return int((run["time"]["dropped_rows"] or {}).get("count", 0))
    return int(run.get("state_operator", {}).get("numRowsDroppedByWatermark", 0))


def run_windows(spark: Any, s: TimeSettings, log: Any) -> dict[str, Any]:
    """The windows section (see the module docstring)."""
    table = {line.name: line for line in lines(s) if s.lines is None or line.name in s.lines}
    names = list(table)
    py_gc = PyGcTimer().install()

    def one(name: str, window_s: float, warmup_s: float) -> dict[str, Any]:
        line = table[name]
        return measure_variant(
            spark,
            name,
            line.start,
            Workload(window_source(s, line.batch_rows), s.parallelism, s.interval_ms),
            window=partial(
                steady_window,
                warmup_batches=s.warmup_batches,
                warmup_s=warmup_s,
                window_s=window_s,
            ),
            timeout_s=s.query_timeout_s,
            py_gc=py_gc,
            extra=ckpt_extra if line.spark_ckpt else spark_extra,
        )

    warmup = []
    if s.warmup_round:
        for name in names:
            r = one(name, max(s.warmup_query_s, table[name].window_s / 3), 0.0)
            warmup.append(r)
            log(f"  warm-up {name:<18} {r['rows_per_s']:>10,.0f} rows/s (not measured)")
    runs: list[dict[str, Any]] = []
    for rep in range(s.reps):
        for name in abba(names, rep):
            quiet = settle(s.settle_cores, s.settle_timeout_s) if s.settle_timeout_s > 0 else None
            r = one(name, table[name].window_s, s.warmup_s)
            r.update(rep=rep, settle=quiet)
            runs.append(r)
            d = r["diagnostics"] or {}
            timers = r.get("timers_fired_per_s")
            log(
                f"  rep {rep + 1}/{s.reps} {name:<18} {r['rows_per_s']:>10,.0f} rows/s "
                f"({r['window']['batches']} batches in {r['window']['seconds']:.1f} s"
                + (f", {timers:,.0f} timers fired/s" if timers is not None else "")
                + (f", {r['output_rows']:,} rows out" if r.get("output_rows") is not None else "")
                + f"; cores other {d.get('other_cores', 0):.2f}; load "
                f"{r['loadavg_start'][0]:.1f})"
            )
    by_line = {n: [r["rows_per_s"] for r in runs if r["variant"] == n] for n in names}
    ratios = {
        f"{a} : {b}": paired_ratios(by_line[a], by_line[b])
        for a, b in RATIOS
        if a in by_line and b in by_line
    }
    timers = {
        n: spread(
            [
                r["timers_fired_per_s"]
                for r in runs
                if r["variant"] == n and r["timers_fired_per_s"] is not None
            ]
        )
        for n in names
        if table[n].spark_ckpt
    }
    emitted = {
        n: spread(
            [
                r["windows_emitted_per_row"]
                for r in runs
                if r["variant"] == n and r["windows_emitted_per_row"] is not None
            ]
        )
        for n in names
    }
    return {
        "lines": names,
        "rows_per_s": {n: spread(v) for n, v in by_line.items()},
        "ratios": ratios,
        "timers_fired_per_s": timers,
        "windows_emitted_per_row": emitted,
        "dropped_rows": {n: sum(dropped_rows(r) for r in runs if r["variant"] == n) for n in names},
        "warmup_runs": warmup,
        "runs": runs,
    }


# -- the TTL section ----------------------------------------------------------------------------
def ttl_source(s: TimeSettings) -> dict[str, object]:
    """Every row a new key: ``ttl_keys`` uniform keys, ``ttl_rate`` rows/s per channel."""
    return {
        "source": "generator",
        "channels": s.channels,
        "rate": s.ttl_rate,
        "keys": s.ttl_keys,
        "seed": 11,
    }


def run_ttl(spark: Any, s: TimeSettings, ttl_ms: int | None, log: Any) -> dict[str, Any]:
    """One dedup run of ``ttl_duration_s`` (see the module docstring): the series of its
    checkpoints and of the Python workers' RSS, and the keys a reader finds in its last
    checkpoint."""
    from runbench.dedup import Dedup
    from runbench.procstat import jvm_pid
    from runbench.state_size import Rss
    from spark_ckpt import CheckpointConfig, Pipeline, StateReader, WatermarkStrategy

    label = "ttl" if ttl_ms is not None else "no-ttl"
    root = tempfile.mkdtemp(prefix=f"spark-ckpt-bench-time-{label}-")
    rss = Rss(jvm_pid())
    try:
        pipeline = Pipeline(
            spark,
            PIPELINE,
            config=CheckpointConfig.from_options(checkpoint_options(s.interval_ms)),
            root=os.path.join(root, "pipeline"),
        )
        started_ms = time.time() * 1000
        run = pipeline.start(
            ttl_source(s),
            Dedup(ttl_ms),
            output=os.path.join(root, "out"),
            parallelism=s.parallelism,
            placement=s.placement,
            watermark=WatermarkStrategy.no_watermarks(),
        )
        rows_before: dict[int, int] = {}
        rss_series: list[dict[str, float]] = []
        next_rss = 0.0
        try:
            deadline = time.monotonic() + s.ttl_duration_s
            while time.monotonic() < deadline:
                if run.query.exception() is not None:
                    raise RuntimeError(f"{label}: the query failed: {run.query.exception()}")
                for c in pipeline.client.checkpoints():
                    rows_before.setdefault(c.checkpoint_id, sum(c.offsets().values()))
                if time.monotonic() >= next_rss:
                    now = rss.now()
                    rss_series.append({"t_s": round(time.time() - started_ms / 1000, 1), **now})
                    next_rss = time.monotonic() + 5.0
                time.sleep(0.5)
        finally:
            stop_quietly(run)
        points = points_of(pipeline.client.history(), rows_before)
        points = [p for p in points if p.trigger_ms >= started_ms]
        series = state_series(points, started_ms)
        reader = StateReader.open(pipeline.root)
        final_keys = reader.keyed("dedup", "seen").num_rows
        known = [x for x in series if x["state_keys"] is not None]
        log(
            f"  {label}: {len(series)} checkpoints, the last {series[-1]['state_bytes'] / 1e6:,.1f}"
            " MB of state"
            + (f", {known[-1]['state_keys']:,} keys" if known else "")
            + f"; the final checkpoint (of the stop) holds {final_keys:,} keys"
        )
        return {
            "ttl_ms": ttl_ms,
            "series": series,
            "rss_mb": rss_series,
            "final_checkpoint_keys": final_keys,
            "final_checkpoint_id": reader.checkpoint_id,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


#: The series :func:`run_ttl_section` compares, TTL against none.
TTL_FIELDS = ("state_bytes", "bytes_written", "state_keys")


def run_ttl_section(spark: Any, s: TimeSettings, log: Any) -> dict[str, Any]:
    """The TTL section: with the TTL, then without; growth of each series and the ratios
    TTL / no TTL of each series' mean over the last tenth of the runs, and of the bytes
    written over their second halves."""
    runs = {
        "ttl": run_ttl(spark, s, s.ttl_ms, log),
        "no-ttl": run_ttl(spark, s, None, log),
    }
    shape = {
        label: {f: growth(r["series"], f, s.ttl_duration_s) for f in TTL_FIELDS}
        for label, r in runs.items()
    }
    for label, r in runs.items():  # not compared: it holds whatever ran before in the session
        workers = [{"t_s": x["t_s"], "python_workers": x["python_workers"]} for x in r["rss_mb"]]
        shape[label]["python_workers_rss_mb"] = growth(workers, "python_workers", s.ttl_duration_s)
    ratios: dict[str, float | None] = {}
    for f in TTL_FIELDS:
        a, b = shape["ttl"][f]["end"], shape["no-ttl"][f]["end"]
        ratios[f] = a / b if a is not None and b else None
    a, b = (
        shape["ttl"]["bytes_written"]["second_half"],
        shape["no-ttl"]["bytes_written"]["second_half"],
    )
    ratios["bytes_written_second_half"] = a / b if a is not None and b else None
    return {"runs": runs, "growth": shape, "ratio_ttl_over_no_ttl": ratios}


# -- report -------------------------------------------------------------------------------------
def _ci(r: dict[str, Any]) -> str:
    ci = r.get("median_ci95")
    return f" (95% CI {ci[0]:.2f}-{ci[1]:.2f})" if ci else ""


def render(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines_out = [
        f"Time{' (QUICK smoke run)' if result['quick'] else ''}: {s['master']}, "
        f"{s['placement']}, checkpoints every {s['interval_ms']} ms; load "
        f"{result['loadavg_start'][0]:.1f} -> {result['loadavg_end'][0]:.1f}"
    ]
    w = result.get("windows")
    if w:
        lines_out.append(
            f"  windows: {s['keys']:,} keys, {s['window_ms'] / 1000:g} s tumbling windows, "
            f"{s['event_rate']:,} rows per event-second per channel, {s['reps']} reps ABBA"
        )
        for n, sp in w["rows_per_s"].items():
            em = w["windows_emitted_per_row"][n]
            lines_out.append(
                f"    {n:<18} median {sp['median']:>10,.0f} rows/s "
                f"(min {sp['min']:,.0f}, max {sp['max']:,.0f})"
                + (f"; windows emitted per row {em['median']:.2f}" if em["n"] else "")
                + f"; rows dropped {w['dropped_rows'][n]}"
            )
        for pair, r in w["ratios"].items():
            lines_out.append(
                f"    ratio {pair}: {r['median']:.3f}{_ci(r)}, min {r['min']:.3f}, "
                f"max {r['max']:.3f}"
            )
        for n, sp in w["timers_fired_per_s"].items():
            if sp["n"]:
                lines_out.append(f"    {n}: median {sp['median']:,.0f} timers fired/s")
    t = result.get("ttl")
    if t:
        lines_out.append(
            f"  TTL: {s['ttl_duration_s']:.0f} s of new keys at {s['ttl_rate'] * s['channels']:,} "
            f"rows/s, TTL {s['ttl_ms'] / 1000:g} s against none"
        )
        for label, g in t["growth"].items():
            parts = []
            for f, x in g.items():
                if x["end"] is None:
                    continue
                eom = x["end_over_mid"]
                parts.append(
                    f"{f} end {x['end']:,.0f}"
                    + (f" (end/mid {eom:.2f})" if eom is not None else "")
                )
            lines_out.append(f"    {label}: " + "; ".join(parts))
        lines_out.append(
            "    TTL / no TTL (end; bytes written also over the second half): "
            + ", ".join(
                f"{f} {v:.3f}" for f, v in t["ratio_ttl_over_no_ttl"].items() if v is not None
            )
        )
    return "\n".join(lines_out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (~7 min)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    parser.add_argument("--only", choices=("windows", "ttl"), help="one section only")
    parser.add_argument("--reps", type=int, help="repetitions of the windows section")
    parser.add_argument("--window", type=float, help="measured window of a run, seconds")
    parser.add_argument("--placement", choices=("driver", "executors"))
    parser.add_argument("--event-rate", type=int, help="rows per event-second per channel")
    parser.add_argument("--spark-state-store", choices=sorted(STATE_STORES))
    parser.add_argument("--spark-sink", choices=SPARK_SINKS)
    parser.add_argument("--ttl-duration", type=float, help="seconds of each TTL run")
    parser.add_argument(
        "--lines", help="comma-separated lines of the windows section (default: all)"
    )
    parser.add_argument(
        "--settle-timeout", type=float, help="max wait for a quiet machine before each run"
    )
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    overrides = {
        "reps": args.reps,
        "window_s": args.window,
        "placement": args.placement,
        "event_rate": args.event_rate,
        "spark_state_store": args.spark_state_store,
        "spark_sink": args.spark_sink,
        "ttl_duration_s": args.ttl_duration,
        "settle_timeout_s": args.settle_timeout,
        "lines": tuple(args.lines.split(",")) if args.lines else None,
    }
    s = replace(s, **{k: v for k, v in overrides.items() if v is not None})
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from spark_ckpt import local_session

    began = time.perf_counter()
    result: dict[str, Any] = {
        "quick": args.quick,
        "machine": {**spark_machine_info(), "spark_master": s.master},
        "git": git_info(),
        "settings": asdict(s),
        "only": args.only,
        "notes": NOTES,
        "loadavg_start": os.getloadavg(),
    }
    spark = local_session(
        "spark-ckpt-time", master=s.master, shuffle_partitions=s.parallelism, log_level="ERROR"
    )
    try:
        if args.only in (None, "windows"):
            log("windows")
            result["windows"] = run_windows(spark, s, log)
        if args.only in (None, "ttl"):
            log("TTL")
            result["ttl"] = run_ttl_section(spark, s, log)
    finally:
        spark.stop()
    result["loadavg_end"] = os.getloadavg()
    result["elapsed_s"] = round(time.perf_counter() - began, 1)
    print(render(result))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=list) + "\n")
    print(f"wrote {out} in {result['elapsed_s']:.0f} s")
    return 0

"""The graphs bench (``bench/graphs.py``): two inputs joined by spark-ckpt's interval join
against Spark's own stream-stream join, and a one-stage job run as a one-input graph against
the same job written as today, each against its baseline measured in the same run
(``bench/README.md``, section "Graphs").

One SparkSession (``local[2]``), exactly-once checkpoints every ``interval_ms`` for every
spark-ckpt query (:func:`runbench.time_variants.checkpoint_options`), its subtasks placed as
``placement`` says. The lines (:mod:`runbench.graph_variants`):

* ``spark-ckpt/join`` — ``IntervalJoin("clicks", "impressions", key="user_id", lower=-5 s,
  upper=+5 s, time="event_ts")`` over two generated inputs, a watermark bound of 2 s on
  both, into Delta;
* ``spark-join`` — Spark's stream-stream inner join of the same rows (``withWatermark`` of
  2 s on both sides, the same time-range condition), into ``spark_sink``;
* ``count/today`` — the keyed running count over one generated source, ``Pipeline.start(
  source, RunningCount(...))``, into Delta;
* ``count/graph`` — the same job given as a one-input graph, ``sources={"only": source}``;
* ``stages/spark-ckpt`` — two keyed stages over the count lines' input
  (:func:`runbench.graph_variants.ckpt_stages`): per-user running counts
  (:class:`runbench.two_stages.UserCounts`), then, re-keyed by country, per-country sums over
  tumbling 5 s event-time windows (``WindowAggregate``), a watermark bound of 2 s, into Delta;
* ``stages/spark`` — Spark chaining two of its stateful operators in one query, append mode:
  per-user counts per 5 s window, then per-country sums over ``window(window_time(window),
  5 s)`` (:func:`runbench.graph_variants.spark_stages`), into ``spark_sink``;
* ``stages/spark-pandas`` (opt-in: only when ``--lines`` names it) — Spark's
  ``applyInPandasWithState`` per-user running counts, one row per input row as spark-ckpt's
  first stage, then the windowed sums.

Every input is the generator (``channels`` channels, ``keys`` uniform keys, event time
advancing ``event_rate`` rows per second per channel, in order within each channel: the
watermark's 2 s bound is never needed) with a backlog far longer than any run reads, so the
input is faster than the processing (saturated). Clicks and impressions differ in their seed
only; the running count reads the clicks. Each micro-batch reads ``batch_rows`` rows: the join
lines ``batch_rows / 2`` per input (:func:`join_sources`). Each line runs once unmeasured
(``warmup_round``), then ``reps`` repetitions run every line once in ABBA order
(:func:`~runbench.measure.abba`), each after a bounded wait for a quiet machine
(:func:`~runbench.procstat.settle`). A run's rows/s (over both inputs for the join lines) come
from Spark's query progress over a steady window of ``window_s`` after ``warmup_batches``
batches with data and ``warmup_s`` (:func:`~runbench.steady.steady_window`). Per run also the
output rows per input row over the whole query (:func:`output_extra`: the lines of a pair
should agree, showing they did the same work). Ratios (:data:`RATIOS`): per repetition
``spark-ckpt/join / spark-join`` (target >= 1.0), ``count/graph / count/today`` (target
>= 0.97) and ``stages/spark-ckpt / stages/spark`` (target >= 1.0); median with a bootstrap 95%
interval (:func:`~runbench.steady.paired_ratios`). Before any timed run, the two-stage lines'
output is checked once against a pandas fold over a bounded copy of their input
(:func:`check_stages`); a wrong output ends the bench before it measures anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from benchcommon import git_info, spark_machine_info

from runbench.graph_variants import (
    BOUND_MS,
    LEFT,
    LOWER_MS,
    ONLY,
    RIGHT,
    UPPER_MS,
    GraphStarted,
    ckpt_join,
    ckpt_stages,
    graph_count,
    spark_join,
    spark_pandas_stages,
    spark_stages,
    today_count,
)
from runbench.measure import abba, measure_variant
from runbench.procstat import PyGcTimer, settle
from runbench.steady import ProgressLog, Window, batch_rows, paired_ratios, spread, steady_window
from runbench.time_variants import SPARK_SINKS, STATE_STORES
from runbench.variants import Started, VariantStart, Workload

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results" / "graphs.json"
QUICK_OUT = Path("/tmp/graphs_quick.json")

#: Rows per channel at the start: far more than any run reads (made on demand).
BACKLOG_PER_CHANNEL = 10**10
#: The generator's seed of each input (the running count reads the clicks').
SEEDS = {LEFT: 7, RIGHT: 8}

#: What the JSON says about the lines' configuration.
NOTES = {
    "disorder": (
        "the generator's rows are in order within each channel, and the inputs' channels "
        "advance alike; both lines' watermarks trail by the 2 s bound all the same"
    ),
    "spark_sinks": (
        "parquet: Spark's file sink, exactly-once through its _spark_metadata log (no Delta "
        "Spark JAR here); noop: nothing written. spark-ckpt writes Delta (two-phase commit)"
    ),
    "read_limit": (
        "with sources= the inputs' maxRowsPerTrigger add up to the read limit of their one "
        "ckpt-source (source=inputs), shared fairly by all channels: each input reads its own "
        "limit per micro-batch, as each of spark-join's two sources does"
    ),
}


@dataclass(frozen=True)
class GraphSettings:
    master: str
    channels: int  # per input
    parallelism: int
    interval_ms: int
    placement: str  # where spark-ckpt's subtasks run
    keys: int
    event_rate: int  # rows per second of event time, per channel
    spark_state_store: str  # spark-join's provider (STATE_STORES)
    spark_sink: str  # SPARK_SINKS
    batch_rows: int  # rows per micro-batch, over all inputs
    reps: int
    warmup_round: bool  # every line once, unmeasured, before the repetitions
    warmup_batches: int
    warmup_s: float
    window_s: float
    warmup_query_s: float  # the unmeasured round's windows
    settle_cores: float
    settle_timeout_s: float
    query_timeout_s: float
    lines: tuple[str, ...] | None = None  # None: all of them


FULL = GraphSettings(
    master="local[2]",
    channels=2,
    parallelism=2,
    interval_ms=1000,
    placement="executors",
    keys=100_000,
    event_rate=5_000,
    spark_state_store="hdfs",
    spark_sink="parquet",
    batch_rows=300_000,
    reps=4,
    warmup_round=True,
    warmup_batches=3,
    warmup_s=6.0,
    window_s=20.0,
    warmup_query_s=8.0,
    settle_cores=0.3,
    settle_timeout_s=30.0,
    query_timeout_s=600.0,
)
QUICK = replace(
    FULL,
    batch_rows=200_000,
    reps=1,
    warmup_round=False,
    warmup_batches=2,
    warmup_s=3.0,
    window_s=8.0,
    settle_timeout_s=0.0,
    query_timeout_s=300.0,
)


# -- the lines ----------------------------------------------------------------------------------
def generator_source(s: GraphSettings, seed: int, batch_rows: int) -> dict[str, object]:
    """The generator's ``ckpt-source`` options of one input, reading *batch_rows* rows per
    micro-batch."""
    return {
        "source": "generator",
        "channels": s.channels,
        "rate": s.event_rate,
        "backlog": ",".join([str(BACKLOG_PER_CHANNEL)] * s.channels),
        "keys": s.keys,
        "seed": seed,
        "maxRowsPerTrigger": batch_rows,
    }


def join_sources(s: GraphSettings) -> dict[str, object]:
    """The join lines' named inputs: clicks and impressions, ``batch_rows / 2`` rows each
    per micro-batch (so a micro-batch of either join reads ``batch_rows``)."""
    share = max(1, s.batch_rows // len(SEEDS))
    return {name: generator_source(s, seed, share) for name, seed in SEEDS.items()}


@dataclass(frozen=True)
class Line:
    """A line: how to start it and what it reads (``Workload.source``)."""

    name: str
    start: VariantStart
    source: dict[str, object]
    opt_in: bool = False  # run only when --lines names it


def lines(s: GraphSettings) -> list[Line]:
    count_source = generator_source(s, SEEDS[LEFT], s.batch_rows)
    return [
        Line("spark-ckpt/join", ckpt_join(s.placement), join_sources(s)),
        Line("spark-join", spark_join(s.spark_state_store, s.spark_sink), join_sources(s)),
        Line("count/today", today_count(s.placement), count_source),
        Line("count/graph", graph_count(s.placement), count_source),
        Line("stages/spark-ckpt", ckpt_stages(s.placement), count_source),
        Line("stages/spark", spark_stages(s.spark_state_store, s.spark_sink), count_source),
        Line(
            "stages/spark-pandas",
            spark_pandas_stages(s.spark_state_store, s.spark_sink),
            count_source,
            opt_in=True,
        ),
    ]


def selected(s: GraphSettings) -> list[Line]:
    """The lines a run runs: those ``s.lines`` names, else every line but the opt-in ones."""
    return [
        line
        for line in lines(s)
        if (line.name in s.lines if s.lines is not None else not line.opt_in)
    ]


#: The ratios: (numerator line, denominator line) -> target.
RATIOS = {
    ("spark-ckpt/join", "spark-join"): 1.0,
    ("count/graph", "count/today"): 0.97,
    ("stages/spark-ckpt", "stages/spark"): 1.0,
    ("stages/spark-ckpt", "stages/spark-pandas"): 1.0,
}
#: The lines of the two-stage job, whose output :func:`check_stages` checks before any run.
STAGE_LINES = ("stages/spark-ckpt", "stages/spark", "stages/spark-pandas")


# -- what a run did besides its rows/s ----------------------------------------------------------
def file_sink_files(path: str) -> list[str]:
    """The files Spark's file sink committed to *path*: those its ``_spark_metadata`` log
    adds (its batch files and compactions, which repeat them) less those it deletes, as
    local paths. A file of a batch the stop interrupted is in no log entry."""
    from urllib.parse import unquote, urlparse

    added: set[str] = set()
    removed: set[str] = set()
    for entry in sorted(Path(path, "_spark_metadata").iterdir()):
        if entry.name.startswith(".") or not entry.is_file():
            continue
        for line in entry.read_text().splitlines()[1:]:  # the first line is the version
            if not line.strip():
                continue
            f = json.loads(line)
            (removed if f.get("action") == "delete" else added).add(f["path"])
    return sorted(unquote(urlparse(p).path) for p in added - removed)


def output_rows(started: Started, batches: Sequence[dict[str, Any]]) -> int | None:
    """The rows a stopped run wrote: those of its Delta table (spark-ckpt), of the files
    Spark's file sink committed, else the sum of its sink's ``numOutputRows`` over *batches*
    (None: a batch without the figure; Spark's file sink reports -1)."""
    if isinstance(started, GraphStarted) and started.output is not None:
        if started.output_format == "delta":
            from deltalake import DeltaTable

            return int(DeltaTable(started.output).to_pyarrow_dataset().count_rows())
        import pyarrow.parquet as pq

        files = file_sink_files(started.output)
        return sum(int(pq.ParquetFile(f).metadata.num_rows) for f in files)
    counts = [int((b.get("sink") or {}).get("numOutputRows", -1)) for b in batches]
    return sum(counts) if counts and min(counts) >= 0 else None


def per_row(output: int | None, rows: int) -> float | None:
    """Output rows per input row (None: unknown, or no input)."""
    return output / rows if output is not None and rows > 0 else None


def output_extra(started: Started, window: Window, batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the whole (stopped) query: the rows it read, the rows it wrote, and their ratio.
    Its progress is polled once more: the batches of the stop come after the measured
    window."""
    log = ProgressLog()
    log.batches.update({int(b["batchId"]): b for b in batches})
    log.poll(started.query)
    every = log.ordered()
    rows = sum(batch_rows(b) for b in every)
    out = output_rows(started, every)
    return {
        "query_input_rows": rows,
        "query_output_rows": out,
        "output_per_input_row": per_row(out, rows),
        "batch_rows_max": max((batch_rows(b) for b in every), default=0),
    }


# -- the check of the two-stage lines' output -------------------------------------------------
#: Rows per channel of the check's bounded input (rate 0: nothing arrives after them, their
#: event times 1 ms apart).
CHECK_ROWS_PER_CHANNEL = 150_000


def check_source(s: GraphSettings) -> dict[str, object]:
    """The two-stage lines' input with a bounded backlog and no rows arriving (``rate`` 0), so
    that a run can read all of it and the oracle knows every row."""
    source = generator_source(s, SEEDS[LEFT], s.batch_rows)
    backlog = ",".join([str(CHECK_ROWS_PER_CHANNEL)] * s.channels)
    return {**source, "rate": 0, "backlog": backlog}


def generated_rows(source: dict[str, object]) -> Any:
    """Every row of a bounded generator *source* (its backlog), all channels."""
    import pyarrow as pa

    from spark_ckpt.sources.generator import GeneratorSpec

    spec = GeneratorSpec.from_options({k: str(v) for k, v in source.items()})
    return pa.concat_tables(spec.rows(c, 0, n) for c, n in enumerate(spec.backlogs))


def output_frame(started: GraphStarted) -> Any:
    """A stopped two-stage run's output as pandas, :data:`two_stages.OUTPUT_COLUMNS`, the
    windows' bounds in epoch ms."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from runbench.two_stages import OUTPUT_COLUMNS

    assert started.output is not None
    if started.output_format == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(started.output).to_pyarrow_table()
    else:
        files = file_sink_files(started.output)
        table = pa.concat_tables([pq.read_table(f) for f in files]) if files else None
    if table is None or table.num_rows == 0:
        import pandas as pd

        return pd.DataFrame(columns=list(OUTPUT_COLUMNS))
    columns = {}
    for name in OUTPUT_COLUMNS:
        column = table.column(name)
        if pa.types.is_timestamp(column.type):  # instants: Delta's are UTC, Spark's naive UTC
            column = column.cast(pa.timestamp("ms", tz=column.type.tz)).cast(pa.int64())
        columns[name] = column.cast(pa.int64())
    return pa.table(columns).to_pandas()


def compare_windows(got: Any, oracle: Any, due_until_ms: int) -> dict[str, Any]:
    """*got* (a run's windows) against *oracle* (:func:`two_stages.window_sums`): every window
    once, with the oracle's sum; every oracle window ending at or before *due_until_ms* (the
    final watermark: every window it passed) present."""
    on = ["country", "window_start", "window_end"]
    merged = got.merge(oracle, on=on, how="left", suffixes=("", "_expected"))
    wrong = int((merged["sum_amount"] != merged["sum_amount_expected"]).sum())
    due = oracle[oracle["window_end"] <= due_until_ms]
    present = due.merge(got[on].drop_duplicates(), on=on, how="inner")
    report = {
        "windows": len(got),
        "windows_due": len(due),
        "duplicates": int(got.duplicated(on).sum()),
        "wrong_sums": wrong,
        "missing_due": len(due) - len(present),
        "oracle_windows": len(oracle),
    }
    report["ok"] = (
        report["windows"] > 0
        and report["duplicates"] == 0
        and report["wrong_sums"] == 0
        and report["missing_due"] == 0
    )
    return report


def check_stages(spark: Any, s: GraphSettings, log: Any) -> dict[str, Any]:
    """Once, outside the timed runs: both two-stage lines over a bounded input
    (:func:`check_source`) against a pandas fold over its rows (:func:`two_stages.window_sums`);
    spark-ckpt reads it all (``available_now``, a final checkpoint), Spark's query processes
    all available data, then idles long enough for its watermark to close the windows."""
    import shutil
    import tempfile

    import pyarrow as pa

    from runbench.two_stages import window_sums

    source = check_source(s)
    rows = generated_rows(source)
    oracle = window_sums(rows)
    last_ms = int(rows.column("event_ts").cast(pa.int64()).to_numpy().max() // 1000)
    due_until = last_ms - BOUND_MS  # the final watermark: every window it passed is out
    workload = Workload(source, s.parallelism, s.interval_ms)
    out: dict[str, Any] = {"input_rows": rows.num_rows, "due_until_ms": due_until}
    table = {line.name: line for line in lines(s)}
    names = [line.name for line in selected(s) if line.name in STAGE_LINES]
    for name in names:
        root = tempfile.mkdtemp(prefix="spark-ckpt-bench-stages-check-")
        try:
            if name == "stages/spark-ckpt":
                started = ckpt_stages(s.placement, available_now=True)(spark, root, workload)
                started.query.awaitTermination(s.query_timeout_s)
            else:
                started = table[name].start(spark, root, workload)
                started.query.processAllAvailable()
                time.sleep(5.0)  # the batch without data that moves the watermark on
                started.query.processAllAvailable()
            started.stop()
            assert isinstance(started, GraphStarted)
            out[name] = compare_windows(output_frame(started), oracle, due_until)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        log(f"  check {name:<18} {out[name]}")
    out["ok"] = all(out[n]["ok"] for n in names)
    return out


# -- the run ------------------------------------------------------------------------------------
def ratios_of(runs: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per ratio of :data:`RATIOS` whose lines both ran: the paired per-repetition ratios
    (:func:`paired_ratios`, repetitions in the order of *runs*) and its target."""
    by_line = {n: [r["rows_per_s"] for r in runs if r["variant"] == n] for n in names}
    out = {}
    for (a, b), target in RATIOS.items():
        if by_line.get(a) and by_line.get(b):
            out[f"{a} : {b}"] = {**paired_ratios(by_line[a], by_line[b]), "target": target}
    return out


def run_lines(spark: Any, s: GraphSettings, log: Any) -> dict[str, Any]:
    """Every line (``s.lines``): the warm-up round, then the ABBA repetitions."""
    table = {line.name: line for line in selected(s)}
    names = list(table)
    py_gc = PyGcTimer().install()

    def one(name: str, window_s: float, warmup_s: float) -> dict[str, Any]:
        line = table[name]
        return measure_variant(
            spark,
            name,
            line.start,
            Workload(line.source, s.parallelism, s.interval_ms),
            window=partial(
                steady_window,
                warmup_batches=s.warmup_batches,
                warmup_s=warmup_s,
                window_s=window_s,
            ),
            timeout_s=s.query_timeout_s,
            py_gc=py_gc,
            extra=output_extra,
        )

    warmup = []
    if s.warmup_round:
        for name in names:
            r = one(name, max(s.warmup_query_s, s.window_s / 3), 0.0)
            warmup.append(r)
            log(f"  warm-up {name:<19} {r['rows_per_s']:>10,.0f} rows/s (not measured)")
    runs: list[dict[str, Any]] = []
    for rep in range(s.reps):
        for name in abba(names, rep):
            quiet = settle(s.settle_cores, s.settle_timeout_s) if s.settle_timeout_s > 0 else None
            r = one(name, s.window_s, s.warmup_s)
            r.update(rep=rep, settle=quiet)
            runs.append(r)
            d = r["diagnostics"] or {}
            per = r.get("output_per_input_row")
            log(
                f"  rep {rep + 1}/{s.reps} {name:<19} {r['rows_per_s']:>10,.0f} rows/s "
                f"({r['window']['batches']} batches in {r['window']['seconds']:.1f} s"
                + (f", {per:.4g} rows out per row in" if per is not None else "")
                + f"; cores other {d.get('other_cores', 0):.2f}; load "
                f"{r['loadavg_start'][0]:.1f}; query {r['query_wall_s']:.0f} s)"
            )
    by_line = {n: [r["rows_per_s"] for r in runs if r["variant"] == n] for n in names}
    per_row_of = {
        n: spread(
            [
                r["output_per_input_row"]
                for r in runs
                if r["variant"] == n and r["output_per_input_row"] is not None
            ]
        )
        for n in names
    }
    return {
        "lines": names,
        "rows_per_s": {n: spread(v) for n, v in by_line.items()},
        "ratios": ratios_of(runs, names),
        "output_per_input_row": per_row_of,
        "warmup_runs": warmup,
        "runs": runs,
    }


# -- report -------------------------------------------------------------------------------------
def _ci(r: dict[str, Any]) -> str:
    ci = r.get("median_ci95")
    return f" (95% CI {ci[0]:.3f}-{ci[1]:.3f})" if ci else ""


def render(result: dict[str, Any]) -> str:
    s = result["settings"]
    g = result["graphs"]
    out = [
        f"Graphs{' (QUICK smoke run)' if result['quick'] else ''}: {s['master']}, "
        f"{s['placement']}, checkpoints every {s['interval_ms']} ms; load "
        f"{result['loadavg_start'][0]:.1f} -> {result['loadavg_end'][0]:.1f}",
        f"  {s['keys']:,} keys, {s['channels']} channels per input, {s['event_rate']:,} rows "
        f"per event-second per channel, {s['batch_rows']:,} rows per micro-batch; join "
        f"{LOWER_MS / 1000:+g} s..{UPPER_MS / 1000:+g} s, bound 2 s; {s['reps']} reps ABBA",
    ]
    for n, sp in g["rows_per_s"].items():
        per = g["output_per_input_row"][n]
        out.append(
            f"    {n:<19} median {sp['median']:>10,.0f} rows/s "
            f"(min {sp['min']:,.0f}, max {sp['max']:,.0f})"
            + (f"; rows out per row in {per['median']:.4g}" if per["n"] else "")
        )
    for pair, r in g["ratios"].items():
        out.append(
            f"    ratio {pair}: {r['median']:.3f}{_ci(r)} (target >= {r['target']:g}); "
            "per repetition " + ", ".join(f"{x:.3f}" for x in r["per_rep"])
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (~2 min)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    parser.add_argument("--reps", type=int, help="ABBA repetitions")
    parser.add_argument("--window", type=float, help="measured window of a run, seconds")
    parser.add_argument("--placement", choices=("driver", "executors"))
    parser.add_argument("--event-rate", type=int, help="rows per event-second per channel")
    parser.add_argument("--batch-rows", type=int, help="rows per micro-batch, over all inputs")
    parser.add_argument("--spark-state-store", choices=sorted(STATE_STORES))
    parser.add_argument("--spark-sink", choices=SPARK_SINKS)
    parser.add_argument("--lines", help="comma-separated lines (default: all)")
    parser.add_argument(
        "--no-check", action="store_true", help="skip the check of the two-stage job's output"
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
        "batch_rows": args.batch_rows,
        "spark_state_store": args.spark_state_store,
        "spark_sink": args.spark_sink,
        "settle_timeout_s": args.settle_timeout,
        "lines": tuple(args.lines.split(",")) if args.lines else None,
    }
    s = replace(s, **{k: v for k, v in overrides.items() if v is not None})
    known = {line.name for line in lines(s)}
    if s.lines is not None and not set(s.lines) <= known:
        parser.error(f"--lines: {sorted(set(s.lines) - known)} not among {sorted(known)}")
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from spark_ckpt.spark.session.builders import local_session

    began = time.perf_counter()
    result: dict[str, Any] = {
        "quick": args.quick,
        "machine": {**spark_machine_info(), "spark_master": s.master},
        "git": git_info(),
        "settings": asdict(s),
        "join": {
            "left": LEFT,
            "right": RIGHT,
            "lower_ms": LOWER_MS,
            "upper_ms": UPPER_MS,
            "bound_ms": BOUND_MS,
        },
        "one_stage_input": ONLY,
        "targets": {f"{a} : {b}": t for (a, b), t in RATIOS.items()},
        "notes": NOTES,
        "loadavg_start": os.getloadavg(),
    }
    spark = local_session(
        "spark-ckpt-graphs", master=s.master, shuffle_partitions=s.parallelism, log_level="ERROR"
    )
    try:
        if not args.no_check and {line.name for line in selected(s)} & set(STAGE_LINES):
            log("check of the two-stage job's output")
            result["stages_check"] = check_stages(spark, s, log)
            if not result["stages_check"]["ok"]:
                raise SystemExit("the two-stage lines' output is wrong: not measured")
        log("graphs")
        result["graphs"] = run_lines(spark, s, log)
    finally:
        spark.stop()
    result["loadavg_end"] = os.getloadavg()
    result["elapsed_s"] = round(time.perf_counter() - began, 1)
    print(render(result))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=list) + "\n")
    print(f"wrote {out} in {result['elapsed_s']:.0f} s")
    return 0

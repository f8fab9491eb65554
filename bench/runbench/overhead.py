"""The overhead bench (``bench/overhead.py``, #16 "Overhead"): rows/s of the saturated
production path with checkpoints every 1 s against checkpoints off, steady enough to tell a
ratio of 0.95 from 0.99.

One SparkSession (``local[2]``) for every query. Each variant of the variant table
(:func:`~runbench.variants.overhead_variants`: per placement, checkpoints on and off)
runs once unmeasured (Python workers, JIT), then ``reps`` repetitions, each running every
variant once in ABBA order (:func:`~runbench.measure.abba`). Every run reads a backlog
far longer than it reads, ``maxRowsPerTrigger`` fixed, so all variants read identical
batches back to back; its rows/s come from Spark's query progress over a window of
``window_s`` that starts after ``warmup_batches`` batches with data and ``warmup_s``
(:func:`~runbench.steady.steady_window`). Before each run: Python and JVM garbage
collected, and (``settle_timeout_s`` > 0) a bounded wait until other work on the machine
uses at most ``settle_cores``. Every run records the cores the benchmark's processes and
other work used in its window, JVM and driver GC time, and the checkpoints in the window.

Reported per variant: median, mean, min, max, stdev of rows/s; per pair (checkpoints/off of
one placement): the per-repetition ratios, their median with a bootstrap 95% interval, and
the ratio of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from benchcommon import git_info, spark_machine_info

from runbench.alternating import AlternatingSettings, run_alternating
from runbench.measure import abba, measure_variant
from runbench.procstat import PyGcTimer, settle
from runbench.steady import paired_ratios, spread, steady_window
from runbench.variants import PLACEMENTS, Workload, overhead_variants

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results" / "overhead.json"


@dataclass(frozen=True)
class OverheadSettings:
    master: str
    channels: int
    keys: int
    parallelism: int
    interval_ms: int
    batch_rows: int  # maxRowsPerTrigger: every batch of every variant reads this many rows
    reps: int  # repetitions; each runs every variant once (ABBA order)
    warmup_batches: int  # batches with data before the window, at least
    warmup_s: float  # seconds after the first batch with data before the window, at least
    window_s: float  # the measured window
    warmup_query_s: float  # each variant's unmeasured first run: its window length
    settle_cores: float  # before each run: wait until other work uses at most this many cores
    settle_timeout_s: float  # ... for at most this long (0: do not wait)
    query_timeout_s: float


FULL = OverheadSettings(
    master="local[2]",
    channels=4,
    keys=100_000,
    parallelism=2,
    interval_ms=1000,
    batch_rows=600_000,
    reps=8,
    warmup_batches=3,
    warmup_s=8.0,
    window_s=30.0,
    warmup_query_s=20.0,
    settle_cores=0.3,
    settle_timeout_s=60.0,
    query_timeout_s=300.0,
)
QUICK = replace(
    FULL,
    batch_rows=300_000,
    reps=2,
    warmup_batches=2,
    warmup_s=2.0,
    window_s=5.0,
    warmup_query_s=3.0,
    settle_timeout_s=0.0,
    query_timeout_s=120.0,
)

#: Rows per channel at the start: far more than any run reads (the generator makes them
#: on demand, so a long backlog costs nothing).
BACKLOG_PER_CHANNEL = 10**10


def workload(s: OverheadSettings, checkpoints: bool) -> Workload:
    return Workload(
        {
            "source": "generator",
            "channels": s.channels,
            "rate": 0.0,
            "backlog": ",".join([str(BACKLOG_PER_CHANNEL)] * s.channels),
            "keys": s.keys,
            "seed": 7,
            "maxRowsPerTrigger": s.batch_rows,
        },
        s.parallelism,
        s.interval_ms if checkpoints else None,
    )


def run_overhead(
    spark: Any, s: OverheadSettings, log: Any, placement: str | None = None
) -> dict[str, Any]:
    """The runs and their summary (see the module docstring); *placement*: only its
    variants."""
    variants = {
        name: v
        for name, v in overhead_variants().items()
        if placement is None or name.startswith(f"{placement}/")
    }
    names = list(variants)
    py_gc = PyGcTimer().install()

    def one(name: str, window_s: float, warmup_s: float) -> dict[str, Any]:
        start, checkpoints = variants[name]
        return measure_variant(
            spark,
            name,
            start,
            workload(s, checkpoints),
            window=partial(
                steady_window,
                warmup_batches=s.warmup_batches,
                warmup_s=warmup_s,
                window_s=window_s,
            ),
            timeout_s=s.query_timeout_s,
            py_gc=py_gc,
        )

    warmup = []
    for name in names:
        r = one(name, s.warmup_query_s, 0.0)
        warmup.append(r)
        log(f"  warm-up {name:<20} {r['rows_per_s']:>12,.0f} rows/s (not measured)")
    runs: list[dict[str, Any]] = []
    for rep in range(s.reps):
        for name in abba(names, rep):
            quiet = settle(s.settle_cores, s.settle_timeout_s) if s.settle_timeout_s > 0 else None
            r = one(name, s.window_s, s.warmup_s)
            r.update(rep=rep, settle=quiet)
            runs.append(r)
            d = r["diagnostics"] or {}
            log(
                f"  rep {rep + 1}/{s.reps} {name:<20} {r['rows_per_s']:>12,.0f} rows/s "
                f"({r['window']['batches']} batches in {r['window']['seconds']:.1f} s, "
                f"{r['checkpoints']} checkpoints; cores ours {d.get('ours_cores', 0):.2f} "
                f"other {d.get('other_cores', 0):.2f}; JVM GC {d.get('jvm_gc_ms') or 0:.0f} ms, "
                f"py GC {d.get('py_gc_ms', 0):.0f} ms; load {r['loadavg_start'][0]:.1f})"
            )
    by_variant = {n: [r["rows_per_s"] for r in runs if r["variant"] == n] for n in names}
    ratios = {
        f"{p}/checkpoints : {p}/off": paired_ratios(
            by_variant[f"{p}/checkpoints"], by_variant[f"{p}/off"]
        )
        for p in PLACEMENTS
        if f"{p}/checkpoints" in by_variant
    }
    others = [r["diagnostics"]["other_cores"] for r in runs if r["diagnostics"] is not None]
    return {
        "variants": names,
        "rows_per_s": {n: spread(v) for n, v in by_variant.items()},
        "ratios": ratios,
        "other_cores": spread(others),
        # how much of the spread other work on the machine explains, per variant
        "corr_rows_per_s_other_cores": {n: _corr(runs, n) for n in names},
        "checkpoints_per_s": {
            n: sum(r["checkpoints"] for r in runs if r["variant"] == n)
            / sum(r["window"]["seconds"] for r in runs if r["variant"] == n)
            for n in names
        },
        "warmup_runs": warmup,
        "runs": runs,
    }


def _corr(runs: list[dict[str, Any]], name: str) -> float | None:
    """Pearson correlation of a variant's rows/s with the cores other work took in its
    windows (None for fewer than 3 runs, or when it cannot be computed)."""
    pairs = [
        (r["rows_per_s"], r["diagnostics"]["other_cores"])
        for r in runs
        if r["variant"] == name and r["diagnostics"] is not None
    ]
    if len(pairs) < 3:  # two points always correlate by +-1
        return None
    try:
        return statistics.correlation([p[0] for p in pairs], [p[1] for p in pairs])
    except statistics.StatisticsError:
        return None


def render(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        f"Overhead{' (QUICK smoke run)' if result['quick'] else ''}: saturated production "
        f"path, {s['master']}, {s['channels']} channels, {s['keys']:,} keys, parallelism "
        f"{s['parallelism']}, batches of {s['batch_rows']:,} rows, window {s['window_s']:.0f} s "
        f"after {s['warmup_s']:.0f} s, {s['reps']} reps ABBA; load "
        f"{result['loadavg_start'][0]:.1f} -> {result['loadavg_end'][0]:.1f}",
        f"  {'variant':<20} {'median':>11} {'mean':>11} {'min':>11} {'max':>11} {'stdev':>9}",
    ]
    for n, sp in result["rows_per_s"].items():
        lines.append(
            f"  {n:<20} {sp['median']:>11,.0f} {sp['mean']:>11,.0f} {sp['min']:>11,.0f} "
            f"{sp['max']:>11,.0f} {sp['stdev']:>9,.0f}"
        )
    for pair, r in result["ratios"].items():
        ci = r["median_ci95"]
        lines.append(
            f"  ratio {pair}: median {r['median']:.3f}"
            + (f" (95% CI {ci[0]:.3f}-{ci[1]:.3f}, width {r['ci95_width']:.3f})" if ci else "")
            + f", min {r['min']:.3f}, max {r['max']:.3f}, stdev {r['stdev']:.3f}, "
            f"ratio of medians {r['ratio_of_medians']:.3f}"
        )
    o = result["other_cores"]
    if o["n"]:
        lines.append(
            f"  other work on the machine during the windows: median {o['median']:.2f} cores "
            f"(max {o['max']:.2f}); correlation of rows/s with it: "
            + ", ".join(
                f"{n} {c:+.2f}"
                for n, c in result["corr_rows_per_s_other_cores"].items()
                if c is not None
            )
        )
    return "\n".join(lines)


def render_alternating(result: dict[str, Any]) -> str:
    a = result["alternating"]
    s = a["settings"]
    r = a["ratio"]
    ci = r["median_ci95"]
    return "\n".join(
        [
            f"Overhead inside one query ({s['placement']}): {s['pairs']} pairs of "
            f"{s['window_s']:.0f} s windows (first {s['guard_s']:.0f} s not measured), "
            f"checkpoints every {s['interval_ms']} ms ({s.get('trigger', 'requests')}) against "
            f"none, ABBA; load "
            f"{result['loadavg_start'][0]:.1f} -> {result['loadavg_end'][0]:.1f}",
            f"  ratio on/off: median {r['median']:.3f}"
            + (f" (95% CI {ci[0]:.3f}-{ci[1]:.3f}, width {r['ci95_width']:.3f})" if ci else "")
            + f", min {r['min']:.3f}, max {r['max']:.3f}, stdev {r['stdev']:.3f}, n {r['n']}",
            f"  checkpoints per on window: {a['checkpoints_per_on_window']}; failed requests "
            f"{a['failed_requests']}; the bench's own CPU: on {a['bench_cpu_s']['on']:.1f} s, "
            f"off {a['bench_cpu_s']['off']:.1f} s",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (~3 min)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument("--reps", type=int, help="repetitions (each runs every variant)")
    parser.add_argument("--window", type=float, help="measured window, seconds")
    parser.add_argument(
        "--settle-timeout", type=float, help="max wait for a quiet machine before each run"
    )
    parser.add_argument(
        "--placement",
        choices=sorted(PLACEMENTS),
        help="only this placement's two variants (default: every placement)",
    )
    parser.add_argument(
        "--alternating",
        type=int,
        metavar="PAIRS",
        help=(
            "instead: one query of --placement (default executors), PAIRS windows of each "
            "kind alternating between checkpoints every 1 s and none (runbench.alternating)"
        ),
    )
    parser.add_argument(
        "--trigger",
        choices=("periodic", "requests"),
        default="periodic",
        help=(
            "with --alternating: the pipeline's periodic checkpoints paused and resumed "
            "(default), or checkpoints requested through the client"
        ),
    )
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    if args.reps:
        s = replace(s, reps=args.reps)
    if args.window:
        s = replace(s, window_s=args.window)
    if args.settle_timeout is not None:
        s = replace(s, settle_timeout_s=args.settle_timeout)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from spark_ckpt.spark.session.builders import local_session

    began = time.perf_counter()
    result: dict[str, Any] = {
        "quick": args.quick,
        "machine": {**spark_machine_info(), "spark_master": s.master},
        "git": git_info(),
        "settings": asdict(s),
        "loadavg_start": os.getloadavg(),
    }
    spark = local_session("spark-ckpt-overhead", master=s.master, log_level="ERROR")
    try:
        if args.alternating:
            alternating = AlternatingSettings(
                placement=args.placement or "executors",
                interval_ms=s.interval_ms,
                warmup_s=20.0 if not args.quick else 5.0,
                window_s=args.window or 10.0,
                guard_s=2.0,
                pairs=args.alternating,
                trigger=args.trigger,
            )
            result["settings"] = {**asdict(s), "alternating": asdict(alternating)}
            result["alternating"] = run_alternating(
                spark, alternating, workload(s, False).source, s.parallelism, log
            )
        else:
            result.update(run_overhead(spark, s, log, args.placement))
    finally:
        spark.stop()
    result["loadavg_end"] = os.getloadavg()
    result["elapsed_s"] = time.perf_counter() - began
    print(render_alternating(result) if args.alternating else render(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=list) + "\n")
    print(f"wrote {args.out} in {result['elapsed_s']:.0f} s")
    return 0

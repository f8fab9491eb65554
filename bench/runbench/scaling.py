"""The scaling bench (``bench/scaling.py``, #16 "Scaling" and the driver-memory half of "State
size"): a keyed running count with exactly-once checkpoints every 1 s at 100k and at 10M
keys, rows/s at ``local[1]`` and ``local[2]``, every variant of the variant table
(:func:`~runbench.variants.scaling_variants`: spark-ckpt per placement, and Spark's own
JVM ``groupBy(key).count()`` with a ``checkpointLocation``) over the same generated input, and
the driver process's peak RSS.

A Spark master cannot change inside one JVM, so the bench's driver runs one **cell** per
(cores, keys) as a subprocess (``bench/scaling.py --cell ...``): its own SparkSession at
``local[cores]``, spark-ckpt's parallelism and ``spark.sql.shuffle.partitions`` = cores, its
processes pinned to ``cores`` CPUs (``pin_cores``: so that ``local[n]`` has *n* cores).
Cells run in the order (1, 100k), (2, 100k), (1, 10M), (2, 10M). In a cell every variant
runs once unmeasured on ``warmup_rows`` (Python workers, JIT), then ``reps`` repetitions run
every variant once, in ABBA order. Each run works off the same backlog of ``rows`` rows
(``channels`` generator channels, ``key_cardinality`` = keys, ``maxRowsPerTrigger`` =
``batch_rows``); its rows/s come from Spark's query progress, from the first batch after
``warmup_batches`` batches with data to the end of the batch that read the last row
(:func:`~runbench.steady.drained_window`). The driver's (the cell process's) RSS is
sampled during every run; ``VmHWM`` is its peak over the cell.

Reported: per cell and variant the spread of rows/s; per variant and keys the scaling
``local[2] / local[1]`` (ratio of medians); per cell each spark-ckpt variant against
``spark-groupby`` (median of the per-repetition ratios); the driver's peak RSS per cell.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from benchcommon import git_info, spark_machine_info

from runbench.measure import abba, measure_variant
from runbench.procstat import PyGcTimer, RssSampler, rss_mb
from runbench.steady import drained_window, paired_ratios, spread
from runbench.variants import Workload, scaling_variants

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results" / "scaling.json"
ENTRY = Path(__file__).resolve().parent.parent / "scaling.py"
BASELINE = "spark-groupby"


@dataclass(frozen=True)
class ScalingSettings:
    cores: tuple[int, ...]  # local[n] masters, one cell each
    keys: tuple[int, ...]  # key cardinalities, one cell each
    channels: int
    interval_ms: int  # spark-ckpt: exactly-once aligned checkpoints every interval
    rows: int  # input rows of every measured run (a backlog, worked off)
    batch_rows: int  # maxRowsPerTrigger
    warmup_batches: int  # batches with data before the window
    warmup_rows: int  # each variant's unmeasured first run in a cell
    reps: int  # repetitions per cell; each runs every variant once (ABBA order)
    driver_memory: str  # the cell's JVM heap (spark.driver.memory), the same for all
    query_timeout_s: float
    # pin each cell's processes (driver, JVM, Python workers) to its first `cores` CPUs, so
    # local[n] has n cores: unpinned, local[1] keeps more than one core busy (the source's
    # and the subtasks' Python workers and the JVM run side by side) and the ratio
    # local[2] / local[1] measures what the second task slot adds, not the second core
    pin_cores: bool = True

    def __post_init__(self) -> None:
        if self.rows <= (self.warmup_batches + 1) * self.batch_rows:
            raise ValueError("rows must exceed (warmup_batches + 1) * batch_rows")
        if self.warmup_rows <= 2 * self.batch_rows:
            raise ValueError("warmup_rows must exceed 2 * batch_rows")


FULL = ScalingSettings(
    cores=(1, 2),
    keys=(100_000, 10_000_000),
    channels=4,
    interval_ms=1000,
    rows=30_000_000,
    batch_rows=500_000,
    warmup_batches=3,
    warmup_rows=3_000_000,
    reps=3,
    driver_memory="2g",
    query_timeout_s=1200.0,
)
QUICK = replace(
    FULL,
    rows=1_500_000,
    batch_rows=250_000,
    warmup_batches=2,
    warmup_rows=750_000,
    reps=1,
    query_timeout_s=300.0,
)


def expected_distinct_keys(rows: int, keys: int) -> float:
    """Keys a uniform draw of *rows* from *keys* is expected to touch: the state's size."""
    return keys * (1 - math.exp(-rows / keys))


def workload(s: ScalingSettings, cores: int, keys: int, rows: int) -> Workload:
    share = -(-rows // s.channels)
    return Workload(
        {
            "source": "generator",
            "channels": s.channels,
            "rate": 0.0,
            "backlog": ",".join([str(share)] * s.channels),
            "keys": keys,
            "seed": 7,
            "maxRowsPerTrigger": s.batch_rows,
        },
        cores,
        s.interval_ms,
    )


# -- one cell, in its own process ------------------------------------------------------------
def run_cell(s: ScalingSettings, cores: int, keys: int, log: Any) -> dict[str, Any]:
    """Every variant at ``local[cores]`` and *keys* (see the module docstring)."""
    from spark_ckpt.spark.session.builders import local_session

    if s.pin_cores:  # before the JVM starts: every child process inherits the affinity
        os.sched_setaffinity(0, set(range(cores)))
    variants = scaling_variants()
    names = list(variants)
    spark = local_session(
        "spark-ckpt-scaling", master=f"local[{cores}]", shuffle_partitions=cores, log_level="ERROR"
    )
    rss = RssSampler()
    py_gc = PyGcTimer().install()
    session_rss = rss.window()

    def one(name: str, rows: int, warmup_batches: int) -> dict[str, Any]:
        return measure_variant(
            spark,
            name,
            variants[name],
            workload(s, cores, keys, rows),
            window=partial(drained_window, warmup_batches=warmup_batches, total_rows=rows),
            timeout_s=s.query_timeout_s,
            py_gc=py_gc,
            rss=rss,
        )

    try:
        warmup = []
        for name in names:
            r = one(name, s.warmup_rows, 1)
            warmup.append(r)
            log(f"  [local[{cores}] {keys:,} keys] warm-up {name:<20} {r['rows_per_s']:>11,.0f}")
        runs = []
        for rep in range(s.reps):
            for name in abba(names, rep):
                r = one(name, s.rows, s.warmup_batches)
                r["rep"] = rep
                runs.append(r)
                d = r["diagnostics"] or {}
                log(
                    f"  [local[{cores}] {keys:,} keys] rep {rep + 1}/{s.reps} {name:<20} "
                    f"{r['rows_per_s']:>11,.0f} rows/s ({r['window']['batches']} batches, "
                    f"{r['checkpoints']} checkpoints; driver RSS peak "
                    f"{(r['rss_mb_peak'] or {}).get('driver', 0):,.0f} MB; cores ours "
                    f"{d.get('ours_cores', 0):.2f} other {d.get('other_cores', 0):.2f})"
                )
    finally:
        spark.stop()
        rss.close()
    return {
        "cores": cores,
        "keys": keys,
        "expected_distinct_keys": expected_distinct_keys(s.rows, keys),
        "rss_mb_after_session_start": session_rss,
        "driver_vmhwm_mb": rss_mb(os.getpid(), "VmHWM"),
        "warmup_runs": warmup,
        "runs": runs,
    }


def cell_main(args: argparse.Namespace) -> int:
    s = ScalingSettings(**{**json.loads(args.settings)})
    s = replace(s, cores=tuple(s.cores), keys=tuple(s.keys))

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    cell = run_cell(s, args.cores, args.keys, log)
    Path(args.cell_out).write_text(json.dumps(cell, default=list) + "\n")
    return 0


# -- the bench's driver ------------------------------------------------------------------------
def cell_order(s: ScalingSettings) -> list[tuple[int, int]]:
    """(cores, keys) per cell: both masters at a key count before the next key count."""
    return [(c, k) for k in s.keys for c in s.cores]


def summarize(s: ScalingSettings, cells: list[dict[str, Any]]) -> dict[str, Any]:
    variants = list(dict.fromkeys(r["variant"] for c in cells for r in c["runs"]))
    table: dict[str, Any] = {}
    for cell in cells:
        label = f"local[{cell['cores']}] {cell['keys']:,} keys"
        by = {n: [r["rows_per_s"] for r in cell["runs"] if r["variant"] == n] for n in variants}
        peaks = {
            n: max(
                (
                    (r["rss_mb_peak"] or {}).get("driver", 0.0)
                    for r in cell["runs"]
                    if r["variant"] == n
                ),
                default=None,
            )
            for n in variants
        }
        growth = {
            n: max(
                (
                    (r["rss_mb_peak"] or {}).get("driver", 0.0)
                    - (r["rss_mb_start"] or {}).get("driver", 0.0)
                    for r in cell["runs"]
                    if r["variant"] == n
                ),
                default=None,
            )
            for n in variants
        }
        table[label] = {
            "cores": cell["cores"],
            "keys": cell["keys"],
            "rows_per_s": {n: spread(v) for n, v in by.items()},
            "vs_" + BASELINE.replace("-", "_"): {
                n: paired_ratios(by[n], by[BASELINE]) for n in variants if n != BASELINE
            },
            "driver_rss_mb_peak": peaks,
            # during a run, over the RSS at its start (the cell's earlier runs leave memory
            # with the process: a variant's peak alone may be another variant's)
            "driver_rss_mb_growth": growth,
            "driver_vmhwm_mb": cell["driver_vmhwm_mb"],
            # subtasks on the executors: where they found their state, per micro-batch
            "task_cache": {
                n: [r.get("task_cache") for r in cell["runs"] if r["variant"] == n]
                for n in variants
            },
            "checkpoint_bytes_written_p50": {
                n: [
                    r.get("checkpoint_bytes_written_p50") for r in cell["runs"] if r["variant"] == n
                ]
                for n in variants
            },
        }
    scaling: dict[str, Any] = {}
    lo, hi = min(s.cores), max(s.cores)
    for keys in s.keys:
        a = table.get(f"local[{lo}] {keys:,} keys")
        b = table.get(f"local[{hi}] {keys:,} keys")
        if a and b and lo != hi:
            scaling[f"{keys:,} keys local[{hi}]/local[{lo}]"] = {
                n: b["rows_per_s"][n]["median"] / a["rows_per_s"][n]["median"]
                for n in variants
                if a["rows_per_s"][n]["median"] and b["rows_per_s"][n]["median"]
            }
    rss: dict[str, Any] = {}
    for cores in s.cores:
        small = table.get(f"local[{cores}] {min(s.keys):,} keys")
        large = table.get(f"local[{cores}] {max(s.keys):,} keys")
        if small and large:
            rss[f"local[{cores}]"] = {
                n: {
                    "small_mb": small["driver_rss_mb_peak"][n],
                    "large_mb": large["driver_rss_mb_peak"][n],
                    "growth_mb": (large["driver_rss_mb_peak"][n] or 0)
                    - (small["driver_rss_mb_peak"][n] or 0),
                }
                for n in variants
            }
    return {
        "variants": variants,
        "cells": table,
        "scaling": scaling,
        "model": scaling_model(s, table, variants),
        "driver_rss": rss,
    }


def scaling_model(s: ScalingSettings, table: dict[str, Any], variants: list[str]) -> dict[str, Any]:
    """Per variant and key count, the two-point model of a micro-batch of ``batch_rows``
    rows on *n* cores: ``T(n) = fixed + work / n``, fitted to the median rows/s at the two
    masters (``T = batch_rows / rows_per_s``). ``fixed`` is what no core added shortens
    (the driver's planning and commits, the source runner, the coordinator, task launches);
    ``work`` the core-seconds that spread over the cores. Projected rows/s at 4, 8 and 16
    cores, and ``n_half``: the cores at which the fixed part equals the spread part (beyond
    it, each further core adds less than half of what the first ones did). A negative
    ``fixed`` (the second master more than twice as fast) says the model does not apply."""
    lo, hi = min(s.cores), max(s.cores)
    out: dict[str, Any] = {}
    for keys in s.keys:
        a = table.get(f"local[{lo}] {keys:,} keys")
        b = table.get(f"local[{hi}] {keys:,} keys")
        if not a or not b or lo == hi:
            continue
        for n in variants:
            ra, rb = a["rows_per_s"][n]["median"], b["rows_per_s"][n]["median"]
            if not ra or not rb:
                continue
            ta, tb = s.batch_rows / ra, s.batch_rows / rb
            work = (ta - tb) / (1 / lo - 1 / hi)
            fixed = ta - work / lo
            projected = {
                str(c): s.batch_rows / (fixed + work / c) if fixed + work / c > 0 else None
                for c in (4, 8, 16)
            }
            out[f"{n} {keys:,} keys"] = {
                "batch_s": {f"local[{lo}]": ta, f"local[{hi}]": tb},
                "fixed_s_per_batch": fixed,
                "work_core_s_per_batch": work,
                "work_core_us_per_row": work / s.batch_rows * 1e6,
                "projected_rows_per_s": projected,
                "ceiling_rows_per_s": s.batch_rows / fixed if fixed > 0 else None,
                "n_half": work / fixed if fixed > 0 else None,
            }
    return out


def render(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        f"Scaling{' (QUICK smoke run)' if result['quick'] else ''}: keyed running count, "
        f"{s['rows']:,} rows per run in batches of {s['batch_rows']:,}, {s['channels']} "
        f"channels, checkpoints every {s['interval_ms']} ms, {s['reps']} reps ABBA per cell; "
        f"load {result['loadavg_start'][0]:.1f} -> {result['loadavg_end'][0]:.1f}",
        f"  {'cell':<26} {'variant':<20} {'median rows/s':>13} {'min':>11} {'max':>11} "
        f"{'vs groupBy':>10} driver RSS MB peak (+ growth in the run)",
    ]
    su = result["summary"]
    for label, cell in su["cells"].items():
        for n in su["variants"]:
            sp = cell["rows_per_s"][n]
            vs = cell["vs_spark_groupby"].get(n)
            lines.append(
                f"  {label:<26} {n:<20} {sp['median'] or 0:>13,.0f} {sp['min'] or 0:>11,.0f} "
                f"{sp['max'] or 0:>11,.0f} {(vs['median'] if vs else 1.0):>10.3f} "
                f"{cell['driver_rss_mb_peak'][n] or 0:>7,.0f} "
                f"(+{cell['driver_rss_mb_growth'][n] or 0:,.0f})"
            )
    for label, cell in su["cells"].items():
        for n in su["variants"]:
            caches = [c for c in cell.get("task_cache", {}).get(n, []) if c]
            if caches:
                hits = sum(c["hits"] for c in caches)
                rebuilds = sum(c["rebuilds"] for c in caches)
                written = cell["checkpoint_bytes_written_p50"][n]
                lines.append(
                    f"  {label:<26} {n:<20} state found in its host {hits} / "
                    f"{hits + rebuilds} subtask micro-batches; checkpoint bytes written p50 "
                    f"{written}"
                )
    for label, ratios in su["scaling"].items():
        lines.append(f"  {label}: " + ", ".join(f"{n} {v:.2f}x" for n, v in ratios.items()))
    for label, m in su.get("model", {}).items():
        proj = ", ".join(
            f"{c} cores {v:,.0f}" for c, v in m["projected_rows_per_s"].items() if v is not None
        )
        lines.append(
            f"  model {label}: fixed {m['fixed_s_per_batch']:.3f} s/batch, work "
            f"{m['work_core_us_per_row']:.2f} core-us/row; projected rows/s {proj}; "
            f"n_half {m['n_half'] or 0:.1f}"
        )
    for master, by in su["driver_rss"].items():
        for n, r in by.items():
            lines.append(
                f"  driver RSS peak {master} {n}: {r['small_mb']:,.0f} MB at "
                f"{min(s['keys']):,} keys, {r['large_mb']:,.0f} MB at {max(s['keys']):,} keys "
                f"(+{r['growth_mb']:,.0f} MB)"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (~6 min)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument("--reps", type=int, help="repetitions per cell")
    parser.add_argument("--rows", type=int, help="input rows per measured run")
    parser.add_argument("--keys", type=int, action="append", help="key counts (repeatable)")
    parser.add_argument("--cores", type=int, action="append", help="local[n] (repeatable)")
    # one cell, as a subprocess of the bench's driver
    parser.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--cell-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cell:
        args.cores, args.keys = args.cores[0], args.keys[0]
        return cell_main(args)
    s = QUICK if args.quick else FULL
    if args.reps:
        s = replace(s, reps=args.reps)
    if args.rows:
        s = replace(s, rows=args.rows)
    if args.keys:
        s = replace(s, keys=tuple(args.keys))
    if args.cores:
        s = replace(s, cores=tuple(args.cores))

    began = time.perf_counter()
    result: dict[str, Any] = {
        "quick": args.quick,
        "machine": {**spark_machine_info(), "spark_master": [f"local[{c}]" for c in s.cores]},
        "git": git_info(),
        "settings": asdict(s),
        "loadavg_start": os.getloadavg(),
    }
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": f"--driver-memory {s.driver_memory} pyspark-shell"}
    cells = []
    with tempfile.TemporaryDirectory(prefix="spark-ckpt-scaling-") as tmp:
        for cores, keys in cell_order(s):
            print(f"cell local[{cores}], {keys:,} keys ...", file=sys.stderr, flush=True)
            out = Path(tmp) / f"cell-{cores}-{keys}.json"
            started = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    str(ENTRY),
                    "--cell",
                    "--settings",
                    json.dumps(asdict(s)),
                    "--cores",
                    str(cores),
                    "--keys",
                    str(keys),
                    "--cell-out",
                    str(out),
                ],
                env=env,
                check=True,
            )
            cell = json.loads(out.read_text())
            cell["elapsed_s"] = time.perf_counter() - started
            cells.append(cell)
    result["cells"] = cells
    result["summary"] = summarize(s, cells)
    result["loadavg_end"] = os.getloadavg()
    result["elapsed_s"] = time.perf_counter() - began
    print(render(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=list) + "\n")
    print(f"wrote {args.out} in {result['elapsed_s']:.0f} s")
    return 0

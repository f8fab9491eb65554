"""The command line of ``bench/pipeline.py``: the sections to run, the SparkSession, the
calibration, the JSON and the report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchcommon import spark_machine_info

import pipelinebench
from pipelinebench.calibration import calibrate, source_cost
from pipelinebench.lag import bench_lag
from pipelinebench.latency import bench_latency
from pipelinebench.profiling import profile_foreach_batch
from pipelinebench.report import render
from pipelinebench.saturated import bench_saturated
from pipelinebench.settings import DEFAULT_OUT, FULL, QUICK, Settings
from pipelinebench.sustained import bench_sustained
from pipelinebench.throughput import bench_throughput

Log = Callable[[str], None]

#: Section name -> (what the log says, the measurement), in the order they run.
SECTION_RUNS: dict[str, tuple[str, Callable[[Any, Settings, Log], Any]]] = {
    "sustained": (
        "sustained throughput, pipelined, back to back (checkpoints every 1 s vs off)",
        bench_sustained,
    ),
    "saturated": (
        "saturated throughput, pipelined, backlog (checkpoints every 1 s vs off)",
        bench_saturated,
    ),
    "throughput": ("throughput (checkpoints every 1 s vs off)", bench_throughput),
    "latency": ("checkpoint duration", bench_latency),
    "lag": ("lagging channel, aligned vs unaligned", bench_lag),
}
SECTIONS = tuple(SECTION_RUNS)


def main(argv: Sequence[str] | None = None) -> int:
    doc = pipelinebench.__doc__ or ""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (~2-3 min)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument("--reps", type=int, help="override the throughput repetitions")
    parser.add_argument("--profile", action="store_true", help="add a cProfile'd query")
    parser.add_argument("--only", choices=SECTIONS, action="append", help="run only these")
    parser.add_argument(
        "--rate", type=float, help="offered rows/s instead of the calibrated utilization"
    )
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    if args.reps:
        s = replace(s, reps=args.reps)
    sections = [n for n in SECTIONS if n in (args.only or SECTIONS)]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from spark_ckpt.spark.session.builders import local_session

    started = time.perf_counter()
    result: dict[str, Any] = {
        "quick": args.quick,
        "machine": spark_machine_info(),
        "settings": {**asdict(s), "batch_rows": s.batch_rows},
        "loadavg_start": os.getloadavg(),
    }
    # Spark's log at ERROR from the start (``spark.log.level``), no console progress bars
    spark = local_session("spark-ckpt-bench", log_level="ERROR")
    try:
        log("warm-up and calibration ...")
        result["calibration"] = calibrate(spark, s, log)
        result["calibration"]["source_read"] = source_cost(s)
        rate = args.rate or round(s.utilization * result["calibration"]["capacity_rows_per_s"], -4)
        s = replace(s, rate=max(rate, 20_000.0), latency_rate=max(rate, 20_000.0))
        result["settings"] = {**asdict(s), "batch_rows": s.batch_rows}
        for name in sections:
            title, bench = SECTION_RUNS[name]
            log(f"{title} ...")
            result[name] = bench(spark, s, log)
        if args.profile:
            log("cProfile of foreachBatch ...")
            result["profile"] = profile_foreach_batch(spark, s)
    finally:
        spark.stop()
    result["loadavg_end"] = os.getloadavg()
    result["elapsed_s"] = time.perf_counter() - started
    print(render(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=list) + "\n")
    print(f"wrote {args.out} in {result['elapsed_s']:.0f} s")
    return 0

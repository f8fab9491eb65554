"""Object-store bench (#42): a pipeline whose root and output are on an S3 endpoint against
the same pipeline on local disk, in one run, and the requests the endpoint served::

    .venv/bin/python bench/object_store.py              # writes bench/results/object_store.json
    .venv/bin/python bench/object_store.py --quick      # smoke run, /tmp/object_store_quick.json

The endpoint is moto's server on this host (``spark_ckpt.testing.s3_endpoint``): it keeps
everything in memory and answers from one Python process, so its latencies are not S3's;
what carries over is the request count, which is what S3 bills. Every run: generator,
2 channels, 100k keys, a backlog longer than the run reads, ``maxRowsPerTrigger`` 200,000,
a keyed running count on the executors, exactly-once checkpoints every second, into Delta.
Lines ``local`` (root and output in a temporary directory) and ``s3`` (both on the
endpoint), ``--reps`` repetitions in ABBA order. Per run, in a window after a warm-up:
rows/s (Spark's progress), checkpoint durations (trigger to completion, p50/p95), and the
endpoint's requests per completed checkpoint, by method and by the root's folders. Then one
idle run on the endpoint (no input: checkpoints still every second), and one with
checkpoints off: the requests per idle second. Figures: ``bench/README.md``, section
"Object storage".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: runbench, benchcommon

from benchcommon import PIPELINE, git_info, spark_machine_info, stop_quietly
from runbench.steady import ProgressLog, paired_ratios, spread, steady_window

from spark_ckpt.testing.s3_endpoint import S3Endpoint, Served, start_s3_endpoint

BUCKET = "bench"
KEYS = 100_000
MAX_ROWS = 200_000


def source(backlog: int) -> dict[str, object]:
    return {
        "source": "generator",
        "channels": 2,
        "rate": 0.0,
        "backlog": str(backlog),
        "keys": KEYS,
        "maxRowsPerTrigger": MAX_ROWS,
    }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def area(path: str) -> str:
    """The folder of the root a request went to (``/bucket/<line>/root/<area>/...``)."""
    parts = path.strip("/").split("/")
    if "root" in parts:
        rest = parts[parts.index("root") + 1 :]
        return rest[0] if rest else "(root)"
    return "output" if len(parts) > 2 else "(bucket)"


def served_in(endpoint: S3Endpoint, prefix: str, start: float, end: float) -> list[Served]:
    """The requests under path *prefix* whose log lines arrived in ``[start, end)``."""
    return [r for r in endpoint.requests() if r.path.startswith(prefix) and start <= r.time_s < end]


def per_checkpoint(served: list[Served], checkpoints: int) -> dict[str, Any]:
    n = max(checkpoints, 1)
    return {
        "total": len(served) / n,
        "by_method": {k: v / n for k, v in sorted(Counter(r.method for r in served).items())},
        "by_area": {k: v / n for k, v in sorted(Counter(area(r.path) for r in served).items())},
    }


def measure(
    spark: Any, endpoint: S3Endpoint, line: str, base: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One saturated run of *line* (see the module docstring)."""
    from spark_ckpt import CheckpointConfig, Pipeline, RunningCount

    options = {"checkpoint.interval": "1s", "checkpoint.history": "5000"}
    pipeline = Pipeline(
        spark, PIPELINE, config=CheckpointConfig.from_options(options), root=f"{base}/root"
    )
    run = pipeline.start(
        source(50_000_000), RunningCount("counter", "user_id"), output=f"{base}/out"
    )
    log = ProgressLog()
    try:
        window = None
        deadline = time.monotonic() + args.warmup + args.window + 120
        while window is None and time.monotonic() < deadline:
            time.sleep(1)
            log.poll(run.query)
            window = steady_window(
                log.ordered(), warmup_batches=3, warmup_s=args.warmup, window_s=args.window
            )
        if window is None:
            raise RuntimeError(f"{line}: no measured window")
    finally:
        stop_quietly(run)
    start, end = window.start_s, window.start_s + window.seconds
    inside = [
        r.stats
        for r in pipeline.client.history()
        if r.stats is not None and start <= r.stats.trigger_ms / 1000 < end
    ]
    durations = [float(s.completed_ms - s.trigger_ms) for s in inside]
    result: dict[str, Any] = {
        "line": line,
        "rows_per_s": window.rows_per_s,
        "window": window.as_dict(),
        "checkpoints": len(durations),
        "duration_ms": {
            "p50": percentile(durations, 0.5),
            "p95": percentile(durations, 0.95),
            **spread(durations),
        },
    }
    if line == "s3":
        prefix = base.replace("s3:/", "", 1) + "/"
        result["requests_per_checkpoint"] = per_checkpoint(
            served_in(endpoint, prefix, start, end), len(durations)
        )
    return result


def idle(
    spark: Any, endpoint: S3Endpoint, base: str, seconds: float, interval: str
) -> dict[str, Any]:
    """An idle run on the endpoint (no input) for *seconds*: requests per second, by method
    and folder, and the checkpoints completed meanwhile."""
    from spark_ckpt import CheckpointConfig, Pipeline, RunningCount

    config = CheckpointConfig.from_options({"checkpoint.interval": interval})
    pipeline = Pipeline(spark, PIPELINE, config=config, root=f"{base}/root")
    run = pipeline.start(source(0), RunningCount("counter", "user_id"), output=f"{base}/out")
    try:
        time.sleep(15)  # started, first checkpoints done
        before = len(pipeline.client.history())
        start = time.time()
        time.sleep(seconds)
        end = time.time()
        after = len(pipeline.client.history())
    finally:
        stop_quietly(run)
    served = served_in(endpoint, base.replace("s3:/", "", 1) + "/", start, end)
    return {
        "interval": interval,
        "seconds": end - start,
        "requests": len(served),
        "requests_per_s": len(served) / (end - start),
        "by_method": dict(sorted(Counter(r.method for r in served).items())),
        "by_area": dict(sorted(Counter(area(r.path) for r in served).items())),
        "checkpoints": after - before,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of each idle run")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.reps, args.warmup, args.window, args.idle = 1, 5.0, 10.0, 10.0
    out = args.out or (
        "/tmp/object_store_quick.json" if args.quick else "bench/results/object_store.json"
    )
    started = time.time()
    endpoint = start_s3_endpoint()
    try:
        endpoint.create_bucket(BUCKET)
        os.environ.update(endpoint.environment())  # before the JVM and its workers start
        from spark_ckpt import local_session

        spark = local_session("object-store-bench", "local[2]", log_level="ERROR")
        runs: dict[str, list[dict[str, Any]]] = {"local": [], "s3": []}
        order = ["local", "s3", "s3", "local"] * ((args.reps + 1) // 2)
        counts = Counter[str]()
        with tempfile.TemporaryDirectory() as scratch:
            for line in order:
                if counts[line] >= args.reps:
                    continue
                counts[line] += 1
                n = counts[line]
                base = f"{scratch}/{line}-{n}" if line == "local" else f"s3://{BUCKET}/{line}-{n}"
                result = measure(spark, endpoint, line, base, args)
                runs[line].append(result)
                print(
                    f"  {line:5} rep {n}: {result['rows_per_s']:,.0f} rows/s, "
                    f"{result['checkpoints']} checkpoints, p50 "
                    f"{result['duration_ms']['p50']} ms, p95 {result['duration_ms']['p95']} ms",
                    flush=True,
                )
            idle_runs = [
                idle(spark, endpoint, f"s3://{BUCKET}/idle-1s", args.idle, "1s"),
                idle(spark, endpoint, f"s3://{BUCKET}/idle-off", args.idle, "off"),
            ]
        spark.stop()
    finally:
        endpoint.stop()
    local_rate = [r["rows_per_s"] for r in runs["local"]]
    s3_rate = [r["rows_per_s"] for r in runs["s3"]]
    result = {
        "bench": "object_store",
        "machine": spark_machine_info(),
        "git": git_info(),
        "seconds": time.time() - started,
        "settings": vars(args),
        "runs": runs,
        "throughput_ratio_s3_over_local": paired_ratios(s3_rate, local_rate),
        "duration_p50_ms": {
            line: statistics.median([r["duration_ms"]["p50"] for r in runs[line]]) for line in runs
        },
        "duration_p95_ms": {
            line: statistics.median([r["duration_ms"]["p95"] for r in runs[line]]) for line in runs
        },
        "idle": idle_runs,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("duration_p50_ms", "duration_p95_ms")}, indent=2))
    print(f"  s3 : local rows/s {result['throughput_ratio_s3_over_local']['median']:.3f}")
    for run in idle_runs:
        rate = run["requests_per_s"]
        print(f"  idle, checkpoints {run['interval']}: {rate:.2f} requests/s {run['by_area']}")
    print(f"wrote {out} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

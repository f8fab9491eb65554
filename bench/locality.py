"""Locality benchmark: how often a subtask finds its state where it runs, across micro-batches.

A streaming query ``groupBy("subtask").applyInPandasWithState(fn, ...)`` over 4 subtasks
(``rate-micro-batch`` source: micro-batch *b* holds the values ``[b*R, (b+1)*R)``; subtask =
``value % 4``, key = ``(value // 4) % K``). Per subtask and micro-batch, ``fn``:

1. reads the fence from its ``GroupState`` (``spark_ckpt.spark.executors.executor_cache.Fence``);
2. looks the subtask's state image up in a cache (the kind under test, below) with that fence;
3. on a miss rebuilds the state from the durable copy the fence names (a file per subtask and
   batch in the pipeline directory, written every batch: the stand-in for the changelog);
4. "processes": adds the per-key counts of the rows it got to the state (Arrow ``group_by``);
5. writes the durable copy, publishes the new image to the cache and keeps the new fence in
   its ``GroupState``; emits the state with the lookup's outcome, the Python worker's pid, the
   executor's identity and JVM pid.

Cache kinds: ``executor`` — :class:`~spark_ckpt.spark.executors.executor_cache.ExecutorStateCache`
(Arrow IPC files in the executor's local directory, shared by its Python workers);
``worker`` — a dict in the Python worker's memory (what a cache without the executor-wide
directory amounts to).

Measured after warm-up (the first 3 micro-batches are skipped): the fraction of subtask
micro-batches that hit, the misses by reason, how often a subtask changed Python worker and
executor between consecutive micro-batches, and the load time of hits and rebuilds. Each
master runs in a child process of its own (one SparkSession, both cache kinds one after the
other). Correctness: every micro-batch's state of every subtask must equal a plain fold over
the rows ``[0, (b+1)*R)`` (numpy ``bincount``), each subtask must see ``R/4`` rows per batch and
the batch id Spark gives ``foreachBatch``; otherwise the exit status is 1.

    .venv/bin/python bench/locality.py            # local[2] and local-cluster[2,1,1024], ~5 min
    .venv/bin/python bench/locality.py --masters "local[2]" --batches 10 --out /tmp/loc.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SUBTASKS = 4
WARMUP = 3
KINDS = ("executor", "worker")
MASTERS = ("local[2]", "local-cluster[2,1,1024]")
OUT_SCHEMA = (
    "sub long, batch long, outcome string, load_s double, rows long, worker_pid long,"
    " jvm_pid long, executor string, cache_dir string, key long, count long"
)


# -- the subtask function (runs in Spark's Python workers) -------------------------------------


def make_fn(kind: str, root: str, run_id: str, keys: int) -> Any:
    """The ``applyInPandasWithState`` function of one query (see the module docstring)."""

    def fn(key: Any, pdfs: Any, state: Any) -> Any:
        import sys as _sys
        import time as _time

        import pandas as pd
        import pyarrow as pa
        import pyarrow.compute as pc

        from spark_ckpt.spark.executors.executor_cache import (
            CacheKey,
            ExecutorStateCache,
            Fence,
            MissReason,
            StateImage,
            attempt_token,
            current_batch_id,
            executor_cache_dir,
            executor_identity,
        )

        sub = int(key[0])
        batch = current_batch_id()
        assert batch is not None, "not in a streaming task"
        fence = Fence.from_row(state.get if state.exists else None)
        ckey = CacheKey(root, run_id, sub)
        t0 = _time.perf_counter()
        counts: pa.Table | None
        if kind == "executor":
            cache = ExecutorStateCache.for_this_executor()
            found = cache.lookup(ckey, fence)
            counts = found.image.tables["counts"] if found.image is not None else None
            outcome = "hit" if found.miss is None else found.miss.value
        else:  # a dict in this Python worker's memory (it outlives the task in a reused worker)
            memo = _sys.__dict__.setdefault("_spark_ckpt_locality_bench", {})
            entry = memo.get((root, run_id, sub))
            if fence is None:
                counts, outcome = None, MissReason.NO_FENCE.value
            elif entry is None:
                counts, outcome = None, MissReason.NO_ENTRY.value
            elif entry[0] != fence:
                counts, outcome = None, MissReason.STALE_FENCE.value
            else:
                counts, outcome = entry[1], "hit"
        if counts is None:  # rebuild from the durable copy the fence names
            if fence is None:
                counts = pa.table(
                    {"key": pa.array([], pa.int64()), "count": pa.array([], pa.int64())}
                )
            else:
                path = f"{root}/durable/{sub}/b{fence.batch_id:012d}-{fence.token}.arrow"
                with pa.memory_map(path, "r") as source:
                    counts = pa.ipc.open_file(source).read_all()
        load_s = _time.perf_counter() - t0

        rows = pa.Table.from_pandas(pd.concat(list(pdfs), ignore_index=True), preserve_index=False)
        delta = rows.group_by("key").aggregate([("key", "count")]).rename_columns(["key", "count"])
        merged = (
            pa.concat_tables([counts, delta.cast(counts.schema)])
            .group_by("key")
            .aggregate([("count", "sum")])
            .rename_columns(["key", "count"])
        )
        merged = merged.take(pc.sort_indices(merged, [("key", "ascending")]))

        token = attempt_token()
        durable = Path(f"{root}/durable/{sub}")
        durable.mkdir(parents=True, exist_ok=True)
        tmp = durable / f".tmp-{token}"
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, merged.schema) as writer:
            writer.write_table(merged)
        os.rename(tmp, durable / f"b{batch:012d}-{token}.arrow")
        if kind == "executor":
            new_fence = cache.publish(
                ckey, batch, StateImage({"counts": merged}), token=token, previous=fence
            )
        else:
            new_fence = Fence(run_id, batch, token, executor_identity())
            memo[(root, run_id, sub)] = (new_fence, merged)
        state.update(new_fence.to_row())

        def parent(pid: int) -> int:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                return -1

        n = merged.num_rows
        yield pd.DataFrame(
            {
                "sub": [sub] * n,
                "batch": [batch] * n,
                "outcome": [outcome] * n,
                "load_s": [load_s] * n,
                "rows": [rows.num_rows] * n,
                "worker_pid": [os.getpid()] * n,
                # a worker is forked by pyspark's daemon, a child of the executor's JVM
                "jvm_pid": [parent(os.getppid())] * n,
                "executor": [executor_identity()] * n,
                "cache_dir": [str(executor_cache_dir())] * n,
                "key": merged.column("key").to_pylist(),
                "count": merged.column("count").to_pylist(),
            }
        )

    return fn


# -- one query ------------------------------------------------------------------------------


def run_query(
    spark: Any, kind: str, batches: int, rows_per_batch: int, keys: int
) -> dict[str, Any]:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from spark_ckpt.spark.driver.batch_aligner import collect_arrow
    from spark_ckpt.spark.executors.executor_cache import FENCE_SCHEMA

    workdir = Path(tempfile.mkdtemp(prefix=f"locality-{kind}-"))
    root, run_id = str(workdir / "pipeline"), uuid.uuid4().hex
    src = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", 2)
        .load()
        .select(
            (F.col("value") % SUBTASKS).alias("sub"),
            ((F.col("value") / SUBTASKS).cast("long") % keys).alias("key"),
        )
    )
    records: list[dict[str, Any]] = []
    done = threading.Event()

    def sink(df: Any, batch_id: int) -> None:
        table = collect_arrow(df)
        for row in table.to_pylist():
            row["spark_batch"] = batch_id
            records.append(row)
        if batch_id + 1 >= batches:
            done.set()

    started = time.monotonic()
    query = (
        src.groupBy("sub")
        .applyInPandasWithState(
            make_fn(kind, root, run_id, keys),
            OUT_SCHEMA,
            FENCE_SCHEMA,
            "append",
            GroupStateTimeout.NoTimeout,
        )
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(workdir / "spark-checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        while not done.wait(1.0):
            if not query.isActive:
                raise RuntimeError(f"query failed: {query.exception()}")
    finally:
        query.stop()
    elapsed = time.monotonic() - started
    shutil.rmtree(workdir, ignore_errors=True)
    records = [r for r in records if r["spark_batch"] < batches]
    return {
        "kind": kind,
        "elapsed_s": round(elapsed, 1),
        **analyze(records, batches, rows_per_batch, keys),
    }


# -- analysis and the oracle ----------------------------------------------------------------


def fold(batch: int, rows_per_batch: int, keys: int) -> np.ndarray:
    """Per (subtask, key): how many of the values ``[0, (batch+1)*R)`` map to it (a plain
    fold over the rate source's rows)."""
    values = np.arange((batch + 1) * rows_per_batch, dtype=np.int64)
    index = (values % SUBTASKS) * keys + (values // SUBTASKS) % keys
    return np.bincount(index, minlength=SUBTASKS * keys).reshape(SUBTASKS, keys)


def analyze(
    records: list[dict[str, Any]], batches: int, rows_per_batch: int, keys: int
) -> dict[str, Any]:
    errors: list[str] = []
    per: dict[tuple[int, int], dict[str, Any]] = {}
    for r in records:
        if r["batch"] != r["spark_batch"]:
            errors.append(
                f"sub {r['sub']}: task batch {r['batch']} in foreachBatch {r['spark_batch']}"
            )
        cell = per.setdefault((r["sub"], r["batch"]), {**r, "state": {}})
        cell["state"][r["key"]] = r["count"]
    for b in range(batches):
        expected = fold(b, rows_per_batch, keys)
        for s in range(SUBTASKS):
            cell = per.get((s, b))
            if cell is None:
                errors.append(f"sub {s} batch {b}: no output")
                continue
            if cell["rows"] != rows_per_batch // SUBTASKS:
                errors.append(
                    f"sub {s} batch {b}: {cell['rows']} rows, expected {rows_per_batch // SUBTASKS}"
                )
            want = {k: int(c) for k, c in enumerate(expected[s]) if c}
            if cell["state"] != want:
                errors.append(f"sub {s} batch {b}: state differs from the fold over the input")
    measured = [c for (s, b), c in per.items() if b >= WARMUP]
    hits = sum(1 for c in measured if c["outcome"] == "hit")
    reasons: dict[str, int] = {}
    for c in measured:
        if c["outcome"] != "hit":
            reasons[c["outcome"]] = reasons.get(c["outcome"], 0) + 1
    worker_switches = executor_switches = 0
    per_sub: dict[str, Any] = {}
    for s in range(SUBTASKS):
        cells = [per[(s, b)] for b in range(batches) if (s, b) in per]
        pairs = [(a, b) for a, b in itertools.pairwise(cells) if b["batch"] >= WARMUP]
        ws = sum(1 for a, b in pairs if a["worker_pid"] != b["worker_pid"])
        es = sum(1 for a, b in pairs if a["executor"] != b["executor"])
        worker_switches += ws
        executor_switches += es
        per_sub[str(s)] = {
            "worker_pids": [c["worker_pid"] for c in cells],
            "executors": sorted({c["executor"] for c in cells}),
            "jvm_pids": sorted({c["jvm_pid"] for c in cells}),
            "outcomes": [c["outcome"] for c in cells],
            "worker_switches": ws,
            "executor_switches": es,
        }
    hit_load = [c["load_s"] for c in measured if c["outcome"] == "hit"]
    miss_load = [c["load_s"] for c in per.values() if c["outcome"] not in ("hit", "no_fence")]
    return {
        "batches": batches,
        "subtask_batches_measured": len(measured),
        "hits": hits,
        "hit_rate": round(hits / len(measured), 4) if measured else None,
        "misses": reasons,
        "worker_switches": worker_switches,
        "executor_switches": executor_switches,
        "executors": sorted({c["executor"] for c in per.values()}),
        "jvm_pids": sorted({c["jvm_pid"] for c in per.values()}),
        "worker_pids": len({c["worker_pid"] for c in per.values()}),
        "cache_dirs": sorted({c["cache_dir"] for c in per.values()}),
        "load_ms_p50": {
            "hit": round(statistics.median(hit_load) * 1e3, 2) if hit_load else None,
            "rebuild": round(statistics.median(miss_load) * 1e3, 2) if miss_load else None,
        },
        "per_subtask": per_sub,
        "errors": errors,
    }


# -- processes ------------------------------------------------------------------------------


def child(args: argparse.Namespace) -> int:
    from spark_ckpt.spark.session.builders import local_session

    started = time.monotonic()
    spark = local_session(
        "locality-bench", master=args.child, shuffle_partitions=SUBTASKS, log_level="ERROR"
    )
    session_s = time.monotonic() - started
    try:
        results = [run_query(spark, kind, args.batches, args.rows, args.keys) for kind in KINDS]
    finally:
        spark.stop()
    Path(args.out).write_text(
        json.dumps({"master": args.child, "session_start_s": round(session_s, 1), "kinds": results})
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--masters", nargs="+", default=list(MASTERS))
    parser.add_argument(
        "--batches", type=int, default=18, help="micro-batches per query (3 are warm-up)"
    )
    parser.add_argument("--rows", type=int, default=40_000, help="rows per micro-batch")
    parser.add_argument("--keys", type=int, default=256, help="keys per subtask")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "locality.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # pyspark's own applyInPandasWithState serializer warns about pandas' concat on every call
        "PYTHONWARNINGS": "ignore::FutureWarning",
    }
    started = time.monotonic()
    runs = []
    for master in args.masters:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            part = f.name
        cmd = [
            sys.executable,
            __file__,
            "--child",
            master,
            "--batches",
            str(args.batches),
            "--rows",
            str(args.rows),
            "--keys",
            str(args.keys),
            "--out",
            part,
        ]
        print(f"{master}: running ...", flush=True)
        proc = subprocess.run(cmd, env=env, cwd=ROOT, timeout=1800, check=False)
        if proc.returncode != 0:
            print(
                f"error: {master}: the child failed with exit status {proc.returncode}",
                file=sys.stderr,
            )
            return 1
        runs.append(json.loads(Path(part).read_text()))
        os.unlink(part)
    summary = {
        f"{run['master']} / {k['kind']}": {
            "hit_rate": k["hit_rate"],
            "worker_switches": k["worker_switches"],
            "executor_switches": k["executor_switches"],
            "subtask_batches_measured": k["subtask_batches_measured"],
            "batches": k["batches"],
            "misses": k["misses"],
        }
        for run in runs
        for k in run["kinds"]
    }
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_end": os.getloadavg(),
        },
        "settings": {
            "subtasks": SUBTASKS,
            "warmup_batches": WARMUP,
            "batches": args.batches,
            "rows_per_batch": args.rows,
            "keys_per_subtask": args.keys,
            "trigger": "1 second",
            "source": "rate-micro-batch, 2 partitions",
            "python_worker_reuse": True,
        },
        "elapsed_s": round(time.monotonic() - started, 1),
        "summary": summary,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    errors = [
        f"{run['master']} / {k['kind']}: {e}"
        for run in runs
        for k in run["kinds"]
        for e in k["errors"]
    ]
    for e in errors[:20]:
        print(f"error: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

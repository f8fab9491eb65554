"""Sources bench (#17): the read rate of ``source=kafka`` and ``source=files`` against a plain
reader of the same data, in one run::

    .venv/bin/python bench/sources.py            # writes bench/results/sources.json
    .venv/bin/python bench/sources.py --quick    # smoke run

* **Kafka.** ``records`` records (a JSON value of ~40 bytes) on ``partitions`` partitions of a
  local tansu broker. Plain reader: one ``confluent-kafka`` consumer assigned every partition
  from offset 0, consuming until it has every record. ``ckpt-source``: a streaming query of
  the raw source (every partition a channel, ``maxOffsetsPerTrigger`` off) into Spark's
  ``noop`` sink, ``local[2]``.
* **Files.** The same rows as ``files`` Parquet files. Plain reader: a ``pyarrow.dataset``
  scan of the directory. ``ckpt-source``: the raw ``source=files`` query into ``noop``.

A ``ckpt-source`` query's rate is its rows over the time from the first micro-batch's trigger
to the end of the batch that read the last row (Spark's query progress), so the query's start
(the JVM is warm: one unmeasured run first) is not counted; the plain readers are timed
around their reads. Repetitions are interleaved; the report gives medians and the ratio
``ckpt-source / plain`` of medians. Readers here include what each must do to deliver rows:
the plain consumer builds nothing, the source builds Arrow tables with the barrier columns
and hands them to Spark.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: benchcommon

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "sources.json"


def produce_all(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    from spark_ckpt.testing.broker import producer

    p = producer(bootstrap, **{"queue.buffering.max.messages": 1_000_000})
    for i in range(records):
        value = json.dumps({"user_id": i % 10_000, "amount": i % 997}).encode()
        while True:
            try:
                p.produce(
                    topic, value=value, key=str(i % 10_000).encode(), partition=i % partitions
                )
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0


def plain_kafka(bootstrap: str, topic: str, partitions: int, records: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False})
    start = time.perf_counter()
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = 0
    while seen < records:
        seen += sum(1 for m in c.consume(10_000, timeout=1.0) if m.error() is None)
    elapsed = time.perf_counter() - start
    c.close()
    return records / elapsed


def plain_files(directory: str, rows: int) -> float:
    import pyarrow.dataset as ds

    start = time.perf_counter()
    table = ds.dataset(directory, format="parquet").to_table()
    elapsed = time.perf_counter() - start
    assert table.num_rows == rows
    return rows / elapsed


def ckpt_source(spark: Any, options: dict[str, Any], rows: int, root: str) -> float:
    """Rows/s of a raw ``ckpt-source`` query into ``noop`` (see the module docstring)."""
    from spark_ckpt import CheckpointConfig, Pipeline

    pipeline = Pipeline(spark, "bench", config=CheckpointConfig(interval_ms=None), root=root)
    query = (
        pipeline.read(**options)
        .writeStream.format("noop")
        .option("checkpointLocation", os.path.join(root, "spark"))
        .start()
    )
    try:
        progress: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + 600
        while sum(p["numInputRows"] for p in progress.values()) < rows:
            if time.monotonic() > deadline or not query.isActive:
                raise RuntimeError(
                    f"query read {sum(p['numInputRows'] for p in progress.values())}"
                )
            time.sleep(0.2)
            for p in query.recentProgress:
                d = p if isinstance(p, dict) else json.loads(p.json)
                progress.setdefault(int(d["batchId"]), d)
    finally:
        query.stop()
    batches = [p for p in progress.values() if p["numInputRows"] > 0]
    from datetime import datetime

    def at(p: dict[str, Any]) -> float:
        return datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()

    first = min(batches, key=at)
    last = max(batches, key=at)
    seconds = at(last) + last["durationMs"]["triggerExecution"] / 1000 - at(first)
    return rows / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    records = 20_000 if args.quick else 300_000
    reps = args.reps or (1 if args.quick else 3)
    partitions, files = 4, 16

    import pyarrow as pa
    import pyarrow.parquet as pq
    from benchcommon import git_info, spark_machine_info

    from spark_ckpt.spark.session.builders import local_session
    from spark_ckpt.testing.broker import running_broker

    work = tempfile.mkdtemp(prefix="spark-ckpt-bench-sources-")
    spark = local_session("spark-ckpt-bench-sources", log_level="ERROR")
    rates: dict[str, list[float]] = {
        k: [] for k in ("kafka/plain", "kafka/ckpt-source", "files/plain", "files/ckpt-source")
    }
    try:
        directory = os.path.join(work, "files")
        os.makedirs(directory)
        per_file = records // files
        for f in range(files):
            ids = range(f * per_file, (f + 1) * per_file)
            pq.write_table(
                pa.table({"user_id": [i % 10_000 for i in ids], "amount": [i % 997 for i in ids]}),
                os.path.join(directory, f"part-{f:03d}.parquet"),
            )
        with running_broker() as broker:
            broker.create_topic("bench", partitions)
            t0 = time.perf_counter()
            produce_all(broker.bootstrap, "bench", partitions, records)
            print(f"produced {records:,} records in {time.perf_counter() - t0:.1f} s", flush=True)
            kafka = {
                "source": "kafka",
                "kafka.bootstrap.servers": broker.bootstrap,
                "subscribe": "bench",
                "startingOffsets": "earliest",
            }
            files_options = {
                "source": "files",
                "path": directory,
                "format": "parquet",
                "channels": partitions,
            }
            runs = {
                "kafka/plain": lambda: plain_kafka(broker.bootstrap, "bench", partitions, records),
                "kafka/ckpt-source": lambda root: ckpt_source(spark, kafka, records, root),
                "files/plain": lambda: plain_files(directory, per_file * files),
                "files/ckpt-source": lambda root: ckpt_source(
                    spark, files_options, per_file * files, root
                ),
            }
            for rep in range(-1, reps):  # -1: warm-up, not measured
                order = list(runs) if rep % 2 else list(reversed(runs))
                for name in order:
                    root = tempfile.mkdtemp(dir=work)
                    fn = runs[name]
                    rate = fn(root) if name.endswith("ckpt-source") else fn()  # type: ignore[call-arg]
                    shutil.rmtree(root, ignore_errors=True)
                    if rep >= 0:
                        rates[name].append(rate)
                        print(f"rep {rep + 1}/{reps} {name:<18} {rate:>12,.0f} rows/s", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    medians = {k: statistics.median(v) for k, v in rates.items()}
    result = {
        "quick": args.quick,
        "machine": spark_machine_info(),
        "git": git_info(),
        "settings": {"records": records, "partitions": partitions, "files": files, "reps": reps},
        "rows_per_s": {k: {"median": medians[k], "runs": v} for k, v in rates.items()},
        "ratio": {
            "kafka ckpt-source / plain": medians["kafka/ckpt-source"] / medians["kafka/plain"],
            "files ckpt-source / plain": medians["files/ckpt-source"] / medians["files/plain"],
        },
    }
    for k, v in result["ratio"].items():
        print(f"{k}: {v:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

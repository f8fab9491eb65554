"""#42's offline state and stateless sink with everything on the test's S3 endpoint, in a
process whose environment points at it::

    python tests/integration/s3_offline_job.py BASE SCRATCH

1. A pipeline at BASE/root counts the generator's first 200 rows per channel into
   BASE/counts (``available_now``); then ``StateReader`` and ``format("ckpt-state")`` read
   its state from the endpoint, and ``SavepointWriter`` writes a savepoint from it to
   BASE/written.
2. A stateless ``ckpt-source`` → ``ckpt-sink`` query (its store BASE/sink-root, its output
   BASE/sink-out, Spark's checkpoint location in SCRATCH) runs, then stops with a final
   checkpoint.

Prints one JSON line: the counts each reader found, and the final checkpoint's source
positions of the stateless query; exit status 0 when everything ran.

With ``SPARK_CKPT_TEST_STORAGE_OPTIONS`` set (a JSON object of delta-rs keys), the
environment has no ``AWS_*`` variables and every step gets those options explicitly: the
pipelines' ``storage_options``, ``StateReader.open(..., storage_options=)``, the
``ckpt-state`` option ``storage.secret``, and ``ckpt-sink`` through
``pipeline.sink_options``."""

from __future__ import annotations

import json
import os
import sys
import time

from spark_ckpt import (
    BARRIER_COLUMNS,
    CheckpointConfig,
    Pipeline,
    RunningCount,
    SavepointWriter,
    StateReader,
    StorageOptions,
    local_session,
    register_data_sources,
    stop_query,
)

SOURCE = {"source": "generator", "seed": 7, "channels": 2, "rate": 0, "backlog": 200, "keys": 25}


def main(argv: list[str]) -> int:
    base, scratch = argv
    explicit = os.environ.get("SPARK_CKPT_TEST_STORAGE_OPTIONS")
    options = None if explicit is None else json.loads(explicit)
    assert options is None or not any(k.startswith("AWS_") for k in os.environ)
    spark = local_session("s3-offline", "local[2]")
    try:
        config = CheckpointConfig.from_options({"checkpoint.interval": "300ms"})
        pipeline = Pipeline(
            spark, "counts", config=config, root=f"{base}/root", storage_options=options
        )
        result = pipeline.run(
            SOURCE, RunningCount("counter", "user_id"), output=f"{base}/counts", available_now=True
        )
        root = StateReader.open(f"{base}/root", storage_options=options)
        counts = root.keyed("counter", "count")
        state = spark.read.format("ckpt-state")
        if options is not None:
            state = state.option("storage.secret", StorageOptions.of(options).to_json())
        frame = (
            state.option("path", f"{base}/root").option("uid", "counter").option("state", "count")
        ).load()
        read = frame.count()
        written = f"{base}/written"
        SavepointWriter.from_existing(root, pipeline="counts").rename_operator(
            "counter", "v2"
        ).write(written, storage_options=options)
        renamed = StateReader.open(written, storage_options=options).keyed("v2", "count")
        register_data_sources(spark)
        store = f"{base}/sink-root"
        orders = Pipeline(spark, "orders", root=store, storage_options=options)
        src = orders.read(
            source="generator", channels="2", rate="0", backlog="300", keys="25", seed="7"
        )
        query = (
            src.select("user_id", "amount", *BARRIER_COLUMNS)
            .writeStream.format("ckpt-sink")
            .options(**orders.sink_options(f"{base}/sink-out"))
            .option("checkpointLocation", f"{scratch}/spark")
            .start()
        )
        time.sleep(3)
        last = stop_query(query, store, drain=True)
    finally:
        spark.stop()
    print(
        json.dumps(
            {
                "failures": list(result.failures),
                "state_keys": counts.num_rows,
                "state_rows_spark": read,
                "written_keys": renamed.num_rows,
                "sink_positions": [last.offsets()[("source", c)] for c in range(2)],
            }
        )
    )
    return 0 if not result.failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The variants of the time bench (:mod:`runbench.timebench`): event-time tumbling window
counts per key, each started as a Spark streaming query on the same generated input, in the
shape of :mod:`runbench.variants` (``start(spark, root, workload) -> Started``), so that
:func:`runbench.measure.measure_variant` measures them alike.

The input of every variant is the generator's ``ckpt-source`` (data rows only), with an
event-time column ``ts`` that :func:`jitter` computes: the generator's ``event_ts`` less up
to 1.9 s, a function of the row's ``amount``, so the rows are out of order by up to 2 s and
none is behind a watermark that trails by 2 s (no variant drops a row):

* :func:`ckpt_windows` — spark-ckpt: ``WindowAggregate(..., Windows.tumbling(size),
  [Agg.count()])`` with ``WatermarkStrategy.for_bounded_out_of_orderness("ts", 2000)``,
  exactly-once checkpoints every ``interval_ms``, output into Delta through the two-phase
  sink;
* :func:`spark_windows` — Spark's own ``withWatermark("ts", "2 seconds").groupBy(window(ts,
  size), user_id).count()``, append mode, with a ``checkpointLocation``;
* :func:`tws_windows` — ``transformWithStateInPandas`` with ``timeMode="EventTime"`` and
  :class:`runbench.tws.WindowCounter` (a count per key per window, an event-time timer at
  the window's end), append mode, with a ``checkpointLocation`` (it needs the RocksDB state
  store).

Spark's two variants write to :data:`SPARK_SINKS` (``parquet``: Spark's exactly-once file
sink, files and its ``_spark_metadata`` log, the nearest to spark-ckpt's Delta output that
needs no JAR — there is no Delta Spark JAR here; ``noop``: nothing written).
"""

from __future__ import annotations

import os
from typing import Any

from benchcommon import PIPELINE, stop_quietly

from runbench.variants import ROCKSDB_CONF, Started, VariantStart, Workload

#: The out-of-orderness bound of every variant's watermark, ms.
BOUND_MS = 2000
#: :func:`jitter` moves a row's event time back by ``(amount % JITTER_STEPS) * JITTER_US``.
JITTER_STEPS, JITTER_US = 20, 100_000  # 0 .. 1.9 s: within the bound
#: The event-time column :func:`jitter` adds.
TIME_COLUMN = "ts"

#: Spark's state store providers, by the name the bench's settings use.
STATE_STORES = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": ROCKSDB_CONF["spark.sql.streaming.stateStore.providerClass"],
}
#: The sinks Spark's variants may write to (see the module docstring).
SPARK_SINKS = ("parquet", "noop")


def jitter(df: Any) -> Any:
    """The event-time column ``ts``: ``event_ts`` less ``(amount % 20) * 0.1 s`` (0 to 1.9 s)."""
    from pyspark.sql import functions as F

    back = (F.col("amount") % JITTER_STEPS) * JITTER_US
    return df.withColumn(TIME_COLUMN, F.timestamp_micros(F.unix_micros("event_ts") - back))


def checkpoint_options(interval_ms: int) -> dict[str, str]:
    """Exactly-once aligned checkpoints every *interval_ms*, 2 retained, a statistics
    history long enough for any measured run (every checkpoint's timers are read from it)."""
    return {
        "checkpoint.interval": f"{interval_ms}ms",
        "checkpoint.retained": "2",
        "checkpoint.history": "5000",
    }


def ckpt_windows(size_ms: int, placement: str) -> VariantStart:
    """spark-ckpt's ``WindowAggregate`` (tumbling windows of *size_ms*, ``Agg.count()``),
    its subtasks placed as *placement* says."""
    from spark_ckpt import (
        Agg,
        CheckpointConfig,
        Pipeline,
        WatermarkStrategy,
        WindowAggregate,
        Windows,
    )

    def run(spark: Any, root: str, w: Workload) -> Started:
        if w.interval_ms is None:
            raise ValueError("the time bench runs with checkpoints")
        pipeline = Pipeline(
            spark,
            PIPELINE,
            config=CheckpointConfig.from_options(checkpoint_options(w.interval_ms)),
            root=os.path.join(root, "pipeline"),
        )
        started = pipeline.start(
            w.source,
            WindowAggregate("windows", "user_id", Windows.tumbling(size_ms), [Agg.count()]),
            output=os.path.join(root, "out"),
            parallelism=w.parallelism,
            placement=placement,
            transform=jitter,
            watermark=WatermarkStrategy.for_bounded_out_of_orderness(TIME_COLUMN, BOUND_MS),
        )
        return Started(started.query, lambda: stop_quietly(started), pipeline)

    return run


def _spark_input(spark: Any, root: str, w: Workload, state_store: str) -> Any:
    """The data rows of ``ckpt-source`` with :func:`jitter`'s ``ts``, read by a pipeline
    object that only names the source (no checkpoints of its own); the session set to
    *state_store* and ``spark.sql.shuffle.partitions`` = the parallelism."""
    from pyspark.sql import functions as F

    from spark_ckpt import CheckpointConfig, Pipeline
    from spark_ckpt.protocol.barrier import KIND

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", STATE_STORES[state_store])
    for key, value in ROCKSDB_CONF.items():
        if key != "spark.sql.streaming.stateStore.providerClass":
            spark.conf.set(key, value)
    spark.conf.set("spark.sql.shuffle.partitions", str(w.parallelism))
    reader = Pipeline(
        spark,
        f"{PIPELINE}-jvm",
        config=CheckpointConfig(interval_ms=None),
        root=os.path.join(root, "pipeline"),
    )
    return jitter(reader.read(**w.source).where(F.col(KIND) == 0))


def _write(frame: Any, root: str, sink: str) -> Any:
    """Append mode into *sink* (:data:`SPARK_SINKS`), with a ``checkpointLocation``."""
    writer = (
        frame.writeStream.outputMode("append")
        .format(sink)
        .option("checkpointLocation", os.path.join(root, "spark"))
    )
    if sink == "parquet":
        writer = writer.option("path", os.path.join(root, "out"))
    return writer.start()


def spark_windows(size_ms: int, state_store: str, sink: str) -> VariantStart:
    """Spark's ``groupBy(window(ts, size), user_id).count()`` after ``withWatermark(ts,
    "2 seconds")``, in append mode (each window once, when the watermark passes it)."""

    def run(spark: Any, root: str, w: Workload) -> Started:
        from pyspark.sql import functions as F

        rows = _spark_input(spark, root, w, state_store)
        counts = (
            rows.withWatermark(TIME_COLUMN, f"{BOUND_MS} milliseconds")
            .groupBy(F.window(TIME_COLUMN, f"{size_ms} milliseconds"), "user_id")
            .count()
        )
        query = _write(counts, root, sink)
        return Started(query, query.stop)

    return run


def tws_windows(size_ms: int, sink: str) -> VariantStart:
    """``transformWithStateInPandas(WindowCounter(size_ms), ..., "append", "EventTime")``
    after ``withWatermark(ts, "2 seconds")``, on the RocksDB state store (which the API
    requires)."""

    def run(spark: Any, root: str, w: Workload) -> Started:
        from pyspark import cloudpickle

        from runbench import tws

        cloudpickle.register_pickle_by_value(tws)  # type: ignore[no-untyped-call]
        rows = _spark_input(spark, root, w, "rocksdb").select("user_id", TIME_COLUMN)
        counts = (
            rows.withWatermark(TIME_COLUMN, f"{BOUND_MS} milliseconds")
            .groupBy("user_id")
            .transformWithStateInPandas(
                statefulProcessor=tws.WindowCounter(size_ms, TIME_COLUMN),
                outputStructType=tws.OUTPUT_DDL,
                outputMode="append",
                timeMode="EventTime",
            )
        )
        query = _write(counts, root, sink)
        return Started(query, query.stop)

    return run

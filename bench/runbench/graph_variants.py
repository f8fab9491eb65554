"""The variants of the graphs bench (:mod:`runbench.graphbench`), in the shape of
:mod:`runbench.variants` (``start(spark, root, workload) -> Started``), so that
:func:`runbench.measure.measure_variant` measures them alike.

**Two inputs joined** (``Workload.source`` holds the named inputs, ``{"clicks": {...},
"impressions": {...}}``, each the generator's ``ckpt-source`` options with its own
``maxRowsPerTrigger``):

* :func:`ckpt_join` — spark-ckpt: ``Pipeline.start(sources=..., operators=IntervalJoin(
  "clicks", "impressions", key="user_id", lower=-5 s, upper=+5 s, time="event_ts"),
  watermark={each: for_bounded_out_of_orderness("event_ts", 2 s)})``, exactly-once
  checkpoints every ``interval_ms``, into Delta through the two-phase sink;
* :func:`spark_join` — Spark's own stream-stream inner join of the same rows, read by one
  ``ckpt-source`` per input (data rows only, no checkpoints of their own):
  ``withWatermark("event_ts", "2 seconds")`` on both sides, ``c.user_id = i.user_id AND
  i.event_ts BETWEEN c.event_ts - INTERVAL 5 s AND c.event_ts + INTERVAL 5 s``, append mode,
  with a ``checkpointLocation``, into :data:`~runbench.time_variants.SPARK_SINKS` (``parquet``:
  Spark's exactly-once file sink, as the time bench's baselines). Its output has spark-ckpt's
  columns: the clicks' ``user_id, amount, event_ts``, then ``impressions_amount,
  impressions_event_ts``.

**One input, one stage** (the keyed running count of :mod:`runbench.variants`):

* :func:`today_count` — the job as written today, ``Pipeline.start(source,
  RunningCount(...))`` (:func:`runbench.variants.start_pipeline`);
* :func:`graph_count` — the same job given as a one-input graph, ``sources={"only":
  source}``, which the pipeline runs as a pipeline of that one source (history of this
  line's figures: ``bench/README.md``, *Graphs*).

**The read limit of named inputs.** With ``sources=`` the pipeline reads every input through
one ``ckpt-source`` (``source=inputs``); the inputs' ``maxRowsPerTrigger`` add up to that
source's read limit, which it shares fairly over all channels: with equal
inputs every input reads its own limit per micro-batch, as each of Spark's two sources does
with its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from benchcommon import PIPELINE, stop_quietly

from runbench.time_variants import STATE_STORES, checkpoint_options
from runbench.variants import PLACEMENTS, Started, VariantStart, Workload
from spark_ckpt.pipeline.pipeline import Pipeline
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.runtime.joins import IntervalJoin
from spark_ckpt.runtime.operator import RunningCount

#: The join's inputs (left, right), their key and event-time columns.
LEFT, RIGHT = "clicks", "impressions"
KEY, TIME = "user_id", "event_ts"
#: The interval, ms: an impression joins a click within +-5 s of it (both bounds inclusive).
LOWER_MS, UPPER_MS = -5_000, 5_000
#: The out-of-orderness bound of both inputs' watermarks, ms.
BOUND_MS = 2_000
#: The single input's name of the one-stage graph.
ONLY = "only"
#: Spark's setting of the state store provider (set for the Spark query alone).
PROVIDER = "spark.sql.streaming.stateStore.providerClass"


@dataclass
class GraphStarted(Started):
    """A started variant, and where its output goes: *output*, a Delta table (spark-ckpt
    variants) or the directory of Spark's file sink (*output_format* ``"parquet"``); None:
    Spark's ``noop`` sink."""

    output: str | None = None
    output_format: str = "delta"


def _pipeline(spark: Any, root: str, w: Workload) -> Pipeline:
    if w.interval_ms is None:
        raise ValueError("the graphs bench runs with checkpoints")
    return Pipeline(
        spark,
        PIPELINE,
        config=CheckpointConfig.from_options(checkpoint_options(w.interval_ms)),
        root=os.path.join(root, "pipeline"),
    )


def _inputs(w: Workload) -> dict[str, dict[str, object]]:
    """The named inputs of a workload (``Workload.source`` of a join line)."""
    out: dict[str, dict[str, object]] = {}
    for name, opts in w.source.items():
        if not isinstance(opts, Mapping):
            raise ValueError(f"input {name!r}: ckpt-source options, not {opts!r}")
        out[name] = dict(opts)
    return out


def ckpt_join(placement: str) -> VariantStart:
    """spark-ckpt's ``IntervalJoin`` of the workload's two inputs, its subtasks placed as
    *placement* says."""

    def run(spark: Any, root: str, w: Workload) -> Started:
        inputs = _inputs(w)
        pipeline = _pipeline(spark, root, w)
        bounded = WatermarkStrategy.for_bounded_out_of_orderness(TIME, BOUND_MS)
        output = os.path.join(root, "out")
        started = pipeline.start(
            sources=inputs,
            operators=IntervalJoin(LEFT, RIGHT, key=KEY, lower=LOWER_MS, upper=UPPER_MS, time=TIME),
            watermark={LEFT: bounded, RIGHT: bounded},
            output=output,
            parallelism=w.parallelism,
            placement=placement,
        )
        return GraphStarted(started.query, lambda: stop_quietly(started), pipeline, output=output)

    return run


@contextmanager
def session_conf(spark: Any, settings: Mapping[str, str]) -> Iterator[None]:
    """*settings* in the session while a query starts (it keeps them: a streaming query runs
    on a clone of the session taken at its start), then the session's own values again, so
    that the spark-ckpt queries started later do not inherit them."""
    before = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def spark_join(state_store: str, sink: str) -> VariantStart:
    """Spark's stream-stream inner join of the workload's two inputs (see the module
    docstring), its state on the *state_store* provider (:data:`STATE_STORES`), into
    *sink*."""

    def run(spark: Any, root: str, w: Workload) -> Started:
        from pyspark.sql import functions as F

        from runbench.time_variants import _write
        from spark_ckpt.protocol.barrier import KIND

        inputs = _inputs(w)
        if set(inputs) != {LEFT, RIGHT}:
            raise ValueError(f"the join's inputs are {LEFT!r} and {RIGHT!r}, not {sorted(inputs)}")

        def rows(name: str) -> Any:
            reader = Pipeline(  # one per input: only names its source, no checkpoints
                spark,
                f"{PIPELINE}-{name}",
                config=CheckpointConfig(interval_ms=None),
                root=os.path.join(root, f"pipeline-{name}"),
            )
            return reader.read(**inputs[name]).where(F.col(KIND) == 0).select(KEY, "amount", TIME)

        delay = f"{BOUND_MS} milliseconds"
        clicks = rows(LEFT).withWatermark(TIME, delay)
        impressions = (
            rows(RIGHT)
            .select(
                F.col(KEY).alias(f"{RIGHT}_{KEY}"),
                F.col("amount").alias(f"{RIGHT}_amount"),
                F.col(TIME).alias(f"{RIGHT}_{TIME}"),
            )
            .withWatermark(f"{RIGHT}_{TIME}", delay)
        )
        condition = F.expr(
            f"{KEY} = {RIGHT}_{KEY} AND {RIGHT}_{TIME} BETWEEN "
            f"{TIME} - INTERVAL {-LOWER_MS} MILLISECONDS AND "
            f"{TIME} + INTERVAL {UPPER_MS} MILLISECONDS"
        )
        pairs = clicks.join(impressions, condition, "inner").select(
            KEY, "amount", TIME, f"{RIGHT}_amount", f"{RIGHT}_{TIME}"
        )
        conf = {
            PROVIDER: STATE_STORES[state_store],
            "spark.sql.shuffle.partitions": str(w.parallelism),
        }
        with session_conf(spark, conf):
            query = _write(pairs, root, sink)
        out = os.path.join(root, "out") if sink == "parquet" else None  # _write's path
        return GraphStarted(query, query.stop, output=out, output_format=sink)

    return run


def graph_count(placement: str) -> VariantStart:
    """The keyed running count of :mod:`runbench.variants` over the workload's one source
    given as a one-input graph (``sources={"only": source}``), its subtasks placed as
    *placement* says."""

    def run(spark: Any, root: str, w: Workload) -> Started:
        inputs = {ONLY: dict(w.source)}
        pipeline = _pipeline(spark, root, w)
        output = os.path.join(root, "out")
        started = pipeline.start(
            sources=inputs,
            operators=RunningCount("counter", KEY),
            output=output,
            parallelism=w.parallelism,
            placement=placement,
        )
        return GraphStarted(started.query, lambda: stop_quietly(started), pipeline, output=output)

    return run


def today_count(placement: str) -> VariantStart:
    """The keyed running count over the workload's one source as a job is written today
    (:func:`runbench.variants.start_pipeline`: ``Pipeline.start(source, RunningCount(...))``),
    with :func:`graph_count`'s checkpoint configuration."""

    def run(spark: Any, root: str, w: Workload) -> Started:
        pipeline = _pipeline(spark, root, w)
        output = os.path.join(root, "out")
        started = PLACEMENTS[placement](
            pipeline, dict(w.source), output=output, parallelism=w.parallelism
        )
        return GraphStarted(started.query, lambda: stop_quietly(started), pipeline, output=output)

    return run

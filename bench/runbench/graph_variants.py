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

**One input, two keyed stages** (issue 51; the operators and the oracle in
:mod:`runbench.two_stages`): per-user counts, then, re-keyed by country, per-country sums over
tumbling 5 s event-time windows:

* :func:`ckpt_stages` — spark-ckpt: ``Pipeline.start(source, [Stage([UserCounts()],
  name="users"), Stage([WindowAggregate("countries", "country", Windows.tumbling(5 s),
  [Agg.sum("amount")], time_column="event_ts")], name="countries", parallelism=...)],
  watermark=for_bounded_out_of_orderness("event_ts", 2 s))``: one query, one checkpoint over
  both stages, into Delta;
* :func:`spark_stages` — Spark chaining two stateful operators in one query, both its own JVM
  aggregations (Spark >= 3.4, append mode): ``withWatermark("event_ts", "2000
  milliseconds").groupBy(window("event_ts", "5000 milliseconds"), "user_id").agg(count,
  sum("amount"))`` (per-user counts, per window: Spark has no running count that a later
  stateful operator may follow), ``country = user_id % COUNTRIES``, then
  ``groupBy(window(window_time("window"), "5000 milliseconds"), "country")
  .agg(sum("amount"))``, with a ``checkpointLocation``, into
  :data:`~runbench.time_variants.SPARK_SINKS`. The same output as spark-ckpt's job (the
  windows align), with one row per user and window between the stages instead of one per
  input row;
* :func:`spark_pandas_stages` — the first stage as spark-ckpt's, per-row running counts:
  ``groupBy("user_id").applyInPandasWithState(count_users, ..., "append", NoTimeout)``, then
  ``withWatermark("event_ts", ...)`` on its output (defined on the source only, the watermark
  does not pass through ``applyInPandasWithState`` and Spark refuses the windowed aggregation
  in append mode) and the same windowed sums. Opt-in (``--lines``): a Python call per user
  and micro-batch, some hundreds of rows/s here.

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

from runbench import two_stages
from runbench.time_variants import STATE_STORES, checkpoint_options
from runbench.variants import PLACEMENTS, Started, VariantStart, Workload
from spark_ckpt.pipeline.pipeline import Pipeline
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.runtime.joins import IntervalJoin
from spark_ckpt.runtime.operator import RunningCount
from spark_ckpt.runtime.stage import Stage
from spark_ckpt.runtime.windows import Agg, WindowAggregate, Windows

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


def stages_job(parallelism: int) -> list[Stage]:
    """The two stages of :func:`ckpt_stages`: users (the job's parallelism), then countries on
    *parallelism* subtasks."""
    return [
        Stage([two_stages.UserCounts("users")], name="users"),
        Stage(
            [
                WindowAggregate(
                    "countries",
                    "country",
                    Windows.tumbling(two_stages.WINDOW_MS),
                    [Agg.sum("amount")],
                    time_column=TIME,
                )
            ],
            name="countries",
            parallelism=parallelism,
        ),
    ]


def ckpt_stages(placement: str, *, available_now: bool = False) -> VariantStart:
    """spark-ckpt's job of two keyed stages (see the module docstring) over the workload's one
    source, its subtasks placed as *placement* says; *available_now*: read what is available,
    then end with a final checkpoint (the bench's check of the output)."""

    def run(spark: Any, root: str, w: Workload) -> Started:
        pipeline = _pipeline(spark, root, w)
        output = os.path.join(root, "out")
        started = pipeline.start(
            dict(w.source),
            stages_job(w.parallelism),
            output=output,
            parallelism=w.parallelism,
            placement=placement,
            watermark=WatermarkStrategy.for_bounded_out_of_orderness(TIME, BOUND_MS),
            available_now=available_now,
        )
        return GraphStarted(started.query, lambda: stop_quietly(started), pipeline, output=output)

    return run


def _stage_rows(spark: Any, root: str, w: Workload) -> Any:
    """The workload's data rows (user, amount, event time) for Spark's two-stage lines, read
    by a ``ckpt-source`` that only names its source (no checkpoints)."""
    from pyspark.sql import functions as F

    from spark_ckpt.protocol.barrier import KIND

    reader = Pipeline(
        spark,
        f"{PIPELINE}-stages",
        config=CheckpointConfig(interval_ms=None),
        root=os.path.join(root, "pipeline"),
    )
    return reader.read(**w.source).where(F.col(KIND) == 0).select(KEY, "amount", TIME)


def _start_sums(
    by_window: Any, spark: Any, root: str, w: Workload, state_store: str, sink: str
) -> Started:
    """Spark's second stage, per-country sums of *by_window* (grouped by window and country),
    started into *sink* with its state on *state_store*."""
    from pyspark.sql import functions as F

    from runbench.time_variants import _write

    sums = by_window.agg(F.sum("amount").alias("sum_amount")).select(
        "country",
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "sum_amount",
    )
    conf = {
        PROVIDER: STATE_STORES[state_store],
        "spark.sql.shuffle.partitions": str(w.parallelism),
    }
    with session_conf(spark, conf):
        query = _write(sums, root, sink)
    out = os.path.join(root, "out") if sink == "parquet" else None  # _write's path
    return GraphStarted(query, query.stop, output=out, output_format=sink)


def spark_stages(state_store: str, sink: str) -> VariantStart:
    """Spark's two chained stateful operators, both its own JVM aggregations (see the module
    docstring), their state on the *state_store* provider (:data:`STATE_STORES`), into
    *sink*."""

    def run(spark: Any, root: str, w: Workload) -> Started:
        from pyspark.sql import functions as F

        rows = _stage_rows(spark, root, w)
        size = f"{two_stages.WINDOW_MS} milliseconds"
        users = (
            rows.withWatermark(TIME, f"{BOUND_MS} milliseconds")
            .groupBy(F.window(TIME, size), KEY)
            .agg(F.count("*").alias("count"), F.sum("amount").alias("amount"))
            .withColumn("country", F.col(KEY) % two_stages.COUNTRIES)
        )
        by_window = users.groupBy(F.window(F.window_time("window"), size), "country")
        return _start_sums(by_window, spark, root, w, state_store, sink)

    return run


def spark_pandas_stages(state_store: str, sink: str) -> VariantStart:
    """Spark's ``applyInPandasWithState`` (per-user running counts, one row per input row, as
    spark-ckpt's first stage) chained with its windowed aggregation (see the module docstring),
    their state on the *state_store* provider (:data:`STATE_STORES`), into *sink*."""

    def run(spark: Any, root: str, w: Workload) -> Started:
        from pyspark import cloudpickle
        from pyspark.sql import functions as F
        from pyspark.sql.streaming.state import GroupStateTimeout

        cloudpickle.register_pickle_by_value(two_stages)  # type: ignore[no-untyped-call]
        rows = _stage_rows(spark, root, w)
        users = rows.groupBy(KEY).applyInPandasWithState(
            two_stages.count_users,
            two_stages.USERS_DDL,
            two_stages.STATE_DDL,
            "append",
            GroupStateTimeout.NoTimeout,
        )
        by_window = users.withWatermark(TIME, f"{BOUND_MS} milliseconds").groupBy(
            F.window(TIME, f"{two_stages.WINDOW_MS} milliseconds"), "country"
        )
        return _start_sums(by_window, spark, root, w, state_store, sink)

    return run

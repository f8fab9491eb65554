"""The variant table: every way of running the keyed running count that the overhead and
scaling benches compare, each started as a Spark streaming query on the same generated input.

**Where the subtasks run** is :data:`PLACEMENTS`: ``"driver"`` (the micro-batch is
collected into this process and the pipelined aligner runs every subtask here) and
``"executors"`` (``placement="executors"``: Spark tasks on the executors, next to their
state). Both benches take every entry: the overhead bench measures ``<placement>/checkpoints``
against ``<placement>/off`` in the same interleaved run (:func:`overhead_variants`), and the
scaling bench runs ``spark-ckpt/<placement>`` next to ``spark-groupby``
(:func:`scaling_variants`).

:func:`spark_groupby` is Spark's own JVM stateful aggregation (``groupBy(key).count()`` with a
``checkpointLocation``: a state store committed every micro-batch) over the same
``ckpt-source`` input, its data rows only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from benchcommon import PIPELINE, stop_quietly

from spark_ckpt.coordination.requests import STOP
from spark_ckpt.pipeline.pipeline import Pipeline
from spark_ckpt.pipeline.pipeline_run import PipelineRun
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.operator import RunningCount

#: Spark's RocksDB state store with changelog checkpointing (what a large keyed state uses in
#: production; the default in-heap provider does not hold 10M keys in a 1 GB driver heap).
ROCKSDB_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


@dataclass(frozen=True)
class Workload:
    """What every variant reads and computes: the generator's ``ckpt-source`` options (the
    same input), the parallelism (subtasks / shuffle partitions), and whether checkpoints are
    taken (every ``interval_ms``) at all."""

    source: dict[str, object]
    parallelism: int
    interval_ms: int | None  # None: checkpointing off (spark-ckpt variants only)


@dataclass
class Started:
    """A started variant: its Spark query, how to stop it, and (spark-ckpt variants) its
    pipeline, whose completed checkpoints :meth:`poll_checkpoints` collects."""

    query: Any
    stop: Callable[[], None]
    pipeline: Pipeline | None = None
    completed: dict[int, CompletedCheckpoint] = field(default_factory=dict)

    def poll_checkpoints(self) -> None:
        """Collect the pipeline's completed checkpoints (retention keeps only the latest, so
        this is called while the query runs); the final checkpoint of a stop is left out."""
        if self.pipeline is None:
            return
        for c in self.pipeline.client.checkpoints():
            if STOP not in c.properties and not c.is_savepoint:
                self.completed.setdefault(c.checkpoint_id, c)

    def checkpoints_between(self, start_ms: float, end_ms: float) -> list[CompletedCheckpoint]:
        return [c for c in self.completed.values() if start_ms <= c.stats.trigger_ms < end_ms]


class StartPipeline(Protocol):
    """Starts one run of a pipeline (the keyed running count) and returns it."""

    def __call__(
        self, pipeline: Pipeline, source: dict[str, object], *, output: str, parallelism: int
    ) -> PipelineRun: ...


def start_pipeline(
    pipeline: Pipeline,
    source: dict[str, object],
    *,
    output: str,
    parallelism: int,
    placement: str = "driver",
) -> PipelineRun:
    """``Pipeline.start`` with the keyed running count, output to Delta through the
    two-phase sink, the subtasks placed as *placement* says: ``driver`` (the pipelined
    aligner in this process) or ``executors`` (Spark tasks next to their state)."""
    return pipeline.start(
        source,
        RunningCount("counter", "user_id"),
        output=output,
        parallelism=parallelism,
        placement=placement,
    )


#: Where spark-ckpt runs the subtasks: THE VARIANT TABLE's hook (see the module docstring).
PLACEMENTS: dict[str, StartPipeline] = {
    "driver": start_pipeline,
    "executors": partial(start_pipeline, placement="executors"),
}


def checkpoint_config(interval_ms: int | None) -> CheckpointConfig:
    """Exactly-once aligned checkpoints every *interval_ms* (2 retained), or none at all."""
    if interval_ms is None:
        return CheckpointConfig(interval_ms=None)
    return CheckpointConfig(interval_ms=interval_ms, retained_checkpoints=2)


def spark_ckpt_variant(placement: str) -> Callable[[Any, str, Workload], Started]:
    """A variant running the pipeline with its subtasks placed as *placement* says."""
    start = PLACEMENTS[placement]

    def run(spark: Any, root: str, w: Workload) -> Started:
        pipeline = Pipeline(
            spark,
            PIPELINE,
            config=checkpoint_config(w.interval_ms),
            root=os.path.join(root, "pipeline"),
        )
        run = start(pipeline, w.source, output=os.path.join(root, "out"), parallelism=w.parallelism)
        return Started(run.query, lambda: stop_quietly(run), pipeline)

    return run


def spark_groupby(spark: Any, root: str, w: Workload) -> Started:
    """Spark's JVM stateful ``groupBy("user_id").count()`` over the same ``ckpt-source``
    input (data rows only: ``_ckpt_kind == 0``), update mode into the ``noop`` sink, with a
    ``checkpointLocation``: offsets and the RocksDB state store (changelog checkpointing)
    committed every micro-batch, ``spark.sql.shuffle.partitions`` = the parallelism."""
    from pyspark.sql import functions as F

    from spark_ckpt.protocol.barrier import KIND

    for key, value in ROCKSDB_CONF.items():
        spark.conf.set(key, value)
    spark.conf.set("spark.sql.shuffle.partitions", str(w.parallelism))
    reader = Pipeline(
        spark,
        f"{PIPELINE}-jvm",
        config=CheckpointConfig(interval_ms=None),
        root=os.path.join(root, "pipeline"),
    )
    counts = reader.read(**w.source).where(F.col(KIND) == 0).groupBy("user_id").count()
    query = (
        counts.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", os.path.join(root, "spark"))
        .start()
    )

    def stop() -> None:
        query.stop()

    return Started(query, stop)


VariantStart = Callable[[Any, str, Workload], Started]


def overhead_variants() -> dict[str, tuple[VariantStart, bool]]:
    """The overhead bench's lines: per placement, checkpoints on and off. Name ->
    (start, checkpoints on)."""
    out: dict[str, tuple[VariantStart, bool]] = {}
    for placement in PLACEMENTS:
        out[f"{placement}/checkpoints"] = (spark_ckpt_variant(placement), True)
        out[f"{placement}/off"] = (spark_ckpt_variant(placement), False)
    return out


def scaling_variants() -> dict[str, VariantStart]:
    """The scaling bench's lines: spark-ckpt per placement, then Spark's own aggregation."""
    out: dict[str, VariantStart] = {f"spark-ckpt/{p}": spark_ckpt_variant(p) for p in PLACEMENTS}
    out["spark-groupby"] = spark_groupby
    return out

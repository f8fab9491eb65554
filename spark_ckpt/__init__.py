"""spark-ckpt: Flink-style checkpoints and savepoints for Spark Structured Streaming,
committed into Delta Lake tables.

The public API is what this module exports (``__all__``)::

    from spark_ckpt import CheckpointConfig, Pipeline, RunningCount, local_session

    spark = local_session()                     # or a notebook's `spark`, or connect_session()
    pipeline = Pipeline(spark, "orders", config=CheckpointConfig(interval_ms=1000))
    pipeline.run({"source": "generator", "channels": 4}, RunningCount("counter", "user_id"),
                 output="/lake/counts", duration_s=60)

Layers (``docs/architecture.md``; ``make lint`` checks who may import whom): the pure core —
:mod:`~spark_ckpt.protocol`, :mod:`~spark_ckpt.state`, :mod:`~spark_ckpt.storage`,
:mod:`~spark_ckpt.sinks`, :mod:`~spark_ckpt.sources`, :mod:`~spark_ckpt.runtime` — imports
neither ``pyspark`` nor ``deltalake``; :mod:`~spark_ckpt.delta` holds the Delta adapters,
:mod:`~spark_ckpt.spark` the Spark layer, :mod:`~spark_ckpt.testing` the testing aids.
Importing the package points ``PYSPARK_PYTHON`` at this interpreter when unset; it does not
import ``pyspark``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from spark_ckpt.spark.environment import ensure_pyspark_python

ensure_pyspark_python()

# The exports load on first use (PEP 562): Spark's Python workers import this package through
# the data sources, and most of them need a handful of modules, not the whole API.
_EXPORTS: dict[str, str] = {
    "Savepoint": "spark_ckpt.delta.savepoint",
    "dispose_savepoint": "spark_ckpt.delta.savepoint",
    "list_savepoints": "spark_ckpt.delta.savepoint",
    "CheckpointError": "spark_ckpt.errors",
    "CheckpointFailedError": "spark_ckpt.errors",
    "ConfigError": "spark_ckpt.errors",
    "CorruptCheckpointError": "spark_ckpt.errors",
    "DataLossError": "spark_ckpt.errors",
    "EnvironmentSetupError": "spark_ckpt.errors",
    "PipelineFailedError": "spark_ckpt.errors",
    "PipelineFencedError": "spark_ckpt.errors",
    "RestoreError": "spark_ckpt.errors",
    "SourceError": "spark_ckpt.errors",
    "SparkCkptError": "spark_ckpt.errors",
    "StateError": "spark_ckpt.errors",
    "StoreError": "spark_ckpt.errors",
    "SavepointWriter": "spark_ckpt.offline",
    "StateReader": "spark_ckpt.offline",
    "write_savepoint": "spark_ckpt.offline",
    "BARRIER_COLUMNS": "spark_ckpt.protocol.barrier",
    "SnapshotType": "spark_ckpt.protocol.barrier",
    "CheckpointStats": "spark_ckpt.protocol.checkpoint",
    "CompletedCheckpoint": "spark_ckpt.protocol.checkpoint",
    "Phase": "spark_ckpt.protocol.trace",
    "Tracer": "spark_ckpt.protocol.trace",
    "CheckpointConfig": "spark_ckpt.runtime.config",
    "CheckpointingMode": "spark_ckpt.runtime.config",
    "ExternalizedCheckpointRetention": "spark_ckpt.runtime.config",
    "minutes": "spark_ckpt.runtime.config",
    "seconds": "spark_ckpt.runtime.config",
    "KeyedOperator": "spark_ckpt.runtime.operator",
    "RecordOperator": "spark_ckpt.runtime.operator",
    "RunningCount": "spark_ckpt.runtime.operator",
    "RestartStrategies": "spark_ckpt.runtime.restart",
    "RestoreSettings": "spark_ckpt.runtime.restore_settings",
    "CheckpointSummary": "spark_ckpt.spark.client",
    "PipelineClient": "spark_ckpt.spark.client",
    "Pipeline": "spark_ckpt.spark.pipeline",
    "register_data_sources": "spark_ckpt.spark.pipeline",
    "PipelineRun": "spark_ckpt.spark.pipeline_run",
    "stop_query": "spark_ckpt.spark.pipeline_run",
    "connect_session": "spark_ckpt.spark.session",
    "local_session": "spark_ckpt.spark.session",
    "plot_checkpoint_stats": "spark_ckpt.spark.stats_plot",
    "RunResult": "spark_ckpt.spark.supervisor",
    "StopReason": "spark_ckpt.spark.supervisor",
    "ListStateDescriptor": "spark_ckpt.state.descriptor",
    "MapStateDescriptor": "spark_ckpt.state.descriptor",
    "ValueStateDescriptor": "spark_ckpt.state.descriptor",
    "StateHandle": "spark_ckpt.state.handle",
}

if TYPE_CHECKING:  # the same names, for type checkers and IDEs
    from spark_ckpt.delta.savepoint import Savepoint, dispose_savepoint, list_savepoints
    from spark_ckpt.errors import (
        CheckpointError,
        CheckpointFailedError,
        ConfigError,
        CorruptCheckpointError,
        DataLossError,
        EnvironmentSetupError,
        PipelineFailedError,
        PipelineFencedError,
        RestoreError,
        SourceError,
        SparkCkptError,
        StateError,
        StoreError,
    )
    from spark_ckpt.offline import SavepointWriter, StateReader, write_savepoint
    from spark_ckpt.protocol.barrier import BARRIER_COLUMNS, SnapshotType
    from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
    from spark_ckpt.protocol.trace import Phase, Tracer
    from spark_ckpt.runtime.config import (
        CheckpointConfig,
        CheckpointingMode,
        ExternalizedCheckpointRetention,
        minutes,
        seconds,
    )
    from spark_ckpt.runtime.operator import KeyedOperator, RecordOperator, RunningCount
    from spark_ckpt.runtime.restart import RestartStrategies
    from spark_ckpt.runtime.restore_settings import RestoreSettings
    from spark_ckpt.spark.client import CheckpointSummary, PipelineClient
    from spark_ckpt.spark.pipeline import Pipeline, register_data_sources
    from spark_ckpt.spark.pipeline_run import PipelineRun, stop_query
    from spark_ckpt.spark.session import connect_session, local_session
    from spark_ckpt.spark.stats_plot import plot_checkpoint_stats
    from spark_ckpt.spark.supervisor import RunResult, StopReason
    from spark_ckpt.state.descriptor import (
        ListStateDescriptor,
        MapStateDescriptor,
        ValueStateDescriptor,
    )
    from spark_ckpt.state.handle import StateHandle


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__version__ = "0.1.0"

__all__ = [
    "BARRIER_COLUMNS",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointFailedError",
    "CheckpointStats",
    "CheckpointSummary",
    "CheckpointingMode",
    "CompletedCheckpoint",
    "ConfigError",
    "CorruptCheckpointError",
    "DataLossError",
    "EnvironmentSetupError",
    "ExternalizedCheckpointRetention",
    "KeyedOperator",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "Phase",
    "Pipeline",
    "PipelineClient",
    "PipelineFailedError",
    "PipelineFencedError",
    "PipelineRun",
    "RecordOperator",
    "RestartStrategies",
    "RestoreError",
    "RestoreSettings",
    "RunResult",
    "RunningCount",
    "Savepoint",
    "SavepointWriter",
    "SnapshotType",
    "SourceError",
    "SparkCkptError",
    "StateError",
    "StateHandle",
    "StateReader",
    "StopReason",
    "StoreError",
    "Tracer",
    "ValueStateDescriptor",
    "__version__",
    "connect_session",
    "dispose_savepoint",
    "list_savepoints",
    "local_session",
    "minutes",
    "plot_checkpoint_stats",
    "register_data_sources",
    "seconds",
    "stop_query",
    "write_savepoint",
]

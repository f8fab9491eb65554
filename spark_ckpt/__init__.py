"""spark-ckpt: Flink-style checkpoints and savepoints for Spark Structured Streaming,
committed into Delta Lake tables.

The public API is what this module exports (``__all__``)::

    from spark_ckpt import CheckpointConfig, Pipeline, RunningCount, local_session

    spark = local_session()                     # or a notebook's `spark`, or connect_session()
    pipeline = Pipeline(spark, "orders", config=CheckpointConfig(interval_ms=1000))
    pipeline.run({"source": "generator", "channels": 4}, RunningCount("counter", "user_id"),
                 output="/lake/counts", duration_s=60)

Errors are in :mod:`spark_ckpt.errors` (their root, :class:`SparkCkptError`, is exported here
too). The layers and what may import what: ``docs/architecture.md``. Importing the package
imports nothing but this module: the exports load on first use (PEP 562), so Spark's Python
workers, which import the package through the data sources, load only what they use.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING

__version__ = "0.2.0"

#: The public names and the modules that define them: the one list ``__all__`` and the lazy
#: loading below are made from (``tests/test_public_api.py`` checks the ``TYPE_CHECKING``
#: block against it).
_EXPORTS: dict[str, str] = {
    "LookupJoin": "spark_ckpt.delta.lookup_join",
    "Savepoint": "spark_ckpt.delta.savepoint",
    "list_savepoints": "spark_ckpt.delta.savepoint",
    "SparkCkptError": "spark_ckpt.errors",
    "StorageOptions": "spark_ckpt.locations.credentials",
    "SavepointWriter": "spark_ckpt.offline",
    "StateReader": "spark_ckpt.offline",
    "Pipeline": "spark_ckpt.pipeline.pipeline",
    "register_data_sources": "spark_ckpt.pipeline.pipeline",
    "PipelineRun": "spark_ckpt.pipeline.pipeline_run",
    "stop_query": "spark_ckpt.pipeline.pipeline_run",
    "RunResult": "spark_ckpt.pipeline.supervisor",
    "PipelineClient": "spark_ckpt.client.pipeline_client",
    "BARRIER_COLUMNS": "spark_ckpt.protocol.barrier",
    "CheckpointConfig": "spark_ckpt.runtime.config",
    "CheckpointingMode": "spark_ckpt.runtime.config",
    "minutes": "spark_ckpt.runtime.config",
    "seconds": "spark_ckpt.runtime.config",
    "KeyedCoOperator": "spark_ckpt.runtime.co_operator",
    "RecordCoOperator": "spark_ckpt.runtime.co_operator",
    "IntervalJoin": "spark_ckpt.runtime.joins",
    "JoinType": "spark_ckpt.runtime.joins",
    "KeyedOperator": "spark_ckpt.runtime.operator",
    "RecordOperator": "spark_ckpt.runtime.operator",
    "RunningCount": "spark_ckpt.runtime.operator",
    "RestartStrategies": "spark_ckpt.runtime.restart",
    "RestoreSettings": "spark_ckpt.runtime.restore_settings",
    "Stage": "spark_ckpt.runtime.stage",
    "WatermarkStrategy": "spark_ckpt.runtime.event_time",
    "Accumulator": "spark_ckpt.runtime.windows",
    "Agg": "spark_ckpt.runtime.windows",
    "WindowAggregate": "spark_ckpt.runtime.windows",
    "Windows": "spark_ckpt.runtime.windows",
    "connect_session": "spark_ckpt.spark.session.builders",
    "local_session": "spark_ckpt.spark.session.builders",
    "StateContext": "spark_ckpt.state.context",
    "ListStateDescriptor": "spark_ckpt.state.descriptor",
    "MapStateDescriptor": "spark_ckpt.state.descriptor",
    "ValueStateDescriptor": "spark_ckpt.state.descriptor",
    "StateTtlConfig": "spark_ckpt.state.descriptor",
}

#: Names this package exported before 0.2 that now live elsewhere (or were renamed): they
#: still import from here, with a ``DeprecationWarning`` naming where to import them from.
_DEPRECATED: dict[str, str] = {
    "StateHandle": "spark_ckpt.state.context:StateContext",
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
    "StateError": "spark_ckpt.errors",
    "StoreError": "spark_ckpt.errors",
    "dispose_savepoint": "spark_ckpt.delta.savepoint",
    "write_savepoint": "spark_ckpt.offline",
    "SnapshotType": "spark_ckpt.protocol.barrier",
    "CheckpointStats": "spark_ckpt.protocol.checkpoint",
    "CompletedCheckpoint": "spark_ckpt.protocol.checkpoint",
    "Phase": "spark_ckpt.protocol.trace",
    "Tracer": "spark_ckpt.protocol.trace",
    "ExternalizedCheckpointRetention": "spark_ckpt.runtime.config",
    "CheckpointSummary": "spark_ckpt.client.pipeline_client",
    "plot_checkpoint_stats": "spark_ckpt.client.stats_plot",
    "StopReason": "spark_ckpt.pipeline.supervisor",
}

if TYPE_CHECKING:  # the same names, for type checkers and IDEs
    from spark_ckpt.client.pipeline_client import PipelineClient
    from spark_ckpt.delta.lookup_join import LookupJoin
    from spark_ckpt.delta.savepoint import Savepoint, list_savepoints
    from spark_ckpt.errors import SparkCkptError
    from spark_ckpt.locations.credentials import StorageOptions
    from spark_ckpt.offline import SavepointWriter, StateReader
    from spark_ckpt.pipeline.pipeline import Pipeline, register_data_sources
    from spark_ckpt.pipeline.pipeline_run import PipelineRun, stop_query
    from spark_ckpt.pipeline.supervisor import RunResult
    from spark_ckpt.protocol.barrier import BARRIER_COLUMNS
    from spark_ckpt.runtime.co_operator import KeyedCoOperator, RecordCoOperator
    from spark_ckpt.runtime.config import CheckpointConfig, CheckpointingMode, minutes, seconds
    from spark_ckpt.runtime.event_time import WatermarkStrategy
    from spark_ckpt.runtime.joins import IntervalJoin, JoinType
    from spark_ckpt.runtime.operator import KeyedOperator, RecordOperator, RunningCount
    from spark_ckpt.runtime.restart import RestartStrategies
    from spark_ckpt.runtime.restore_settings import RestoreSettings
    from spark_ckpt.runtime.stage import Stage
    from spark_ckpt.runtime.windows import Accumulator, Agg, WindowAggregate, Windows
    from spark_ckpt.spark.session.builders import connect_session, local_session
    from spark_ckpt.state.context import StateContext
    from spark_ckpt.state.descriptor import (
        ListStateDescriptor,
        MapStateDescriptor,
        StateTtlConfig,
        ValueStateDescriptor,
    )


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # once: later lookups do not come here
        return value
    moved = _DEPRECATED.get(name)
    if moved is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, new = moved.partition(":")
    warnings.warn(
        f"spark_ckpt.{name} is deprecated: use {module}.{new or name}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), new or name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = sorted([*_EXPORTS, "__version__"])

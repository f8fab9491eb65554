"""The executor path's query: the subtasks' grouped stateful operators over the routed
``ckpt-source`` DataFrame, one per stage (:mod:`spark_ckpt.spark.executors.subtask_function`,
:mod:`spark_ckpt.spark.executors.stage_processor`). Built in the driver."""

from __future__ import annotations

from typing import Any

from spark_ckpt.errors import ProtocolError
from spark_ckpt.spark.executors.executor_cache import FENCE_SCHEMA
from spark_ckpt.spark.executors.routing import GROUP, ROUTED_DDL, ROUTED_SCHEMA
from spark_ckpt.spark.executors.stage_processor import StageProcessor
from spark_ckpt.spark.executors.subtask_function import REPORT_SCHEMA, SubtaskFunction


def subtask_query(df: Any, function: SubtaskFunction) -> Any:
    """The streaming DataFrame of the executor path over the routed ``ckpt-source``
    DataFrame *df* (:mod:`spark_ckpt.spark.executors.routing`; see the module docstring); start it
    with ``writeStream.format("noop")`` in :func:`output_mode`. A job of several stages
    (:mod:`spark_ckpt.runtime.stage`) chains one grouped stateful operator per stage: the
    first stage's ``applyInPandasWithState``, then a ``transformWithStateInPandas`` per later
    stage (:mod:`spark_ckpt.spark.executors.stage_processor`), each grouped by its subtasks'
    group keys; what a stage's subtasks forward reaches the next stage's through Spark's
    shuffle, as the source's rows reach the first's."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    if df.columns != ROUTED_SCHEMA.names:
        raise ProtocolError(
            f"the executor path reads a routed ckpt-source {ROUTED_SCHEMA.names}, got {df.columns}"
        )
    later = len(function.spec.stages)
    if not later:
        return df.groupBy(GROUP).applyInPandasWithState(
            function, REPORT_SCHEMA, FENCE_SCHEMA, "update", GroupStateTimeout.NoTimeout
        )
    query = df.groupBy(GROUP).applyInPandasWithState(
        function, ROUTED_DDL, FENCE_SCHEMA, "append", GroupStateTimeout.NoTimeout
    )
    for position in range(1, later + 1):
        stage = SubtaskFunction(function.spec, position)
        schema = REPORT_SCHEMA if position == later else ROUTED_DDL
        query = query.groupBy(GROUP).transformWithStateInPandas(
            StageProcessor(stage), schema, "append", "None"
        )
    return query


def output_mode(function: SubtaskFunction) -> str:
    """The output mode of the executor path's query: ``update`` for one stage, ``append``
    for several (Spark chains stateful operators in append mode only)."""
    return "append" if function.spec.stages else "update"

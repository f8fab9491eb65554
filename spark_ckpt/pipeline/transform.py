"""Spark SQL before the keyed operators: a transformation of the source DataFrame that keeps
every barrier row intact and in order.

Kafka delivers binary ``key`` and ``value``, files deliver raw columns: a Spark user parses
and filters them with the DataFrame API before the keyed stage. ``Pipeline.run(...,
transform=f)`` calls ``f`` with a :class:`BarrierSafeFrame`, a DataFrame that offers the
row-wise operations — ``select``, ``selectExpr``, ``where``/``filter``, ``withColumn(s)``,
``withColumnRenamed``, ``drop``, ``fillna``, column access — and keeps the barrier rows
through them:

* ``where``/``filter``: a barrier row passes whatever the predicate says (it is null on
  barrier rows, whose user columns are null): the predicate ``p`` becomes
  ``p OR _ckpt_kind <> 0``;
* ``select``/``selectExpr``: the barrier columns are kept, after the selected ones;
* the barrier columns cannot be replaced, renamed or dropped.

Every other operation (an aggregation, a join, a repartition, a sort, a limit, dropping
rows with nulls, ...) moves or drops rows, so it cannot keep a channel's barriers in their
place: it raises :class:`~spark_ckpt.errors.ConfigError` naming it. The operations are narrow
(no shuffle), so each of the source's partitions — one channel of one micro-batch — stays one
partition, in order; on the executor path the transformed rows are then routed to the
subtasks (:class:`RouteBatches`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.barrier import BARRIER_COLUMNS, KIND, RecordKind
from spark_ckpt.spark.executors.routing import Router

#: The user's transformation of the source DataFrame.
Transform = Callable[[Any], Any]

_ROW_WISE = frozenset(
    {
        "select",
        "selectExpr",
        "where",
        "filter",
        "withColumn",
        "withColumns",
        "withColumnRenamed",
        "withColumnsRenamed",
        "drop",
        "fillna",
    }
)
#: What the frame answers as a DataFrame does (no rows moved).
_READ_ONLY = frozenset({"columns", "schema", "dtypes", "printSchema", "isStreaming"})


class BarrierSafeFrame:
    """A DataFrame whose operations keep the barrier rows (see the module docstring)."""

    def __init__(self, frame: Any) -> None:
        self._frame = frame

    @property
    def frame(self) -> Any:
        """The underlying Spark DataFrame."""
        return self._frame

    def __getattr__(self, name: str) -> Any:
        if name in _READ_ONLY:
            return getattr(self._frame, name)
        if name in self._frame.columns:
            return self._frame[name]
        raise ConfigError(
            "transform",
            f"DataFrame.{name}",
            "row-wise operations that keep the barrier rows in place: "
            f"{', '.join(sorted(_ROW_WISE))} (an aggregation, a join, a repartition, a sort, "
            "a limit or dropping rows would move or drop a channel's barriers)",
        )

    def __getitem__(self, item: Any) -> Any:
        return self._frame[item]

    # -- the row-wise operations ------------------------------------------------------------
    def where(self, condition: Any) -> BarrierSafeFrame:
        from pyspark.sql import functions as F

        predicate = F.expr(condition) if isinstance(condition, str) else condition
        keep = F.col(KIND) != F.lit(RecordKind.DATA.code)
        return BarrierSafeFrame(self._frame.where(predicate | keep))

    filter = where

    def select(self, *columns: Any) -> BarrierSafeFrame:
        if any(isinstance(c, str) and c == "*" for c in columns):
            return BarrierSafeFrame(self._frame.select(*columns))
        chosen = self._frame.select(*columns).columns
        return BarrierSafeFrame(self._frame.select(*columns, *_missing(chosen)))

    def selectExpr(self, *expressions: str) -> BarrierSafeFrame:
        if "*" in (e.strip() for e in expressions):
            return BarrierSafeFrame(self._frame.selectExpr(*expressions))
        chosen = self._frame.selectExpr(*expressions).columns
        return BarrierSafeFrame(self._frame.selectExpr(*expressions, *_missing(chosen)))

    def withColumn(self, name: str, column: Any) -> BarrierSafeFrame:
        _check_user_column(name, "withColumn")
        return BarrierSafeFrame(self._frame.withColumn(name, column))

    def withColumns(self, columns: dict[str, Any]) -> BarrierSafeFrame:
        for name in columns:
            _check_user_column(name, "withColumns")
        return BarrierSafeFrame(self._frame.withColumns(columns))

    def withColumnRenamed(self, existing: str, new: str) -> BarrierSafeFrame:
        _check_user_column(existing, "withColumnRenamed")
        _check_user_column(new, "withColumnRenamed")
        return BarrierSafeFrame(self._frame.withColumnRenamed(existing, new))

    def withColumnsRenamed(self, renames: dict[str, str]) -> BarrierSafeFrame:
        for existing, new in renames.items():
            _check_user_column(existing, "withColumnsRenamed")
            _check_user_column(new, "withColumnsRenamed")
        return BarrierSafeFrame(self._frame.withColumnsRenamed(renames))

    def drop(self, *columns: Any) -> BarrierSafeFrame:
        for c in columns:
            if isinstance(c, str):
                _check_user_column(c, "drop")
        return BarrierSafeFrame(self._frame.drop(*columns))

    def fillna(self, value: Any, subset: Any = None) -> BarrierSafeFrame:
        return BarrierSafeFrame(self._frame.fillna(value, subset))


def _missing(columns: list[str]) -> list[str]:
    return [c for c in BARRIER_COLUMNS if c not in columns]


def _check_user_column(name: str, operation: str) -> None:
    if name in BARRIER_COLUMNS:
        raise ConfigError(
            "transform", f"DataFrame.{operation}({name!r})", "no change to the barrier columns"
        )


def apply_transform(transform: Transform, frame: Any, key_column: str) -> Any:
    """The DataFrame *transform* makes of the source DataFrame *frame*, checked: built with
    the row-wise operations only, with every barrier column and the operators' key column.
    Raises :class:`ConfigError`."""
    result = transform(BarrierSafeFrame(frame))
    if not isinstance(result, BarrierSafeFrame):
        raise ConfigError(
            "transform",
            type(result).__name__,
            "the DataFrame it was given, transformed by its own operations (it keeps the "
            "barrier rows in place)",
        )
    columns = result.frame.columns
    lost = _missing(columns)
    if lost:
        raise ConfigError("transform", columns, f"the barrier columns {lost} kept")
    if key_column not in columns:
        raise ConfigError("transform", columns, f"the operators' key column {key_column!r}")
    return result.frame


@dataclass(frozen=True)
class RouteBatches:
    """``mapInArrow`` function of the executor path after a transformation: one source
    partition's transformed rows (a channel's rows of a micro-batch, in order) routed to the
    subtasks (:meth:`Router.route`). Picklable."""

    router: Router

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = list(batches)
        if received:
            table = pa.Table.from_batches(received)
            if table.num_rows:
                yield self.router.route(table)

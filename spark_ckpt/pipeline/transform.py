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

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.barrier import BARRIER_COLUMNS, CHANNEL, KIND, RecordKind
from spark_ckpt.sources.inputs import INPUT_KEY, INPUT_TIME, Inputs
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
    """A DataFrame whose operations keep the barrier rows (see the module docstring). *kept*:
    the columns its operations keep and may not change (the barrier columns; for one input of
    several, also the other inputs' columns); *passthrough*: the rows every filter lets pass
    (default: the barrier rows)."""

    def __init__(
        self, frame: Any, kept: tuple[str, ...] = BARRIER_COLUMNS, passthrough: Any = None
    ) -> None:
        self._frame = frame
        self._kept = kept
        self._passthrough = passthrough

    def _same(self, frame: Any) -> BarrierSafeFrame:
        return BarrierSafeFrame(frame, self._kept, self._passthrough)

    def _check(self, name: str, operation: str) -> None:
        if name in self._kept:
            raise ConfigError(
                "transform",
                f"DataFrame.{operation}({name!r})",
                "no change to the barrier columns (nor, for one input of several, to the "
                "other inputs' columns)",
            )

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
        keep = self._passthrough
        if keep is None:
            keep = F.col(KIND) != F.lit(RecordKind.DATA.code)
        return self._same(self._frame.where(predicate | keep))

    filter = where

    def select(self, *columns: Any) -> BarrierSafeFrame:
        if any(isinstance(c, str) and c == "*" for c in columns):
            return self._same(self._frame.select(*columns))
        chosen = self._frame.select(*columns).columns
        return self._same(self._frame.select(*columns, *_missing(chosen, self._kept)))

    def selectExpr(self, *expressions: str) -> BarrierSafeFrame:
        if "*" in (e.strip() for e in expressions):
            return self._same(self._frame.selectExpr(*expressions))
        chosen = self._frame.selectExpr(*expressions).columns
        return self._same(self._frame.selectExpr(*expressions, *_missing(chosen, self._kept)))

    def withColumn(self, name: str, column: Any) -> BarrierSafeFrame:
        self._check(name, "withColumn")
        return self._same(self._frame.withColumn(name, column))

    def withColumns(self, columns: dict[str, Any]) -> BarrierSafeFrame:
        for name in columns:
            self._check(name, "withColumns")
        return self._same(self._frame.withColumns(columns))

    def withColumnRenamed(self, existing: str, new: str) -> BarrierSafeFrame:
        self._check(existing, "withColumnRenamed")
        self._check(new, "withColumnRenamed")
        return self._same(self._frame.withColumnRenamed(existing, new))

    def withColumnsRenamed(self, renames: dict[str, str]) -> BarrierSafeFrame:
        for existing, new in renames.items():
            self._check(existing, "withColumnsRenamed")
            self._check(new, "withColumnsRenamed")
        return self._same(self._frame.withColumnsRenamed(renames))

    def drop(self, *columns: Any) -> BarrierSafeFrame:
        for c in columns:
            if isinstance(c, str):
                self._check(c, "drop")
        return self._same(self._frame.drop(*columns))

    def fillna(self, value: Any, subset: Any = None) -> BarrierSafeFrame:
        return self._same(self._frame.fillna(value, subset))


def _missing(columns: list[str], kept: tuple[str, ...] = BARRIER_COLUMNS) -> list[str]:
    return [c for c in kept if c not in columns]


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


def _transformed(transform: Transform, frame: BarrierSafeFrame) -> Any:
    """*transform*'s DataFrame of *frame*, checked: made by the frame's own operations and
    keeping its kept columns."""
    result = transform(frame)
    if not isinstance(result, BarrierSafeFrame):
        raise ConfigError(
            "transform",
            type(result).__name__,
            "the DataFrame it was given, transformed by its own operations (it keeps the "
            "barrier rows in place)",
        )
    lost = _missing(result.frame.columns, frame._kept)
    if lost:
        raise ConfigError("transform", result.frame.columns, f"the columns {lost} kept")
    return result.frame


def apply_input_transforms(
    transforms: Mapping[str, Transform],
    frame: Any,
    inputs: Inputs,
    keys: Mapping[str, str | None],
    times: Mapping[str, str | None],
) -> Any:
    """The union form *frame* (:mod:`spark_ckpt.sources.inputs`) with each input's rows
    transformed by its function of *transforms*: the function receives a DataFrame of the
    input's own columns (flattened from its struct; the other inputs' columns and the barrier
    columns kept, their rows passing every filter), and its result goes back into the input's
    struct, the union form's key and event time taken from the input's *keys* and *times*
    columns as the transform left them. Row-wise, as :func:`apply_transform`. Raises
    :class:`ConfigError`."""
    from pyspark.sql import functions as F

    for spec in inputs.inputs:
        transform = transforms.get(spec.name)
        if transform is None:
            continue
        channels = inputs.ranges[spec.name]
        mine = F.col(CHANNEL).between(channels.start, channels.stop - 1)
        data = F.col(KIND) == F.lit(RecordKind.DATA.code)
        others = tuple(c for c in frame.columns if c != spec.name)
        flat = frame.select(F.col(f"`{spec.name}`.*"), *others)
        clash = sorted({c for c in flat.columns if flat.columns.count(c) > 1})
        if clash:
            raise ConfigError(
                f"transform[{spec.name!r}]",
                clash,
                "input columns named otherwise than the inputs and the union form's columns",
            )
        safe = BarrierSafeFrame(flat, others, ~(data & mine))
        out = _transformed(transform, safe)
        own = [c for c in out.columns if c not in others]
        wanted = {"key": keys.get(spec.name), "event time": times.get(spec.name)}
        for what, column in wanted.items():
            if column is not None and column not in own:
                raise ConfigError(
                    f"transform[{spec.name!r}]", own, f"the input's {what} column {column!r}"
                )
        derived: dict[str, Any] = {}
        for column, source in ((INPUT_KEY, wanted["key"]), (INPUT_TIME, wanted["event time"])):
            if source is None:
                continue
            value = F.col(f"`{source}`")
            if column == INPUT_TIME:
                value = value.cast("timestamp")
            derived[column] = F.when(mine, value)
            if column in frame.columns:
                derived[column] = derived[column].otherwise(F.col(column))
        struct = F.when(data & mine, F.struct(*[F.col(f"`{c}`") for c in own]))
        columns = [c for c in frame.columns if c not in BARRIER_COLUMNS]
        columns += [c for c in (INPUT_KEY, INPUT_TIME) if c in derived and c not in columns]
        frame = out.select(
            *[
                struct.alias(c)
                if c == spec.name
                else derived[c].alias(c)
                if c in derived
                else F.col(f"`{c}`")
                for c in columns
            ],
            *BARRIER_COLUMNS,
        )
    return frame


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

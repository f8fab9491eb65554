"""Delta file statistics (the ``stats`` JSON of an add action: ``numRecords``,
``minValues``, ``maxValues``, ``nullCount``), accumulated over the tables written into one
file. Best effort, used by Spark's data skipping: a column without min/max is simply never
skipped, so bounds are given only when they are safe (they contain every value)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: Spark truncates string statistics to this many characters; longer maxima are omitted.
_STRING_STATS_PREFIX = 32

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _iso_millis(micros: int) -> str:
    return (_EPOCH + timedelta(milliseconds=micros // 1000)).strftime("%Y-%m-%dT%H:%M:%S.%f")[
        :-3
    ] + "Z"


def _raw_bounds(column: pa.ChunkedArray) -> tuple[Any, Any] | None:
    """``(min, max)`` of a primitive column with at least one non-null value, as Python
    values (timestamps as integers of their unit), or ``None`` when the column can have no
    statistics (a type without them, or a float column with NaN)."""
    t = column.type
    if not (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_date32(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
    ):
        return None
    if pa.types.is_floating(t) and pc.any(pc.is_nan(column)).as_py():
        return None
    mm = pc.min_max(column.cast(pa.int64()) if pa.types.is_timestamp(t) else column)
    return mm["min"].as_py(), mm["max"].as_py()


def _json_bounds(t: pa.DataType, lo: Any, hi: Any) -> tuple[Any, Any] | None:
    """JSON-ready statistics from raw bounds, or ``None`` when none can be given safely.
    Timestamps (microseconds) are milliseconds in Delta: min rounded down, max up, so the
    range always contains every value; strings longer than Spark's 32-character prefix have
    no max (minima are cut to it); non-finite float bounds give none."""
    if pa.types.is_timestamp(t):
        return _iso_millis(lo), _iso_millis(-(-hi // 1000) * 1000)
    if pa.types.is_date32(t):
        return lo.isoformat(), hi.isoformat()
    if pa.types.is_floating(t) and not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    if isinstance(lo, str):
        # A prefix is <= the value (a safe min); a truncated max would not be safe.
        if len(hi) > _STRING_STATS_PREFIX:
            return None
        return lo[:_STRING_STATS_PREFIX], hi
    return lo, hi


class DeltaStats:
    """Delta file statistics accumulated over the tables written into one file: row count,
    null counts of top-level columns and min/max of primitive ones (best effort, used by
    Spark's data skipping; a column without min/max is simply never skipped). Bounds are
    accumulated as raw values (the min of the tables' mins, the max of their maxes) and
    formatted once (:func:`_json_bounds`); a column loses them for good once one table has
    non-null values but no safe bounds (:func:`_raw_bounds`)."""

    def __init__(self) -> None:
        self.rows = 0
        self._types: dict[str, pa.DataType] = {}
        self._nulls: dict[str, int] = {}
        self._bounds: dict[str, tuple[Any, Any]] = {}
        self._unsafe: set[str] = set()

    def add(self, table: pa.Table) -> DeltaStats:
        self.rows += table.num_rows
        for name, column in zip(table.column_names, table.columns, strict=True):
            if pa.types.is_nested(column.type):
                continue
            self._types.setdefault(name, column.type)
            self._nulls[name] = self._nulls.get(name, 0) + column.null_count
            if name in self._unsafe or column.null_count == len(column):
                continue
            raw = _raw_bounds(column)
            old = self._bounds.get(name)
            if raw is None:
                self._unsafe.add(name)
                self._bounds.pop(name, None)
            else:
                self._bounds[name] = (
                    raw if old is None else (min(old[0], raw[0]), max(old[1], raw[1]))
                )
        return self

    def to_json(self) -> str:
        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        for name, (lo, hi) in self._bounds.items():
            bounds = _json_bounds(self._types[name], lo, hi)
            if bounds is not None:
                mins[name], maxs[name] = bounds
        return json.dumps(
            {
                "numRecords": self.rows,
                "minValues": mins,
                "maxValues": maxs,
                "nullCount": self._nulls,
            },
            separators=(",", ":"),
        )


def delta_stats(table: pa.Table) -> str:
    """Delta file statistics (the ``stats`` JSON of an add action) of *table*."""
    return DeltaStats().add(table).to_json()

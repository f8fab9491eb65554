"""Aggregates of a window, vectorized and mergeable (Flink's ``AggregateFunction``: an
accumulator, added to, merged, turned into a result).

An :class:`Aggregate` is one or more :class:`Accumulator` columns and a result. An
accumulator takes one input array per batch (a column of the rows, or an array computed from
them), reduces it per window with a pyarrow hash aggregation (*partial*: ``"sum"``,
``"min"``, ``"max"``, ``"count"``, ...), and merges its values across batches with another
(*merge*: ``"sum"`` for counts and sums, ``"min"``, ``"max"``). So a batch costs pyarrow
kernels, never a Python call per row. The built-ins (:class:`Agg`): ``count``, ``sum``,
``min``, ``max``, ``mean``; :meth:`Agg.of` builds a user's own, for example a variance:

.. code-block:: python

    Agg.of(
        "variance",
        [
            Accumulator("n", "x", "count", "sum"),
            Accumulator("s", "x", "sum", "sum"),
            Accumulator("q", lambda rows: pc.multiply(rows["x"], rows["x"]), "sum", "sum"),
        ],
        lambda a: pc.subtract(pc.divide(a["q"], a["n"]), pc.power(pc.divide(a["s"], a["n"]), 2)),
    )
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ConfigError

#: An accumulator's input: a column of the rows, a function of the rows (an array), or None
#: (the rows themselves: for counting them).
Input = str | Callable[[pa.Table], pa.Array] | None
#: A result from the accumulator arrays, by accumulator name.
Result = Callable[[Mapping[str, pa.Array]], pa.Array]

#: The pyarrow hash aggregations an accumulator may use.
PARTIALS = frozenset({"sum", "min", "max", "count", "count_all", "product", "any", "all"})
MERGES = frozenset({"sum", "min", "max", "product", "any", "all"})


@dataclass(frozen=True)
class Accumulator:
    """One accumulator column of an aggregate (see the module docstring)."""

    name: str
    input: Input
    partial: str
    merge: str

    def __post_init__(self) -> None:
        if self.partial not in PARTIALS:
            raise ConfigError("partial", self.partial, f"one of {sorted(PARTIALS)}")
        if self.merge not in MERGES:
            raise ConfigError("merge", self.merge, f"one of {sorted(MERGES)}")

    def values(self, rows: pa.Table) -> pa.Array | pa.ChunkedArray:
        """The input array of a batch of *rows*."""
        if self.input is None:
            return pa.nulls(rows.num_rows, pa.bool_()).fill_null(True)
        if isinstance(self.input, str):
            if self.input not in rows.column_names:
                raise ConfigError("aggregate", self.input, f"a column of {rows.column_names}")
            return rows.column(self.input)
        return self.input(rows)


@dataclass(frozen=True)
class Aggregate:
    """An output column *name*: its accumulators and the result computed from them."""

    name: str
    accumulators: tuple[Accumulator, ...]
    result: Result

    def column(self, accumulator: Accumulator) -> str:
        """The state column of *accumulator* of this aggregate."""
        return f"{self.name}.{accumulator.name}"


def _first(name: str) -> Result:
    return lambda accumulators: accumulators[name]


def _mean(accumulators: Mapping[str, pa.Array]) -> pa.Array:
    return pc.divide(pc.cast(accumulators["sum"], pa.float64()), accumulators["count"])


class Agg:
    """The built-in aggregates, and :meth:`of` for a user's own."""

    @staticmethod
    def count(name: str = "count") -> Aggregate:
        """The window's rows."""
        return Aggregate(name, (Accumulator("count", None, "count", "sum"),), _first("count"))

    @staticmethod
    def sum(column: str, name: str | None = None) -> Aggregate:
        """The sum of *column* (null: no non-null value)."""
        return Aggregate(
            name or f"sum_{column}", (Accumulator("sum", column, "sum", "sum"),), _first("sum")
        )

    @staticmethod
    def min(column: str, name: str | None = None) -> Aggregate:
        return Aggregate(
            name or f"min_{column}", (Accumulator("min", column, "min", "min"),), _first("min")
        )

    @staticmethod
    def max(column: str, name: str | None = None) -> Aggregate:
        return Aggregate(
            name or f"max_{column}", (Accumulator("max", column, "max", "max"),), _first("max")
        )

    @staticmethod
    def mean(column: str, name: str | None = None) -> Aggregate:
        """The mean of the non-null values of *column* (a double)."""
        return Aggregate(
            name or f"mean_{column}",
            (
                Accumulator("sum", column, "sum", "sum"),
                Accumulator("count", column, "count", "sum"),
            ),
            _mean,
        )

    @staticmethod
    def of(name: str, accumulators: Sequence[Accumulator], result: Result) -> Aggregate:
        """A user's aggregate: its *accumulators* and the *result* (a vectorized function of
        the accumulator arrays, by accumulator name)."""
        names = [a.name for a in accumulators]
        if not accumulators or len(set(names)) != len(names):
            raise ConfigError("accumulators", names, "one or more, with distinct names")
        return Aggregate(name, tuple(accumulators), result)

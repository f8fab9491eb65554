"""Several inputs in one pipeline: how their rows travel together and come apart again.

A pipeline of several named inputs (``Pipeline.run(sources={"clicks": {...}, "impressions":
{...}})``) reads them through one ``ckpt-source``: its channels are the channels of every
input, one after the other in the inputs' order, so one source runner places every
checkpoint's barriers on all of them and one checkpoint records every input's positions
(:class:`~spark_ckpt.sources.inputs_source.InputsSource`). Its rows have one schema, the
*union form* (:meth:`Inputs.union_schema`):

* one struct column per input, named after it, holding that input's own columns; a row of
  input ``clicks`` has its values in ``clicks`` and a null in every other input's column;
* :data:`INPUT_KEY`: the row's key, taken from its input's key column (the column the
  operators are keyed by on that input), which routes the rows of every input to the subtask
  of its key group by one rule;
* :data:`INPUT_TIME` (with event time): the row's event time, from its input's event-time
  column, which fills the channels' progress and decides which rows are late by one rule
  while each input keeps its own bound (per channel, :class:`WatermarkStrategy.channels
  <spark_ckpt.runtime.event_time.WatermarkStrategy>`).

The barrier columns come after, as for one input. The task splits its records back into one
table per input (:meth:`Inputs.split`) for a two-input operator
(:class:`~spark_ckpt.runtime.co_operator.KeyedCoOperator`), or into one table of their
common columns for a one-input operator over inputs of one schema (:meth:`Inputs.merged`).

Pure: pyarrow only. Frozen and picklable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.barrier import CHECKPOINT_ID

#: The union form's key column and event-time column (see the module docstring).
INPUT_KEY: Final = "_input_key"
INPUT_TIME: Final = "_input_time"
#: The type of :data:`INPUT_TIME`.
TIME_TYPE: Final = pa.timestamp("us", tz="UTC")
_NAME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def check_input_name(name: object, option: str = "sources") -> str:
    """*name* if it can name an input or an output (a letter, then letters, digits and
    ``_``); :class:`ConfigError` naming *option* otherwise."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(
            option, name, "names of a letter then letters, digits or '_' (e.g. 'clicks')"
        )
    return name


#: The late-output table's column that names each row's input (several inputs).
LATE_INPUT: Final = "input"


@dataclass(frozen=True)
class InputSpec:
    """One input of a pipeline: its *name*, how many *channels* it has, the column of its rows
    that keys the operators (*key_column*; None: the pipeline has no keyed operators yet, the
    rows carry no key), and its event-time column (*time_column*; None: none). *transformed*:
    the input has a transform of its own, which makes its key and event-time columns: the
    source leaves the union form's key and event time of its rows null, and the transform
    fills them in (:func:`~spark_ckpt.pipeline.transform.apply_input_transforms`)."""

    name: str
    channels: int
    key_column: str | None = None
    time_column: str | None = None
    transformed: bool = False


@dataclass(frozen=True)
class Inputs:
    """The inputs of a pipeline, in channel order (see the module docstring)."""

    inputs: tuple[InputSpec, ...]

    def __post_init__(self) -> None:
        names = [i.name for i in self.inputs]
        if not names:
            raise ConfigError("sources", {}, "at least one input")
        for name in names:
            check_input_name(name)
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError("sources", names, f"distinct input names ({repeated[0]!r} twice)")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @property
    def channels(self) -> int:
        """Every input's channels."""
        return sum(i.channels for i in self.inputs)

    @cached_property
    def ranges(self) -> dict[str, range]:
        """Each input's channels (global numbers)."""
        out: dict[str, range] = {}
        start = 0
        for spec in self.inputs:
            out[spec.name] = range(start, start + spec.channels)
            start += spec.channels
        return out

    def input_of(self, channel: int) -> InputSpec:
        """The input channel *channel* (a global number) belongs to."""
        for spec in self.inputs:
            if channel in self.ranges[spec.name]:
                return spec
        raise ConfigError("channel", channel, f"a channel of the inputs (0..{self.channels - 1})")

    def local_channel(self, channel: int) -> tuple[InputSpec, int]:
        """The input of global channel *channel*, and the channel's number in that input."""
        spec = self.input_of(channel)
        return spec, channel - self.ranges[spec.name].start

    def spec(self, name: str) -> InputSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise ConfigError("input", name, f"one of the pipeline's inputs: {', '.join(self.names)}")

    # -- the union form --------------------------------------------------------------------
    def union_schema(
        self, schemas: Mapping[str, pa.Schema], key_type: pa.DataType | None
    ) -> pa.Schema:
        """The union form's user columns for inputs of *schemas* (their own columns): a
        nullable struct per input, then :data:`INPUT_KEY` of *key_type* (when the inputs are
        keyed) and :data:`INPUT_TIME` (when they keep event time). Every field is nullable."""
        fields = [
            pa.field(spec.name, pa.struct([f.with_nullable(True) for f in schemas[spec.name]]))
            for spec in self.inputs
        ]
        if key_type is not None:
            fields.append(pa.field(INPUT_KEY, key_type))
        if any(spec.time_column for spec in self.inputs):
            fields.append(pa.field(INPUT_TIME, TIME_TYPE))
        return pa.schema(fields)

    def wrap(self, name: str, rows: pa.Table, schema: pa.Schema) -> pa.Table:
        """Input *name*'s *rows* (its own columns) in the union form *schema*
        (:meth:`union_schema`): its struct, nulls in the others', its key and event time.
        O(rows), vectorized."""
        spec = self.spec(name)
        n = rows.num_rows
        columns: list[pa.Array] = []
        for f in schema:
            if f.name == name:
                children = [rows.column(c.name).combine_chunks().cast(c.type) for c in f.type]
                columns.append(pa.StructArray.from_arrays(children, fields=list(f.type)))
            elif f.name in (INPUT_KEY, INPUT_TIME) and spec.transformed:
                columns.append(pa.nulls(n, f.type))  # the input's transform fills them in
            elif f.name == INPUT_KEY:
                key = spec.key_column
                if key is None or key not in rows.column_names:
                    raise ConfigError(
                        "key", key, f"a column of input {name!r}: {rows.column_names}"
                    )
                columns.append(rows.column(key).combine_chunks().cast(f.type))
            elif f.name == INPUT_TIME:
                time = spec.time_column
                if time is None:
                    columns.append(pa.nulls(n, f.type))
                else:
                    columns.append(rows.column(time).combine_chunks().cast(f.type))
            else:
                columns.append(pa.nulls(n, f.type))
        return pa.Table.from_arrays(columns, schema=schema)

    def split(self, records: pa.Table) -> dict[str, pa.Table]:
        """The data rows of *records* (union form) per input that has any, each as a table
        of that input's own columns, in the records' order. O(rows), vectorized."""
        out: dict[str, pa.Table] = {}
        data = records
        if CHECKPOINT_ID in records.column_names:
            data = records.filter(pc.is_null(records.column(CHECKPOINT_ID)))
        for name in self.names:
            column = data.column(name)
            mine = pc.is_valid(column)
            if not pc.any(mine).as_py():
                continue
            out[name] = _flattened(column.filter(mine))
        return out

    def late_schema(self, union: pa.Schema) -> pa.Schema:
        """The late-output table's columns for rows of the union form *union*: ``input``, the
        name of the row's input, then each input's struct (the row's own columns in its
        input's, the others null)."""
        structs = [union.field(n) for n in self.names]
        return pa.schema([pa.field(LATE_INPUT, pa.string()), *structs])

    def late_rows(self, rows: pa.Table) -> pa.Table:
        """Rows of the union form dropped as late (their own columns, no barrier columns) as
        the late-output table holds them (:meth:`late_schema`). O(rows), vectorized."""
        which = pa.nulls(rows.num_rows, pa.string())
        for name in reversed(self.names):
            which = pc.if_else(pc.is_valid(rows.column(name)), pa.scalar(name), which)
        return pa.table(
            [which, *(rows.column(n) for n in self.names)], names=[LATE_INPUT, *self.names]
        )

    def merged(self, records: pa.Table) -> pa.Table:
        """The data rows of *records* (union form) of every input as one table of their own
        columns, input by input (one-input operators over inputs of one schema)."""
        tables = list(self.split(records).values())
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables, promote_options="default")


def _flattened(structs: pa.ChunkedArray | pa.Array) -> pa.Table:
    """A struct column as a table of its fields."""
    if isinstance(structs, pa.ChunkedArray):
        structs = structs.combine_chunks()
    return pa.Table.from_struct_array(structs)


def common_time(inputs: Inputs) -> str | None:
    """The event-time column every input names alike (None: they differ, or have none)."""
    columns = {spec.time_column for spec in inputs.inputs}
    return columns.pop() if len(columns) == 1 else None


def same_schemas(schemas: Sequence[pa.Schema]) -> bool:
    """Whether *schemas* have the same column names and types (nullability aside)."""
    first = [(f.name, f.type) for f in schemas[0]]
    return all([(f.name, f.type) for f in s] == first for s in schemas[1:])

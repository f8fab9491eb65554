"""The interval join of two keyed inputs on event time (Flink's ``intervalJoin``; Spark's
stream-stream join with a time-range condition).

``IntervalJoin("clicks", "impressions", key="ad_id", lower=-seconds(10), upper=0,
time=("click_ts", "impression_ts"))`` joins a left row ``l`` with every right row ``r`` of its
key with ``l.time + lower <= r.time <= l.time + upper`` (both bounds inclusive, as Flink's
``between``). ``how``:

* ``"inner"``: the pairs, as Flink;
* ``"left_outer"`` / ``"right_outer"``: the pairs, and each row of that side that no pair
  took, with nulls for the other side's columns, once the watermark rules out a match (Spark's
  stream-stream outer joins: an unmatched row is emitted late, when its buffer entry leaves
  the state).

**State.** Each side's rows wait in keyed value state (a list of its rows per key, with their
event time and whether a pair took them). A row leaves the state once the watermark passes
the last event time a row of the other side could still have to match it, plus the
pipeline's allowed lateness: a left row at ``t`` at ``t + max(upper, 0)``, a right row at
``t + max(-lower, 0)`` (Flink's cleanup times); an event-time timer per row takes it out.
The state is so bounded by the interval and the disorder, not by the input.

**Rows late beyond the allowed lateness** are dropped before the join (the task's rule,
:mod:`spark_ckpt.runtime.task`), as Flink drops late elements of an interval join and Spark
drops rows behind the watermark.

**Output.** The left input's columns, then the right input's except its key column; a right
column named as a left one is prefixed by the right input's name (``impressions_ts``). A
micro-batch's pairs come ordered by the left row's, then the right row's arrival. Vectorized:
per micro-batch O(new rows + buffered rows of the keys touched), one hash join, no Python per
row.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ConfigError, StateError
from spark_ckpt.runtime.co_operator import KeyedCoOperator
from spark_ckpt.runtime.event_time import Duration, _ms, event_times_us
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import ValueStateDescriptor
from spark_ckpt.state.key_lists import exploded, gathered

#: The fields a buffered row carries besides its own columns.
_TIME: Final = "_time_us"
_MATCHED: Final = "_matched"
_KEY: Final = "_key"
_INDEX: Final = "_index"
_NEW: Final = "_new"


class JoinType(StrEnum):
    """Which rows an :class:`IntervalJoin` emits (see the module docstring)."""

    INNER = "inner"
    LEFT_OUTER = "left_outer"
    RIGHT_OUTER = "right_outer"


def _signed_ms(option: str, value: Duration) -> int:
    """A bound in ms, which may be negative (``-seconds(5)``, ``"-5s"``, ``-5000``)."""
    if isinstance(value, str) and value.strip().startswith("-"):
        return -_ms(option, value.strip()[1:])
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return value
    if not isinstance(value, int | str) and hasattr(value, "total_seconds"):
        return int(value.total_seconds() * 1000)
    return _ms(option, value)


class IntervalJoin(KeyedCoOperator):
    """See the module docstring. *key*: the key column of both inputs (a name, or a pair
    ``(left, right)``); *time*: their event-time columns (likewise), Arrow timestamps;
    *lower*, *upper*: the interval in ms, a ``timedelta`` or text (``"-5s"``), ``lower <=
    upper``; *key_type*: the keys' Arrow type."""

    def __init__(
        self,
        left: str,
        right: str,
        key: str | tuple[str, str],
        lower: Duration,
        upper: Duration,
        *,
        time: str | tuple[str, str],
        how: JoinType | str = JoinType.INNER,
        uid: str | None = None,
        key_type: pa.DataType | None = None,
    ) -> None:
        if left == right:
            raise ConfigError("right", right, "another input than the left one")
        left_key, right_key = (key, key) if isinstance(key, str) else key
        self.left, self.right = left, right
        self.left_time, self.right_time = (time, time) if isinstance(time, str) else time
        self.lower_ms = _signed_ms("lower", lower)
        self.upper_ms = _signed_ms("upper", upper)
        if self.lower_ms > self.upper_ms:
            raise ConfigError("lower", self.lower_ms, f"at most upper ({self.upper_ms} ms)")
        try:
            self.how = JoinType(str(how).strip().lower())
        except ValueError:
            raise ConfigError("how", how, " or ".join(j.value for j in JoinType)) from None
        super().__init__(
            uid or f"interval-join-{left}-{right}",
            {left: left_key, right: right_key},
            key_type or pa.int64(),
            left_key,
        )
        self._schemas: dict[str, pa.Schema] = {}
        self._descriptors: dict[str, ValueStateDescriptor] = {}

    # -- schemas ------------------------------------------------------------------------------
    def bind_inputs(self, schemas: Mapping[str, pa.Schema]) -> None:
        """The inputs' own columns (the pipeline hands them over before the job runs): the
        output's schema is then known before any row, and an outer join pads the other side
        even when it never had a row."""
        for name in (self.left, self.right):
            schema = schemas.get(name)
            if schema is None:
                continue
            for column in (self.keys[name], self._time_of(name)):
                if column not in schema.names:
                    raise ConfigError(
                        f"operator {self.uid!r}",
                        column,
                        f"a column of input {name!r}: {schema.names}",
                    )
            if not pa.types.is_timestamp(schema.field(self._time_of(name)).type):
                raise ConfigError(
                    f"operator {self.uid!r}", self._time_of(name), "a timestamp column"
                )
            self._schemas[name] = pa.schema([f.with_nullable(True) for f in schema])

    def _time_of(self, name: str) -> str:
        return self.left_time if name == self.left else self.right_time

    def _side(self, name: str) -> str:
        return "left" if name == self.left else "right"

    def _learn(self, name: str, table: pa.Table) -> None:
        if name not in self._schemas and table is not None:
            self._schemas[name] = pa.schema([f.with_nullable(True) for f in table.schema])

    def _descriptor(self, name: str, state: StateContext) -> ValueStateDescriptor | None:
        """The buffer of input *name*'s rows: known from its schema, or from the stored state
        (a restore); None when neither is known (no row of it yet: nothing buffered)."""
        found = self._descriptors.get(name)
        if found is not None:
            return found
        schema = self._schemas.get(name)
        if schema is None:
            stored = state.stored_descriptor(self._side(name))
            if stored is None:
                return None
            if not isinstance(stored, ValueStateDescriptor):
                raise StateError(
                    f"operator {self.uid!r}: state {self._side(name)!r} is not value state"
                )
            self._descriptors[name] = stored
            element = stored.value_type.value_type
            self._schemas[name] = pa.schema([f for f in element if f.name not in (_TIME, _MATCHED)])
            return stored
        fields = [*schema, pa.field(_TIME, pa.int64()), pa.field(_MATCHED, pa.bool_())]
        descriptor = ValueStateDescriptor(self._side(name), pa.list_(pa.struct(fields)))
        self._descriptors[name] = descriptor
        return descriptor

    @property
    def output_schema(self) -> pa.Schema | None:
        if self.left not in self._schemas or self.right not in self._schemas:
            return None
        return pa.schema([*self._schemas[self.left], *self._right_fields()])

    def _right_fields(self) -> list[pa.Field]:
        left_names = set(self._schemas[self.left].names)
        fields = []
        for f in self._schemas[self.right]:
            if f.name == self.keys[self.right]:
                continue
            name = f"{self.right}_{f.name}" if f.name in left_names else f.name
            fields.append(f.with_name(name))
        return fields

    # -- rows -------------------------------------------------------------------------------
    def process_inputs(
        self, batches: Mapping[str, pa.Table], state: StateContext
    ) -> pa.Table | None:
        for name, table in batches.items():
            self._learn(name, table)
        new_left = self._rows(self.left, batches.get(self.left))
        new_right = self._rows(self.right, batches.get(self.right))
        if new_left is None and new_right is None:
            return None
        key_arrays = [t.column(_KEY) for t in (new_left, new_right) if t is not None]
        keys = pc.unique(pa.chunked_array(key_arrays).combine_chunks())
        left = self._with_buffered(self.left, new_left, keys, state)
        right = self._with_buffered(self.right, new_right, keys, state)
        out = None
        if left is not None and right is not None:
            li, ri = self._pairs(left, right)
            if len(li):
                out = self._joined(left.take(pa.array(li)), right.take(pa.array(ri)))
                left = _mark(left, li)
                right = _mark(right, ri)
        for name, table in ((self.left, left), (self.right, right)):
            if table is not None:
                self._store(name, keys, table, state)
        for name, table in ((self.left, new_left), (self.right, new_right)):
            if table is not None and table.num_rows:
                stamps = self._cleanup_us(name, table.column(_TIME), state)
                ms = pc.divide(pc.add(stamps, 999), 1000)  # ceil: fires once all are due
                state.register_event_time_timers(table.column(_KEY), pc.cast(ms, pa.int64()))
        return out

    def on_timers(self, timers: pa.Table, state: StateContext) -> pa.Table | None:
        """Rows whose last possible match the watermark passed leave the state; an outer
        join emits those of its side no pair took."""
        mark = state.current_watermark
        if mark is None or timers.num_rows == 0:
            return None
        keys = pc.unique(timers.column(self.key_column).combine_chunks())
        emitted: list[pa.Table] = []
        for name in (self.left, self.right):
            descriptor = self._descriptor(name, state)
            if descriptor is None:
                continue
            buffered = _explode(keys, state.get_values(descriptor, keys), descriptor)
            if buffered.num_rows == 0:
                continue
            cleanup = self._cleanup_us(name, buffered.column(_TIME), state)
            expired = pc.less_equal(cleanup, mark * 1000)
            if not pc.any(expired).as_py():
                continue
            gone = buffered.filter(expired)
            kept = buffered.filter(pc.invert(expired))
            self._store(name, keys, kept, state)
            outer = (name == self.left and self.how is JoinType.LEFT_OUTER) or (
                name == self.right and self.how is JoinType.RIGHT_OUTER
            )
            if outer:
                lonely = gone.filter(pc.invert(gone.column(_MATCHED)))
                if lonely.num_rows:
                    emitted.append(self._padded(name, lonely))
        if not emitted:
            return None
        return pa.concat_tables(emitted)

    # -- pieces -------------------------------------------------------------------------------
    def _rows(self, name: str, table: pa.Table | None) -> pa.Table | None:
        """Input *name*'s new rows as buffer rows: its columns, the key, the event time in µs,
        not matched, new."""
        if table is None or table.num_rows == 0:
            return None
        schema = self._schemas[name]
        table = table.select(schema.names).cast(schema)
        times = event_times_us(table.column(self._time_of(name)))
        valid = pc.is_valid(times)
        if not pc.all(valid).as_py():  # a row without event time never matches: dropped
            table, times = table.filter(valid), times.filter(valid)
            if table.num_rows == 0:
                return None
        n = table.num_rows
        return (
            table.append_column(_KEY, table.column(self.keys[name]).cast(self.key_type))
            .append_column(_TIME, times)
            .append_column(_MATCHED, pa.array(np.zeros(n, dtype=bool)))
            .append_column(_NEW, pa.array(np.ones(n, dtype=bool)))
        )

    def _with_buffered(
        self, name: str, new: pa.Table | None, keys: pa.Array, state: StateContext
    ) -> pa.Table | None:
        """Input *name*'s buffered rows of *keys*, then its *new* rows (buffer rows)."""
        descriptor = self._descriptor(name, state)
        pieces = []
        if descriptor is not None:
            old = _explode(keys, state.get_values(descriptor, keys), descriptor)
            if old.num_rows:
                old = old.append_column(_NEW, pa.array(np.zeros(old.num_rows, dtype=bool)))
                pieces.append(old.select(new.column_names) if new is not None else old)
        if new is not None:
            pieces.append(new)
        if not pieces:
            return None
        return pa.concat_tables(pieces).combine_chunks()

    def _pairs(self, left: pa.Table, right: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """Row indices of the pairs of *left* and *right* rows of one key within the interval,
        one of them new, ordered by left row then right row."""
        lk = pa.table({_KEY: left.column(_KEY), "l": pa.array(np.arange(left.num_rows))})
        rk = pa.table({_KEY: right.column(_KEY), "r": pa.array(np.arange(right.num_rows))})
        joined = lk.join(rk, keys=_KEY, join_type="inner", use_threads=False)
        if joined.num_rows == 0:
            return np.array([], dtype=np.int64), np.array([], dtype=np.int64)
        li = joined.column("l").to_numpy()
        ri = joined.column("r").to_numpy()
        lt = left.column(_TIME).to_numpy()[li]
        rt = right.column(_TIME).to_numpy()[ri]
        fresh = (
            left.column(_NEW).to_numpy(zero_copy_only=False)[li]
            | right.column(_NEW).to_numpy(zero_copy_only=False)[ri]
        )
        keep = (rt >= lt + self.lower_ms * 1000) & (rt <= lt + self.upper_ms * 1000) & fresh
        li, ri = li[keep], ri[keep]
        order = np.lexsort((ri, li))
        return li[order], ri[order]

    def _joined(self, left: pa.Table, right: pa.Table) -> pa.Table:
        schema = self.output_schema
        assert schema is not None
        left_cols = [left.column(f.name) for f in self._schemas[self.left]]
        right_src = [f for f in self._schemas[self.right] if f.name != self.keys[self.right]]
        right_cols = [right.column(f.name) for f in right_src]
        return pa.Table.from_arrays([*left_cols, *right_cols], schema=schema)

    def _padded(self, name: str, rows: pa.Table) -> pa.Table:
        """Rows of one side no pair took, with nulls for the other side's columns."""
        schema = self.output_schema
        if schema is None:
            raise StateError(
                f"operator {self.uid!r}: an outer join needs both inputs' columns before it emits "
                "an unmatched row (the pipeline hands them over; none came for "
                f"{self.right if name == self.left else self.left!r})"
            )
        n = rows.num_rows
        columns: list[pa.Array | pa.ChunkedArray] = []
        left_names = self._schemas[self.left].names
        for f in schema:
            if name == self.left:
                columns.append(rows.column(f.name) if f.name in left_names else pa.nulls(n, f.type))
            else:
                source = self._right_source(f.name)
                if f.name == self.keys[self.left]:
                    columns.append(rows.column(self.keys[self.right]).cast(f.type))
                elif source is not None:
                    columns.append(rows.column(source))
                else:
                    columns.append(pa.nulls(n, f.type))
        return pa.Table.from_arrays(columns, schema=schema)

    def _right_source(self, output_name: str) -> str | None:
        """The right input's column that output column *output_name* holds (None: a left one)."""
        for f, out in zip(
            [f for f in self._schemas[self.right] if f.name != self.keys[self.right]],
            self._right_fields(),
            strict=True,
        ):
            if out.name == output_name:
                return str(f.name)
        return None

    def _cleanup_us(
        self, name: str, times: pa.Array | pa.ChunkedArray, state: StateContext
    ) -> pa.Array:
        """When a buffered row of input *name* at *times* can no longer be matched."""
        reach = max(self.upper_ms, 0) if name == self.left else max(-self.lower_ms, 0)
        return pc.add(times, (reach + state.allowed_lateness_ms) * 1000)

    def _store(self, name: str, keys: pa.Array, rows: pa.Table, state: StateContext) -> None:
        """Input *name*'s buffer for every key of *keys*: its *rows* of that key (none:
        cleared), ordered by event time."""
        descriptor = self._descriptor(name, state)
        assert descriptor is not None
        element = descriptor.value_type.value_type
        structs = pa.StructArray.from_arrays(
            [rows.column(f.name).combine_chunks().cast(f.type) for f in element],
            fields=list(element),
        )
        times = rows.column(_TIME).combine_chunks().to_numpy(zero_copy_only=False)
        lists = gathered(keys, rows.column(_KEY), times, structs, descriptor.value_type)
        state.put_values(descriptor, keys, lists)


def _explode(keys: pa.Array, lists: pa.Array, descriptor: ValueStateDescriptor) -> pa.Table:
    """The buffered rows of *keys* (their state *lists*): the row's fields and its key."""
    element = descriptor.value_type.value_type
    owners, flat = exploded(keys, lists)
    columns = {
        f.name: (flat.field(i) if len(flat) else pa.array([], f.type))
        for i, f in enumerate(element)
    }
    columns[_KEY] = owners
    return pa.table(columns)


def _mark(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """*table* with the rows at *rows* matched."""
    matched = table.column(_MATCHED).to_numpy(zero_copy_only=False).copy()
    matched[rows] = True
    index = table.schema.get_field_index(_MATCHED)
    return table.set_column(index, _MATCHED, pa.array(matched))

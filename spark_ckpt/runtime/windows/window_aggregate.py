"""The window operator: per key, event-time windows of rows aggregated as they arrive, each
emitted once, when the watermark passes its end plus the allowed lateness (Flink's
``WindowOperator`` with an ``AggregateFunction`` and the event-time trigger, in append mode;
Spark's ``groupBy(window(...)).agg(...)`` with a watermark in append mode).

Built on the pieces under it, as Flink builds windows on keyed state and timers:

* **State**: one keyed value state, ``windows``: per key, the list of its open windows, each
  ``start``, ``end`` and the accumulator columns (:mod:`.aggregates`). Its types follow the
  input's; a restore reads them from the stored state.
* **Timers**: an event-time timer per open window at ``end - 1 + allowed lateness``, when
  it is emitted. Session windows that merge move their timers.
* **Lateness, per window** (Flink's ``WindowOperator``): the operator receives every row,
  late ones included (``receives_late_rows``). A row counts in each of its windows that is
  not yet emitted, and is dropped from those that are: their fire time is at or below the
  watermark. A row that falls in no open window goes to the late output. A session row
  behind the watermark still counts when its session — merged with the key's open sessions
  and the batch's other rows — is open.
* **Per batch** (vectorized: pyarrow kernels and numpy, a Python call per key only inside
  the state backend): assign windows (:mod:`.assigners`), drop the windows already emitted,
  reduce the batch per (key, window), merge with the keys' open windows (session windows:
  merge those that touch), register the new windows' timers, store the lists back.
* **Firing**: the timers that fire name their keys; every window of those keys whose
  ``end - 1 + lateness`` the watermark reached is emitted and leaves the state.

Output: the key column, ``window_start`` and ``window_end`` (timestamps, ms, UTC), then one
column per aggregate. Exactly once like any operator output: it goes through the sink's
two-phase commit with the checkpoint whose snapshot follows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ConfigError, StateError
from spark_ckpt.runtime.operator import KeyedOperator
from spark_ckpt.runtime.windows.aggregates import Accumulator, Aggregate
from spark_ckpt.runtime.windows.assigners import Int64s, WindowAssigner, merged_groups
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import ValueStateDescriptor
from spark_ckpt.state.key_lists import exploded, gathered

#: The keyed state that holds a key's open windows.
WINDOWS: Final = "windows"
_KEY: Final = "key"
_START: Final = "start"
_END: Final = "end"
_HELD: Final = "_held"
_WINDOW_TIME: Final = pa.timestamp("ms", tz="UTC")


class WindowAggregate(KeyedOperator):
    """Per *key_column*, the *aggregates* of the rows of each window *windows* assigns
    (see the module docstring). *time_column*: the event-time column (default: the
    pipeline's watermark column). Needs a pipeline with an event-time watermark strategy.
    Receives late rows: it decides lateness per window, as Flink does."""

    receives_late_rows = True

    def __init__(
        self,
        uid: str,
        key_column: str,
        windows: WindowAssigner,
        aggregates: Sequence[Aggregate],
        *,
        key_type: pa.DataType | None = None,
        time_column: str | None = None,
    ) -> None:
        super().__init__(uid, key_column, key_type or pa.int64())
        if not aggregates:
            raise ConfigError("aggregates", aggregates, "one or more aggregates")
        names = [a.name for a in aggregates]
        reserved = {key_column, "window_start", "window_end"}
        if len(set(names)) != len(names) or reserved & set(names):
            raise ConfigError("aggregates", names, f"distinct names other than {sorted(reserved)}")
        self.windows = windows
        self.aggregates = tuple(aggregates)
        self.time_column = time_column
        self._descriptor: ValueStateDescriptor | None = None
        self._descriptor_for: pa.Schema | None = None

    def open(self, state: StateContext) -> None:
        self._descriptor = None
        self._descriptor_for = None

    def on_timers(self, timers: pa.Table, state: StateContext) -> pa.Table | None:
        # declared so the task gives the operator timers (WindowAggregate handles its own)
        return self._fire(timers, state)

    # -- the state's types -------------------------------------------------------------------------
    def _state_for(self, rows: pa.Table) -> ValueStateDescriptor:
        """The state's descriptor for input *rows*: accumulator types as the partial
        aggregations give them on this schema."""
        if self._descriptor is not None and self._descriptor_for == rows.schema:
            return self._descriptor
        empty = rows.schema.empty_table()
        fields = [pa.field(_START, pa.int64()), pa.field(_END, pa.int64())]
        for agg in self.aggregates:
            for acc in agg.accumulators:
                probe = pa.table({"g": pa.array([], pa.int64()), "v": acc.values(empty)})
                reduced = probe.group_by("g").aggregate([("v", acc.partial)])
                fields.append(pa.field(agg.column(acc), reduced.schema.field(1).type))
        descriptor = ValueStateDescriptor(WINDOWS, pa.list_(pa.struct(fields)))
        self._descriptor, self._descriptor_for = descriptor, rows.schema
        return descriptor

    def _stored(self, state: StateContext) -> ValueStateDescriptor | None:
        if self._descriptor is not None:
            return self._descriptor
        stored = state.stored_descriptor(WINDOWS)
        if stored is not None and not isinstance(stored, ValueStateDescriptor):
            raise StateError(f"operator {self.uid!r}: state {WINDOWS!r} is not value state")
        return stored

    # -- rows --------------------------------------------------------------------------------------
    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        column = self.time_column or state.event_time_column
        if column is None:
            raise StateError(
                f"window operator {self.uid!r} needs event time: give the pipeline "
                "WatermarkStrategy.for_bounded_out_of_orderness(column, bound)"
            )
        descriptor = self._state_for(batch)
        batch = batch.filter(pc.is_valid(batch.column(column)))
        if batch.num_rows == 0:
            return None
        times = _millis(batch.column(column))
        rows, starts, ends = self.windows.assign(times)
        keys = pc.unique(batch.column(self.key_column))
        held = _explode(keys, state.get_values(descriptor, keys), descriptor)
        lateness = state.allowed_lateness_ms
        watermark = state.current_watermark
        if watermark is not None:
            emitted = _fire_times_of(ends, lateness) <= watermark
            if emitted.any():
                if self.windows.merges:
                    row_keys = batch.column(self.key_column).take(pa.array(rows))
                    emitted = _closed_sessions(row_keys, starts, ends, held, lateness, watermark)
                rows, starts, ends = self._drop_late(batch, rows, starts, ends, emitted, state)
                if len(rows) == 0:
                    return None
                kept = pc.unique(batch.column(self.key_column).take(pa.array(rows)))
                if len(kept) < len(keys):
                    keys, held = kept, held.filter(pc.is_in(held.column(_KEY), value_set=kept))
        picked = batch.take(pa.array(rows))
        parts = {_KEY: picked.column(self.key_column), _START: starts, _END: ends}
        for agg in self.aggregates:
            for acc in agg.accumulators:
                parts[agg.column(acc)] = acc.values(picked)
        reduce = [(agg.column(acc), acc.partial) for agg, acc in self._accumulators()]
        partial = _grouped(pa.table(parts), [_KEY, _START, _END], reduce)
        partial = partial.cast(held.schema)
        if self.windows.merges:
            merged = self._merge_sessions(pa.concat_tables([held, partial]))
            gone = _anti_join(held, merged, [_KEY, _END])
            new = _anti_join(merged, held, [_KEY, _END])
            if gone.num_rows:
                state.delete_event_time_timers(gone.column(_KEY), _fire_times(gone, lateness))
        else:
            merged, new = self._merge_aligned(held, partial)
        if new.num_rows:
            state.register_event_time_timers(new.column(_KEY), _fire_times(new, lateness))
        state.put_values(descriptor, keys, _collect(keys, merged, descriptor))
        return None

    @staticmethod
    def _drop_late(
        batch: pa.Table,
        rows: Int64s,
        starts: Int64s,
        ends: Int64s,
        emitted: npt.NDArray[np.bool_],
        state: StateContext,
    ) -> tuple[Int64s, Int64s, Int64s]:
        """The (row, window) pairs of windows not yet emitted; the rows of *batch* that have
        none go to the late output (Flink drops an element only when every window it falls
        in is late)."""
        taken = np.zeros(batch.num_rows, dtype=bool)
        taken[rows[~emitted]] = True
        if not taken.all():
            state.output_late(batch.filter(pa.array(~taken)))
        keep = ~emitted
        return rows[keep], starts[keep], ends[keep]

    def _accumulators(self) -> list[tuple[Aggregate, Accumulator]]:
        return [(agg, acc) for agg in self.aggregates for acc in agg.accumulators]

    def _merge_aligned(self, held: pa.Table, partial: pa.Table) -> tuple[pa.Table, pa.Table]:
        """Windows that never merge (tumbling, sliding): the open windows *held* and a
        batch's *partial* ones merged per (key, window); and those of them that are new
        (none of *held*), whose timers are to be registered."""
        merge = [(agg.column(acc), acc.merge) for agg, acc in self._accumulators()]
        mark = [
            pa.array(np.ones(held.num_rows, np.int8)),
            pa.array(np.zeros(partial.num_rows, np.int8)),
        ]
        both = pa.concat_tables([held, partial]).append_column(
            _HELD, pa.chunked_array(mark, pa.int8())
        )
        out = _grouped(both, [_KEY, _START, _END], [*merge, (_HELD, "max")])
        new = pc.equal(out.column(_HELD), 0)
        merged = out.drop_columns([_HELD]).cast(held.schema)
        return merged, merged.filter(new)

    def _merge_sessions(self, windows: pa.Table) -> pa.Table:
        """Session windows: open windows and a batch's partial ones merged per group of
        windows of a key that touch."""
        merge = [(agg.column(acc), acc.merge) for agg, acc in self._accumulators()]
        ordered = windows.sort_by([(_KEY, "ascending"), (_START, "ascending")])
        codes = pc.dictionary_encode(ordered.column(_KEY)).combine_chunks().indices
        group = merged_groups(
            codes.to_numpy(zero_copy_only=False).astype(np.int64),
            ordered.column(_START).to_numpy(),
            ordered.column(_END).to_numpy(),
        )
        ordered = ordered.append_column("group", pa.array(group))
        spans = [(_START, "min"), (_END, "max")]
        out = _grouped(ordered, [_KEY, "group"], spans + merge).drop_columns(["group"])
        return out.select(windows.column_names).cast(windows.schema)

    # -- firing ------------------------------------------------------------------------------------
    def _fire(self, timers: pa.Table, state: StateContext) -> pa.Table | None:
        event = timers.filter(pc.equal(timers.column("domain"), "event"))
        descriptor = self._stored(state)
        watermark = state.current_watermark
        if event.num_rows == 0 or descriptor is None or watermark is None:
            return None
        keys = pc.unique(event.column(self.key_column))
        held = _explode(keys, state.get_values(descriptor, keys), descriptor)
        lateness = state.allowed_lateness_ms
        due = pc.less_equal(_fire_times(held, lateness), watermark)
        fired, kept = held.filter(due), held.filter(pc.invert(due))
        state.put_values(descriptor, keys, _collect(keys, kept, descriptor))
        # in (fire time, key) order, as the timers come
        fired = fired.sort_by([(_END, "ascending"), (_KEY, "ascending")])
        if kept.num_rows:
            stale = _stale_keys(event.select([self.key_column, "timestamp"]), fired, lateness)
            if len(stale):
                # a timer fired for no window that is due: set with another allowed lateness
                # (an upgrade changed it); the key's open windows get timers for this one
                moved = kept.filter(pc.is_in(kept.column(_KEY), value_set=stale))
                state.register_event_time_timers(moved.column(_KEY), _fire_times(moved, lateness))
        if fired.num_rows == 0:
            return None
        out = {
            self.key_column: fired.column(_KEY).cast(self.key_type),
            "window_start": pc.cast(fired.column(_START), pa.int64()).cast(_WINDOW_TIME),
            "window_end": pc.cast(fired.column(_END), pa.int64()).cast(_WINDOW_TIME),
        }
        for agg in self.aggregates:
            accumulators = {acc.name: fired.column(agg.column(acc)) for acc in agg.accumulators}
            out[agg.name] = agg.result(accumulators)
        return pa.table(out)


def _millis(column: pa.ChunkedArray | pa.Array) -> Int64s:
    """Event times as int64 ms since the epoch (floored)."""
    if not pa.types.is_timestamp(column.type):
        raise StateError(f"the event-time column is {column.type}, not a timestamp")
    micros = pc.cast(pc.cast(column, pa.timestamp("us", tz=column.type.tz)), pa.int64())
    millis: Int64s = np.floor_divide(micros.to_numpy(), 1000).astype(np.int64)
    return millis


def _fire_times(windows: pa.Table, lateness: int) -> pa.Array:
    """When each window fires: the watermark passed its last millisecond plus *lateness*."""
    return pc.add(windows.column(_END), lateness - 1)


def _fire_times_of(ends: Int64s, lateness: int) -> Int64s:
    """:func:`_fire_times` of windows ending at *ends*."""
    return ends + (lateness - 1)


def _closed_sessions(
    row_keys: pa.ChunkedArray,
    starts: Int64s,
    ends: Int64s,
    held: pa.Table,
    lateness: int,
    watermark: int,
) -> npt.NDArray[np.bool_]:
    """Per session window of a batch's rows (key, ``[t, t + gap)``), whether it belongs to
    a session already emitted: once merged with the key's open sessions *held* and with the
    batch's other windows, its session holds none of the open ones and its fire time is at
    or below *watermark*. So a row behind the watermark that extends or joins an open
    session — or a session that the batch's rows on time open — still counts in it.
    Independent of the rows' order within the batch. Vectorized: one sort."""
    n_held = held.num_rows
    key_type = held.schema.field(_KEY).type
    keys = pa.concat_arrays(
        [held.column(_KEY).combine_chunks(), row_keys.combine_chunks().cast(key_type)]
    )
    codes = pc.dictionary_encode(keys).indices.to_numpy(zero_copy_only=False).astype(np.int64)
    all_starts = np.concatenate([held.column(_START).to_numpy(), starts]).astype(np.int64)
    all_ends = np.concatenate([held.column(_END).to_numpy(), ends]).astype(np.int64)
    is_held = np.arange(len(codes)) < n_held
    order = np.lexsort((all_starts, codes))
    group = merged_groups(codes[order], all_starts[order], all_ends[order])
    count = int(group[-1]) + 1
    group_end = np.full(count, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(group_end, group, all_ends[order])
    group_held = np.zeros(count, dtype=bool)
    np.logical_or.at(group_held, group, is_held[order])
    closed = (_fire_times_of(group_end, lateness) <= watermark) & ~group_held
    out = np.empty(len(codes), dtype=bool)
    out[order] = closed[group]
    return out[n_held:]


def _grouped(table: pa.Table, by: list[str], how: list[tuple[str, str]]) -> pa.Table:
    """*table* grouped by *by*, each column of *how* aggregated, named as before."""
    out = table.group_by(by, use_threads=False).aggregate(how)
    columns = {c: out.column(c) for c in by}
    for c, f in how:
        columns[c] = out.column(f"{c}_{f}")
    return pa.table(columns)


def _stale_keys(timers: pa.Table, fired: pa.Table, lateness: int) -> pa.Array:
    """The keys of *timers* (key, timestamp; ordered by timestamp, then key) that fired for
    no window of *fired* (ordered by end, then key; a window fires at ``end - 1 +
    lateness``). When every timer is a due window's, which is the rule while the lateness
    stays what it was, the two line up one to one: a vectorized comparison, no join."""
    due = pa.table([fired.column(_KEY), _fire_times(fired, lateness)], names=["k", "t"])
    asked = pa.table([timers.column(0), timers.column(1)], names=["k", "t"]).cast(due.schema)
    if asked.num_rows == due.num_rows and all(
        pc.all(pc.equal(asked.column(c), due.column(c))).as_py() is not False for c in "kt"
    ):
        return due.column("k").slice(0, 0).combine_chunks()
    return pc.unique(_anti_join(asked, due, ["k", "t"]).column("k"))


def _explode(keys: pa.Array, lists: pa.Array, descriptor: ValueStateDescriptor) -> pa.Table:
    """The open windows of *keys* (their state *lists*) as a table: key, start, end, the
    accumulator columns."""
    element = descriptor.value_type.value_type
    owners, flat = exploded(keys, lists)
    columns = {_KEY: owners}
    for i, f in enumerate(element):
        columns[f.name] = flat.field(i) if len(flat) else pa.array([], f.type)
    return pa.table(columns, schema=pa.schema([pa.field(_KEY, keys.type), *element]))


def _collect(keys: pa.Array, windows: pa.Table, descriptor: ValueStateDescriptor) -> pa.Array:
    """Per key of *keys* (unique), the list of its windows in *windows* ordered by start
    (null: none), as the state's values."""
    element = descriptor.value_type.value_type
    if windows.num_rows == 0:
        return pa.nulls(len(keys), descriptor.value_type)
    structs = pa.StructArray.from_arrays(
        [windows.column(f.name).combine_chunks().cast(f.type) for f in element],
        fields=list(element),
    )
    starts = windows.column(_START).combine_chunks().to_numpy(zero_copy_only=False)
    return gathered(keys, windows.column(_KEY), starts, structs, descriptor.value_type)


def _anti_join(left: pa.Table, right: pa.Table, on: list[str]) -> pa.Table:
    """The rows of *left* whose *on* columns match no row of *right*."""
    return left.join(right.select(on), keys=on, join_type="left anti", use_threads=False)

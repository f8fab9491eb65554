"""The user's state API: what an operator sees of its subtask's state.

Modelled on Spark's ``stateful_processor.py`` (``StatefulProcessorHandle`` and the
``ValueState``/``ListState``/``MapState`` views) and Flink's ``KeyedStateStore``: an operator
registers and reads/writes its state through a :class:`StateContext` and the per-record views
it returns, and cannot reach the backend's snapshot, restore or checkpoint-notification
methods, which belong to the task running it (:class:`~spark_ckpt.runtime.task.OperatorTask`).
The backend (:mod:`spark_ckpt.state.backend`) creates the views; their storage is its
business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from spark_ckpt.errors import StateError
from spark_ckpt.state.descriptor import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from spark_ckpt.state.operator_state import OperatorListState
from spark_ckpt.state.timers import TimeDomain, TimerService
from spark_ckpt.state.ttl import TtlStates
from spark_ckpt.state.views import ArrayLike, ListState, MapState, ValueState

if TYPE_CHECKING:
    from spark_ckpt.state.backend import KeyedStateBackend


class TimeView(Protocol):
    """The subtask's time, as the task that runs the operator knows it."""

    @property
    def watermark_ms(self) -> int | None:
        """The subtask's watermark (ms since the epoch; None: none yet)."""
        ...

    @property
    def processing_ms(self) -> int:
        """The processing time of the micro-batch being processed (ms since the epoch)."""
        ...

    @property
    def event_time(self) -> bool:
        """Whether the pipeline keeps event time (not processing time only)."""
        ...

    @property
    def event_time_column(self) -> str | None:
        """The pipeline's event-time column (None: processing time only)."""
        ...

    @property
    def allowed_lateness_ms(self) -> int:
        """How far behind the watermark a row may arrive and still be processed (ms)."""
        ...

    def lookup_version(self, table: str) -> int | None:
        """The version of lookup table *table* the micro-batch joins with."""
        ...

    def late(self, event_times: pa.ChunkedArray | pa.Array, lateness_ms: int) -> pa.Array:
        """Per event time, whether it is at or below the watermark less *lateness_ms*."""
        ...


#: Where the rows an operator drops as late go (:meth:`StateContext.output_late`): the task
#: counts them, and writes those of the chain's first operator to the late-output table.
LateOutput = Callable[[pa.Table], None]
#: Where an operator's rows for a named output go (the task writes them to its table).
SideOutput = Callable[[str, pa.Table], None]


#: Why a timer call fails in a pipeline that keeps no time.
NO_TIME = (
    "timers need a pipeline that keeps time: give it watermark=WatermarkStrategy... "
    "(WatermarkStrategy.no_watermarks() for processing-time timers only)"
)


class StateContext:
    """An operator's access to the state of its subtask (the backend it wraps stays with the
    task). Same threading contract as the backend: use it only from the calls the task makes
    into the operator (``open``, ``process_batch``, ``process_record``), and keep no
    references into it across calls.

    * registration and per-record views: :meth:`value_state`, :meth:`list_state`,
      :meth:`map_state` (registered on first use, so ``open`` registers by calling them);
      the views act on the key set by :meth:`set_current_key`;
    * vectorized access to value state: :meth:`get_values`, :meth:`put_values`, and
      :meth:`clear_values` for any keyed state — whole Arrow key arrays, no per-row Python;
    * operator (non-keyed) list state: :meth:`operator_list_state`;
    * time, in a pipeline that keeps it: :attr:`current_watermark`,
      :attr:`current_processing_time`, late rows (:meth:`late_rows`, :meth:`output_late`,
      for an operator that receives them), and timers per key — vectorized
      (:meth:`register_event_time_timers` and the like, arrays of keys and timestamps) or for
      the current key (:meth:`register_event_time_timer` and the like). Fired timers reach
      the operator's ``on_timers`` (:mod:`spark_ckpt.state.timers`); states whose
      descriptor has a ``ttl`` expire (:mod:`spark_ckpt.state.ttl`), with the same views.

    All keys must belong to the subtask's key groups (the task routes them so);
    :class:`~spark_ckpt.errors.StateError` otherwise."""

    __slots__ = ("_backend", "_late_output", "_side_output", "_time", "_timers", "_ttl")

    def __init__(
        self,
        backend: KeyedStateBackend,
        timers: TimerService | None = None,
        time: TimeView | None = None,
        ttl: TtlStates | None = None,
        late_output: LateOutput | None = None,
        side_output: SideOutput | None = None,
    ) -> None:
        """*timers*: the operator's timers (it handles them); *time*: the subtask's time (the
        pipeline keeps it); *ttl*: the operator's states with a TTL (a pipeline that keeps
        time); *late_output*: where the rows it drops as late go (a pipeline that keeps
        time); *side_output*: where the rows it gives a named output go (:meth:`output`)."""
        self._backend = backend
        self._side_output = side_output
        self._timers = timers
        self._time = time
        self._ttl = ttl
        self._late_output = late_output

    def __repr__(self) -> str:
        return f"StateContext({self._backend!r})"

    # -- registration, per-record views ------------------------------------------------------
    def value_state(self, descriptor: ValueStateDescriptor) -> ValueState:
        """The per-record view of value state *descriptor* (registered on first use)."""
        if descriptor.ttl is not None:
            return self._expiring(descriptor).value_state(descriptor)
        return self._backend.value_state(descriptor)

    def list_state(self, descriptor: ListStateDescriptor) -> ListState:
        """The per-record view of list state *descriptor* (registered on first use)."""
        if descriptor.ttl is not None:
            return self._expiring(descriptor).list_state(descriptor)
        return self._backend.list_state(descriptor)

    def map_state(self, descriptor: MapStateDescriptor) -> MapState:
        """The per-record view of map state *descriptor* (registered on first use)."""
        if descriptor.ttl is not None:
            return self._expiring(descriptor).map_state(descriptor)
        return self._backend.map_state(descriptor)

    def _expiring(self, descriptor: StateDescriptor) -> TtlStates:
        if self._ttl is None:
            raise StateError(
                f"state {descriptor.name!r} has a TTL, which needs a pipeline that keeps "
                "time: give it watermark=WatermarkStrategy... (WatermarkStrategy."
                "no_watermarks() for processing time only)"
            )
        return self._ttl

    def stored_descriptor(self, name: str) -> StateDescriptor | None:
        """The descriptor keyed state *name* is held under — registered, or as restored
        when nothing registered it yet (None: no such state). For operators whose state
        types follow their input, which a restore may have to read before any input."""
        for descriptor in self._backend.descriptors():
            if descriptor.name == name:
                return descriptor
        return None

    # -- current key ---------------------------------------------------------------------------
    def set_current_key(self, key: Any) -> None:
        """Make *key* the key the per-record views act on; StateError if it is null, not of
        the key type, or outside the subtask's key groups."""
        self._backend.set_current_key(key)

    @property
    def current_key(self) -> Any:
        """The key set by :meth:`set_current_key`; StateError if none was set."""
        return self._backend.current_key

    # -- vectorized access ---------------------------------------------------------------------
    def get_values(self, descriptor: ValueStateDescriptor, keys: ArrayLike) -> pa.Array:
        """The value of each key (null where it has none), aligned with *keys*, as an array
        of ``descriptor.value_type``. Keys may repeat. With a TTL, an expired value is null
        (and purged)."""
        if descriptor.ttl is not None:
            return self._expiring(descriptor).get_values(descriptor, keys)
        return self._backend.get_values(descriptor, keys)

    def put_values(
        self, descriptor: ValueStateDescriptor, keys: ArrayLike, values: ArrayLike
    ) -> None:
        """Set the value of each key; a null value clears the key. If a key repeats, its
        last occurrence wins. Nothing changes if any key is invalid. With a TTL, the values
        are updated now."""
        if descriptor.ttl is not None:
            self._expiring(descriptor).put_values(descriptor, keys, values)
            return
        self._backend.put_values(descriptor, keys, values)

    def clear_values(self, descriptor: StateDescriptor, keys: ArrayLike) -> None:
        """Remove the entries of *keys* from keyed state *descriptor* (any kind)."""
        if descriptor.ttl is not None:
            descriptor = self._expiring(descriptor).storage(descriptor)
        self._backend.clear_values(descriptor, keys)

    # -- operator state ------------------------------------------------------------------------
    def operator_list_state(self, name: str, element_type: pa.DataType) -> OperatorListState:
        """Operator list state *name* of the subtask (registered on first use)."""
        return self._backend.operator_list_state(name, element_type)

    # -- time ----------------------------------------------------------------------------------
    def _service(self, domain: TimeDomain) -> TimerService:
        if self._time is None:
            raise StateError(NO_TIME)
        if self._timers is None:
            raise StateError(
                "this operator has no timers: override on_timers (or on_timer, for a "
                "RecordOperator) to receive the timers it registers"
            )
        if domain is TimeDomain.EVENT and not self._time.event_time:
            raise StateError(
                "event-time timers need an event-time column: give the pipeline "
                "WatermarkStrategy.for_bounded_out_of_orderness(column, bound) (its strategy "
                "has none: no_watermarks)"
            )
        return self._timers

    @property
    def current_watermark(self) -> int | None:
        """The subtask's watermark in ms since the epoch (None: none yet, or no event time)."""
        return None if self._time is None else self._time.watermark_ms

    @property
    def event_time_column(self) -> str | None:
        """The pipeline's event-time column (None: no event time)."""
        return None if self._time is None else self._time.event_time_column

    @property
    def allowed_lateness_ms(self) -> int:
        """The pipeline's allowed lateness (ms): rows less than this behind the watermark
        still reach an operator that does not receive late rows; a window closes this long
        after its end."""
        return 0 if self._time is None else self._time.allowed_lateness_ms

    def late_rows(self, batch: pa.Table, lateness_ms: int | None = None) -> pa.Array:
        """Per row of *batch*, whether it is late: its event time (the pipeline's event-time
        column) at or below the watermark less *lateness_ms* — by default the allowed
        lateness, which marks the rows the task drops before an operator that does not
        receive late rows; 0 marks every row behind the watermark (Flink's ``timestamp <=
        currentWatermark``). All False before the first watermark and in a pipeline without
        event time; a null event time is never late. Vectorized: one comparison per row."""
        column = self.event_time_column
        if self._time is None or column is None:
            return pa.array([False] * batch.num_rows, pa.bool_())
        lateness = self.allowed_lateness_ms if lateness_ms is None else lateness_ms
        return self._time.late(batch.column(column), lateness)

    def output_late(self, rows: pa.Table) -> None:
        """Drop *rows* as late, into the pipeline's late output (Flink's side output of late
        data): counted as dropped in the checkpoint's statistics and, when the pipeline has a
        late-output table and this operator is the first of its chain, written there with
        their own columns, exactly once with the next checkpoint (the rows must have the
        columns this operator receives). For operators that receive late rows
        (``KeyedOperator.receives_late_rows``); a row given twice is written twice."""
        if self._late_output is None:
            raise StateError(
                "late rows need a pipeline that keeps event time: give it "
                "watermark=WatermarkStrategy.for_bounded_out_of_orderness(column, bound)"
            )
        if rows.num_rows:
            self._late_output(rows)

    def output(self, name: str, rows: pa.Table) -> None:
        """Emit *rows* to the operator's named output *name* (Flink's side output): one of the
        operator's ``side_outputs``, which the pipeline maps to a Delta table of its own
        (``outputs={name: path}``), committed exactly once with the same checkpoint as the
        main output and rolled back with it on a restore. The rows must have the schema the
        operator declares for it. Costs one staged write per call."""
        if self._side_output is None:
            raise StateError(
                f"no output named {name!r}: declare it in the operator's side_outputs and give "
                "the pipeline its table (outputs={name: path})"
            )
        if rows.num_rows:
            self._side_output(name, rows)

    def lookup_version(self, table: str) -> int | None:
        """The version of the lookup table *table* (its path) that this micro-batch joins
        with, as the source recorded it in the batch's offsets (None: none recorded: the
        pipeline names no lookup join on it)."""
        return None if self._time is None else self._time.lookup_version(table)

    @property
    def current_processing_time(self) -> int:
        """The processing time of the micro-batch being processed, in ms since the epoch (the
        same when the batch is replayed); 0 in a pipeline that keeps no time."""
        return 0 if self._time is None else self._time.processing_ms

    def register_event_time_timers(self, keys: ArrayLike, timestamps: ArrayLike) -> None:
        """A timer per (key, timestamp): fires once the watermark reaches the timestamp
        (milliseconds, or Arrow timestamps). Registering one twice keeps one."""
        self._service(TimeDomain.EVENT).register(TimeDomain.EVENT, keys, timestamps)

    def delete_event_time_timers(self, keys: ArrayLike, timestamps: ArrayLike) -> None:
        """Delete the event-time timer of each (key, timestamp), if registered."""
        self._service(TimeDomain.EVENT).delete(TimeDomain.EVENT, keys, timestamps)

    def register_processing_time_timers(self, keys: ArrayLike, timestamps: ArrayLike) -> None:
        """A timer per (key, timestamp): fires with the first micro-batch whose processing
        time reaches the timestamp (within a trigger interval, rows or not)."""
        service = self._service(TimeDomain.PROCESSING)
        service.register(TimeDomain.PROCESSING, keys, timestamps)

    def delete_processing_time_timers(self, keys: ArrayLike, timestamps: ArrayLike) -> None:
        """Delete the processing-time timer of each (key, timestamp), if registered."""
        self._service(TimeDomain.PROCESSING).delete(TimeDomain.PROCESSING, keys, timestamps)

    def register_event_time_timer(self, timestamp: int) -> None:
        """An event-time timer of the current key (:meth:`set_current_key`)."""
        self.register_event_time_timers([self.current_key], [timestamp])

    def delete_event_time_timer(self, timestamp: int) -> None:
        """Delete the current key's event-time timer at *timestamp*."""
        self.delete_event_time_timers([self.current_key], [timestamp])

    def register_processing_time_timer(self, timestamp: int) -> None:
        """A processing-time timer of the current key."""
        self.register_processing_time_timers([self.current_key], [timestamp])

    def delete_processing_time_timer(self, timestamp: int) -> None:
        """Delete the current key's processing-time timer at *timestamp*."""
        self.delete_processing_time_timers([self.current_key], [timestamp])

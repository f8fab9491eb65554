"""A subtask's time: its watermark valve, the processing time of its micro-batches, what it
counted since its previous checkpoint, and its operators' timers.

The task (:mod:`spark_ckpt.runtime.task`) holds one :class:`TaskTime` when the pipeline keeps
time (a :class:`~spark_ckpt.runtime.event_time.WatermarkStrategy`, with an event-time column
or :meth:`~spark_ckpt.runtime.event_time.WatermarkStrategy.no_watermarks`) and calls it

* with each channel's progress as it arrives (:meth:`TaskTime.observe`);
* on each batch of rows, before the operators: :meth:`TaskTime.drop_late`, or only
  :meth:`TaskTime.count_late` when the first operator receives late rows itself
  (``KeyedOperator.receives_late_rows``: it drops them, :meth:`TaskTime.count_dropped`);
* at the end of each micro-batch and before each snapshot: :meth:`TaskTime.advance`, then
  :meth:`TaskTime.due` per operator until no timer is due (the task hands them to the
  operator's ``on_timers``);
* at a snapshot (:meth:`TaskTime.snapshot`) and a restore (:meth:`TaskTime.restore`).

Both times move only with the progress rows of the replayable source positions, so a
replayed micro-batch fires the same timers in the same order (``docs/time.md``). The timers
themselves are keyed state of each operator's backend (:mod:`spark_ckpt.state.timers`); this
class only decides when they are due. Single-threaded, as the task. Pure: pyarrow only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.protocol.barrier import (
    BARRIER_COLUMNS,
    BARRIER_OPTIONS,
    BARRIER_TS,
    KIND,
    ChannelProgress,
    RecordKind,
)
from spark_ckpt.protocol.state_handles import TimeMetrics
from spark_ckpt.runtime.event_time import WatermarkStrategy, WatermarkValve
from spark_ckpt.runtime.operator import KeyedOperator
from spark_ckpt.sources.inputs import Inputs, common_time
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.descriptor import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from spark_ckpt.state.timers import TimeDomain, TimerService
from spark_ckpt.state.ttl import TtlStates

#: The columns of a table of fired timers besides the key (named as the operator's key).
TIMESTAMP: Final = "timestamp"
DOMAIN: Final = "domain"


class TaskTime:
    """The time of one subtask over its *channels* under *strategy* (see the module
    docstring). Implements :class:`~spark_ckpt.state.context.TimeView` for the operators'
    state contexts."""

    def __init__(
        self,
        strategy: WatermarkStrategy,
        channels: Iterable[int],
        inputs: Inputs | None = None,
    ) -> None:
        """*inputs*: several inputs, whose rows the task judges by their union form's event
        time (the strategy's column); the operators receive each input's own columns, whose
        event-time column is the one the inputs name alike (none where they differ: the
        operators name theirs)."""
        self.strategy = strategy
        self._operator_column = strategy.column if inputs is None else common_time(inputs)
        self.valve = WatermarkValve(channels, strategy.bound_us, strategy.channel_bounds_us())
        #: what the subtask counted since its previous checkpoint
        self.metrics = TimeMetrics()
        #: per operator uid: its timers (operators that handle timers only)
        self.timers: dict[str, TimerService] = {}
        #: per operator uid: its states with a TTL
        self.ttl: dict[str, TtlStates] = {}
        #: the processing time of the micro-batch being processed (0: not known)
        self._batch_ms = 0
        #: the lookup tables' versions of the newest micro-batch seen (by path)
        self._lookups: dict[str, int] = {}

    # -- the operators' view -------------------------------------------------------------------
    @property
    def event_time(self) -> bool:
        """Whether the pipeline keeps event time (not processing time only)."""
        return self.strategy.event_time

    @property
    def event_time_column(self) -> str | None:
        """The event-time column of the rows the first operator receives."""
        return self._operator_column

    @property
    def allowed_lateness_ms(self) -> int:
        """Rows this far behind the watermark still reach the operators."""
        return self.strategy.allowed_lateness_ms

    @property
    def watermark_ms(self) -> int | None:
        """The subtask's watermark, ms since the epoch (None: none yet, or no event time)."""
        mark = self.valve.watermark_us
        return None if mark is None else mark // 1000

    @property
    def processing_ms(self) -> int:
        """The processing time of the micro-batch being processed (or the newest one), ms
        since the epoch (0: none yet)."""
        return max(self.valve.processing_ms, self._batch_ms)

    def add_timers(self, uid: str, backend: KeyedStateBackend) -> TimerService:
        """The timers of operator *uid*, kept in *backend* (call before a restore, where the
        operator registers its state)."""
        service = self.timers[uid] = TimerService(backend)
        return service

    def add_ttl(self, uid: str, backend: KeyedStateBackend) -> TtlStates:
        """The states with a TTL of operator *uid*, kept in *backend*, expiring by this
        subtask's processing time."""
        states = self.ttl[uid] = TtlStates(backend, lambda: self.processing_ms)
        return states

    # -- input ---------------------------------------------------------------------------------
    def begin(self, batch: pa.Table | pa.RecordBatch) -> None:
        """A micro-batch's input arrives: its processing time (its progress rows') is the
        operators' :attr:`processing_ms` while they process its rows. O(rows), vectorized."""
        if not batch.num_rows:
            return
        progress = pc.equal(batch.column(KIND), RecordKind.PROGRESS.code)
        stamps = batch.column(BARRIER_TS).filter(progress)
        top = pc.max(pc.cast(stamps, pa.int64())).as_py()
        if top is not None:
            self._batch_ms = max(self._batch_ms, top // 1000)
        # the lookup tables' versions of this micro-batch hold for all its rows, those
        # before a barrier in it too (its progress rows, which carry them, come last)
        for options in batch.column(BARRIER_OPTIONS).filter(progress).to_pylist()[:1]:
            found = json.loads(options or "{}").get("lookups")
            if found:
                self._lookups.update({str(k): int(v) for k, v in found.items()})

    def observe(self, channel: int, progress: ChannelProgress) -> None:
        """Channel *channel*'s progress arrived; the next :meth:`advance` applies it."""
        self.valve.observe(channel, progress)

    def lookup_version(self, table: str) -> int | None:
        """The version of lookup table *table* the micro-batch joins with (None: none
        recorded)."""
        return self._lookups.get(table)

    def count_late(self, table: pa.Table) -> pa.Array | None:
        """Count the rows of *table* that arrive late (event time at or below the watermark)
        and return that mask (None: none late, no event-time column or no watermark yet).
        Vectorized: one comparison per row."""
        column = self.strategy.column
        if column is None or self.valve.watermark_us is None:
            return None
        if column not in table.column_names:
            # a later stage whose input lacks the column (its first stage checks the schema
            # before the run): nothing of it can be judged late
            return None
        late = self.valve.late(table.column(column))
        n_late = pc.sum(late).as_py() or 0
        if not n_late:
            return None
        self.metrics = self.metrics.add(late=n_late)
        return late

    def drop_late(self, table: pa.Table) -> tuple[pa.Table, pa.Table | None]:
        """*table* without its rows late beyond the allowed lateness, and those rows (their
        own columns, none of the engine's; None: none); counts the late rows
        (:meth:`count_late`) and the dropped ones. Vectorized: one comparison per row;
        nothing without an event-time column or a watermark."""
        late = self.count_late(table)
        if late is None:
            return table, None
        lateness = self.strategy.allowed_lateness_ms * 1000
        column = self.strategy.column
        assert column is not None
        dropped = late if lateness == 0 else self.valve.late(table.column(column), lateness)
        n_dropped = pc.sum(dropped).as_py() or 0
        if not n_dropped:
            return table, None
        self.count_dropped(n_dropped)
        return table.filter(pc.invert(dropped)), own_columns(table.filter(dropped))

    def count_dropped(self, rows: int) -> None:
        """*rows* late rows were dropped (by the task, or by an operator that receives late
        rows and decided so: ``StateContext.output_late``)."""
        self.metrics = self.metrics.add(dropped=rows)

    def late(self, event_times: pa.ChunkedArray | pa.Array, lateness_ms: int) -> pa.Array:
        """Per event time, whether it is at or below the watermark less *lateness_ms* (all
        False before a watermark; a null time is never late). Vectorized."""
        return self.valve.late(event_times, lateness_ms * 1000)

    def advance(self) -> None:
        """Apply the progress observed since the last call (the end of a micro-batch, or a
        snapshot): the watermark and the processing time move, and the entries of states
        with a TTL that expired by then are purged (O(channels + entries due))."""
        self.valve.advance()
        if self.processing_ms:
            for states in self.ttl.values():
                states.purge()
                states.compact()

    def due(self, uid: str, key_column: str) -> list[pa.Table]:
        """The timers of operator *uid* due now, taken out of its state: event-time ones at or
        below the watermark, then processing-time ones at or below the processing time, each
        a table of *key_column*, :data:`TIMESTAMP` (int64 ms) and :data:`DOMAIN`, ordered by
        (timestamp, key). Empty when none is due. O(timers due + keys touched)."""
        service = self.timers.get(uid)
        if service is None:
            return []
        fired: list[pa.Table] = []
        mark = self.watermark_ms
        if mark is not None and self.event_time:
            fired.append(_named(service.pop_due(TimeDomain.EVENT, mark), key_column, "event"))
        if self.processing_ms:
            due = service.pop_due(TimeDomain.PROCESSING, self.processing_ms)
            fired.append(_named(due, key_column, "processing"))
        return [t for t in fired if t.num_rows]

    def state_replaced(self) -> None:
        """The operators' state changed behind the timers (a restore, a loaded image, a
        changelog applied)."""
        for service in self.timers.values():
            service.forget_index()
        for states in self.ttl.values():
            states.forget_index()

    # -- checkpoints -----------------------------------------------------------------------------
    def snapshot(self) -> tuple[pa.Table, TimeMetrics]:
        """At a snapshot (after :meth:`advance`): the valve's state for the checkpoint, and
        the metrics since the previous one (the counts start again)."""
        registered = fired = 0
        for service in self.timers.values():
            r, f = service.take_counts()
            registered, fired = registered + r, fired + f
        expired = sum(states.take_expired() for states in self.ttl.values())
        metrics = self.metrics.add(
            timers_registered=registered, timers_fired=fired, ttl_expired=expired
        )
        self.metrics = TimeMetrics()
        return self.valve.to_table(), self._stamped(metrics)

    def give_back(self, metrics: TimeMetrics) -> None:
        """A snapshot was aborted: its counts go with the next checkpoint instead."""
        self.metrics = self.metrics.add(
            late=metrics.late_rows,
            dropped=metrics.dropped_rows,
            timers_registered=metrics.timers_registered,
            timers_fired=metrics.timers_fired,
            ttl_expired=metrics.ttl_expired,
        )

    def current(self) -> TimeMetrics:
        """The metrics so far, with the current watermark and processing time."""
        return self._stamped(self.metrics)

    def _stamped(self, metrics: TimeMetrics) -> TimeMetrics:
        return metrics.at(self.watermark_ms, self.processing_ms)

    def restore(self, tables: Iterable[pa.Table]) -> None:
        """Resume the valve from the states of every subtask of a checkpoint (at any
        parallelism; :meth:`WatermarkValve.restore`); the timers come with the state."""
        self.valve.restore(tables)
        self.state_replaced()

    # -- images between micro-batches ----------------------------------------------------------
    def image_meta(self) -> dict[str, Any]:
        """The valve and the counts as JSON-compatible values, for a subtask's image:
        ``event_time`` (the valve's) and ``time`` (the counts)."""
        return {"event_time": self.valve.state_dict(), "time": self.metrics.to_dict()}

    def load_image_meta(self, meta: Mapping[str, Any]) -> None:
        """Take the valve and the counts from an image's metadata (:meth:`image_meta`'s);
        the timers come with the state. An image without them leaves them be."""
        if meta.get("event_time") is None:
            return
        self.valve.load_state_dict(meta["event_time"])
        metrics = meta.get("time")
        self.metrics = TimeMetrics() if metrics is None else TimeMetrics.from_dict(metrics)
        self.state_replaced()


def own_columns(rows: pa.Table) -> pa.Table:
    """*rows* without the engine's columns (the barrier columns): the columns the late-output
    table holds."""
    return rows.drop_columns([c for c in rows.column_names if c in BARRIER_COLUMNS])


def _named(due: pa.Table, key_column: str, domain: str) -> pa.Table:
    return pa.table(
        {
            key_column: due.column("key"),
            TIMESTAMP: due.column("ts"),
            DOMAIN: pa.array([domain] * due.num_rows, pa.string()),
        }
    )


def time_needed(operator: KeyedOperator) -> str | None:
    """Why *operator* needs a pipeline that keeps time (None: it does not): it handles
    timers, or it holds a state descriptor with a TTL. Found before anything runs and
    without running any of the operator's code (no ``open``, no ``close``, no copy): from
    the descriptors it holds in its attributes or its class's, and in the lists, tuples,
    sets and dicts among them. A descriptor built only inside ``open`` is refused by its
    real ``open`` (:class:`~spark_ckpt.errors.StateError`). O(attributes)."""
    if operator.handles_timers:
        return "handles timers"
    names = sorted({d.name for d in _held_descriptors(operator) if d.ttl is not None})
    return f"has states with a TTL ({', '.join(names)})" if names else None


_CONTAINERS: Final = (list, tuple, set, frozenset)


def _held_descriptors(operator: KeyedOperator) -> list[StateDescriptor]:
    """The state descriptors *operator* holds: its instance's attributes and its classes'
    (plain values only: no property or other descriptor is called)."""
    found: list[StateDescriptor] = []
    pending: list[object] = list(getattr(operator, "__dict__", {}).values())
    for cls in type(operator).__mro__:
        pending.extend(vars(cls).values())
    seen: set[int] = set()
    while pending:
        value = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, (ValueStateDescriptor, ListStateDescriptor, MapStateDescriptor)):
            found.append(value)
        elif isinstance(value, _CONTAINERS):
            pending.extend(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
    return found

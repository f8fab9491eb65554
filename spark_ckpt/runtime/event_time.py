"""Event time: the watermark strategy a pipeline is given, the channels' progress filled in
from their rows, and the subtask's watermark valve (Flink's ``StatusWatermarkValve``).

How the watermark moves, deterministically under replay (``docs/time.md``):

* **The source records when and what.** Each micro-batch's end offset carries its processing
  time and the channels the source found idle
  (:class:`~spark_ckpt.sources.stream_offset.StreamOffset`); the batch emits, after each
  channel's data rows, a progress row (:class:`~spark_ckpt.protocol.barrier.ChannelProgress`).
  A replayed batch has the same offsets, so the same progress rows.
* **The largest event time of a channel's rows** is filled into its progress row where the
  event-time column exists — the executors' routing, or the driver's batch aligner, after any
  transformation (:func:`fill_progress`): every subtask receives every progress row, so every
  subtask computes the same watermark.
* **The valve** (:class:`WatermarkValve`): a channel's watermark is the largest event time
  seen on it less the bound, less 1 ms (Flink's rule: a row the bound behind the largest
  event time is on time); the subtask's is the minimum over its channels that are not
  idle (a channel with no rows yet holds it back), and it never decreases. It moves between
  micro-batches: a batch's rows are judged against the watermark its previous batches left,
  so both placements see the same watermark whatever order their channels arrive in.

Pure: pyarrow and numpy only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ConfigError, ProtocolError
from spark_ckpt.protocol.barrier import (
    BARRIER_OPTIONS,
    CHANNEL,
    KIND,
    ChannelProgress,
    RecordKind,
)
from spark_ckpt.runtime.config.durations import parse_duration

#: A duration as the strategy takes it: milliseconds, a ``timedelta`` or text (``"2s"``).
Duration = int | timedelta | str

#: The source options that carry a pipeline's watermark strategy to ``ckpt-source``.
COLUMN_OPTION: Final = "watermark.column"
BOUND_OPTION: Final = "watermark.outOfOrderness"
IDLENESS_OPTION: Final = "watermark.idleness"
LATENESS_OPTION: Final = "watermark.allowedLateness"
#: Several inputs (:mod:`spark_ckpt.sources.inputs`): each channel's own bound and idleness,
#: a JSON list of ``[bound_ms, idleness_ms or null]`` per channel (set by the pipeline).
CHANNELS_OPTION: Final = "watermark.channels"
OPTIONS: Final = (COLUMN_OPTION, BOUND_OPTION, IDLENESS_OPTION, LATENESS_OPTION, CHANNELS_OPTION)


def _ms(option: str, value: Duration) -> int:
    if isinstance(value, bool):
        raise ConfigError(option, value, "a duration")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(option, value, "a non-negative duration")
        return value
    if isinstance(value, timedelta):
        ms = value // timedelta(milliseconds=1)
        if ms < 0:
            raise ConfigError(option, value, "a non-negative duration")
        return ms
    return parse_duration(option, value)


@dataclass(frozen=True)
class WatermarkStrategy:
    """Where a pipeline's event time comes from and how far behind it the watermark trails
    (Flink's ``WatermarkStrategy``; Spark's ``withWatermark``):

    * *column*: the event-time column of the rows the first operator receives (a source
      column, or one the ``transform`` computes); an Arrow timestamp. None
      (:meth:`no_watermarks`): the pipeline keeps processing time only — no watermark, no
      late rows, processing-time timers;
    * *out_of_orderness_ms*: the bound — a channel's watermark is the largest event time seen
      on it less this, less 1 ms (``forBoundedOutOfOrderness``): rows up to the bound behind
      the largest event time are on time;
    * *idleness_ms*: a channel that has had no new row for this long is left out of the
      subtask's watermark until it has rows again (``withIdleness``; None: never);
    * *allowed_lateness_ms*: a late row (event time at or below the watermark when it
      arrives) is still processed when it is less than this behind the watermark; rows
      further behind are dropped, counted, and written to the pipeline's late output when it
      has one. Windows emit once the watermark passes their end plus this.

    Build it with :meth:`for_bounded_out_of_orderness` or :meth:`for_monotonous_timestamps`,
    then :meth:`with_idleness` / :meth:`with_allowed_lateness`. Frozen and picklable.

    A pipeline of several inputs (:mod:`spark_ckpt.sources.inputs`) gives each input a strategy
    of its own; the pipeline combines them into one whose *channels* hold, per channel, its
    input's bound and idleness (``(bound_ms, idleness_ms)``; empty: every channel has this
    strategy's)."""

    column: str | None
    out_of_orderness_ms: int = 0
    idleness_ms: int | None = None
    allowed_lateness_ms: int = 0
    channels: tuple[tuple[int, int | None], ...] = ()

    def __post_init__(self) -> None:
        if self.column is not None and (not isinstance(self.column, str) or not self.column):
            raise ConfigError(COLUMN_OPTION, self.column, "the name of the event-time column")
        for option, value in (
            (BOUND_OPTION, self.out_of_orderness_ms),
            (LATENESS_OPTION, self.allowed_lateness_ms),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(option, value, "a non-negative number of milliseconds")
        idle = self.idleness_ms
        if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int) or idle < 1):
            raise ConfigError(IDLENESS_OPTION, idle, "a positive number of milliseconds")

    @staticmethod
    def for_bounded_out_of_orderness(column: str, bound: Duration) -> WatermarkStrategy:
        """The watermark trails the largest event time seen on each channel by *bound* and
        1 ms (Flink's ``max - bound - 1``): a row *bound* behind is on time."""
        return WatermarkStrategy(column, _ms(BOUND_OPTION, bound))

    @staticmethod
    def no_watermarks() -> WatermarkStrategy:
        """Processing time only (Flink's ``noWatermarks``): micro-batches carry their
        processing time for processing-time timers; nothing is late."""
        return WatermarkStrategy(None)

    @property
    def event_time(self) -> bool:
        """Whether the pipeline keeps event time (a column), not only processing time."""
        return self.column is not None

    @staticmethod
    def for_monotonous_timestamps(column: str) -> WatermarkStrategy:
        """Event time never goes back on a channel: the watermark is its largest event time
        less 1 ms (Flink's ``forMonotonousTimestamps``): a row at the largest event time
        seen so far is on time."""
        return WatermarkStrategy(column, 0)

    def with_idleness(self, timeout: Duration) -> WatermarkStrategy:
        """Leave a channel out of the watermark after *timeout* without new rows."""
        return replace(self, idleness_ms=_ms(IDLENESS_OPTION, timeout))

    def with_allowed_lateness(self, lateness: Duration) -> WatermarkStrategy:
        """Process late rows up to *lateness* behind the watermark (see the class)."""
        return replace(self, allowed_lateness_ms=_ms(LATENESS_OPTION, lateness))

    @property
    def bound_us(self) -> int:
        return self.out_of_orderness_ms * 1000

    def channel_bounds_us(self) -> dict[int, int]:
        """Per channel with a bound of its own (several inputs), that bound in µs."""
        return {c: bound * 1000 for c, (bound, _) in enumerate(self.channels)}

    def idleness_of(self, channel: int) -> int | None:
        """Channel *channel*'s idleness timeout in ms (None: never idle)."""
        if channel < len(self.channels):
            return self.channels[channel][1]
        return self.idleness_ms

    @property
    def keeps_idleness(self) -> bool:
        """Whether any channel can become idle."""
        return self.idleness_ms is not None or any(i is not None for _, i in self.channels)

    def to_options(self) -> dict[str, str]:
        """The ``ckpt-source`` options that carry this strategy (:meth:`from_options`)."""
        options = {
            COLUMN_OPTION: self.column or "",
            BOUND_OPTION: str(self.out_of_orderness_ms),
            LATENESS_OPTION: str(self.allowed_lateness_ms),
        }
        if self.idleness_ms is not None:
            options[IDLENESS_OPTION] = str(self.idleness_ms)
        if self.channels:
            options[CHANNELS_OPTION] = json.dumps([list(c) for c in self.channels])
        return options

    @staticmethod
    def from_options(options: Mapping[str, str]) -> WatermarkStrategy | None:
        """The strategy the ``watermark.*`` options give (keys lower-cased or not); None
        without ``watermark.column``. :class:`ConfigError` naming a bad option."""
        lower = {k.lower(): v for k, v in options.items()}
        column = lower.get(COLUMN_OPTION.lower())
        if column is None:
            stray = [k for k in OPTIONS if k.lower() in lower]
            if stray:
                raise ConfigError(stray[0], lower[stray[0].lower()], f"{COLUMN_OPTION} too")
            return None
        strategy = WatermarkStrategy(
            column.strip() or None, _ms(BOUND_OPTION, lower.get(BOUND_OPTION.lower(), "0"))
        )
        idle = lower.get(IDLENESS_OPTION.lower())
        if idle is not None:
            strategy = strategy.with_idleness(idle)
        lateness = lower.get(LATENESS_OPTION.lower())
        if lateness is not None:
            strategy = strategy.with_allowed_lateness(lateness)
        per_channel = lower.get(CHANNELS_OPTION.lower())
        if per_channel is not None:
            strategy = replace(strategy, channels=_channel_times(per_channel))
        return strategy

    def check_schema(self, schema: pa.Schema) -> None:
        """:class:`ConfigError` unless *schema* (what the first operator receives) has the
        event-time column as an Arrow timestamp: before anything runs (processing time only:
        nothing to check)."""
        if self.column is None:
            return
        index = schema.get_field_index(self.column)
        if index < 0:
            raise ConfigError(
                COLUMN_OPTION, self.column, f"an event-time column of the rows: {schema.names}"
            )
        column_type = schema.field(index).type
        if not pa.types.is_timestamp(column_type):
            raise ConfigError(
                COLUMN_OPTION,
                self.column,
                f"a timestamp column (it is {column_type}): cast it in the transform, e.g. "
                f"withColumn({self.column!r}, F.col({self.column!r}).cast('timestamp'))",
            )


def _channel_times(text: str) -> tuple[tuple[int, int | None], ...]:
    """The ``watermark.channels`` option: per channel ``[bound_ms, idleness_ms or null]``."""
    try:
        items = json.loads(text)
        result = tuple((int(b), None if i is None else int(i)) for b, i in items)
    except (TypeError, ValueError) as e:
        raise ConfigError(CHANNELS_OPTION, text, "a JSON list of [bound_ms, idleness_ms]") from e
    if any(b < 0 or (i is not None and i < 1) for b, i in result):
        raise ConfigError(CHANNELS_OPTION, text, "bounds >= 0 and idleness timeouts >= 1 ms")
    return result


def event_times_us(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """An event-time column as int64 microseconds since the epoch (nulls stay null)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not pa.types.is_timestamp(column.type):
        raise ProtocolError(f"the event-time column is {column.type}, not a timestamp")
    return pc.cast(pc.cast(column, pa.timestamp("us", tz=column.type.tz)), pa.int64())


def fill_progress(
    table: pa.Table, column: str, carry: dict[int, int] | None = None
) -> tuple[pa.Table, dict[int, int]]:
    """*table* (rows of one or more channels, each channel's in order) with each progress
    row's largest event time set: that of the channel's data rows since its previous control
    row, *carry* included (the largest event time per channel of the data rows before
    *table* that no progress row covered yet). Returns the table and the carry for the rows
    after it. A channel's progress row that already holds a larger value keeps it. O(rows),
    vectorized; a table without progress rows costs one max per channel."""
    carry = dict(carry or {})
    if table.num_rows == 0:
        return table, carry
    kind = table.column(KIND).to_numpy(zero_copy_only=False)
    progress_rows = np.flatnonzero(kind == RecordKind.PROGRESS.code)
    control = kind != RecordKind.DATA.code
    channels = table.column(CHANNEL).to_numpy(zero_copy_only=False)
    times = event_times_us(table.column(column)).to_numpy(zero_copy_only=False)
    valid = ~np.isnan(times) if times.dtype.kind == "f" else np.ones(len(times), dtype=bool)
    if times.dtype.kind == "f":  # nulls: to_numpy made the column float
        times = np.where(valid, times, 0).astype(np.int64)
    data = ~control & valid
    options = table.column(BARRIER_OPTIONS).to_pylist()
    cursor: dict[int, int] = {}  # per channel: the row after its last control row so far
    for row in progress_rows.tolist():
        channel = int(channels[row])
        start = cursor.get(channel, 0)
        span = slice(start, row)
        mine = data[span] & (channels[span] == channel)
        best = carry.pop(channel, None)
        if mine.any():
            top = int(times[span][mine].max())
            best = top if best is None else max(best, top)
        opts = json.loads(options[row] or "{}")
        known = opts.get("max")
        if best is not None and (known is None or best > int(known)):
            opts["max"] = best
            options[row] = json.dumps(opts, sort_keys=True)
        cursor[channel] = row + 1
    for channel in np.unique(channels).tolist():
        start = cursor.get(channel, 0)
        mine = data[start:] & (channels[start:] == channel)
        if mine.any():
            top = int(times[start:][mine].max())
            carry[channel] = max(carry.get(channel, top), top)
    if len(progress_rows):
        index = table.schema.get_field_index(BARRIER_OPTIONS)
        table = table.set_column(index, BARRIER_OPTIONS, pa.array(options, pa.string()))
    return table, carry


@dataclass
class _Channel:
    max_event_time_us: int | None = None
    idle: bool = False

    def raise_to(self, top: int | None) -> None:
        if top is not None and (self.max_event_time_us is None or top > self.max_event_time_us):
            self.max_event_time_us = top


#: The schema of a valve's state in a checkpoint (one row per channel; the watermark and the
#: processing time in the schema's metadata).
VALVE_SCHEMA: Final = pa.schema(
    [
        pa.field("channel", pa.int32(), nullable=False),
        pa.field("max_event_time_us", pa.int64()),
        pa.field("idle", pa.bool_(), nullable=False),
    ]
)
_WATERMARK_KEY: Final = b"watermark_us"

#: How far below "the largest event time less the bound" a channel's watermark is: Flink's
#: ``BoundedOutOfOrdernessWatermarks`` emits ``max - bound - 1`` ms, so a row exactly the
#: bound behind the largest event time is still on time.
WATERMARK_GAP_US: Final = 1000
_PROCESSING_KEY: Final = b"processing_ms"


class WatermarkValve:
    """A subtask's event time over its channels *channels* with the strategy's bound (see
    the module docstring). :meth:`observe` takes progress as it arrives; :meth:`advance`
    applies it (the task calls it at the end of each micro-batch and before each snapshot).
    :attr:`watermark_us` is None until every channel that is not idle has had a row."""

    def __init__(
        self, channels: Iterable[int], bound_us: int, bounds: Mapping[int, int] | None = None
    ) -> None:
        """*bounds*: channels with a bound of their own (µs; several inputs), the others
        have *bound_us*."""
        self.bound_us = bound_us
        self._bounds = dict(bounds or {})
        self._channels: dict[int, _Channel] = {c: _Channel() for c in channels}
        self._pending: list[tuple[int, ChannelProgress]] = []
        #: the subtask's watermark (microseconds since the epoch), never decreasing
        self.watermark_us: int | None = None
        #: the processing time of the newest micro-batch seen (ms since the epoch; 0: none)
        self.processing_ms = 0

    def observe(self, channel: int, progress: ChannelProgress) -> None:
        """Channel *channel*'s progress arrived (applied by the next :meth:`advance`)."""
        self._pending.append((channel, progress))

    def advance(self) -> int | None:
        """Apply the progress observed since the last call; returns the watermark. O(channels)."""
        if not self._pending:
            return self.watermark_us
        for channel, progress in self._pending:
            state = self._channels.setdefault(channel, _Channel())
            top = progress.max_event_time_us
            if top is not None and (
                state.max_event_time_us is None or top > state.max_event_time_us
            ):
                state.max_event_time_us = top
            state.idle = progress.idle
            self.processing_ms = max(self.processing_ms, progress.batch_ms)
        self._pending.clear()
        active = [(c, s) for c, s in self._channels.items() if not s.idle]
        if active and all(s.max_event_time_us is not None for _, s in active):
            low = min(
                s.max_event_time_us - self._bounds.get(c, self.bound_us)
                for c, s in active
                if s.max_event_time_us is not None
            )
            candidate = low - WATERMARK_GAP_US
            if self.watermark_us is None or candidate > self.watermark_us:
                self.watermark_us = candidate
        return self.watermark_us

    def late(self, event_times: pa.ChunkedArray | pa.Array, lateness_us: int = 0) -> pa.Array:
        """Per row, whether it is late beyond *lateness_us*: its event time is at or below
        the watermark less *lateness_us* (a null event time is never late)."""
        if self.watermark_us is None:
            return pa.array(np.zeros(len(event_times), dtype=bool))
        times = event_times_us(event_times)
        return pc.fill_null(pc.less_equal(times, self.watermark_us - lateness_us), False)

    def channel_maxima(self) -> dict[int, int | None]:
        return {c: s.max_event_time_us for c, s in sorted(self._channels.items())}

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The valve's state as JSON-compatible values (a subtask's image between
        micro-batches); :meth:`load_state_dict` restores it exactly."""
        return {
            "watermark_us": self.watermark_us,
            "processing_ms": self.processing_ms,
            "channels": [
                [c, s.max_event_time_us, s.idle] for c, s in sorted(self._channels.items())
            ],
        }

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Replace the valve's state by *d* (:meth:`state_dict`'s)."""
        try:
            mark = d.get("watermark_us")
            self.watermark_us = None if mark is None else int(mark)
            self.processing_ms = int(d.get("processing_ms", 0))
            self._channels = {
                int(c): _Channel(None if top is None else int(top), bool(idle))
                for c, top, idle in d.get("channels", [])
            }
        except (TypeError, ValueError) as e:
            raise ProtocolError(f"a damaged watermark state: {d!r}") from e
        self._pending.clear()

    def to_table(self) -> pa.Table:
        """The valve's state (progress observed but not applied is not in it: snapshots
        follow :meth:`advance`)."""
        items = sorted(self._channels.items())
        meta = {
            _WATERMARK_KEY: b"" if self.watermark_us is None else str(self.watermark_us).encode(),
            _PROCESSING_KEY: str(self.processing_ms).encode(),
        }
        return pa.table(
            {
                "channel": pa.array([c for c, _ in items], pa.int32()),
                "max_event_time_us": pa.array([s.max_event_time_us for _, s in items], pa.int64()),
                "idle": pa.array([s.idle for _, s in items], pa.bool_()),
            },
            schema=VALVE_SCHEMA.with_metadata(meta),
        )

    def restore(self, tables: Iterable[pa.Table]) -> None:
        """Resume from the states of every subtask of a checkpoint (at any parallelism): per
        channel the largest event time any of them saw, the newest watermark and processing
        time. Channels of the state this valve does not read are kept (the next run may read
        them again); channels it reads and the state lacks start empty."""
        for table in tables:
            meta = table.schema.metadata or {}
            try:
                raw = meta.get(_WATERMARK_KEY, b"")
                if raw:
                    watermark = int(raw)
                    if self.watermark_us is None or watermark > self.watermark_us:
                        self.watermark_us = watermark
                self.processing_ms = max(self.processing_ms, int(meta.get(_PROCESSING_KEY, b"0")))
            except ValueError as e:
                raise ProtocolError(f"a damaged watermark state: {meta!r}") from e
            for row in table.to_pylist():
                state = self._channels.setdefault(int(row["channel"]), _Channel())
                top = row["max_event_time_us"]
                if top is not None and (
                    state.max_event_time_us is None or top > state.max_event_time_us
                ):
                    state.max_event_time_us = int(top)
                state.idle = bool(row["idle"])


def describe(strategy: WatermarkStrategy | None) -> dict[str, Any]:
    """A JSON-ready summary of *strategy* (for logs and statistics)."""
    if strategy is None:
        return {}
    return {
        "column": strategy.column,
        "out_of_orderness_ms": strategy.out_of_orderness_ms,
        "idleness_ms": strategy.idleness_ms,
        "allowed_lateness_ms": strategy.allowed_lateness_ms,
    }

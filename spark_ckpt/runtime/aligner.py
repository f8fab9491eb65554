"""Barrier alignment: Flink's ``CheckpointBarrierHandler`` family over Arrow record batches.

One :class:`BarrierAligner` sits in front of one operator input with *N* channels. The task
hands it the rows it reads (data rows interleaved with barrier and cancel rows, encoded as in
:mod:`spark_ckpt.protocol.barrier`) and executes the ordered list of :data:`Step` values it returns:

* :class:`Records` — data rows to feed to the operator now (one large table per run of rows
  that may be processed together; user columns plus ``_ckpt_channel`` and ``_ckpt_offset``);
* :class:`Snapshot` — take the synchronous operator snapshot *now*: the operator state at this
  point is exactly the state after all :class:`Records` returned before it (across calls);
* :class:`Complete` — every channel delivered barrier *n*: the task may acknowledge *n*, with
  the in-flight channel state (unaligned checkpoints only) and the per-channel barrier offsets;
* :class:`Abort` — the aligner gave up checkpoint *n*; the task declines it and forwards a cancel
  marker downstream. Rows held back for *n* appear in the following :class:`Records`.

Modes (:class:`AlignmentMode`):

* ``ALIGNED`` (exactly-once, Flink's aligned ``SingleCheckpointBarrierHandler``): a channel that
  delivered barrier *n* is blocked; its later rows are buffered (as Arrow, never emitted) until
  the last channel delivers *n*. Then :class:`Snapshot`, :class:`Complete`, and the buffered rows
  go through the aligner again (they may hold barrier *n + 1*). With ``aligned_timeout_ms > 0``
  a checkpoint still aligning once ``clock.now_ms() - barrier.timestamp_ms >= aligned_timeout_ms``
  switches to unaligned (checked on every :meth:`~BarrierAligner.process`,
  :meth:`~BarrierAligner.tick`, :meth:`~BarrierAligner.abort` and
  :meth:`~BarrierAligner.end_of_input`, and when the first barrier arrives). A barrier whose own
  ``unaligned`` flag is set is taken unaligned from the start.
* ``UNALIGNED`` (exactly-once, unaligned): the first barrier *n* on any channel triggers the
  :class:`Snapshot` at once (the barrier overtakes the in-flight data). Rows that arrive later on
  channels that have not delivered *n* yet are emitted **and** recorded as channel state of *n*.
  Nothing blocks (savepoints excepted, see below).
* ``AT_LEAST_ONCE`` (Flink's ``CheckpointBarrierTracker``): nothing blocks; the snapshot is taken
  when the last channel delivered *n*, so it also contains post-barrier rows of the early channels
  (replayed again after a restore: the at-least-once contract). Several checkpoints may be
  tracked concurrently (at most :data:`MAX_TRACKED_CHECKPOINTS`); completing *n* aborts every
  older tracked one, which can no longer complete.

Protocol (violations raise :class:`~spark_ckpt.errors.ProtocolError`, after which the aligner is
``FAILED`` and refuses further calls — the task must fail and restore):

* a row on a channel the aligner does not know, or on a channel after its end of input;
* barrier *n* on a channel that already delivered a barrier ``>= n`` (a duplicate, or channel
  order broken) — unless *n* was aborted or cancelled, whose late barriers are ignored (aborted
  ids are forgotten once every live channel has passed them; a barrier that old can then only be
  a protocol error). In ``ALIGNED`` mode the rows of a blocked channel, control rows included,
  are inspected only when released, so errors among them surface then;
* a control row (non-null ``_ckpt_checkpoint_id``) whose kind is not ``barrier``/``cancel``;
* a batch whose schema differs from the first one, or that lacks the barrier columns.

Control rows are recognized by a non-null ``_ckpt_checkpoint_id`` (data rows carry nulls in all
barrier columns, see :mod:`spark_ckpt.protocol.barrier`). This lets a batch without control rows be
recognized from the column's null count in O(1): with no checkpoint pending, such a batch costs a
channel-range check and a column projection. A malformed barrier row *without* checkpoint id is
therefore indistinguishable from data.

Savepoints (``SnapshotType.SAVEPOINT`` barriers) and final checkpoints (``barrier.final``) are
always aligned, as in Flink, so that they never carry channel state: in ``UNALIGNED`` mode too,
and the aligned timeout does not apply to them. In ``AT_LEAST_ONCE`` mode the barriers'
``unaligned`` flag is ignored.

A barrier newer than the pending checkpoint subsumes it (``Abort(SUBSUMED)``) in the
exactly-once modes. Barriers older than the newest started checkpoint that were never started
here are late and ignored. A cancel marker aborts its checkpoint if pending (``Abort(CANCELLED)``);
for a checkpoint not started yet it is remembered (its barriers are ignored) and reported once as
``Abort(CANCELLED)`` so the task can forward the cancellation; an older pending checkpoint stays
pending (unlike Flink, which drops it: it can still complete). Cancels for completed or unknown
old checkpoints are ignored.

Offsets: ``Complete.barrier_offsets[ch]`` is the ``_ckpt_offset`` of channel *ch*'s barrier row,
i.e. the offset of its next data row, where a source rewinds on restore; for a channel that
ended before delivering the barrier it is the end offset given to
:meth:`~BarrierAligner.end_of_input`.

Threading: an aligner is used by one task thread; it is not thread-safe. It never reads time
itself; all timestamps come from the injected :class:`~spark_ckpt.protocol.clock.Clock`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ConfigError, ProtocolError
from spark_ckpt.protocol.barrier import (
    BARRIER_FIELDS,
    BARRIER_OPTIONS,
    BARRIER_TS,
    CHANNEL,
    CHECKPOINT_ID,
    KIND,
    OFFSET,
    CancelCheckpointMarker,
    CheckpointBarrier,
    RecordKind,
    event_from_row,
)
from spark_ckpt.protocol.clock import Clock

__all__ = [
    "MAX_TRACKED_CHECKPOINTS",
    "Abort",
    "AbortReason",
    "AlignerState",
    "AlignmentMode",
    "BarrierAligner",
    "Complete",
    "Records",
    "Snapshot",
    "Step",
]

#: Concurrent checkpoints an ``AT_LEAST_ONCE`` aligner tracks; older ones are aborted (as Flink).
MAX_TRACKED_CHECKPOINTS = 50

#: Barrier columns dropped from emitted data (``_ckpt_channel``/``_ckpt_offset`` are kept).
_CONTROL_ONLY_COLUMNS: tuple[str, ...] = (KIND, CHECKPOINT_ID, BARRIER_TS, BARRIER_OPTIONS)


class AlignmentMode(StrEnum):
    """How barriers of one checkpoint are aligned across the channels of an input."""

    ALIGNED = "aligned"
    UNALIGNED = "unaligned"
    AT_LEAST_ONCE = "at_least_once"


class AlignerState(StrEnum):
    """Lifecycle of an aligner (of its oldest pending checkpoint when one is pending).

    ``IDLE``: no checkpoint pending. ``ALIGNING``: aligned checkpoint, some channels blocked.
    ``UNALIGNED_COLLECTING``: snapshot taken, collecting in-flight rows of the channels whose
    barrier is still due. ``TRACKING``: at-least-once, some but not all barriers seen.
    ``FINISHED``: every channel ended. ``FAILED``: a protocol error was raised; terminal."""

    IDLE = "idle"
    ALIGNING = "aligning"
    UNALIGNED_COLLECTING = "unaligned_collecting"
    TRACKING = "tracking"
    FINISHED = "finished"
    FAILED = "failed"


class AbortReason(StrEnum):
    """Why the aligner gave up a checkpoint."""

    SUBSUMED = "subsumed"  # a newer checkpoint's barrier (or completion) superseded it
    CANCELLED = "cancelled"  # a cancel marker arrived on a channel
    COORDINATOR = "coordinator"  # the coordinator notified the task (abort())


@dataclass(frozen=True)
class Records:
    """Data rows to process now, in an order that preserves each channel's order. Columns: the
    user's columns, ``_ckpt_channel`` and ``_ckpt_offset``. Never empty."""

    table: pa.Table


@dataclass(frozen=True)
class Snapshot:
    """Take the synchronous snapshot of checkpoint ``barrier.checkpoint_id`` now.

    ``unaligned`` is true when the snapshot is taken before every channel delivered the barrier
    (its :class:`Complete` may then carry channel state). ``alignment_ms``: time from the first
    barrier's arrival to the last one (aligned / at-least-once) or to the switch to unaligned
    (0 when unaligned from the start). ``start_delay_ms``: first arrival minus the barrier's
    timestamp, clamped at 0."""

    barrier: CheckpointBarrier
    unaligned: bool
    alignment_ms: int
    start_delay_ms: int

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id


@dataclass(frozen=True)
class Complete:
    """Every channel delivered barrier ``checkpoint_id`` (or ended): acknowledge it.

    ``channel_state[ch]``: rows (``Records`` schema, channel order) that arrived on *ch* after the
    unaligned snapshot and before *ch*'s barrier; they were also emitted as :class:`Records`.
    Only channels with such rows appear; empty for aligned and at-least-once checkpoints.
    ``barrier_offsets[ch]``: offset of *ch*'s barrier row (= its next data row), for every
    channel."""

    checkpoint_id: int
    channel_state: Mapping[int, pa.Table]
    barrier_offsets: Mapping[int, int]


@dataclass(frozen=True)
class Abort:
    """The aligner gave up checkpoint ``checkpoint_id``; decline it and forward a cancel
    marker. Reported at most once per checkpoint."""

    checkpoint_id: int
    reason: AbortReason
    message: str = ""


Step = Records | Snapshot | Complete | Abort


@dataclass(frozen=True)
class _Control:
    """A decoded barrier or cancel row of *channel* (``offset``: its ``_ckpt_offset``)."""

    channel: int
    offset: int
    event: CheckpointBarrier | CancelCheckpointMarker


@dataclass(frozen=True)
class _EndOfInput:
    """In-band end of a channel, queued behind that channel's buffered rows."""

    channel: int
    end_offset: int


#: What flows through the aligner's queue and buffer: data rows (already projected to the
#: :class:`Records` columns), control rows, and ends of input.
_Item: TypeAlias = "pa.Table | _Control | _EndOfInput"


@dataclass
class _Pending:
    """A checkpoint this aligner has started and neither completed nor aborted."""

    barrier: CheckpointBarrier
    first_arrival_ms: int
    phase: AlignerState
    arrived: dict[int, int]  # channel -> barrier offset (end offset for ended channels)
    # unaligned in-flight rows: (channels collected when captured, their rows)
    captured: list[tuple[frozenset[int], pa.Table]] = field(default_factory=list)
    snapshotted: bool = False  # the Snapshot step was emitted

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id


class BarrierAligner:
    """Aligns the checkpoint barriers of one operator input (see the module docstring).

    Every public method runs synchronously in the task thread and returns the steps to execute,
    in order. Rows handed to :meth:`process` are either returned in :class:`Records` by that call
    or held back (blocked channel, aligned mode) and returned by a later call; across calls each
    data row is emitted exactly once and each channel's rows keep their order."""

    def __init__(
        self,
        channels: Sequence[int],
        mode: AlignmentMode,
        clock: Clock,
        aligned_timeout_ms: int = 0,
    ) -> None:
        chans = tuple(int(c) for c in channels)
        if not chans or len(set(chans)) != len(chans) or min(chans) < 0 or max(chans) >= 2**31:
            raise ConfigError("channels", channels, "distinct int32 channel ids >= 0, not empty")
        if not isinstance(mode, AlignmentMode):
            raise ConfigError("mode", mode, "an AlignmentMode")
        if aligned_timeout_ms < 0 or (aligned_timeout_ms and mode is not AlignmentMode.ALIGNED):
            raise ConfigError(
                "aligned_timeout_ms", aligned_timeout_ms, "0, or > 0 with AlignmentMode.ALIGNED"
            )
        self._channels = tuple(sorted(chans))
        self._mode = mode
        self._clock = clock
        self._timeout_ms = int(aligned_timeout_ms)
        self._schema: pa.Schema | None = None
        self._failed = False
        self._last_barrier: dict[int, int] = dict.fromkeys(self._channels, 0)
        self._ended: dict[int, int] = {}  # channel -> end offset
        self._ending: set[int] = set()  # end_of_input queued behind a blocked channel's buffer
        self._pending: dict[int, _Pending] = {}  # ascending checkpoint ids
        self._max_started = 0
        self._aborted: set[int] = set()  # aborted or cancelled ids above _prune_floor
        self._prune_floor = 0  # every live channel has passed barrier _prune_floor
        self._buffer: list[_Item] = []
        self._buffered_rows = 0
        self._buffered_bytes = 0
        self._released: list[_Item] = []
        self._queue: deque[_Item] = deque()
        self._blocked: frozenset[int] = frozenset()
        self._collecting: frozenset[int] = frozenset()
        self._out: list[Step] = []
        self._records: list[pa.Table] = []
        self._accepted: frozenset[int] = frozenset(self._channels)
        self._accepted_range: tuple[int, int] | None = None
        self._accepted_lut = np.zeros(0, dtype=bool)
        self._refresh_accepted()

    # --- introspection ---------------------------------------------------------------------

    @property
    def channels(self) -> tuple[int, ...]:
        return self._channels

    @property
    def mode(self) -> AlignmentMode:
        return self._mode

    @property
    def state(self) -> AlignerState:
        if self._failed:
            return AlignerState.FAILED
        if self._pending:
            return next(iter(self._pending.values())).phase
        if len(self._ended) == len(self._channels):
            return AlignerState.FINISHED
        return AlignerState.IDLE

    @property
    def pending_checkpoint(self) -> int | None:
        """The oldest pending checkpoint (the only one in the exactly-once modes), or None."""
        return next(iter(self._pending), None)

    @property
    def pending_checkpoints(self) -> tuple[int, ...]:
        """All pending checkpoints, ascending (several only in ``AT_LEAST_ONCE``)."""
        return tuple(self._pending)

    @property
    def blocked_channels(self) -> frozenset[int]:
        """Channels whose rows are currently buffered (aligned mode)."""
        return self._blocked

    @property
    def ended_channels(self) -> frozenset[int]:
        return frozenset(self._ended)

    @property
    def buffered_rows(self) -> int:
        """Rows (data and control) held back for blocked channels."""
        return self._buffered_rows

    @property
    def buffered_bytes(self) -> int:
        return self._buffered_bytes

    # --- public operations -----------------------------------------------------------------

    def process(self, batch: pa.Table | pa.RecordBatch) -> list[Step]:
        """Feed rows read from the input; return the steps to execute now, in order."""
        self._check_usable()
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        try:
            self._admit(table)
            self._check_timeout()
            self._queue.extend(self._split(table))
            self._drain()
        except ProtocolError:
            self._failed = True
            raise
        return self._take_output()

    def tick(self) -> list[Step]:
        """Apply time-based transitions (the aligned timeout) without new input."""
        self._check_usable()
        try:
            self._check_timeout()
            self._drain()
        except ProtocolError:
            self._failed = True
            raise
        return self._take_output()

    def abort(
        self,
        checkpoint_id: int,
        reason: AbortReason = AbortReason.COORDINATOR,
        message: str = "",
    ) -> list[Step]:
        """The coordinator aborted *checkpoint_id*. If pending here it is aborted (an
        :class:`Abort` step, buffers released); otherwise it is remembered so its barriers are
        ignored, and nothing is returned. Idempotent."""
        self._check_usable()
        try:
            self._check_timeout()
            if checkpoint_id in self._pending:
                self._abort_pending(checkpoint_id, reason, message or "aborted by the coordinator")
            elif self._is_undecided(checkpoint_id):
                self._aborted.add(checkpoint_id)
            self._drain()
        except ProtocolError:
            self._failed = True
            raise
        return self._take_output()

    def end_of_input(self, channel: int, end_offset: int) -> list[Step]:
        """Channel *channel* will deliver no more rows; *end_offset* is one past its last data
        row (its number of data rows). Takes effect after the channel's rows already handed to
        :meth:`process` (including rows still buffered). From then on the channel counts as
        having delivered every barrier, at *end_offset*; rows on it are a protocol error."""
        self._check_usable()
        try:
            if channel not in self._last_barrier:
                raise ProtocolError(f"end of input on unknown channel {channel}")
            if channel in self._ended or channel in self._ending:
                raise ProtocolError(f"end of input on channel {channel} twice")
            self._check_timeout()
            self._ending.add(channel)
            self._refresh_accepted()
            self._queue.append(_EndOfInput(channel, int(end_offset)))
            self._drain()
        except ProtocolError:
            self._failed = True
            raise
        return self._take_output()

    # --- input validation ------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failed:
            raise ProtocolError("the aligner failed on a protocol error; restore the task")

    def _admit(self, table: pa.Table) -> None:
        """Check the schema and that every row's channel accepts rows (O(rows) in numpy)."""
        schema = table.schema
        if self._schema is None:
            for f in BARRIER_FIELDS:
                idx = schema.get_field_index(f.name)
                if idx < 0 or not schema.field(idx).type.equals(f.type):
                    raise ProtocolError(f"input lacks barrier column {f.name}: {f.type}")
            self._schema = schema
        elif not schema.equals(self._schema):
            raise ProtocolError(f"input schema changed: {schema} != {self._schema}")
        col = table.column(CHANNEL)
        if col.null_count:
            raise ProtocolError(f"null {CHANNEL}")
        for chunk in col.chunks:
            if not len(chunk):
                continue
            values = chunk.to_numpy()
            if self._channels_accepted(values):
                continue
            bad = sorted(
                {int(v) for v in np.unique(values) if int(v) not in self._accepted}
            )  # error path: unique() is vectorized, the loop runs over distinct channels
            raise ProtocolError(f"rows on unknown or ended channels {bad}")

    def _channels_accepted(self, values: Any) -> bool:
        """Whether every channel id in the int32 array *values* accepts rows (1-2 passes)."""
        accepted = self._accepted_range
        if accepted is not None and accepted[0] == 0:
            # one pass: negative ids wrap around to huge unsigned values
            return int(values.view(np.uint32).max()) <= accepted[1]
        lo, hi = int(values.min()), int(values.max())
        if accepted is not None:
            return lo >= accepted[0] and hi <= accepted[1]
        return lo >= 0 and hi < len(self._accepted_lut) and bool(self._accepted_lut[values].all())

    def _refresh_accepted(self) -> None:
        acc = frozenset(c for c in self._channels if c not in self._ended and c not in self._ending)
        self._accepted = acc
        if acc and max(acc) - min(acc) + 1 == len(acc):
            self._accepted_range = (min(acc), max(acc))
        else:
            self._accepted_range = None
        lut = np.zeros(max(self._channels) + 1, dtype=bool)
        lut[list(acc)] = True
        self._accepted_lut = lut

    # --- the processing loop ---------------------------------------------------------------

    def _split(self, table: pa.Table) -> list[_Item]:
        """Cut *table* into data segments (projected to the Records columns) and decoded
        control rows, in row order. A table without control rows costs a null count."""
        data = table.drop_columns(list(_CONTROL_ONLY_COLUMNS))
        cid = table.column(CHECKPOINT_ID)
        if cid.null_count == table.num_rows:
            return [data] if table.num_rows else []
        idx = pc.indices_nonzero(pc.is_valid(cid))
        ctrl = table.take(idx).select([CHANNEL, OFFSET, KIND, CHECKPOINT_ID, BARRIER_OPTIONS])
        ts = table.column(BARRIER_TS).take(idx).cast(pa.int64())
        items: list[_Item] = []
        pos = 0
        rows = ctrl.append_column(BARRIER_TS, ts).to_pylist()
        for i, row in zip(idx.to_pylist(), rows, strict=True):
            if i > pos:
                items.append(data.slice(pos, i - pos))
            pos = i + 1
            if row[KIND] == RecordKind.DATA.code:
                raise ProtocolError(f"data row with {CHECKPOINT_ID}: {row!r}")
            event = event_from_row(row)
            if event is None:  # pragma: no cover - KIND checked above
                raise ProtocolError(f"not a control row: {row!r}")
            items.append(_Control(int(row[CHANNEL]), int(row[OFFSET]), event))
        if pos < table.num_rows:
            items.append(data.slice(pos))
        return items

    def _drain(self) -> None:
        """Process queued items until the queue is empty. Items of blocked channels go to the
        buffer; buffers released on the way are processed before the rest of the queue (they
        arrived earlier; only per-channel order matters)."""
        self._requeue_released()
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, pa.Table):
                self._route(item)
            elif item.channel in self._blocked:
                self._hold(item)
            elif isinstance(item, _Control):
                self._on_control(item)
            else:
                self._apply_end(item.channel, item.end_offset)
            self._requeue_released()

    def _requeue_released(self) -> None:
        if not self._released:
            return
        merged: list[_Item] = []
        run: list[pa.Table] = []
        for item in self._released:
            if isinstance(item, pa.Table):
                run.append(item)
                continue
            if run:
                merged.append(pa.concat_tables(run))
                run = []
            merged.append(item)
        if run:
            merged.append(pa.concat_tables(run))
        self._released = []
        self._queue.extendleft(reversed(merged))

    def _route(self, seg: pa.Table) -> None:
        """Emit, buffer or capture one segment of data rows (Records columns)."""
        if not seg.num_rows:
            return
        if self._blocked:
            held, passed = self._partition(seg, self._blocked)
            if held is not None:
                self._hold(held)
            if passed is not None:
                self._emit_records(passed)
        elif self._collecting:
            self._emit_records(seg)
            captured, _ = self._partition(seg, self._collecting, rest=False)
            if captured is not None:
                pending = next(iter(self._pending.values()))
                pending.captured.append((self._collecting, captured))
        else:
            self._emit_records(seg)

    def _partition(
        self, seg: pa.Table, channels: frozenset[int], rest: bool = True
    ) -> tuple[pa.Table | None, pa.Table | None]:
        """(rows of *channels*, other rows), None for an empty side; the other rows are only
        computed when *rest*. One mask; no filter when the mask is all-true or all-false."""
        col = seg.column(CHANNEL)
        if len(channels) == 1:
            mask = pc.equal(col, pa.scalar(next(iter(channels)), pa.int32()))
        else:
            lut = np.zeros(self._channels[-1] + 1, dtype=bool)
            lut[list(channels)] = True
            mask = pa.array(lut[col.to_numpy()])
        hits = pc.sum(mask).as_py() or 0
        if hits == 0:
            return None, seg
        if hits == seg.num_rows:
            return seg, None
        return seg.filter(mask), seg.filter(pc.invert(mask)) if rest else None

    def _hold(self, item: _Item) -> None:
        self._buffer.append(item)
        if isinstance(item, pa.Table):
            self._buffered_rows += item.num_rows
            self._buffered_bytes += item.nbytes
        elif isinstance(item, _Control):
            self._buffered_rows += 1

    def _release(self) -> None:
        """Hand the buffer back for reprocessing (picked up by the loop)."""
        self._released.extend(self._buffer)
        self._buffer = []
        self._buffered_rows = 0
        self._buffered_bytes = 0

    # --- control rows ----------------------------------------------------------------------

    def _on_control(self, item: _Control) -> None:
        if isinstance(item.event, CancelCheckpointMarker):
            self._on_cancel(item.channel, item.event.checkpoint_id)
        else:
            self._on_barrier(item.channel, item.offset, item.event)
        self._refresh_routing()

    def _on_barrier(self, channel: int, offset: int, barrier: CheckpointBarrier) -> None:
        n = barrier.checkpoint_id
        if n in self._aborted:
            self._last_barrier[channel] = max(self._last_barrier[channel], n)
            self._prune_aborted()
            return
        if n <= self._last_barrier[channel]:
            raise ProtocolError(
                f"barrier {n} on channel {channel} after barrier {self._last_barrier[channel]}"
            )
        self._last_barrier[channel] = n
        self._prune_aborted()
        pending = self._pending.get(n)
        if pending is not None:
            self._arrive(pending, channel, offset)
            return
        if n <= self._max_started:
            return  # late barrier of a checkpoint skipped here (a newer one started first)
        if self._mode is not AlignmentMode.AT_LEAST_ONCE:
            for old in list(self._pending):
                self._abort_pending(
                    old, AbortReason.SUBSUMED, f"barrier {n} arrived on channel {channel}"
                )
        self._start(barrier, channel, offset)

    def _is_undecided(self, n: int) -> bool:
        """Neither started, skipped, aborted nor forgotten here: a cancel for it is news."""
        return n not in self._aborted and n > max(self._max_started, self._prune_floor)

    def _on_cancel(self, channel: int, n: int) -> None:
        if n in self._pending:
            self._abort_pending(n, AbortReason.CANCELLED, f"cancel marker on channel {channel}")
        elif self._is_undecided(n):
            self._aborted.add(n)
            self._emit(
                Abort(n, AbortReason.CANCELLED, f"cancel marker on channel {channel} (not started)")
            )

    def _prune_aborted(self) -> None:
        """Forget aborted ids every live channel has passed (their barriers can only come again
        as protocol errors now)."""
        live = [b for c, b in self._last_barrier.items() if c not in self._ended]
        if live and min(live) > self._prune_floor:
            self._prune_floor = min(live)
            self._aborted = {n for n in self._aborted if n > self._prune_floor}

    # --- checkpoint lifecycle --------------------------------------------------------------

    def _start(self, barrier: CheckpointBarrier, channel: int, offset: int) -> None:
        now = self._clock.now_ms()
        arrived = dict(self._ended)
        arrived[channel] = offset
        if self._mode is AlignmentMode.AT_LEAST_ONCE:
            phase = AlignerState.TRACKING
        elif barrier.must_align:
            phase = AlignerState.ALIGNING  # savepoints/final checkpoints: never channel state
        elif (
            self._mode is AlignmentMode.UNALIGNED
            or barrier.unaligned
            or (self._timeout_ms > 0 and now - barrier.timestamp_ms >= self._timeout_ms)
        ):
            phase = AlignerState.UNALIGNED_COLLECTING
        else:
            phase = AlignerState.ALIGNING
        pending = _Pending(barrier, now, phase, arrived)
        self._pending[barrier.checkpoint_id] = pending
        self._max_started = barrier.checkpoint_id
        if len(arrived) == len(self._channels):
            self._complete(pending)
        elif phase is AlignerState.UNALIGNED_COLLECTING:
            pending.snapshotted = True
            self._emit(Snapshot(barrier, True, 0, max(0, now - barrier.timestamp_ms)))
        while len(self._pending) > MAX_TRACKED_CHECKPOINTS:
            oldest = next(iter(self._pending))
            self._abort_pending(oldest, AbortReason.SUBSUMED, "too many tracked checkpoints")

    def _arrive(self, pending: _Pending, channel: int, offset: int) -> None:
        pending.arrived[channel] = offset
        if len(pending.arrived) == len(self._channels):
            self._complete(pending)

    def _complete(self, pending: _Pending) -> None:
        now = self._clock.now_ms()
        n = pending.checkpoint_id
        if not pending.snapshotted:
            pending.snapshotted = True
            self._emit(
                Snapshot(
                    pending.barrier,
                    False,
                    now - pending.first_arrival_ms,
                    max(0, pending.first_arrival_ms - pending.barrier.timestamp_ms),
                )
            )
        self._emit(
            Complete(
                n,
                MappingProxyType(self._group_channel_state(pending.captured)),
                MappingProxyType(dict(sorted(pending.arrived.items()))),
            )
        )
        del self._pending[n]
        for old in [m for m in self._pending if m < n]:
            self._abort_pending(old, AbortReason.SUBSUMED, f"checkpoint {n} completed first")
        if pending.phase is AlignerState.ALIGNING:
            self._release()

    def _group_channel_state(
        self, captured: list[tuple[frozenset[int], pa.Table]]
    ) -> dict[int, pa.Table]:
        """Split captured in-flight rows by channel, keeping each channel's order."""
        per_channel: dict[int, list[pa.Table]] = {}
        for channels, rows in captured:
            if len(channels) == 1:
                per_channel.setdefault(next(iter(channels)), []).append(rows)
                continue
            col = rows.column(CHANNEL)
            for c in sorted(channels):
                part = rows.filter(pc.equal(col, pa.scalar(c, pa.int32())))
                if part.num_rows:
                    per_channel.setdefault(c, []).append(part)
        return {
            c: parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            for c, parts in sorted(per_channel.items())
        }

    def _abort_pending(self, n: int, reason: AbortReason, message: str) -> None:
        pending = self._pending.pop(n)
        self._aborted.add(n)
        self._emit(Abort(n, reason, message))
        if pending.phase is AlignerState.ALIGNING:
            self._release()
        self._refresh_routing()

    def _check_timeout(self) -> None:
        if self._timeout_ms <= 0 or not self._pending:
            return
        now = self._clock.now_ms()
        for pending in self._pending.values():
            if (
                pending.phase is AlignerState.ALIGNING
                and not pending.barrier.must_align
                and now - pending.barrier.timestamp_ms >= self._timeout_ms
            ):
                pending.phase = AlignerState.UNALIGNED_COLLECTING
                pending.snapshotted = True
                self._emit(
                    Snapshot(
                        pending.barrier,
                        True,
                        now - pending.first_arrival_ms,
                        max(0, pending.first_arrival_ms - pending.barrier.timestamp_ms),
                    )
                )
                self._release()  # post-barrier rows: processed, not channel state
        self._refresh_routing()

    def _apply_end(self, channel: int, end_offset: int) -> None:
        self._ending.discard(channel)
        self._ended[channel] = end_offset
        self._refresh_accepted()
        for n in list(self._pending):
            pending = self._pending.get(n)
            if pending is not None and channel not in pending.arrived:
                self._arrive(pending, channel, end_offset)
        self._prune_aborted()
        self._refresh_routing()

    def _refresh_routing(self) -> None:
        """Recompute the blocked / collecting channel sets from the pending checkpoint."""
        blocked: frozenset[int] = frozenset()
        collecting: frozenset[int] = frozenset()
        if self._pending and self._mode is not AlignmentMode.AT_LEAST_ONCE:
            pending = next(iter(self._pending.values()))
            if pending.phase is AlignerState.ALIGNING:
                blocked = frozenset(c for c in pending.arrived if c not in self._ended)
            elif pending.phase is AlignerState.UNALIGNED_COLLECTING:
                collecting = frozenset(c for c in self._channels if c not in pending.arrived)
        self._blocked = blocked
        self._collecting = collecting

    # --- output ----------------------------------------------------------------------------

    def _emit_records(self, table: pa.Table) -> None:
        if table.num_rows:
            self._records.append(table)

    def _flush_records(self) -> None:
        """Emit the pending data rows as one :class:`Records`. Its table is contiguous (one
        chunk per column): a table pieced together from segments, buffers and filters is
        combined once here (one copy), so that operators never pay the much higher cost of
        chunk-by-chunk kernels (hash encoding in particular) on every column they touch."""
        if self._records:
            tables = self._records
            self._records = []
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            if table.num_columns and table.column(0).num_chunks > 1:
                table = table.combine_chunks()
            self._out.append(Records(table))

    def _emit(self, step: Step) -> None:
        self._flush_records()
        self._out.append(step)

    def _take_output(self) -> list[Step]:
        self._flush_records()
        out = self._out
        self._out = []
        return out

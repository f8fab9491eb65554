"""Barrier alignment: Flink's ``CheckpointBarrierHandler`` family over Arrow record batches.

One :class:`BarrierAligner` sits in front of one operator input with *N* channels, used by the
one thread of the task that owns it (:mod:`spark_ckpt.runtime.task`): it is not thread-safe,
and it never reads time itself (an injected :class:`~spark_ckpt.protocol.clock.Clock`). The
task hands it the rows it reads (data rows interleaved with barrier and cancel rows, encoded
as in :mod:`spark_ckpt.protocol.barrier`) and executes the ordered :data:`Step` values it
returns:

* :class:`Records` — data rows to feed to the operator now (user columns plus
  ``_ckpt_channel`` and ``_ckpt_offset``); each data row is emitted exactly once, and each
  channel's rows keep their order;
* :class:`Snapshot` — take the synchronous operator snapshot *now*: the state after exactly
  the :class:`Records` returned before it (across calls);
* :class:`Complete` — every channel delivered barrier *n*: the task may acknowledge *n*, with
  the channel state (unaligned checkpoints only) and ``barrier_offsets[ch]``, the offset of
  channel *ch*'s next data row (where a restore rewinds; for a channel that ended before the
  barrier, its end offset);
* :class:`Abort` — the aligner gave up checkpoint *n*; the task declines it and forwards a
  cancel marker downstream. Rows held back for *n* appear in the following :class:`Records`.

Modes (:class:`AlignmentMode`): ``ALIGNED`` (exactly-once; blocks a channel from its barrier
until the last channel's, and with ``aligned_timeout_ms > 0`` switches to unaligned once the
barrier is that old), ``UNALIGNED`` (exactly-once; snapshots at the first barrier, rows of
lagging channels become channel state) and ``AT_LEAST_ONCE`` (Flink's
``CheckpointBarrierTracker``; nothing blocks). Savepoints and final checkpoints are always
aligned, without timeout. The rules in full — timeouts, subsumption, cancel markers, late
barriers, the protocol errors: ``docs/architecture.md``, *Barrier alignment in a subtask*.

A protocol violation raises :class:`~spark_ckpt.errors.ProtocolError`, after which the aligner
is ``FAILED`` and refuses further calls: the task must fail and restore. Control rows are
recognized by a non-null ``_ckpt_checkpoint_id``, so a batch without control rows is
recognized in O(1) (the column's null count) and, with no checkpoint pending, costs a
channel-range check and a column projection.

This class is a facade over :mod:`spark_ckpt.runtime.alignment`: input admission, items, one
queue, and a barrier handler (the exactly-once
:class:`~spark_ckpt.runtime.alignment.single_checkpoint_handler.SingleCheckpointBarrierHandler`
with its states, :mod:`~spark_ckpt.runtime.alignment.barrier_handler_state`, or the
at-least-once :class:`~spark_ckpt.runtime.alignment.barrier_tracker.BarrierTracker`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import pyarrow as pa

from spark_ckpt.errors import ConfigError, ProtocolError
from spark_ckpt.protocol.barrier import CancelCheckpointMarker, ChannelProgress
from spark_ckpt.protocol.clock import Clock
from spark_ckpt.runtime.alignment.admission import InputAdmission
from spark_ckpt.runtime.alignment.aligner_state import AlignerState
from spark_ckpt.runtime.alignment.alignment_context import AlignmentContext
from spark_ckpt.runtime.alignment.alignment_mode import AlignmentMode
from spark_ckpt.runtime.alignment.barrier_handler import BarrierHandler, create_barrier_handler
from spark_ckpt.runtime.alignment.barrier_ledger import BarrierLedger
from spark_ckpt.runtime.alignment.barrier_tracker import MAX_TRACKED_CHECKPOINTS
from spark_ckpt.runtime.alignment.channel_buffer import ChannelBuffer
from spark_ckpt.runtime.alignment.items import ControlRow, EndOfInput, Item, split_items
from spark_ckpt.runtime.alignment.step_output import StepOutput
from spark_ckpt.runtime.alignment.steps import (
    Abort,
    AbortReason,
    Complete,
    Progress,
    Records,
    Snapshot,
    Step,
)

__all__ = [
    "MAX_TRACKED_CHECKPOINTS",
    "Abort",
    "AbortReason",
    "AlignerState",
    "AlignmentMode",
    "BarrierAligner",
    "Complete",
    "Progress",
    "Records",
    "Snapshot",
    "Step",
]


class BarrierAligner:
    """Aligns the checkpoint barriers of one operator input (see the module docstring).

    Every public method runs synchronously in the task thread and returns the steps to execute,
    in order. Rows handed to :meth:`process` are either returned in :class:`Records` by that call
    or held back (blocked channel, aligned mode) and returned by a later call; across calls each
    data row is emitted exactly once and each channel's rows keep their order.

    Lifecycle of the facade itself: usable until a call raises :class:`ProtocolError`, then
    failed for good (every later call raises). The checkpoint lifecycle is the handler's."""

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
        self._admission = InputAdmission(self._channels)
        self._ledger = BarrierLedger(self._channels)
        self._buffer = ChannelBuffer()
        self._output = StepOutput()
        context = AlignmentContext(self._channels, clock, self._ledger, self._buffer, self._output)
        self._handler: BarrierHandler = create_barrier_handler(
            mode, context, int(aligned_timeout_ms)
        )
        self._queue: deque[Item] = deque()
        self._failure: ProtocolError | None = None  # set once: the facade is failed for good

    # --- introspection ---------------------------------------------------------------------

    @property
    def channels(self) -> tuple[int, ...]:
        return self._channels

    @property
    def mode(self) -> AlignmentMode:
        return self._mode

    @property
    def state(self) -> AlignerState:
        if self._failure is not None:
            return AlignerState.FAILED
        phase = self._handler.phase
        if phase is AlignerState.IDLE and self._ledger.all_ended:
            return AlignerState.FINISHED
        return phase

    @property
    def pending_checkpoint(self) -> int | None:
        """The oldest pending checkpoint (the only one in the exactly-once modes), or None."""
        pending = self._handler.pending_checkpoints
        return pending[0] if pending else None

    @property
    def pending_checkpoints(self) -> tuple[int, ...]:
        """All pending checkpoints, ascending (several only in ``AT_LEAST_ONCE``)."""
        return self._handler.pending_checkpoints

    @property
    def blocked_channels(self) -> frozenset[int]:
        """Channels whose rows are currently buffered (aligned mode)."""
        return self._handler.blocked_channels

    @property
    def ended_channels(self) -> frozenset[int]:
        return frozenset(self._ledger.ended)

    @property
    def buffered_rows(self) -> int:
        """Rows (data and control) held back for blocked channels."""
        return self._buffer.rows

    @property
    def buffered_bytes(self) -> int:
        return self._buffer.nbytes

    # --- public operations -----------------------------------------------------------------

    def process(self, batch: pa.Table | pa.RecordBatch) -> list[Step]:
        """Feed rows read from the input; return the steps to execute now, in order."""

        def run() -> None:
            table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
            table = self._admission.admit(table)
            self._handler.check_timeout()
            self._queue.extend(split_items(table))
            self._drain()

        return self._run(run)

    def tick(self) -> list[Step]:
        """Apply time-based transitions (the aligned timeout) without new input."""

        def run() -> None:
            self._handler.check_timeout()
            self._drain()

        return self._run(run)

    def abort(
        self,
        checkpoint_id: int,
        reason: AbortReason = AbortReason.COORDINATOR,
        message: str = "",
    ) -> list[Step]:
        """The coordinator aborted *checkpoint_id*. If pending here it is aborted (an
        :class:`Abort` step, buffers released); otherwise it is remembered so its barriers are
        ignored, and nothing is returned. Idempotent."""

        def run() -> None:
            self._handler.check_timeout()
            aborted = self._handler.abort(
                checkpoint_id, reason, message or "aborted by the coordinator"
            )
            if not aborted and self._ledger.is_undecided(checkpoint_id):
                self._ledger.mark_aborted(checkpoint_id)
            self._drain()

        return self._run(run)

    def end_of_input(self, channel: int, end_offset: int) -> list[Step]:
        """Channel *channel* will deliver no more rows; *end_offset* is one past its last data
        row (its number of data rows). Takes effect after the channel's rows already handed to
        :meth:`process` (including rows still buffered). From then on the channel counts as
        having delivered every barrier, at *end_offset*; rows on it are a protocol error."""

        def run() -> None:
            if not self._admission.knows(channel):
                raise ProtocolError(f"end of input on unknown channel {channel}")
            if self._admission.is_closed(channel):
                raise ProtocolError(f"end of input on channel {channel} twice")
            self._handler.check_timeout()
            self._admission.close(channel)
            self._queue.append(EndOfInput(channel, int(end_offset)))
            self._drain()

        return self._run(run)

    # --- the processing loop ---------------------------------------------------------------

    def _run(self, action: Callable[[], None]) -> list[Step]:
        """Run *action* unless failed; a :class:`ProtocolError` fails the aligner for good."""
        if self._failure is not None:
            raise ProtocolError("the aligner failed on a protocol error; restore the task")
        try:
            action()
        except ProtocolError as exc:
            self._failure = exc
            raise
        return self._output.take()

    def _drain(self) -> None:
        """Process queued items until the queue is empty. Items of blocked channels go to the
        buffer; buffers released on the way are processed before the rest of the queue (they
        arrived earlier; only per-channel order matters)."""
        handler, buffer, queue = self._handler, self._buffer, self._queue
        released = buffer.take_released()
        if released:
            queue.extendleft(reversed(released))
        while queue:
            item = queue.popleft()
            if isinstance(item, pa.Table):
                if item.num_rows:
                    handler.route(item)
            elif item.channel in handler.blocked_channels:
                buffer.hold(item)
            elif isinstance(item, ControlRow):
                self._on_control(item)
            else:
                self._on_end(item)
            released = buffer.take_released()
            if released:
                queue.extendleft(reversed(released))

    def _on_control(self, item: ControlRow) -> None:
        event = item.event
        if isinstance(event, ChannelProgress):  # in channel order, never aligned on
            self._output.emit(Progress(item.channel, item.offset, event))
            return
        n = event.checkpoint_id
        if isinstance(event, CancelCheckpointMarker):
            message = f"cancel marker on channel {item.channel}"
            aborted = self._handler.abort(n, AbortReason.CANCELLED, message)
            if not aborted and self._ledger.is_undecided(n):  # not started yet: remember it
                self._ledger.mark_aborted(n)
                self._output.emit(Abort(n, AbortReason.CANCELLED, f"{message} (not started)"))
        elif self._ledger.admit_barrier(item.channel, n):
            self._handler.barrier_received(item.channel, item.offset, event)

    def _on_end(self, item: EndOfInput) -> None:
        self._ledger.end(item.channel, item.end_offset)
        self._handler.end_of_input(item.channel, item.end_offset)
        self._ledger.prune()

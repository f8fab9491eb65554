"""The lifecycle of the exactly-once barrier handler as state objects (Flink's
``BarrierHandlerState`` implementations).

Each state handles one event and returns the next state (possibly itself); side effects (steps,
buffer hold/release, ledger updates) go through the shared
:class:`~spark_ckpt.runtime.alignment.alignment_context.AlignmentContext`. Transitions::

    WaitingForFirstBarrier[Unaligned|Alternating]      (idle; phase IDLE)
      -- first barrier n, every channel arrived/ended -> Snapshot, Complete; stays
      -- first barrier n, aligned                     -> CollectingBarriers
      -- first barrier n, aligned, timeout configured -> AlternatingCollectingBarriers
      -- first barrier n, unaligned (mode, barrier flag, or timed out already)
                                                      -> Snapshot(unaligned) ->
                                                         CollectingBarriersUnaligned
    CollectingBarriers (phase ALIGNING; arrived channels blocked, their items buffered)
      -- last barrier n / end of input   -> Snapshot, Complete, buffer released -> idle
      -- barrier n flagged unaligned     -> Snapshot(unaligned), buffer released
         (not a savepoint, not final)       -> CollectingBarriersUnaligned, which receives it
      -- abort / cancel n                -> Abort, buffer released -> idle
      -- barrier m > n                   -> Abort(SUBSUMED), buffer released -> idle, which
                                            receives barrier m
    AlternatingCollectingBarriers (a CollectingBarriers that times out)
      -- now - barrier.timestamp_ms >= timeout -> Snapshot(unaligned), buffer released
                                                  -> CollectingBarriersUnaligned
    CollectingBarriersUnaligned (phase UNALIGNED_COLLECTING; snapshot taken; rows of channels
    whose barrier is due are emitted and recorded as channel state)
      -- last barrier n / end of input   -> Complete(channel state) -> idle
      -- abort / cancel n, barrier m > n -> as CollectingBarriers (nothing buffered)

Every collecting state returns to the idle state it was created by, so the mode's start policy
survives checkpoints. Savepoints and final checkpoints (``barrier.must_align``) always go to the
plain :class:`CollectingBarriers` (never channel state, no timeout). Barriers of a checkpoint
older than or equal to the newest started one that is not the pending one are late: ignored in
every state. Protocol checks on barriers happen before a state sees them
(:class:`~spark_ckpt.runtime.alignment.barrier_ledger.BarrierLedger`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import pyarrow as pa

from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.runtime.alignment.aligner_state import AlignerState
from spark_ckpt.runtime.alignment.alignment_context import AlignmentContext
from spark_ckpt.runtime.alignment.channel_partition import partition_rows
from spark_ckpt.runtime.alignment.channel_state import ChannelStateRecorder
from spark_ckpt.runtime.alignment.pending_alignment import PendingAlignment
from spark_ckpt.runtime.alignment.steps import Abort, AbortReason

__all__ = [
    "AlternatingCollectingBarriers",
    "AlternatingWaitingForFirstBarrier",
    "BarrierHandlerState",
    "CollectingBarriers",
    "CollectingBarriersUnaligned",
    "WaitingForFirstBarrier",
    "WaitingForFirstBarrierUnaligned",
]

_NO_CHANNELS: frozenset[int] = frozenset()


class BarrierHandlerState(ABC):
    """One phase of the exactly-once handler. Event methods return the next state; the
    caller replaces its state with it. ``phase`` is what the aligner reports."""

    phase: ClassVar[AlignerState]

    def __init__(self, ctx: AlignmentContext) -> None:
        self._ctx = ctx

    @property
    def pending(self) -> PendingAlignment | None:
        """The checkpoint being aligned, None when idle."""
        return None

    @property
    def blocked_channels(self) -> frozenset[int]:
        """Channels whose items are held back in the channel buffer."""
        return _NO_CHANNELS

    def route(self, rows: pa.Table) -> None:
        """Dispose of a non-empty run of data rows (Records columns): emit by default."""
        self._ctx.output.emit_records(rows)

    @abstractmethod
    def barrier_received(
        self, channel: int, offset: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState:
        """Barrier *barrier* at *offset* of *channel* (already admitted by the ledger)."""

    def abort(self, reason: AbortReason, message: str) -> BarrierHandlerState:
        """Give up the pending checkpoint (only called when one is pending)."""
        return self

    def end_of_input(self, channel: int, end_offset: int) -> BarrierHandlerState:
        """*channel* ended at *end_offset* (already recorded in the ledger)."""
        return self

    def check_timeout(self) -> BarrierHandlerState:
        """Apply the aligned-checkpoint timeout, if this state has one."""
        return self


def _emit_aligned_completion(ctx: AlignmentContext, pending: PendingAlignment) -> None:
    """Snapshot (aligned, at the clock's now) then Complete without channel state."""
    ctx.output.emit(pending.snapshot(ctx.clock.now_ms(), unaligned=False))
    ctx.output.emit(pending.complete({}))


# --- idle states -----------------------------------------------------------------------------


class WaitingForFirstBarrier(BarrierHandlerState):
    """Idle, ``ALIGNED`` mode without timeout: a first barrier starts an aligned checkpoint
    unless its ``unaligned`` flag is set (and it is neither a savepoint nor final)."""

    phase = AlignerState.IDLE

    def barrier_received(
        self, channel: int, offset: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState:
        if barrier.checkpoint_id <= self._ctx.ledger.max_started:
            return self  # late barrier of a checkpoint skipped here (a newer one started first)
        pending = self._ctx.start(barrier, channel, offset)
        if pending.is_complete:  # every other channel has ended
            _emit_aligned_completion(self._ctx, pending)
            return self
        return self._collect(pending)

    def _collect(self, pending: PendingAlignment) -> BarrierHandlerState:
        """The state collecting the remaining barriers of *pending* (the start policy)."""
        barrier = pending.barrier
        if barrier.unaligned and not barrier.must_align:
            return self._collect_unaligned(pending)
        return CollectingBarriers(self._ctx, pending, self)

    def _collect_unaligned(self, pending: PendingAlignment) -> BarrierHandlerState:
        self._ctx.output.emit(pending.snapshot(pending.first_arrival_ms, unaligned=True))
        return CollectingBarriersUnaligned(self._ctx, pending, self)


class WaitingForFirstBarrierUnaligned(WaitingForFirstBarrier):
    """Idle, ``UNALIGNED`` mode: a first barrier takes the snapshot at once, except for
    savepoints and final checkpoints, which are aligned."""

    def _collect(self, pending: PendingAlignment) -> BarrierHandlerState:
        if pending.barrier.must_align:
            return CollectingBarriers(self._ctx, pending, self)
        return self._collect_unaligned(pending)


class AlternatingWaitingForFirstBarrier(WaitingForFirstBarrier):
    """Idle, ``ALIGNED`` mode with an aligned-checkpoint timeout (> 0 ms): a first barrier that
    is already ``timeout_ms`` old when it arrives (``first_arrival - timestamp >= timeout``),
    or flagged unaligned, starts unaligned; otherwise aligned with the timeout armed.
    Savepoints and final checkpoints are aligned without timeout."""

    def __init__(self, ctx: AlignmentContext, timeout_ms: int) -> None:
        super().__init__(ctx)
        self._timeout_ms = timeout_ms

    def _collect(self, pending: PendingAlignment) -> BarrierHandlerState:
        barrier = pending.barrier
        if barrier.must_align:
            return CollectingBarriers(self._ctx, pending, self)
        if barrier.unaligned or pending.first_arrival_ms - barrier.timestamp_ms >= self._timeout_ms:
            return self._collect_unaligned(pending)
        return AlternatingCollectingBarriers(self._ctx, pending, self, self._timeout_ms)


# --- collecting states -----------------------------------------------------------------------


class _CollectingState(BarrierHandlerState):
    """A checkpoint is pending; completion, abort and subsumption return to *idle*."""

    def __init__(
        self, ctx: AlignmentContext, pending: PendingAlignment, idle: WaitingForFirstBarrier
    ) -> None:
        super().__init__(ctx)
        self._pending = pending
        self._idle = idle

    @property
    def pending(self) -> PendingAlignment:
        return self._pending

    def barrier_received(
        self, channel: int, offset: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState:
        n = barrier.checkpoint_id
        if n == self._pending.checkpoint_id:
            self._pending.arrive(channel, offset)
            return self._after_arrival()
        if n <= self._ctx.ledger.max_started:
            return self  # late barrier of a checkpoint skipped here
        idle = self.abort(AbortReason.SUBSUMED, f"barrier {n} arrived on channel {channel}")
        return idle.barrier_received(channel, offset, barrier)

    def abort(self, reason: AbortReason, message: str) -> BarrierHandlerState:
        n = self._pending.checkpoint_id
        self._ctx.ledger.mark_aborted(n)
        self._ctx.output.emit(Abort(n, reason, message))
        self._leave()
        return self._idle

    def end_of_input(self, channel: int, end_offset: int) -> BarrierHandlerState:
        if channel in self._pending.arrived:
            return self
        self._pending.arrive(channel, end_offset)
        return self._after_arrival()

    def _after_arrival(self) -> BarrierHandlerState:
        if not self._pending.is_complete:
            self._arrivals_changed()
            return self
        self._complete()
        return self._idle

    @abstractmethod
    def _arrivals_changed(self) -> None:
        """A channel arrived; the checkpoint is not complete yet."""

    @abstractmethod
    def _complete(self) -> None:
        """Emit the completion steps (every channel arrived) and leave the state."""

    @abstractmethod
    def _leave(self) -> None:
        """Undo the state's hold on the input (on abort)."""


class CollectingBarriers(_CollectingState):
    """Aligned checkpoint pending: channels that delivered the barrier are blocked (their data,
    control rows and ends of input are held in the channel buffer, in arrival order); the
    snapshot is taken when the last channel delivers it. Leaving releases the buffer: the held
    items go through the aligner again, after the completion steps."""

    phase = AlignerState.ALIGNING

    def __init__(
        self, ctx: AlignmentContext, pending: PendingAlignment, idle: WaitingForFirstBarrier
    ) -> None:
        super().__init__(ctx, pending, idle)
        self._blocked = self._arrived_live_channels()

    @property
    def blocked_channels(self) -> frozenset[int]:
        return self._blocked

    def route(self, rows: pa.Table) -> None:
        held, passed = partition_rows(rows, self._blocked, self._ctx.lut_size)
        if held is not None:
            self._ctx.buffer.hold(held)
        if passed is not None:
            self._ctx.output.emit_records(passed)

    def barrier_received(
        self, channel: int, offset: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState:
        """As :class:`_CollectingState`, except that a barrier of the pending checkpoint that
        arrives flagged unaligned (an upstream that timed out, or any input whose barrier
        was cut) switches the checkpoint to unaligned at once, as Flink's alternating
        handler does (``AlternatingCheckpointsTest.testTimeoutAlignmentOnUnalignedCheckpoint``):
        the snapshot is taken now, the buffer is released, and the rest is collected as
        channel state. Savepoints and final checkpoints stay aligned."""
        if (
            barrier.checkpoint_id == self._pending.checkpoint_id
            and barrier.unaligned
            and not self._pending.barrier.must_align
        ):
            return self._to_unaligned().barrier_received(channel, offset, barrier)
        return super().barrier_received(channel, offset, barrier)

    def _to_unaligned(self) -> CollectingBarriersUnaligned:
        """Take the pending checkpoint's snapshot now (alignment time up to the switch),
        release the buffer (the blocked channels' post-barrier rows are processed, they are
        not channel state) and go on collecting unaligned."""
        self._ctx.output.emit(self._pending.snapshot(self._ctx.clock.now_ms(), unaligned=True))
        self._ctx.buffer.release()
        return CollectingBarriersUnaligned(self._ctx, self._pending, self._idle)

    def _arrived_live_channels(self) -> frozenset[int]:
        ended = self._ctx.ledger.ended
        return frozenset(c for c in self._pending.arrived if c not in ended)

    def _arrivals_changed(self) -> None:
        self._blocked = self._arrived_live_channels()

    def _complete(self) -> None:
        _emit_aligned_completion(self._ctx, self._pending)
        self._ctx.buffer.release()

    def _leave(self) -> None:
        self._ctx.buffer.release()


class AlternatingCollectingBarriers(CollectingBarriers):
    """A :class:`CollectingBarriers` with the aligned-checkpoint timeout armed: once
    ``now - barrier.timestamp_ms >= timeout_ms`` it takes the snapshot unaligned (alignment
    time up to the switch), releases the buffer (the blocked channels' post-barrier rows are
    processed, they are not channel state) and goes on as :class:`CollectingBarriersUnaligned`.
    """

    def __init__(
        self,
        ctx: AlignmentContext,
        pending: PendingAlignment,
        idle: WaitingForFirstBarrier,
        timeout_ms: int,
    ) -> None:
        super().__init__(ctx, pending, idle)
        self._timeout_ms = timeout_ms

    def check_timeout(self) -> BarrierHandlerState:
        if self._ctx.clock.now_ms() - self._pending.barrier.timestamp_ms < self._timeout_ms:
            return self
        return self._to_unaligned()


class CollectingBarriersUnaligned(_CollectingState):
    """Unaligned checkpoint pending, its snapshot already taken: nothing blocks; rows of the
    channels that have not delivered the barrier yet are emitted **and** recorded as channel
    state, which :class:`~spark_ckpt.runtime.alignment.steps.Complete` carries."""

    phase = AlignerState.UNALIGNED_COLLECTING

    def __init__(
        self, ctx: AlignmentContext, pending: PendingAlignment, idle: WaitingForFirstBarrier
    ) -> None:
        super().__init__(ctx, pending, idle)
        self._recorder = ChannelStateRecorder()
        self._collecting = self._due_channels()

    def route(self, rows: pa.Table) -> None:
        self._ctx.output.emit_records(rows)
        captured, _ = partition_rows(rows, self._collecting, self._ctx.lut_size, rest=False)
        if captured is not None:
            self._recorder.record(self._collecting, captured)

    def _due_channels(self) -> frozenset[int]:
        arrived = self._pending.arrived
        return frozenset(c for c in self._ctx.channels if c not in arrived)

    def _arrivals_changed(self) -> None:
        self._collecting = self._due_channels()

    def _complete(self) -> None:
        self._ctx.output.emit(self._pending.complete(self._recorder.channel_state()))

    def _leave(self) -> None:
        pass  # nothing held back

"""The at-least-once barrier handler (Flink's ``CheckpointBarrierTracker``)."""

from __future__ import annotations

import pyarrow as pa

from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.runtime.alignment.aligner_state import AlignerState
from spark_ckpt.runtime.alignment.alignment_context import AlignmentContext
from spark_ckpt.runtime.alignment.pending_alignment import PendingAlignment
from spark_ckpt.runtime.alignment.steps import Abort, AbortReason

__all__ = ["MAX_TRACKED_CHECKPOINTS", "BarrierTracker"]

#: Concurrent checkpoints an ``AT_LEAST_ONCE`` aligner tracks; older ones are aborted (as Flink).
MAX_TRACKED_CHECKPOINTS = 50

_NO_CHANNELS: frozenset[int] = frozenset()


class BarrierTracker:
    """Tracks barriers without blocking anything: every data row is emitted at once.

    A checkpoint starts at its first barrier newer than every started one (older ones are late
    and ignored) and completes when the last channel delivered it (or ended): then
    ``Snapshot`` (aligned, so it also holds post-barrier rows of the early channels: the
    at-least-once contract) and ``Complete`` without channel state, and every older tracked
    checkpoint is aborted (``SUBSUMED``: it can no longer complete). Several checkpoints may be
    tracked at once, at most :data:`MAX_TRACKED_CHECKPOINTS`; starting one more aborts the
    oldest. Barriers' ``unaligned`` flags are ignored; there is no timeout."""

    def __init__(self, ctx: AlignmentContext) -> None:
        self._ctx = ctx
        self._pending: dict[int, PendingAlignment] = {}  # ascending checkpoint ids

    @property
    def phase(self) -> AlignerState:
        return AlignerState.TRACKING if self._pending else AlignerState.IDLE

    @property
    def pending_checkpoints(self) -> tuple[int, ...]:
        return tuple(self._pending)

    @property
    def blocked_channels(self) -> frozenset[int]:
        return _NO_CHANNELS

    def route(self, rows: pa.Table) -> None:
        self._ctx.output.emit_records(rows)

    def barrier_received(self, channel: int, offset: int, barrier: CheckpointBarrier) -> None:
        n = barrier.checkpoint_id
        pending = self._pending.get(n)
        if pending is not None:
            self._arrive(pending, channel, offset)
            return
        if n <= self._ctx.ledger.max_started:
            return  # late barrier of a checkpoint skipped here (a newer one started first)
        pending = self._ctx.start(barrier, channel, offset)
        self._pending[n] = pending
        if pending.is_complete:
            self._complete(pending)
        while len(self._pending) > MAX_TRACKED_CHECKPOINTS:
            self._abort(
                next(iter(self._pending)), AbortReason.SUBSUMED, "too many tracked checkpoints"
            )

    def abort(self, checkpoint_id: int, reason: AbortReason, message: str) -> bool:
        if checkpoint_id not in self._pending:
            return False
        self._abort(checkpoint_id, reason, message)
        return True

    def end_of_input(self, channel: int, end_offset: int) -> None:
        for n in list(self._pending):
            pending = self._pending.get(n)  # completing one aborts the older ones
            if pending is not None and channel not in pending.arrived:
                self._arrive(pending, channel, end_offset)

    def check_timeout(self) -> None:
        """No aligned-checkpoint timeout in at-least-once mode."""

    def _arrive(self, pending: PendingAlignment, channel: int, offset: int) -> None:
        pending.arrive(channel, offset)
        if pending.is_complete:
            self._complete(pending)

    def _complete(self, pending: PendingAlignment) -> None:
        n = pending.checkpoint_id
        self._ctx.output.emit(pending.snapshot(self._ctx.clock.now_ms(), unaligned=False))
        self._ctx.output.emit(pending.complete({}))
        del self._pending[n]
        for old in [m for m in self._pending if m < n]:
            self._abort(old, AbortReason.SUBSUMED, f"checkpoint {n} completed first")

    def _abort(self, checkpoint_id: int, reason: AbortReason, message: str) -> None:
        del self._pending[checkpoint_id]
        self._ctx.ledger.mark_aborted(checkpoint_id)
        self._ctx.output.emit(Abort(checkpoint_id, reason, message))

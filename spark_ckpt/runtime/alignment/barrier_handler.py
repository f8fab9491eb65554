"""The interface between the aligner facade and its barrier handler, and the choice of
handler by alignment mode."""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.runtime.alignment.aligner_state import AlignerState
from spark_ckpt.runtime.alignment.alignment_context import AlignmentContext
from spark_ckpt.runtime.alignment.alignment_mode import AlignmentMode
from spark_ckpt.runtime.alignment.barrier_handler_state import (
    AlternatingWaitingForFirstBarrier,
    WaitingForFirstBarrier,
    WaitingForFirstBarrierUnaligned,
)
from spark_ckpt.runtime.alignment.barrier_tracker import BarrierTracker
from spark_ckpt.runtime.alignment.single_checkpoint_handler import (
    SingleCheckpointBarrierHandler,
)
from spark_ckpt.runtime.alignment.steps import AbortReason

__all__ = ["BarrierHandler", "create_barrier_handler"]


class BarrierHandler(Protocol):
    """What the facade drives. Events arrive in per-channel order, already checked: barriers
    admitted by the :class:`~spark_ckpt.runtime.alignment.barrier_ledger.BarrierLedger`, ends
    recorded in it. Steps go to the context's output."""

    @property
    def phase(self) -> AlignerState:
        """``IDLE`` when nothing is pending, else the oldest pending checkpoint's phase."""
        ...

    @property
    def pending_checkpoints(self) -> tuple[int, ...]:
        """Pending checkpoint ids, ascending."""
        ...

    @property
    def blocked_channels(self) -> frozenset[int]:
        """Channels whose items (of any kind) must go to the channel buffer."""
        ...

    def route(self, rows: pa.Table) -> None:
        """Emit, hold or record a non-empty run of data rows (Records columns)."""
        ...

    def barrier_received(self, channel: int, offset: int, barrier: CheckpointBarrier) -> None: ...

    def abort(self, checkpoint_id: int, reason: AbortReason, message: str) -> bool:
        """Abort *checkpoint_id* if pending (an ``Abort`` step); False if it is not."""
        ...

    def end_of_input(self, channel: int, end_offset: int) -> None: ...

    def check_timeout(self) -> None: ...


def create_barrier_handler(
    mode: AlignmentMode, ctx: AlignmentContext, aligned_timeout_ms: int
) -> BarrierHandler:
    """The handler for *mode*: the at-least-once tracker, or the exactly-once handler starting
    in the idle state of *mode* (the alternating one when ``ALIGNED`` with a timeout > 0)."""
    if mode is AlignmentMode.AT_LEAST_ONCE:
        return BarrierTracker(ctx)
    if mode is AlignmentMode.UNALIGNED:
        return SingleCheckpointBarrierHandler(WaitingForFirstBarrierUnaligned(ctx))
    if aligned_timeout_ms > 0:
        return SingleCheckpointBarrierHandler(
            AlternatingWaitingForFirstBarrier(ctx, aligned_timeout_ms)
        )
    return SingleCheckpointBarrierHandler(WaitingForFirstBarrier(ctx))

"""What the barrier handlers and their states act on (Flink's ``CheckpointBarrierHandler``
controller): the channels, the clock, the barrier ledger, the channel buffer, the output."""

from __future__ import annotations

from dataclasses import dataclass

from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.protocol.clock import Clock
from spark_ckpt.runtime.alignment.barrier_ledger import BarrierLedger
from spark_ckpt.runtime.alignment.channel_buffer import ChannelBuffer
from spark_ckpt.runtime.alignment.pending_alignment import PendingAlignment
from spark_ckpt.runtime.alignment.step_output import StepOutput

__all__ = ["AlignmentContext"]


@dataclass(frozen=True)
class AlignmentContext:
    """Shared by the handler and every state of one aligner. ``channels``: ascending."""

    channels: tuple[int, ...]
    clock: Clock
    ledger: BarrierLedger
    buffer: ChannelBuffer
    output: StepOutput

    @property
    def lut_size(self) -> int:
        """Size of a channel lookup table (largest channel id + 1)."""
        return self.channels[-1] + 1

    def start(self, barrier: CheckpointBarrier, channel: int, offset: int) -> PendingAlignment:
        """Start checkpoint ``barrier.checkpoint_id`` on its first barrier (on *channel* at
        *offset*), now: the ended channels count as arrived at their end offsets."""
        arrived = dict(self.ledger.ended)
        arrived[channel] = offset
        pending = PendingAlignment(barrier, self.clock.now_ms(), arrived, len(self.channels))
        self.ledger.mark_started(barrier.checkpoint_id)
        return pending

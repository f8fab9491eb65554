"""What a barrier aligner returns: the ordered steps the task executes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

import pyarrow as pa

from spark_ckpt.protocol.barrier import ChannelProgress, CheckpointBarrier

__all__ = ["Abort", "AbortReason", "Complete", "Progress", "Records", "Snapshot", "Step"]


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


@dataclass(frozen=True)
class Progress:
    """Channel *channel*'s progress (event time, idleness, processing time) as of *offset*,
    after its records before it: the task's watermark valve takes it."""

    channel: int
    offset: int
    progress: ChannelProgress


Step = Records | Snapshot | Complete | Abort | Progress

"""A checkpoint an aligner has started and neither completed nor aborted."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import pyarrow as pa

from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.runtime.alignment.steps import Complete, Snapshot

__all__ = ["PendingAlignment"]


class PendingAlignment:
    """The barrier arrivals of one started checkpoint.

    ``arrived``: channel -> barrier offset (the ``_ckpt_offset`` of its barrier row, i.e. of its
    next data row), or end offset for a channel that ended before delivering the barrier.
    Channels that had ended when the checkpoint started count as arrived from the start.
    Complete once every one of ``channel_count`` channels arrived."""

    def __init__(
        self,
        barrier: CheckpointBarrier,
        first_arrival_ms: int,
        arrived: dict[int, int],
        channel_count: int,
    ) -> None:
        self.barrier = barrier
        self.first_arrival_ms = first_arrival_ms
        self._arrived = arrived
        self._channel_count = channel_count

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id

    @property
    def arrived(self) -> Mapping[int, int]:
        return self._arrived

    @property
    def is_complete(self) -> bool:
        return len(self._arrived) == self._channel_count

    def arrive(self, channel: int, offset: int) -> None:
        self._arrived[channel] = offset

    def snapshot(self, now_ms: int, unaligned: bool) -> Snapshot:
        """The :class:`Snapshot` step taken at *now_ms* (alignment time since the first arrival,
        0 when taken at the first arrival; start delay clamped at 0)."""
        return Snapshot(
            self.barrier,
            unaligned,
            now_ms - self.first_arrival_ms,
            max(0, self.first_arrival_ms - self.barrier.timestamp_ms),
        )

    def complete(self, channel_state: dict[int, pa.Table]) -> Complete:
        """The :class:`Complete` step (barrier offsets in ascending channel order)."""
        return Complete(
            self.checkpoint_id,
            MappingProxyType(channel_state),
            MappingProxyType(dict(sorted(self._arrived.items()))),
        )

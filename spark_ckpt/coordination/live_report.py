"""What a running coordinator says about itself while it runs: the checkpoints in progress
and how far each source channel has been read against how far its input goes.

Flink's web UI reads both from the JobManager's memory. Here nothing but the pipeline's
root is shared, so the coordinator's heartbeat record (:mod:`spark_ckpt.coordination.heartbeats`),
rewritten every second anyway, carries a :class:`LiveReport`: no extra request on an object
store, and the report is as fresh as the liveness it rides on. A stopped pipeline has none;
its finished checkpoints are in the statistics history.

Built in the source runner (:class:`~spark_ckpt.coordination.host_thread.HostThread`), read by
the checkpoint page and ``/metrics`` (:mod:`spark_ckpt.monitoring`). Frozen values with an
explicit JSON form; a reader ignores fields it does not know, so a newer writer's record
stays readable after a rollback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spark_ckpt.protocol.barrier import SnapshotType


@dataclass(frozen=True)
class InProgress:
    """A checkpoint triggered and not finished yet: *acknowledged* of *total* subtasks."""

    checkpoint_id: int
    snapshot_type: SnapshotType
    trigger_ms: int
    acknowledged: int
    total: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "type": self.snapshot_type.value,
            "trigger_ms": self.trigger_ms,
            "acknowledged": self.acknowledged,
            "total": self.total,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> InProgress:
        return InProgress(
            int(d["checkpoint_id"]),
            SnapshotType(d["type"]),
            int(d["trigger_ms"]),
            int(d["acknowledged"]),
            int(d["total"]),
        )


@dataclass(frozen=True)
class ChannelProgress:
    """One source channel: *position*, where the last planned micro-batch ends, and *head*,
    where its input ends as the source runner last saw it (in the source's own position
    units: rows for the generator, Delta and files sources, offsets for Kafka). *start*:
    its position when the run started."""

    channel: int
    start: int
    position: int
    head: int

    @property
    def pending(self) -> int:
        """Input not read yet (Flink's ``pendingRecords``), never negative."""
        return max(0, self.head - self.position)

    @property
    def read(self) -> int:
        """Input read by this run."""
        return max(0, self.position - self.start)

    def to_dict(self) -> dict[str, int]:
        return {
            "channel": self.channel,
            "start": self.start,
            "position": self.position,
            "head": self.head,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ChannelProgress:
        return ChannelProgress(
            int(d["channel"]), int(d["start"]), int(d["position"]), int(d["head"])
        )


@dataclass(frozen=True)
class LiveReport:
    """The running coordinator of run *run_id* at *at_ms*: checkpoints in progress (oldest
    first) and the source channels' progress (empty before the first micro-batch is
    planned)."""

    run_id: str
    at_ms: int
    in_progress: tuple[InProgress, ...] = ()
    channels: tuple[ChannelProgress, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "at_ms": self.at_ms,
            "in_progress": [p.to_dict() for p in self.in_progress],
            "channels": [c.to_dict() for c in self.channels],
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> LiveReport:
        return LiveReport(
            str(d["run_id"]),
            int(d["at_ms"]),
            tuple(InProgress.from_dict(p) for p in d.get("in_progress", [])),
            tuple(ChannelProgress.from_dict(c) for c in d.get("channels", [])),
        )


def channel_progress(
    starts: Sequence[int], positions: Sequence[int], heads: Sequence[int]
) -> tuple[ChannelProgress, ...]:
    """The progress of each channel from three position vectors of equal length."""
    return tuple(
        ChannelProgress(c, s, p, h)
        for c, (s, p, h) in enumerate(zip(starts, positions, heads, strict=True))
    )

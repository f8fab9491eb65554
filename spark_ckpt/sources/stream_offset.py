"""The offsets ``ckpt-source`` hands to Spark, and how barriers are placed and aligned in them
(in the source runner's ``latestOffset``; a micro-batch's rows follow from its two offsets).

Each channel (one source split) is an ordered log. A :class:`StreamOffset` — what Spark writes
to its offset log as the end of a micro-batch — records per channel ``positions[c]`` (rows
``[0, positions[c])`` belong to batches up to here), ``emitted[c]`` (the id of the last barrier
emitted on *c*, 0 = none) and the ``barriers`` placed that some batch has yet to emit, each with
its position on every channel (a barrier at position *p* sits before data row *p*).

Placement (:class:`BarrierPlacement`) of an aligned barrier: ``read`` (the default) at the end
of the micro-batch being planned, where a Flink source emits its barrier, so a checkpoint
completes with that micro-batch however deep the backlog; ``head`` at every channel's last
produced row, so under a read limit a channel with a deeper backlog reaches it later.

Alignment (:class:`SourceAlignment`) happens here, at the source (``docs/design/executors.md``,
decision 1): a channel that has reached a barrier not emitted yet is held there until every
channel has, and the batch in which the last one does emits it on every channel, after each
channel's rows. So a checkpoint falls on a micro-batch boundary, identically on every subtask,
and no subtask carries buffered rows from one micro-batch to the next. An unaligned barrier,
and any barrier under at-least-once, goes at the read position and does not wait; an aligned
barrier still waiting after the aligned-checkpoint timeout is *cut* there on every lagging
channel and becomes unaligned (the rows in flight stay in the replayable channel: channel
state by reference). Savepoints and final checkpoints always wait. The process, step by
step: ``docs/architecture.md``, *One checkpoint, step by step*, 1 and 2.

Event time: when the pipeline keeps it, every end offset also records the micro-batch's
processing time (``batch_ms``, the source runner's clock when it planned the batch) and the
channels the source found idle (``idle``), and the batch emits a progress row after each
channel's data rows (:class:`~spark_ckpt.protocol.barrier.ChannelProgress`); a batch may then
carry no row at all, only the progress of the time that passed (a *tick*).

Replay guarantee: the micro-batch ``(start, end]`` emits on channel *c* the data rows
``[start.positions[c], end.positions[c])``, then its progress (when ``end.batch_ms`` is set)
and every barrier with ``start.emitted[c] < id <= end.emitted[c]``, each before the data row
at its position. This is a pure function of the two offsets, so a batch Spark replays from its
offset log emits identical rows, progress and barriers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from spark_ckpt.errors import ProtocolError
from spark_ckpt.protocol.barrier import ChannelProgress, CheckpointBarrier, SnapshotType

FORMAT_VERSION = 1


class BarrierPlacement(Enum):
    """Where ``latestOffset`` places the barriers it takes (see the module docstring)."""

    READ = "read"
    HEAD = "head"

    def positions(
        self, positions: Sequence[int], heads: Sequence[int], max_rows: int | None
    ) -> list[int]:
        """Per-channel barrier positions for a batch starting at *positions*, given the
        channels' *heads* and the batch's read limit: the batch's end (:func:`fair_limits`)
        for ``READ``, the heads for ``HEAD``. A barrier at position *p* sits before data row
        *p*, so one at the batch's end is emitted by that batch, after its last row."""
        return fair_limits(positions, heads, None if self is BarrierPlacement.HEAD else max_rows)


@dataclass(frozen=True)
class PlacedBarrier:
    barrier: CheckpointBarrier
    positions: tuple[int, ...]

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.barrier.checkpoint_id,
            "ts": self.barrier.timestamp_ms,
            "type": self.barrier.snapshot_type.value,
            "unaligned": self.barrier.unaligned,
            "final": self.barrier.final,
            "positions": list(self.positions),
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> PlacedBarrier:
        return PlacedBarrier(
            CheckpointBarrier(
                int(d["id"]),
                int(d["ts"]),
                SnapshotType(d["type"]),
                bool(d["unaligned"]),
                bool(d.get("final", False)),
            ),
            tuple(int(p) for p in d["positions"]),
        )


@dataclass(frozen=True)
class ChannelSlice:
    """What one micro-batch emits on one channel: data rows ``[start, end)``, its progress
    after them (None: the pipeline keeps no event time) and barriers ``(position, barrier)`` in
    position order (a barrier at *p* goes before data row *p*)."""

    channel: int
    start: int
    end: int
    barriers: tuple[tuple[int, CheckpointBarrier], ...] = ()
    progress: ChannelProgress | None = None


@dataclass(frozen=True)
class StreamOffset:
    positions: tuple[int, ...]
    emitted: tuple[int, ...]
    barriers: tuple[PlacedBarrier, ...] = ()
    #: event time (see the module docstring): the batch's processing time (0: not kept) and
    #: the channels found idle when it was planned
    batch_ms: int = 0
    idle: tuple[int, ...] = ()
    #: the version of each lookup table (by path) the batch joins with (see
    #: :class:`~spark_ckpt.protocol.barrier.ChannelProgress`)
    lookups: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if len(self.positions) != len(self.emitted):
            raise ProtocolError("positions and emitted must cover the same channels")
        for b in self.barriers:
            if len(b.positions) != len(self.positions):
                raise ProtocolError(f"barrier {b.checkpoint_id} does not cover every channel")

    @property
    def channels(self) -> int:
        return len(self.positions)

    @staticmethod
    def initial(positions: Sequence[int], last_checkpoint_id: int = 0) -> StreamOffset:
        """Where a (restored) stream starts: at *positions*, with every barrier up to
        *last_checkpoint_id* considered emitted."""
        return StreamOffset(tuple(positions), tuple(last_checkpoint_id for _ in positions))

    @property
    def last_barrier_id(self) -> int:
        return max([b.checkpoint_id for b in self.barriers] + list(self.emitted), default=0)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "positions": list(self.positions),
            "emitted": list(self.emitted),
            "barriers": [b.to_dict() for b in self.barriers],
        }
        if self.batch_ms:  # only with event time: other offsets stay as they were
            d["time"] = self.batch_ms
            d["idle"] = list(self.idle)
        if self.lookups:
            d["lookups"] = dict(self.lookups)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> StreamOffset:
        try:
            if int(d.get("v", 0)) != FORMAT_VERSION:
                raise ProtocolError(f"unsupported ckpt-source offset version {d.get('v')!r}")
            return StreamOffset(
                tuple(int(p) for p in d["positions"]),
                tuple(int(e) for e in d["emitted"]),
                tuple(PlacedBarrier.from_dict(b) for b in d.get("barriers", ())),
                int(d.get("time", 0)),
                tuple(int(c) for c in d.get("idle", ())),
                tuple(sorted((str(p), int(v)) for p, v in dict(d.get("lookups") or {}).items())),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"not a ckpt-source offset: {d!r}") from e

    @staticmethod
    def from_json(text: str) -> StreamOffset:
        try:
            return StreamOffset.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise ProtocolError(f"not a ckpt-source offset: {text!r}") from e

    # -- moving forward ----------------------------------------------------------------------
    def place(self, barrier: CheckpointBarrier, heads: Sequence[int]) -> StreamOffset:
        """Place *barrier* at *heads* (clamped to at least the current positions)."""
        if barrier.checkpoint_id <= self.last_barrier_id:
            raise ProtocolError(
                f"barrier {barrier.checkpoint_id} is not newer than {self.last_barrier_id}"
            )
        if len(heads) != self.channels:
            raise ProtocolError("heads must cover every channel")
        previous = [b.positions for b in self.barriers]
        positions = tuple(
            max(h, p, *(prev[c] for prev in previous))
            for c, (h, p) in enumerate(zip(heads, self.positions, strict=True))
        )
        return StreamOffset(
            self.positions, self.emitted, (*self.barriers, PlacedBarrier(barrier, positions))
        )

    def advance(self, limits: Sequence[int]) -> StreamOffset:
        """The next end offset: channel *c* moves towards ``limits[c]`` (never backwards), but
        not beyond the oldest barrier not yet emitted (its channel is *held* there); a barrier
        that every channel has reached is emitted on every channel at once, and the batch
        ends there. Barriers emitted before this batch are dropped."""
        pending = self.pending()
        hold = pending[0].positions if pending else None
        positions = tuple(
            max(p, lim if hold is None else min(lim, hold[c]))
            for c, (p, lim) in enumerate(zip(self.positions, limits, strict=True))
        )
        emitted = list(self.emitted)
        for b in pending:
            if any(pos < at for pos, at in zip(positions, b.positions, strict=True)):
                break  # not reached everywhere yet: it and every later barrier wait
            emitted = [max(e, b.checkpoint_id) for e in emitted]
        floor = min(self.emitted, default=0)
        kept = tuple(b for b in self.barriers if b.checkpoint_id > floor)
        return StreamOffset(positions, tuple(emitted), kept)

    def pending(self) -> list[PlacedBarrier]:
        """The barriers placed but not yet emitted on every channel, oldest first."""
        return [b for b in self.barriers if any(b.checkpoint_id > e for e in self.emitted)]

    def cut(self, checkpoint_id: int, reads: Sequence[int]) -> StreamOffset:
        """Barrier *checkpoint_id* (pending) stops waiting for the lagging channels: on every
        channel its position becomes at most *reads* (the channel's read position in the
        batch being planned, never behind the channel's position) and it becomes unaligned.
        Later barriers keep their positions (they are never before an earlier one)."""
        placed: list[PlacedBarrier] = []
        for b in self.barriers:
            if b.checkpoint_id == checkpoint_id:
                floor = placed[-1].positions if placed else self.positions
                at = tuple(
                    max(f, min(pos, r)) for pos, r, f in zip(b.positions, reads, floor, strict=True)
                )
                b = PlacedBarrier(replace(b.barrier, unaligned=True), at)
            placed.append(b)
        return StreamOffset(self.positions, self.emitted, tuple(placed))

    def is_idle_after(self, start: StreamOffset) -> bool:
        """Whether the micro-batch ``(start, self]`` would read no row and emit no barrier,
        and *self* places no barrier *start* lacks — so it differs from *start* at most by
        barriers it dropped as emitted everywhere. ``latestOffset`` then returns *start*
        unchanged: Spark runs a micro-batch for any changed offset, even an empty one."""
        return (
            self.positions == start.positions
            and self.emitted == start.emitted
            and {b.checkpoint_id for b in self.barriers}
            <= {b.checkpoint_id for b in start.barriers}
        )

    def at_time(self, batch_ms: int, idle: Sequence[int]) -> StreamOffset:
        """This offset as the end of a micro-batch planned at *batch_ms* with the channels
        *idle* found idle (event time; see the module docstring)."""
        return replace(self, batch_ms=batch_ms, idle=tuple(sorted(set(idle))))

    def plan(self, end: StreamOffset) -> list[ChannelSlice]:
        """The micro-batch from this offset (exclusive) to *end* (inclusive), per channel."""
        if end.channels != self.channels:
            raise ProtocolError("start and end offsets cover different channels")
        slices = []
        for c in range(self.channels):
            if end.positions[c] < self.positions[c] or end.emitted[c] < self.emitted[c]:
                raise ProtocolError(f"end offset is behind start on channel {c}")
            marks = sorted(
                (b.positions[c], b.checkpoint_id, b.barrier)
                for b in end.barriers
                if self.emitted[c] < b.checkpoint_id <= end.emitted[c]
            )
            progress = (
                ChannelProgress(end.batch_ms, c in end.idle, None, end.lookups)
                if end.batch_ms
                else None
            )
            slices.append(
                ChannelSlice(
                    c,
                    self.positions[c],
                    end.positions[c],
                    tuple((p, b) for p, _, b in marks),
                    progress,
                )
            )
        return slices


@dataclass(frozen=True)
class SourceAlignment:
    """How the source places and aligns the barriers it takes (see the module docstring):
    *placement* for barriers that wait (aligned ones); *aligned_timeout_ms*: an aligned
    barrier still pending that long after its trigger is cut (0: never); *at_least_once*:
    barriers never wait. Runs in the source runner (``latestOffset``); everything it decides
    is recorded in the offset it returns."""

    placement: BarrierPlacement = BarrierPlacement.READ
    aligned_timeout_ms: int = 0
    at_least_once: bool = False

    def waits(self, barrier: CheckpointBarrier) -> bool:
        """Whether *barrier* waits at its placement for every channel (aligned)."""
        return barrier.must_align or not (barrier.unaligned or self.at_least_once)

    def place(
        self,
        offset: StreamOffset,
        barriers: Sequence[CheckpointBarrier],
        heads: Sequence[int],
        max_rows: int | None,
    ) -> StreamOffset:
        """*offset* with *barriers* placed (in order): a waiting barrier where the placement
        says, any other at the read position of the batch being planned."""
        for barrier in barriers:
            placement = self.placement if self.waits(barrier) else BarrierPlacement.READ
            offset = offset.place(barrier, placement.positions(offset.positions, heads, max_rows))
        return offset

    def expire(
        self, offset: StreamOffset, heads: Sequence[int], max_rows: int | None, now_ms: int
    ) -> StreamOffset:
        """*offset* with every pending aligned barrier older than the timeout cut at the
        read positions of the batch being planned (:meth:`StreamOffset.cut`)."""
        if self.aligned_timeout_ms <= 0:
            return offset
        reads = fair_limits(offset.positions, heads, max_rows)
        for b in offset.pending():
            barrier = b.barrier
            if (
                not barrier.must_align
                and not barrier.unaligned
                and now_ms - barrier.timestamp_ms >= self.aligned_timeout_ms
            ):
                offset = offset.cut(barrier.checkpoint_id, reads)
        return offset

    def next(
        self,
        offset: StreamOffset,
        heads: Sequence[int],
        max_rows: int | None,
        now_ms: int,
    ) -> StreamOffset:
        """The end offset of the batch from *offset* (with its barriers placed) to *heads*
        under the read limit *max_rows*: expired barriers cut, then advanced."""
        offset = self.expire(offset, heads, max_rows, now_ms)
        return offset.advance(fair_limits(offset.positions, heads, max_rows))


def fair_limits(positions: Sequence[int], heads: Sequence[int], max_rows: int | None) -> list[int]:
    """Per-channel end positions under a read limit of *max_rows* for the whole batch: every
    channel may take an equal share (at least one row); a channel with a shorter backlog does
    not hand its share to others, so lag is a property of the channel's own backlog."""
    if max_rows is None:
        return [max(h, p) for p, h in zip(positions, heads, strict=True)]
    share = max(1, max_rows // max(1, len(positions)))
    return [max(p, min(h, p + share)) for p, h in zip(positions, heads, strict=True)]

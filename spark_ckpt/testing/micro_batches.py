"""Spark's micro-batch loop over ``ckpt-source``, without Spark: for tests of the engine.

What ``CkptStreamReader`` does per micro-batch, with the same code: ``latestOffset`` places
the barriers the coordinator triggered and plans the end offset
(:class:`~spark_ckpt.sources.stream_offset.SourceAlignment`), ``partitions``/``read`` turn
the offsets into each channel's rows with their barrier rows
(:func:`~spark_ckpt.sources.channel_batch.channel_rows`), and ``toArrow`` concatenates the
channels, as ``foreachBatch`` receives them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.sources.channel_batch import channel_rows
from spark_ckpt.sources.stream_offset import SourceAlignment, StreamOffset

#: ``(channel, start, end)`` → the channel's user rows ``[start, end)``.
Rows = Callable[[int, int, int], pa.Table]


@dataclass
class MicroBatches:
    """The offsets of one query run, from *offset* (its initial offset) on: each
    :meth:`next` is one micro-batch."""

    rows: Rows
    schema: pa.Schema  # the stream's schema (user and barrier columns)
    offset: StreamOffset
    alignment: SourceAlignment = field(default_factory=SourceAlignment)

    def next(
        self,
        barriers: Sequence[CheckpointBarrier],
        heads: Sequence[int],
        max_rows: int | None,
        now_ms: int = 0,
    ) -> pa.Table:
        """The next micro-batch's rows, with *barriers* (just triggered) placed, under the
        read limit *max_rows*, with the channels produced up to *heads*; moves the offset."""
        start = self.alignment.place(self.offset, barriers, heads, max_rows)
        end = self.alignment.next(start, heads, max_rows, now_ms)
        parts = [
            channel_rows(
                self.rows(s.channel, s.start, s.end),
                self.schema,
                s.channel,
                s.start,
                s.barriers,
                self.offset.channels,
            )
            for s in start.plan(end)
        ]
        self.offset = end
        return pa.concat_tables(parts)

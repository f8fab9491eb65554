"""In-flight rows of an unaligned checkpoint, recorded as its channel state."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.protocol.barrier import CHANNEL

__all__ = ["ChannelStateRecorder"]


class ChannelStateRecorder:
    """Rows that arrived after an unaligned snapshot on channels whose barrier was still due.

    :meth:`record` keeps each captured run with the set of channels it was captured for (the
    rows are already restricted to those channels); :meth:`channel_state` splits them by
    channel only once, when the checkpoint completes, keeping each channel's order."""

    def __init__(self) -> None:
        self._captured: list[tuple[frozenset[int], pa.Table]] = []

    def record(self, channels: frozenset[int], rows: pa.Table) -> None:
        """*rows* (Records columns, only channels in *channels*) belong to the channel state."""
        self._captured.append((channels, rows))

    def channel_state(self) -> dict[int, pa.Table]:
        """Channel -> its recorded rows in arrival order, ascending channels; channels without
        rows are absent."""
        per_channel: dict[int, list[pa.Table]] = {}
        for channels, rows in self._captured:
            if len(channels) == 1:
                per_channel.setdefault(next(iter(channels)), []).append(rows)
                continue
            col = rows.column(CHANNEL)
            for c in sorted(channels):
                part = rows.filter(pc.equal(col, pa.scalar(c, pa.int32())))
                if part.num_rows:
                    per_channel.setdefault(c, []).append(part)
        return {
            c: parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            for c, parts in sorted(per_channel.items())
        }

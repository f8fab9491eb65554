"""The items that flow through a barrier aligner: runs of data rows, decoded control rows and
in-band ends of input, and :func:`split_items`, which cuts an input table into them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ProtocolError
from spark_ckpt.protocol.barrier import (
    BARRIER_OPTIONS,
    BARRIER_TS,
    CHANNEL,
    CHECKPOINT_ID,
    KIND,
    OFFSET,
    CancelCheckpointMarker,
    ChannelProgress,
    CheckpointBarrier,
    RecordKind,
    event_from_row,
)

__all__ = ["CONTROL_ONLY_COLUMNS", "ControlRow", "EndOfInput", "Item", "split_items"]

#: Barrier columns dropped from emitted data (``_ckpt_channel``/``_ckpt_offset`` are kept).
CONTROL_ONLY_COLUMNS: tuple[str, ...] = (KIND, CHECKPOINT_ID, BARRIER_TS, BARRIER_OPTIONS)


@dataclass(frozen=True)
class ControlRow:
    """A decoded barrier, cancel or progress row of *channel* (``offset``: its
    ``_ckpt_offset``, i.e. the offset of the channel's next data row)."""

    channel: int
    offset: int
    event: CheckpointBarrier | CancelCheckpointMarker | ChannelProgress


@dataclass(frozen=True)
class EndOfInput:
    """In-band end of a channel, queued behind that channel's buffered rows. ``end_offset``:
    one past the channel's last data row."""

    channel: int
    end_offset: int


#: What flows through the aligner's queue and buffer: data rows (already projected to the
#: :class:`~spark_ckpt.runtime.alignment.steps.Records` columns), control rows, ends of input.
Item: TypeAlias = "pa.Table | ControlRow | EndOfInput"


def split_items(table: pa.Table) -> list[Item]:
    """Cut *table* into data segments (projected to the Records columns, i.e. without
    :data:`CONTROL_ONLY_COLUMNS`) and decoded control rows, in row order. Row ``i`` of a control
    row ends the preceding segment at ``i`` (exclusive) and the next one starts at ``i + 1``;
    empty segments are omitted. A table without control rows costs a null count (one item, or
    none for an empty table). Raises :class:`ProtocolError` for a row with a checkpoint id whose
    kind is data."""
    data = table.drop_columns(list(CONTROL_ONLY_COLUMNS))
    cid = table.column(CHECKPOINT_ID)
    if cid.null_count == table.num_rows:
        return [data] if table.num_rows else []
    idx = pc.indices_nonzero(pc.is_valid(cid))
    ctrl = table.take(idx).select([CHANNEL, OFFSET, KIND, CHECKPOINT_ID, BARRIER_OPTIONS])
    ts = table.column(BARRIER_TS).take(idx).cast(pa.int64())
    items: list[Item] = []
    pos = 0
    rows = ctrl.append_column(BARRIER_TS, ts).to_pylist()
    for i, row in zip(idx.to_pylist(), rows, strict=True):
        if i > pos:
            items.append(data.slice(pos, i - pos))
        pos = i + 1
        if row[KIND] == RecordKind.DATA.code:
            raise ProtocolError(f"data row with {CHECKPOINT_ID}: {row!r}")
        event = event_from_row(row)
        if event is None:  # pragma: no cover - KIND checked above
            raise ProtocolError(f"not a control row: {row!r}")
        items.append(ControlRow(int(row[CHANNEL]), int(row[OFFSET]), event))
    if pos < table.num_rows:
        items.append(data.slice(pos))
    return items

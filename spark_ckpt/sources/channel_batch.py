"""The rows ``ckpt-source`` emits for one channel of one micro-batch: the channel's data rows
with the barrier columns added, barrier rows inserted at their positions and, when the
pipeline keeps event time, the channel's progress row after its data rows.

A barrier row carries nulls in the user columns, so in the stream schema every user column is
nullable (:func:`stream_schema`). Built with Arrow slices and concatenation: no Python loop
over data rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from spark_ckpt.errors import ProtocolError
from spark_ckpt.protocol.barrier import (
    BARRIER_FIELDS,
    BARRIER_OPTIONS,
    BARRIER_TS,
    CHANNEL,
    CHECKPOINT_ID,
    KIND,
    OFFSET,
    ChannelProgress,
    CheckpointBarrier,
    RecordKind,
    barrier_row_values,
)


def stream_schema(user: pa.Schema) -> pa.Schema:
    """The user's columns (made nullable) followed by the barrier columns."""
    for name in user.names:
        if name.startswith("_ckpt_"):
            raise ProtocolError(f"user column {name!r} uses the reserved prefix _ckpt_")
    return pa.schema([f.with_nullable(True) for f in user] + list(BARRIER_FIELDS))


def data_rows(
    user: pa.Table,
    schema: pa.Schema,
    channel: int,
    start: int,
    positions: pa.Array | None = None,
) -> pa.Table:
    """*user* rows as channel *channel* rows of *schema*, at positions ``start, start+1,
    ...``, or at *positions* (increasing; a source whose positions have gaps)."""
    n = user.num_rows
    cols = [user.column(f.name).cast(f.type) for f in schema if not f.name.startswith("_ckpt_")]
    cols += [
        pa.array(np.full(n, channel, dtype=np.int32)),
        pa.array(np.arange(start, start + n, dtype=np.int64))
        if positions is None
        else positions.cast(pa.int64()),
        pa.array(np.full(n, RecordKind.DATA.code, dtype=np.int8)),
        pa.nulls(n, pa.int64()),
        pa.nulls(n, pa.timestamp("us", tz="UTC")),
        pa.nulls(n, pa.string()),
    ]
    return pa.Table.from_arrays(cols, schema=schema)


def barrier_options(barrier: CheckpointBarrier, channels: int | None) -> str:
    """The ``_ckpt_barrier_options`` JSON: snapshot type, unaligned flag, and the number of
    source channels (so a stateless consumer knows when every channel delivered it)."""
    options = json.loads(barrier.options_json())
    if channels is not None:
        options["channels"] = channels
    return json.dumps(options, sort_keys=True)


def barrier_rows(
    schema: pa.Schema,
    channel: int,
    marks: Sequence[tuple[int, CheckpointBarrier]],
    channels: int | None = None,
) -> pa.Table:
    """One barrier row per ``(position, barrier)`` of *channel*."""
    n = len(marks)
    user = [pa.nulls(n, f.type) for f in schema if not f.name.startswith("_ckpt_")]
    barrier_cols = {
        CHANNEL: pa.array([channel] * n, pa.int32()),
        OFFSET: pa.array([p for p, _ in marks], pa.int64()),
        KIND: pa.array([RecordKind.BARRIER.code] * n, pa.int8()),
        CHECKPOINT_ID: pa.array([b.checkpoint_id for _, b in marks], pa.int64()),
        BARRIER_TS: pa.array([b.timestamp_ms * 1000 for _, b in marks], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")
        ),
        BARRIER_OPTIONS: pa.array([barrier_options(b, channels) for _, b in marks], pa.string()),
    }
    return pa.Table.from_arrays(
        user + [barrier_cols[f.name] for f in BARRIER_FIELDS], schema=schema
    )


def progress_row(
    schema: pa.Schema, channel: int, offset: int, progress: ChannelProgress
) -> pa.Table:
    """The row that carries *progress* of *channel* at *offset* (its next data row)."""
    values = barrier_row_values(progress, channel, offset)
    user = [pa.nulls(1, f.type) for f in schema if not f.name.startswith("_ckpt_")]
    control = [pa.array([values[f.name]], f.type) for f in BARRIER_FIELDS]
    return pa.Table.from_arrays(user + control, schema=schema)


def channel_rows(
    user: pa.Table,
    schema: pa.Schema,
    channel: int,
    start: int,
    marks: Sequence[tuple[int, CheckpointBarrier]] = (),
    channels: int | None = None,
    *,
    positions: pa.Array | None = None,
    end: int | None = None,
    progress: ChannelProgress | None = None,
) -> pa.Table:
    """Data rows ``[start, start + user.num_rows)`` of *channel* with each barrier inserted
    before the data row at its position (at the end when the position is the end), and
    *progress* after the last data row, before the barriers at the end. A source whose
    positions have gaps (Kafka offsets: transaction markers, compaction) gives each row's
    *positions* (increasing, in ``[start, end)``) and the range's *end*: a barrier then goes
    before the first row at or after its position."""
    if positions is None:
        end = start + user.num_rows
        index = np.arange(user.num_rows + 1, dtype=np.int64)  # row i is at start + i
        at = np.arange(start, start + user.num_rows + 1, dtype=np.int64)
    else:
        if end is None:
            raise ProtocolError("rows at positions with gaps need the range's end")
        at = np.append(np.asarray(positions.cast(pa.int64())), end)
        index = np.arange(at.size, dtype=np.int64)
    data = data_rows(user, schema, channel, start, positions)
    if not marks and progress is None:
        return data
    pieces: list[pa.Table] = []
    cursor, row = start, 0
    for i, (pos, _) in enumerate(marks):
        if not start <= pos <= end or pos < cursor:
            raise ProtocolError(
                f"barrier position {pos} outside [{cursor}, {end}] on channel {channel}"
            )
        upto = int(index[np.searchsorted(at, pos, side="left")])
        if upto > row:
            pieces.append(data.slice(row, upto - row))
        if progress is not None and upto == data.num_rows:
            pieces.append(progress_row(schema, channel, end, progress))
            progress = None
        pieces.append(barrier_rows(schema, channel, marks[i : i + 1], channels))
        cursor, row = pos, upto
    if row < data.num_rows:
        pieces.append(data.slice(row, data.num_rows - row))
    if progress is not None:
        pieces.append(progress_row(schema, channel, end, progress))
    return pa.concat_tables(pieces)

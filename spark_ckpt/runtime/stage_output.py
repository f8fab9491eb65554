"""What a subtask forwards to the next stage (:mod:`spark_ckpt.runtime.stage`): its output rows,
its event time and its barriers, in order, as the rows of one channel.

A subtask of a stage that has a next one gets a :class:`StageOutput`. During an input batch
(a micro-batch) the task hands it, in the order they happen, the rows its chain emits
(:meth:`StageOutput.rows`), each checkpoint it snapshots at (:meth:`StageOutput.barrier`,
after everything it emitted before its snapshot) and each checkpoint it gives up
(:meth:`StageOutput.cancel`, Flink's cancel marker). :meth:`StageOutput.drain` then gives the
batch's channel: the rows in the encoding of :mod:`spark_ckpt.protocol.barrier`, on channel
*subtask*, each barrier preceded by a progress row and the channel closed by one, which carry
the subtask's watermark and the batch's processing time. The next stage's subtasks read each
upstream subtask as one channel: everything it emitted before its barrier *n* belongs to
checkpoint *n*, as on a source channel.

The progress rows carry the upstream watermark *w* as the largest event time
``w + WATERMARK_GAP_US``: the next stage's watermark valve, with a bound of 0, derives exactly
*w* per channel, and its watermark is the minimum over its channels. Pure: pyarrow only.
Single-threaded, as the task.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.barrier import (
    BARRIER_COLUMNS,
    BARRIER_FIELDS,
    CHANNEL,
    CHECKPOINT_ID,
    KIND,
    OFFSET,
    CancelCheckpointMarker,
    ChannelProgress,
    CheckpointBarrier,
    barrier_row_values,
)
from spark_ckpt.runtime.event_time import WATERMARK_GAP_US, WatermarkStrategy
from spark_ckpt.state.keygroup import subtasks_for_keys

_CONTROL: Final = "control"


def forwarded_strategy(
    pipeline: WatermarkStrategy | None, column: str | None
) -> WatermarkStrategy | None:
    """The watermark strategy of a later stage whose pipeline keeps time under *pipeline*:
    no bound (its channels carry their upstream watermarks, see the module docstring), the
    pipeline's allowed lateness, event time read from *column* (None: none of the rows')."""
    if pipeline is None:
        return None
    time_column = column if pipeline.event_time else None
    return WatermarkStrategy(time_column, 0, None, pipeline.allowed_lateness_ms)


class StageOutput:
    """The channel of one upstream *subtask* towards the next stage (see the module
    docstring). O(rows emitted) per batch, vectorized."""

    def __init__(self, subtask: int) -> None:
        self.channel = subtask
        self._pieces: list[pa.Table | tuple[str, Any]] = []

    def rows(self, table: pa.Table) -> None:
        """Rows the chain emitted (their own columns; barrier columns are dropped)."""
        if table.num_rows:
            keep = [c for c in table.column_names if c not in BARRIER_COLUMNS]
            self._pieces.append(table.select(keep))

    def barrier(self, barrier: CheckpointBarrier, watermark_us: int | None, batch_ms: int) -> None:
        """The subtask snapshotted at *barrier*, its watermark then *watermark_us*."""
        self._pieces.append((_CONTROL, _progress(watermark_us, batch_ms)))
        self._pieces.append((_CONTROL, barrier))

    def cancel(self, checkpoint_id: int) -> None:
        """The subtask gave checkpoint *checkpoint_id* up."""
        self._pieces.append((_CONTROL, CancelCheckpointMarker(checkpoint_id)))

    def drain(self, watermark_us: int | None, batch_ms: int) -> pa.Table:
        """The batch's channel (see the module docstring), closed by a progress row at
        *watermark_us*; afterwards empty."""
        pieces, self._pieces = self._pieces, []
        pieces.append((_CONTROL, _progress(watermark_us, batch_ms)))
        data = [p for p in pieces if isinstance(p, pa.Table)]
        schema = _data_schema(data)
        tables: list[pa.Table] = []
        offset = 0
        for piece in pieces:
            if isinstance(piece, pa.Table):
                tables.append(_data_rows(piece, schema, self.channel, offset))
                offset += piece.num_rows
            else:
                tables.append(_control_row(piece[1], schema, self.channel, offset))
        return pa.concat_tables(tables).combine_chunks()


def _progress(watermark_us: int | None, batch_ms: int) -> ChannelProgress:
    top = None if watermark_us is None else watermark_us + WATERMARK_GAP_US
    return ChannelProgress(batch_ms, False, top)


def _data_schema(tables: list[pa.Table]) -> pa.Schema:
    if not tables:
        return pa.schema([])
    return pa.unify_schemas([t.schema for t in tables], promote_options="permissive")


def _data_rows(table: pa.Table, schema: pa.Schema, channel: int, offset: int) -> pa.Table:
    n = table.num_rows
    columns = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(n, f.type)
        for f in schema
    ]
    barrier: dict[str, pa.Array] = {
        CHANNEL: pa.array(np.full(n, channel, dtype=np.int32)),
        OFFSET: pa.array(np.arange(offset, offset + n, dtype=np.int64)),
        KIND: pa.array(np.zeros(n, dtype=np.int8)),
    }
    for f in BARRIER_FIELDS:
        columns.append(barrier[f.name] if f.name in barrier else pa.nulls(n, f.type))
    return pa.Table.from_arrays(columns, schema=_full_schema(schema))


def _control_row(
    event: CheckpointBarrier | CancelCheckpointMarker | ChannelProgress,
    schema: pa.Schema,
    channel: int,
    offset: int,
) -> pa.Table:
    values = barrier_row_values(event, channel, offset)
    columns = [pa.nulls(1, f.type) for f in schema]
    columns += [pa.array([values[f.name]], f.type) for f in BARRIER_FIELDS]
    return pa.Table.from_arrays(columns, schema=_full_schema(schema))


def _full_schema(schema: pa.Schema) -> pa.Schema:
    fields = [f.with_nullable(True) for f in schema]
    return pa.schema([*fields, *BARRIER_FIELDS])


def split_for_subtasks(
    table: pa.Table, key_column: str, max_parallelism: int, parallelism: int
) -> list[pa.Table]:
    """Each subtask's rows of *table* (data and control rows of any channels, in channel
    order): the data rows of its key groups of *key_column*, and every control row (barriers
    and progress reach every subtask), each channel's order kept. O(rows), vectorized.
    :class:`~spark_ckpt.errors.ConfigError` when data rows lack *key_column* (the stage before
    does not emit the column this stage is keyed by)."""
    control = pc.is_valid(table.column(CHECKPOINT_ID)).to_numpy(zero_copy_only=False)
    data = np.flatnonzero(~control)
    if parallelism == 1:
        return [table]
    owner = np.full(table.num_rows, -1, dtype=np.int64)
    if len(data):
        if key_column not in table.column_names:
            raise ConfigError(
                "Stage.operators",
                [c for c in table.column_names if c not in BARRIER_COLUMNS],
                f"a stage input with the column {key_column!r} it is keyed by (the stage "
                "before it emits these columns)",
            )
        keys = table.column(key_column).take(pa.array(data))
        owner[data] = subtasks_for_keys(keys, max_parallelism, parallelism).to_numpy(
            zero_copy_only=False
        )
    return [table.filter(pa.array(control | (owner == s))) for s in range(parallelism)]

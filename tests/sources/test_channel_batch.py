"""Rows of one channel slice: data rows with barrier columns, barrier rows at their positions."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_ckpt.errors import ProtocolError
from spark_ckpt.protocol.barrier import CheckpointBarrier, event_from_row
from spark_ckpt.sources.channel_batch import channel_rows, stream_schema

USER = pa.schema([pa.field("k", pa.int64(), nullable=False)])


@given(
    start=st.integers(0, 1000),
    n=st.integers(0, 30),
    positions=st.lists(st.integers(0, 30), max_size=4),
)
def test_barriers_sit_before_the_data_row_at_their_position(
    start: int, n: int, positions: list[int]
) -> None:
    positions = sorted(start + min(p, n) for p in positions)
    marks = [(p, CheckpointBarrier(i + 1, 0)) for i, p in enumerate(positions)]
    user = pa.table({"k": list(range(start, start + n))}, schema=USER)
    rows = channel_rows(user, stream_schema(USER), 3, start, marks, channels=5).to_pylist()
    # reference: walk offsets, emitting barriers before the data row at their position
    expected: list[tuple[int, int]] = []  # (_ckpt_kind: 0 data, 1 barrier, id or offset)
    pending = list(marks)
    for off in range(start, start + n + 1):
        while pending and pending[0][0] == off:
            expected.append((1, pending.pop(0)[1].checkpoint_id))
        if off < start + n:
            expected.append((0, off))
    got = [
        (
            r["_ckpt_kind"],
            r["_ckpt_checkpoint_id"] if r["_ckpt_kind"] == 1 else r["_ckpt_offset"],
        )
        for r in rows
    ]
    assert got == expected
    for r in rows:
        assert r["_ckpt_channel"] == 3
        if r["_ckpt_kind"] == 0:
            assert r["k"] == r["_ckpt_offset"]
        else:
            assert r["k"] is None and json.loads(r["_ckpt_barrier_options"])["channels"] == 5
            assert event_from_row(r) is not None


def test_stream_schema_makes_user_columns_nullable_and_rejects_reserved_names() -> None:
    s = stream_schema(USER)
    assert s.field("k").nullable and s.names[-1] == "_ckpt_barrier_options"
    with pytest.raises(ProtocolError):
        stream_schema(pa.schema([pa.field("_ckpt_x", pa.int64())]))


def test_barrier_outside_the_slice_is_rejected() -> None:
    user = pa.table({"k": [1, 2]}, schema=USER)
    with pytest.raises(ProtocolError):
        channel_rows(user, stream_schema(USER), 0, 10, [(13, CheckpointBarrier(1, 0))])


@given(
    start=st.integers(0, 1000),
    span=st.integers(0, 30),
    present=st.lists(st.booleans(), min_size=30, max_size=30),
    positions=st.lists(st.integers(0, 30), max_size=4),
)
def test_rows_at_positions_with_gaps_keep_their_positions_and_barriers_go_before_the_next(
    start: int, span: int, present: list[bool], positions: list[int]
) -> None:
    """Kafka offsets: a range ``[start, end)`` holds rows at some of its positions only
    (transaction markers, compaction); a barrier at *p* goes before the first row at or
    after *p*."""
    end = start + span
    offsets = [start + i for i in range(span) if present[i]]
    marks = [
        (p, CheckpointBarrier(i + 1, 0))
        for i, p in enumerate(sorted(start + min(p, span) for p in positions))
    ]
    user = pa.table({"k": offsets}, schema=USER)
    rows = channel_rows(
        user,
        stream_schema(USER),
        2,
        start,
        marks,
        positions=pa.array(offsets, pa.int64()),
        end=end,
    ).to_pylist()
    expected: list[tuple[int, int]] = []
    pending = list(marks)
    for off in range(start, end + 1):
        while pending and pending[0][0] == off:
            expected.append((1, pending.pop(0)[1].checkpoint_id))
        if off in offsets:
            expected.append((0, off))
    got = [
        (r["_ckpt_kind"], r["_ckpt_checkpoint_id"] if r["_ckpt_kind"] == 1 else r["_ckpt_offset"])
        for r in rows
    ]
    assert got == expected
    assert all(r["k"] == r["_ckpt_offset"] for r in rows if r["_ckpt_kind"] == 0)

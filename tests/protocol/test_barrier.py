"""Barrier and cancel-marker encodings (JSON and row columns) round-trip; bad input is a
ProtocolError."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_ckpt.errors import ProtocolError, SparkCkptError
from spark_ckpt.protocol.barrier import (
    BARRIER_FIELDS,
    CancelCheckpointMarker,
    CheckpointBarrier,
    RecordKind,
    SnapshotType,
    barrier_row_values,
    decode_event,
    event_from_row,
)

barriers = st.builds(
    CheckpointBarrier,
    checkpoint_id=st.integers(1, 2**62),
    timestamp_ms=st.integers(0, 2**41),
    snapshot_type=st.sampled_from(SnapshotType),
    unaligned=st.booleans(),
    final=st.booleans(),
)


@given(barriers)
def test_barrier_json_round_trip(b: CheckpointBarrier) -> None:
    assert decode_event(b.to_json()) == b
    assert decode_event(json.loads(b.to_json())) == b


@given(barriers, st.integers(0, 1000), st.integers(0, 2**40))
def test_barrier_row_round_trip_through_arrow(
    b: CheckpointBarrier, channel: int, offset: int
) -> None:
    row = barrier_row_values(b, channel, offset)
    table = pa.Table.from_pylist([row], schema=pa.schema(BARRIER_FIELDS))
    back = table.to_pylist()[0]  # timestamps come back as datetime
    assert event_from_row(back) == b
    assert back["_ckpt_kind"] == 1 == RecordKind.BARRIER.code  # documented code
    assert back["_ckpt_offset"] == offset and back["_ckpt_channel"] == channel


def test_cancel_marker_round_trips() -> None:
    m = CancelCheckpointMarker(7)
    assert decode_event(m.to_json()) == m
    assert event_from_row(barrier_row_values(m, 2, 10)) == m


def test_data_rows_decode_to_none() -> None:
    assert event_from_row({"_ckpt_kind": 0}) is None


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        {"kind": "barrier"},
        {"kind": "barrier", "checkpoint_id": 0, "timestamp_ms": 1},
        {"kind": "barrier", "checkpoint_id": 1, "timestamp_ms": 1, "type": "bogus"},
        {"kind": "wat", "checkpoint_id": 1},
    ],
)
def test_bad_events_are_protocol_errors(bad: object) -> None:
    with pytest.raises(ProtocolError) as e:
        decode_event(bad)  # type: ignore[arg-type]
    assert isinstance(e.value, SparkCkptError)


def test_bad_rows_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        event_from_row({"_ckpt_kind": 1, "_ckpt_checkpoint_id": None})
    for unknown in (4, -1, "barrier", None, True):
        with pytest.raises(ProtocolError):
            event_from_row({"_ckpt_kind": unknown, "_ckpt_checkpoint_id": 3})
    with pytest.raises(ProtocolError):
        event_from_row({"_ckpt_kind": 1, "_ckpt_checkpoint_id": 3, "_ckpt_barrier_options": "{"})


def test_progress_rows_round_trip() -> None:
    """A progress row (event time) decodes to what it encoded, as JSON too; it belongs to no
    checkpoint (id 0) and its options are explicit JSON."""
    from spark_ckpt.protocol.barrier import ChannelProgress, barrier_row_values, decode_event

    for progress in (
        ChannelProgress(1_700_000_000_123),
        ChannelProgress(5, idle=True),
        ChannelProgress(7, max_event_time_us=1_700_000_000_123_456),
    ):
        row = barrier_row_values(progress, channel=2, offset=40)
        assert row["_ckpt_kind"] == 3 and row["_ckpt_checkpoint_id"] == 0
        assert event_from_row(row) == progress
        assert decode_event(progress.to_json()) == progress
    with pytest.raises(ProtocolError):
        event_from_row({"_ckpt_kind": 3, "_ckpt_checkpoint_id": 0, "_ckpt_barrier_options": "[]"})

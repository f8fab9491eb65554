"""Barrier placement and batch planning against a direct model: every channel, read from
start to finish over any sequence of batches, emits each data row once in order and each
barrier exactly once, before the data row at its position."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.barrier import CheckpointBarrier
from spark_ckpt.errors import ProtocolError
from spark_ckpt.stream_offset import StreamOffset, fair_limits

ops = st.lists(
    st.one_of(
        st.tuples(st.just("produce"), st.integers(0, 2), st.integers(0, 30)),
        st.tuples(st.just("barrier")),
        st.tuples(st.just("batch"), st.one_of(st.none(), st.integers(1, 40))),
        st.tuples(st.just("replay")),
    ),
    max_size=60,
)


@settings(max_examples=300)
@given(ops=ops, channels=st.integers(1, 3))
def test_batches_emit_every_row_and_barrier_once_in_order(
    ops: list[tuple[object, ...]], channels: int
) -> None:
    heads = [0] * channels
    offset = StreamOffset.initial([0] * channels)
    next_id = 1
    # model: per channel, the sequence of events the source produced
    produced: list[list[tuple[str, int]]] = [[] for _ in range(channels)]
    emitted: list[list[tuple[str, int]]] = [[] for _ in range(channels)]
    log: list[tuple[StreamOffset, StreamOffset]] = []
    for op in ops:
        if op[0] == "produce":
            c, n = op[1] % channels, op[2]
            produced[c] += [("row", heads[c] + i) for i in range(n)]  # type: ignore[operator]
            heads[c] += n  # type: ignore[operator]
        elif op[0] == "barrier":
            offset = offset.place(CheckpointBarrier(next_id, 0), heads)
            for c in range(channels):
                produced[c].append(("barrier", next_id))
            next_id += 1
        elif op[0] == "batch":
            end = offset.advance(fair_limits(offset.positions, heads, op[1]))  # type: ignore[arg-type]
            for s in offset.plan(end):
                marks = list(s.barriers)
                for pos in range(s.start, s.end + 1):
                    while marks and marks[0][0] == pos:
                        emitted[s.channel].append(("barrier", marks.pop(0)[1].checkpoint_id))
                    if pos < s.end:
                        emitted[s.channel].append(("row", pos))
                assert not marks
            log.append((offset, StreamOffset.from_json(end.to_json())))
            offset = end
        elif op[0] == "replay" and log:
            a, b = log[-1]
            assert a.plan(b) == a.plan(StreamOffset.from_json(b.to_json()))
    # drain everything
    end = offset.advance(heads)
    for s in offset.plan(end):
        marks = list(s.barriers)
        for pos in range(s.start, s.end + 1):
            while marks and marks[0][0] == pos:
                emitted[s.channel].append(("barrier", marks.pop(0)[1].checkpoint_id))
            if pos < s.end:
                emitted[s.channel].append(("row", pos))
    assert emitted == produced


def test_lagging_channel_reaches_barrier_batches_later() -> None:
    offset = StreamOffset.initial([0, 0])
    heads = [300, 10]  # channel 0 has a 300-row backlog, channel 1 only 10
    offset = offset.place(CheckpointBarrier(1, 0), heads)
    batches_until: dict[int, int] = {}
    for i in range(1, 10):
        end = offset.advance(fair_limits(offset.positions, heads, 200))
        for s in offset.plan(end):
            if s.barriers:
                batches_until[s.channel] = i
        offset = end
    assert batches_until == {1: 1, 0: 3}


def test_restored_offset_does_not_reemit_completed_barriers() -> None:
    o = StreamOffset.initial([5, 7], last_checkpoint_id=4)
    with pytest.raises(ProtocolError):
        o.place(CheckpointBarrier(4, 0), [5, 7])
    o = o.place(CheckpointBarrier(5, 0), [9, 9])
    end = o.advance([9, 9])
    assert [len(s.barriers) for s in o.plan(end)] == [1, 1]


def test_bad_offsets_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        StreamOffset.from_json("{}")
    with pytest.raises(ProtocolError):
        StreamOffset.from_json("not json")
    with pytest.raises(ProtocolError):
        StreamOffset.initial([1]).plan(StreamOffset.initial([0]))

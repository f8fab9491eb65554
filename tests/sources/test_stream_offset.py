"""Barrier placement and batch planning against a direct model: every channel, read from
start to finish over any sequence of batches, emits each data row once in order and each
barrier exactly once, before the data row at its position."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import ProtocolError
from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.sources.stream_offset import BarrierPlacement, StreamOffset, fair_limits

ops = st.lists(
    st.one_of(
        st.tuples(st.just("produce"), st.integers(0, 2), st.integers(0, 30)),
        st.tuples(st.just("barrier")),
        st.tuples(st.just("batch"), st.one_of(st.none(), st.integers(1, 40)), st.booleans()),
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
    # position of the newest barrier per channel (a newer one never goes before it)
    last_mark = [0] * channels
    for op in ops:
        if op[0] == "produce":
            c, n = op[1] % channels, op[2]
            produced[c] += [("row", heads[c] + i) for i in range(n)]  # type: ignore[operator]
            heads[c] += n  # type: ignore[operator]
        elif op[0] == "barrier":  # BarrierPlacement.HEAD: after everything produced
            at = BarrierPlacement.HEAD.positions(offset.positions, heads, None)
            offset = offset.place(CheckpointBarrier(next_id, 0), at)
            for c in range(channels):
                produced[c].append(("barrier", next_id))
                last_mark[c] = heads[c]
            next_id += 1
        elif op[0] == "batch":
            max_rows: int | None = op[1]  # type: ignore[assignment]
            if op[2]:  # a trigger taken by this batch, BarrierPlacement.READ: at its end
                at = BarrierPlacement.READ.positions(offset.positions, heads, max_rows)
                offset = offset.place(CheckpointBarrier(next_id, 0), at)
                for c in range(channels):
                    # expected: before data row p, after the barriers already there
                    p = max(
                        offset.positions[c]
                        + min(heads[c] - offset.positions[c], max_rows // channels or 1)
                        if max_rows is not None
                        else heads[c],
                        last_mark[c],
                    )
                    row = [i for i, e in enumerate(produced[c]) if e == ("row", p)]
                    produced[c].insert(row[0] if row else len(produced[c]), ("barrier", next_id))
                    last_mark[c] = p
                next_id += 1
            end = offset.advance(fair_limits(offset.positions, heads, max_rows))
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


def test_barrier_at_read_position_is_emitted_by_the_batch_that_places_it() -> None:
    offset = StreamOffset.initial([0, 0])
    heads = [300, 10]
    at = BarrierPlacement.READ.positions(offset.positions, heads, 200)
    assert at == [100, 10]
    offset = offset.place(CheckpointBarrier(1, 0), at)
    end = offset.advance(fair_limits(offset.positions, heads, 200))
    assert [(s.end, [p for p, _ in s.barriers]) for s in offset.plan(end)] == [
        (100, [100]),
        (10, [10]),
    ]
    assert BarrierPlacement.HEAD.positions([0, 0], heads, 200) == [300, 10]


def test_an_offset_that_only_drops_emitted_barriers_is_idle() -> None:
    start = StreamOffset.initial([0, 0]).place(CheckpointBarrier(1, 0), [5, 5])
    batch = start.advance([5, 5])  # reads the rows and emits barrier 1 on both channels
    assert not batch.is_idle_after(start)
    after = batch.advance([5, 5])  # nothing new: only drops barrier 1 (emitted everywhere)
    assert after.barriers == () and after != batch
    assert after.is_idle_after(batch)
    # a new barrier placed at the current position is emitted by an otherwise empty batch
    placed = batch.place(CheckpointBarrier(2, 0), [5, 5])
    assert not placed.advance([5, 5]).is_idle_after(batch)
    # one placed beyond the current position must be kept in the offset, though not emitted
    ahead = batch.place(CheckpointBarrier(2, 0), [9, 9])
    assert not ahead.advance([5, 5]).is_idle_after(batch)
    assert not batch.advance([6, 5]).is_idle_after(batch)


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

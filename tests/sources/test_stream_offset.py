"""Barrier placement and batch planning against a direct model: every channel, read from
start to finish over any sequence of batches, emits each data row once in order and each
barrier exactly once, before the data row at its position."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import ProtocolError
from spark_ckpt.protocol.barrier import CheckpointBarrier, SnapshotType
from spark_ckpt.sources.stream_offset import (
    BarrierPlacement,
    SourceAlignment,
    StreamOffset,
    fair_limits,
)

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
            emit(offset, end, emitted)
            log.append((offset, StreamOffset.from_json(end.to_json())))
            offset = end
        elif op[0] == "replay" and log:
            a, b = log[-1]
            assert a.plan(b) == a.plan(StreamOffset.from_json(b.to_json()))
    # drain everything: held channels move on once each barrier is emitted
    for _ in range(next_id + 1):
        end = offset.advance(heads)
        emit(offset, end, emitted)
        offset = end
    assert list(offset.positions) == heads and not offset.pending()
    assert emitted == produced


def emit(start: StreamOffset, end: StreamOffset, emitted: list[list[tuple[str, int]]]) -> None:
    """What the batch (start, end] emits, appended per channel. Alignment at the source: a
    barrier is emitted on every channel in the same batch, after the channel's last row."""
    slices = start.plan(end)
    ids = [[b.checkpoint_id for _, b in s.barriers] for s in slices]
    assert all(i == ids[0] for i in ids), ids
    for s in slices:
        assert all(p == s.end for p, _ in s.barriers), s
        emitted[s.channel] += [("row", pos) for pos in range(s.start, s.end)]
        emitted[s.channel] += [("barrier", b.checkpoint_id) for _, b in s.barriers]


def test_a_lagging_channel_holds_the_others_at_an_aligned_barrier() -> None:
    offset = StreamOffset.initial([0, 0])
    heads = [300, 10]  # channel 0 has a 300-row backlog, channel 1 only 10
    offset = offset.place(CheckpointBarrier(1, 0), heads)
    heads[1] = 50  # channel 1 produces more: held at its barrier, it does not read it
    ends = []
    for _ in range(4):
        end = offset.advance(fair_limits(offset.positions, heads, 200))
        ends.append((end.positions, [len(s.barriers) for s in offset.plan(end)]))
        offset = end
    assert ends == [
        ((100, 10), [0, 0]),
        ((200, 10), [0, 0]),
        ((300, 10), [1, 1]),  # the last channel reaches it: emitted everywhere at once
        ((300, 50), [0, 0]),  # released: channel 1 reads on
    ]


def test_an_expired_aligned_barrier_is_cut_at_the_read_positions() -> None:
    align = SourceAlignment(BarrierPlacement.HEAD, aligned_timeout_ms=50)
    heads = [300, 10]
    offset = align.place(StreamOffset.initial([0, 0]), [CheckpointBarrier(1, 0)], heads, 200)
    offset = align.next(offset, heads, 200, now_ms=10)  # waiting: channel 0 reads 100
    assert offset.positions == (100, 10) and offset.emitted == (0, 0)
    end = align.next(offset, heads, 200, now_ms=60)  # expired: cut where channel 0 reads
    assert end.positions == (200, 10) and end.emitted == (1, 1)
    [barrier] = end.barriers
    assert barrier.positions == (200, 10) and barrier.barrier.unaligned
    assert [p for s in offset.plan(end) for p, _ in s.barriers] == [200, 10]
    # a savepoint never cuts a channel
    offset = align.place(
        StreamOffset.initial([0, 0]),
        [CheckpointBarrier(1, 0, SnapshotType.SAVEPOINT)],
        heads,
        200,
    )
    for _ in range(2):
        offset = align.next(offset, heads, 200, now_ms=1_000)
    assert offset.emitted == (0, 0) and offset.positions == (200, 10)


@pytest.mark.parametrize(
    ("alignment", "unaligned"),
    [
        (SourceAlignment(BarrierPlacement.HEAD), True),
        (SourceAlignment(BarrierPlacement.HEAD, at_least_once=True), False),
    ],
)
def test_barriers_that_do_not_wait_go_at_the_read_position(
    alignment: SourceAlignment, unaligned: bool
) -> None:
    heads = [300, 10]
    offset = alignment.place(
        StreamOffset.initial([0, 0]), [CheckpointBarrier(1, 0, unaligned=unaligned)], heads, 200
    )
    end = alignment.next(offset, heads, 200, now_ms=0)
    assert end.positions == (100, 10) and end.emitted == (1, 1)


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

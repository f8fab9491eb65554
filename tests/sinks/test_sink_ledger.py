"""The stateless sink's ledger across micro-batches, and splitting rows at barriers."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_ckpt.errors import ProtocolError
from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.sinks.ledger import SinkEvent, SinkLedger, split_at_barriers
from spark_ckpt.sources.channel_batch import channel_rows, stream_schema


def f(ch: int, name: str) -> SinkEvent:
    return SinkEvent(ch, file=name)


def b(ch: int, cid: int, off: int) -> SinkEvent:
    return SinkEvent(ch, checkpoint_id=cid, offset=off, channels=2)


def test_lagging_channel_assigns_files_to_the_right_checkpoint_across_batches() -> None:
    ledger = SinkLedger()
    # batch 0: channel 0 delivers barrier 1; channel 1 lags
    assert ledger.apply(0, [f(0, "a"), b(0, 1, 10), f(0, "b"), f(1, "c")]) == []
    # batch 1: channel 1 still before barrier 1
    assert ledger.apply(1, [f(1, "d")]) == []
    # batch 2: channel 1 delivers barrier 1 -> checkpoint 1 ready
    assert ledger.apply(2, [f(1, "e"), b(1, 1, 7), f(1, "g")]) == [1]
    assert ledger.pending_transactions(1) == {1: ["a", "c", "d", "e"]}
    assert ledger.arrivals[1] == {0: 10, 1: 7}
    assert ledger.open_files == {0: ["b"], 1: ["g"]}


def test_replayed_batch_is_ignored_and_json_round_trips() -> None:
    ledger = SinkLedger()
    ledger.apply(0, [f(0, "a"), b(0, 1, 1), b(1, 1, 0)])
    before = ledger.to_json()
    assert ledger.apply(0, [f(0, "zzz"), b(0, 2, 5)]) == []
    assert ledger.to_json() == before
    assert SinkLedger.from_json(before).to_json() == before


def test_transactions_stay_until_committed() -> None:
    ledger = SinkLedger()
    ledger.apply(0, [f(0, "a"), b(0, 1, 1), b(1, 1, 0)])
    ledger.apply(1, [f(1, "b"), b(0, 2, 1), b(1, 2, 1)])
    assert ledger.pending_transactions(2) == {1: ["a"], 2: ["b"]}  # 1 not committed yet
    ledger.committed(1)
    assert ledger.pending_transactions(2) == {2: ["b"]}


def test_corrupt_ledger_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        SinkLedger.from_json("{}")
    with pytest.raises(ProtocolError):
        SinkLedger().apply(0, [SinkEvent(0)])


def test_split_at_barriers_stages_runs_between_barriers_per_channel() -> None:
    user = pa.schema([pa.field("v", pa.int64())])
    schema = stream_schema(user)
    ch0 = channel_rows(pa.table({"v": [0, 1, 2]}), schema, 0, 0, [(2, CheckpointBarrier(5, 0))], 2)
    ch1 = channel_rows(pa.table({"v": [10, 11]}), schema, 1, 0, [(0, CheckpointBarrier(5, 0))], 2)
    staged: list[list[int]] = []

    def stage(rows: pa.Table) -> str:
        assert rows.column_names == ["v"]
        staged.append(rows.column("v").to_pylist())
        return f"file{len(staged)}"

    events = split_at_barriers(pa.concat_tables([ch0, ch1]), stage)
    assert staged == [[0, 1], [2], [10, 11]]
    assert events == [
        SinkEvent(0, file="file1"),
        SinkEvent(0, checkpoint_id=5, offset=2, channels=2),
        SinkEvent(0, file="file2"),
        SinkEvent(1, checkpoint_id=5, offset=0, channels=2),
        SinkEvent(1, file="file3"),
    ]

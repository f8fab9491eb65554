"""A task hands its operators each run of records as one batch: the rows of both channels
before their barriers in one call (each channel's rows in order), never rows from both
sides of a snapshot."""

from __future__ import annotations

import pyarrow as pa
from timed_jobs import CHANNELS, Batch, Job

from spark_ckpt.protocol.barrier import CHANNEL, OFFSET
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.runtime.operator import KeyedOperator
from spark_ckpt.state.context import StateContext

calls: list[list[tuple[int, int]]] = []


class Recorder(KeyedOperator):
    """Records the (channel, offset) of every row of each call."""

    def __init__(self) -> None:
        super().__init__("recorder", "k", pa.int64())

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        pairs = zip(
            batch.column(CHANNEL).to_pylist(), batch.column(OFFSET).to_pylist(), strict=True
        )
        calls.append(list(pairs))
        return None


def test_the_rows_of_both_channels_before_a_snapshot_are_one_batch() -> None:
    calls.clear()
    job = Job(Recorder, WatermarkStrategy.no_watermarks(), 1)
    job.start(1)
    positions = dict.fromkeys(CHANNELS, 0)
    rows = {c: [(k, 1000 + k) for k in range(5)] for c in CHANNELS}
    job.feed(0, Batch(rows, {}, True), positions)
    job.feed(1, Batch(rows, {}, False), positions)
    job.feed(2, Batch(rows, {}, True), positions)
    first = [(c, o) for c in CHANNELS for o in range(5)]
    later = [(c, o) for c in CHANNELS for o in range(5, 10)]
    last = [(c, o) for c in CHANNELS for o in range(10, 15)]
    assert calls == [first, later, last]

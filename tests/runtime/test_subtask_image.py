"""A subtask rebuilt from its image at every micro-batch behaves as one that never left its
process: the same acknowledgements, the same state at every checkpoint, the same output.

Oracle: a plain fold over the generator's input — per key, the running count at every row
and the count at each checkpoint's positions; the rows seen in total (operator state)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import ProtocolError, StateError
from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.handle import AcknowledgeCheckpoint, DeclineCheckpoint, TaskId
from spark_ckpt.runtime.operator import KeyedOperator, RunningCount
from spark_ckpt.runtime.subtask_image import (
    SubtaskImage,
    export_image,
    export_images,
    import_image,
    import_images,
)
from spark_ckpt.runtime.task import CHAIN_VERTEX, OperatorTask
from spark_ckpt.sinks.memory import MemorySink
from spark_ckpt.sinks.sink import Transaction
from spark_ckpt.sources.channel_batch import stream_schema
from spark_ckpt.sources.generator import GENERATOR_SCHEMA, GeneratorSpec
from spark_ckpt.sources.stream_offset import StreamOffset
from spark_ckpt.state.handle import StateHandle
from spark_ckpt.state.restore import restore_backend
from spark_ckpt.storage.memory import InMemoryCheckpointStore
from spark_ckpt.testing.micro_batches import MicroBatches

CHANNELS = 2
HEADS = (120, 90)
SPEC = GeneratorSpec(seed=5, channels=CHANNELS, rows_per_second=0, backlog=HEADS, key_cardinality=7)
SCHEMA = stream_schema(GENERATOR_SCHEMA)


class RowsSeen(KeyedOperator):
    """Passes rows through; operator state: the rows it has seen."""

    def __init__(self) -> None:
        super().__init__("seen", "user_id", pa.int64())

    def open(self, state: StateHandle) -> None:
        state.operator_list_state("rows", pa.int64())

    def process_batch(self, batch: pa.Table, state: StateHandle) -> pa.Table | None:
        rows = state.operator_list_state("rows", pa.int64())
        rows.update([sum(rows.get()) + batch.num_rows])
        return batch


def new_task(store: InMemoryCheckpointStore, sink: MemorySink, acks: list[Any]) -> OperatorTask:
    return OperatorTask(
        TaskId(CHAIN_VERTEX, 0),
        channels=range(CHANNELS),
        operators=[RowsSeen(), RunningCount("counter", "user_id")],
        parallelism=1,
        store=store,
        respond=acks.append,
        clock=ManualClock(0),
        sink=sink,
        source_vertex="source",
    )


def run(batches: list[tuple[int, bool]], *, via: str) -> tuple[list[Any], MemorySink, Any]:
    """Feed the micro-batches (read limit, whether a checkpoint is triggered) and a final
    one to a subtask, which a fresh task takes over before every micro-batch *via* the
    previous one's ``image``, or its ``changelog``: the chain of images since the newest
    full one (full after a snapshot, a segment of changes otherwise). Returns the
    acknowledgements, the sink and the store."""
    store, sink, acks = InMemoryCheckpointStore(), MemorySink(), []
    micro = MicroBatches(SPEC.rows, SCHEMA, StreamOffset.initial([0] * CHANNELS))
    task = new_task(store, sink, acks)
    chain: list[SubtaskImage] = [export_image(task, sink.writer)]
    next_id = 1
    for max_rows, trigger in [*batches, (None, True)]:
        barriers = [CheckpointBarrier(next_id, 0)] if trigger else []
        next_id += trigger
        table = micro.next(barriers, HEADS, max_rows)
        task = new_task(store, sink, acks)
        import_images(task, sink.writer, chain)
        task.process(table)
        snapshot = any(b.pending_snapshots() for b in task.backends.values())
        full, segment = export_images(
            task, sink.writer, changes=via == "changelog" and not snapshot
        )
        if segment is full:
            chain = [full]
        else:
            chain.append(segment)
    return acks, sink, store


def fold(ends: dict[tuple[str, int], int]) -> Counter[int]:
    counts: Counter[int] = Counter()
    for c in range(CHANNELS):
        counts.update(SPEC.rows(c, 0, ends[("source", c)]).column("user_id").to_pylist())
    return counts


def checkpoint_state(store: InMemoryCheckpointStore, ack: AcknowledgeCheckpoint) -> Any:
    """(counts per key, rows seen) restored from the acknowledged state."""
    task = new_task(InMemoryCheckpointStore(), MemorySink(), [])
    for uid, backend in task.backends.items():
        refs = [r for r in ack.state.blobs if r.operator_uid == uid]
        restore_backend(backend, refs, store.read_blob)
    counter = task.backends["counter"].to_table("count")
    counts = dict(zip(counter.column(1).to_pylist(), counter.column(2).to_pylist(), strict=True))
    seen = task.backends["seen"].operator_list_state("rows", pa.int64()).get()
    return counts, sum(seen)


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(
        st.tuples(st.sampled_from([None, 10, 30, 50]), st.booleans()), min_size=1, max_size=12
    ),
    via=st.sampled_from(["image", "changelog"]),
)
def test_a_subtask_rebuilt_every_batch_matches_the_fold(
    batches: list[tuple[int | None, bool]], via: str
) -> None:
    acks, sink, store = run(batches, via=via)
    assert not [a for a in acks if isinstance(a, DeclineCheckpoint)]
    final = None
    for ack in acks:
        assert isinstance(ack, AcknowledgeCheckpoint)
        ends = {(o.source, o.channel): o.offset for o in ack.state.offsets}
        counts, seen = checkpoint_state(store, ack)
        folded = fold(ends)
        assert counts == dict(folded)
        assert seen == sum(folded.values())
        final = ack
    assert final is not None and [o.offset for o in final.state.offsets] == list(HEADS)
    # every transaction sealed up to the final checkpoint: exactly the running counts
    txns = [
        t
        for table in store.read_blobs(
            [r for r in final.state.blobs if r.state_name == "_sink_transactions"]
        )
        for t in table.column("transaction").to_pylist()
    ]
    for text in txns:
        sink.committer.commit(Transaction.from_json(text))
    out = sink.committer.output()
    got = Counter(
        zip(out.column("user_id").to_pylist(), out.column("count").to_pylist(), strict=True)
    )
    total = fold({("source", c): h for c, h in enumerate(HEADS)})
    assert got == Counter((k, i) for k, n in total.items() for i in range(1, n + 1))


def test_an_image_loads_only_into_its_own_subtask_and_version() -> None:
    store, sink = InMemoryCheckpointStore(), MemorySink()
    image = export_image(new_task(store, sink, []), sink.writer)
    other = OperatorTask(
        TaskId(CHAIN_VERTEX, 1),
        channels=range(CHANNELS),
        operators=[RunningCount()],
        parallelism=2,
        store=store,
        respond=lambda _: None,
        clock=ManualClock(0),
    )
    with pytest.raises(StateError, match="subtask 0"):
        import_image(other, None, image)
    with pytest.raises(StateError, match="version"):
        import_image(
            new_task(store, sink, []), None, SubtaskImage({}, {**image.meta, "version": 9})
        )


def test_a_subtask_still_aligning_has_no_image() -> None:
    store, sink = InMemoryCheckpointStore(), MemorySink()
    task = new_task(store, sink, [])
    micro = MicroBatches(SPEC.rows, SCHEMA, StreamOffset.initial([0] * CHANNELS))
    table = micro.next([CheckpointBarrier(1, 0)], HEADS, 20)
    task.process(table.filter(pa.compute.not_equal(table.column("_ckpt_channel"), 1)))
    with pytest.raises(ProtocolError, match="aligning"):
        export_image(task, sink.writer)

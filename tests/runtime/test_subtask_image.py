"""A subtask rebuilt from its image at every micro-batch behaves as one that never left its
process: the same acknowledgements, the same state at every checkpoint, the same output.

Oracle: a plain fold over the generator's input — per key, the running count at every row
and the count at each checkpoint's positions; the rows seen in total (operator state)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import ProtocolError, StateError
from spark_ckpt.protocol.barrier import CheckpointBarrier, SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import (
    AcknowledgeCheckpoint,
    BlobKind,
    DeclineCheckpoint,
    TaskId,
)
from spark_ckpt.runtime.operator import KeyedOperator, RunningCount
from spark_ckpt.runtime.subtask_image import (
    DELTA,
    SubtaskImage,
    catch_up,
    export_folded_image,
    export_image,
    import_image,
    import_images,
)
from spark_ckpt.runtime.task import CHAIN_VERTEX, OperatorTask
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.sinks.two_phase_commit import Transaction
from spark_ckpt.sources.channel_batch import stream_schema
from spark_ckpt.sources.generator import GENERATOR_SCHEMA, GeneratorSpec
from spark_ckpt.sources.stream_offset import StreamOffset
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import ListStateDescriptor, MapStateDescriptor
from spark_ckpt.state.state_restore import restore_backend
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore
from spark_ckpt.testing.micro_batches import MicroBatches

CHANNELS = 2
HEADS = (120, 90)
SPEC = GeneratorSpec(seed=5, channels=CHANNELS, rows_per_second=0, backlog=HEADS, key_cardinality=7)
#: many keys, few of them changed per micro-batch: folds of the changelog stay small
SPEC_WIDE = GeneratorSpec(
    seed=5, channels=CHANNELS, rows_per_second=0, backlog=HEADS, key_cardinality=1000
)
SCHEMA = stream_schema(GENERATOR_SCHEMA)


class RowsSeen(KeyedOperator):
    """Passes rows through; operator state: the rows it has seen."""

    def __init__(self) -> None:
        super().__init__("seen", "user_id", pa.int64())

    def open(self, state: StateContext) -> None:
        state.operator_list_state("rows", pa.int64())

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        rows = state.operator_list_state("rows", pa.int64())
        rows.update([sum(rows.get()) + batch.num_rows])
        return batch


class Recent(KeyedOperator):
    """Per key, per record: the last three amounts (list state, cleared at every fourth
    row) and the rows per amount's parity (map state; the odd entry removed at every fifth
    row): changes, tombstones and whole-collection values for the changelog to carry."""

    RECENT = ListStateDescriptor("recent", pa.int64())
    PARITY = MapStateDescriptor("parity", pa.string(), pa.int64())

    def __init__(self) -> None:
        super().__init__("recent", "user_id", pa.int64())

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        recent, parity = state.list_state(self.RECENT), state.map_state(self.PARITY)
        for key, amount in zip(
            batch.column("user_id").to_pylist(), batch.column("amount").to_pylist(), strict=True
        ):
            state.set_current_key(key)
            values = recent.get()
            if len(values) >= 3:
                recent.clear()
            else:
                recent.add(amount)
            name = "odd" if amount % 2 else "even"
            parity.put(name, (parity.get(name) or 0) + 1)
            if (parity.get("even") or 0) % 5 == 4:
                parity.remove("odd")
        return batch


def counting_chain() -> list[KeyedOperator]:
    return [RowsSeen(), RunningCount("counter", "user_id")]


def new_task(
    store: InMemoryCheckpointStore,
    sink: MemorySink,
    acks: list[Any],
    chain: Callable[[], list[KeyedOperator]] = counting_chain,
) -> OperatorTask:
    return OperatorTask(
        TaskId(CHAIN_VERTEX, 0),
        channels=range(CHANNELS),
        operators=chain(),
        parallelism=1,
        store=store,
        respond=acks.append,
        clock=ManualClock(0),
        sink=sink,
        source_vertex="source",
    )


def run(
    batches: list[tuple[int | None, bool]],
    *,
    via: str,
    schedule: list[int] | None = None,
    chain: Callable[[], list[KeyedOperator]] = counting_chain,
    folds: bool = False,
    spec: GeneratorSpec = SPEC,
    rebase: bool = False,
    heads: tuple[int, ...] = HEADS,
) -> tuple[list[Any], MemorySink, Any]:
    """Feed the micro-batches (read limit, whether a checkpoint is triggered) and a final
    one to a subtask, which a fresh task takes over before every micro-batch *via* the
    previous one's ``image``, or its ``changelog``: the chain of images since the newest
    full one (full at the start and every fifth, a segment of changes otherwise; with
    *folds*, every fifth folds the chain's segments into one when the task can, as
    :mod:`spark_ckpt.spark.executors.changelog` links it). ``workers``: as on the executors, each
    micro-batch runs in the Python worker that *schedule* names (cycled; 0 or 1, -1: a new
    worker), whose task stays alive between micro-batches: it continues if it ran the
    previous micro-batch, catches up by the changelog's images since its own if it can
    (through a fold of the chain it stands on), else a fresh task rebuilds from the chain;
    completions are notified, so snapshots are incremental; with *rebase*, a task caught up
    or rebuilt builds its next snapshot on the latest acknowledged checkpoint (as the
    executors build it on the latest committed one). Returns the acknowledgements, the
    sink and the store."""
    store, sink, acks = InMemoryCheckpointStore(), MemorySink(), []
    micro = MicroBatches(spec.rows, SCHEMA, StreamOffset.initial([0] * CHANNELS))
    log: list[SubtaskImage] = [export_image(new_task(store, sink, acks, chain), sink.writer)]
    links = [0]  # the current chain: positions in log, its full image first
    folded: dict[int, set[int]] = {}  # a fold's position -> the positions it folds
    alive: dict[int, tuple[OperatorTask, int]] = {}  # worker -> (task, its log position)
    order = schedule or [-1]
    next_id = 1
    for i, (max_rows, trigger) in enumerate([*batches, (None, True)]):
        barriers = [CheckpointBarrier(next_id, 0)] if trigger else []
        next_id += trigger
        table = micro.next(barriers, heads, max_rows)
        worker = order[i % len(order)] if via == "workers" else -1
        held = alive.pop(worker, None)
        through = [j for j in links if held is not None and held[1] in folded.get(j, ())]
        if held is not None and held[1] == links[-1]:
            task = held[0]
            sink.writer.attach(task.sink_uid, 0, tuple(log[-1].meta["open"]))
        elif held is not None and (held[1] in links or through):
            task = held[0]
            after = links.index(through[0]) if through else links.index(held[1]) + 1
            catch_up(task, sink.writer, [log[j] for j in links[after:]])
        else:
            task = new_task(store, sink, acks, chain)
            import_images(task, sink.writer, [log[j] for j in links])
        if (
            rebase
            and acks
            and not any(b.snapshots.base_checkpoint_id for b in task.backends.values())
        ):
            task.rebase(completed(acks[-1]))
        seen = len(acks)
        task.process(table)
        if via == "workers":
            for ack in acks[seen:]:
                task.notify_complete(ack.checkpoint_id, 0)  # nothing committed: keep sealed
        image = None
        if via != "image" and i % 5 == 4 and folds:
            image = export_folded_image(task, sink.writer)
            if image is not None:
                folded[len(log)] = {j for k in links[1:] for j in {k, *folded.get(k, ())}}
                links = [links[0], len(log)]
        if image is None:
            changes = via != "image" and i % 5 != 4
            image = export_image(task, sink.writer, changes=changes)
            links = [*links, len(log)] if changes else [len(log)]
        log.append(image)
        if worker >= 0:
            alive[worker] = (task, len(log) - 1)
    return acks, sink, store


def completed(ack: AcknowledgeCheckpoint) -> CompletedCheckpoint:
    """The checkpoint a coordinator would complete from this subtask's acknowledgement."""
    return CompletedCheckpoint(
        ack.checkpoint_id, SnapshotType.CHECKPOINT, (ack.state,), CheckpointStats(0, 0)
    )


def fold(ends: dict[tuple[str, int], int], spec: GeneratorSpec = SPEC) -> Counter[int]:
    counts: Counter[int] = Counter()
    for c in range(CHANNELS):
        counts.update(spec.rows(c, 0, ends[("source", c)]).column("user_id").to_pylist())
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
        st.tuples(st.sampled_from([None, 10, 30, 50]), st.booleans()), min_size=1, max_size=16
    ),
    via=st.sampled_from(["image", "changelog", "workers"]),
    schedule=st.lists(st.sampled_from([0, 1, -1]), min_size=1, max_size=12),
    folds=st.booleans(),
    rebase=st.booleans(),
)
def test_a_subtask_rebuilt_every_batch_matches_the_fold(
    batches: list[tuple[int | None, bool]],
    via: str,
    schedule: list[int],
    folds: bool,
    rebase: bool,
) -> None:
    spec = SPEC_WIDE if folds else SPEC
    acks, sink, store = run(
        batches, via=via, schedule=schedule, folds=folds, spec=spec, rebase=rebase
    )
    assert_matches_the_fold(acks, sink, store, spec)


def assert_matches_the_fold(
    acks: list[Any],
    sink: MemorySink,
    store: InMemoryCheckpointStore,
    spec: GeneratorSpec,
    heads: tuple[int, ...] = HEADS,
) -> None:
    """Every checkpoint's state is the plain fold over the input up to its offsets, and the
    committed output is every running count once."""
    assert not [a for a in acks if isinstance(a, DeclineCheckpoint)]
    # a snapshot builds only on a checkpoint the coordinator still keeps: bases never go back
    kept_from = 0
    for ack in acks:
        assert ack.base_checkpoint_id == 0 or ack.base_checkpoint_id >= kept_from
        kept_from = max(kept_from, ack.base_checkpoint_id)
    final = None
    for ack in acks:
        assert isinstance(ack, AcknowledgeCheckpoint)
        ends = {(o.source, o.channel): o.offset for o in ack.state.offsets}
        counts, seen = checkpoint_state(store, ack)
        folded = fold(ends, spec)
        assert counts == dict(folded)
        assert seen == sum(folded.values())
        final = ack
    assert final is not None and [o.offset for o in final.state.offsets] == list(heads)
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
    total = fold({("source", c): h for c, h in enumerate(heads)}, spec)
    assert got == Counter((k, i) for k, n in total.items() for i in range(1, n + 1))


def test_a_folded_changelog_rebuilds_and_catches_up_like_the_fold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # worker 0 exports the full image at micro-batch 4 and folds the chain at 9; worker 1,
    # which stands on a delta the fold replaced (micro-batch 6), catches up through the
    # fold at 10; a new worker rebuilds from [full, fold, ...] at 12
    schedule = [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, -1, 1]
    counted = {"fold": 0}
    real = export_folded_image

    def counting(task: OperatorTask, writer: Any) -> SubtaskImage | None:
        image = real(task, writer)
        counted["fold"] += image is not None
        return image

    monkeypatch.setitem(globals(), "export_folded_image", counting)
    batches = [(60, True)] + [(8, True)] * 12
    acks, sink, store = run(batches, via="workers", schedule=schedule, folds=True, spec=SPEC_WIDE)
    assert counted["fold"] == 1
    assert_matches_the_fold(acks, sink, store, SPEC_WIDE)


def full_snapshots(acks: list[Any]) -> list[int]:
    """The checkpoints whose snapshot wrote a full keyed blob."""
    return [
        a.checkpoint_id
        for a in acks
        if any(
            r.kind is BlobKind.KEYED_FULL and r.checkpoint_id == a.checkpoint_id
            for r in a.state.blobs
        )
    ]


def test_workers_taking_turns_build_on_the_latest_checkpoint_not_a_full_one() -> None:
    # two workers alternate (as under local[2]): each catches up by the other's segment
    # after the other snapshotted; rebased onto the latest checkpoint, its next snapshot is
    # a delta, and every checkpoint restores the fold
    batches = [(60, True)] + [(6, True)] * 11
    schedule = [0, 1]
    acks, sink, store = run(
        batches, via="workers", schedule=schedule, spec=SPEC_WIDE, folds=True, rebase=True
    )
    assert_matches_the_fold(acks, sink, store, SPEC_WIDE)
    assert [a.base_checkpoint_id for a in acks][1:] == [a.checkpoint_id for a in acks][:-1]
    # full: the first; the 9th delta of a chain whose full blob (checkpoint 1) predates the
    # changelog's full image (micro-batch 4), so what its deltas hold is unknown after a
    # rebase and it cannot fold; the last (its micro-batch reads every row left)
    assert set(full_snapshots(acks)) <= {1, 10, 13}
    # a rebased delta holds what changed since the checkpoint it builds on: the 6 rows of a
    # micro-batch, except after a fold of the changelog (which holds everything since the
    # changelog's full image)
    rows = [
        sum(
            r.rows
            for r in a.state.blobs
            if r.checkpoint_id == a.checkpoint_id and r.state_name == "count"
        )
        for a in acks
        if a.checkpoint_id not in (1, 10, 11, 13)
    ]
    assert max(rows) <= 6
    # without the rebase, every worker switch after a snapshot made the next one full
    plain, _, _ = run(batches, via="workers", schedule=schedule, spec=SPEC_WIDE, folds=True)
    assert all(a.base_checkpoint_id == 0 for a in plain)
    assert set(range(6, 13)) <= set(full_snapshots(plain))


#: a longer input, for runs of many micro-batches
SPEC_LONG = GeneratorSpec(
    seed=5, channels=CHANNELS, rows_per_second=0, backlog=(600, 500), key_cardinality=400
)


@pytest.mark.slow  # long runs; the fast lane has the short ones above
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_long_runs_with_folds_rebases_and_worker_turns_match_the_fold(seed: int) -> None:
    # up to 40 micro-batches: chains fold (changelog and checkpoints), workers take turns,
    # catch up through folds, rebuild and rebase; every checkpoint restores the fold
    rnd = random.Random(seed)
    batches = [
        (rnd.choice([5, 10, 20, 40, 8]), rnd.random() < 0.7) for _ in range(rnd.randint(5, 40))
    ]
    schedule = [rnd.choice([0, 1, 1, 0, -1]) for _ in range(rnd.randint(1, 10))]
    acks, sink, store = run(
        batches,
        via=rnd.choice(["workers", "workers", "changelog", "image"]),
        schedule=schedule,
        folds=rnd.random() < 0.7,
        spec=SPEC_LONG,
        rebase=rnd.random() < 0.7,
        heads=(600, 500),
    )
    assert_matches_the_fold(acks, sink, store, SPEC_LONG, (600, 500))


def restored_states(store: InMemoryCheckpointStore, ack: AcknowledgeCheckpoint) -> dict[str, Any]:
    """Every keyed state of the acknowledged snapshot, as sorted rows."""
    task = new_task(InMemoryCheckpointStore(), MemorySink(), [], lambda: [Recent()])
    backend = task.backends["recent"]
    restore_backend(
        backend, [r for r in ack.state.blobs if r.operator_uid == "recent"], store.read_blob
    )
    return {
        d.name: sorted(map(str, backend.to_table(d).to_pylist())) for d in backend.descriptors()
    }


@settings(max_examples=25, deadline=None)
@given(
    batches=st.lists(
        st.tuples(st.sampled_from([None, 10, 30]), st.booleans()), min_size=1, max_size=10
    ),
    schedule=st.lists(st.sampled_from([0, 1, -1]), min_size=1, max_size=8),
    folds=st.booleans(),
    rebase=st.booleans(),
)
def test_list_and_map_state_across_workers_match_one_task(
    batches: list[tuple[int | None, bool]], schedule: list[int], folds: bool, rebase: bool
) -> None:
    """Differential: every checkpoint of a subtask that moves between workers (continued,
    caught up, rebuilt; through folded changelogs) holds the same list and map state as one
    task that ran it all."""
    spec = SPEC_WIDE if folds else SPEC
    acks, _, store = run(
        batches,
        via="workers",
        schedule=schedule,
        chain=lambda: [Recent()],
        folds=folds,
        spec=spec,
        rebase=rebase,
    )
    reference, _, reference_store = run(
        batches, via="workers", schedule=[0], chain=lambda: [Recent()], spec=spec
    )
    assert [a.checkpoint_id for a in acks] == [a.checkpoint_id for a in reference]
    for ack, expected in zip(acks, reference, strict=True):
        assert restored_states(store, ack) == restored_states(reference_store, expected)


def test_a_subtask_kept_alive_checkpoints_only_what_changed() -> None:
    batches = [(60, True), (2, True), (2, False), (2, True)]
    acks, _, _ = run(batches, via="workers", schedule=[0])
    assert [a.base_checkpoint_id for a in acks] == [0, 1, 2, 3]
    kinds = [{r.kind for r in a.state.blobs if r.state_name == "count"} for a in acks]
    assert kinds[0] == {BlobKind.KEYED_FULL}
    assert kinds[1] == {BlobKind.KEYED_FULL, BlobKind.KEYED_DELTA}  # the first chain reused
    # another worker snapshotted in between: the next snapshot is full
    acks, _, _ = run(batches, via="workers", schedule=[0, 1, 0, 0, 0])
    assert [a.base_checkpoint_id for a in acks] == [0, 0, 0, 3]
    # worker 0 never builds on its checkpoint 1 once worker 1 reported base 2 (the
    # coordinator may have dropped checkpoint 1 by then)
    every = [(60, True), (2, True), (2, True), (2, True)]
    acks, _, _ = run(every, via="workers", schedule=[0, 1, 1, 0])
    assert [a.base_checkpoint_id for a in acks] == [0, 0, 2, 0, 4]
    # rebuilt from its image or changelog before every micro-batch, a subtask has no base
    for via in ("image", "changelog"):
        rebuilt, _, _ = run(batches, via=via)
        assert [a.base_checkpoint_id for a in rebuilt] == [0, 0, 0, 0]
        assert all(r.kind is not BlobKind.KEYED_DELTA for a in rebuilt for r in a.state.blobs)


def test_a_worker_catches_up_by_the_changes_of_the_others() -> None:
    store, sink = InMemoryCheckpointStore(), MemorySink()
    micro = MicroBatches(SPEC.rows, SCHEMA, StreamOffset.initial([0] * CHANNELS))
    one, other = new_task(store, sink, []), new_task(store, sink, [])
    import_images(other, sink.writer, [export_image(one, sink.writer)])
    one.process(micro.next([], HEADS, 40))
    full = export_image(one, sink.writer)
    sink.writer.attach(one.sink_uid, 0, tuple(full.meta["open"]))
    one.process(micro.next([], HEADS, 10))
    delta = export_image(one, sink.writer, changes=True)
    assert delta.meta["kind"] == DELTA
    with pytest.raises(StateError, match="by delta images only"):
        catch_up(other, sink.writer, [full, delta])
    third = new_task(store, sink, [])
    import_images(third, sink.writer, [full])
    sink.writer.detach(third.sink_uid, 0)
    catch_up(third, sink.writer, [delta])
    assert (
        third.backends["counter"]
        .to_table("count")
        .sort_by("key")
        .equals(one.backends["counter"].to_table("count").sort_by("key"))
    )


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

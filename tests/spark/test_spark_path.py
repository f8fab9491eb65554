"""The Spark code path, without Spark: the source runner's coordinator host and barrier
placement (stream offsets under read limits), the rows ``ckpt-source`` emits, the foreachBatch
aligner with keyed state, acks through the mailbox, the host as global 2PC committer, and
crashes that lose every process — driven the way Spark drives them, in random interleavings.

Oracle: a plain fold over the generator input (counts per key → the exactly-once output
multiset {(key, i) : 1 ≤ i ≤ n_key})."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_ckpt.coordination.host import CoordinatorHost
from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.messages import Request, RequestKind
from spark_ckpt.coordination.runs import RunFiles, new_run_id
from spark_ckpt.coordination.topology import SinkSpec, Topology, write_topology
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.runtime.aligner import AlignmentMode
from spark_ckpt.runtime.config import CheckpointConfig, CheckpointingMode
from spark_ckpt.runtime.coordinator import RequestStatus
from spark_ckpt.runtime.failure import CheckpointFailureReason
from spark_ckpt.runtime.operator import RunningCount
from spark_ckpt.runtime.task import CHAIN_VERTEX, SOURCE_TASK
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.sources.channel_batch import stream_schema
from spark_ckpt.sources.generator import GENERATOR_SCHEMA, GeneratorSpec
from spark_ckpt.sources.stream_offset import BarrierPlacement, StreamOffset
from spark_ckpt.spark.datasource.source_options import source_alignment
from spark_ckpt.spark.driver.batch_aligner import BatchAligner
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore
from spark_ckpt.testing.micro_batches import MicroBatches

CHANNELS = 3
BACKLOG = (240, 30, 30)  # channel 0 lags: 8 batches deep at 30 rows per channel and batch
SPEC = GeneratorSpec(
    seed=3, channels=CHANNELS, rows_per_second=0, backlog=BACKLOG, key_cardinality=12
)
SCHEMA = stream_schema(GENERATOR_SCHEMA)


def restore_point(
    root: str, run_id: str, store: InMemoryCheckpointStore
) -> CompletedCheckpoint | None:
    """What the run's foreachBatch function restores: the checkpoint its coordinator chose."""
    point = RunFiles(root, run_id).restore_point()
    assert point is not None
    return None if point.checkpoint_id is None else store.get(point.checkpoint_id)


class SparkLikeRun:
    """One query run: a source runner (host + offsets) and a foreachBatch aligner."""

    def __init__(
        self,
        root: str,
        store: InMemoryCheckpointStore,
        sink: MemorySink,
        clock: ManualClock,
        config: CheckpointConfig,
        mode: AlignmentMode,
        timeout: int,
        parallelism: int,
        threads: str = "sync",
    ) -> None:
        run_id = new_run_id()  # every query run is a new run (Pipeline.start)
        write_topology(
            root, Topology(CHAIN_VERTEX, parallelism, SinkSpec("memory", "-", CHAIN_VERTEX)), run_id
        )
        self.host = CoordinatorHost(
            root,
            config,
            store,
            sink_factory=lambda spec: sink.committer,
            clock=clock,
            run_id=run_id,
        )
        latest = self.host.start_run()  # initialOffset
        self.aligner = BatchAligner(  # built at the first foreachBatch call, from the run's files
            root,
            store,
            operators=[RunningCount("counter", "user_id")],
            channels=CHANNELS,
            parallelism=parallelism,
            mode=mode,
            sink=sink,
            clock=clock,
            async_snapshots=threads != "sync",
            pipelined=threads == "pipelined",
            restore_from=restore_point(root, run_id, store),
            run_id=run_id,
        )
        if latest is None:
            offset = StreamOffset.initial([0] * CHANNELS)
        else:
            offsets = latest.offsets()
            offset = StreamOffset.initial(
                [offsets[(SOURCE_TASK.vertex, c)] for c in range(CHANNELS)], latest.checkpoint_id
            )
        # barriers at the heads, so channel 0 lags (aligned ones wait for it)
        alignment = source_alignment(config, BarrierPlacement.HEAD)
        self.batches = MicroBatches(SPEC.rows, SCHEMA, offset, alignment)
        self.clock = clock

    def batch(self, max_rows: int | None) -> None:
        """latestOffset → partitions → read → foreachBatch, as Spark runs one micro-batch."""
        table = self.batches.next(self.host.poll(), BACKLOG, max_rows, self.clock.now_ms())
        self.aligner.submit(table)  # what foreachBatch does after toArrow


def expected_output() -> Counter[tuple[int, int]]:
    counts: Counter[int] = Counter()
    for c in range(CHANNELS):
        for k in SPEC.rows(c, 0, BACKLOG[c]).column("user_id").to_pylist():
            counts[k] += 1
    return Counter((k, i) for k, n in counts.items() for i in range(1, n + 1))


def output(sink: MemorySink) -> Counter[tuple[int, int]]:
    out = sink.committer.output()
    if out is None:
        return Counter()
    return Counter(
        zip(out.column("user_id").to_pylist(), out.column("count").to_pylist(), strict=True)
    )


MODES: dict[str, tuple[AlignmentMode, int, CheckpointingMode]] = {
    "aligned": (AlignmentMode.ALIGNED, 0, CheckpointingMode.EXACTLY_ONCE),
    "unaligned": (AlignmentMode.UNALIGNED, 0, CheckpointingMode.EXACTLY_ONCE),
    "aligned_timeout": (AlignmentMode.ALIGNED, 25, CheckpointingMode.EXACTLY_ONCE),
    "at_least_once": (AlignmentMode.AT_LEAST_ONCE, 0, CheckpointingMode.AT_LEAST_ONCE),
}

actions = st.lists(
    st.one_of(
        st.tuples(st.just("batch"), st.sampled_from([None, 30, 60, 90])),
        st.tuples(st.just("batch"), st.sampled_from([30, 60])),
        st.tuples(st.just("time"), st.integers(1, 150)),
        st.tuples(st.just("request"), st.sampled_from(list(RequestKind)[:2])),
        st.tuples(st.just("crash"), st.integers(1, 3)),
        st.tuples(st.just("drain")),  # with async snapshots: wait for the worker
    ),
    min_size=5,
    max_size=40,
)


def assert_no_failed_completion(run: SparkLikeRun) -> None:
    """Checkpoints may expire or be subsumed, but one that every task acknowledged must
    commit: its acks only reference blobs that exist (retention keeps what tasks build on)."""
    coordinator = run.host.coordinator
    if coordinator is not None:
        failed = [
            h.failure
            for h in coordinator.history
            if h.failure is not None and h.failure.reason is CheckpointFailureReason.FINALIZE_FAILED
        ]
        assert not failed, failed


def drive(root: Path, mode_name: str, script: list[tuple[Any, ...]], threads: str = "sync") -> None:
    mode, timeout, ckpt_mode = MODES[mode_name]
    config = CheckpointConfig(
        interval_ms=50,
        mode=ckpt_mode,
        unaligned=mode is AlignmentMode.UNALIGNED or timeout > 0,
        aligned_checkpoint_timeout_ms=timeout,
        tolerable_failed_checkpoints=1_000_000,
        retained_checkpoints=1,  # the least: retention races incremental snapshots
        timeout_ms=10_000,
    )
    store, sink, clock = InMemoryCheckpointStore(), MemorySink(), ManualClock(1_000)
    run = SparkLikeRun(str(root), store, sink, clock, config, mode, timeout, 2, threads)
    ids: list[int] = []
    for a in script:
        if a[0] == "batch":
            run.batch(a[1])
        elif a[0] == "time":
            clock.advance(a[1])
        elif a[0] == "request":
            Mailbox(str(root)).post(Request(f"r{len(ids)}", a[1]))
        elif a[0] == "drain":
            run.aligner.drain()
        elif a[0] == "crash":
            if threads == "pipelined":
                # the batch in flight is processed before the crash or dies with the process;
                # either way nothing of the old run writes after the crash
                run.aligner.abandon()
            sink.crash()
            assert_no_failed_completion(run)
            run.aligner.close()  # what it had queued may still reach the mailbox, or not
            run = SparkLikeRun(str(root), store, sink, clock, config, mode, timeout, a[1], threads)
        ids.extend(c.checkpoint_id for c in store.list_completed() if c.checkpoint_id not in ids)
    # Trigger.AvailableNow: micro-batches until the source has read all data (the periodic
    # checkpoints go on meanwhile), then a final checkpoint, then its commit
    for _ in range(40):
        run.batch(None)
        clock.advance(10)
        if run.batches.offset.positions == BACKLOG:
            break
    final = run.host.request_final_checkpoint()
    assert final is not None
    for _ in range(40):
        if final.status is RequestStatus.COMPLETED:
            break
        run.batch(None)
        run.aligner.drain()
    assert final.status is RequestStatus.COMPLETED
    assert_no_failed_completion(run)
    latest = store.latest_completed()
    assert latest is not None and latest.offsets() == {
        ("source", c): BACKLOG[c] for c in range(CHANNELS)
    }
    assert sink.committer.committed_checkpoint() == latest.checkpoint_id
    got, exp = output(sink), expected_output()
    if ckpt_mode is CheckpointingMode.EXACTLY_ONCE:
        assert got == exp
    else:
        assert set(exp) <= set(got)


@pytest.mark.parametrize("threads", ["sync", "async", "pipelined"])
@pytest.mark.parametrize("mode_name", list(MODES))
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=actions)
def test_spark_path_exactly_once_under_crashes(
    mode_name: str,
    threads: str,
    script: list[tuple[Any, ...]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``async``: the asynchronous phase runs on the snapshot worker thread, so acks and
    completions arrive at any point relative to the batches. ``pipelined`` (what the Pipeline
    runs) adds the processing thread: ``submit`` returns before the batch is processed, and a
    crash may come while a batch Spark considers done is still in flight. The result must
    not change."""
    drive(tmp_path_factory.mktemp("root"), mode_name, script, threads)


@pytest.mark.parametrize("mode_name", list(MODES))
def test_lagging_channel_reaches_barrier_batches_later(mode_name: str, tmp_path: Path) -> None:
    script: list[tuple[Any, ...]] = (
        [("time", 60), ("batch", 90)]
        + [("batch", 90)] * 3
        + [("time", 60), ("crash", 2)]
        + [("batch", 90)] * 4
    )
    drive(tmp_path, mode_name, script)


@pytest.mark.parametrize(
    ("mode_name", "max_batches"), [("aligned", None), ("unaligned", 2), ("aligned_timeout", 3)]
)
def test_unaligned_checkpoints_do_not_wait_for_the_lagging_channel(
    mode_name: str, max_batches: int | None, tmp_path: Path
) -> None:
    """Channel 0 is 8 micro-batches behind. An aligned checkpoint waits for its barrier; an
    unaligned one (or one past the aligned timeout) cuts the lagging channel and completes
    within a couple of micro-batches (counted in batches, not time)."""
    mode, timeout, ckpt_mode = MODES[mode_name]
    config = CheckpointConfig(
        interval_ms=None,
        mode=ckpt_mode,
        unaligned=mode is AlignmentMode.UNALIGNED or timeout > 0,
        aligned_checkpoint_timeout_ms=timeout,
        tolerable_failed_checkpoints=0,
    )
    store, sink, clock = InMemoryCheckpointStore(), MemorySink(), ManualClock(1_000)
    run = SparkLikeRun(str(tmp_path), store, sink, clock, config, mode, timeout, 2)
    run.batch(90)
    Mailbox(str(tmp_path)).post(Request("r", RequestKind.CHECKPOINT))
    batches = 0
    while not store.list_completed():
        run.batch(90)  # 30 rows per channel and batch: channel 0 has 240 rows backlog
        clock.advance(40)
        batches += 1
        assert batches < 20
    if max_batches is None:
        assert batches >= 8  # waited for the lagging channel
    else:
        assert batches <= max_batches
    resume = store.list_completed()[0].offsets()[("source", 0)]
    if max_batches is None:
        assert resume == BACKLOG[0]  # at its barrier (placed at the head: the whole backlog)
    else:
        assert resume < BACKLOG[0]  # cut: resumes before its barrier, re-reading in-flight rows

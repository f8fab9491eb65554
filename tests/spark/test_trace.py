"""The engine's tracing hook (:mod:`spark_ckpt.protocol.trace`), without Spark: a tracer handed
to the foreachBatch aligner receives every phase of a run that takes checkpoints — on the
batch's thread, and on the snapshot worker's thread for the asynchronous phase — with spans
closed and nested on each thread; the default spec, with its no-op tracer, pickles."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from spark_ckpt.coordination.host import CoordinatorHost
from spark_ckpt.coordination.runs import new_run_id
from spark_ckpt.coordination.topology import SinkSpec, Topology, write_topology
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.trace import NOOP_TRACER, NoopTracer, Phase, Tracer
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.operator import RunningCount
from spark_ckpt.runtime.task import CHAIN_VERTEX
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.sources.channel_batch import stream_schema
from spark_ckpt.sources.generator import GENERATOR_SCHEMA, GeneratorSpec
from spark_ckpt.sources.stream_offset import StreamOffset
from spark_ckpt.spark.driver.batch_aligner import BatchAligner
from spark_ckpt.spark.driver.foreach_batch import ForeachBatchFunction
from spark_ckpt.spark.subtask_spec import AlignerSpec
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore
from spark_ckpt.testing.micro_batches import MicroBatches

CHANNELS = 2
BACKLOG = (400, 400)
SPEC = GeneratorSpec(seed=5, channels=CHANNELS, rows_per_second=0, backlog=BACKLOG)
SCHEMA = stream_schema(GENERATOR_SCHEMA)


class RecordingTracer:
    """Records (phase, thread name) of every closed span; checks nesting per thread."""

    def __init__(self) -> None:
        self.spans: list[tuple[Phase, str]] = []
        self.open: dict[str, list[Phase]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def _span(self, phase: Phase) -> Iterator[None]:
        name = threading.current_thread().name
        with self._lock:
            self.open.setdefault(name, []).append(phase)
        try:
            yield
        finally:
            with self._lock:
                assert self.open[name].pop() is phase  # closed innermost first
                self.spans.append((phase, name))

    def span(self, phase: Phase) -> AbstractContextManager[None]:
        return self._span(phase)

    def phases(self, thread: str | None = None) -> set[Phase]:
        with self._lock:
            return {p for p, t in self.spans if thread is None or t == thread}


def run_engine(root: Path, tracer: Tracer, *, async_snapshots: bool) -> None:
    """A run of a few micro-batches with a checkpoint every 50 ms of (manual) time, the way
    Spark drives it: coordinator poll and barrier placement, read, foreachBatch."""
    run_id = new_run_id()
    write_topology(
        str(root), Topology(CHAIN_VERTEX, 2, SinkSpec("memory", "-", CHAIN_VERTEX)), run_id
    )
    store, sink, clock = InMemoryCheckpointStore(), MemorySink(), ManualClock(1_000)
    host = CoordinatorHost(
        str(root),
        CheckpointConfig(interval_ms=50, retained_checkpoints=2),
        store,
        sink_factory=lambda spec: sink.committer,
        clock=clock,
        run_id=run_id,
    )
    assert host.start_run() is None
    aligner = BatchAligner(
        str(root),
        store,
        operators=[RunningCount("counter", "user_id")],
        channels=CHANNELS,
        parallelism=2,
        sink=sink,
        clock=clock,
        async_snapshots=async_snapshots,
        run_id=run_id,
        tracer=tracer,
    )
    batches = MicroBatches(SPEC.rows, SCHEMA, StreamOffset.initial([0] * CHANNELS))
    try:
        for _ in range(12):
            clock.advance(60)
            table = batches.next(host.poll(), BACKLOG, 40)  # barriers at the read position
            aligner.submit(table)
            aligner.drain()
    finally:
        aligner.close()
    assert len(store.list_completed()) >= 2  # checkpoints completed and were notified


@pytest.mark.parametrize("async_snapshots", [False, True])
def test_tracer_receives_every_phase(tmp_path: Path, async_snapshots: bool) -> None:
    tracer = RecordingTracer()
    run_engine(tmp_path, tracer, async_snapshots=async_snapshots)
    assert tracer.phases() == set(Phase)
    assert all(not stack for stack in tracer.open.values())  # every span closed
    main = threading.current_thread().name
    on_batch_thread = {
        Phase.NOTIFY_COMPLETED,
        Phase.ROUTE,
        Phase.OPERATOR,
        Phase.SINK_WRITE,
        Phase.SNAPSHOT_SYNC,
        Phase.SINK_PRE_COMMIT,
        Phase.SNAPSHOT_ASYNC,
        Phase.MAILBOX,  # the batch's outbox (empty with async snapshots: the span still runs)
    }
    assert on_batch_thread <= tracer.phases(main)
    if async_snapshots:
        worker = {Phase.SNAPSHOT_WRITE, Phase.MAILBOX, Phase.LIST_COMPLETED}
        assert worker <= tracer.phases("spark-ckpt-snapshot")
        assert Phase.SNAPSHOT_WRITE not in tracer.phases(main)
    else:
        assert tracer.phases(main) == set(Phase)


def test_default_tracer_is_a_shared_no_op() -> None:
    with NOOP_TRACER.span(Phase.OPERATOR), NOOP_TRACER.span(Phase.ROUTE):
        pass
    assert NOOP_TRACER.span(Phase.OPERATOR) is NOOP_TRACER.span(Phase.MAILBOX)
    assert NoopTracer() == NOOP_TRACER


def test_default_spec_and_function_pickle() -> None:
    spec = AlignerSpec(
        root="/tmp/root",
        pipeline="p",
        run_id="r1",
        operators=(RunningCount("counter", "user_id"),),
        channels=CHANNELS,
        output="/tmp/out",
    )
    assert spec.tracer is NOOP_TRACER
    again = pickle.loads(pickle.dumps(spec))
    assert [op.uid for op in again.operators] == ["counter"]
    assert replace(again, operators=spec.operators) == spec  # operators compare by identity
    assert isinstance(again.tracer, NoopTracer)
    function = pickle.loads(pickle.dumps(ForeachBatchFunction(spec)))
    assert function.spec.run_id == "r1" and function.spec.tracer == NOOP_TRACER
    assert function.aligner is None

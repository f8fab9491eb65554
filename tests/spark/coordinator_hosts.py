"""A run's coordinator host on a real Delta store, driven poll by poll with a manual clock
(no Spark): what the tests of its requests start from."""

from __future__ import annotations

from spark_ckpt.coordination.host import CoordinatorHost
from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.runs import new_run_id
from spark_ckpt.coordination.topology import SinkSpec, Topology, write_topology
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import AcknowledgeCheckpoint, TaskId, TaskStateHandle
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.task import CHAIN_VERTEX
from spark_ckpt.sinks.memory_sink import MemorySink

SUBTASKS = [TaskId(CHAIN_VERTEX, s) for s in range(2)]


def run_host(root: str, clock: ManualClock) -> tuple[CoordinatorHost, str]:
    """The host of a new run of two subtasks (periodic checkpoints every 50 ms, a memory
    sink), not started."""
    run_id = new_run_id()
    write_topology(root, Topology(CHAIN_VERTEX, 2, SinkSpec("memory", "-", CHAIN_VERTEX)), run_id)
    sink = MemorySink()
    host = CoordinatorHost(
        root,
        CheckpointConfig(interval_ms=50, tolerable_failed_checkpoints=5),
        DeltaCheckpointStore(root),
        sink_factory=lambda spec: sink.committer,
        clock=clock,
        run_id=run_id,
    )
    return host, run_id


def started_host(root: str) -> tuple[CoordinatorHost, ManualClock, str]:
    """A run's host whose first (periodic) checkpoint completed."""
    clock = ManualClock(1_000)
    host, run_id = run_host(root, clock)
    host.start_run()
    clock.advance(60)
    assert [b.checkpoint_id for b in host.poll()] == [1]
    for task in SUBTASKS:
        Mailbox(root, run_id).post(AcknowledgeCheckpoint(1, task, TaskStateHandle(task)))
    host.poll(tick=False)
    assert host.last_completed is not None and host.last_completed.checkpoint_id == 1
    return host, clock, run_id

"""The narrow state handle operators receive: it exposes registration, per-record and
vectorized access and operator state, never the backend's snapshot, restore or checkpoint
notifications; and the pure engine (``OperatorTask``) hands it to ``RunningCount`` end to end,
through a checkpoint and a restore."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from spark_ckpt.errors import StateError
from spark_ckpt.protocol.barrier import CheckpointBarrier, SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import AcknowledgeCheckpoint, DeclineCheckpoint, TaskId
from spark_ckpt.runtime.operator import RecordOperator, RunningCount
from spark_ckpt.runtime.task import OperatorTask
from spark_ckpt.sources.channel_batch import data_rows
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import ListStateDescriptor, ValueStateDescriptor
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore
from spark_ckpt.testing.simulation import RECORD_SCHEMA, STREAM_SCHEMA, barrier_table, stream_rows

COUNT = ValueStateDescriptor("count", pa.int64())
SEEN = ListStateDescriptor("seen", pa.string())

#: What of the backend (and of its snapshot strategy) belongs to the task, never to an operator.
TASK_ONLY = (
    "snapshots",
    "tables",
    "snapshot",
    "restore",
    "notify_checkpoint_complete",
    "notify_checkpoint_aborted",
    "pending_snapshots",
    "base_checkpoint_id",
    "adopt_restored",
    "register",
    "to_table",
)


def test_handle_exposes_state_access_but_not_snapshot_or_restore() -> None:
    backend = KeyedStateBackend.for_subtask("op", 0, 1, pa.int64())
    handle = StateContext(backend)
    for name in TASK_ONLY:
        assert not hasattr(handle, name), name
    with pytest.raises(AttributeError):  # no attributes can be added either
        handle.snapshot = backend.snapshots.snapshot  # type: ignore[attr-defined]

    handle.put_values(COUNT, pa.array([1, 2, 3]), pa.array([10, 20, 30]))
    assert handle.get_values(COUNT, pa.array([3, 1, 4])).to_pylist() == [30, 10, None]
    handle.clear_values(COUNT, [1])
    assert handle.get_values(COUNT, [1, 2]).to_pylist() == [None, 20]

    handle.set_current_key(2)
    assert handle.current_key == 2
    assert handle.value_state(COUNT).value() == 20
    handle.list_state(SEEN).add("a")
    handle.operator_list_state("offsets", pa.int64()).add(7)
    with pytest.raises(StateError):  # the handle keeps the backend's checks
        handle.set_current_key(None)

    # the writes went to the task's backend
    assert backend.value_count(COUNT) == 2 and backend.value_count(SEEN) == 1
    assert backend.operator_list_state("offsets", pa.int64()).get() == [7]


class RecordingCount(RunningCount):
    """RunningCount that records what the task hands it and the rows it emits."""

    def __init__(self) -> None:
        super().__init__("counter", "user_id")
        self.handed: list[type] = []
        self.out: list[dict[str, Any]] = []

    def open(self, state: StateContext) -> None:
        self.handed.append(type(state))
        super().open(state)

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        self.handed.append(type(state))
        out = super().process_batch(batch, state)
        if out is not None:
            self.out.extend(out.to_pylist())
        return out


class LastAmount(RecordOperator):
    """Per-record: emits each row's previous ``amount`` for its key (through the handle)."""

    LAST = ValueStateDescriptor("last", pa.int64())

    def __init__(self) -> None:
        super().__init__("last", "user_id", pa.int64())

    @property
    def output_schema(self) -> pa.Schema:
        return pa.schema([("user_id", pa.int64()), ("previous", pa.int64())])

    def process_record(self, row: dict[str, Any], state: StateContext) -> list[dict[str, Any]]:
        last = state.value_state(self.LAST)
        previous = last.value()
        last.update(row["amount"])
        return [{"user_id": state.current_key, "previous": previous}]


def _task(
    store: InMemoryCheckpointStore,
    operators: list[RunningCount | LastAmount],
    inbox: list[AcknowledgeCheckpoint | DeclineCheckpoint],
) -> OperatorTask:
    return OperatorTask(
        TaskId("counter", 0),
        channels=[0],
        operators=operators,
        parallelism=1,
        store=store,
        respond=inbox.append,
        clock=ManualClock(0),
    )


def test_running_count_gets_a_handle_end_to_end_through_checkpoint_and_restore() -> None:
    store = InMemoryCheckpointStore()
    inbox: list[AcknowledgeCheckpoint | DeclineCheckpoint] = []
    counter = RecordingCount()
    task = _task(store, [LastAmount(), counter], inbox)

    log = pa.table({"user_id": [1, 2, 1, 3, 1], "amount": [1, 2, 3, 4, 5]}, RECORD_SCHEMA)
    task.process(stream_rows(log, 0, 0, 5))
    task.process(barrier_table(CheckpointBarrier(1, 0), 0, 5))
    [ack] = inbox
    assert isinstance(ack, AcknowledgeCheckpoint)
    task.notify_complete(1)

    assert counter.handed and set(counter.handed) == {StateContext}
    counts = [(r["user_id"], r["count"]) for r in counter.out]
    assert counts == [(1, 1), (2, 1), (1, 2), (3, 1), (1, 3)]

    # a new task restores the checkpoint: the counts (and the per-record state) continue
    checkpoint = CompletedCheckpoint(
        1, SnapshotType.CHECKPOINT, (ack.state,), CheckpointStats(0, 0)
    )
    restored_counter = RecordingCount()
    restored = _task(store, [LastAmount(), restored_counter], [])
    restored.restore(checkpoint)
    more = pa.table({"user_id": [1, 3], "amount": [6, 7]}, RECORD_SCHEMA)
    restored.process(data_rows(more, STREAM_SCHEMA, 0, 5))
    assert set(restored_counter.handed) == {StateContext}
    assert [(r["user_id"], r["count"]) for r in restored_counter.out] == [(1, 4), (3, 2)]
    last = restored.backends["last"].to_table(LastAmount.LAST).to_pylist()
    assert {r["key"]: r["value"] for r in last} == {1: 6, 2: 2, 3: 7}


def test_value_state_exists_only_while_the_key_has_a_value() -> None:
    handle = StateContext(KeyedStateBackend.for_subtask("op", 0, 1, pa.int64()))
    handle.set_current_key(5)
    count = handle.value_state(COUNT)
    assert not count.exists() and count.value() is None
    count.update(0)  # a value that is falsy still exists
    assert count.exists()
    handle.put_values(COUNT, [6], [None])
    handle.set_current_key(6)
    assert not handle.value_state(COUNT).exists()
    handle.set_current_key(5)
    count.update(None)
    assert not count.exists()


class Closing(RunningCount):
    def __init__(self, uid: str, log: list[str], fail: bool = False) -> None:
        super().__init__(uid, "user_id")
        self.log, self.fail = log, fail

    def close(self) -> None:
        self.log.append(self.uid)
        if self.fail:
            raise RuntimeError(f"{self.uid} cannot close")


def test_a_task_closes_its_operators_once_in_chain_order(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    ops = [Closing("a", log, fail=True), Closing("b", log)]
    task = OperatorTask(
        TaskId("chain", 0),
        channels=[0],
        operators=ops,
        parallelism=1,
        store=InMemoryCheckpointStore(),
        respond=lambda m: None,
        clock=ManualClock(0),
    )
    assert log == []
    task.close()
    task.close()
    assert log == ["a", "b"]  # a failing close does not keep the next one from closing
    assert "a cannot close" in caplog.text

"""The order in which queued requests trigger: savepoints and stops never wait behind queued
checkpoints (scenarios after Flink's CheckpointRequestDeciderTest and
CheckpointCoordinatorTest, run against our coordinator with an in-memory store), and a random
interleaving of requests, acknowledgements, declines and time never breaks the order."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from test_coordinator import OP, SRC, RecordingGateway, ack_all, make

from spark_ckpt.protocol.barrier import CheckpointBarrier, SnapshotType
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import DeclineCheckpoint, TaskId
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.coordinator import (
    CheckpointCoordinator,
    CheckpointRequest,
    RequestStatus,
)
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore


def test_a_savepoint_overtakes_queued_manual_checkpoints() -> None:
    """max concurrent 1, one checkpoint pending and two manual ones queued: a savepoint
    requested now triggers at once (forced), before the queued checkpoints."""
    coord, _, _, store = make(interval_ms=None, max_concurrent=1)
    first = coord.trigger_checkpoint()
    queued = [coord.trigger_checkpoint(), coord.trigger_checkpoint()]
    assert [r.status for r in queued] == [RequestStatus.QUEUED] * 2
    savepoint = coord.trigger_savepoint()
    assert savepoint.status is RequestStatus.TRIGGERED
    assert [r.status for r in queued] == [RequestStatus.QUEUED] * 2
    assert first.checkpoint_id is not None and savepoint.checkpoint_id is not None
    assert savepoint.checkpoint_id > first.checkpoint_id
    assert [p.checkpoint_id for p in coord.pending] == [
        first.checkpoint_id,
        savepoint.checkpoint_id,
    ]
    ack_all(coord, store, first.checkpoint_id)
    # two pending before (over max concurrent): the savepoint alone still blocks the queue
    assert [r.status for r in queued] == [RequestStatus.QUEUED] * 2
    ack_all(coord, store, savepoint.checkpoint_id)
    latest = store.latest_completed()
    assert latest is not None and latest.snapshot_type is SnapshotType.SAVEPOINT
    # the queued checkpoints go on afterwards, in order, one at a time
    assert [r.status for r in queued] == [RequestStatus.TRIGGERED, RequestStatus.QUEUED]
    assert queued[0].checkpoint_id is not None and queued[0].checkpoint_id > savepoint.checkpoint_id


def test_a_savepoint_ignores_min_pause() -> None:
    coord, _, clock, store = make(interval_ms=None, min_pause_ms=10_000)
    first = coord.trigger_checkpoint()
    assert first.checkpoint_id is not None
    ack_all(coord, store, first.checkpoint_id)
    clock.set(10)
    manual = coord.trigger_checkpoint()
    savepoint = coord.trigger_savepoint()
    assert manual.status is RequestStatus.QUEUED  # min pause holds it back
    assert savepoint.status is RequestStatus.TRIGGERED


def test_a_stop_checkpoint_goes_before_queued_manual_checkpoints() -> None:
    coord, _, _, store = make(interval_ms=None, max_concurrent=1)
    first = coord.trigger_checkpoint()
    manual = coord.trigger_checkpoint()
    stop = coord.trigger_checkpoint({"stop": "x"}, final=True)
    assert stop.status is RequestStatus.QUEUED  # not forced: waits for max concurrent
    assert first.checkpoint_id is not None
    ack_all(coord, store, first.checkpoint_id)
    assert stop.status is RequestStatus.TRIGGERED and manual.status is RequestStatus.QUEUED


def test_queued_manual_checkpoints_go_before_a_due_periodic_one() -> None:
    coord, gw, clock, store = make(interval_ms=100, max_concurrent=1)
    clock.set(100)
    [periodic] = coord.tick()
    manual = coord.trigger_checkpoint()
    clock.set(200)  # the next periodic checkpoint is due; one is pending
    assert coord.tick() == []
    ack_all(coord, store, periodic.checkpoint_id)
    assert manual.status is RequestStatus.TRIGGERED
    assert manual.checkpoint_id == max(gw.barrier_ids())  # not the due periodic one
    assert manual.checkpoint_id is not None
    ack_all(coord, store, manual.checkpoint_id)
    assert max(gw.barrier_ids()) > manual.checkpoint_id  # now the periodic one fires


# -- any interleaving ----------------------------------------------------------------------


@dataclass
class Observer(RecordingGateway):
    """A gateway that checks, at each trigger, that no request of a higher priority (or an
    earlier one of the same priority) was left waiting in the queue."""

    coord: CheckpointCoordinator | None = None
    config: CheckpointConfig | None = None
    requests: list[tuple[str, CheckpointRequest]] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # kind of each trigger, in order

    def trigger(self, task: TaskId, barrier: CheckpointBarrier) -> None:
        super().trigger(task, barrier)
        coord, config = self.coord, self.config
        assert coord is not None and config is not None
        cid = barrier.checkpoint_id
        if barrier.snapshot_type is SnapshotType.SAVEPOINT:
            kind = "savepoint"
        elif barrier.final:
            kind = "stop"
        elif cid in coord._requests_by_id:
            kind = "checkpoint"
        else:
            kind = "periodic"
        self.order.append(kind)
        rank = _RANK[kind]
        # where the triggered request arrived (None: it is being requested right now)
        here = next((i for i, (_, r) in enumerate(self.requests) if r.checkpoint_id == cid), None)
        for i, (k, r) in enumerate(self.requests):
            if r.status is not RequestStatus.QUEUED:
                continue
            # nothing of a higher priority waits, nor anything older of the same one (FIFO)
            assert _RANK[k] > rank or (_RANK[k] == rank and here is not None and i > here), (
                kind,
                [(k, r.status.value) for k, r in self.requests],
            )
        if kind != "savepoint":  # not forced: within the limits
            assert len(coord.pending) <= config.max_concurrent
            if config.min_pause_ms > 0:
                assert len(coord.pending) == 1


_RANK = {"savepoint": 0, "stop": 1, "checkpoint": 2, "periodic": 3}

_OPS = st.one_of(
    st.tuples(st.sampled_from(["checkpoint", "savepoint", "stop"])),
    st.tuples(st.just("ack"), st.integers(0, 3)),
    st.tuples(st.just("decline"), st.integers(0, 3)),
    st.tuples(st.just("time"), st.integers(1, 250)),
)


@settings(max_examples=150, deadline=None)
@given(
    max_concurrent=st.integers(1, 3),
    min_pause_ms=st.sampled_from([0, 0, 60]),
    interval_ms=st.sampled_from([None, 100]),
    ops=st.lists(_OPS, min_size=1, max_size=25),
)
def test_any_interleaving_triggers_savepoints_and_stops_first(
    max_concurrent: int, min_pause_ms: int, interval_ms: int | None, ops: list[tuple]
) -> None:
    """Requests, acknowledgements, declines and time in any order, under any limits:

    * a savepoint triggers at once (forced), whatever is pending or queued;
    * every trigger is of the highest-priority request waiting (savepoints and stops, then
      manual checkpoints, then a due periodic checkpoint), the oldest of that priority;
    * a non-forced trigger stays within max concurrent (and min pause: one at a time);
    * nothing stays queued that the limits would allow: once the pending checkpoints are
      done and min pause has passed, the head of the queue — a stop, when one waits — is
      the next trigger.
    """
    store = InMemoryCheckpointStore()
    clock = ManualClock(0)
    config = CheckpointConfig(
        interval_ms=interval_ms,
        max_concurrent=max_concurrent,
        min_pause_ms=min_pause_ms,
        tolerable_failed_checkpoints=1000,
    )
    gw = Observer(config=config)
    coord = CheckpointCoordinator(
        config, store, gw, tasks_to_trigger=[SRC], tasks_to_ack=[SRC, OP], clock=clock
    )
    gw.coord = coord
    coord.start()
    last_completion: int | None = None
    for op in ops:
        match op:
            case ("checkpoint",):
                gw.requests.append(("checkpoint", coord.trigger_checkpoint()))
            case ("stop",):
                gw.requests.append(("stop", coord.trigger_checkpoint({"stop": "s"}, final=True)))
            case ("savepoint",):
                savepoint = coord.trigger_savepoint()
                gw.requests.append(("savepoint", savepoint))
                assert savepoint.status is RequestStatus.TRIGGERED  # at once: forced
                assert any(p.checkpoint_id == savepoint.checkpoint_id for p in coord.pending)
            case ("ack", i) | ("decline", i):
                pending = coord.pending
                if not pending:
                    continue
                target = pending[i % len(pending)].checkpoint_id
                if op[0] == "ack":
                    ack_all(coord, store, target)
                    last_completion = clock.now_ms()
                else:
                    coord.receive_decline(DeclineCheckpoint(target, OP, "no"))
            case ("time", ms):
                clock.advance(ms)
                coord.tick()
        # liveness: a queued request waits only for a limit
        queued = [r for _, r in gw.requests if r.status is RequestStatus.QUEUED]
        if queued:
            paused = min_pause_ms > 0 and (
                bool(coord.pending)
                or (last_completion is not None and clock.now_ms() < last_completion + min_pause_ms)
            )
            assert len(coord.pending) >= max_concurrent or paused, (queued, coord.pending)
    # drain: complete everything; the rest triggers in priority order
    for _ in range(100):
        if not coord.pending:
            clock.advance(max(min_pause_ms, 1))
            coord.tick()
            if not coord.pending:
                break
        ack_all(coord, store, coord.pending[0].checkpoint_id)
    assert all(r.status is not RequestStatus.QUEUED for _, r in gw.requests)

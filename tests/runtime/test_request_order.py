"""Savepoints and stops never wait behind queued checkpoints, and failed checkpoints are
recorded durably (scenarios after Flink's CheckpointRequestDeciderTest and
CheckpointCoordinatorTest, run against our coordinator with an in-memory store)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_coordinator import OP, SRC, ack, ack_all, make

from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.handle import CheckpointMetrics, DeclineCheckpoint
from spark_ckpt.runtime.coordinator import RequestStatus


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
    ack_all(coord, store, first.checkpoint_id)
    ack_all(coord, store, savepoint.checkpoint_id)
    assert store.latest_completed() is not None
    assert store.latest_completed().snapshot_type is SnapshotType.SAVEPOINT  # type: ignore[union-attr]
    # the queued checkpoints go on afterwards, in order
    triggered = [r for r in queued if r.status is RequestStatus.TRIGGERED]
    assert triggered == queued[:1]


def test_a_stop_checkpoint_goes_before_queued_manual_checkpoints() -> None:
    coord, _, _, store = make(interval_ms=None, max_concurrent=1)
    first = coord.trigger_checkpoint()
    manual = coord.trigger_checkpoint()
    stop = coord.trigger_checkpoint({"stop": "x"}, final=True)
    assert first.checkpoint_id is not None
    ack_all(coord, store, first.checkpoint_id)
    assert stop.status is RequestStatus.TRIGGERED and manual.status is RequestStatus.QUEUED


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["checkpoint", "savepoint", "stop"]), min_size=1, max_size=8))
def test_queued_requests_trigger_savepoints_and_stops_first(kinds: list[str]) -> None:
    """Whatever the interleaving: once the pending checkpoint completes, the order of
    triggers is every savepoint/stop (in request order) before every manual checkpoint
    (in request order)."""
    coord, _, _, store = make(interval_ms=None, max_concurrent=1)
    blocker = coord.trigger_checkpoint()
    requests = []
    for kind in kinds:
        if kind == "savepoint":
            requests.append((kind, coord.trigger_savepoint()))
        elif kind == "stop":
            requests.append((kind, coord.trigger_checkpoint({"stop": "s"}, final=True)))
        else:
            requests.append((kind, coord.trigger_checkpoint()))
    order = [blocker]
    while True:
        pending = sorted(p.checkpoint_id for p in coord.pending)
        if not pending:
            break
        for cid in pending:
            ack_all(coord, store, cid)
    triggered = sorted(
        (r for _, r in requests if r.checkpoint_id is not None), key=lambda r: r.checkpoint_id
    )
    assert len(triggered) == len(requests) and order
    ranks = [
        0 if k in ("savepoint", "stop") else 1
        for k, r in sorted(requests, key=lambda kr: kr[1].checkpoint_id or 0)
    ]
    assert ranks == sorted(ranks)
    # within a rank, request order is kept
    for rank in (0, 1):
        same = [r for k, r in requests if (0 if k in ("savepoint", "stop") else 1) == rank]
        ids = [r.checkpoint_id or 0 for r in same]
        assert ids == sorted(ids)


def test_failed_checkpoints_are_recorded_with_reason_and_subtask_figures() -> None:
    coord, _, clock, store = make(interval_ms=None, timeout_ms=1000, tolerable_failed_checkpoints=5)
    declined = coord.trigger_checkpoint()
    assert declined.checkpoint_id is not None
    ack(coord, store, declined.checkpoint_id, SRC, metrics=CheckpointMetrics(3, 4, 5, 6, 7, 8))
    clock.set(50)
    coord.receive_decline(DeclineCheckpoint(declined.checkpoint_id, OP, "disk full"))
    expired = coord.trigger_checkpoint()
    clock.set(2000)
    coord.tick()  # expires it
    [first, second] = store.list_failed()
    assert first.checkpoint_id == declined.checkpoint_id and first.reason == "declined"
    assert "disk full" in first.message and first.duration_ms == 50
    assert first.task_metrics == {str(SRC): CheckpointMetrics(3, 4, 5, 6, 7, 8)}
    assert second.checkpoint_id == expired.checkpoint_id and second.reason == "expired"
    assert second.task_metrics == {}

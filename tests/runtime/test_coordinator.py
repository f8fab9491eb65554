"""Unit tests of every coordinator rule, with an injected clock (no sleeps)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import (
    CheckpointError,
    CoordinatorShutdownError,
    FencedError,
    StoreError,
    TolerableFailuresExceededError,
)
from spark_ckpt.protocol.barrier import CheckpointBarrier, SnapshotType
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import (
    AcknowledgeCheckpoint,
    BlobKind,
    CheckpointMetrics,
    DeclineCheckpoint,
    SourceOffset,
    StateBlob,
    TaskId,
    TaskSnapshot,
)
from spark_ckpt.runtime.checkpoint_cleaner import ANSWER_KEEP_MS, REQUEST_ID
from spark_ckpt.runtime.config import CheckpointConfig, ExternalizedCheckpointRetention
from spark_ckpt.runtime.coordinator import (
    RETENTION_RETRY_MS,
    CheckpointCoordinator,
    CoordinatorStatus,
    JobStatus,
    RequestStatus,
)
from spark_ckpt.runtime.failure import CheckpointFailureReason
from spark_ckpt.runtime.pending import AckResult
from spark_ckpt.storage.lease import CoordinatorLease
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

SRC = TaskId("source", 0)
OP = TaskId("counter", 0)


@dataclass
class RecordingGateway:
    triggered: list[tuple[TaskId, CheckpointBarrier]] = field(default_factory=list)
    completed: list[tuple[TaskId, int]] = field(default_factory=list)
    aborted: list[tuple[TaskId, int, str]] = field(default_factory=list)

    def trigger(self, task: TaskId, barrier: CheckpointBarrier) -> None:
        self.triggered.append((task, barrier))

    def notify_complete(self, task: TaskId, checkpoint_id: int) -> None:
        self.completed.append((task, checkpoint_id))

    def notify_aborted(self, task: TaskId, checkpoint_id: int, reason: str) -> None:
        self.aborted.append((task, checkpoint_id, reason))

    def barrier_ids(self) -> list[int]:
        return sorted({b.checkpoint_id for _, b in self.triggered})


def make(
    store: InMemoryCheckpointStore | None = None,
    clock: ManualClock | None = None,
    *,
    retain_every_ms: int = 0,
    **cfg: object,
) -> tuple[CheckpointCoordinator, RecordingGateway, ManualClock, InMemoryCheckpointStore]:
    config = CheckpointConfig(**{"interval_ms": 100, **cfg})  # type: ignore[arg-type]
    store = store or InMemoryCheckpointStore()
    clock = clock or ManualClock(0)
    gw = RecordingGateway()
    coord = CheckpointCoordinator(
        config,
        store,
        gw,
        tasks_to_trigger=[SRC],
        tasks_to_ack=[SRC, OP],
        clock=clock,
        retain_every_ms=retain_every_ms,
    )
    coord.start()
    return coord, gw, clock, store


def ack(
    coord: CheckpointCoordinator,
    store: InMemoryCheckpointStore,
    cid: int,
    task: TaskId,
    rows: int = 1,
    metrics: CheckpointMetrics | None = None,
) -> AckResult:
    blob = StateBlob(
        task.vertex, task.subtask, BlobKind.OPERATOR, "s", pa.table({"v": list(range(rows))})
    )
    offsets = (SourceOffset("src", 0, cid * 10),) if task == SRC else ()
    handle = store.write_task_state(cid, TaskSnapshot(task, (blob,), (), offsets))
    return coord.receive_acknowledge(
        AcknowledgeCheckpoint(cid, task, handle, metrics or CheckpointMetrics())
    )


def ack_all(coord: CheckpointCoordinator, store: InMemoryCheckpointStore, cid: int) -> None:
    assert ack(coord, store, cid, SRC) is AckResult.SUCCESS
    assert ack(coord, store, cid, OP) is AckResult.SUCCESS


def test_periodic_trigger_follows_interval() -> None:
    coord, gw, clock, _ = make()
    clock.set(99)
    assert coord.tick() == []
    clock.set(100)
    [b] = coord.tick()
    assert b.checkpoint_id >= 1 and b.timestamp_ms == 100
    assert gw.triggered == [(SRC, b)]
    assert coord.next_periodic_ms == 200


def test_max_concurrent_blocks_periodic_until_completion() -> None:
    coord, gw, clock, store = make(max_concurrent=1)
    clock.set(100)
    [b1] = coord.tick()
    clock.set(250)
    assert coord.tick() == []  # due, but one is pending
    ack_all(coord, store, b1.checkpoint_id)  # completion re-evaluates the due trigger
    assert len(gw.barrier_ids()) == 2
    assert coord.pending[0].checkpoint_id > b1.checkpoint_id


def test_periodic_checkpoints_keep_a_fixed_rate_when_triggered_late() -> None:
    """The source ticks once per micro-batch, so a due checkpoint fires late; the schedule
    stays on its grid (Flink's fixed rate) instead of drifting by each delay, and points
    missed meanwhile are skipped, not caught up."""
    coord, gw, clock, store = make(max_concurrent=1)
    clock.set(130)
    [b1] = coord.tick()  # due at 100
    ack_all(coord, store, b1.checkpoint_id)
    assert coord.next_periodic_ms == 200  # not 230
    clock.set(210)
    [b2] = coord.tick()
    clock.set(320)
    assert coord.tick() == []  # due at 300, but b2 is pending
    clock.set(340)
    ack_all(coord, store, b2.checkpoint_id)  # the completion fires the due one
    b3 = coord.pending[0]
    assert b3.checkpoint_id > b2.checkpoint_id and b3.trigger_ms == 340
    assert coord.next_periodic_ms == 400
    ack_all(coord, store, b3.checkpoint_id)
    clock.set(650)
    [b4] = coord.tick()  # due at 400; 500 and 600 were missed
    assert b4.timestamp_ms == 650 and coord.next_periodic_ms == 700
    ack_all(coord, store, b4.checkpoint_id)
    clock.set(700)
    [b5] = coord.tick()
    assert b5.timestamp_ms == 700 and coord.next_periodic_ms == 800
    assert len(gw.barrier_ids()) == 5


def test_max_concurrent_two() -> None:
    coord, gw, clock, _ = make(max_concurrent=2)
    for t in (100, 200, 300):
        clock.set(t)
        coord.tick()
    assert len(coord.pending) == 2
    assert len(gw.barrier_ids()) == 2


def test_min_pause_counts_from_last_completion() -> None:
    coord, _gw, clock, store = make(min_pause_ms=100)
    clock.set(100)
    [b1] = coord.tick()
    clock.set(150)
    ack_all(coord, store, b1.checkpoint_id)
    clock.set(200)  # interval due, but only 50 ms since completion
    assert coord.tick() == []
    clock.set(249)
    assert coord.tick() == []
    clock.set(250)
    [b2] = coord.tick()
    assert b2.timestamp_ms == 250
    assert coord.next_periodic_ms == 350


def test_min_pause_forbids_concurrent_checkpoints() -> None:
    coord, _, clock, _ = make(min_pause_ms=1, max_concurrent=3)
    clock.set(100)
    coord.tick()
    clock.set(500)
    assert coord.tick() == []
    assert len(coord.pending) == 1


def test_timeout_aborts_and_notifies_every_task() -> None:
    coord, gw, clock, _ = make(timeout_ms=50, tolerable_failed_checkpoints=5)
    clock.set(100)
    [b] = coord.tick()
    clock.set(149)
    coord.tick()
    assert coord.pending
    clock.set(150)
    coord.tick()
    assert not any(p.checkpoint_id == b.checkpoint_id for p in coord.pending)
    assert {(t, c) for t, c, _ in gw.aborted} == {(SRC, b.checkpoint_id), (OP, b.checkpoint_id)}
    assert coord.history[-1].failure is not None
    assert coord.history[-1].failure.reason is CheckpointFailureReason.EXPIRED


def test_tolerable_failures_fail_the_job_when_exceeded() -> None:
    coord, _, clock, store = make(timeout_ms=10, tolerable_failed_checkpoints=1)
    clock.set(100)
    coord.tick()
    clock.set(110)
    coord.tick()  # first failure: tolerated; triggers nothing new (interval)
    clock.set(200)
    [b2] = coord.tick()
    ack_all(coord, store, b2.checkpoint_id)  # success resets the count
    clock.set(300)
    coord.tick()
    clock.set(310)
    coord.tick()  # one failure again: tolerated
    clock.set(400)
    coord.tick()
    clock.set(410)
    with pytest.raises(TolerableFailuresExceededError, match="expired"):
        coord.tick()
    assert coord.status is CoordinatorStatus.FAILED
    with pytest.raises(CoordinatorShutdownError):
        coord.tick()


def test_decline_aborts_counts_and_notifies() -> None:
    coord, gw, clock, _ = make(tolerable_failed_checkpoints=0)
    clock.set(100)
    [b] = coord.tick()
    with pytest.raises(TolerableFailuresExceededError, match="disk full"):
        coord.receive_decline(DeclineCheckpoint(b.checkpoint_id, OP, "disk full"))
    assert {t for t, _, _ in gw.aborted} == {SRC, OP}


def test_decline_within_tolerance() -> None:
    coord, _gw, clock, store = make(tolerable_failed_checkpoints=3)
    clock.set(100)
    [b] = coord.tick()
    coord.receive_decline(DeclineCheckpoint(b.checkpoint_id, OP, "nope"))
    assert coord.pending == []
    assert ack(coord, store, b.checkpoint_id, SRC) is AckResult.DISCARDED
    assert store.latest_completed() is None


def test_a_decline_from_a_task_that_acknowledged_changes_nothing() -> None:
    """A late decline (a lost writer's checkpoint that its write acknowledged after all)
    does not abort the checkpoint, which completes with the other task's ack."""
    coord, gw, clock, store = make(tolerable_failed_checkpoints=0)
    clock.set(100)
    [b] = coord.tick()
    assert ack(coord, store, b.checkpoint_id, OP) is AckResult.SUCCESS
    coord.receive_decline(DeclineCheckpoint(b.checkpoint_id, OP, "its writer was lost"))
    assert gw.aborted == []
    assert ack(coord, store, b.checkpoint_id, SRC) is AckResult.SUCCESS
    latest = store.latest_completed()
    assert latest is not None and latest.checkpoint_id == b.checkpoint_id


def test_each_ack_result() -> None:
    coord, _, clock, store = make()
    clock.set(100)
    [b] = coord.tick()
    cid = b.checkpoint_id
    assert ack(coord, store, cid, SRC) is AckResult.SUCCESS
    assert ack(coord, store, cid, SRC) is AckResult.DUPLICATE
    assert ack(coord, store, cid, TaskId("stranger")) is AckResult.UNKNOWN
    assert ack(coord, store, cid + 500, SRC) is AckResult.UNKNOWN
    assert ack(coord, store, cid, OP) is AckResult.SUCCESS  # completes
    assert ack(coord, store, cid, OP) is AckResult.DISCARDED
    latest = store.latest_completed()
    assert latest is not None and latest.checkpoint_id == cid


def test_completion_commits_notifies_and_reports_stats() -> None:
    coord, gw, clock, store = make()
    clock.set(100)
    [b] = coord.tick()
    clock.set(130)
    ack(
        coord,
        store,
        b.checkpoint_id,
        SRC,
        rows=3,
        metrics=CheckpointMetrics(sync_ms=1, alignment_ms=7),
    )
    clock.set(170)
    ack(coord, store, b.checkpoint_id, OP, rows=5, metrics=CheckpointMetrics(start_delay_ms=4))
    c = store.get(b.checkpoint_id)
    assert c.stats.end_to_end_ms == 70
    assert c.stats.max_alignment_ms == 7 and c.stats.max_start_delay_ms == 4
    assert c.stats.state_bytes == sum(r.nbytes for r in c.blobs()) > 0
    assert c.offsets() == {("src", 0): b.checkpoint_id * 10}
    assert set(gw.completed) == {(SRC, b.checkpoint_id), (OP, b.checkpoint_id)}


def test_subsumption_aborts_older_pending_without_counting() -> None:
    coord, gw, clock, store = make(max_concurrent=2, tolerable_failed_checkpoints=0)
    clock.set(100)
    [b1] = coord.tick()
    clock.set(200)
    [b2] = coord.tick()
    ack_all(coord, store, b2.checkpoint_id)
    assert coord.pending == []
    assert (SRC, b1.checkpoint_id, CheckpointFailureReason.SUBSUMED.value) in gw.aborted
    assert ack(coord, store, b1.checkpoint_id, OP) is AckResult.DISCARDED
    assert coord.status is CoordinatorStatus.RUNNING


def test_savepoint_is_forced_aligned_and_not_subsumed() -> None:
    coord, gw, clock, store = make(max_concurrent=1, unaligned=True)
    clock.set(100)
    [b1] = coord.tick()
    assert b1.unaligned
    req = coord.trigger_savepoint("/sp")
    assert req.status is RequestStatus.TRIGGERED  # forced past max concurrent
    sp_id = req.checkpoint_id
    assert sp_id is not None
    sp_barrier = next(b for _, b in gw.triggered if b.checkpoint_id == sp_id)
    assert sp_barrier.snapshot_type is SnapshotType.SAVEPOINT and not sp_barrier.unaligned
    clock.set(200)
    coord.tick()
    ack_all(coord, store, b1.checkpoint_id)  # does not subsume the newer savepoint anyway
    ack_all(coord, store, sp_id)
    assert req.status is RequestStatus.COMPLETED and req.completed is not None
    assert req.completed.is_savepoint and req.completed.properties["savepoint_dir"] == "/sp"


def test_completed_checkpoint_does_not_subsume_pending_savepoint() -> None:
    coord, _gw, clock, store = make(max_concurrent=2)
    req = coord.trigger_savepoint()
    clock.set(100)
    [b] = coord.tick()
    ack_all(coord, store, b.checkpoint_id)
    assert [p.checkpoint_id for p in coord.pending] == [req.checkpoint_id]


def test_manual_checkpoint_queues_until_allowed() -> None:
    coord, _gw, _clock, store = make(interval_ms=None)
    r1 = coord.trigger_checkpoint()
    r2 = coord.trigger_checkpoint()
    assert r1.status is RequestStatus.TRIGGERED and r2.status is RequestStatus.QUEUED
    assert r1.checkpoint_id is not None
    ack_all(coord, store, r1.checkpoint_id)
    assert r1.status is RequestStatus.COMPLETED
    assert r2.status is RequestStatus.TRIGGERED and r2.checkpoint_id is not None
    assert r2.checkpoint_id > r1.checkpoint_id


def test_retention_keeps_newest_and_savepoints() -> None:
    coord, _, _clock, store = make(retained_checkpoints=2, interval_ms=None)
    done = []
    sp = coord.trigger_savepoint()
    assert sp.checkpoint_id is not None
    ack_all(coord, store, sp.checkpoint_id)
    for _ in range(4):
        r = coord.trigger_checkpoint()
        assert r.checkpoint_id is not None
        ack_all(coord, store, r.checkpoint_id)
        done.append(r.checkpoint_id)
    assert [c.checkpoint_id for c in store.list_completed()] == [sp.checkpoint_id, *done[-2:]]


def test_garbage_blobs_are_collected_every_nth_retention_and_after_the_final() -> None:
    store = InMemoryCheckpointStore()
    coord = CheckpointCoordinator(
        CheckpointConfig(interval_ms=None, retained_checkpoints=1),
        store,
        RecordingGateway(),
        tasks_to_trigger=[SRC],
        tasks_to_ack=[SRC, OP],
        clock=ManualClock(0),
        garbage_every=3,
    )
    coord.start()
    ids: list[int] = []
    blob_ids: list[set[int]] = []  # checkpoints whose blobs are stored, after each completion
    for final in [False] * 7 + [True]:
        r = coord.trigger_checkpoint(final=final)
        assert r.checkpoint_id is not None
        ack_all(coord, store, r.checkpoint_id)
        ids.append(r.checkpoint_id)
        blob_ids.append({b.checkpoint_id for b in store.stored_blobs()})
        assert [c.checkpoint_id for c in store.list_completed()] == [r.checkpoint_id]
    # retention runs at every completion (the first drops nothing); blobs are collected at
    # every 3rd one (completions 3 and 6) and after the final checkpoint (completion 8)
    collected = [i for i, alive in enumerate(blob_ids) if alive == {ids[i]}]
    assert collected == [0, 2, 5, 7]
    for i, alive in enumerate(blob_ids):
        assert alive >= {ids[i]} and alive <= set(ids[: i + 1])
    with pytest.raises(CheckpointError):
        CheckpointCoordinator(
            CheckpointConfig(),
            store,
            RecordingGateway(),
            tasks_to_trigger=[SRC],
            tasks_to_ack=[SRC],
            garbage_every=0,
        )


def test_spaced_retention_runs_at_most_every_retain_every_ms_and_after_the_final() -> None:
    """With ``retain_every_ms`` a completion makes retention due; it runs at the first
    completion, then only once the spacing has passed (at the next completion, or at
    :meth:`maintain` in between), and at once after a final checkpoint."""
    coord, _, clock, store = make(retain_every_ms=1_000, interval_ms=None, retained_checkpoints=1)

    def log() -> list[int]:
        return [c.checkpoint_id for c in store.list_completed()]

    a = _complete_one(coord, store)  # the run's first retention runs at once (it drops nothing)
    clock.advance(400)
    b = _complete_one(coord, store)
    clock.advance(400)
    c = _complete_one(coord, store)
    assert log() == [a, b, c]  # 800 ms since the last retention: subsumed ones stay
    coord.maintain()
    assert log() == [a, b, c]
    clock.advance(200)
    coord.maintain()  # 1 s passed: the due retention runs without a completion
    assert log() == [c]
    clock.advance(100)
    d = _complete_one(coord, store)
    assert log() == [c, d]
    e = _complete_one(coord, store, final=True)  # no spacing after the final checkpoint
    assert log() == [e]
    with pytest.raises(CheckpointError):
        make(retain_every_ms=-1)


def test_retention_keeps_a_checkpoint_answering_a_request_until_its_requester_polled() -> None:
    """A checkpoint answering another process's request (property ``request_id``) stays
    in the log ANSWER_KEEP_MS after its completion, though newer ones complete and retention
    runs after each: its requester finds it there. Then retention drops it as any other."""
    coord, _, clock, store = make(interval_ms=None, retained_checkpoints=1)

    def log() -> list[int]:
        return [c.checkpoint_id for c in store.list_completed()]

    def complete(properties: dict[str, str] | None = None) -> int:
        r = coord.trigger_checkpoint(properties)
        assert r.checkpoint_id is not None
        ack_all(coord, store, r.checkpoint_id)
        return r.checkpoint_id

    a = complete()
    asked = complete({REQUEST_ID: "r1"})
    b = complete()
    assert log() == [asked, b]  # a was dropped at once; the answer stays
    clock.advance(ANSWER_KEEP_MS - 1)
    c = complete()
    assert a not in log() and log() == [asked, b, c]
    clock.advance(1)
    d = complete()
    assert log() == [d]
    asked = complete({REQUEST_ID: "r2"})
    r = coord.trigger_checkpoint(final=True)
    assert r.checkpoint_id is not None
    ack_all(coord, store, r.checkpoint_id)
    assert log() == [r.checkpoint_id]  # the job's final retains exactly the configured count


def test_retention_keeps_the_checkpoints_tasks_still_build_on() -> None:
    """A task whose incremental snapshots build on checkpoint b (it has not applied later
    completions yet) reports b in its acks: b and newer stay, blobs included, beyond the
    retained count, until the task reports a newer base."""
    coord, _, _clock, store = make(retained_checkpoints=1, interval_ms=None)
    ids: list[int] = []
    bases = [0, 0, 2, 2, 4]  # base reported with each checkpoint's ack of OP (0: none)
    for base in bases:
        r = coord.trigger_checkpoint()
        assert r.checkpoint_id is not None
        ids.append(r.checkpoint_id)
        assert ack(coord, store, r.checkpoint_id, SRC) is AckResult.SUCCESS
        blob = StateBlob(OP.vertex, 0, BlobKind.OPERATOR, "s", pa.table({"v": [1]}))
        handle = store.write_task_state(r.checkpoint_id, TaskSnapshot(OP, (blob,), ()))
        result = coord.receive_acknowledge(
            AcknowledgeCheckpoint(
                r.checkpoint_id, OP, handle, base_checkpoint_id=ids[base - 1] if base else 0
            )
        )
        assert result is AckResult.SUCCESS
        kept = [c.checkpoint_id for c in store.list_completed()]
        # no base yet (0): it may adopt any completed checkpoint, so all are kept
        assert kept == [i for i in ids if i >= (ids[base - 1] if base else 0)]
        for c in store.list_completed():  # nothing a kept checkpoint references is gone
            store.read_blobs(list(c.blobs()))
    assert [c.checkpoint_id for c in store.list_completed()] == [ids[3], ids[4]]
    # the job's final checkpoint: nothing will build on older checkpoints any more
    final = coord.trigger_checkpoint(final=True)
    assert final.checkpoint_id is not None
    assert ack(coord, store, final.checkpoint_id, SRC) is AckResult.SUCCESS
    blob = StateBlob(OP.vertex, 0, BlobKind.OPERATOR, "s", pa.table({"v": [1]}))
    handle = store.write_task_state(final.checkpoint_id, TaskSnapshot(OP, (blob,), ()))
    coord.receive_acknowledge(
        AcknowledgeCheckpoint(final.checkpoint_id, OP, handle, base_checkpoint_id=ids[4])
    )
    assert [c.checkpoint_id for c in store.list_completed()] == [final.checkpoint_id]


def test_deferred_completion_leaves_triggers_to_tick_and_retention_to_maintain() -> None:
    store = InMemoryCheckpointStore()
    clock = ManualClock(0)
    coord = CheckpointCoordinator(
        CheckpointConfig(interval_ms=100, retained_checkpoints=1),
        store,
        RecordingGateway(),
        tasks_to_trigger=[SRC],
        tasks_to_ack=[SRC, OP],
        clock=clock,
        defer_after_completion=True,
    )
    coord.start()
    clock.advance(100)
    [first] = coord.tick()
    ack_all(coord, store, first.checkpoint_id)
    clock.advance(100)
    [second] = coord.tick()
    clock.advance(300)  # the next trigger is overdue when the second one completes ...
    ack_all(coord, store, second.checkpoint_id)
    assert coord.pending == []  # ... but waits for tick()
    ids = [c.checkpoint_id for c in store.list_completed()]
    assert ids == [first.checkpoint_id, second.checkpoint_id]  # retention waits for maintain()
    coord.maintain()
    assert [c.checkpoint_id for c in store.list_completed()] == [second.checkpoint_id]
    assert len(coord.tick()) == 1


def test_nothing_after_shutdown_and_pending_aborted_uncounted() -> None:
    coord, gw, clock, store = make(tolerable_failed_checkpoints=0)
    clock.set(100)
    [b] = coord.tick()
    coord.shutdown(JobStatus.SUSPENDED)
    assert (OP, b.checkpoint_id, CheckpointFailureReason.COORDINATOR_SHUTDOWN.value) in gw.aborted
    with pytest.raises(CoordinatorShutdownError):
        coord.trigger_checkpoint()
    with pytest.raises(CoordinatorShutdownError):
        coord.tick()
    assert ack(coord, store, b.checkpoint_id, SRC) is AckResult.DISCARDED


@pytest.mark.parametrize(
    ("retention", "status", "kept"),
    [
        (ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS, JobStatus.CANCELED, False),
        (ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS, JobStatus.FAILED, False),
        (ExternalizedCheckpointRetention.DELETE_ON_CANCELLATION, JobStatus.CANCELED, False),
        (ExternalizedCheckpointRetention.DELETE_ON_CANCELLATION, JobStatus.FAILED, True),
        (ExternalizedCheckpointRetention.DELETE_ON_CANCELLATION, JobStatus.SUSPENDED, True),
        (ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION, JobStatus.CANCELED, True),
        (ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION, JobStatus.FINISHED, True),
    ],
)
def test_externalized_retention_on_shutdown(
    retention: ExternalizedCheckpointRetention, status: JobStatus, kept: bool
) -> None:
    coord, _, _clock, store = make(externalized_retention=retention, interval_ms=None)
    sp = coord.trigger_savepoint()
    assert sp.checkpoint_id is not None
    ack_all(coord, store, sp.checkpoint_id)
    r = coord.trigger_checkpoint()
    assert r.checkpoint_id is not None
    ack_all(coord, store, r.checkpoint_id)
    coord.shutdown(status)
    ids = [c.checkpoint_id for c in store.list_completed()]
    assert sp.checkpoint_id in ids  # savepoints always survive
    assert (r.checkpoint_id in ids) is kept


def test_ids_never_reused_across_restarts_and_old_coordinator_is_fenced() -> None:
    store = InMemoryCheckpointStore()
    c1, _, clock, _ = make(store=store, interval_ms=None)
    r1 = c1.trigger_checkpoint()
    assert r1.checkpoint_id is not None
    c2, _, _, _ = make(store=store, clock=clock, interval_ms=None)
    r2 = c2.trigger_checkpoint()
    assert r2.checkpoint_id is not None and r2.checkpoint_id > r1.checkpoint_id
    ack(c1, store, r1.checkpoint_id, SRC)
    with pytest.raises(FencedError):
        ack(c1, store, r1.checkpoint_id, OP)
    assert c1.status is CoordinatorStatus.FAILED
    ack_all(c2, store, r2.checkpoint_id)
    assert [c.checkpoint_id for c in store.list_completed()] == [r2.checkpoint_id]


def test_id_blocks_are_extended_when_exhausted() -> None:
    coord, _, _, store = make(interval_ms=None)
    coord._next_id = coord._lease.end_id - 1  # last id of the block
    a = coord.trigger_checkpoint()
    assert a.checkpoint_id is not None
    ack_all(coord, store, a.checkpoint_id)
    b = coord.trigger_checkpoint()
    assert b.checkpoint_id is not None and b.checkpoint_id > a.checkpoint_id


class FailingCommitStore(InMemoryCheckpointStore):
    def commit(self, lease: CoordinatorLease, checkpoint: CompletedCheckpoint) -> None:
        raise StoreError("object store unavailable")


def test_failed_completion_commit_aborts_and_counts() -> None:
    store = FailingCommitStore()
    coord, gw, clock, _ = make(store=store, tolerable_failed_checkpoints=1)
    clock.set(100)
    [b] = coord.tick()
    ack_all(coord, store, b.checkpoint_id)
    assert store.latest_completed() is None
    assert coord.history[-1].failure is not None
    assert coord.history[-1].failure.reason is CheckpointFailureReason.FINALIZE_FAILED
    assert gw.completed == []


class FlakyRetainStore(InMemoryCheckpointStore):
    """``retain`` raises *error* while ``failing`` is set; records every call's
    ``collect_garbage``."""

    def __init__(self, error: StoreError) -> None:
        super().__init__()
        self.error = error
        self.failing = True
        self.calls: list[bool] = []

    def retain(
        self,
        lease: CoordinatorLease,
        retained: int,
        keep_from: int | None = None,
        *,
        collect_garbage: bool = True,
        history_size: int = 100,
    ) -> list[int]:
        self.calls.append(collect_garbage)
        if self.failing:
            raise self.error
        return super().retain(
            lease, retained, keep_from, collect_garbage=collect_garbage, history_size=history_size
        )


def _complete_one(
    coord: CheckpointCoordinator, store: InMemoryCheckpointStore, *, final: bool = False
) -> int:
    r = coord.trigger_checkpoint(final=final)
    assert r.checkpoint_id is not None
    ack_all(coord, store, r.checkpoint_id)
    return r.checkpoint_id


def test_retention_store_error_is_tolerated_and_retried_after_the_next_completion(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FlakyRetainStore(StoreError("object store unavailable"))
    coord, _gw, clock, _ = make(store=store, retained_checkpoints=1, interval_ms=None)
    with caplog.at_level(logging.WARNING, logger="spark_ckpt.runtime.coordinator"):
        first = _complete_one(coord, store)
        clock.advance(RETENTION_RETRY_MS)  # past the backoff of the failed attempt
        second = _complete_one(coord, store)
    assert coord.status is CoordinatorStatus.RUNNING
    assert [h.checkpoint_id for h in coord.completed_history()] == [first, second]
    assert [c.checkpoint_id for c in store.list_completed()] == [first, second]  # nothing lost
    assert len(store.calls) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("object store unavailable" in w for w in warnings)
    store.failing = False
    clock.advance(RETENTION_RETRY_MS)
    third = _complete_one(coord, store)
    assert [c.checkpoint_id for c in store.list_completed()] == [third]
    assert coord.status is CoordinatorStatus.RUNNING


def test_failed_deferred_retention_stays_due_with_its_garbage_collection() -> None:
    """Deferred mode: a failed maintain() leaves retention due, so the next maintain()
    retries it without a new completion — collecting garbage if the failed one was to."""
    store = FlakyRetainStore(StoreError("throttled"))
    store.failing = False
    clock = ManualClock(0)
    coord = CheckpointCoordinator(
        CheckpointConfig(interval_ms=None, retained_checkpoints=1),
        store,
        RecordingGateway(),
        tasks_to_trigger=[SRC],
        tasks_to_ack=[SRC, OP],
        clock=clock,
        defer_after_completion=True,
        garbage_every=2,
    )
    coord.start()
    first = _complete_one(coord, store)
    coord.maintain()  # retention 1: nothing to drop, no garbage collection
    second = _complete_one(coord, store)
    store.failing = True
    coord.maintain()  # retention 2 would collect garbage: fails, tolerated
    assert store.calls == [False, True]
    assert [c.checkpoint_id for c in store.list_completed()] == [first, second]
    store.failing = False
    coord.maintain()  # backing off: a store outage must not be retried every poll
    assert store.calls == [False, True]
    clock.advance(RETENTION_RETRY_MS)
    coord.maintain()  # retried without a new completion, still collecting
    assert store.calls == [False, True, True]
    assert [c.checkpoint_id for c in store.list_completed()] == [second]
    assert {b.checkpoint_id for b in store.stored_blobs()} == {second}
    coord.maintain()  # no longer due: nothing happens
    assert len(store.calls) == 3


def test_retention_fenced_error_still_fails_the_coordinator() -> None:
    store = FlakyRetainStore(FencedError("coordinator epoch 1 was superseded by epoch 2"))
    coord, _gw, _clock, _ = make(store=store, retained_checkpoints=1, interval_ms=None)
    r = coord.trigger_checkpoint()
    assert r.checkpoint_id is not None
    assert ack(coord, store, r.checkpoint_id, SRC) is AckResult.SUCCESS
    with pytest.raises(FencedError):
        ack(coord, store, r.checkpoint_id, OP)
    assert coord.status is CoordinatorStatus.FAILED
    assert isinstance(coord.failure_cause, FencedError)


@settings(max_examples=200, deadline=None)
@given(
    interval=st.sampled_from([100, None]),
    max_concurrent=st.integers(1, 2),
    min_pause=st.sampled_from([0, 50]),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["advance", "tick", "ack", "request", "savepoint"]), st.integers(1, 120)
        ),
        max_size=40,
    ),
)
def test_next_trigger_ms_says_exactly_when_a_tick_triggers(
    interval: int | None, max_concurrent: int, min_pause: int, steps: list[tuple[str, int]]
) -> None:
    """What lets the source runner skip a tick while a poll holds the coordinator: a tick
    triggers something exactly when ``next_trigger_ms`` is due."""
    coord, _, clock, store = make(
        interval_ms=interval, max_concurrent=max_concurrent, min_pause_ms=min_pause
    )
    for op, n in steps:
        if op == "advance":
            clock.advance(n)
        elif op == "ack" and coord.pending:
            ack_all(coord, store, coord.pending[0].checkpoint_id)
        elif op == "request":
            coord.trigger_checkpoint()
        elif op == "savepoint":
            coord.trigger_savepoint(None)
        due = coord.next_trigger_ms()
        if op == "tick":
            sent = coord.tick()
            assert bool(sent) == (due is not None and due <= clock.now_ms()), (due, sent)

"""The coordinator host on its own thread (what ``ckpt-source``'s runner uses) and the
foreachBatch aligner's snapshot worker thread: barriers reach ``latestOffset`` without it
running a poll, polling errors fail the caller, and the worker runs jobs in order and
reports their errors. No timing is asserted: waits are bounded loops on a condition."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from spark_ckpt.coordination.heartbeats import Heartbeats
from spark_ckpt.coordination.host import CoordinatorHost
from spark_ckpt.coordination.host_thread import HostThread, PollCadence
from spark_ckpt.coordination.live_report import LiveReport, channel_progress
from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.messages import Request, RequestKind
from spark_ckpt.coordination.topology import SinkSpec, Topology, write_topology
from spark_ckpt.errors import TolerableFailuresExceededError
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.snapshot_worker import SnapshotWorker
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore


def wait_until(condition: Callable[[], bool], limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def hosted(root: Path, cadence: PollCadence | None = None) -> tuple[HostThread, ManualClock]:
    store, sink, clock = InMemoryCheckpointStore(), MemorySink(), ManualClock(1_000)
    # the topology the host needs before it triggers anything
    write_topology(str(root), Topology("counter", 1, SinkSpec("memory", "-", "counter")))
    config = CheckpointConfig(interval_ms=100)
    host = CoordinatorHost(
        str(root),
        config,
        store,
        sink_factory=lambda _: sink.committer,
        clock=clock,
        defer_after_completion=True,
    )
    return HostThread(host, cadence or PollCadence(0.01, 0.01)), clock


def test_barriers_are_triggered_on_the_host_thread(tmp_path: Path) -> None:
    thread, clock = hosted(tmp_path)
    try:
        assert thread.take_barriers() == []  # starts the thread
        got: list[int] = []

        def triggered() -> bool:
            got.extend(b.checkpoint_id for b in thread.take_barriers())
            return bool(got)

        wait_until(lambda: thread.call(lambda h: h.coordinator is not None))
        clock.advance(1_000)  # the periodic trigger is due: the thread triggers it
        wait_until(triggered)
        assert len(got) == 1 and thread.stopping is None
        Mailbox(str(tmp_path)).post(Request("stop-1", RequestKind.STOP))
        wait_until(lambda: thread.stopping is not None)
        stopping = thread.stopping
        assert stopping is not None and stopping.final  # queued behind checkpoint 1
    finally:
        thread.stop()


def test_an_object_store_root_is_polled_fast_only_while_acks_are_due(tmp_path: Path) -> None:
    """On an object store every poll is a billed listing: 1 s apart while nothing is pending,
    50 ms while a checkpoint waits for acknowledgements; a local root is polled every 20 ms."""
    local, remote = PollCadence.for_root(str(tmp_path)), PollCadence.for_root("s3://lake/root")
    assert local.wait_s(True) == local.wait_s(False) == 0.02
    assert (remote.wait_s(True), remote.wait_s(False)) == (0.05, 1.0)


def test_a_trigger_wakes_an_idle_host_thread(tmp_path: Path) -> None:
    """With an idle cadence of an hour, the thread still sees what arrives once a checkpoint
    is triggered: the trigger ends its wait, and it polls at the busy cadence."""
    thread, clock = hosted(tmp_path, PollCadence(busy_s=0.01, idle_s=3600))
    try:
        thread.start()
        wait_until(lambda: thread.call(lambda h: h.coordinator is not None))
        Mailbox(str(tmp_path)).post(Request("stop-1", RequestKind.STOP))
        clock.advance(1_000)
        assert len(thread.take_barriers()) == 1  # latestOffset triggers checkpoint 1
        wait_until(lambda: thread.stopping is not None)  # polled within the hour
    finally:
        thread.stop()


def test_the_host_thread_expires_a_checkpoint_no_batch_acknowledges(tmp_path: Path) -> None:
    """A micro-batch that outlasts the checkpoint timeout calls no ``latestOffset``: the
    thread's polls expire the checkpoint all the same (and trigger nothing)."""
    thread, clock = hosted(tmp_path)
    try:
        thread.start()
        wait_until(lambda: thread.call(lambda h: h.coordinator is not None))
        clock.advance(1_000)
        [barrier] = thread.take_barriers()  # latestOffset: checkpoint 1 triggered
        timeout = thread.call(lambda h: h.config.timeout_ms)
        clock.advance(timeout + 1)  # no latestOffset meanwhile
        wait_until(lambda: thread.call(lambda h: h.coordinator.num_failed) == 1)
        [failure] = thread.call(lambda h: h.store.list_failed())
        assert (failure.checkpoint_id, failure.reason) == (barrier.checkpoint_id, "expired")
        assert thread.call(lambda h: h.coordinator.num_triggered) == 1
    finally:
        thread.stop()


def test_latest_offset_waits_for_a_busy_poll_only_when_a_tick_may_trigger(
    tmp_path: Path,
) -> None:
    """A poll holds the host while it completes a checkpoint (store and sink commits):
    ``take_barriers`` does not wait for it when nothing is due, and waits, then triggers,
    when the periodic checkpoint is due."""
    thread, clock = hosted(tmp_path)
    try:
        thread.start()
        wait_until(lambda: thread.call(lambda h: h.coordinator is not None))
        assert thread.take_barriers() == []  # the interval has not passed: nothing due
        taken: list[list[object]] = []
        with thread._host_lock:  # a poll in progress
            waiter = threading.Thread(target=lambda: taken.append(thread.take_barriers()))
            waiter.start()
            wait_until(lambda: bool(taken))  # returned while the poll still runs
            assert taken == [[]]
            clock.advance(1_000)  # the periodic checkpoint is due: this one has to wait
            waiter = threading.Thread(target=lambda: taken.append(thread.take_barriers()))
            waiter.start()
        waiter.join(30)
        assert len(taken) == 2 and len(taken[1]) == 1  # it ticked once the poll ended
    finally:
        thread.stop()


def test_a_failed_poll_fails_the_caller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    thread, _ = hosted(tmp_path)

    def fail(tick: bool = True) -> list[object]:
        raise TolerableFailuresExceededError("too many failed checkpoints")

    monkeypatch.setattr(thread.host, "poll", fail)
    thread.start()
    with pytest.raises(TolerableFailuresExceededError):
        wait_until(lambda: bool(thread.take_barriers()) and False)
    thread.stop()


def test_snapshot_worker_runs_jobs_in_order_and_reports_errors() -> None:
    worker = SnapshotWorker()
    seen: list[int] = []
    for i in range(50):
        worker.submit(lambda i=i: seen.append(i))
    worker.drain()
    assert seen == list(range(50))
    assert threading.current_thread().name != "spark-ckpt-snapshot"

    def boom() -> None:
        raise TolerableFailuresExceededError("boom")

    worker.submit(boom)
    worker.submit(lambda: seen.append(99))  # not run: the worker stopped at the error
    with pytest.raises(TolerableFailuresExceededError):
        worker.drain()
    with pytest.raises(TolerableFailuresExceededError):
        worker.submit(lambda: None)
    assert 99 not in seen
    worker.close()
    worker.close()


def test_mailbox_receives_while_another_thread_posts(tmp_path: Path) -> None:
    """Senders write a temporary file and rename it into the mailbox; a listing that races a
    rename must not fail, and every message arrives exactly once."""
    mailbox = Mailbox(str(tmp_path))
    n = 3000

    def post_all() -> None:
        for i in range(n):
            mailbox.post(Request(f"r{i}", RequestKind.CHECKPOINT))

    sender = threading.Thread(target=post_all)
    sender.start()
    got: list[str] = []
    while True:
        done = not sender.is_alive()  # before listing: a later post is seen next round
        received = mailbox.receive()
        got.extend(m.request_id for _, m in received if isinstance(m, Request))
        mailbox.delete([name for name, _ in received])
        if done and not received:
            break
    sender.join()
    assert len(got) == n, (len(got), len(set(got)))
    assert sorted(got) == sorted(f"r{i}" for i in range(n))


def test_the_heartbeat_reports_checkpoints_in_progress_and_channels(tmp_path: Path) -> None:
    """What the checkpoint page shows of a running coordinator comes with its heartbeat: the
    checkpoint it triggered and waits for (0 of 1 subtask acknowledged), and the channels'
    progress the source runner handed over."""
    thread, clock = hosted(tmp_path, PollCadence(0.01, 0.01))
    try:
        thread.take_barriers()
        wait_until(lambda: thread.call(lambda h: h.coordinator is not None))
        clock.advance(1_000)
        got: list[int] = []
        wait_until(lambda: bool(got.extend(b.checkpoint_id for b in thread.take_barriers()) or got))
        thread.report_channels(channel_progress([0, 5], [40, 5], [90, 5]))

        def report() -> LiveReport | None:
            [beat] = Heartbeats(str(tmp_path)).live()
            r = beat.report
            return r if r is not None and r.in_progress and r.channels else None

        wait_until(lambda: report() is not None)
        r = report()
        assert r is not None and [p.checkpoint_id for p in r.in_progress] == got
        [p] = r.in_progress
        assert (p.acknowledged, p.total) == (0, 1)
        assert [(c.read, c.pending) for c in r.channels] == [(40, 50), (0, 0)]
    finally:
        thread.stop()

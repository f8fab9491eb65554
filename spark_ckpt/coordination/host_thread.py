"""The coordinator host's own thread in the source runner, off Spark's micro-batch path, and
the runner's quiet exit when Spark closes its channel."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from spark_ckpt.coordination.heartbeats import HeartbeatThread
from spark_ckpt.coordination.host import CoordinatorHost
from spark_ckpt.coordination.live_report import ChannelProgress, InProgress, LiveReport
from spark_ckpt.errors import FencedError
from spark_ckpt.locations.uris import is_remote
from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.runtime.coordinator import CheckpointRequest

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class PollCadence:
    """How long the coordinator thread waits between polls of its mailboxes.

    Each poll lists the mailboxes: nothing on a local disk, a billed request on an object
    store. *busy_s* applies while a checkpoint waits for acknowledgements (they arrive as
    mailbox messages, so this bounds how late a completion is seen), *idle_s* otherwise
    (then only a client's request can arrive). A trigger wakes the thread at once."""

    busy_s: float
    idle_s: float

    @staticmethod
    def for_root(root: str) -> PollCadence:
        """20 ms on a local root; on an object store 50 ms while acknowledgements are due
        and 1 s otherwise, so an idle pipeline lists its mailboxes about twice a second."""
        return PollCadence(0.05, 1.0) if is_remote(root) else PollCadence(0.02, 0.02)

    def wait_s(self, awaiting_acks: bool) -> float:
        return self.busy_s if awaiting_acks else self.idle_s


class HostThread:
    """Runs a :class:`CoordinatorHost` on its own thread, off Spark's micro-batch path.

    Flink's checkpoint coordinator runs on its own timer thread, never on the data path. In
    the source runner the data path is ``latestOffset``: polling the host there put every
    completion (the checkpoint commit, retention, the global sink commit: several Delta
    commits) into the micro-batch's critical path. Here a daemon thread polls the host at
    a :class:`PollCadence` (by default the one for the host's root) — acks, declines,
    requests, completions — and then, in a separate step, applies retention (the host's
    coordinator defers it: ``defer_after_completion``). The polls also expire checkpoints
    past their timeout (Flink's canceller), so a long micro-batch cannot keep its checkpoint
    alive until the next ``latestOffset``.
    ``latestOffset`` only ticks the coordinator (:meth:`take_barriers`: periodic triggers and
    timeouts, cheap) and takes the barriers, placing them at the channel heads of that
    moment: a periodic checkpoint is triggered when its barriers are injected, as in Flink,
    and its duration counts from there. Barriers of requests (checkpoint/savepoint/stop)
    received by the thread wait in a queue until then.

    Thread safety: every use of the host goes through one lock (:meth:`call`, the polls), so
    the host and its store stay single-threaded; the queue of barriers has a lock of its
    own. An error raised by a poll (tolerable failures exceeded, fenced by another
    coordinator, a bug) stops the thread and is raised again by the next
    :meth:`take_barriers`, failing the query from Spark's own thread."""

    def __init__(self, host: CoordinatorHost, cadence: PollCadence | None = None) -> None:
        self.host = host
        self.cadence = cadence or PollCadence.for_root(host.root)
        #: set by a trigger (or a stop) to end the thread's wait at once
        self._wake = threading.Event()
        self._awaiting_acks = False
        self._host_lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._barriers: list[CheckpointBarrier] = []
        self._stopping: CheckpointRequest | None = None
        self._draining = False
        self._last_completed: CompletedCheckpoint | None = None
        #: when a tick may trigger something next, as of the last poll or tick (0: unknown)
        self._due_ms: int | None = 0
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # what the heartbeat reports (see spark_ckpt.coordination.live_report), as of the
        # last poll or tick, and of the last latestOffset
        self._in_progress: tuple[InProgress, ...] = ()
        self._channels: tuple[ChannelProgress, ...] = ()
        holder = host.run_id or f"coordinator-{uuid.uuid4().hex}"
        #: tells clients a coordinator polls the mailbox (see spark_ckpt.coordination.mailbox)
        self.heartbeat = HeartbeatThread(
            host.root,
            holder,
            alive=lambda: self._error is None,
            report=lambda: LiveReport(
                holder,
                self.host.clock.now_ms(),
                self._in_progress,
                self._channels,
            ),
        )

    def start(self) -> None:
        """Start polling (idempotent), and the coordinator's heartbeat."""
        if self._thread is None:
            self.heartbeat.start()
            self._thread = threading.Thread(
                target=self._run, name="spark-ckpt-coordinator", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except BaseException as e:  # handed to Spark's thread (take_barriers)
                log.error("coordinator thread stopped: %s", e)
                self._error = e
                run = self.host.run
                if run is not None and isinstance(e, FencedError):
                    run.write_fatal(f"{type(e).__name__}: {e}")
                return
            self._wake.wait(self.cadence.wait_s(self._awaiting_acks))
            self._wake.clear()

    def _poll(self) -> None:
        with self._host_lock:
            barriers = self.host.poll(tick=False)
            stopping = self.host.stopping
            self._draining = self.host.draining is not None
            self._last_completed = self.host.last_completed
            self._due_ms = self.host.next_trigger_ms()
            self._awaiting_acks = self.host.awaiting_acks
            self._observe()
        self._queue(barriers, stopping)
        with self._host_lock:  # separately: latestOffset may tick in between
            self.host.maintain()

    def _queue(self, barriers: list[CheckpointBarrier], stopping: CheckpointRequest | None) -> None:
        with self._queue_lock:
            self._barriers.extend(barriers)
            self._stopping = stopping

    def call(self, fn: Callable[[CoordinatorHost], T]) -> T:
        """Run *fn* on the host (waits for a poll in progress)."""
        with self._host_lock:
            try:
                return fn(self.host)
            finally:
                self._due_ms = self.host.next_trigger_ms()  # fn may have requested one

    def sync(self) -> None:
        """Wait until a poll in progress has finished — a completion with its global sink
        commit runs inside one — and raise what stopped the polling thread, if anything did."""
        with self._host_lock:
            pass
        if self._error is not None:
            raise self._error

    def take_barriers(self) -> list[CheckpointBarrier]:
        """The barriers triggered since the last call, oldest first; raises what stopped the
        polling thread, if anything did. Starts the thread on first use.

        Ticks the coordinator, except while a poll holds the host (a completion with its
        store and sink commits) and, as of the last poll, the tick would trigger
        nothing (no request queued, no periodic checkpoint due): ``latestOffset`` does not
        wait for a completion it has no use for. Only a tick that may trigger waits."""
        if self._error is not None:
            raise self._error
        self.start()
        locked = self._host_lock.acquire(blocking=False)
        if not locked and self._tick_due():
            locked = self._host_lock.acquire()
        if locked:
            try:
                ticked = self.host.tick()
                stopping = self.host.stopping
                self._due_ms = self.host.next_trigger_ms()
                self._awaiting_acks = self.host.awaiting_acks
                self._observe()
            finally:
                self._host_lock.release()
            self._queue(ticked, stopping)
            if ticked:  # acknowledgements are due: poll at the busy cadence from now
                self._wake.set()
        with self._queue_lock:
            barriers, self._barriers = self._barriers, []
        return barriers

    def _observe(self) -> None:
        """Under the host lock: what the heartbeat reports of the coordinator."""
        self._in_progress = self.host.in_progress()

    def report_channels(self, channels: tuple[ChannelProgress, ...]) -> None:
        """Source runner, at each ``latestOffset``: the channels' progress, for the
        heartbeat's report."""
        self._channels = channels

    def _tick_due(self) -> bool:
        """Whether a tick may trigger something now (lock-free: as of the last poll)."""
        due = self._due_ms
        return due is not None and due <= self.host.clock.now_ms()

    @property
    def stopping(self) -> CheckpointRequest | None:
        """The host's stop request as of the last poll (consistent with the barriers
        queued by it)."""
        with self._queue_lock:
            return self._stopping

    @property
    def last_completed(self) -> CompletedCheckpoint | None:
        """The newest checkpoint completed in this run, as of the last poll; read without
        waiting for a poll in progress (a completion's Delta commits)."""
        return self._last_completed

    @property
    def draining(self) -> bool:
        """Whether a stop with drain waits for the channels (as of the last poll)."""
        return self._draining

    def poll_now(self) -> list[CheckpointBarrier]:
        """One poll on the caller's thread, then :meth:`take_barriers`: for callers that
        wait on the coordinator and want no polling delay."""
        if self._error is not None:
            raise self._error
        self._poll()
        return self.take_barriers()  # ticks the coordinator

    def stop(self) -> None:
        """Stop polling and wait for the thread (idempotent); the heartbeat ends."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self.heartbeat.stop()


def exit_quietly_if_channel_closed() -> None:
    """Source runner, from the stream reader's ``stop()``: end the process without a trace
    when the JVM closed the runner's channel.

    Spark stops a query's source runner by closing its socket; the runner's loop then reads
    end-of-file, calls ``reader.stop()`` in a ``finally`` and would print the ``EOFError``'s
    stack trace to the job's console while the JVM is killing it. A user who stops a pipeline
    must see no stack trace, so once the coordinator's thread has stopped, a stop caused by
    that end-of-file exits here with status 0 (the runner exits anyway; nothing of ours is
    left to run). Any other exception propagates to Spark as before.
    """
    if isinstance(sys.exc_info()[1], EOFError):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)

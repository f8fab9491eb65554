"""The asynchronous phase of the executors' checkpoints, off the Spark task.

A subtask's snapshot has a synchronous phase (copy the changed state, seal the sink's
transaction) that runs in its micro-batch's task, and an asynchronous phase (write the copy
to the checkpoint store, then acknowledge) that Flink runs on a thread of its own. On the
executors that thread is :class:`ExecutorSnapshots`' :class:`SnapshotWorker
<spark_ckpt.runtime.snapshot_worker.SnapshotWorker>`, one per subtask host
(:mod:`spark_ckpt.spark.executors.subtask_host`): the micro-batch ends without waiting for the Delta
commit of its state, and the next micro-batch's tasks start while it runs.

Only where Spark reuses its Python workers (``spark.python.worker.reuse``, the default:
``SPARK_REUSE_WORKER=1`` in the environment the host inherits from the worker that started
it). Where it does not, the phase runs inline, in the micro-batch, so a failed write fails
the task and Spark retries it.

**A writer lost before it acknowledged.** A subtask host may die (killed, out of memory,
its executor lost) between its micro-batch and the end of the write, while no task of
Spark's waits on it: Spark notices nothing, and the checkpoint would wait for an
acknowledgement that never comes, until its timeout. So every changelog segment names its
writer (:class:`Writer`: host, process, and the checkpoints whose write it had not finished
when it published the segment).
The next micro-batch of the subtask that runs in another process (it caught up, or rebuilt
the state) reads the fence's segment: if that writer is gone (its process no longer exists
on this host, or it was on another host), it declines those checkpoints
(:func:`decline_lost_writes`). A decline of a checkpoint the writer had acknowledged after
all, or that is no longer pending, changes nothing at the coordinator.

No micro-batch may follow: the final checkpoint of ``Trigger.AvailableNow`` or of a stop is
the last one the subtasks see. So the coordinator's host also looks, about once a second
while a checkpoint waits for subtasks (:class:`LostWriterScan`), at the newest segment of
each subtask that has not acknowledged it: a writer on the driver's host whose process is
gone is declined there, and the final checkpoint is taken again (the next micro-batch carries
its barrier, and the subtasks rebuild elsewhere). A writer on another host is left to the
next micro-batch, or else to the checkpoint's timeout (the driver cannot see that host's
processes).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from spark_ckpt.coordination.heartbeats import process_exists
from spark_ckpt.locations.uris import is_remote
from spark_ckpt.protocol.state_handles import DeclineCheckpoint, TaskId
from spark_ckpt.runtime.snapshot_worker import SnapshotWorker
from spark_ckpt.runtime.task import AsyncPhase, OperatorTask
from spark_ckpt.spark.executors.changelog import SubtaskChangelog
from spark_ckpt.spark.executors.executor_cache import CacheKey

#: The key of a changelog segment's metadata that names its writer.
WRITER = "writer"


@dataclass(frozen=True)
class Writer:
    """The process that published a changelog segment, and the checkpoints whose state it
    was still writing then (the asynchronous phase, not acknowledged yet)."""

    host: str
    pid: int
    writing: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "writing": list(self.writing)}

    @staticmethod
    def from_meta(meta: Mapping[str, Any]) -> Writer | None:
        """The writer a segment's metadata names (None: none named, an older segment)."""
        d = meta.get(WRITER)
        if not isinstance(d, dict):
            return None
        return Writer(str(d["host"]), int(d["pid"]), tuple(int(c) for c in d["writing"]))

    def lost(self) -> bool:
        """Whether its writes may never finish: its process is gone from this host, or it
        ran on another host (whose process this one cannot see)."""
        return self.host != socket.gethostname() or not process_exists(self.pid)

    def gone_from_here(self) -> bool:
        """Whether its writes will never finish as seen from another process of a pipeline
        (the driver): it ran on this host and its process no longer exists. A writer on
        another host may be alive: this host cannot tell."""
        return self.host == socket.gethostname() and not process_exists(self.pid)

    def decline(self, checkpoint_id: int, task: TaskId) -> DeclineCheckpoint:
        """The decline of *task*'s checkpoint *checkpoint_id*, which this writer lost."""
        return DeclineCheckpoint(
            checkpoint_id,
            task,
            f"the process writing its state (process {self.pid} on {self.host}) was "
            "lost before it acknowledged",
        )


class ExecutorSnapshots:
    """This process's snapshot thread, and the checkpoints each subtask's asynchronous
    phases are writing (see the module docstring)."""

    def __init__(self) -> None:
        self._worker: SnapshotWorker | None = None
        self._lock = threading.Lock()
        self._writing: dict[CacheKey, list[int]] = {}

    @staticmethod
    def reused_worker() -> bool:
        """Whether Spark reuses this Python worker after its task (the phase may outlive the
        task only then)."""
        return os.environ.get("SPARK_REUSE_WORKER") == "1"

    def run_async(self, key: CacheKey) -> Callable[[Callable[[], None]], None] | None:
        """The *run_async* of *key*'s :class:`~spark_ckpt.runtime.task.OperatorTask`: this
        worker's snapshot thread, or None (inline) in a worker that is not reused."""
        return partial(self._submit, key) if self.reused_worker() else None

    def _submit(self, key: CacheKey, job: Callable[[], None]) -> None:
        """Queue *job* (an :class:`AsyncPhase`) on the thread. Raises what stopped the thread
        (an unexpected error of an earlier job: the task fails); the next submit starts a
        new thread."""
        cid = job.checkpoint_id if isinstance(job, AsyncPhase) else 0

        def run() -> None:
            try:
                job()
            finally:
                with self._lock:
                    self._writing[key].remove(cid)

        with self._lock:
            self._writing.setdefault(key, []).append(cid)
        try:
            if self._worker is None:
                self._worker = SnapshotWorker("spark-ckpt-executor-snapshot")
            self._worker.submit(run)
        except BaseException:
            self._worker = None
            with self._lock:
                self._writing[key].remove(cid)
            raise

    def writer(self, key: CacheKey) -> Writer:
        """This process as the writer of *key*'s next changelog segment."""
        with self._lock:
            writing = tuple(sorted(self._writing.get(key, ())))
        return Writer(socket.gethostname(), os.getpid(), writing)

    def writing(self) -> bool:
        """Whether a write is queued or running."""
        with self._lock:
            return any(self._writing.values())

    def drain(self) -> None:
        """Wait until every queued write has finished (tests, and a worker's end)."""
        if self._worker is not None:
            self._worker.drain()


#: This process's snapshot thread (one per process).
SNAPSHOTS = ExecutorSnapshots()


def decline_lost_writes(task: OperatorTask, segment_meta: Mapping[str, Any]) -> list[int]:
    """*task* continues its subtask after another process ran it and published the segment
    whose metadata is *segment_meta*: if that writer is lost (:meth:`Writer.lost`), decline
    the checkpoints it had not finished writing (their acknowledgements will never come).
    Returns the checkpoints declined."""
    writer = Writer.from_meta(segment_meta)
    if writer is None or not writer.writing or not writer.lost():
        return []
    for cid in writer.writing:
        task.respond(writer.decline(cid, task.task_id))
    return list(writer.writing)


class LostWriterScan:
    """The coordinator's host (driver side): which pending checkpoints wait for a write that
    its host lost after the subtask's last micro-batch (see the module docstring).

    Use: :meth:`scan` *before* reading the mailbox, then apply its declines *after* the
    acknowledgements read there. A writer that acknowledged and then died has its ack in the
    mailbox by then, and a decline after an ack changes nothing at the coordinator."""

    def __init__(self, root: str, run_id: str, interval_s: float = 1.0) -> None:
        self.root = root
        self.run_id = run_id
        self.interval_s = interval_s
        self._next = 0.0

    def scan(self, waiting: Mapping[int, Iterable[TaskId]]) -> list[DeclineCheckpoint]:
        """*waiting*: each pending checkpoint and the subtasks that have not acknowledged it.
        The declines of those whose subtask's newest changelog segment names a writer gone
        from this host that was still writing them. At most once per *interval_s* ([] in
        between, and on a root without a changelog)."""
        now = time.monotonic()
        if not waiting or now < self._next or is_remote(self.root):  # /proc of this host
            return []
        self._next = now + self.interval_s
        writers: dict[TaskId, list[Writer]] = {}
        declines = []
        for cid, tasks in sorted(waiting.items()):
            for task in tasks:
                if task not in writers:
                    changelog = SubtaskChangelog(self.root, self.run_id, task.subtask, task.vertex)
                    metas = changelog.newest_segment_metas()
                    found = (Writer.from_meta(m) for m in metas)
                    writers[task] = [w for w in found if w is not None and w.writing]
                for writer in writers[task]:
                    if cid in writer.writing and writer.gone_from_here():
                        declines.append(writer.decline(cid, task))
                        break
        return declines

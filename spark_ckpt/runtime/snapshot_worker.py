"""The asynchronous phase of checkpoints, on a thread of its own.

Flink splits a task's snapshot into a synchronous phase (on the task thread: copy the state,
seal the sink transaction) and an asynchronous phase (on a separate thread: write the copy to
checkpoint storage, then acknowledge). :class:`SnapshotWorker` is that separate thread for
the foreachBatch aligner: its micro-batch no longer waits for Delta commits of state blobs,
nor for the reads that learn which checkpoints completed.

Jobs run one at a time, in submission order (so acknowledgements of one task keep their
order). A job handles its own expected failures (a failed state write declines the
checkpoint); anything else it raises stops the worker and is raised again, on the
submitting thread, by the next :meth:`SnapshotWorker.submit` or :meth:`SnapshotWorker.drain`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Job = Callable[[], None]


class SnapshotWorker:
    """A single daemon thread running submitted jobs in order. See the module docstring."""

    def __init__(self, name: str = "spark-ckpt-snapshot") -> None:
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if self._error is None:
                    job()
            except BaseException as e:  # raised again on the submitting thread
                log.error("%s stopped: %s", self._thread.name, e)
                self._error = e
            finally:
                self._jobs.task_done()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, job: Job) -> None:
        """Queue *job*; raises what stopped the worker, if anything did."""
        self._raise_error()
        self._jobs.put(job)

    def drain(self) -> None:
        """Wait until every submitted job has run; raises what stopped the worker."""
        self._jobs.join()
        self._raise_error()

    def abandon(self) -> None:
        """Drop the jobs not started yet, wait for the running one, end the thread."""
        while True:
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
            self._jobs.task_done()
        self.close()

    def close(self) -> None:
        """Run what is queued, then end the thread (idempotent)."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

"""One run of a pipeline as the driver sees it: its Spark query, its foreachBatch function
and its run files — and how it stops.

A graceful stop (Flink's stop-with-savepoint, or a stop with a final checkpoint) goes
through the coordinator: the final checkpoint is requested through the pipeline's client,
its output commit is awaited, the micro-batch in progress ends (the source emits nothing
after the final barrier), then the query stops and the run's runtime is retired.
Externalized-checkpoint retention is applied when the job ends.

Who carries a stop request out: :meth:`Pipeline.run <spark_ckpt.pipeline.pipeline.Pipeline.run>`'s
supervising loop, or — for a run of :meth:`Pipeline.start
<spark_ckpt.pipeline.pipeline.Pipeline.start>` — the run's watcher thread
(:meth:`PipelineRun.watch_stop_requests`), so that :meth:`PipelineClient.stop
<spark_ckpt.client.pipeline_client.PipelineClient.stop>` from this or any other process ends either.
A query of your own (``ckpt-source`` into ``ckpt-sink``) stops the same way with
:func:`stop_query` and its pipeline root.

Runs in the user's driver process (the Spark Connect client under Connect).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from spark_ckpt.client.pipeline_client import PipelineClient
from spark_ckpt.coordination.global_committer import sink_from_spec
from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.messages import RequestKind
from spark_ckpt.coordination.requests import RESTART, RUN, STOP
from spark_ckpt.coordination.runs import RunFiles, RunState, RunStatus
from spark_ckpt.coordination.savepoint_export import wait_exported
from spark_ckpt.coordination.topology import read_topology
from spark_ckpt.errors import CheckpointError, CheckpointFailedError, SparkCkptError
from spark_ckpt.locations.uris import is_remote
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.clock import SystemClock
from spark_ckpt.runtime.checkpoint_cleaner import REQUEST_ID
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.coordinator import JobStatus, discards_checkpoints
from spark_ckpt.runtime.restore_settings import PIPELINE
from spark_ckpt.spark.driver.foreach_batch import ForeachBatchFunction
from spark_ckpt.spark.executors.changelog import remove_run
from spark_ckpt.spark.executors.subtask_function import SubtaskFunction

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

#: How long a graceful stop waits for a micro-batch in progress before stopping anyway.
STOP_GRACE_S = 30.0
#: What a run's query calls: the foreachBatch function (subtasks in the driver) or the
#: subtasks' stateful function (on executors).
RunFunction = ForeachBatchFunction | SubtaskFunction

#: How often a run's watcher looks for the final checkpoint of a stop request.
WATCH_POLL_S = 0.5
#: The same on an object-store root, where each look at the log is several billed requests
#: (a stop there is seen up to that much later).
WATCH_POLL_REMOTE_S = 2.0
#: How often a stop on the user's behalf requests its final checkpoint before it stops
#: without one (:meth:`PipelineRun.stop_quietly`).
STOP_ATTEMPTS = 3


class RunOwner(Protocol):
    """What a run needs of the pipeline it belongs to
    (:class:`~spark_ckpt.pipeline.pipeline.Pipeline` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def root(self) -> str: ...

    @property
    def config(self) -> CheckpointConfig: ...

    @property
    def driver_id(self) -> str: ...

    @property
    def client(self) -> PipelineClient: ...

    def owns_run(self, run_id: str) -> bool:
        """Whether run *run_id* was started by this pipeline's driver."""
        ...


@dataclass
class PipelineRun:
    """One run of a pipeline (see :mod:`spark_ckpt.coordination.runs`): its Spark query and its
    foreachBatch function. Made by :meth:`Pipeline.start
    <spark_ckpt.pipeline.pipeline.Pipeline.start>`."""

    pipeline: RunOwner
    run_id: str
    attempt: int
    query: StreamingQuery
    function: RunFunction
    files: RunFiles
    #: a local directory of the driver the run's query used and that goes when it retires
    #: (Spark's checkpoint location of a run whose root is on an object store)
    scratch: str | None = None
    _stop_lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )
    _stopped: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def restored_from(self) -> int | None:
        """The checkpoint this run restored from (None: it started empty or not yet)."""
        point = self.files.restore_point()
        return None if point is None else point.checkpoint_id

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait for the query to end; raises Spark's ``StreamingQueryException`` if it
        failed. Returns whether it ended."""
        if timeout_s is None:
            self.query.awaitTermination()
            return True
        return bool(self.query.awaitTermination(timeout_s))  # type: ignore[arg-type]

    def report(self, state: RunState, **fields: object) -> None:
        """Write the run's status file (read by clients: CLI, notebooks)."""
        self.files.write_status(
            RunStatus(
                self.run_id,
                self.pipeline.driver_id,
                state,
                self.attempt,
                SystemClock().now_ms(),
                **fields,  # type: ignore[arg-type]
            )
        )

    def retire(self) -> None:
        """After the query ended: remove the run's mailbox box and its :attr:`scratch`
        directory, and release the function's runtime if it was built in this process
        (classic Spark calls the foreachBatch function in the driver; under Spark Connect the
        runtime lives in the server's foreachBatch process, which Spark ends with the query).
        Idempotent."""
        self.function.retire()
        remove_run(self.pipeline.root, self.run_id)  # subtasks on the executors: changelog
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        try:
            Mailbox(self.pipeline.root, self.run_id).remove_box()
        except SparkCkptError as e:
            log.debug("removing the mailbox of run %s: %s", self.run_id, e)

    # -- stopping ---------------------------------------------------------------------------
    def stop(
        self, *, savepoint: bool = False, drain: bool = False, timeout_s: float = 120.0
    ) -> CompletedCheckpoint | None:
        """Stop with a final checkpoint (or savepoint): request it, wait until it completed
        and its output is committed, then stop the query without interrupting a micro-batch.
        *drain*: read the input available now first. Returns it (the latest completed
        checkpoint if the query had ended)."""
        client = self.pipeline.client
        if not self.query.isActive:
            self.retire()
            return client.latest()
        request_id = client.request(
            RequestKind.STOP, savepoint=savepoint, timeout_s=timeout_s, drain=drain
        )
        final = client.wait_for(request_id, timeout_s)
        self.finish_stop(final, request_id)
        return final

    def stop_quietly(self) -> CompletedCheckpoint | None:
        """A stop on the user's behalf (duration, Ctrl-C): with a final checkpoint when the
        query still runs; never a stack trace. A final checkpoint that fails is requested
        again, up to :data:`STOP_ATTEMPTS` times; then the query stops without one (the next
        run resumes from the latest completed checkpoint)."""
        for attempt in range(1, STOP_ATTEMPTS + 1):
            try:
                return self.stop()
            except KeyboardInterrupt:  # a second Ctrl-C: stop now, without a final checkpoint
                break
            except CheckpointFailedError as e:
                then = "trying again" if attempt < STOP_ATTEMPTS else "stopping without one"
                log.warning("the final checkpoint of the stop failed (%s); %s", e, then)
        end_query(self.query)
        self.retire()
        self.report(RunState.STOPPED, restored_from=self.restored_from)
        return self.pipeline.client.latest()

    def finish_stop(self, final: CompletedCheckpoint, request_id: str) -> None:
        """The final checkpoint of a stop completed: wait for its sink commit, let the
        micro-batch in progress end, stop the query, end the runtime, apply externalized
        retention.

        Everything here reaches the run through files and Spark's query handle, never
        through the foreachBatch function's runtime (under Spark Connect it lives in a
        server-side process): the final checkpoint completed, so every task processed and
        acknowledged all rows before the final barrier, and the source emits none after it;
        the batch carrying it was processed before its ``foreachBatch`` call returned.

        Runs once per run: a second call (the run's watcher and :meth:`stop` may both see the
        final checkpoint) waits for the first and returns."""
        with self._stop_lock:
            if self._stopped:
                return
            self.report(
                RunState.STOPPING, restored_from=self.restored_from, stop_request=request_id
            )
            wait_committed(self.pipeline.root, self.pipeline.name, final)
            if final.is_savepoint:  # the query's source runner exports it: not before that
                wait_exported(self.pipeline.root, final, timeout_s=120.0)
            end_query(self.query)
            self.retire()
            if RESTART not in final.properties:  # a restart goes on with the next run
                end_job(
                    self.pipeline, JobStatus.FINISHED if final.is_savepoint else JobStatus.CANCELED
                )
            self._stopped = True
            self.report(RunState.STOPPED, restored_from=self.restored_from, stop_request=request_id)

    # -- the watcher of a started run ---------------------------------------------------------
    def watch_stop_requests(self, poll_s: float | None = None) -> threading.Thread:
        """Carry out stop requests for this run from a daemon thread of this process, as
        :meth:`Pipeline.run <spark_ckpt.pipeline.pipeline.Pipeline.run>`'s supervising loop
        does: once the final checkpoint (or savepoint) of a stop request that this run's
        coordinator took has completed, :meth:`finish_stop` (output committed, savepoint
        copied, query stopped, status ``STOPPED``), so that :meth:`PipelineClient.stop
        <spark_ckpt.client.pipeline_client.PipelineClient.stop>` returns. When the query ends
        otherwise (``available_now``, a failure, ``query.stop()``) the run is retired and
        reported ``FINISHED`` or ``FAILED``. :meth:`Pipeline.start
        <spark_ckpt.pipeline.pipeline.Pipeline.start>` starts it; the thread ends with the
        query. It looks at the checkpoint log every *poll_s* (default :data:`WATCH_POLL_S`,
        :data:`WATCH_POLL_REMOTE_S` on an object-store root)."""
        if poll_s is None:
            poll_s = WATCH_POLL_REMOTE_S if is_remote(self.pipeline.root) else WATCH_POLL_S
        thread = threading.Thread(
            target=self._watch, args=(poll_s,), name=f"spark-ckpt-run-{self.run_id}", daemon=True
        )
        thread.start()
        return thread

    def _watch(self, poll_s: float) -> None:
        client = PipelineClient(self.pipeline.root)  # a store of its own: not shared
        try:
            while self.query.isActive:
                final = next(
                    (
                        c
                        for c in client.checkpoints()
                        if STOP in c.properties and c.properties.get(RUN) == self.run_id
                    ),
                    None,
                )
                if final is not None:
                    self.finish_stop(final, str(final.properties.get(REQUEST_ID)))
                    return
                time.sleep(poll_s)
            with self._stop_lock:
                if self._stopped:
                    return
                error = self.query.exception()
                self.retire()
                if error is None:
                    self.report(RunState.FINISHED, restored_from=self.restored_from)
                else:
                    first = str(error).strip().splitlines()
                    self.report(RunState.FAILED, error=first[0] if first else repr(error))
        except Exception as e:  # the session ended under the watcher, a store error: log only
            log.debug("watcher of run %s ended: %s", self.run_id, e)


def wait_committed(
    root: str, pipeline: str, checkpoint: CompletedCheckpoint, timeout_s: float = 60.0
) -> None:
    """Wait until the output of *checkpoint* of pipeline *pipeline* under *root* is committed
    to its sink, and its late rows to the late-output table if the pipeline has one (the
    coordinator commits them right after the completion); raises
    :class:`~spark_ckpt.errors.CheckpointError` after *timeout_s*. Nothing to wait for without
    a sink. The sinks' tables say so, or the run's coordinator, which records each checkpoint
    whose commits it made (``committed.json``): a pipeline that never had output has no table
    to say it."""
    run_id = checkpoint.properties.get(RUN)
    topology = read_topology(root, str(run_id) if run_id else None)
    if topology is None or topology.sink is None:
        return
    sinks = [sink_from_spec(topology.sink, pipeline=pipeline)]
    if topology.late_sink is not None:  # the late rows' table commits right after
        sinks.append(sink_from_spec(topology.late_sink, pipeline=pipeline))
    sinks += [sink_from_spec(spec, pipeline=pipeline) for _, spec in topology.side_sinks]
    run = RunFiles(root, str(run_id)) if run_id else None
    target = checkpoint.checkpoint_id
    deadline = time.monotonic() + timeout_s
    while min(s.committed_checkpoint() for s in sinks) < target:
        if run is not None and (run.committed() or 0) >= target:
            return  # its coordinator made the commits (none, without output)
        if time.monotonic() > deadline:
            raise CheckpointError(f"output of checkpoint {target} was not committed in time")
        time.sleep(0.2)


def end_job(pipeline: RunOwner, status: JobStatus) -> None:
    """Externalized-checkpoint retention for a job that ended with *status* (no run of it is
    active): discard its checkpoints (never savepoints) where configured. A stop without
    savepoint is CANCELED, a stop with savepoint FINISHED (it resumes from the savepoint), a
    failure beyond the restart strategy FAILED. The end of a ``Trigger.AvailableNow`` run is
    no end of the job (the next run resumes from its final checkpoint): nothing is
    discarded then."""
    retention = pipeline.config.externalized_retention
    if not discards_checkpoints(retention, status):
        return
    store = pipeline.client.store
    ids = [c.checkpoint_id for c in store.list_completed() if not c.is_savepoint]
    if ids:
        store.discard(store.acquire(), ids)
        log.info("discarded checkpoints %s (%s)", ids, retention)


def stop_query(
    query: StreamingQuery,
    root: str | None = None,
    *,
    savepoint: bool = False,
    drain: bool = False,
    timeout_s: float = 120.0,
) -> CompletedCheckpoint | None:
    """Stop *query*, a ``ckpt-source`` query of the pipeline under *root* (its ``store``
    option), gracefully: as :meth:`PipelineClient.stop
    <spark_ckpt.client.pipeline_client.PipelineClient.stop>` does for a pipeline run, take a final
    checkpoint (a savepoint with *savepoint*; with *drain* after reading the input
    available now), wait until its output is committed (and a savepoint's copy written),
    then stop the query between micro-batches. A query that has just started is waited for
    until its coordinator runs. Returns the final checkpoint (the latest completed one if
    the query had ended). Raises :class:`~spark_ckpt.errors.CheckpointError` if the final
    checkpoint does not complete within *timeout_s* (the request is taken back; the query
    keeps running).

    Without *root*: no final checkpoint, only the stop between micro-batches (the next run
    resumes from the latest completed checkpoint). Externalized-checkpoint retention is not
    applied here (a :class:`~spark_ckpt.pipeline.pipeline.Pipeline` run applies it)."""
    if root is None:
        end_query(query)
        return None
    client = PipelineClient(root)
    deadline = time.monotonic() + timeout_s
    while not client.live():  # a query just started: its coordinator is not polling yet
        if not query.isActive:
            return client.latest()
        if time.monotonic() >= deadline:
            raise CheckpointError(
                f"the coordinator of the query under {client.root} did not start within "
                f"{timeout_s:g} s"
            )
        time.sleep(0.2)
    remaining = max(1.0, deadline - time.monotonic())
    request_id = client.request(
        RequestKind.STOP, savepoint=savepoint, timeout_s=remaining, drain=drain
    )
    try:
        final = client.wait_for(request_id, remaining)
    except CheckpointError:
        client.withdraw(request_id)
        raise
    wait_committed(client.root, str(final.properties.get(PIPELINE, "")), final)
    if final.is_savepoint:
        wait_exported(client.root, final, timeout_s=timeout_s)
    end_query(query)
    return final


def end_query(query: StreamingQuery) -> None:
    """Stop *query* without interrupting a micro-batch in progress where possible: the
    source emits nothing after a stop's final barrier, so wait (bounded) until no trigger is
    active, then stop."""
    deadline = time.monotonic() + STOP_GRACE_S
    while query.isActive and time.monotonic() < deadline:
        try:
            if not query.status.get("isTriggerActive", False):
                break
        except Exception:  # a status call on a dying query: stop it anyway
            break
        time.sleep(0.05)
    query.stop()

"""The pipeline client: how a notebook, the CLI, or the pipeline object itself talks to a
running pipeline — by its root, never through a Python object of the process that runs it.

Requests (checkpoint, savepoint, stop) are posted to the coordinator's mailbox under the
root and answered by completed checkpoints in the checkpoint store that carry the
request's id; a pause or resume of the periodic checkpoints is answered by the
coordinator taking the request, with the pause recorded under the root
(:mod:`spark_ckpt.coordination.schedule`); queries (completed checkpoints, the latest one,
statistics, runs) read the store and the runs' files. That is what makes a pipeline
controllable from anywhere that sees its root: another notebook, a shell, a Spark Connect
client whose foreachBatch function runs in a server-side process.

Statistics come from the store's checkpoint statistics history
(:mod:`spark_ckpt.storage.history`), which outlives checkpoint retention; the retained
checkpoints themselves (:meth:`PipelineClient.checkpoints`) are the restore points.

No ``pyspark`` here: the client needs neither a SparkSession nor a running JVM.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import mean
from typing import TYPE_CHECKING

from spark_ckpt.coordination.heartbeats import Heartbeats
from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.messages import Request, RequestKind
from spark_ckpt.coordination.runs import Runs, RunState, RunStatus
from spark_ckpt.coordination.savepoint_export import exported_path, wait_exported
from spark_ckpt.coordination.schedule import CheckpointSchedule, SchedulePause
from spark_ckpt.errors import CheckpointError, CheckpointFailedError
from spark_ckpt.locations.credentials import StorageOptions
from spark_ckpt.locations.uris import normalized
from spark_ckpt.monitoring.notebook import overview_html
from spark_ckpt.monitoring.root_view import RootReader, RootView
from spark_ckpt.monitoring.server import CheckpointServer
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint, FailedCheckpoint
from spark_ckpt.protocol.clock import SystemClock
from spark_ckpt.runtime.checkpoint_cleaner import REQUEST_ID
from spark_ckpt.runtime.failure import is_aborted

if TYPE_CHECKING:
    from spark_ckpt.delta.delta_store import DeltaCheckpointStore
    from spark_ckpt.storage.history import CheckpointRecord

#: How often the client polls the store while waiting for an answer.
POLL_S = 0.2


@dataclass(frozen=True)
class Span:
    """Minimum, average and maximum of one figure over the completed checkpoints and
    savepoints of the statistics history."""

    min: float
    avg: float
    max: float


@dataclass(frozen=True)
class CheckpointSummary:
    """Statistics over the checkpoint statistics history (Flink's checkpoint summary and
    counts; see :meth:`PipelineClient.history`): how many completed checkpoints, savepoints,
    failed and aborted ones it holds (they add up to :attr:`total`, its length), min/avg/max
    of end-to-end duration, state size and alignment time over the completed ones (None
    when there are none), the failed and aborted ones by reason, and the last of them.
    ``latest`` is the newest *retained* completed checkpoint (a restore point), not a
    history record.

    A failed checkpoint is one whose reason counts against ``checkpoint.tolerable-failures``
    (expired, declined, finalize_failed, task_failure); the others (subsumed, cancelled,
    coordinator_shutdown, fenced) are aborted."""

    checkpoints: int
    savepoints: int
    latest: CompletedCheckpoint | None
    duration_ms: Span | None
    state_bytes: Span | None
    alignment_ms: Span | None
    #: failed and aborted checkpoints on record, by reason (a CheckpointFailureReason value)
    failures: Mapping[str, int] = field(default_factory=dict)
    last_failure: FailedCheckpoint | None = None
    failed: int = 0
    aborted: int = 0

    @property
    def total(self) -> int:
        """The number of records in the history: completed, savepoints, failed, aborted."""
        return self.checkpoints + self.savepoints + self.failed + self.aborted


def _span(values: list[int]) -> Span | None:
    return Span(min(values), mean(values), max(values)) if values else None


class PipelineClient:
    """Requests to and queries of the pipeline under *root* (the pipeline's root folder or
    URI: checkpoint store, mailbox, runs). Safe to use from any process, any number of
    times; a request expires after its timeout, so a pipeline started later never acts on a
    request nobody waits for any more. *storage_options*: the pipeline's explicit storage
    options (see :class:`~spark_ckpt.pipeline.pipeline.Pipeline`), installed for the root's
    bucket in this process; default: the environment's."""

    def __init__(self, root: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.root = normalized(root)
        StorageOptions.of(storage_options, [self.root]).install()
        self.mailbox = Mailbox(self.root)
        self._store: DeltaCheckpointStore | None = None
        self._posted: dict[str, tuple[str, RequestKind]] = {}  # request id -> (file, kind)

    @property
    def store(self) -> DeltaCheckpointStore:
        """The pipeline's checkpoint store (opened on first use)."""
        if self._store is None:
            from spark_ckpt.delta.delta_store import DeltaCheckpointStore

            self._store = DeltaCheckpointStore(self.root)
        return self._store

    # -- requests ---------------------------------------------------------------------------
    def request(
        self,
        kind: RequestKind,
        target: str | None = None,
        savepoint: bool = False,
        timeout_s: float = 120.0,
        drain: bool = False,
    ) -> str:
        """Post a request to the running coordinator and return its id; it expires after
        *timeout_s*. *drain* (STOP): read the input available now before the final
        checkpoint. Raises :class:`~spark_ckpt.errors.CheckpointError` at once, posting
        nothing, when no run of the pipeline is live (:meth:`live`)."""
        if not self.live():
            raise CheckpointError(
                f"no live run of the pipeline under {self.root}: nothing would answer the "
                f"{kind.value} request (a run that stopped or was killed is not live; start "
                "the pipeline first)"
            )
        request_id = uuid.uuid4().hex
        expires = SystemClock().now_ms() + int(timeout_s * 1000)
        request = Request(request_id, kind, target, savepoint, expires, drain)
        name = self.mailbox.post(request)
        self._posted[request_id] = (name, kind)
        return request_id

    def live(self) -> bool:
        """Whether a run of the pipeline is live: starting, or its coordinator polling the
        mailbox (a fresh heartbeat whose process, on this host, exists; see
        :mod:`spark_ckpt.coordination.mailbox`)."""
        return bool(Heartbeats(self.root).live())

    def withdraw(self, request_id: str) -> None:
        """Take back a request this client posted, if the coordinator has not taken it yet."""
        posted = self._posted.pop(request_id, None)
        if posted is not None:
            self.mailbox.delete([posted[0]])

    def answer(self, request_id: str) -> CompletedCheckpoint | None:
        """The completed checkpoint that answered *request_id*, if any yet."""
        return next(
            (c for c in self.store.list_completed() if c.properties.get(REQUEST_ID) == request_id),
            None,
        )

    def failure(self, request_id: str) -> FailedCheckpoint | None:
        """The failure of the checkpoint that answered *request_id*, if it failed (from the
        statistics history, where the coordinator records it with the request's id)."""
        return next(
            (f for f in self.store.list_failed() if f.properties.get(REQUEST_ID) == request_id),
            None,
        )

    def wait_for(self, request_id: str, timeout_s: float = 120.0) -> CompletedCheckpoint:
        """Wait until the checkpoint answering *request_id* completed. Raises
        :class:`~spark_ckpt.errors.CheckpointFailedError` once it failed (the pipeline goes
        on), :class:`~spark_ckpt.errors.CheckpointError` after *timeout_s* without an
        answer."""
        deadline = time.monotonic() + timeout_s
        posted = self._posted.get(request_id)
        what = f"the {posted[1].value} request" if posted else f"request {request_id}"
        while True:
            answer = self.answer(request_id)
            if answer is not None:
                return answer
            failed = self.failure(request_id)
            if failed is not None:
                raise CheckpointFailedError(
                    f"{what} failed: {failed.snapshot_type.value} {failed.checkpoint_id} "
                    f"{failed.reason}: {failed.message}"
                )
            if time.monotonic() >= deadline:
                raise CheckpointError(
                    f"no answer to {what} within {timeout_s:g} s "
                    f"(is the pipeline under {self.root} running?)"
                )
            time.sleep(POLL_S)

    def wait_stopped(self, request_id: str, timeout_s: float = 120.0) -> RunStatus:
        """Wait until the run that acted on the stop request *request_id* reports STOPPED
        (final checkpoint completed, output committed, query ended)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for status in Runs(self.root).statuses():
                if status.stop_request == request_id and status.state is RunState.STOPPED:
                    return status
            if time.monotonic() >= deadline:
                raise CheckpointError(
                    f"the pipeline under {self.root} did not stop within {timeout_s:g} s"
                )
            time.sleep(POLL_S)

    def checkpoint(self, timeout_s: float = 120.0) -> CompletedCheckpoint:
        """Trigger a checkpoint now and wait for it to complete."""
        return self.wait_for(self.request(RequestKind.CHECKPOINT, timeout_s=timeout_s), timeout_s)

    def savepoint(self, target: str | None = None, timeout_s: float = 120.0) -> CompletedCheckpoint:
        """Trigger a savepoint now (into directory *target*, default ``savepoint.dir``, else
        ``<root>/savepoints``) and wait until it completed and its self-contained copy is
        written (:meth:`savepoint_path` says where)."""
        request_id = self.request(RequestKind.SAVEPOINT, target, timeout_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        savepoint = self.wait_for(request_id, timeout_s)
        wait_exported(self.root, savepoint, max(0.0, deadline - time.monotonic()))
        return savepoint

    def savepoint_path(self, savepoint: CompletedCheckpoint) -> str:
        """The directory of the self-contained copy of a savepoint of this pipeline (see
        :mod:`spark_ckpt.delta.savepoint`)."""
        return exported_path(self.root, savepoint)

    def stop(
        self, *, savepoint: bool = False, drain: bool = False, timeout_s: float = 120.0
    ) -> CompletedCheckpoint:
        """Stop the running pipeline with a final checkpoint (or savepoint) and wait until it
        has stopped; returns the final checkpoint. The process that supervises the run
        (:meth:`Pipeline.run <spark_ckpt.pipeline.pipeline.Pipeline.run>`) ends the query once
        the final checkpoint's output is committed (and a savepoint's copy written). With
        *drain*, the sources are first read up to where they were when the request arrived
        (Flink's ``stop --drain``). A request nobody acted on within *timeout_s* is taken
        back."""
        request_id = self.request(
            RequestKind.STOP, savepoint=savepoint, timeout_s=timeout_s, drain=drain
        )
        deadline = time.monotonic() + timeout_s
        try:
            final = self.wait_for(request_id, timeout_s)
        except CheckpointError:
            self.withdraw(request_id)
            raise
        self.wait_stopped(request_id, max(0.0, deadline - time.monotonic()))
        return final

    def pause_checkpoints(self, timeout_s: float = 120.0) -> SchedulePause:
        """Pause the periodic checkpoints of the running pipeline, and of its later runs,
        until :meth:`resume_checkpoints`; returns once the coordinator paused them (a
        checkpoint already under way completes). Manual checkpoints, savepoints and stops
        still work. Raises :class:`~spark_ckpt.errors.CheckpointError` when no run is live,
        or none took the request within *timeout_s* (then it is taken back)."""
        self._act(RequestKind.PAUSE, timeout_s)
        pause = self.checkpoints_paused()
        if pause is None:
            raise CheckpointError(
                f"the coordinator of the pipeline under {self.root} took the pause request "
                "but could not record it (see its log): periodic checkpoints go on"
            )
        return pause

    def resume_checkpoints(self, timeout_s: float = 120.0) -> None:
        """Resume the periodic checkpoints (the first one an interval after the coordinator
        took the request); returns once it did. Nothing changes when they were not paused.
        Raises as :meth:`pause_checkpoints` does."""
        self._act(RequestKind.RESUME, timeout_s)
        if self.checkpoints_paused() is not None:
            raise CheckpointError(
                f"the coordinator of the pipeline under {self.root} took the resume request "
                "but could not remove the pause record (see its log): periodic checkpoints "
                "stay paused"
            )

    def _act(self, kind: RequestKind, timeout_s: float) -> None:
        """Post a request that no checkpoint answers and wait until the coordinator took
        it (it deletes a request once it acted on it)."""
        request_id = self.request(kind, timeout_s=timeout_s)
        name = self._posted[request_id][0]
        deadline = time.monotonic() + timeout_s
        while self.mailbox.holds(name):
            if time.monotonic() >= deadline:
                self.withdraw(request_id)
                raise CheckpointError(
                    f"no coordinator took the {kind.value} request within {timeout_s:g} s "
                    f"(is the pipeline under {self.root} running?)"
                )
            time.sleep(POLL_S)
        self._posted.pop(request_id, None)

    # -- queries ----------------------------------------------------------------------------
    def checkpoints_paused(self) -> SchedulePause | None:
        """The pause of the periodic checkpoints in force (:meth:`pause_checkpoints`), None
        when they run."""
        return CheckpointSchedule(self.root).paused()

    def checkpoints(self) -> list[CompletedCheckpoint]:
        """Retained completed checkpoints and savepoints, oldest first."""
        return self.store.list_completed()

    def latest(self, include_savepoints: bool = True) -> CompletedCheckpoint | None:
        """The latest completed checkpoint (or savepoint), None before the first."""
        return self.store.latest_completed(include_savepoints)

    def history(self) -> list[CheckpointRecord]:
        """The checkpoint statistics history, by id: one record per finished checkpoint or
        savepoint, completed, failed or aborted, with its figures (timestamps, sizes,
        per-subtask metrics; the reason of a failure). It keeps the newest
        ``checkpoint.history`` records (default 100), however few checkpoints
        ``checkpoint.retained`` keeps for restores (:meth:`checkpoints`)."""
        return self.store.list_history()

    def stats(self) -> CheckpointSummary:
        """Statistics over the history (see :class:`CheckpointSummary`), read once."""
        records = self.history()
        completed = [r.stats for r in records if r.stats is not None]
        failed = [r.failure for r in records if r.failure is not None]
        aborted = sum(is_aborted(f) for f in failed)
        return CheckpointSummary(
            checkpoints=sum(r.stats is not None and not r.is_savepoint for r in records),
            savepoints=sum(r.stats is not None and r.is_savepoint for r in records),
            latest=self.latest(),
            duration_ms=_span([s.end_to_end_ms for s in completed]),
            state_bytes=_span([s.state_bytes for s in completed]),
            alignment_ms=_span([s.max_alignment_ms for s in completed]),
            failures=dict(sorted(Counter(f.reason for f in failed).items())),
            last_failure=failed[-1] if failed else None,
            failed=len(failed) - aborted,
            aborted=aborted,
        )

    def failures(self) -> list[FailedCheckpoint]:
        """The failed and aborted checkpoints of the history, by id: the reason, the message,
        and the figures of the subtasks that had acknowledged."""
        return self.store.list_failed()

    def runs(self) -> list[RunStatus]:
        """The status of each recent run (attempt) of the pipeline."""
        return Runs(self.root).statuses()

    # -- the checkpoint page ------------------------------------------------------------------
    def view(self) -> RootView:
        """Everything the checkpoint page shows, read now (see
        :mod:`spark_ckpt.monitoring.root_view`)."""
        return RootReader(self.root, self.store).read()

    def overview_html(self) -> str:
        """The checkpoint page's overview and charts as one piece of HTML (for
        ``displayHTML`` on Databricks; Jupyter shows it for the client itself)."""
        return overview_html(self.view())

    def _repr_html_(self) -> str:
        return self.overview_html()

    def serve(self, port: int = 0, host: str = "127.0.0.1") -> CheckpointServer:
        """Start the checkpoint page (``spark-ckpt ui``) for this pipeline on a thread of
        this process; its address is ``.url`` (port 0: any free one). Stop it with
        ``.shutdown()``."""
        server = CheckpointServer(RootReader(self.root, self.store), host, port)
        server.serve_in_thread()
        return server

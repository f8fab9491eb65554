"""Everything the checkpoint page shows, read from a pipeline's root in one go.

The page, ``/metrics`` and the notebook view are drawn from one :class:`RootView`, so the
figures on one screen agree with each other. A view holds:

* the checkpoint statistics history (completed, failed, aborted: the store's
  :meth:`~spark_ckpt.storage.checkpoint_store.CompletedCheckpoints.list_history`) and the
  retained checkpoints (restore points);
* the recent runs with their status, restore point and checkpoint configuration
  (:mod:`spark_ckpt.coordination.runs`);
* the live coordinators' reports (checkpoints in progress, source progress:
  :mod:`spark_ckpt.coordination.live_report`), carried by their heartbeats.

:class:`RootReader` reads views again and again (the page refreshes itself): the files of a
run that ended never change, so it reads them once. A read costs one listing of the runs,
the status, restore point and configuration of each run that has not ended, the store's
history and log, and one listing of the heartbeats.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_ckpt.coordination.heartbeats import Heartbeats
from spark_ckpt.coordination.live_report import LiveReport
from spark_ckpt.coordination.runs import RestorePoint, RunFiles, Runs, RunStatus
from spark_ckpt.errors import StoreError
from spark_ckpt.locations.uris import normalized
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint

if TYPE_CHECKING:
    from spark_ckpt.storage.checkpoint_store import CheckpointStore
    from spark_ckpt.storage.history import CheckpointRecord


@dataclass(frozen=True)
class RunView:
    """One run: its status, the restore point its coordinator chose and the checkpoint
    configuration it ran with (None: not written, a run of an older version or one whose
    coordinator never started)."""

    status: RunStatus
    restore: RestorePoint | None = None
    config: Mapping[str, Any] | None = None
    #: the pipeline's name as the run's coordinator knew it ("": not recorded)
    pipeline: str = ""


@dataclass(frozen=True)
class RootView:
    """A pipeline's checkpoints as read at *read_ms* (see the module docstring). *pipeline*
    names it on the page and in the metrics' labels: the name given to the reader, else the
    name the newest run recorded, else the root's last path component."""

    root: str
    pipeline: str
    read_ms: int
    records: tuple[CheckpointRecord, ...] = ()
    retained: tuple[CompletedCheckpoint, ...] = ()
    runs: tuple[RunView, ...] = ()
    live: tuple[LiveReport, ...] = ()
    #: whether a run of the pipeline is live: starting, or its coordinator beating
    running: bool = False

    @property
    def current_run(self) -> RunView | None:
        """The live run, else the newest one (None: the pipeline never ran)."""
        live = {r.run_id for r in self.live}
        for run in reversed(self.runs):
            if run.status.run_id in live:
                return run
        return self.runs[-1] if self.runs else None

    @property
    def config(self) -> Mapping[str, Any] | None:
        """The checkpoint configuration of the current run, else of the newest run that
        recorded one."""
        current = self.current_run
        if current is not None and current.config is not None:
            return current.config
        return next((r.config for r in reversed(self.runs) if r.config is not None), None)


def pipeline_name(root: str) -> str:
    """The name a root goes by when none is given: its last path component (default roots
    are ``./spark-ckpt-data/<pipeline name>``)."""
    return os.path.basename(normalized(root).rstrip("/")) or normalized(root)


class RootReader:
    """Reads :class:`RootView` of the pipeline under *root* from *store* (its checkpoint
    store), any number of times, from one thread at a time. Raises what the store raises
    for a damaged history (:class:`~spark_ckpt.errors.CorruptCheckpointError`) or an
    unreadable root (:class:`~spark_ckpt.errors.StoreError`)."""

    def __init__(self, root: str, store: CheckpointStore, pipeline: str | None = None) -> None:
        self.root = normalized(root)
        self.store = store
        self.pipeline = pipeline
        self._ended: dict[str, RunView] = {}  # an ended run's files never change

    def read(self) -> RootView:
        records = tuple(self.store.list_history())
        retained = tuple(self.store.list_completed())
        runs = tuple(
            sorted(
                (v for v in map(self._run, Runs(self.root).ids()) if v is not None),
                key=lambda v: v.status.updated_ms,
            )
        )
        beats = Heartbeats(self.root).live()
        live = tuple(h.report for h in beats if h.report is not None)
        named = next((r.pipeline for r in reversed(runs) if r.pipeline), "")
        return RootView(
            self.root,
            self.pipeline or named or pipeline_name(self.root),
            time.time_ns() // 1_000_000,
            records,
            retained,
            runs,
            tuple(sorted(live, key=lambda r: r.run_id)),
            bool(beats),
        )

    def _run(self, run_id: str) -> RunView | None:
        """Run *run_id*'s files (None: no status yet, or unreadable now, as
        :meth:`Runs.statuses` skips it); those of a run that ended, from the first read."""
        known = self._ended.get(run_id)
        if known is not None:
            return known
        files = RunFiles(self.root, run_id)
        try:
            status = files.status()
        except StoreError:
            return None
        if status is None:
            return None
        recorded = files.config() or {}
        checkpoint = recorded.get("checkpoint")
        view = RunView(
            status,
            files.restore_point(),
            checkpoint if isinstance(checkpoint, dict) else None,
            str(recorded.get("pipeline") or ""),
        )
        if status.ended:
            self._ended[run_id] = view
        return view

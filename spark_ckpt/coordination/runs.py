"""A *run* of a pipeline: one attempt of :meth:`Pipeline.run
<spark_ckpt.pipeline.pipeline.Pipeline.run>`,
i.e. one Spark query with its source runner, its foreachBatch function and its coordinator.

Every attempt is a new run with a fresh id, and every run starts from the latest completed
checkpoint — in *every* process that holds a piece of the job: the coordinator (source
runner) decides the restore point, the foreachBatch function restores operator and channel
state from exactly that checkpoint, the sink is recovered to it. The run's files under
``<root>/_runs/<run id>/`` carry that agreement between Spark's processes:

==================  ==============================  ==========================================
file                written by                      read by
==================  ==============================  ==========================================
``topology.json``   the driver, before the query    the run's coordinator (who acks, the sink)
``restore.json``    the coordinator, at its start   the run's foreachBatch function
                    (``initialOffset``)             (:class:`RestorePoint`)
``lease.json``      the coordinator, after taking   drivers deciding whether another driver
                    its lease                       took the pipeline over (:class:`RunLease`)
``aborted.json``    the coordinator                 the run's tasks (abort notifications)
``committed.json``  the coordinator, after each     the run's subtasks on the executors
                    completion's sink commit        (completion notifications)
``status.json``     the driver                      the CLI and notebooks (:class:`RunStatus`)
``config.json``     the coordinator, at its start   the checkpoint page (the pipeline's name,
                                                    the run's checkpoint configuration)
``fatal.json``      the coordinator                 the driver: a failure no restart can mend
                                                    (fenced, no restorable checkpoint)
==================  ==============================  ==========================================

Every file is JSON, written to a temporary name and renamed into place. Nothing here imports
pyspark or deltalake.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pyarrow.fs as pafs

from spark_ckpt.coordination.root_files import RUNS_DIR, remove_dir
from spark_ckpt.errors import ProtocolError, StoreError
from spark_ckpt.locations.objects import read_json, write_whole
from spark_ckpt.locations.uris import filesystem

RESTORE_FILE = "restore.json"
LEASE_FILE = "lease.json"
ABORTED_FILE = "aborted.json"
COMMITTED_FILE = "committed.json"
STATUS_FILE = "status.json"
CONFIG_FILE = "config.json"
FATAL_FILE = "fatal.json"
#: How many aborted checkpoint ids ``aborted.json`` keeps (the newest).
ABORTED_KEPT = 64
#: How many ended runs a root keeps the files of (the newest), for the CLI and inspection.
ENDED_RUNS_KEPT = 20
_ENDED = frozenset({"stopped", "finished", "failed", "fenced"})


def new_run_id() -> str:
    return uuid.uuid4().hex


class RunState(StrEnum):
    """Lifecycle of a run, as its driver reports it."""

    RUNNING = "running"
    STOPPING = "stopping"  # a final checkpoint was taken; the query is being stopped
    STOPPED = "stopped"  # stopped on request (duration, Ctrl-C, CLI, stop())
    FINISHED = "finished"  # the query ended by itself (Trigger.AvailableNow)
    FAILED = "failed"  # the query failed (the next attempt is another run)
    FENCED = "fenced"  # another driver took the pipeline over


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A completed checkpoint a restore passed over because its data is damaged."""

    checkpoint_id: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint_id": self.checkpoint_id, "reason": self.reason}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SkippedCheckpoint:
        return SkippedCheckpoint(int(d["checkpoint_id"]), str(d["reason"]))


@dataclass(frozen=True)
class RestorePoint:
    """The checkpoint a run restores from (None: a fresh start), the newer checkpoints it
    skipped as damaged, and when the run's coordinator chose it (*at_ms*, epoch ms; None in
    the files of older versions)."""

    checkpoint_id: int | None
    skipped: tuple[SkippedCheckpoint, ...] = ()
    at_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "skipped": [s.to_dict() for s in self.skipped],
        } | ({} if self.at_ms is None else {"at_ms": self.at_ms})

    @staticmethod
    def from_dict(d: dict[str, Any]) -> RestorePoint:
        cid = d.get("checkpoint_id")
        at = d.get("at_ms")
        return RestorePoint(
            None if cid is None else int(cid),
            tuple(SkippedCheckpoint.from_dict(s) for s in d.get("skipped", [])),
            None if at is None else int(at),
        )


@dataclass(frozen=True)
class RunLease:
    """The coordinator lease epoch a run's coordinator holds."""

    run_id: str
    epoch: int

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "epoch": self.epoch}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> RunLease:
        return RunLease(str(d["run_id"]), int(d["epoch"]))


@dataclass(frozen=True)
class RunStatus:
    """What a driver reports about one of its runs."""

    run_id: str
    driver_id: str
    state: RunState
    attempt: int
    updated_ms: int
    restored_from: int | None = None
    #: For STOPPED: the request that stopped it (CLI ``stop``), if any.
    stop_request: str | None = None
    error: str | None = None

    @property
    def ended(self) -> bool:
        """Whether the run is over (stopped, finished, failed or fenced)."""
        return self.state.value in _ENDED

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "driver_id": self.driver_id,
            "state": self.state.value,
            "attempt": self.attempt,
            "updated_ms": self.updated_ms,
            "restored_from": self.restored_from,
            "stop_request": self.stop_request,
            "error": self.error,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> RunStatus:
        restored = d.get("restored_from")
        return RunStatus(
            str(d["run_id"]),
            str(d["driver_id"]),
            RunState(d["state"]),
            int(d["attempt"]),
            int(d["updated_ms"]),
            None if restored is None else int(restored),
            d.get("stop_request"),
            d.get("error"),
        )


class RunFiles:
    """The files of run *run_id* under the pipeline root *root* (see the module docstring).
    Safe from any process; readers never see half a file."""

    def __init__(self, root: str, run_id: str) -> None:
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise ProtocolError(f"invalid run id {run_id!r}")
        self.root = root
        self.run_id = run_id
        self._fs, base = filesystem(root)
        self._dir = f"{base.rstrip('/')}/{RUNS_DIR}/{run_id}"

    def _write(self, name: str, payload: dict[str, Any]) -> None:
        write_whole(self._fs, f"{self._dir}/{name}", json.dumps(payload).encode())

    def _read(self, name: str) -> dict[str, Any] | None:
        path = f"{self._dir}/{name}"
        try:
            data = read_json(self._fs, path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise StoreError(f"cannot read {path}: {e}") from e
        if not isinstance(data, dict):
            raise StoreError(f"cannot read {path}: not a JSON object")
        return data

    # -- restore point ------------------------------------------------------------------------
    def write_restore_point(self, point: RestorePoint) -> None:
        self._write(RESTORE_FILE, point.to_dict())

    def restore_point(self) -> RestorePoint | None:
        d = self._read(RESTORE_FILE)
        try:
            return None if d is None else RestorePoint.from_dict(d)
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"malformed restore point of run {self.run_id}: {e!r}") from e

    # -- lease --------------------------------------------------------------------------------
    def write_lease(self, epoch: int) -> None:
        self._write(LEASE_FILE, RunLease(self.run_id, epoch).to_dict())

    # -- aborts -------------------------------------------------------------------------------
    def write_aborted(self, checkpoint_ids: Sequence[int]) -> None:
        self._write(ABORTED_FILE, {"aborted": sorted(checkpoint_ids)[-ABORTED_KEPT:]})

    def aborted(self) -> list[int]:
        d = self._read(ABORTED_FILE)
        return [] if d is None else [int(c) for c in d.get("aborted", [])]

    # -- completions ----------------------------------------------------------------------------
    def write_committed(self, checkpoint_id: int) -> None:
        """Checkpoint *checkpoint_id* completed and the sink committed its output."""
        self._write(COMMITTED_FILE, {"checkpoint_id": checkpoint_id})

    def committed(self) -> int | None:
        """The newest checkpoint of this run whose output the sink committed, as its
        coordinator recorded it; None before the first one."""
        d = self._read(COMMITTED_FILE)
        try:
            return None if d is None else int(d["checkpoint_id"])
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"malformed completion record of run {self.run_id}: {e!r}") from e

    # -- fatal failures -------------------------------------------------------------------------
    def write_fatal(self, reason: str) -> None:
        """Record that the run failed in a way another attempt cannot mend."""
        self._write(FATAL_FILE, {"reason": reason})

    def fatal(self) -> str | None:
        d = self._read(FATAL_FILE)
        return None if d is None else str(d.get("reason"))

    # -- configuration --------------------------------------------------------------------------
    def write_config(self, pipeline: str, checkpoint: dict[str, Any]) -> None:
        """The run's pipeline name and checkpoint configuration (``CheckpointConfig.to_dict``)."""
        self._write(CONFIG_FILE, {"pipeline": pipeline, "checkpoint": checkpoint})

    def config(self) -> dict[str, Any] | None:
        """``{"pipeline": name, "checkpoint": configuration}`` as the run's coordinator wrote
        them; None for a run of an older version or one whose coordinator did not start."""
        return self._read(CONFIG_FILE)

    # -- status -------------------------------------------------------------------------------
    def write_status(self, status: RunStatus) -> None:
        self._write(STATUS_FILE, status.to_dict())

    def status(self) -> RunStatus | None:
        d = self._read(STATUS_FILE)
        try:
            return None if d is None else RunStatus.from_dict(d)
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"malformed status of run {self.run_id}: {e!r}") from e

    def remove(self) -> None:
        """Delete the run's files (idempotent)."""
        remove_dir(self._fs, self._dir)


class Runs:
    """Every run of the pipeline root *root*."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._fs, base = filesystem(root)
        self._runs = f"{base.rstrip('/')}/{RUNS_DIR}"

    def ids(self) -> list[str]:
        try:
            infos = self._fs.get_file_info(pafs.FileSelector(self._runs, allow_not_found=True))
        except OSError as e:
            raise StoreError(f"cannot list {self._runs}: {e}") from e
        return sorted(i.base_name for i in infos if i.type is pafs.FileType.Directory)

    def newest_lease(self) -> RunLease | None:
        """The lease of the highest epoch any run of the root recorded."""
        best: RunLease | None = None
        for run_id in self.ids():
            d = RunFiles(self.root, run_id)._read(LEASE_FILE)
            if d is None:
                continue
            try:
                lease = RunLease.from_dict(d)
            except (KeyError, TypeError, ValueError):
                continue
            if best is None or lease.epoch > best.epoch:
                best = lease
        return best

    def statuses(self) -> list[RunStatus]:
        """The status of every run of the root that has one, oldest update first."""
        out = []
        for run_id in self.ids():
            try:
                status = RunFiles(self.root, run_id).status()
            except StoreError:
                continue
            if status is not None:
                out.append(status)
        return sorted(out, key=lambda s: s.updated_ms)

    def prune(
        self, keep: int = ENDED_RUNS_KEPT, *, on_ended: Callable[[str], None] | None = None
    ) -> list[str]:
        """Delete the files of ended runs (stopped, finished, failed, fenced) but the newest
        *keep*, and call *on_ended* with the id of every ended run (the pipeline removes
        their changelogs: a new run restores from checkpoints, never from a changelog); runs
        without a status or still running are never touched. Returns the ids removed."""
        ended = [s for s in self.statuses() if s.ended]
        doomed = [s.run_id for s in ended[: max(0, len(ended) - keep)]]
        for run_id in doomed:
            RunFiles(self.root, run_id).remove()
        if on_ended is not None:
            for status in ended:
                on_ended(status.run_id)
        return doomed

"""Who would answer a request: liveness records under ``_mailbox/_alive/``.

A record per running coordinator, rewritten every :data:`HEARTBEAT_INTERVAL_S` by a thread of
its own (:class:`HeartbeatThread`, started with the coordinator's polling, removed when it
stops), and a record per starting run, written by its driver before the query starts (the
coordinator's record of that run replaces it). A record is live while fresh (its writer says
for how long) and, on the reader's own host, while its writer's process exists: a run that
was killed is not live, at once on its host, elsewhere once its record went stale (clocks of
the hosts are assumed to agree within seconds). A client posts a request only while a record
is live (:meth:`PipelineClient.request
<spark_ckpt.client.pipeline_client.PipelineClient.request>`)."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pyarrow.fs as pafs

from spark_ckpt.coordination.live_report import LiveReport
from spark_ckpt.coordination.mailbox import MAILBOX_DIR
from spark_ckpt.errors import ProtocolError, StoreError
from spark_ckpt.locations.objects import read_json, write_whole
from spark_ckpt.locations.uris import filesystem

log = logging.getLogger(__name__)

#: Liveness records (under the mailbox directory): ``_alive/<holder>.json``.
ALIVE_DIR = "_alive"
#: How often a running coordinator rewrites its liveness record.
HEARTBEAT_INTERVAL_S = 1.0
#: How long a coordinator's record stays live without a newer one (a slow file system, a
#: paused process, clock differences between hosts).
HEARTBEAT_VALID_MS = 30_000
#: How long a starting run's record stays live: from before its query starts until its
#: coordinator's first heartbeat replaces it.
STARTING_VALID_MS = 120_000


class HeartbeatRole(StrEnum):
    STARTING = "starting"  # a run's driver, before its query (and coordinator) started
    COORDINATOR = "coordinator"  # a coordinator polling the mailbox


@dataclass(frozen=True)
class Heartbeat:
    """A liveness record: *holder* (a run id, or a coordinator's own id) was alive at
    *beat_ms* (wall clock, epoch ms) in process *pid* on *host*, and says so for *valid_ms*.
    A coordinator's record also carries its :class:`LiveReport` (None: none yet, or a
    starting run's record)."""

    holder: str
    role: HeartbeatRole
    host: str
    pid: int
    beat_ms: int
    valid_ms: int
    report: LiveReport | None = None

    def alive(self, now_ms: int) -> bool:
        """Fresh at *now_ms*, and — when written on this host — its process still exists."""
        if now_ms > self.beat_ms + self.valid_ms:
            return False
        return self.host != socket.gethostname() or process_exists(self.pid)

    def to_dict(self) -> dict[str, Any]:
        return {
            "holder": self.holder,
            "role": self.role.value,
            "host": self.host,
            "pid": self.pid,
            "beat_ms": self.beat_ms,
            "valid_ms": self.valid_ms,
        } | ({} if self.report is None else {"report": self.report.to_dict()})

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Heartbeat:
        report = d.get("report")
        return Heartbeat(
            str(d["holder"]),
            HeartbeatRole(d["role"]),
            str(d["host"]),
            int(d["pid"]),
            int(d["beat_ms"]),
            int(d["valid_ms"]),
            None if report is None else LiveReport.from_dict(report),
        )


def process_exists(pid: int) -> bool:
    """Whether process *pid* of this host exists and is no zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True  # no /proc (not Linux): os.kill said it exists


class Heartbeats:
    """The liveness records of the pipeline root *root* ."""

    def __init__(self, root: str) -> None:
        self._fs, base = filesystem(root)
        self._dir = f"{base.rstrip('/')}/{MAILBOX_DIR}/{ALIVE_DIR}"

    def _path(self, holder: str) -> str:
        if not holder or "/" in holder or holder.startswith("."):
            raise ProtocolError(f"invalid heartbeat holder {holder!r}")
        return f"{self._dir}/{holder}.json"

    def beat(
        self, holder: str, role: HeartbeatRole, valid_ms: int, report: LiveReport | None = None
    ) -> Heartbeat:
        """Record that *holder* is alive now, in this process (with *report*); returns the
        record."""
        now = time.time_ns() // 1_000_000
        record = Heartbeat(holder, role, socket.gethostname(), os.getpid(), now, valid_ms, report)
        write_whole(self._fs, self._path(holder), json.dumps(record.to_dict()).encode())
        return record

    def remove(self, holder: str) -> None:
        """Delete *holder*'s record (idempotent)."""
        try:
            self._fs.delete_file(self._path(holder))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StoreError(f"cannot delete the heartbeat of {holder}: {e}") from e

    def records(self) -> list[Heartbeat]:
        """Every well-formed record present (a malformed or vanishing one is skipped)."""
        try:
            infos = self._fs.get_file_info(pafs.FileSelector(self._dir, allow_not_found=True))
        except FileNotFoundError:
            infos = []  # an entry vanished while listed: no record is lost by reading none
        except OSError as e:
            raise StoreError(f"cannot list {self._dir}: {e}") from e
        out: list[Heartbeat] = []
        for info in infos:
            if info.type is not pafs.FileType.File or not info.base_name.endswith(".json"):
                continue
            try:
                out.append(
                    Heartbeat.from_dict(read_json(self._fs, f"{self._dir}/{info.base_name}"))
                )
            except FileNotFoundError:
                continue  # removed meanwhile
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("skipping unreadable heartbeat %s: %s", info.base_name, e)
        return out

    def live(self, now_ms: int | None = None) -> list[Heartbeat]:
        """The records live at *now_ms* (default now; see :meth:`Heartbeat.alive`)."""
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        return [r for r in self.records() if r.alive(now)]


def mark_starting(root: str, run_id: str) -> None:
    """A run's driver, before its query starts: the run is live (starting) until its
    coordinator's heartbeat replaces this record, for :data:`STARTING_VALID_MS` at most."""
    Heartbeats(root).beat(run_id, HeartbeatRole.STARTING, STARTING_VALID_MS)


class HeartbeatThread:
    """Rewrites *holder*'s coordinator record under *root* every *interval_s* on a daemon
    thread of its own (never behind the coordinator's work), while *alive* returns true;
    removes the record when it ends (:meth:`stop`, or *alive* turned false). Each record
    carries what *report* returns then (called on this thread: it must not wait for the
    coordinator's work). A failed write is logged and retried at the next beat."""

    def __init__(
        self,
        root: str,
        holder: str,
        *,
        alive: Callable[[], bool] = lambda: True,
        report: Callable[[], LiveReport | None] = lambda: None,
        interval_s: float = HEARTBEAT_INTERVAL_S,
        valid_ms: int = HEARTBEAT_VALID_MS,
    ) -> None:
        self.heartbeats = Heartbeats(root)
        self.holder = holder
        self._alive = alive
        self._report = report
        self._interval_s = interval_s
        self._valid_ms = valid_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start beating (idempotent); the first beat is written before this returns."""
        if self._thread is not None:
            return
        self._beat()
        self._thread = threading.Thread(target=self._run, name="spark-ckpt-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        try:
            self.heartbeats.beat(
                self.holder, HeartbeatRole.COORDINATOR, self._valid_ms, self._report()
            )
        except (StoreError, ProtocolError) as e:
            log.warning("heartbeat of %s not written: %s", self.holder, e)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s) and self._alive():
            self._beat()
        self._remove()

    def _remove(self) -> None:
        try:
            self.heartbeats.remove(self.holder)
        except StoreError as e:
            log.warning("heartbeat of %s not removed: %s", self.holder, e)

    def stop(self) -> None:
        """Stop beating and remove the record (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._remove()

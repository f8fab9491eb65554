"""Messages between Spark's separate processes, through the pipeline's store root.

In Spark the coordinator lives in the source runner (a long-lived driver-side process), while
the tasks that acknowledge checkpoints run elsewhere: the foreachBatch aligner in the user's
driver process, the ``ckpt-sink`` committer in a fresh process per micro-batch; savepoint and
stop requests come from notebooks and the CLI. They talk through files under the pipeline
root, which works the same on a laptop and on a cluster's shared storage:

* ``_mailbox/`` — a queue of JSON messages to the coordinator (:class:`Mailbox`): acks,
  declines, checkpoint/savepoint/stop/pause/resume requests. A message is written to a
  temporary name and renamed into place, so readers never see half a message. Names sort
  by posting time. Delivery is at-least-once: the coordinator deletes a message after
  acting on it, and acting twice is harmless (a duplicate ack is answered ``DUPLICATE``, a
  request carries an id).
  A run of a pipeline (one attempt of :meth:`Pipeline.run <spark_ckpt.spark.pipeline.Pipeline.run>`)
  has a box of its own, ``_mailbox/<run id>/``, for its tasks' acks and declines, so that a
  second driver on the same root never consumes them. Requests from clients go to the shared
  box; every request carries an expiry (a client that gave up waiting does not leave a
  ``stop`` for a later run), and a malformed file is moved to ``_mailbox/_rejected/`` with a
  warning instead of failing every poll.
* ``_topology.json`` — who acknowledges checkpoints (:class:`Topology`): the consumer vertex
  and its parallelism, and the sink whose transactions the coordinator commits. The consumer
  overwrites it when it starts; the coordinator re-reads it on every poll. A run's topology is
  ``_runs/<run id>/topology.json``, written before its query starts and read by that run's
  coordinator only.

* ``_mailbox/_alive/`` — who would answer a request (:class:`Heartbeats`): a record per
  running coordinator, rewritten every :data:`HEARTBEAT_INTERVAL_S` by a thread of its own
  (:class:`HeartbeatThread`, started with the coordinator's polling, removed when it stops),
  and a record per starting run, written by its driver before the query starts (the
  coordinator's record of that run replaces it). A record is live while fresh (its writer
  says for how long) and, on the reader's own host, while its writer's process exists: a run
  that was killed is not live, at once on its host, elsewhere once its record went stale
  (clocks of the hosts are assumed to agree within seconds). A client posts a request only
  while a record is live (:meth:`PipelineClient.request
  <spark_ckpt.spark.client.PipelineClient.request>`): a request to a root where nothing runs
  fails at once instead of waiting for its timeout, and leaves nothing behind.

Completion is not messaged back: tasks read completed checkpoints from the checkpoint store.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import pyarrow.fs as pafs

from spark_ckpt.errors import ProtocolError, StoreError
from spark_ckpt.protocol.handle import AcknowledgeCheckpoint, DeclineCheckpoint

log = logging.getLogger(__name__)

MAILBOX_DIR = "_mailbox"
#: Where malformed mailbox files are set aside (under the mailbox directory).
REJECTED_DIR = "_rejected"
TOPOLOGY_FILE = "_topology.json"
#: Per-run files of a pipeline root: ``_runs/<run id>/...``.
RUNS_DIR = "_runs"
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


class RequestKind(StrEnum):
    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"
    STOP = "stop"  # take a final checkpoint (or savepoint), then let the job stop
    PAUSE = "pause"  # no periodic checkpoints until resumed (see spark_ckpt.spark.schedule)
    RESUME = "resume"  # periodic checkpoints again


@dataclass(frozen=True)
class Request:
    """Client → coordinator: take a checkpoint or savepoint now, prepare to stop, or pause or
    resume the periodic checkpoints."""

    request_id: str
    kind: RequestKind
    target: str | None = None  # savepoint directory
    savepoint: bool = False  # for STOP: stop with a savepoint instead of a checkpoint
    #: Wall-clock time (epoch ms) after which the request must not be acted on: the client
    #: stopped waiting for it. None: never expires.
    expires_ms: int | None = None
    #: For STOP: read every channel up to where it was when the request arrived before the
    #: final checkpoint (Flink's ``stop --drain``).
    drain: bool = False

    def expired(self, now_ms: int) -> bool:
        return self.expires_ms is not None and now_ms > self.expires_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "request",
            "request_id": self.request_id,
            "kind": self.kind.value,
            "target": self.target,
            "savepoint": self.savepoint,
            "expires_ms": self.expires_ms,
            "drain": self.drain,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Request:
        expires = d.get("expires_ms")
        return Request(
            str(d["request_id"]),
            RequestKind(d["kind"]),
            d.get("target"),
            bool(d.get("savepoint", False)),
            None if expires is None else int(expires),
            bool(d.get("drain", False)),
        )


Message = AcknowledgeCheckpoint | DeclineCheckpoint | Request


def decode_message(d: dict[str, Any]) -> Message:
    try:
        kind = d["type"]
        if kind == "ack":
            return AcknowledgeCheckpoint.from_dict(d)
        if kind == "decline":
            return DeclineCheckpoint.from_dict(d)
        if kind == "request":
            return Request.from_dict(d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ProtocolError(f"malformed message: {e!r}") from e
    raise ProtocolError(f"unknown message type {kind!r}")


@dataclass(frozen=True)
class SinkSpec:
    """Where the consumer's transactional output goes (committed by the coordinator)."""

    kind: str  # "delta"
    path: str
    sink_uid: str
    options: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.path,
            "sink_uid": self.sink_uid,
            "options": self.options,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SinkSpec:
        return SinkSpec(
            str(d["kind"]), str(d["path"]), str(d["sink_uid"]), dict(d.get("options", {}))
        )


@dataclass(frozen=True)
class Topology:
    """The tasks that acknowledge checkpoints: subtasks ``0..parallelism-1`` of ``vertex``.
    ``sink`` is committed by the coordinator when a checkpoint completes."""

    vertex: str
    parallelism: int
    sink: SinkSpec | None = None
    run_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "vertex": self.vertex,
            "parallelism": self.parallelism,
            "sink": self.sink.to_dict() if self.sink else None,
            "run_id": self.run_id,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Topology:
        try:
            sink = d.get("sink")
            return Topology(
                str(d["vertex"]),
                int(d["parallelism"]),
                SinkSpec.from_dict(sink) if sink else None,
                str(d.get("run_id", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"malformed topology: {e}") from e


def _filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    try:
        if "://" in uri:
            fs, path = pafs.FileSystem.from_uri(uri)
            return fs, str(path)
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    except (pafs.ArrowInvalid, OSError) as e:  # type: ignore[attr-defined]
        raise StoreError(f"cannot open {uri!r}: {e}") from e


def _write_atomically(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    directory = path.rsplit("/", 1)[0]
    tmp = f"{directory}/.tmp-{uuid.uuid4().hex}"
    try:
        fs.create_dir(directory, recursive=True)
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)
    except OSError as e:
        raise StoreError(f"cannot write {path}: {e}") from e


#: Listings of the mailbox retried when an entry vanishes while it is read.
_LIST_ATTEMPTS = 5


class Mailbox:
    """The coordinator's inbox under *root* (the pipeline root): the shared box, or the box
    of run *box* (``_mailbox/<box>/``)."""

    def __init__(self, root: str, box: str | None = None) -> None:
        self._fs, base = _filesystem(root)
        self._dir = f"{base.rstrip('/')}/{MAILBOX_DIR}" + (f"/{box}" if box else "")
        self._rejected = f"{base.rstrip('/')}/{MAILBOX_DIR}/{REJECTED_DIR}"

    def post(self, message: Message) -> str:
        """Post *message*; returns its name. Safe from any process."""
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex}.json"
        _write_atomically(self._fs, f"{self._dir}/{name}", json.dumps(message.to_dict()).encode())
        return name

    def receive(self) -> list[tuple[str, Message]]:
        """Every well-formed message present, oldest first. A file that is not a message
        (unparsable JSON, unknown type, missing fields) is set aside under
        ``_mailbox/_rejected/`` with a warning naming it, never returned again."""
        for attempt in range(_LIST_ATTEMPTS):
            try:
                infos = self._fs.get_file_info(pafs.FileSelector(self._dir, allow_not_found=True))
                break
            except FileNotFoundError as e:
                # a sender's temporary file was renamed into a message while the directory
                # was listed (the listing stats every entry it read): list again
                if attempt == _LIST_ATTEMPTS - 1:
                    raise StoreError(f"cannot list {self._dir}: {e}") from e
            except OSError as e:
                raise StoreError(f"cannot list {self._dir}: {e}") from e
        names = sorted(
            i.base_name
            for i in infos
            if i.base_name.endswith(".json") and i.type is pafs.FileType.File
        )
        out: list[tuple[str, Message]] = []
        for name in names:
            try:
                with self._fs.open_input_stream(f"{self._dir}/{name}") as f:
                    raw = f.read()
            except FileNotFoundError:
                continue  # taken by a concurrent reader
            except OSError as e:
                raise StoreError(f"cannot read message {name}: {e}") from e
            try:
                data = json.loads(raw)
                if not isinstance(data, dict):
                    raise ProtocolError(f"not a JSON object: {type(data).__name__}")
                out.append((name, decode_message(data)))
            except (ProtocolError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError
                self._reject(name, str(e))
        return out

    def _reject(self, name: str, reason: str) -> None:
        log.warning("mailbox: set aside malformed message %s/%s: %s", self._dir, name, reason)
        try:
            self._fs.create_dir(self._rejected, recursive=True)
            self._fs.move(f"{self._dir}/{name}", f"{self._rejected}/{name}")
        except FileNotFoundError:
            pass  # taken by a concurrent reader
        except OSError as e:
            raise StoreError(f"cannot set aside malformed message {name}: {e}") from e

    def holds(self, name: str) -> bool:
        """Whether message *name* is still in the box: not yet taken (the coordinator deletes
        a message once it acted on it)."""
        try:
            info = self._fs.get_file_info(f"{self._dir}/{name}")
        except OSError as e:
            raise StoreError(f"cannot look for message {name}: {e}") from e
        return info.type is pafs.FileType.File

    def rejected(self) -> list[str]:
        """Names of the files set aside as malformed, oldest first."""
        infos = self._fs.get_file_info(pafs.FileSelector(self._rejected, allow_not_found=True))
        return sorted(i.base_name for i in infos)

    def delete(self, names: list[str]) -> None:
        for name in names:
            try:
                self._fs.delete_file(f"{self._dir}/{name}")
            except FileNotFoundError:
                pass
            except OSError as e:
                raise StoreError(f"cannot delete message {name}: {e}") from e

    def remove_box(self) -> None:
        """Delete this box with what it holds (a run's box once the run ended). Idempotent."""
        _remove_dir(self._fs, self._dir)


def _remove_dir(fs: pafs.FileSystem, path: str) -> None:
    """Delete the directory *path* with what it holds; a missing one is fine."""
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StoreError(f"cannot remove {path}: {e}") from e


def _topology_path(base: str, run_id: str | None) -> str:
    base = base.rstrip("/")
    return f"{base}/{RUNS_DIR}/{run_id}/topology.json" if run_id else f"{base}/{TOPOLOGY_FILE}"


def write_topology(root: str, topology: Topology, run_id: str | None = None) -> None:
    """Publish *topology*: the root's shared one, or that of run *run_id*."""
    fs, base = _filesystem(root)
    _write_atomically(fs, _topology_path(base, run_id), json.dumps(topology.to_dict()).encode())


def read_topology(root: str, run_id: str | None = None) -> Topology | None:
    """The root's shared topology, or that of run *run_id*; None when absent."""
    fs, base = _filesystem(root)
    try:
        with fs.open_input_stream(_topology_path(base, run_id)) as f:
            return Topology.from_dict(json.loads(f.read()))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise StoreError(f"cannot read the topology under {root}: {e}") from e


# -- liveness -----------------------------------------------------------------------------------


class HeartbeatRole(StrEnum):
    STARTING = "starting"  # a run's driver, before its query (and coordinator) started
    COORDINATOR = "coordinator"  # a coordinator polling the mailbox


@dataclass(frozen=True)
class Heartbeat:
    """A liveness record: *holder* (a run id, or a coordinator's own id) was alive at
    *beat_ms* (wall clock, epoch ms) in process *pid* on *host*, and says so for *valid_ms*."""

    holder: str
    role: HeartbeatRole
    host: str
    pid: int
    beat_ms: int
    valid_ms: int

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
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Heartbeat:
        return Heartbeat(
            str(d["holder"]),
            HeartbeatRole(d["role"]),
            str(d["host"]),
            int(d["pid"]),
            int(d["beat_ms"]),
            int(d["valid_ms"]),
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
    """The liveness records of the pipeline root *root* (see the module docstring)."""

    def __init__(self, root: str) -> None:
        self._fs, base = _filesystem(root)
        self._dir = f"{base.rstrip('/')}/{MAILBOX_DIR}/{ALIVE_DIR}"

    def _path(self, holder: str) -> str:
        if not holder or "/" in holder or holder.startswith("."):
            raise ProtocolError(f"invalid heartbeat holder {holder!r}")
        return f"{self._dir}/{holder}.json"

    def beat(self, holder: str, role: HeartbeatRole, valid_ms: int) -> Heartbeat:
        """Record that *holder* is alive now, in this process; returns the record."""
        record = Heartbeat(
            holder, role, socket.gethostname(), os.getpid(), time.time_ns() // 1_000_000, valid_ms
        )
        _write_atomically(self._fs, self._path(holder), json.dumps(record.to_dict()).encode())
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
                with self._fs.open_input_stream(f"{self._dir}/{info.base_name}") as f:
                    out.append(Heartbeat.from_dict(json.loads(f.read())))
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
    removes the record when it ends (:meth:`stop`, or *alive* turned false). A failed write
    is logged and retried at the next beat."""

    def __init__(
        self,
        root: str,
        holder: str,
        *,
        alive: Callable[[], bool] = lambda: True,
        interval_s: float = HEARTBEAT_INTERVAL_S,
        valid_ms: int = HEARTBEAT_VALID_MS,
    ) -> None:
        self.heartbeats = Heartbeats(root)
        self.holder = holder
        self._alive = alive
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
            self.heartbeats.beat(self.holder, HeartbeatRole.COORDINATOR, self._valid_ms)
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

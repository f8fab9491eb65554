"""Subtask hosts: one long-lived process per subtask, run and executor, that keeps the
subtask's task (operators, keyed state, incremental snapshot base, staged output) between
micro-batches, whichever Python worker of the executor Spark hands the micro-batch to.

**Why.** Spark runs a task in any idle Python worker of its executor, so without a host every
worker would keep its own copy of a subtask and catch up on the changes the others made (CPU
per micro-batch and memory per worker; figures in ``docs/architecture.md``, *State on the
executors*). Flink keeps a subtask in one slot; here its state keeps to one process, its
**host**, and the Spark task (in whichever worker) hands the micro-batch to it.

**Protocol.** The task connects to the host's Unix socket (:func:`host_address`: a private
directory of this user, named by the pipeline root, the run, the subtask and the executor),
starting the host when none listens, and sends one request: a :class:`MicroBatch` (JSON), the
run's :class:`~spark_ckpt.spark.executors.subtask_function.SubtaskFunction` (pickled, as Spark
shipped it to the worker) and the subtask's payloads (Arrow IPC bytes, as the source routed
them). The host runs the micro-batch exactly as a worker would
(:meth:`SubtaskFunction.run_batch
<spark_ckpt.spark.executors.subtask_function.SubtaskFunction.run_batch>`) and answers a
:class:`BatchDone` or a :class:`BatchFailed`; the task then records the fence in Spark's state.
A host serves one request at a time: a retried or speculative attempt waits for a zombie's to
end, and the fences decide what each may continue.

**Lifecycle.** A host is started by the first task that finds none (an exclusive lock on
``<address>.lock`` makes a second starter give way) and ends when the executor goes (it
watches the process that started its Python worker and exits at once when it is gone); when
its run is over (checked every :data:`RUN_CHECK_S`, a read of the run's status file) or after
:data:`IDLE_S` without a micro-batch, once its snapshot writes finished; or killed: the task
waiting for it fails (:class:`SubtaskHostLostError`), Spark retries it, and the retry starts a
new host, which rebuilds the state from the changelog. Snapshot writes are asynchronous where
Spark reuses its Python workers (:mod:`spark_ckpt.spark.executors.snapshot_threads`), inline
otherwise; every changelog segment names the host as its writer, so a host lost while writing
is found as a worker is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, Protocol

from spark_ckpt import errors
from spark_ckpt.coordination.heartbeats import process_exists
from spark_ckpt.errors import EnvironmentSetupError, SparkCkptError
from spark_ckpt.runtime.stage import FIRST_STAGE_VERTEX
from spark_ckpt.spark.executors import subtask_errors
from spark_ckpt.spark.executors.executor_cache import CacheKey, Fence
from spark_ckpt.spark.executors.subtask_errors import SubtaskHostError, SubtaskHostLostError
from spark_ckpt.spark.session.environment import host_environment

#: Seconds a host waits for its next micro-batch before it ends.
IDLE_S: Final = 120.0
#: Seconds a task waits for a host it started to listen.
START_TIMEOUT_S: Final = 60.0
#: Seconds between a host's checks of its executor and of its idle time.
_TICK_S: Final = 0.5
#: Seconds between a host's checks of whether its run is over.
RUN_CHECK_S: Final = 5.0
_COUNT = struct.Struct("!I")
_LENGTH = struct.Struct("!Q")


class BatchRunner(Protocol):
    """What a host runs a micro-batch with (picklable: the task sends it along):
    :class:`~spark_ckpt.spark.executors.subtask_function.SubtaskFunction`."""

    def run_batch(self, batch: MicroBatch, payloads: list[bytes]) -> BatchDone: ...

    def run_ended(self) -> bool:
        """Whether the run whose micro-batches it runs is over (its driver said so)."""
        ...

    def close(self) -> None:
        """The host ends in order (its run is over, or it was idle): release what
        :meth:`run_batch` kept. Not called when the host is killed or its executor stops."""
        ...


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of one subtask as its Spark task hands it on: the attempt (*batch_id*,
    *token*), the executor it runs on, and the fence Spark kept for the subtask (None: the
    run's first micro-batch)."""

    subtask: int
    batch_id: int
    token: str
    executor: str
    fence: Fence | None

    def to_json(self) -> bytes:
        fence = None if self.fence is None else list(self.fence.to_row())
        return json.dumps(
            {
                "subtask": self.subtask,
                "batch_id": self.batch_id,
                "token": self.token,
                "executor": self.executor,
                "fence": fence,
            }
        ).encode()

    @staticmethod
    def from_json(data: bytes) -> MicroBatch:
        d = json.loads(data)
        return MicroBatch(
            int(d["subtask"]),
            int(d["batch_id"]),
            str(d["token"]),
            str(d["executor"]),
            Fence.from_row(d["fence"]),
        )


@dataclass(frozen=True)
class BatchDone:
    """A micro-batch that ended well: the fence to keep in Spark's state, and its report
    (rows processed, where the state was found, how long finding it took); a stage with a
    next one: what it *forwarded*, one payload per subtask of the next stage (sent as parts
    of their own after the JSON, :meth:`parts`)."""

    fence: Fence
    rows: int
    outcome: str
    load_ms: float
    forwarded: tuple[tuple[int, bytes], ...] = ()

    def parts(self) -> list[bytes]:
        """The answer's parts: the JSON, then each forwarded payload."""
        return [self.to_json(), *(p for _, p in self.forwarded)]

    @staticmethod
    def from_parts(parts: Sequence[bytes]) -> BatchDone:
        """Inverse of :meth:`parts`."""
        done = BatchDone.from_json(parts[0])
        subtasks = json.loads(parts[0]).get("forwarded", [])
        if len(subtasks) != len(parts) - 1:
            raise errors.ProtocolError("a subtask host answered with payloads missing")
        return BatchDone(
            done.fence,
            done.rows,
            done.outcome,
            done.load_ms,
            tuple(zip((int(s) for s in subtasks), parts[1:], strict=True)),
        )

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "fence": list(self.fence.to_row()),
                "rows": self.rows,
                "outcome": self.outcome,
                "load_ms": self.load_ms,
                "forwarded": [s for s, _ in self.forwarded],
            }
        ).encode()

    @staticmethod
    def from_json(data: bytes) -> BatchDone:
        d = json.loads(data)
        fence = Fence.from_row(d["fence"])
        if fence is None:
            raise errors.ProtocolError("a subtask host answered without a fence")
        return BatchDone(fence, int(d["rows"]), str(d["outcome"]), float(d["load_ms"]))


@dataclass(frozen=True)
class BatchFailed:
    """A micro-batch the host failed: the error's type name and message (with the host's
    traceback)."""

    error: str
    message: str

    def to_json(self) -> bytes:
        return json.dumps({"error": self.error, "message": self.message}).encode()

    @staticmethod
    def from_json(data: bytes) -> BatchFailed:
        d = json.loads(data)
        return BatchFailed(str(d["error"]), str(d["message"]))

    def exception(self) -> SparkCkptError:
        """The error to raise in the task: the same spark-ckpt error type where one exists
        (a lost state, a state that does not fit), else :class:`SubtaskHostError`."""
        cls = getattr(subtask_errors, self.error, None) or getattr(errors, self.error, None)
        if isinstance(cls, type) and issubclass(cls, SparkCkptError):
            with contextlib.suppress(TypeError):
                return cls(self.message)
        return SubtaskHostError(f"{self.error}: {self.message}")


#: The longest path of a Unix socket (``sun_path`` holds 108 bytes with its terminator).
_SOCKET_PATH_MAX = 107
#: Hex digits of a host socket's name (:func:`host_address`), and the length of that name
#: with its folder.
_NAME_DIGITS = 24
_SOCKET_NAME = len("/hosts/") + _NAME_DIGITS + len(".sock")


def host_directory() -> Path:
    """This user's directory of host sockets, under the temporary directory, or under
    ``/tmp`` when the temporary directory's path is too long for a socket path: private
    (mode 0700; made so when this user owns it); refused when another user owns it (whoever
    can connect to a host can make it run code)."""
    path = Path(tempfile.gettempdir()) / f"spark-ckpt-{os.getuid()}"
    if len(os.fsencode(path)) + _SOCKET_NAME > _SOCKET_PATH_MAX:
        path = Path("/tmp") / f"spark-ckpt-{os.getuid()}"
    for directory in (path, path / "hosts"):
        directory.mkdir(exist_ok=True, mode=0o700)
        st = directory.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(directory, 0o700)  # ours, made by an older version: private now
            st = directory.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise EnvironmentSetupError(
                f"{directory} must be a directory of user {os.getuid()} that no one else may "
                f"enter (owner {st.st_uid}, mode {oct(st.st_mode & 0o777)}): the subtask hosts' "
                "sockets are kept there"
            )
    return path / "hosts"


def host_address(key: CacheKey, executor: str) -> Path:
    """The socket of the host of *key*'s subtask on *executor*."""
    name = f"{key.root}\0{key.run_id}\0{key.subtask}\0{executor}"
    if key.vertex != FIRST_STAGE_VERTEX:
        name += f"\0{key.vertex}"
    return host_directory() / f"{hashlib.sha256(name.encode()).hexdigest()[:_NAME_DIGITS]}.sock"


def _send(sock: socket.socket, parts: Sequence[bytes]) -> None:
    chunks: list[bytes] = [_COUNT.pack(len(parts))]
    for part in parts:
        chunks.append(_LENGTH.pack(len(part)))
        chunks.append(part)
    sock.sendall(b"".join(chunks))


def _read_exactly(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if data is None or len(data) != n:
        raise EOFError(f"the connection ended after {0 if data is None else len(data)}/{n} bytes")
    return data


def _receive(sock: socket.socket) -> list[bytes]:
    with sock.makefile("rb") as stream:
        (count,) = _COUNT.unpack(_read_exactly(stream, _COUNT.size))
        parts = []
        for _ in range(count):
            (length,) = _LENGTH.unpack(_read_exactly(stream, _LENGTH.size))
            parts.append(_read_exactly(stream, length))
        return parts


class SubtaskHosts:
    """The task's side (a Python worker): hands a micro-batch to its subtask's host,
    starting the host when none listens."""

    def __init__(
        self,
        idle_s: float = IDLE_S,
        watch_pid: int | None = None,
        run_check_s: float = RUN_CHECK_S,
    ) -> None:
        self._idle_s = idle_s
        self._watch_pid = watch_pid
        self._run_check_s = run_check_s
        self._started: list[subprocess.Popen[bytes]] = []

    def run(
        self, key: CacheKey, runner: BatchRunner, batch: MicroBatch, payloads: Sequence[bytes]
    ) -> BatchDone:
        """Run *batch* in the host of *key*'s subtask on its executor; raises the host's
        error, or :class:`SubtaskHostLostError` when the host ended before it answered."""
        from pyspark import cloudpickle

        address = host_address(key, batch.executor)
        with self._connect(address) as sock:
            try:
                _send(sock, [batch.to_json(), cloudpickle.dumps(runner), *payloads])  # type: ignore[no-untyped-call]
                kind, *body = _receive(sock)
            except (OSError, EOFError, ValueError) as e:
                raise SubtaskHostLostError(
                    f"the host of subtask {key.subtask} of run {key.run_id} ended before it "
                    f"finished micro-batch {batch.batch_id} ({e}); Spark retries the task"
                ) from e
        if kind == b"done":
            return BatchDone.from_parts(body)
        raise BatchFailed.from_json(body[0]).exception()

    def _connect(self, address: Path) -> socket.socket:
        self._reap()
        sock = _try_connect(address)
        if sock is not None:
            return sock
        _sweep(address.parent)
        self._started.append(self._start(address))
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            sock = _try_connect(address)
            if sock is not None:
                return sock
            time.sleep(0.02)
        raise SubtaskHostLostError(
            f"a subtask host did not start listening at {address} within {START_TIMEOUT_S:.0f} s"
            f" (its log: {address.with_suffix('.log')})"
        )

    def _start(self, address: Path) -> subprocess.Popen[bytes]:
        env = host_environment(
            {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        )
        with open(address.with_suffix(".log"), "ab") as log:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    f"import sys; from {__name__} import main; sys.exit(main(sys.argv[1:]))",
                    str(address),
                    str(os.getppid() if self._watch_pid is None else self._watch_pid),
                    repr(self._idle_s),
                    repr(self._run_check_s),
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                close_fds=True,
            )

    def _reap(self) -> None:
        """Collect the exit status of hosts this worker started that ended (no zombies)."""
        self._started = [p for p in self._started if p.poll() is None]


def _sweep(directory: Path, older_s: float = 600.0) -> None:
    """Remove the files of hosts that ended without removing them (killed): a lock file
    older than *older_s* that nobody holds, its socket, and its log when empty."""
    now = time.time()
    for lock_path in directory.glob("*.lock"):
        try:
            if now - lock_path.stat().st_mtime < older_s:
                continue
            with open(lock_path, "a+b") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                _remove_host_files(lock_path.with_suffix(".sock"))
        except OSError:  # held (a live host), or already gone
            continue


def _remove_host_files(address: Path) -> None:
    """Remove a host's socket, lock, and log when empty."""
    for path in (address, address.with_suffix(".lock")):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    log = address.with_suffix(".log")
    with contextlib.suppress(OSError):
        if log.stat().st_size == 0:
            log.unlink()


def _try_connect(address: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(address))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


#: This Python worker's way to its subtasks' hosts (one per process).
SUBTASK_HOSTS = SubtaskHosts()


class SubtaskHost:
    """The host's side: serves the micro-batches of one subtask on one executor (see the
    module docstring), in the process :func:`main` runs."""

    def __init__(
        self, address: Path, watch_pid: int, idle_s: float, run_check_s: float = RUN_CHECK_S
    ) -> None:
        self._address = address
        self._watch_pid = watch_pid
        self._idle_s = idle_s
        self._run_check_s = run_check_s
        self._runners: dict[bytes, BatchRunner] = {}
        self._last: BatchRunner | None = None

    def serve(self) -> None:
        """Serve until idle or until the executor is gone; returns at once when another
        host holds the address."""
        from spark_ckpt.spark.executors.snapshot_threads import SNAPSHOTS

        lock = open(self._address.with_suffix(".lock"), "a+b")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another host serves this subtask
        with contextlib.suppress(FileNotFoundError):
            self._address.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self._address))
        server.listen(8)
        server.settimeout(_TICK_S)
        last = checked = time.monotonic()
        try:
            while True:
                if not process_exists(self._watch_pid):
                    self.remove_files()
                    os._exit(0)  # the executor is gone: go with it, as its workers do
                now = time.monotonic()
                if now - checked > self._run_check_s:
                    checked = now
                    if self._run_ended() and not SNAPSHOTS.writing():
                        return
                if now - last > self._idle_s and not SNAPSHOTS.writing():
                    return
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(None)
                    self._handle(conn)
                last = time.monotonic()
        finally:
            server.close()
            SNAPSHOTS.drain()
            if self._last is not None:
                try:
                    self._last.close()
                except Exception as e:  # ending anyway
                    print(f"closing the subtasks failed: {e}", file=sys.stderr, flush=True)
            self.remove_files()

    def remove_files(self) -> None:
        """Remove the socket, the lock and (when empty) the log of this host."""
        _remove_host_files(self._address)

    def _handle(self, conn: socket.socket) -> None:
        try:
            head, runner_bytes, *payloads = _receive(conn)
        except (OSError, EOFError, ValueError):
            return  # the task went away before it sent its micro-batch
        try:
            batch = MicroBatch.from_json(head)
            done = self._runner(runner_bytes).run_batch(batch, payloads)
            reply = [b"done", *done.parts()]
        except Exception as e:  # the task raises it; the host goes on
            message = f"{e}\n(in the subtask host, process {os.getpid()})\n"
            message += "".join(traceback.format_exception(e)[-6:])
            reply = [b"failed", BatchFailed(type(e).__name__, message).to_json()]
        with contextlib.suppress(OSError):
            _send(conn, reply)

    def _run_ended(self) -> bool:
        """Whether the run of the last micro-batch served is over."""
        if self._last is None:
            return False
        try:
            return self._last.run_ended()
        except Exception:  # unreadable: the idle time decides
            return False

    def _runner(self, data: bytes) -> BatchRunner:
        digest = hashlib.sha256(data).digest()
        runner = self._runners.get(digest)
        if runner is None:
            # the job's code, pickled by the Spark task that connected (this user's private
            # socket), as Spark pickled it to that task: never data read from storage
            runner = pickle.loads(data)
            self._runners = {digest: runner}  # the newest only
        self._last = runner
        return runner


def main(argv: Sequence[str]) -> int:
    """The host process: ``main([ADDRESS, WATCH_PID, IDLE_S[, RUN_CHECK_S]])``."""
    address, watch_pid, idle_s = Path(argv[0]), int(argv[1]), float(argv[2])
    run_check_s = float(argv[3]) if len(argv) > 3 else RUN_CHECK_S
    host = SubtaskHost(address, watch_pid, idle_s, run_check_s)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the driver is not for hosts

    def executor_ends(signum: int, frame: object) -> None:
        host.remove_files()
        os._exit(0)

    # pyspark's daemon ends its process group (its workers, and the hosts they started)
    # with SIGHUP when the executor stops
    signal.signal(signal.SIGHUP, executor_ends)
    host.serve()
    return 0

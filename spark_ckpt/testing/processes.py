"""The processes tests and benchmarks start: a job's, in a session of its own (which are
alive, which run under a directory, killing them all as a machine crash would; Linux only,
``/proc``), and a server's (a free port, waiting until it listens)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from spark_ckpt.errors import EnvironmentSetupError

#: How long to wait for killed processes to disappear before declaring them orphaned.
REAP_TIMEOUT_S = 60.0


def session_processes(sid: int) -> list[int]:
    """Live (non-zombie) processes of session *sid*, from ``/proc``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)"
        state, session = fields[0], int(fields[3])
        if session == sid and state not in ("Z", "X"):
            pids.append(int(entry))
    return pids


def processes_under(directory: Path) -> list[int]:
    """Live processes whose working directory is *directory* or below it — catches a
    process that left its session (the jobs and everything they spawn start there)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cwd = Path(os.readlink(f"/proc/{entry}/cwd"))
            except OSError:
                continue  # gone, or not ours to inspect
            if cwd == directory or directory in cwd.parents:
                pids.append(int(entry))
    return [p for p in pids if _state(p) not in ("Z", "X", "")]


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def kill_session(sid: int) -> None:
    """SIGKILL every process of session *sid* (the job, its JVM, the JVM's Python daemon —
    which moves to a process group of its own — and workers) until none is left. Raises
    AssertionError naming the survivors after :data:`REAP_TIMEOUT_S`."""
    deadline = time.monotonic() + REAP_TIMEOUT_S
    while pids := session_processes(sid):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of session {sid} survive SIGKILL: {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def free_port() -> int:
    """A TCP port of 127.0.0.1 free at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(
    process: subprocess.Popen[bytes], port: int, name: str, timeout_s: float
) -> None:
    """Wait until *process* (a server called *name*) accepts connections on *port* of
    127.0.0.1. Raises :class:`~spark_ckpt.errors.EnvironmentSetupError` if it exits first
    or does not listen within *timeout_s*; the caller stops it then."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise EnvironmentSetupError(f"{name} exited with status {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError as e:
            if time.monotonic() > deadline:
                raise EnvironmentSetupError(
                    f"{name} did not listen on {port} within {timeout_s} s"
                ) from e
            time.sleep(0.05)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """End a server started by a test: SIGTERM, then SIGKILL after 10 s; waits for it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

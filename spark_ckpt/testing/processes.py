"""The processes of a job that tests and benchmarks start in a session of its own: which are
alive, which run under a directory, and killing them all as a machine crash would. Linux only
(``/proc``)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

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

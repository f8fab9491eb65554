"""JVM options of the jobs that tests and benchmarks start in subprocesses: a local Spark JVM
that starts fast on a small machine, computing exactly what it computes otherwise.

* :data:`FAST_JVM_OPTIONS`: C1-only JIT and the serial collector (less compilation and
  collection work at start-up).
* A **class data sharing archive** (JDK AppCDS): the classes a job's driver JVM loads, parsed
  and verified once and mapped by every later JVM (``-XX:SharedArchiveFile``) instead of
  loaded from Spark's jars again. :func:`class_archive` builds it once per machine, JDK,
  Spark home and options, by running the demo job for a moment with
  ``-XX:ArchiveClassesAtExit`` (a file lock makes a concurrent test worker wait for it
  instead of building it again). Figures: ``docs/spark-notes.md``, section 2. A JVM
  whose class path does not match the archive's (Spark's launcher, a local cluster's
  executors) just runs without it (``-Xshare:auto``, silenced).

``JAVA_TOOL_OPTIONS`` carries them (:func:`jvm_options`), so every JVM of the job sees them.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spark_ckpt.testing.processes import kill_session, session_processes

#: C1-only JIT and the serial collector: a local JVM starts markedly faster on a small
#: machine; no effect on what a job computes.
FAST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: CDS's own messages off: a JVM that cannot use the archive says nothing about it.
_CDS_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: The longest the archive's building run may take.
_BUILD_TIMEOUT_S = 600.0


def _archive_key() -> str:
    from spark_ckpt.spark.session.environment import java_binary
    from spark_ckpt.spark.session.spark_home import pyspark_home, spark_home

    java = java_binary() or "java"
    version = subprocess.run(
        [java, "-version"], capture_output=True, text=True, check=False, timeout=60
    ).stderr
    parts = [os.path.realpath(java), version, str(pyspark_home()), str(spark_home())]
    parts += [FAST_JVM_OPTIONS, sys.executable]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _build(archive: Path, workdir: Path) -> None:
    """Run the demo job briefly with ``-XX:ArchiveClassesAtExit``; the archive is written
    when its driver JVM exits, after the job's process: wait for the whole session."""
    partial = archive.with_suffix(".partial")
    options = f"{FAST_JVM_OPTIONS} -XX:ArchiveClassesAtExit={partial} {_CDS_QUIET}"
    argv = [sys.executable, "-m", "spark_ckpt.demo", "--available-now", "--quiet"]
    argv += ["--root", str(workdir / "root"), "--output", str(workdir / "out")]
    argv += ["--backlog", "200", "--interval", "300ms"]
    popen = subprocess.Popen(
        argv,
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "JAVA_TOOL_OPTIONS": options},
    )
    deadline = time.monotonic() + _BUILD_TIMEOUT_S
    try:
        popen.wait(_BUILD_TIMEOUT_S)
        while session_processes(popen.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    except subprocess.TimeoutExpired:
        pass
    finally:
        kill_session(popen.pid)
    if popen.returncode == 0 and partial.is_file():
        os.replace(partial, archive)
    else:
        partial.unlink(missing_ok=True)


@functools.cache
def class_archive() -> Path | None:
    """The class data sharing archive of the demo job's driver JVM, built on first use (see
    the module docstring); ``None`` if it cannot be built (then jobs start without it)."""
    directory = Path(tempfile.gettempdir()) / f"spark-ckpt-cds-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    key = _archive_key()
    archive = directory / f"{key}.jsa"
    failed = directory / f"{key}.failed"
    with open(directory / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent builder finishes first
        if not archive.is_file() and not failed.exists():
            with tempfile.TemporaryDirectory(dir=directory) as workdir:
                _build(archive, Path(workdir))
            if not archive.is_file():
                failed.touch()
    return archive if archive.is_file() else None


def jvm_options() -> str:
    """``JAVA_TOOL_OPTIONS`` for a job's JVMs: :data:`FAST_JVM_OPTIONS` and the
    :func:`class_archive`, if there is one."""
    archive = class_archive()
    if archive is None:
        return FAST_JVM_OPTIONS
    return f"{FAST_JVM_OPTIONS} -XX:SharedArchiveFile={archive} {_CDS_QUIET}"

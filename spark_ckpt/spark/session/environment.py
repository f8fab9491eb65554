"""What Spark needs from the machine, checked up front with clear errors.

* ``PYSPARK_PYTHON`` (and ``PYSPARK_DRIVER_PYTHON``) default to the running interpreter, so
  Spark's Python workers import the same pyarrow and spark-ckpt as the driver. The session
  builders (:mod:`spark_ckpt.spark.session.builders`) set them when they are unset, before
  Spark starts; a user's explicit setting is left alone.
* ``TOKIO_WORKER_THREADS`` defaults to 1 in the processes spark-ckpt owns — the source
  runner (:func:`ensure_small_delta_runtime`, called when the stream reader is built there)
  and the subtask hosts (:func:`host_environment`) — and nowhere else (not in
  the user's driver). delta-rs runs every call on a tokio runtime with, by default, a worker
  thread per core; the small commits and reads of checkpointing then cost more CPU in
  thread hand-offs than with one worker (figures: ``docs/architecture.md``). A user's
  setting is left alone.
* The subtask hosts, which keep the keyed state on the executors, start with allocators that
  hand freed memory back within about a second (:func:`host_environment`), unless the user
  set them. delta-rs allocates with its own jemalloc, whose default keeps freed pages for
  10 s and returns them only while it allocates again, so the buffers of a full snapshot or
  a restore, written or read through delta-rs, would stay resident long after they were
  freed (figures: ``docs/state-backends.md``). Arrow's mimalloc purges its freed pages at
  once, too.
* Spark 4 needs Java 17 or newer: :func:`ensure_java` finds it (``JAVA_HOME`` first, then
  ``java`` on ``PATH``) and raises :class:`EnvironmentSetupError` saying what to install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping

from spark_ckpt.errors import EnvironmentSetupError

MIN_JAVA = 17


def ensure_pyspark_python() -> None:
    """Point Spark's Python workers at this interpreter unless the user chose one."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


#: The environment variable tokio reads when delta-rs builds its runtime (its worker count).
TOKIO_WORKER_THREADS = "TOKIO_WORKER_THREADS"


def ensure_small_delta_runtime() -> None:
    """One tokio worker thread for delta-rs in this process unless the user chose a count.
    Takes effect only if delta-rs has not built its runtime yet in this process (it does on
    its first call), so call it before the first Delta read or write."""
    os.environ.setdefault(TOKIO_WORKER_THREADS, "1")


#: The environment variable delta-rs's bundled jemalloc reads its options from.
DELTA_JEMALLOC_CONF = "_RJEM_MALLOC_CONF"
#: jemalloc options of a subtask host: freed dirty pages purged after 1 s (default 10 s),
#: and no lazily purged (``muzzy``) stage after that.
HOST_JEMALLOC_CONF = "dirty_decay_ms:1000,muzzy_decay_ms:0"
#: The environment variable of Arrow's mimalloc for the delay before freed pages are purged.
ARROW_MIMALLOC_PURGE_DELAY = "MIMALLOC_PURGE_DELAY"


def host_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a subtask host starts with: *env* with one tokio worker for delta-rs
    and the hosts' allocator options (see the module docstring), each only where *env* sets
    none. Takes effect in a process started with it: tokio and both allocators read their
    options once, when the library is loaded."""
    out = dict(env)
    out.setdefault(TOKIO_WORKER_THREADS, "1")
    out.setdefault(DELTA_JEMALLOC_CONF, HOST_JEMALLOC_CONF)
    out.setdefault(ARROW_MIMALLOC_PURGE_DELAY, "0")
    return out


def java_binary() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("java")


def parse_java_version(text: str) -> int | None:
    """Major version from ``java -version`` output ("1.8.0_392" → 8, "17.0.15" → 17)."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not m:
        return None
    major = int(m.group(1))
    if major == 1 and m.group(2):
        return int(m.group(2))
    return major


def java_version() -> int | None:
    binary = java_binary()
    if binary is None:
        return None
    try:
        out = subprocess.run(
            [binary, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_java_version(out.stderr + out.stdout)


def ensure_java(minimum: int = MIN_JAVA) -> int:
    """Return the Java major version, or raise :class:`EnvironmentSetupError`."""
    version = java_version()
    if version is None:
        raise EnvironmentSetupError(
            f"Spark needs Java {minimum}+ but no java was found (JAVA_HOME unset or invalid, "
            "no java on PATH). Install a JDK, e.g. `apt-get install openjdk-17-jre-headless`, "
            "or set JAVA_HOME."
        )
    if version < minimum:
        raise EnvironmentSetupError(
            f"Spark needs Java {minimum}+ but found Java {version} "
            f"({java_binary()}). Install Java {minimum}+ or point JAVA_HOME at one."
        )
    return version

"""Spark's console noise, silenced: what ``quiet=True`` (the default) of
:func:`~spark_ckpt.spark.session.builders.local_session` and
:func:`~spark_ckpt.spark.session.builders.connect_session` does. ``quiet=False`` (the demo's
``--spark-logs``) leaves Spark's console output as Spark makes it.

A quiet start happens before Spark's JVM starts in this process — a running JVM keeps the
console it started with, so the first session of a process decides — and does three things:

* **log4j 2** reads :data:`QUIET_LOG4J2` (passed as ``-Dlog4j2.configurationFile`` in
  ``spark.driver.extraJavaOptions``): Spark's default profile, minus the loggers of
  ``DataSourceManager … replaced a statically registered data source``, ``Failed to cancel job
  group``, ``Unable to load native-hadoop library``. With a profile of its own Spark prints
  neither ``Using Spark's default log4j profile`` nor ``Setting default log level``.
  ``spark.log.level`` (the sessions' *log_level*) still sets the root level.
* **SPARK_LOCAL_IP** is ``127.0.0.1`` for the JVM of a ``local`` master unless set: Spark then
  does not warn that the host name resolves to a loopback address (a local master needs no
  other address).
* **The JVM's stderr** goes through a line filter (a daemon thread of this process) that
  drops :data:`DROPPED_LINES`: lines printed outside log4j that carry nothing for a user —
  the JVM's ``Using incubator modules`` notice, and pyspark's Spark Connect foreachBatch
  worker's ``Streaming ForeachBatch worker …`` lines (one per micro-batch), which Spark copies
  from the worker's stdout. Every other line is written to this process's stderr (fd 2)
  unchanged.

Nothing is done when the JVM is given (``PYSPARK_GATEWAY_PORT``, as on Databricks) or already
runs. A remote Spark Connect server's console is its own.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

#: The log4j 2 profile of a quiet JVM.
QUIET_LOG4J2 = Path(__file__).with_name("log4j2-quiet.properties")

#: Prefixes of the JVM stderr lines a quiet start drops.
DROPPED_LINES: tuple[bytes, ...] = (
    b"Streaming ForeachBatch worker ",
    b"WARNING: Using incubator modules",
)


def java_options() -> str:
    """The driver JVM option that selects :data:`QUIET_LOG4J2`."""
    path = str(QUIET_LOG4J2)
    return (
        f'-Dlog4j2.configurationFile="{path}"'
        if " " in path
        else (f"-Dlog4j2.configurationFile={path}")
    )


def start_quiet_jvm(master: str) -> bool:
    """Start Spark's JVM for this process quietly (see the module docstring) for *master*;
    ``False`` when there is nothing to start (the JVM runs already, or is given)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return False
    conf = SparkConf(loadDefaults=False).set("spark.driver.extraJavaOptions", java_options())
    env = {"SPARK_LOCAL_IP": "127.0.0.1"} if master.startswith("local") else {}
    with environment(env, override=False):
        gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})  # type: ignore[no-untyped-call]
    stream = gateway.proc.stderr
    threading.Thread(
        target=filter_lines, args=(stream, 2), name="spark-stderr-filter", daemon=True
    ).start()
    SparkContext._ensure_initialized(gateway=gateway)
    return True


def filter_lines(stream: IO[bytes], fd: int, dropped: tuple[bytes, ...] = DROPPED_LINES) -> None:
    """Copy *stream* line by line to file descriptor *fd* until it ends, without the lines
    starting with one of *dropped*. Stops quietly when *fd* is gone."""
    for line in iter(stream.readline, b""):
        if line.startswith(dropped):
            continue
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            return


@contextmanager
def environment(values: Mapping[str, str], *, override: bool = True) -> Iterator[None]:
    """Environment variables *values* set for the duration (without *override*, only those
    unset), restored afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    for key, value in values.items():
        if override or key not in os.environ:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old

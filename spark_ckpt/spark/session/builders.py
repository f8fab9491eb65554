"""Spark sessions for pipelines: the embedded default (local Spark, UI off, small shuffles)
and Spark Connect (:func:`connect_session`: ``sc://host:port``, or ``local[N]`` for a local
Connect server started in this process, reachable from this machine only).

Both check Java first when they start Spark here (a clear
:class:`~spark_ckpt.errors.EnvironmentSetupError` instead of a Py4J stack trace) and point
Spark's Python workers at this interpreter. A local JVM they start with pip's pyspark gets
the Spark home of :mod:`spark_ckpt.spark.session.spark_home`: Spark's Python processes import the
installed, compiled pyspark rather than compiling ``pyspark.zip`` at each start. Nothing
here, nor anywhere in spark-ckpt, uses ``SparkContext``: Spark Connect has none.

*quiet* (default ``True``) silences Spark's console noise when the session starts Spark's JVM
in this process (see :mod:`spark_ckpt.spark.session.spark_logs`); ``quiet=False`` keeps Spark's own
console output (the demo's ``--spark-logs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from spark_ckpt.spark.session.environment import ensure_java, ensure_pyspark_python
from spark_ckpt.spark.session.local_connect import local_connect_url
from spark_ckpt.spark.session.spark_home import local_spark_home
from spark_ckpt.spark.session.spark_logs import environment, start_quiet_jvm

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


#: Settings of a local Spark from pip's pyspark, which has no Hadoop native library: there
#: Hadoop's local file system runs ``readlink`` in a child process of the JVM for every
#: ``FileContext`` rename, and Spark's default checkpoint file manager renames ``file:`` paths
#: through ``FileContext`` (offset and commit logs, state store deltas): a process per
#: rename, several per micro-batch (figures: ``docs/spark-notes.md``, section 2). The
#: ``FileSystem``-based manager, Spark's own where ``FileContext`` is unavailable, renames
#: with ``File.renameTo`` (atomic on a local POSIX file system; without overwrite it checks
#: the target first).
LOCAL_FILE_SETTINGS = {
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
}


def _settings(
    app_name: str, shuffle_partitions: int, log_level: str, master: str
) -> dict[str, str]:
    return {
        "spark.app.name": app_name,
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": log_level,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        **(LOCAL_FILE_SETTINGS if master.startswith("local") else {}),
    }


def local_session(
    app_name: str = "spark-ckpt",
    master: str = "local[2]",
    shuffle_partitions: int = 2,
    log_level: str = "WARN",
    *,
    quiet: bool = True,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Get or create a local (classic) SparkSession suitable for spark-ckpt pipelines and
    tests: no console progress bars (a pipeline reports its checkpoints itself), Spark's log
    at *log_level* from the start (``spark.log.level``), and — *quiet* — without Spark's
    console noise (see the module docstring). *conf*: further Spark settings (they win)."""
    ensure_pyspark_python()
    ensure_java()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master)
    settings = {**_settings(app_name, shuffle_partitions, log_level, master), **(conf or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    with environment(local_spark_home(master), override=False):  # the JVM started here
        if quiet:
            start_quiet_jvm(master)
        return builder.getOrCreate()


def connect_session(
    remote: str = "local[2]",
    app_name: str = "spark-ckpt",
    shuffle_partitions: int = 2,
    log_level: str = "WARN",
    *,
    quiet: bool = True,
) -> SparkSession:
    """A Spark Connect session (``SparkSession.builder.remote(remote)``), as on Databricks
    serverless and shared clusters. *remote* is a Connect URL (``sc://host:15002``) or
    ``local[N]``: a local Connect server (with a local Spark) is then started in this
    process (:mod:`spark_ckpt.spark.session.local_connect`: on the loopback address only, on
    a free port, with a token), with every setting of :func:`local_session` (UI and console
    progress off, *log_level*, app name — settings a Connect session cannot change) and,
    *quiet*, without Spark's console noise (see the module docstring); it stops with the
    session. A session of a remote server gets the settings a Connect session may change
    (the ``spark.sql.*`` ones); the server's own settings and console are the server's.
    Needs ``pyspark[connect]``."""
    ensure_pyspark_python()
    settings = _settings(app_name, shuffle_partitions, log_level, remote)
    session: dict[str, bool | float | int | str | None] = {
        k: v for k, v in settings.items() if k.startswith("spark.sql.")
    }
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    if not remote.startswith("local"):
        return SparkSession.builder.remote(remote).config(map=session).getOrCreate()
    ensure_java()
    with environment(local_spark_home(remote), override=False):  # the server's JVM
        if quiet:
            start_quiet_jvm(remote)
        url = local_connect_url(remote, settings)
    connect = ConnectSession.builder.remote(url).config(map=session).getOrCreate()
    return cast("SparkSession", connect)

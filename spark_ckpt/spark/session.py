"""Spark sessions for pipelines: the embedded default (local Spark, UI off, small shuffles)
and Spark Connect (:func:`connect_session`: ``sc://host:port``, or ``local[N]`` for a local
Connect server started in this process, as pyspark does).

Both check Java first when they start Spark here (a clear
:class:`~spark_ckpt.errors.EnvironmentSetupError` instead of a Py4J stack trace) and point
Spark's Python workers at this interpreter. Nothing here, nor anywhere in spark-ckpt, uses
``SparkContext``: Spark Connect has none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_ckpt.spark.environment import ensure_java, ensure_pyspark_python

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _settings(app_name: str, shuffle_partitions: int, log_level: str) -> dict[str, str]:
    return {
        "spark.app.name": app_name,
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": log_level,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }


def local_session(
    app_name: str = "spark-ckpt",
    master: str = "local[2]",
    shuffle_partitions: int = 2,
    log_level: str = "WARN",
) -> SparkSession:
    """Get or create a local (classic) SparkSession suitable for spark-ckpt pipelines and
    tests: no console progress bars (a pipeline reports its checkpoints itself), Spark's log
    at *log_level* from the start (``spark.log.level``)."""
    ensure_pyspark_python()
    ensure_java()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master)
    for key, value in _settings(app_name, shuffle_partitions, log_level).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def connect_session(
    remote: str = "local[2]",
    app_name: str = "spark-ckpt",
    shuffle_partitions: int = 2,
    log_level: str = "WARN",
) -> SparkSession:
    """A Spark Connect session (``SparkSession.builder.remote(remote)``), as on Databricks
    serverless and shared clusters. *remote* is a Connect URL (``sc://host:15002``) or
    ``local[N]``: pyspark then starts a local Connect server (with a local Spark) in this
    process, with the same settings as :func:`local_session`. Needs ``pyspark[connect]``."""
    ensure_pyspark_python()
    if remote.startswith("local"):
        ensure_java()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(remote)
    for key, value in _settings(app_name, shuffle_partitions, log_level).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()

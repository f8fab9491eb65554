"""The embedded default SparkSession: local Spark, UI off, small shuffles.

Checks Java first (clear :class:`~spark_ckpt.errors.EnvironmentSetupError` instead of a Py4J
stack trace) and points Spark's Python workers at this interpreter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_ckpt.spark.environment import ensure_java, ensure_pyspark_python

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def local_session(
    app_name: str = "spark-ckpt",
    master: str = "local[2]",
    shuffle_partitions: int = 2,
    log_level: str = "WARN",
) -> SparkSession:
    """Get or create a local SparkSession suitable for spark-ckpt pipelines and tests: no
    console progress bars (a pipeline reports its checkpoints itself), Spark's log at
    *log_level* from the start (``spark.log.level``)."""
    ensure_pyspark_python()
    ensure_java()
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", log_level)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )

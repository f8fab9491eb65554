"""spark-ckpt: Flink-style asynchronous barrier snapshots for Spark Structured Streaming.

The engine in this package is pure Python over Arrow; only :mod:`spark_ckpt.delta_store`
imports ``deltalake`` and only :mod:`spark_ckpt.session` (and ``datasources``) import
``pyspark``. Importing the package points ``PYSPARK_PYTHON`` at this interpreter when unset.
"""

from __future__ import annotations

from .environment import ensure_pyspark_python

ensure_pyspark_python()

__version__ = "0.1.0"

"""spark-ckpt: Flink-style asynchronous barrier snapshots for Spark Structured Streaming.

The engine in this package is pure Python over Arrow; only :mod:`spark_ckpt.delta_store`
imports ``deltalake`` and only :mod:`spark_ckpt.spark` imports ``pyspark``.
"""

from __future__ import annotations

__version__ = "0.1.0"

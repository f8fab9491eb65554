"""spark-ckpt: Flink-style asynchronous barrier snapshots for Spark Structured Streaming.

The engine in this package is pure Python over Arrow. Only the storage adapters import
``deltalake`` (:mod:`~spark_ckpt.delta.store`, :mod:`~spark_ckpt.delta.sink`,
:mod:`~spark_ckpt.delta.tail`) and only the Spark adapters import ``pyspark``
(:mod:`~spark_ckpt.spark.session`, :mod:`~spark_ckpt.spark.pipeline`, and the ``datasources``
package).
Importing the package points ``PYSPARK_PYTHON`` at this interpreter when unset.
"""

from __future__ import annotations

from spark_ckpt.spark.environment import ensure_pyspark_python

ensure_pyspark_python()

__version__ = "0.1.0"

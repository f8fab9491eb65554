"""spark-ckpt: Flink-style asynchronous barrier snapshots for Spark Structured Streaming.

The engine in this package is pure Python over Arrow. Only the storage adapters import
``deltalake`` (:mod:`~spark_ckpt.delta_store`, :mod:`~spark_ckpt.delta_sink`,
:mod:`~spark_ckpt.delta_tail`) and only the Spark adapters import ``pyspark``
(:mod:`~spark_ckpt.session`, :mod:`~spark_ckpt.pipeline`, and the ``datasources`` package).
Importing the package points ``PYSPARK_PYTHON`` at this interpreter when unset.
"""

from __future__ import annotations

from .environment import ensure_pyspark_python

ensure_pyspark_python()

__version__ = "0.1.0"

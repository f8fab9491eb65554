"""Spark adapters of spark-ckpt: the Python DataSources ``ckpt-source`` and ``ckpt-sink``.

Each hook is a few lines calling the engine in :mod:`spark_ckpt`. Importing this package
points ``PYSPARK_PYTHON`` at the running interpreter (via :mod:`spark_ckpt`).
"""

from __future__ import annotations

import spark_ckpt  # noqa: F401  (sets PYSPARK_PYTHON)

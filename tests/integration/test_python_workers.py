"""Spark's Python processes of a spark-ckpt session import the installed pyspark (compiled
bytecode), not ``pyspark.zip`` (:mod:`spark_ckpt.spark.session.spark_home`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_python_workers_import_the_installed_pyspark(spark: SparkSession) -> None:
    import py4j
    import pyspark.worker

    def origins(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        # a closure, so the worker unpickles it by value (this module is not importable there)
        import os
        import sys

        import pandas as pd
        import py4j
        import pyspark.worker

        zips = [p for p in sys.path if p.endswith(".zip") and os.path.exists(p)]
        for _ in frames:
            modules = [pyspark.worker.__file__, py4j.__file__]
            yield pd.DataFrame({"module": modules, "zips": [",".join(zips)] * 2})

    rows = (
        spark.range(1, numPartitions=1).mapInPandas(origins, "module string, zips string").collect()
    )
    modules = [r.module for r in rows]
    assert modules == [pyspark.worker.__file__, py4j.__file__]
    assert all(".zip" not in m for m in modules), modules
    assert {r.zips for r in rows} == {""}

"""SQL settings that hold for one streaming query only.

A streaming query copies its session's SQL configuration when it starts (Spark clones the
session for the stream, classic and Connect alike), so a setting made just before
``DataStreamWriter.start()`` and undone just after applies to that query's every
micro-batch and to nothing else the user runs in the session.

:data:`ROUTING_SETTINGS` are the settings of a pipeline whose transformed rows are routed to
the subtasks by a ``mapInArrow`` (:class:`~spark_ckpt.pipeline.transform.RouteBatches`):
that function reads a source partition's rows whole, so Arrow batches bounded by bytes buy
nothing, and Spark checks the byte bound after every row it writes to the Python worker
unless the bound is ``Int.MaxValue``. The record bound
(``spark.sql.execution.arrow.maxRecordsPerBatch``) still cuts the batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Spark's value that turns the per-row byte check of Arrow batches off.
_INT_MAX: Final = 2**31 - 1
#: See the module docstring.
ROUTING_SETTINGS: Final[Mapping[str, str]] = {
    "spark.sql.execution.arrow.maxBytesPerBatch": str(_INT_MAX),
}

#: The state store of a query of several stages (:mod:`spark_ckpt.runtime.stage`): each later
#: stage is a ``transformWithStateInPandas`` operator, which runs on RocksDB's state store
#: only. Spark's state holds only each subtask's fence, a row per subtask.
STAGES_SETTINGS: Final[Mapping[str, str]] = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
}


@contextmanager
def query_settings(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Within the block, the session's SQL *settings* are *settings*; afterwards each is
    what it was (unset if it was unset). Start the query inside the block. Runs in the
    driver (the Connect client); one configuration round trip per setting."""
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)

"""Offline access to checkpoint and savepoint state (Flink's State Processor API).

* :class:`~spark_ckpt.offline.reader.StateReader` — read the keyed, operator and source state
  of any completed checkpoint or savepoint (a pipeline root or a savepoint directory) as
  Arrow tables;
* :class:`~spark_ckpt.offline.writer.SavepointWriter` — bootstrap a savepoint from tables, or
  transform an existing checkpoint or savepoint (drop, rename, edit state, change the max
  parallelism, set source positions) into a new savepoint directory;
* :func:`~spark_ckpt.offline.savepoint_format.write_savepoint` — the one writer of the
  savepoint directory format (shared with the online export).

Pure Python on pyarrow and the Delta checkpoint store; never imports ``pyspark`` (the Spark
glue is :mod:`spark_ckpt.spark.datasource.state_frames` and the ``ckpt-state`` data source).
"""

from __future__ import annotations

from spark_ckpt.offline.chains import KeyedStateInfo
from spark_ckpt.offline.reader import StateReader
from spark_ckpt.offline.savepoint_format import FORMAT_VERSION, write_savepoint
from spark_ckpt.offline.writer import SavepointWriter

__all__ = ["FORMAT_VERSION", "KeyedStateInfo", "SavepointWriter", "StateReader", "write_savepoint"]

"""Checkpoint and savepoint state as Spark DataFrames (batch): the glue between
:class:`~spark_ckpt.offline.StateReader` and Spark.

Two ways in, the same rows:

.. code-block:: python

    from spark_ckpt.spark.datasource.state_frames import state_dataframe

    df = state_dataframe(spark, "/lake/_ckpt/orders", "counter", "count")   # key, value

    df = (spark.read.format("ckpt-state") # the batch data source (datasources.ckpt_state)
          .option("path", "/lake/_ckpt/orders")      # pipeline root or savepoint directory
          .option("uid", "counter")                  # operator uid
          .option("state", "count")                  # state name
          .option("checkpoint", "42")                # optional: default the latest completed
          .option("partitions", "4")                 # optional: default one per stored subtask
          .load())

Keyed state has the columns ``key`` and ``value`` (``value`` is an array for list state and a
map for map state); operator state has ``subtask`` and ``value`` (task-internal state its own
columns after ``subtask``). The data source reads in parallel by key-group range (each
partition reads only the chains that overlap its range) and yields Arrow record batches; the
checkpoint is pinned when the DataFrame is created, so every partition reads the same one.
:func:`state_dataframe` reads on the driver and hands the Arrow table to
``spark.createDataFrame``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from spark_ckpt.errors import ConfigError
from spark_ckpt.locations.credentials import NO_STORAGE_OPTIONS, StorageOptions
from spark_ckpt.locations.credentials import OPTION as STORAGE_OPTION
from spark_ckpt.offline.chains import state_table_schema
from spark_ckpt.offline.reader import StateReader
from spark_ckpt.spark.datasource.formats import STATE_FORMAT
from spark_ckpt.state.descriptor import StateKind
from spark_ckpt.state.keygroup import range_for_subtask

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Name of the batch data source.


@dataclass(frozen=True)
class StateSourceOptions:
    """The options of ``ckpt-state``: ``path``, ``uid``, ``state`` (required),
    ``checkpoint`` (an id; default the latest completed) and ``partitions`` (default one per
    key-group range stored)."""

    path: str
    uid: str
    state: str
    checkpoint_id: int | None = None
    partitions: int | None = None
    #: explicit storage options (``storage.secret``: ``StorageOptions.of({...}).to_json()``)
    storage: StorageOptions = NO_STORAGE_OPTIONS

    @staticmethod
    def parse(options: Mapping[str, str]) -> StateSourceOptions:
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        missing = [k for k in ("path", "uid", "state") if not opts.get(k)]
        if missing:
            raise ConfigError(missing[0], None, f"the {missing[0]} option of {STATE_FORMAT}")
        storage = NO_STORAGE_OPTIONS
        if STORAGE_OPTION in opts:
            storage = StorageOptions.from_json(opts[STORAGE_OPTION]).covering(opts["path"])
        return StateSourceOptions(
            storage=storage,
            path=opts["path"],
            uid=opts["uid"],
            state=opts["state"],
            checkpoint_id=_positive(opts, "checkpoint"),
            partitions=_positive(opts, "partitions"),
        )


def _positive(opts: Mapping[str, str], name: str) -> int | None:
    text = opts.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(name, text, "a positive integer")
    return value


@dataclass(frozen=True)
class StateReadPlan:
    """One read of one state: the store, the pinned checkpoint, the state's kind, the Arrow
    schema of its rows and the key-group ranges (inclusive) to read, one per partition
    (``None``: the whole state in one partition)."""

    path: str
    checkpoint_id: int
    uid: str
    state: str
    keyed: bool
    schema: pa.Schema
    ranges: tuple[tuple[int, int] | None, ...]
    storage: StorageOptions = NO_STORAGE_OPTIONS


def plan_state_read(options: StateSourceOptions) -> StateReadPlan:
    """Open the store, pin the checkpoint and work out schema and partitions (driver side)."""
    options.storage.install()
    reader = StateReader.open(options.path, options.checkpoint_id)
    kind = reader.state_kind(options.uid, options.state)
    keyed = kind is not StateKind.OPERATOR_LIST
    ranges: tuple[tuple[int, int] | None, ...] = (None,)
    if keyed:
        info = reader.keyed_info(options.uid, options.state)
        schema = state_table_schema(info)
        if options.partitions is not None:
            n = min(options.partitions, info.max_parallelism)
            ranges = tuple(
                (r.start, r.end)
                for r in (range_for_subtask(info.max_parallelism, n, i) for i in range(n))
            )
        else:
            ranges = tuple(reader.key_group_ranges(options.uid, options.state)) or (None,)
    else:
        schema = reader.operator_state(options.uid, options.state).schema
    return StateReadPlan(
        path=options.path,
        checkpoint_id=reader.checkpoint_id,
        uid=options.uid,
        state=options.state,
        keyed=keyed,
        schema=schema.remove_metadata(),
        storage=options.storage,
        ranges=ranges,
    )


def read_state(plan: StateReadPlan, key_group_range: tuple[int, int] | None) -> pa.Table:
    """The rows of one partition of *plan* (executor side)."""
    reader = StateReader.open(plan.path, plan.checkpoint_id)
    if plan.keyed:
        table = reader.keyed(plan.uid, plan.state, key_group_range=key_group_range)
    else:
        table = reader.operator_state(plan.uid, plan.state)
    return table.replace_schema_metadata(None)


def state_batches(
    plan: StateReadPlan, key_group_range: tuple[int, int] | None
) -> Iterator[pa.RecordBatch]:
    """The rows of one partition of *plan* as record batches (of at most 64k rows)."""
    plan.storage.install()  # an executor's worker
    yield from read_state(plan, key_group_range).to_batches(max_chunksize=65_536)


def state_table(path: str, uid: str, state: str, checkpoint_id: int | None = None) -> pa.Table:
    """Keyed or operator state *state* of *uid* as an Arrow table (see the module
    docstring)."""
    reader = StateReader.open(path, checkpoint_id)
    if reader.state_kind(uid, state) is StateKind.OPERATOR_LIST:
        table = reader.operator_state(uid, state)
    else:
        table = reader.keyed(uid, state)
    return table.replace_schema_metadata(None)


def state_dataframe(
    spark: SparkSession, path: str, uid: str, state: str, checkpoint_id: int | None = None
) -> DataFrame:
    """Keyed or operator state *state* of operator *uid* in checkpoint *checkpoint_id*
    (default: the latest completed) of *path* (a pipeline root or a savepoint directory) as a
    DataFrame, read on the driver (for large state use the ``ckpt-state`` data source,
    which reads in parallel)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    table = state_table(path, uid, state, checkpoint_id)
    return spark.createDataFrame(table, schema=from_arrow_schema(table.schema))

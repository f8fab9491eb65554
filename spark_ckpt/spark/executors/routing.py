"""Routing of the source's rows to the subtasks on the executors.

The executor path's query (:mod:`spark_ckpt.spark.executors.subtask_function`) is::

    ckpt-source (routed) ─ groupBy(_ckpt_group) ─ applyInPandasWithState(SubtaskFunction)

``ckpt-source`` routes in ``read()`` (executors) when the pipeline sets the ``route.*``
options: each channel's rows of a micro-batch leave the source as one **payload** per
subtask, the Arrow IPC bytes of the data rows of the subtask's key groups plus every control
row of the channel (barriers reach every subtask). Spark then moves a few binary rows per
channel and subtask, never the rows one by one, and the rows keep their Arrow types exactly.
:func:`subtask_rows` puts a subtask's payloads back into channel order.

**Spreading the subtasks over the partitions.** Spark's shuffle sends a group to partition
``pmod(murmur3(key, 42), partitions)``. Grouped by the subtask number itself, the subtasks
collide: with 2 partitions, subtasks 0 and 1 both hash to partition 1, and one Spark task
ran both subtasks one after the other while the other had nothing to do. Every subtask
therefore gets a *group key* (:func:`group_keys`): an integer that Spark's hash sends to
partition ``subtask mod partitions``, so up to ``partitions`` subtasks run in parallel.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.protocol.barrier import CHANNEL, CHECKPOINT_ID, OFFSET
from spark_ckpt.protocol.state_handles import encode_table
from spark_ckpt.runtime.event_time import fill_progress
from spark_ckpt.runtime.stage_output import split_for_subtasks

#: The routed rows' columns: the shuffle's group key, the subtask, and its payload.
GROUP: Final = "_ckpt_group"
SUBTASK: Final = "_ckpt_subtask"
PAYLOAD: Final = "_ckpt_payload"
ROUTED_SCHEMA: Final = pa.schema(
    [(GROUP, pa.int32()), (SUBTASK, pa.int32()), (PAYLOAD, pa.binary())]
)
#: :data:`ROUTED_SCHEMA` as Spark DDL (the return type of the routing ``mapInArrow``).
ROUTED_DDL: Final = f"{GROUP} int, {SUBTASK} int, {PAYLOAD} binary"
#: The ``ckpt-source`` options that make it route (set by the pipeline, not by users).
ROUTE_KEY: Final = "route.key"
ROUTE_PARALLELISM: Final = "route.parallelism"
ROUTE_MAX_PARALLELISM: Final = "route.maxParallelism"
ROUTE_PARTITIONS: Final = "route.partitions"
ROUTE_OPTIONS: Final = (ROUTE_KEY, ROUTE_PARALLELISM, ROUTE_MAX_PARALLELISM, ROUTE_PARTITIONS)
#: Spark's seed of the shuffle's hash (``HashPartitioning``: ``Murmur3Hash(..., 42)``).
SPARK_HASH_SEED: Final = 42
_M32: Final = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``Murmur3Hash`` of an ``IntegerType`` value (``Murmur3_x86_32.hashInt``), as a
    signed 32-bit integer."""
    k = (value & _M32) * 0xCC9E2D51 & _M32
    k = _rotl(k, 15) * 0x1B873593 & _M32
    h = _rotl(seed ^ k, 13)
    h = (h * 5 + 0xE6546B64) & _M32
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & _M32
    h ^= h >> 13
    h = h * 0xC2B2AE35 & _M32
    h ^= h >> 16
    return h - (1 << 32) if h >= 1 << 31 else h


def group_keys(parallelism: int, partitions: int) -> tuple[int, ...]:
    """Per subtask, the smallest distinct non-negative ``int`` group key that Spark's
    shuffle sends to partition ``subtask % partitions``."""
    if parallelism < 1 or partitions < 1:
        raise ValueError("parallelism and partitions must be positive")
    keys: list[int] = []
    taken: set[int] = set()
    for subtask in range(parallelism):
        k = 0
        while k in taken or spark_hash_int(k) % partitions != subtask % partitions:
            k += 1
        keys.append(k)
        taken.add(k)
    return tuple(keys)


@dataclass(frozen=True)
class Router:
    """Cuts rows into one payload per subtask (executors, where the source is read).
    Picklable."""

    key_column: str
    parallelism: int
    max_parallelism: int
    #: the partitions of the subtasks' stage (``spark.sql.shuffle.partitions``)
    partitions: int
    #: event time: the column whose largest value per channel the progress rows carry
    event_time_column: str | None = None

    @cached_property
    def groups(self) -> tuple[int, ...]:
        """Each subtask's group key (see the module docstring)."""
        return group_keys(self.parallelism, self.partitions)

    def options(self) -> dict[str, str]:
        """The ``ckpt-source`` options that route as this router does."""
        return {
            ROUTE_KEY: self.key_column,
            ROUTE_PARALLELISM: str(self.parallelism),
            ROUTE_MAX_PARALLELISM: str(self.max_parallelism),
            ROUTE_PARTITIONS: str(self.partitions),
        }

    def route(self, table: pa.Table) -> pa.RecordBatch:
        """*table*'s rows (source rows, data and control, a channel's of a micro-batch) as
        routed rows: per subtask that gets any, its data rows (by key group) and every
        control row, as one payload. With event time, the progress rows first get the
        largest event time of the rows before them (every subtask receives every one)."""
        if self.event_time_column is not None:
            table, _ = fill_progress(table, self.event_time_column)
        subtasks, payloads = [], []
        parts = split_for_subtasks(table, self.key_column, self.max_parallelism, self.parallelism)
        for s, mine in enumerate(parts):
            if mine.num_rows:
                subtasks.append(s)
                payloads.append(encode_table(mine))
        groups = [self.groups[s] for s in subtasks]
        return pa.RecordBatch.from_arrays(
            [
                pa.array(groups, pa.int32()),
                pa.array(subtasks, pa.int32()),
                pa.array(payloads, pa.binary()),
            ],
            schema=ROUTED_SCHEMA,
        )


def subtask_rows(payloads: list[bytes]) -> pa.Table:
    """A subtask's rows of one micro-batch from its payloads (in any order): data rows in
    channel order, then the control rows in channel order. The source emits a channel's
    barriers after its last data row of the batch, so this keeps every channel's order.

    A payload as :meth:`Router.route` cuts it holds one channel's rows in order, data rows
    first: the payloads' data rows are then only put side by side by channel, without
    sorting the rows (only the few control rows are sorted), into one chunk as a sort
    would give them. Payloads that are not so (several for one channel, rows out of order)
    are sorted row by row."""
    tables = [pa.ipc.open_stream(pa.py_buffer(p)).read_all() for p in payloads]
    pieces = [(_in_order(t), t) for t in tables]
    ordered = sorted(((cut, t) for cut, t in pieces if cut is not None), key=lambda p: p[0])
    if len(ordered) < len(tables) or len({cut[0] for cut, _ in ordered}) < len(ordered):
        return _sorted(pa.concat_tables(tables))
    data = [t.slice(0, n_data) for (_, n_data), t in ordered]
    control = pa.concat_tables([t.slice(n_data) for (_, n_data), t in ordered])
    return pa.concat_tables([*data, _sorted(control)]).combine_chunks()


def stage_rows(payloads: list[bytes]) -> pa.Table:
    """A later stage's subtask's rows of one micro-batch from its payloads (in any order):
    each upstream subtask's channel whole and in its own order (data, progress and barrier
    rows as it forwarded them, :mod:`spark_ckpt.runtime.stage_output`), channel after
    channel. A channel's barrier may come before its last data rows (output after a
    snapshot), so the rows are not reordered as :func:`subtask_rows` does."""
    tables = [pa.ipc.open_stream(pa.py_buffer(p)).read_all() for p in payloads]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return pa.table({})
    tables.sort(key=lambda t: int(t.column(CHANNEL)[0].as_py()))
    return pa.concat_tables(tables, promote_options="default").combine_chunks()


def _in_order(table: pa.Table) -> tuple[int, int] | None:
    """(channel, number of data rows) of a payload holding one channel's rows with the data
    rows first, in offset order; None for any other payload (or an empty one)."""
    if not table.num_rows:
        return None
    bounds = pc.min_max(table.column(CHANNEL)).as_py()
    if bounds["min"] != bounds["max"]:
        return None
    n_data = table.column(CHECKPOINT_ID).null_count
    if table.slice(0, n_data).column(CHECKPOINT_ID).null_count != n_data:
        return None  # a control row before a data row
    offsets = table.column(OFFSET).slice(0, n_data).to_numpy()
    if len(offsets) > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        return None
    return int(bounds["min"]), n_data


def _sorted(table: pa.Table) -> pa.Table:
    """*table*'s rows: data rows by channel and offset, then control rows by channel,
    offset and checkpoint."""
    order = pc.sort_indices(
        pa.table(
            {
                "control": pc.is_valid(table.column(CHECKPOINT_ID)),
                "channel": table.column(CHANNEL),
                "offset": table.column(OFFSET),
                "checkpoint": table.column(CHECKPOINT_ID),
            }
        ),
        sort_keys=[(c, "ascending") for c in ("control", "channel", "offset", "checkpoint")],
    )
    return table.take(order)

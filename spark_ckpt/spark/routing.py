"""Routing of the source's rows to the subtasks on the executors.

The executor path's query (:mod:`spark_ckpt.spark.executor_subtasks`) is::

    ckpt-source (routed) ─ groupBy(_ckpt_subtask) ─ applyInPandasWithState(SubtaskFunction)

``ckpt-source`` routes in ``read()`` (executors) when the pipeline sets the ``route.*``
options: each channel's rows of a micro-batch leave the source as one **payload** per
subtask, the Arrow IPC bytes of the data rows of the subtask's key groups plus every control
row of the channel (barriers reach every subtask). Spark then moves a few binary rows per
channel and subtask, never the rows one by one, and the rows keep their Arrow types exactly.
:func:`subtask_rows` puts a subtask's payloads back into channel order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.protocol.barrier import CHANNEL, CHECKPOINT_ID, OFFSET
from spark_ckpt.protocol.handle import encode_table
from spark_ckpt.state.keygroup import subtasks_for_keys

#: The routed rows' columns: the subtask, and its payload.
SUBTASK: Final = "_ckpt_subtask"
PAYLOAD: Final = "_ckpt_payload"
ROUTED_SCHEMA: Final = pa.schema([(SUBTASK, pa.int32()), (PAYLOAD, pa.binary())])
#: The ``ckpt-source`` options that make it route (set by the pipeline, not by users).
ROUTE_KEY: Final = "route.key"
ROUTE_PARALLELISM: Final = "route.parallelism"
ROUTE_MAX_PARALLELISM: Final = "route.maxParallelism"
ROUTE_OPTIONS: Final = (ROUTE_KEY, ROUTE_PARALLELISM, ROUTE_MAX_PARALLELISM)


@dataclass(frozen=True)
class Router:
    """Cuts rows into one payload per subtask (executors, where the source is read).
    Picklable."""

    key_column: str
    parallelism: int
    max_parallelism: int

    def options(self) -> dict[str, str]:
        """The ``ckpt-source`` options that route as this router does."""
        return {
            ROUTE_KEY: self.key_column,
            ROUTE_PARALLELISM: str(self.parallelism),
            ROUTE_MAX_PARALLELISM: str(self.max_parallelism),
        }

    def route(self, table: pa.Table) -> pa.RecordBatch:
        """*table*'s rows (source rows, data and control) as routed rows: per subtask that
        gets any, its data rows (by key group) and every control row, as one payload."""
        control = pc.is_valid(table.column(CHECKPOINT_ID)).to_numpy(zero_copy_only=False)
        owner = np.full(table.num_rows, -1, dtype=np.int64)
        data = np.flatnonzero(~control)
        if len(data):
            keys = table.column(self.key_column).take(pa.array(data))
            owner[data] = subtasks_for_keys(keys, self.max_parallelism, self.parallelism).to_numpy(
                zero_copy_only=False
            )
        subtasks, payloads = [], []
        for s in range(self.parallelism):
            mine = table.filter(pa.array(control | (owner == s)))
            if mine.num_rows:
                subtasks.append(s)
                payloads.append(encode_table(mine))
        return pa.RecordBatch.from_arrays(
            [pa.array(subtasks, pa.int32()), pa.array(payloads, pa.binary())],
            schema=ROUTED_SCHEMA,
        )


def subtask_rows(payloads: list[bytes]) -> pa.Table:
    """A subtask's rows of one micro-batch from its payloads (in any order): data rows in
    channel order, then the control rows in channel order. The source emits a channel's
    barriers after its last data row of the batch, so this keeps every channel's order."""
    table = pa.concat_tables([pa.ipc.open_stream(pa.py_buffer(p)).read_all() for p in payloads])
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

"""The operator of the time bench's TTL section (:mod:`runbench.timebench`): deduplication
whose memory of a key expires, or never does.

:class:`Dedup` emits a key the first time it is seen (and, with a TTL, again once its entry
expired) and keeps a ``seen`` value state per key: ``ValueStateDescriptor("seen",
pa.bool_(), ttl=StateTtlConfig.of(ttl_ms))``, or the same descriptor without ``ttl``. The
subtasks run on the executors, so this module is pickled by value
(:mod:`spark_ckpt.spark.executors.shipping`): it imports nothing of the bench.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt import KeyedOperator, StateContext, StateTtlConfig, ValueStateDescriptor


class Dedup(KeyedOperator):
    """A ``user_id`` once (again after *ttl_ms* without being emitted; None: never again)."""

    def __init__(self, ttl_ms: int | None) -> None:
        super().__init__("dedup", "user_id", pa.int64())
        ttl = None if ttl_ms is None else StateTtlConfig.of(ttl_ms)
        self.seen = ValueStateDescriptor("seen", pa.bool_(), ttl=ttl)

    def open(self, state: StateContext) -> None:
        state.value_state(self.seen)

    @property
    def output_schema(self) -> pa.Schema:
        return pa.schema([("user_id", pa.int64())])

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        users = pc.unique(batch.column("user_id"))
        new = users.filter(pc.is_null(state.get_values(self.seen, users)))
        state.put_values(self.seen, new, pa.array(np.ones(len(new), dtype=bool)))
        return pa.table([new], schema=self.output_schema)

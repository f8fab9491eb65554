"""User operators with keyed state.

An operator is identified by a stable ``uid`` (its state is restored by uid, so keep it when
the program changes) and keyed by one column. Two ways to write one:

* **vectorized** (the fast path): subclass :class:`KeyedOperator` and implement
  :meth:`~KeyedOperator.process_batch` — a function over an Arrow table of records (all of them
  in this subtask's key groups) and the subtask's :class:`~spark_ckpt.state.context.StateContext`,
  using its vectorized ``get_values``/``put_values``. :class:`RunningCount` is the example:
  no Python loop over rows;
* **per record** (Flink's ``KeyedProcessFunction`` style): subclass :class:`RecordOperator`
  and implement :meth:`~RecordOperator.process_record`; the adapter sets the current key for
  every row. Convenient, but a Python call per row.

Operators see their state only through the :class:`~spark_ckpt.state.context.StateContext` the
task hands them (registration, per-record and vectorized access, operator list state); the
task keeps the backend and takes the snapshots.

Operators run wherever the task runs (the driver in the foreachBatch aligner). They must be
deterministic functions of (state, input) for exactly-once output to be reproducible on replay.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import StateError
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import ValueStateDescriptor


class KeyedOperator(ABC):
    """Base of keyed operators. ``key_type`` is the Arrow type of ``key_column``."""

    #: Whether the operator, first in its chain, receives the rows late beyond the allowed
    #: lateness, as Flink's operators see every element, instead of the task dropping them
    #: before it (the default, as Spark drops rows behind its watermark). Such an operator
    #: decides per row: :meth:`StateContext.late_rows
    #: <spark_ckpt.state.context.StateContext.late_rows>` marks them,
    #: :meth:`~spark_ckpt.state.context.StateContext.output_late` drops rows into the late
    #: output. :class:`~spark_ckpt.runtime.windows.WindowAggregate` does (lateness per
    #: window). Further down a chain an operator receives what the one before it emits.
    receives_late_rows: ClassVar[bool] = False
    #: Whether the operator keeps keyed state, so its rows must be routed by its key column
    #: (the chain's key, :func:`chain_key`). An operator without keyed state (a lookup join)
    #: takes its rows wherever the chain's key routes them.
    keyed: ClassVar[bool] = True
    #: Whether the operator needs the micro-batch's processing time (a lookup join picks
    #: the table version by it): the pipeline then keeps processing time even without a
    #: watermark strategy.
    needs_processing_time: ClassVar[bool] = False

    def __init__(self, uid: str, key_column: str, key_type: pa.DataType) -> None:
        if not uid:
            raise StateError("an operator needs a non-empty, stable uid")
        self.uid = uid
        self.key_column = key_column
        self.key_type = key_type

    def open(self, state: StateContext) -> None:  # noqa: B027 - optional hook
        """Register state descriptors on *state*. Called once per subtask, before restore and
        input."""

    @abstractmethod
    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        """Process *batch* (rows in input order per channel, all in the subtask's key groups)
        with the subtask's *state* and return the output rows, or None. Must not keep
        references into *state* across calls."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what :meth:`open` acquired (Spark's ``StatefulProcessor.close``, Flink's
        ``close``). Called once, where the subtask ran, when its task ends in order: the
        pipeline stops or finishes, or the process that kept the task alive between
        micro-batches lets it go. Not after a crash (a killed process calls nothing), and
        a task that fails is not closed: its state is the last checkpoint's, not this
        one's. Nor under Spark Connect with ``placement="driver"``: Spark ends the server's
        foreachBatch process with the query, without notice. The state is no longer
        accessible; what a checkpoint holds is already written."""

    def on_timers(self, timers: pa.Table, state: StateContext) -> pa.Table | None:
        """Timers of this operator that fired (see :mod:`spark_ckpt.state.timers`): a table of
        the key column (named as :attr:`key_column`), ``timestamp`` (ms since the epoch) and
        ``domain`` (``"event"`` or ``"processing"``), ordered by timestamp, all in the
        subtask's key groups; returns output rows, or None. Called by the task at the end of
        a micro-batch, once the watermark (or the batch's processing time) passed them, and
        before a checkpoint's snapshot; timers it registers at or below that time fire in
        the same round. The default ignores them."""
        return None

    @property
    def handles_timers(self) -> bool:
        """Whether the operator overrides :meth:`on_timers` (or ``on_timer``): it then needs a
        pipeline that keeps time."""
        own = type(self).on_timers is not KeyedOperator.on_timers
        per_record = getattr(type(self), "on_timer", None)
        return own or (per_record is not None and per_record is not RecordOperator.on_timer)

    @property
    def output_schema(self) -> pa.Schema | None:
        """Schema of the output, when known up front (sinks create tables with it)."""
        return None

    @property
    def side_outputs(self) -> Mapping[str, pa.Schema]:
        """The operator's named outputs and their schemas (Flink's ``OutputTag``): rows it
        gives one with :meth:`StateContext.output <spark_ckpt.state.context.StateContext.output>`
        go to the table the pipeline maps it to (``outputs={name: path}``), or nowhere when
        it maps none. Default: none."""
        return {}


class RecordOperator(KeyedOperator):
    """Per-record operator: :meth:`process_record` is called for every row with the current
    key set; it yields output rows as dicts matching :attr:`output_schema`."""

    @abstractmethod
    def process_record(self, row: dict[str, Any], state: StateContext) -> Iterable[dict[str, Any]]:
        """Process *row*, whose key is *state*'s current key, and yield the output rows."""

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        out: list[dict[str, Any]] = []
        for row in batch.to_pylist():
            state.set_current_key(row[self.key_column])
            out.extend(self.process_record(row, state))
        return self._rows(out)

    def on_timer(
        self, key: Any, timestamp: int, domain: str, state: StateContext
    ) -> Iterable[dict[str, Any]]:
        """A timer of *key* (also *state*'s current key) fired at *timestamp* (ms since the
        epoch) in *domain* (``"event"`` or ``"processing"``); yield the output rows. The
        default yields nothing."""
        return ()

    def on_timers(self, timers: pa.Table, state: StateContext) -> pa.Table | None:
        return rows_of(self.output_schema, fired_per_record(self, timers, state))

    def _rows(self, out: list[dict[str, Any]]) -> pa.Table | None:
        return rows_of(self.output_schema, out)


class _PerRecordTimers(Protocol):
    key_column: str

    def on_timer(
        self, key: Any, timestamp: int, domain: str, state: StateContext
    ) -> Iterable[dict[str, Any]]: ...


def fired_per_record(
    op: _PerRecordTimers, timers: pa.Table, state: StateContext
) -> list[dict[str, Any]]:
    """The rows *op*'s ``on_timer`` yields for each of *timers*, the current key set to the
    timer's (the per-record operators' timers: a Python call per timer)."""
    out: list[dict[str, Any]] = []
    for timer in timers.to_pylist():
        key = timer[op.key_column]
        state.set_current_key(key)
        out.extend(op.on_timer(key, timer["timestamp"], timer["domain"], state))
    return out


def rows_of(schema: pa.Schema | None, out: list[dict[str, Any]]) -> pa.Table | None:
    """Per-record output rows as a table of *schema* (None: inferred; no rows: None)."""
    if schema is None:
        return pa.Table.from_pylist(out) if out else None
    return pa.Table.from_pylist(out, schema=schema)


def chain_key(operators: Sequence[KeyedOperator]) -> str:
    """The column that routes a chain's rows to subtasks: the key of its keyed operators
    (the first operator's when none keeps keyed state)."""
    for op in operators:
        if op.keyed:
            return op.key_column
    return operators[0].key_column


def rank_within_key(keys: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """For each row, how many earlier rows of the batch have the same key (0-based), plus the
    distinct keys and the index of each row's key among them. Vectorized (one sort).

    Chunked keys are combined first (one copy, O(rows)): encoding chunk by chunk and unifying
    the dictionaries costs more than the copy (the aligner's output is chunked around
    barriers)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    encoded = pc.dictionary_encode(keys)
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    n = len(codes)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = sorted_codes[1:] != sorted_codes[:-1]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    rank_sorted = np.arange(n) - group_start
    rank = np.empty(n, dtype=np.int64)
    rank[order] = rank_sorted
    return encoded.dictionary, codes, rank


class RunningCount(KeyedOperator):
    """Keyed running count: for every input row emits ``(key, count)`` where *count* is the
    number of rows with that key seen so far, this one included. State: one int64 per key."""

    COUNT = ValueStateDescriptor("count", pa.int64())

    def __init__(
        self, uid: str = "counter", key_column: str = "user_id", key_type: pa.DataType | None = None
    ) -> None:
        super().__init__(uid, key_column, key_type or pa.int64())

    @property
    def output_schema(self) -> pa.Schema:
        return pa.schema([pa.field(self.key_column, self.key_type), pa.field("count", pa.int64())])

    def open(self, state: StateContext) -> None:
        state.value_state(self.COUNT)

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        if batch.num_rows == 0:
            return None
        keys = batch.column(self.key_column)
        distinct, codes, rank = rank_within_key(keys)
        before = state.get_values(self.COUNT, distinct).fill_null(0).to_numpy(zero_copy_only=False)
        sizes = np.bincount(codes, minlength=len(distinct))
        state.put_values(self.COUNT, distinct, pa.array(before + sizes, pa.int64()))
        counts = before[codes] + rank + 1
        return pa.table(
            [keys.cast(self.key_type), pa.array(counts, pa.int64())], schema=self.output_schema
        )

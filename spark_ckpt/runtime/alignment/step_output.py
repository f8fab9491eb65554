"""The ordered output of one aligner call."""

from __future__ import annotations

import pyarrow as pa

from spark_ckpt.runtime.alignment.steps import Records, Step

__all__ = ["StepOutput"]


class StepOutput:
    """Collects the steps of one aligner call in order.

    Data rows passed to :meth:`emit_records` accumulate until the next :meth:`emit` or
    :meth:`take`, which turns them into one :class:`Records` step placed before it, so that the
    rows emitted before a step are exactly the rows the operator processed before it."""

    def __init__(self) -> None:
        self._out: list[Step] = []
        self._records: list[pa.Table] = []

    def emit_records(self, table: pa.Table) -> None:
        if table.num_rows:
            self._records.append(table)

    def emit(self, step: Step) -> None:
        self._flush_records()
        self._out.append(step)

    def take(self) -> list[Step]:
        """The steps collected since the last call (pending rows flushed first)."""
        self._flush_records()
        out = self._out
        self._out = []
        return out

    def _flush_records(self) -> None:
        """Emit the pending data rows as one :class:`Records`. Its table is contiguous (one
        chunk per column): a table pieced together from segments, buffers and filters is
        combined once here (one copy), so that operators never pay the much higher cost of
        chunk-by-chunk kernels (hash encoding in particular) on every column they touch."""
        if self._records:
            tables = self._records
            self._records = []
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            if table.num_columns and table.column(0).num_chunks > 1:
                table = table.combine_chunks()
            self._out.append(Records(table))

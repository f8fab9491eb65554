"""The lookup join: each row of the stream joined with the rows of a Delta table of its key
(stream-static enrichment, Spark's stream-static join; Flink's lookup join).

``LookupJoin("/lake/customers", key="customer_id")`` in a chain joins every row with the
table's rows of the same key: ``how="inner"`` keeps the rows that match, ``"left_outer"``
keeps every row, with nulls for the table's columns where none matches. The output has the
stream's columns, then the table's without its key column; a table column named as a stream
one is prefixed by *prefix* (default ``lookup_``).

**Which version.** When the source runner plans a micro-batch it reads the newest version of
the table and records it in the batch's offsets, next to the batch's processing time; every
row of the batch joins with that version. A replay of the batch, after any failure, joins
with the same version: neither Spark's stream-static join (it reads the table when the batch
runs) nor Flink's lookup join (it reads the table when the row arrives) promises that. A new
version is picked up by the next micro-batch planned after its commit, within a trigger
interval. The pipeline keeps processing time for this (the versions travel in the progress
rows), also without a watermark strategy. A replay needs that version's files, which
``VACUUM`` keeps for 7 days by default.

**Where the table is read.** Each subtask reads the version it needs itself, with delta-rs,
wherever it runs (on the executors, next to the rows), and keeps the newest one it read in
memory; no row of the table passes through the driver. Memory: one copy of the table (its
columns of interest) per subtask host. The join is vectorized: one hash join per micro-batch,
O(rows + matches), no Python per row.

It keeps no keyed state, so its rows need no routing by its key: it runs in a chain keyed by
any column (:func:`~spark_ckpt.runtime.operator.chain_key`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from enum import StrEnum
from typing import ClassVar

import numpy as np
import pyarrow as pa

from spark_ckpt.errors import ConfigError, StateError, StoreError
from spark_ckpt.locations.credentials import for_delta
from spark_ckpt.locations.uris import normalized
from spark_ckpt.runtime.operator import KeyedOperator
from spark_ckpt.state.context import StateContext


class LookupType(StrEnum):
    """Which rows a :class:`LookupJoin` emits."""

    INNER = "inner"
    LEFT_OUTER = "left_outer"


class _TableCache:
    """The rows of the lookup tables this process joins with: per table, the newest version
    read (a micro-batch reads a version once per process; the next one replaces it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, tuple[str, ...] | None], tuple[int, pa.Table]] = {}

    def rows(self, uri: str, version: int, columns: Sequence[str] | None) -> pa.Table:
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        key = (uri, None if columns is None else tuple(columns))
        with self._lock:
            found = self._rows.get(key)
            if found is not None and found[0] == version:
                return found[1]
            try:
                dt = DeltaTable(uri, version=version, storage_options=for_delta(uri))
                rows = dt.to_pyarrow_table(columns=None if columns is None else list(columns))
            except (OSError, DeltaError) as e:
                raise StoreError(f"lookup table {uri} at version {version}: {e}") from e
            self._rows[key] = (version, rows)
            return rows


#: This process's lookup tables.
TABLES = _TableCache()


class LookupJoin(KeyedOperator):
    """See the module docstring. *key*: the join column of the stream and of the table (a
    name, or ``(stream, table)``); *columns*: the table's columns to join (default: all);
    *key_type*: the key's Arrow type."""

    keyed: ClassVar[bool] = False
    needs_processing_time: ClassVar[bool] = True

    def __init__(
        self,
        table: str,
        key: str | tuple[str, str],
        *,
        how: LookupType | str = LookupType.INNER,
        columns: Sequence[str] | None = None,
        prefix: str = "lookup_",
        uid: str | None = None,
        key_type: pa.DataType | None = None,
    ) -> None:
        stream_key, table_key = (key, key) if isinstance(key, str) else key
        self.table = normalized(table)
        self.table_key = table_key
        self.columns = (
            None if columns is None else [table_key, *(c for c in columns if c != table_key)]
        )
        self.prefix = prefix
        try:
            self.how = LookupType(str(how).strip().lower())
        except ValueError:
            raise ConfigError("how", how, " or ".join(t.value for t in LookupType)) from None
        super().__init__(uid or f"lookup-{table_key}", stream_key, key_type or pa.int64())

    def check_table(self) -> None:
        """Before the job runs: the table exists and has the key column (and *columns*);
        :class:`ConfigError` naming it otherwise."""
        from deltalake import DeltaTable

        options = for_delta(self.table)
        if not DeltaTable.is_deltatable(self.table, options):
            raise ConfigError("LookupJoin", self.table, "an existing Delta table")
        names = [f.name for f in DeltaTable(self.table, storage_options=options).schema().fields]
        for column in self.columns or [self.table_key]:
            if column not in names:
                raise ConfigError(
                    f"LookupJoin({self.table!r})", column, f"a column of the table: {names}"
                )

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        if batch.num_rows == 0:
            return None
        version = state.lookup_version(self.table)
        if version is None:
            raise StateError(
                f"lookup join {self.uid!r}: the micro-batch records no version of {self.table} "
                "(the pipeline names its lookup tables to the source)"
            )
        return self._joined(batch, TABLES.rows(self.table, version, self.columns))

    def _joined(self, batch: pa.Table, table: pa.Table) -> pa.Table | None:
        left = pa.table(
            {"k": batch.column(self.key_column), "l": pa.array(np.arange(batch.num_rows))}
        )
        right = pa.table(
            {
                "k": table.column(self.table_key).cast(batch.schema.field(self.key_column).type),
                "r": pa.array(np.arange(table.num_rows)),
            }
        )
        kind = "inner" if self.how is LookupType.INNER else "left outer"
        pairs = left.join(right, keys="k", join_type=kind, use_threads=False)
        if pairs.num_rows == 0:
            return None
        li = pairs.column("l").to_numpy()
        ri = pairs.column("r").to_numpy(zero_copy_only=False)  # nulls: rows with no match
        order = np.lexsort((np.nan_to_num(ri.astype(float), nan=-1), li))
        li = li[order]
        rpos = pairs.column("r").take(pa.array(order))
        out = batch.take(pa.array(li))
        for f in table.schema:
            if f.name == self.table_key:
                continue
            name = f"{self.prefix}{f.name}" if f.name in batch.column_names else f.name
            out = out.append_column(pa.field(name, f.type), table.column(f.name).take(rpos))
        return out

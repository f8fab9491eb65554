"""Shared access to the Delta tables of one checkpoint-store root (:class:`StoreTables`), for
the store's components: each table opened once and then followed
(:class:`~spark_ckpt.delta.followed_table.FollowedTable`), created on first write with the
schema and properties of :mod:`spark_ckpt.delta.store_layout`, and scanned with pyarrow. The
callers translate every error of delta-rs, Arrow and the file system at
:func:`~spark_ckpt.delta.boundary.store_boundary`."""

from __future__ import annotations

import threading
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from spark_ckpt.delta.followed_table import FollowedTable
from spark_ckpt.delta.store_layout import CONFIGURATION, SCHEMAS, StoreTable, empty_table
from spark_ckpt.errors import SparkCkptError
from spark_ckpt.locations.credentials import StorageOptions, for_delta
from spark_ckpt.locations.uris import filesystem
from spark_ckpt.protocol.clock import Clock


class StoreTables:
    """The tables under *root* (a local path or a URI delta-rs understands;
    *storage_options* are passed to delta-rs): opened once, then kept up to date
    (:class:`FollowedTable`); created on first write. *clock* stamps the informational
    timestamp columns (:meth:`now`). Thread-safe: the lock guards the cache of opened
    tables, each of which has its own."""

    def __init__(self, root: str, *, storage_options: dict[str, str] | None, clock: Clock) -> None:
        self._root = str(root).rstrip("/")
        StorageOptions.of(storage_options, [self._root]).install()  # for pyarrow's side too
        self._storage_options = for_delta(self._root, storage_options)
        self._clock = clock
        self._lock = threading.Lock()
        self._tables: dict[StoreTable, FollowedTable] = {}

    @property
    def root(self) -> str:
        return self._root

    def uri(self, table: StoreTable) -> str:
        """Where *table* lives (for second readers: Spark, polars, DuckDB)."""
        return f"{self._root}/{table.value}"

    def load(self, table: StoreTable) -> DeltaTable | None:
        """The newest version of *table*, or ``None`` if it was never created (see
        :class:`FollowedTable`)."""
        with self._lock:
            followed = self._tables.get(table)
            if followed is None:
                followed = FollowedTable(self.uri(table), self._storage_options)
                self._tables[table] = followed
        return followed.newest()

    def forget(self, table: StoreTable) -> None:
        """A use of *table*'s object failed: the next :meth:`load` opens it anew."""
        with self._lock:
            followed = self._tables.get(table)
        if followed is not None:
            followed.forget()

    def ensure(self, table: StoreTable) -> DeltaTable:
        """The newest version of *table*, creating it (explicit schema) if missing. Safe when
        several processes create it at once."""
        dt = self.load(table)
        if dt is not None:
            return dt
        try:
            return DeltaTable.create(
                self.uri(table),
                SCHEMAS[table],
                mode="ignore",
                name=table.value,
                description=f"spark-ckpt {table.value}",
                configuration=dict(CONFIGURATION.get(table, {})) or None,
                storage_options=self._storage_options,
            )
        except DeltaError:
            dt = self.load(table)  # lost the creation race
            if dt is None:
                raise
            return dt

    def configure(self, table: StoreTable) -> None:
        """Give *table*, if it exists, the properties of :data:`CONFIGURATION` it lacks (a
        table an earlier version created keeps Delta's log defaults): one metadata commit,
        none when nothing is missing. A property the table has keeps its value, whoever set
        it. The caller holds the boundary."""
        dt = self.load(table)
        if dt is None:
            return
        current = dt.metadata().configuration
        missing = {k: v for k, v in CONFIGURATION.get(table, {}).items() if k not in current}
        if missing:
            dt.alter.set_table_properties(missing, raise_if_not_exists=False)

    def arrow_fs(self, dt: DeltaTable) -> pafs.FileSystem | None:
        """A native pyarrow file system rooted at *dt*, with the same options delta-rs has
        (:func:`~spark_ckpt.locations.uris.filesystem`). (delta-rs' default Python file
        system handler works too, but in deltalake 1.6 + pyarrow 26 using it aborts the
        interpreter at exit — "terminate called without an active exception".)"""
        try:
            fs, path = filesystem(dt.table_uri)
        except SparkCkptError:
            return None
        return pafs.SubTreeFileSystem(path, fs)

    def scan(
        self,
        dt: DeltaTable,
        columns: list[str],
        *,
        ids: Iterable[int] | None = None,
        row_filter: ds.Expression | None = None,
        filter_columns: Sequence[str] = (),
        pushed: ds.Expression | None = None,
    ) -> pa.Table:
        """Read *columns* of *dt*; *ids* prunes files by ``checkpoint_id`` statistics before
        any data file is opened, *row_filter* selects rows (over *columns* plus
        *filter_columns*), *pushed* (over integer columns only) is pushed into the scan
        with the ``checkpoint_id`` predicate: row groups whose statistics fail them are not
        decoded, and rows that fail them are dropped batch by batch, never materialized.

        Predicates on string columns are not pushed into the scan: files that delta-rs
        rewrote (DELETE during retention) carry ``string_view`` in their Arrow schema, and
        pyarrow cannot compare those statistics with string literals."""
        scan_filter: ds.Expression | None = pushed
        pruning: list[tuple[str, str, Any]] | None = None
        if ids is not None:
            id_list = sorted(set(ids))
            if not id_list:
                return empty_table(columns)
            pruning = [("checkpoint_id", "in", id_list)]
            by_id = pc.field("checkpoint_id").isin(id_list)
            scan_filter = by_id if scan_filter is None else by_id & scan_filter
        dataset = dt.to_pyarrow_dataset(
            filesystem=self.arrow_fs(dt), file_pruning_predicate=pruning
        )
        read = list(dict.fromkeys([*columns, *filter_columns]))
        table = dataset.to_table(columns=read, filter=scan_filter)
        if row_filter is not None:
            table = table.filter(row_filter)
        return table.select(columns)

    def read_files(
        self,
        dt: DeltaTable,
        columns: list[str],
        read: MutableMapping[str, pa.Table],
    ) -> dict[str, pa.Table]:
        """The rows (*columns*) of each data file of *dt*, by the file's path as the Delta log
        names it, in the table's order. *read* holds (and is updated to hold) the rows
        already read from each file: Delta never rewrites a data file in place, so a reader
        following a table that grows by appends reads each file once; files the table no
        longer has are dropped from it."""
        dataset = dt.to_pyarrow_dataset(filesystem=self.arrow_fs(dt))
        out: dict[str, pa.Table] = {}
        for fragment in dataset.get_fragments():
            rows = read.get(fragment.path)
            if rows is None:
                rows = fragment.to_table(schema=dataset.schema, columns=columns)
                read[fragment.path] = rows
            out[fragment.path] = rows
        for path in [p for p in read if p not in out]:
            del read[path]
        return out

    def now(self) -> int:
        """Now, in microseconds since the epoch (the unit of the timestamp columns)."""
        return self._clock.now_ms() * 1000

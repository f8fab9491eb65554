"""One Delta table object kept up to date across uses (:class:`FollowedTable`), shared by the
checkpoint store's tables and the sink's output table.

Opening a table object reads the log from its newest checkpoint on; bringing an open one up
to date (``update_incremental()``) reads only the commits since, so it is much cheaper. But
with deltalake 1.6 a commit through an object costs more the more versions it has followed,
and an object older than the log retention needs commit files the log's cleanup removed:
the object is opened anew after :data:`REOPEN_AFTER_VERSIONS` versions or
:data:`REOPEN_AFTER_S` seconds (figures: docs/architecture.md, "The Delta logs").
"""

from __future__ import annotations

import threading
import time

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from spark_ckpt.locations.credentials import for_delta

#: A table object kept up to date with ``update_incremental()`` is opened again once it is
#: this many versions past the version it was opened at: each commit through such an object
#: costs more the more versions it has followed, while a new object starts from the log's
#: newest checkpoint.
REOPEN_AFTER_VERSIONS = 100

#: ... and once it was opened this many seconds ago: well inside
#: :data:`~spark_ckpt.delta.store_layout.HOT_LOG`'s log retention. An object's snapshot keeps
#: the commit files it was built from, and delta-rs reads them again (for a commit, a log
#: checkpoint); an object older than the log retention then fails on a commit file the cleanup
#: removed (``Object at location .../_delta_log/<version>.json not found``).
REOPEN_AFTER_S = 20.0


class FollowedTable:
    """One Delta table, opened once and then kept up to date (``update_incremental()``: the
    commits since, instead of a fresh open), opened again after :data:`REOPEN_AFTER_VERSIONS`
    versions or :data:`REOPEN_AFTER_S` seconds, or when :meth:`forget` says its object
    failed. Thread-safe."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None) -> None:
        self._uri = uri
        self._storage_options = for_delta(uri, storage_options)
        self._lock = threading.Lock()
        self._dt: DeltaTable | None = None
        self._opened_at = 0
        self._opened_s = 0.0

    def newest(self) -> DeltaTable | None:
        """The newest version of the table, or ``None`` if it does not exist (yet). An
        object that cannot update (a commit file it needs is gone) is replaced by a new
        one."""
        with self._lock:
            dt = self._dt
            if dt is not None and time.monotonic() - self._opened_s < REOPEN_AFTER_S:
                try:
                    dt.update_incremental()
                except (OSError, DeltaError):
                    dt = None
                if dt is not None and dt.version() - self._opened_at < REOPEN_AFTER_VERSIONS:
                    return dt
            if not DeltaTable.is_deltatable(self._uri, self._storage_options):
                self._dt = None
                return None
            dt = DeltaTable(self._uri, storage_options=self._storage_options)
            self._dt, self._opened_at, self._opened_s = dt, dt.version(), time.monotonic()
            return dt

    def forget(self) -> None:
        """Drop the object: a use of it failed; the next :meth:`newest` opens a new one."""
        with self._lock:
            self._dt = None

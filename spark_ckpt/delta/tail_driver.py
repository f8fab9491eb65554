"""The Delta tail source, driver side: :class:`DeltaTailSource`, the
:class:`~spark_ckpt.sources.channel_source.ChannelSource` of ``ckpt-source`` with
``source = "delta"``, which reads an append-only Delta table (any, e.g. another pipeline's
output) as ``channels`` replayable logs (:mod:`~spark_ckpt.delta.tail_channels`). No Spark.

It runs in the source runner. Construction loads the table with delta-rs and refuses what
the source cannot tail (:mod:`~spark_ckpt.delta.tail_append_only`; a missing table too: the
source schema comes from the table, so the upstream must have created it — e.g. with
``DeltaTable.create`` — before the downstream starts). :meth:`~DeltaTailSource.heads` keeps an
in-memory index of the channel logs, incrementally: it reads the commit file of each version
it has not seen once (:mod:`~spark_ckpt.delta.log_commits`; O(commits since the last call and
the files they add)), so the commit file of every version from ``starting_version`` on must
still exist (Delta log cleanup removes old ones after a log checkpoint): a missing one is a
:class:`~spark_ckpt.errors.ProtocolError`. :meth:`~DeltaTailSource.plan` turns a row range
of a channel into a :class:`~spark_ckpt.delta.tail_executors.DeltaReadPlan` (O(log(files of
the channel) + files in the range)), which the executors read.

:attr:`~DeltaTailSource.schema` is the table's Arrow schema (delta-rs' mapping: Delta
``timestamp`` is ``timestamp[us, tz=UTC]``), column names renamed by
:func:`~spark_ckpt.delta.upstream_columns.upstream_name`. Columns added later by schema
evolution are ignored; files that lack a column of the schema (written before it was added)
yield nulls for it.
"""

from __future__ import annotations

import json
import operator
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from spark_ckpt.delta.log_commits import COMMIT_FILE, DamagedCommitError, read_commit
from spark_ckpt.delta.tail_append_only import appended_files, check_supported
from spark_ckpt.delta.tail_channels import file_channel
from spark_ckpt.delta.tail_executors import DeltaReadPlan, FileSlice
from spark_ckpt.delta.tail_files import file_location, table_filesystem, tail_boundary
from spark_ckpt.delta.upstream_columns import upstream_name
from spark_ckpt.errors import ConfigError, ProtocolError
from spark_ckpt.locations.credentials import for_delta
from spark_ckpt.protocol.option import check_int, parse_int
from spark_ckpt.sources.channel_source import check_channel

_MAX_CHANNELS: Final = 2**31 - 1
_MAX_VERSION: Final = 2**62


@dataclass(frozen=True)
class _IndexedFile:
    """One data file of a channel log: its first channel offset, Delta-log path and rows."""

    start: int
    path: str
    rows: int


class DeltaTailSource:
    """The ``source = "delta"`` channel source: ``channels`` logs over the data files the
    Delta table at *table_uri* adds from ``starting_version`` on
    (:mod:`~spark_ckpt.delta.tail_channels`).

    Construction loads the table (driver side) and raises :class:`ConfigError` naming
    ``path`` when it does not exist or is unsupported, ``channels``/``startingVersion`` when
    out of range. :meth:`heads` and :meth:`plan` are driver side and not thread safe;
    :meth:`heads` is incremental (reads only the commit files of versions it has not seen).
    """

    #: Option keys understood by :meth:`from_options` (lower case).
    OPTION_KEYS: ClassVar[tuple[str, ...]] = ("path", "channels", "startingversion")

    def __init__(
        self,
        table_uri: str,
        *,
        channels: int = 1,
        starting_version: int = 0,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self._channels = check_int("channels", channels, 1, _MAX_CHANNELS)
        self._starting_version = check_int("startingVersion", starting_version, 0, _MAX_VERSION)
        uri = str(table_uri)
        storage_options = for_delta(uri, storage_options)
        self._storage_options = storage_options
        try:
            exists = DeltaTable.is_deltatable(uri, storage_options)
            table = DeltaTable(uri, storage_options=storage_options) if exists else None
        except (DeltaError, OSError) as e:
            raise ConfigError("path", uri, f"a readable Delta table ({e})") from e
        if table is None:
            raise ConfigError("path", uri, "the location of an existing Delta table")
        self._table = table
        self._root = table.table_uri.rstrip("/")
        check_supported(table, uri)
        physical = pa.schema(table.schema().to_arrow())
        self._columns: tuple[str, ...] = tuple(physical.names)
        self._physical = physical
        renamed = [upstream_name(name) for name in physical.names]
        if len(set(renamed)) != len(renamed):
            raise ConfigError("path", uri, "a table whose column names stay distinct")
        self._schema = pa.schema(
            [f.with_name(n) for f, n in zip(physical, renamed, strict=True)],
            metadata=physical.metadata,
        )
        self._index: list[list[_IndexedFile]] = [[] for _ in range(self._channels)]
        self._starts: list[list[int]] = [[] for _ in range(self._channels)]
        self._heads = [0] * self._channels
        self._next_version = self._starting_version

    @classmethod
    def from_options(
        cls, options: Mapping[str, str], *, storage_options: dict[str, str] | None = None
    ) -> DeltaTailSource:
        """Build a source from Spark-style string options (keys matched case-insensitively;
        other keys are ignored, they belong to other subsystems).

        =============== ===================================== =======
        key             value                                 default
        =============== ===================================== =======
        path            URI or local path of the Delta table  required
        channels        integer >= 1                          1
        startingVersion first table version to tail, >= 0     0
        =============== ===================================== =======

        Any invalid or missing value raises :class:`ConfigError` naming the option key.
        """
        opts = {str(k).lower(): v for k, v in options.items()}

        def text(key: str, default: str | None) -> str | None:
            value = opts.get(key, default)
            if value is not None and not isinstance(value, str):
                raise ConfigError(key, value, "a string")
            return None if value is None else value.strip()

        path = text("path", None)
        if not path:
            raise ConfigError("path", path, "the location of an existing Delta table")
        channels = parse_int("channels", text("channels", "1") or "")
        starting = parse_int("startingVersion", text("startingversion", "0") or "")
        return cls(
            path, channels=channels, starting_version=starting, storage_options=storage_options
        )

    # --- ChannelSource ---------------------------------------------------------------------

    @property
    def channels(self) -> int:
        return self._channels

    @property
    def schema(self) -> pa.Schema:
        """The table's columns, barrier-like names renamed by :func:`upstream_name`."""
        return self._schema

    @property
    def table_uri(self) -> str:
        """The table root as delta-rs resolved it (a URI, no trailing slash)."""
        return self._root

    @property
    def starting_version(self) -> int:
        return self._starting_version

    @property
    def next_version(self) -> int:
        """The first table version :meth:`heads` has not indexed yet."""
        return self._next_version

    def heads(self) -> list[int]:
        """Driver side: rows per channel in the versions ``[starting_version, latest]``.

        Loads the newest table version and indexes the commits not seen before, in version
        order; each commit is applied atomically (all its files or none). Non-decreasing over
        calls. Raises :class:`ProtocolError` on a commit that removes data (and on every later
        call: the source does not advance past it) or when the log cannot be read."""
        with tail_boundary(f"loading the Delta table {self._root}"):
            self._table.update_incremental()
            latest = self._table.version()
        if latest >= self._next_version:
            fs, base = table_filesystem(self._root)
            while self._next_version <= latest:
                actions = self._read_commit(fs, base, self._next_version)
                self._apply(fs, base, self._next_version, actions)
                self._next_version += 1
        return list(self._heads)

    def plan(self, channel: int, start: int, end: int) -> DeltaReadPlan:
        """Driver side: the files and row ranges holding rows ``[start, end)`` of *channel*.
        Requires ``0 <= start <= end <= heads()[channel]`` (as of the last :meth:`heads`
        call), else :class:`ProtocolError`."""
        channel = check_channel(channel, self._channels, "the source")
        head = self._heads[channel]
        if not 0 <= start <= end <= head:
            raise ProtocolError(
                f"bad row range [{start}, {end}) of channel {channel}: need "
                f"0 <= start <= end <= {head} (its head)"
            )
        files = self._index[channel]
        slices: list[FileSlice] = []
        if start < end:
            i = bisect_right(self._starts[channel], start) - 1
            while i < len(files) and files[i].start < end:
                f = files[i]
                lo = max(start, f.start)
                hi = min(end, f.start + f.rows)
                slices.append(FileSlice(f.path, lo - f.start, hi - lo))
                i += 1
        return DeltaReadPlan(
            channel=channel,
            start=start,
            end=end,
            root=self._root,
            columns=self._columns,
            schema=self._schema,
            slices=tuple(slices),
        )

    # --- internals -------------------------------------------------------------------------

    def _read_commit(self, fs: pafs.FileSystem, base: str, version: int) -> list[dict[str, Any]]:
        """The actions of the commit file of *version*, in file order."""
        name = COMMIT_FILE.format(version=version)
        try:
            actions = read_commit(fs, version, root=base)
        except DamagedCommitError as e:
            raise ProtocolError(f"corrupt commit file {name} of {self._root}: {e}") from e
        except (OSError, pa.ArrowException) as e:
            raise ProtocolError(f"cannot read {name} of {self._root}: {e}") from e
        if actions is None:
            raise ProtocolError(
                f"the commit file of version {version} of {self._root} no longer exists (Delta "
                "log cleanup?): tail from a later startingVersion"
            )
        return actions

    def _apply(
        self, fs: pafs.FileSystem, base: str, version: int, actions: list[dict[str, Any]]
    ) -> None:
        """Index the data files *actions* (the commit of *version*) add, sorted by path;
        ProtocolError, with nothing indexed, if the commit is not an append
        (:func:`~spark_ckpt.delta.tail_append_only.appended_files`)."""
        added = appended_files(self._root, version, actions, self._physical)
        added.sort(key=operator.itemgetter("path"))
        counts = [self._row_count(fs, base, add) for add in added]
        for add, rows in zip(added, counts, strict=True):
            if rows == 0:
                continue
            channel = file_channel(add["path"], self._channels)
            start = self._heads[channel]
            self._index[channel].append(_IndexedFile(start, add["path"], rows))
            self._starts[channel].append(start)
            self._heads[channel] = start + rows

    def _row_count(self, fs: pafs.FileSystem, base: str, add: dict[str, Any]) -> int:
        """Rows of the added file: ``numRecords`` of its stats, else its Parquet footer."""
        stats = add.get("stats")
        if stats:
            try:
                records = json.loads(stats).get("numRecords")
            except (ValueError, AttributeError):
                records = None
            if isinstance(records, int) and not isinstance(records, bool) and records >= 0:
                return records
        file_fs, location = file_location(fs, base, add["path"])
        what = f"reading the footer of {add['path']!r} of {self._root}"
        with tail_boundary(what), file_fs.open_input_file(location) as handle:
            return int(pq.read_metadata(handle).num_rows)

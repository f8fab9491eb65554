"""The ``rocksdb`` state backend's storage: keyed state in an embedded RocksDB on the local
disk of the process that hosts the subtask (an executor's ``spark.local.dir``, or the
driver's temporary directory), through ``rocksdict``.

One RocksDB instance per subtask backend (one operator's subtask), one column family per
keyed state, keys and values in the explicit encodings of
:mod:`~spark_ckpt.state.backends.codecs` (key group first). Reads of a batch are one
``multi_get``; writes of a batch are one write batch, without the write-ahead log: the
instance is a cache of the last checkpoint plus what changed since, and never the durable
copy. Durability comes, as for ``hashmap``, from the checkpoint (incremental: the change log
since the last one, the same canonical Arrow blobs), so a savepoint of one backend restores
on the other.

Memory is bounded by the block cache and the write buffers (:class:`RocksDBOptions`), not by
the state: the state is bounded by the local disk. The directory is removed when the
backend closes, at the latest when the host process exits normally, and (a killed host's)
by the next instance opened in the same directory. A write the disk
cannot take (full, not writable) raises :class:`~spark_ckpt.errors.StateBackendError`,
which fails the batch and so the checkpoint in progress; the committed output and the
completed checkpoints are untouched.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from spark_ckpt.errors import StateBackendError
from spark_ckpt.protocol.state_handles import StorageMetrics
from spark_ckpt.state.backends.codecs import KeyCodec, ValueCodec
from spark_ckpt.state.backends.table import (
    KeyRouting,
    StateStorage,
    StateTable,
    TableStats,
)
from spark_ckpt.state.descriptor import StateDescriptor, from_column

log = logging.getLogger(__name__)

#: Defaults of Flink's ``state.backend.rocksdb.block.cache-size`` and ``…writebuffer.size``.
DEFAULT_BLOCK_CACHE_BYTES: Final = 8 << 20
DEFAULT_WRITE_BUFFER_BYTES: Final = 64 << 20
DEFAULT_MAX_WRITE_BUFFERS: Final = 2
#: The prefix of every instance's directory under the local directory.
DIR_PREFIX: Final = "spark-ckpt-rocksdb-"


@dataclass(frozen=True)
class RocksDBOptions:
    """How a ``rocksdb`` backend sizes its memory and where it puts its files (picklable).
    *local_dir*: the parent directory of the instances (None: the executor's first
    ``SPARK_LOCAL_DIRS``, else the temporary directory). Memory per instance is about
    ``block_cache_bytes + max_write_buffers * write_buffer_bytes``."""

    local_dir: str | None = None
    block_cache_bytes: int = DEFAULT_BLOCK_CACHE_BYTES
    write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES
    max_write_buffers: int = DEFAULT_MAX_WRITE_BUFFERS

    def parent_dir(self) -> str:
        """The directory the instances go under, here (where the subtask runs)."""
        if self.local_dir:
            return self.local_dir
        spark_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
        first = spark_dirs.split(",")[0].strip()
        return first or tempfile.gettempdir()


def _translate(e: BaseException, what: str) -> StateBackendError:
    message = str(e)
    if "No space left" in message or "ENOSPC" in message:
        return StateBackendError(f"rocksdb state backend: the local disk is full ({what})")
    return StateBackendError(f"rocksdb state backend: {what} failed: {message}")


#: Rows of a restored blob stored per write batch (bounds a restore's transient memory).
_LOAD_SLICE = 500_000


class _Instance:
    """One open RocksDB and its directory, closed and removed once (explicitly, or when
    the storage is collected or the process exits)."""

    def __init__(self, options: RocksDBOptions, label: str) -> None:
        from rocksdict import (
            BlockBasedOptions,
            Cache,
            Options,
            Rdict,
            WriteOptions,
        )

        parent = options.parent_dir()
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", label)[:80]
        name = f"{DIR_PREFIX}{safe}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.path = os.path.join(parent, name)
        remove_orphans(parent)
        try:
            os.makedirs(self.path)
        except OSError as e:
            raise StateBackendError(
                f"rocksdb state backend: local directory {parent!r} is not writable: {e}"
            ) from e
        self.options = Options(raw_mode=True)
        self.options.create_if_missing(True)
        self.options.enable_statistics()
        table = BlockBasedOptions()
        table.set_block_cache(Cache(options.block_cache_bytes))
        # index and filter blocks count against the cache, as under Flink's managed memory:
        # held outside it, they grow with the data on disk, and the host's memory with them
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        self.options.set_block_based_table_factory(table)
        self.options.set_write_buffer_size(options.write_buffer_bytes)
        self.options.set_max_write_buffer_number(options.max_write_buffers)
        try:
            self.db: Any = Rdict(self.path, self.options)
        except Exception as e:  # rocksdict raises plain Exceptions
            shutil.rmtree(self.path, ignore_errors=True)
            raise _translate(e, f"opening {self.path}") from e
        self.write_options = WriteOptions()
        self.write_options.disable_wal = True  # type: ignore[method-assign,assignment]
        #: column family name -> (its view, its handle for write batches); only the
        #: instance holds them, so that they are released before the database closes
        #: (rocksdict's handles outliving their database make the last release slow)
        self.families: dict[str, tuple[Any, Any]] = {}
        self._finalizer = weakref.finalize(self, _destroy, self.db, self.families, self.path)

    def family(self, name: str, descriptor: StateDescriptor) -> None:
        """Create column family *name*."""
        from rocksdict import Options

        try:
            view = self.db.create_column_family(name, Options(raw_mode=True))
        except Exception as e:
            raise _translate(e, f"creating state {descriptor.name!r}") from e
        self.families[name] = (view, self.db.get_column_family_handle(name))

    def close(self) -> None:
        self._finalizer()


_OWNER = re.compile(r"-(\d+)-[0-9a-f]{12}$")


def remove_orphans(parent: str) -> list[str]:
    """Remove the instance directories under *parent* whose process is gone (a killed
    subtask host leaves its directory behind: nothing reads it again, a restart rebuilds
    from the checkpoint or the changelog); the names removed. Directories of live
    processes, and anything that is not an instance's, are left alone."""
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        owner = _OWNER.search(name) if name.startswith(DIR_PREFIX) else None
        if owner is None or _alive(int(owner.group(1))):
            continue
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def _destroy(db: Any, families: dict[str, tuple[Any, Any]], path: str) -> None:
    try:
        families.clear()
        db.close()
    except Exception as e:  # a full disk fails the last flush: the files go anyway
        log.warning("closing the rocksdb state backend in %s: %s", path, e)
    finally:
        shutil.rmtree(path, ignore_errors=True)


class RocksDBStateTable(StateTable):
    """Storage of one keyed state in a column family of the backend's RocksDB (see the
    module docstring)."""

    def __init__(
        self, descriptor: StateDescriptor, instance: _Instance, family: str, key_type: pa.DataType
    ) -> None:
        super().__init__(descriptor)
        self._instance = instance
        self._family = family
        instance.family(family, descriptor)
        self._keys = KeyCodec(key_type)
        self._values = ValueCodec(descriptor.column_type)
        #: exact number of keys with an entry (RocksDB only estimates it): each write
        #: batch reads which of its keys exist first, one multi_get
        self._count = 0
        #: the last batch read and what it found, valid until the next write: a write of
        #: the same batch (read, modify, write) needs no second multi_get for the count
        self._last_read: tuple[KeyRouting, list[bytes], list[bytes | None]] | None = None
        #: the key groups loaded by ingesting files while nothing else wrote to the table
        #: (so exactly the key groups that have entries); None once anything else wrote
        self._ingested: set[int] | None = set()

    def _batch(self) -> Any:
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        wb.set_default_column_family(self._instance.families[self._family][1])
        return wb

    def _view(self) -> Any:
        return self._instance.families[self._family][0]

    def _write(self, wb: Any) -> None:
        try:
            self._instance.db.write(wb, self._instance.write_options)
        except Exception as e:
            raise _translate(e, f"writing state {self.descriptor.name!r}") from e

    def _get(self, stored_keys: list[bytes]) -> list[bytes | None]:
        if not stored_keys:
            return []
        try:
            return self._view().get(stored_keys)  # type: ignore[no-any-return]
        except Exception as e:
            raise _translate(e, f"reading state {self.descriptor.name!r}") from e

    def _encoded(self, routing: KeyRouting) -> list[bytes]:
        return self._keys.encode(routing.sorted_groups, routing.sorted_array)

    # -- per record ---------------------------------------------------------------------------
    def lookup(self, key_group: int, key: Any) -> Any:
        found = self._get([self._keys.one(key_group, key)])[0]
        if found is None:
            return None
        return from_column(self.descriptor.kind, self._values.decode([found]))[0]

    def store(self, key_group: int, key: Any, value: Any) -> None:
        self._last_read = None
        self._ingested = None
        stored = self._values.encode(self.column([value]))[0]
        assert stored is not None
        k = self._keys.one(key_group, key)
        existed = self._get([k])[0] is not None
        wb = self._batch()
        wb.put(k, stored)
        self._write(wb)
        self._count += 0 if existed else 1

    def remove(self, key_group: int, key: Any) -> None:
        self._last_read = None
        self._ingested = None
        k = self._keys.one(key_group, key)
        if self._get([k])[0] is None:
            return
        wb = self._batch()
        wb.delete(k)
        self._write(wb)
        self._count -= 1

    # -- vectorized -----------------------------------------------------------------------------
    def read(self, routing: KeyRouting) -> pa.Array:
        keys = self._encoded(routing)
        found = self._get(keys)
        self._last_read = (routing, keys, found)
        return self._values.decode(found)

    def write(self, routing: KeyRouting, values: pa.Array) -> None:
        last = self._last_read
        if last is not None and last[0] is routing:
            self._apply(last[1], self._values.encode(values), last[2])
        else:
            self._apply(self._encoded(routing), self._values.encode(values))

    def _apply(
        self,
        stored_keys: list[bytes],
        stored: list[bytes | None],
        before: list[bytes | None] | None = None,
    ) -> None:
        """Put each stored value (None: delete its key) in one write batch, keeping the
        count exact (*before*: what the keys hold now, if just read)."""
        self._last_read = None
        self._ingested = None
        if before is None:
            before = self._get(stored_keys)
        wb = self._batch()
        put, delete = wb.put, wb.delete
        change = 0
        for k, v, old in zip(stored_keys, stored, before, strict=True):
            if v is None:
                if old is not None:
                    delete(k)
                    change -= 1
            else:
                put(k, v)
                change += old is None
        self._write(wb)
        self._count += change

    def delete(self, routing: KeyRouting) -> None:
        keys = self._encoded(routing)
        self._apply(keys, [None] * len(keys))

    def read_python(self, routing: KeyRouting) -> list[Any]:
        return from_column(self.descriptor.kind, self.read(routing))

    def write_python(self, routing: KeyRouting, entries: list[Any]) -> None:
        self.write(routing, self.column(entries))

    # -- snapshots and restores -----------------------------------------------------------------
    def entries(self) -> tuple[npt.NDArray[np.int64], pa.Array, pa.Array]:
        """Every entry, in stored order. Scanned and decoded in slices of
        :data:`_LOAD_SLICE` rows, so that the stored forms (Python bytes) of one slice at a
        time are alive beside the columns."""
        groups: list[npt.NDArray[np.int64]] = []
        key_parts: list[pa.Array] = []
        value_parts: list[pa.Array] = []
        rows = iter(self._view().items())
        while True:
            try:  # the scan's errors are the backend's; a value that does not decode is damage
                chunk = list(islice(rows, _LOAD_SLICE))
            except Exception as e:
                raise _translate(e, f"scanning state {self.descriptor.name!r}") from e
            if not chunk:
                break
            kgs, keys = self._keys.decode([k for k, _ in chunk])
            values = self._values.decode([v for _, v in chunk])
            del chunk
            groups.append(kgs)
            key_parts.append(keys)
            value_parts.append(values)
        if not groups:
            kgs, keys = self._keys.decode([])
            return kgs, keys, self._values.decode([])
        return (
            np.concatenate(groups),
            pa.concat_arrays(key_parts),
            pa.concat_arrays(value_parts),
        )

    def current(self, groups: list[int], keys: list[list[Any]]) -> tuple[pa.Array, list[bool]]:
        stored_keys = [
            self._keys.one(kg, k) for kg, ks in zip(groups, keys, strict=True) for k in ks
        ]
        found = self._get(stored_keys)
        return self._values.decode(found), [v is not None for v in found]

    def load(
        self,
        key_groups: npt.NDArray[np.int64],
        keys: pa.Array,
        values: pa.Array,
        deleted: npt.NDArray[np.bool_] | None,
    ) -> None:
        if len(keys) == 0:
            return
        # the distinct keys in stored order (a repeat keeps its last row): a file needs
        # that order, and a write batch's count needs each key once
        order = self._keys.ascending(key_groups, keys)
        groups = set(key_groups[np.append(True, np.diff(key_groups) != 0)].tolist())
        if (
            self._ingested is not None
            and self._ingested.isdisjoint(groups)
            and deleted is None
            and values.null_count == 0
        ):
            # a FULL blob of key groups the table holds nothing of (a restore's first blobs,
            # one per old subtask at a rescale): written as one sorted file and ingested,
            # without reading anything first or a write batch per key
            self._ingest(key_groups, keys, values, order)
            self._ingested |= groups
            return
        # in slices, so the stored forms (Python bytes) of one slice at a time are alive
        for start in range(0, len(order), _LOAD_SLICE):
            at = order[start : start + _LOAD_SLICE]
            taken = pa.array(at)
            stored = self._values.encode(values.take(taken))
            if deleted is not None:
                gone = deleted[at].tolist()
                stored = [None if g else v for v, g in zip(stored, gone, strict=True)]
            self._apply(self._keys.encode(key_groups[at], keys.take(taken)), stored)

    def _ingest(
        self,
        key_groups: npt.NDArray[np.int64],
        keys: pa.Array,
        values: pa.Array,
        order: npt.NDArray[np.int64],
    ) -> None:
        """Write the rows at *order* (distinct keys in stored order, none of which exists)
        into one SST file and ingest it into the column family (moved, not copied). O(rows)
        in C plus one call per row into the file writer."""
        from rocksdict import IngestExternalFileOptions, Options, SstFileWriter

        path = os.path.join(self._instance.path, f"load-{uuid.uuid4().hex}.sst")
        try:
            writer = SstFileWriter(Options(raw_mode=True))
            writer.open(path)
            # in slices, so the stored forms (Python bytes) of one slice at a time are alive
            for start in range(0, len(order), _LOAD_SLICE):
                at = order[start : start + _LOAD_SLICE]
                taken = pa.array(at)
                stored_keys = self._keys.encode(key_groups[at], keys.take(taken))
                stored = self._values.encode(values.take(taken))
                deque(map(writer.__setitem__, stored_keys, stored), 0)
            writer.finish()
            ingest = IngestExternalFileOptions()
            ingest.set_move_files(True)
            self._view().ingest_external_file([path], ingest)
        except Exception as e:
            raise _translate(e, f"loading state {self.descriptor.name!r}") from e
        finally:
            if os.path.exists(path):
                os.remove(path)
        self._count += len(order)

    def migrate(
        self, migration: Callable[[pa.Array], pa.Array], descriptor: StateDescriptor
    ) -> None:
        kgs, keys, values = self.entries()
        migrated = migration(values)
        self.descriptor = descriptor
        self._values = ValueCodec(descriptor.column_type)
        self.load(kgs, keys, migrated, None)  # every key exists: the count stays

    def count(self) -> int:
        return self._count

    def is_empty(self) -> bool:
        return self._count == 0

    def stats(self) -> TableStats:
        def prop(name: str) -> int:
            return int(self._view().property_int_value(name) or 0)

        return TableStats(
            self._count,
            prop("rocksdb.cur-size-all-mem-tables"),
            prop("rocksdb.total-sst-files-size"),
        )


_STAT = re.compile(r"rocksdb\.block\.cache\.(hit|miss) COUNT : (\d+)")


class RocksDBStorage(StateStorage):
    """The ``rocksdb`` backend of one subtask backend: one RocksDB instance, opened on first
    use in the local directory of *options*, one column family per keyed state."""

    name = "rocksdb"

    def __init__(self, options: RocksDBOptions, label: str, key_type: pa.DataType) -> None:
        self._options = options
        self._label = label
        self._key_type = key_type
        self._instance: _Instance | None = None
        self._families = 0

    def _open(self) -> _Instance:
        if self._instance is None:
            self._instance = _Instance(self._options, self._label)
        return self._instance

    @property
    def path(self) -> str | None:
        """The instance's directory (None: not opened yet)."""
        return None if self._instance is None else self._instance.path

    def new_table(self, descriptor: StateDescriptor) -> StateTable:
        self._families += 1
        return RocksDBStateTable(descriptor, self._open(), f"s{self._families}", self._key_type)

    def stats(self, tables: list[StateTable]) -> StorageMetrics:
        parts = [t.stats() for t in tables]
        hits = misses = cache = 0
        if self._instance is not None:
            db = self._instance.db
            cache = int(db.property_int_value("rocksdb.block-cache-usage") or 0)
            for kind, count in _STAT.findall(db.property_value("rocksdb.options-statistics") or ""):
                if kind == "hit":
                    hits = int(count)
                else:
                    misses = int(count)
        return StorageMetrics(
            self.name,
            sum(p.entries for p in parts),
            sum(p.memory_bytes for p in parts) + cache,
            sum(p.disk_bytes for p in parts),
            hits,
            misses,
        )

    def close(self) -> None:
        if self._instance is not None:
            self._instance.close()

"""An executor-wide cache of subtask state images, fenced by Spark's own state.

A subtask that runs inside a stateful streaming operator keyed by subtask id
(``groupBy("subtask").applyInPandasWithState(...)``) stays on one executor across
micro-batches (Spark's ``StateStoreCoordinator`` pins the state-store partition), but the
Python worker that runs it may change from one micro-batch to the next (measured in
``bench/README.md``, the locality bench). So the subtask's state is cached where every Python
worker of the executor reaches it, and no other executor does: Arrow IPC files under the
executor's own local directory, memory-mapped on read (zero copy).

**Where.** :func:`executor_cache_dir`: ``<first of SPARK_LOCAL_DIRS>/spark-ckpt-state-cache``.
Spark sets ``SPARK_LOCAL_DIRS`` for every Python worker it starts to its executor's block
manager directories (``blockmgr-<uuid>``), which the executor creates at its start and deletes
when it stops. The directory's name is the executor's identity (:func:`executor_identity`): a
restarted executor is another one.

**Layout.** ``<cache>/<sha256(root)[:16]>/<subtask>/r-<sha256(run id)[:16]>/b<batch>-<token>/``
holds one entry: ``t<i>.arrow`` (an Arrow IPC file per table) and ``meta.json`` (the fence,
the tables' names and the caller's metadata), written under a temporary name and renamed into
place: a reader sees a complete entry or none. The token is unique per attempt
(:func:`attempt_token`), so a retried, speculative or zombie attempt never replaces another
attempt's entry.

**Fence.** A :class:`Fence` (run id, batch id, token, writer's executor) is what the task keeps
in Spark's state for the subtask (schema :data:`FENCE_SCHEMA`). Spark versions that state per
micro-batch, so the fence read at the start of a micro-batch names exactly the entry the
previous committed micro-batch wrote, and :meth:`ExecutorStateCache.lookup` uses that entry and
no other. Anything else is a miss with a reason (:class:`MissReason`); the caller then rebuilds
the state from its durable copy.

**Eviction.** Publishing batch *b* after reading fence *p* removes the subtask's entries of
other runs and of batches before *p* (a retry of *b* still finds *p*'s); temporary entries of
those batches go once abandoned (:data:`ABANDONED_AFTER_S`), so an attempt still writing is
never cut short. Entries of a subtask that moved stay on the old executor until it stops.

Nothing here needs a SparkSession: :func:`attempt_token` and :func:`current_batch_id` read
pyspark's ``TaskContext`` when there is one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import pyarrow as pa

from spark_ckpt.errors import EnvironmentSetupError, StateError, StoreError
from spark_ckpt.runtime.stage import FIRST_STAGE_VERTEX

CACHE_DIR_NAME = "spark-ckpt-state-cache"
FORMAT_VERSION = 1
FENCE_SCHEMA = "run_id string, batch_id long, token string, executor string"
"""The fence's columns in Spark's state, as a DDL string (``applyInPandasWithState``'s
``stateStructType``)."""

ABANDONED_AFTER_S = 600.0
"""A temporary entry (of a batch eviction drops) untouched this long is a dead writer's."""

_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,96}")
_ENTRY = re.compile(r"(?:\.tmp-)?b(\d{12})-")
_PUBLISHED = re.compile(r"b(\d+)-")
_META = "meta.json"
#: The file of an entry that holds its fence and metadata (written last).
ENTRY_META = _META


class MissReason(StrEnum):
    """Why a lookup found no usable state image."""

    NO_FENCE = (
        "no_fence"  # Spark's state holds no fence: the subtask's first batch (or a fresh state)
    )
    NO_ENTRY = "no_entry"  # this executor holds no entry of the subtask in this run
    STALE_FENCE = "stale_fence"  # entries exist, none is the fence's; or the fence is another run's
    OTHER_EXECUTOR = "other_executor"  # the fence was written on another executor
    UNREADABLE = "unreadable"  # the fence's entry vanished while read, or is damaged


@dataclass(frozen=True)
class CacheKey:
    """Whose state: a subtask of a stage (*vertex*) of a run of the pipeline at *root*."""

    root: str
    run_id: str
    subtask: int
    vertex: str = FIRST_STAGE_VERTEX

    def __post_init__(self) -> None:
        if self.subtask < 0:
            raise StateError(f"subtask must be >= 0, got {self.subtask}")


@dataclass(frozen=True)
class Fence:
    """Which entry holds a subtask's state after a micro-batch: kept in Spark's state for the
    subtask (:data:`FENCE_SCHEMA`; :meth:`to_row` / :meth:`from_row`)."""

    run_id: str
    batch_id: int
    token: str
    executor: str

    def to_row(self) -> tuple[str, int, str, str]:
        """The fence as the tuple ``GroupState.update`` takes."""
        return (self.run_id, self.batch_id, self.token, self.executor)

    @classmethod
    def from_row(cls, row: Sequence[Any] | None) -> Fence | None:
        """The fence of a ``GroupState.get`` tuple (``None`` for no state)."""
        if row is None:
            return None
        run_id, batch_id, token, executor = row
        return cls(str(run_id), int(batch_id), str(token), str(executor))


@dataclass(frozen=True)
class StateImage:
    """A subtask's state: named Arrow tables and small JSON-compatible metadata."""

    tables: Mapping[str, pa.Table]
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Lookup:
    """The result of :meth:`ExecutorStateCache.lookup`: the image (a hit) or the reason of
    the miss."""

    image: StateImage | None
    miss: MissReason | None
    nbytes: int = 0  # the size of the mapped files (a hit)

    @property
    def hit(self) -> bool:
        return self.image is not None


@dataclass
class CacheCounters:
    """What one process's lookups and publishes did, for checkpoint statistics. Counters of
    several workers add up with ``+``."""

    hits: int = 0
    misses: dict[str, int] = field(default_factory=lambda: {r.value: 0 for r in MissReason})
    publishes: int = 0
    evicted: int = 0
    bytes_written: int = 0
    bytes_mapped: int = 0

    def record(self, lookup: Lookup) -> None:
        if lookup.miss is None:
            self.hits += 1
        else:
            self.misses[lookup.miss.value] += 1

    @property
    def lookups(self) -> int:
        return self.hits + sum(self.misses.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "hits": self.hits,
            "misses": dict(self.misses),
            "publishes": self.publishes,
            "evicted": self.evicted,
            "bytes_written": self.bytes_written,
            "bytes_mapped": self.bytes_mapped,
        }

    def __add__(self, other: CacheCounters) -> CacheCounters:
        misses = {k: self.misses.get(k, 0) + other.misses.get(k, 0) for k in self.misses}
        return CacheCounters(
            self.hits + other.hits,
            misses,
            self.publishes + other.publishes,
            self.evicted + other.evicted,
            self.bytes_written + other.bytes_written,
            self.bytes_mapped + other.bytes_mapped,
        )


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def entry_name(batch_id: int, token: str) -> str:
    return f"b{batch_id:012d}-{token}"


def published_entry_batch(name: str) -> int | None:
    """The micro-batch of an entry directory named by :func:`entry_name` (None for any
    other name, a temporary one included)."""
    match = _PUBLISHED.match(name)
    return int(match.group(1)) if match else None


def _entry_batch(name: str) -> int | None:
    match = _ENTRY.match(name)
    return int(match.group(1)) if match else None


class ExecutorStateCache:
    """Subtask state images in *directory*, shared by the processes of the executor
    *executor* (see the module docstring). Thread- and process-safe: entries are immutable
    once published, published and removed by renames."""

    def __init__(self, directory: str | os.PathLike[str], executor: str) -> None:
        self.directory = Path(directory)
        self.executor = executor
        self.counters = CacheCounters()
        self._lock = threading.Lock()

    @classmethod
    def for_this_executor(cls) -> ExecutorStateCache:
        """This process's cache of the executor that runs it (one per process, so that its
        counters add up over the tasks the process runs). Raises
        :class:`~spark_ckpt.errors.EnvironmentSetupError` outside a Spark Python worker."""
        global _THIS_EXECUTOR
        with _SINGLETON_LOCK:
            if _THIS_EXECUTOR is None:
                _THIS_EXECUTOR = cls(executor_cache_dir(), executor_identity())
            return _THIS_EXECUTOR

    # -- paths ---------------------------------------------------------------------------

    def _subtask_dir(self, key: CacheKey) -> Path:
        return self.directory / _digest(key.root) / str(key.subtask)

    def _run_dir(self, key: CacheKey) -> Path:
        return self._subtask_dir(key) / f"r-{_digest(key.run_id)}"

    def entries(self, key: CacheKey) -> list[tuple[int, str]]:
        """The published entries of *key*: ``(batch id, token)``, in batch order."""
        try:
            names = os.listdir(self._run_dir(key))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            batch = _entry_batch(name)
            if batch is not None and not name.startswith("."):
                out.append((batch, name[len(entry_name(batch, "")) :]))
        return sorted(out)

    # -- read ----------------------------------------------------------------------------

    def lookup(self, key: CacheKey, fence: Fence | None) -> Lookup:
        """The image the fence names, memory-mapped, if this executor holds it; else the
        reason of the miss. Never raises for a missing or damaged entry (a miss)."""
        result = self._lookup(key, fence)
        with self._lock:
            self.counters.record(result)
            self.counters.bytes_mapped += result.nbytes
        return result

    def _lookup(self, key: CacheKey, fence: Fence | None) -> Lookup:
        if fence is None:
            return Lookup(None, MissReason.NO_FENCE)
        if fence.run_id != key.run_id:
            return Lookup(None, MissReason.STALE_FENCE)
        if fence.executor != self.executor:
            return Lookup(None, MissReason.OTHER_EXECUTOR)
        if not _TOKEN.fullmatch(fence.token):
            return Lookup(None, MissReason.STALE_FENCE)
        path = self._run_dir(key) / entry_name(fence.batch_id, fence.token)
        try:
            image, nbytes = read_entry(path, fence)
        except FileNotFoundError:
            entries = self.entries(key)
            if (fence.batch_id, fence.token) in entries:  # there, but a file of it is not
                return Lookup(None, MissReason.UNREADABLE)
            return Lookup(None, MissReason.STALE_FENCE if entries else MissReason.NO_ENTRY)
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
            return Lookup(None, MissReason.UNREADABLE)
        return Lookup(image, None, nbytes)

    # -- write ---------------------------------------------------------------------------

    def publish(
        self,
        key: CacheKey,
        batch_id: int,
        image: StateImage,
        *,
        token: str,
        previous: Fence | None,
    ) -> Fence:
        """Publish *image* as the subtask's state after micro-batch *batch_id*, written by the
        attempt *token* (:func:`attempt_token`); *previous* is the fence this attempt read at
        its start. Returns the fence to keep in Spark's state. Then evicts the subtask's
        entries of other runs and of batches before ``previous.batch_id`` (before *batch_id*
        without a previous fence of this run). Raises
        :class:`~spark_ckpt.errors.StoreError` when the entry cannot be written."""
        if not _TOKEN.fullmatch(token):
            raise StateError(f"attempt token must match {_TOKEN.pattern}, got {token!r}")
        if batch_id < 0:
            raise StateError(f"batch id must be >= 0, got {batch_id}")
        fence = Fence(key.run_id, batch_id, token, self.executor)
        run_dir = self._run_dir(key)
        final = run_dir / entry_name(batch_id, token)
        tmp = run_dir / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir(parents=True)
            written = write_entry(tmp, fence, image)
            os.rename(tmp, final)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StoreError(
                f"executor state cache: cannot publish subtask {key.subtask} batch {batch_id}"
                f" under {run_dir}: {e}"
            ) from e
        keep_from = (
            previous.batch_id
            if previous is not None and previous.run_id == key.run_id
            else batch_id
        )
        evicted = self.evict(key, keep_from)
        with self._lock:
            self.counters.publishes += 1
            self.counters.bytes_written += written
            self.counters.evicted += evicted
        return fence

    def evict(self, key: CacheKey, keep_from: int) -> int:
        """Remove the subtask's entries of other runs and of batches before *keep_from*, and
        its temporary entries of those batches untouched for :data:`ABANDONED_AFTER_S` (a
        writer still at work, a zombie, keeps its own); returns how many published entries
        went. Readers of a removed entry that mapped it already keep their mapping."""
        subtask_dir = self._subtask_dir(key)
        run_dir = self._run_dir(key)
        removed = 0
        try:
            runs = os.listdir(subtask_dir)
        except FileNotFoundError:
            return 0
        for name in runs:
            if name != run_dir.name:
                removed += self._discard(subtask_dir / name, count_entries=True)
        try:
            names = os.listdir(run_dir)
        except FileNotFoundError:
            return removed
        now = time.time()
        for name in names:
            batch = _entry_batch(name)
            if batch is None or batch >= keep_from:
                continue
            if name.startswith("."):  # a temporary entry: may still be written (a zombie)
                try:
                    if now - os.stat(run_dir / name).st_mtime < ABANDONED_AFTER_S:
                        continue
                except FileNotFoundError:
                    continue
            removed += self._discard(run_dir / name, count_entries=False)
        return removed

    def _discard(self, path: Path, *, count_entries: bool) -> int:
        """Move *path* out of sight in one rename, then delete it; the number of published
        entries it held (0 if another process removed it first)."""
        trash = self.directory / f".trash-{uuid.uuid4().hex}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return 0
        if count_entries:
            n = sum(1 for e in os.listdir(trash) if not e.startswith("."))
        else:
            n = 0 if path.name.startswith(".") else 1
        shutil.rmtree(trash, ignore_errors=True)
        return n


def write_entry(directory: Path, fence: Fence, image: StateImage) -> int:
    """Write *image* as an entry into the (new, empty) *directory*: an Arrow IPC file per
    table and ``meta.json`` with the fence; returns the bytes written."""
    tables = []
    written = 0
    for i, (name, table) in enumerate(image.tables.items()):
        file = f"t{i}.arrow"
        with pa.OSFile(str(directory / file), "wb") as sink:
            with pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            size = sink.tell()
        written += size
        tables.append({"name": name, "file": file, "rows": table.num_rows, "bytes": size})
    data = entry_meta_bytes(fence, image, tables)
    (directory / _META).write_bytes(data)
    return written + len(data)


def encode_entry(fence: Fence, image: StateImage) -> list[tuple[str, bytes]]:
    """*image* as an entry's files, in memory: an Arrow IPC file per table, then
    ``meta.json`` (last: its presence says the entry is complete, where files cannot be
    renamed into place)."""
    files: list[tuple[str, bytes]] = []
    tables = []
    for i, (name, table) in enumerate(image.tables.items()):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        data = sink.getvalue().to_pybytes()
        files.append((f"t{i}.arrow", data))
        tables.append(
            {"name": name, "file": files[-1][0], "rows": table.num_rows, "bytes": len(data)}
        )
    files.append((_META, entry_meta_bytes(fence, image, tables)))
    return files


def entry_meta_bytes(fence: Fence, image: StateImage, tables: list[dict[str, Any]]) -> bytes:
    """The ``meta.json`` of an entry of *image* whose tables are *tables*."""
    meta = {
        "format": FORMAT_VERSION,
        "run_id": fence.run_id,
        "batch_id": fence.batch_id,
        "token": fence.token,
        "executor": fence.executor,
        "tables": tables,
        "meta": dict(image.meta),
    }
    return json.dumps(meta, sort_keys=True).encode()


def parse_entry_meta(data: bytes, fence: Fence | None = None) -> dict[str, Any]:
    """An entry's ``meta.json`` (all of it); ``ValueError`` unless in a known format and,
    given *fence*, the entry of that fence."""
    meta = json.loads(data)
    if meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"cache entry format {meta.get('format')!r}")
    if fence is not None and (meta["run_id"], meta["batch_id"], meta["token"]) != (
        fence.run_id,
        fence.batch_id,
        fence.token,
    ):
        raise ValueError("cache entry does not match its name")
    return dict(meta)


def read_entry_meta(path: Path) -> dict[str, Any]:
    """The image metadata of the entry at *path* (its tables unread); ``ValueError`` unless
    in a known format."""
    return dict(parse_entry_meta((path / _META).read_bytes())["meta"])


def read_entry(path: Path, fence: Fence) -> tuple[StateImage, int]:
    """The image of the entry at *path*, memory-mapped, and its size; ``ValueError`` unless
    it is the entry of *fence* in a known format."""
    meta = parse_entry_meta((path / _META).read_bytes(), fence)
    tables: dict[str, pa.Table] = {}
    size = 0
    for entry in meta["tables"]:
        with pa.memory_map(str(path / entry["file"]), "r") as source:
            tables[entry["name"]] = pa.ipc.open_file(source).read_all()
        size += int(entry["bytes"])
    return StateImage(tables, dict(meta["meta"])), size


_THIS_EXECUTOR: ExecutorStateCache | None = None
_SINGLETON_LOCK = threading.Lock()


def _local_dir(env: Mapping[str, str]) -> Path:
    dirs = [d for d in env.get("SPARK_LOCAL_DIRS", "").split(",") if d.strip()]
    if not dirs:
        raise EnvironmentSetupError(
            "no executor local directory: SPARK_LOCAL_DIRS is set by Spark for its Python"
            " workers only; outside one, give ExecutorStateCache a directory"
        )
    return Path(dirs[0].strip())


def executor_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The cache directory of the executor running this Python worker (see the module
    docstring); created on first publish."""
    return _local_dir(os.environ if env is None else env) / CACHE_DIR_NAME


def executor_identity(env: Mapping[str, str] | None = None) -> str:
    """The identity of the executor running this Python worker: the name of its block
    manager directory (``blockmgr-<uuid>``), unique per executor process."""
    return _local_dir(os.environ if env is None else env).name


def attempt_token() -> str:
    """A token unique to this attempt of this task (and to this call): the task attempt id
    and attempt number when a ``TaskContext`` exists, and random bits."""
    rand = uuid.uuid4().hex[:12]
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return rand
    tc = TaskContext.get()
    if tc is None:
        return rand
    return f"t{tc.taskAttemptId()}a{tc.attemptNumber()}-{rand}"


def current_batch_id() -> int | None:
    """The micro-batch id of the streaming query this task belongs to (Spark's local
    property ``streaming.sql.batchId``), or None outside a streaming task."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return None
    tc = TaskContext.get()
    value = tc.getLocalProperty("streaming.sql.batchId") if tc is not None else None
    return int(value) if value is not None else None

"""Savepoint directories: self-contained savepoints on disk, and finding checkpoints in time.

A savepoint lives in its own directory, ``<savepoint dir>/savepoint-<pipeline>-<id>``, which
is itself a checkpoint-store root (:mod:`spark_ckpt.delta.store_layout`): the four Delta
tables ``checkpoints`` (one lease row and one ``completed`` row: the savepoint's metadata
JSON and checksum, with the properties ``pipeline``, ``max_parallelism`` and ``format``),
``operator_state`` (every keyed and operator state blob as a FULL blob written by the
savepoint itself: Arrow IPC payloads with their checksums), ``channel_state`` (empty:
savepoints are aligned) and ``source_offsets`` (each source channel's position), and
for ``source=files`` the listing of the directory (``_sources/files.jsonl``). It
references nothing outside itself, so it can be copied or moved to another path or machine
and restored from there; retention of the pipeline's root never touches it.

The online export (:func:`export_savepoint`) runs in the coordinator host when a savepoint
completes; :func:`open_savepoint` opens one for a restore or offline reading (every error
reading a damaged savepoint names its directory);
:func:`list_savepoints` and :func:`dispose_savepoint` back the CLI and the client;
:func:`checkpoint_as_of` finds "the latest completed checkpoint at or before T" from the
completion times a root's log and statistics history record.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
import pyarrow.fs as pafs

from spark_ckpt.delta.boundary import delta_boundary
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    RestoreError,
    StoreError,
)
from spark_ckpt.locations.uris import filesystem, join, normalized
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.state_handles import BlobRef
from spark_ckpt.runtime.restore_settings import MAX_PARALLELISM, PIPELINE
from spark_ckpt.sources.files.file_listing import export_listing
from spark_ckpt.storage.checkpoint_store import StateStorage
from spark_ckpt.storage.history import completed_as_of
from spark_ckpt.storage.transfer import copy_checkpoint

log = logging.getLogger(__name__)

#: Version of the savepoint directory layout (the ``format`` property).
FORMAT_VERSION = "1"
FORMAT = "format"
#: Completed-checkpoint property: where the coordinator exported a savepoint.
SAVEPOINT_PATH = "savepoint_path"
#: Completed-checkpoint property: the directory a savepoint was requested into.
SAVEPOINT_DIR = "savepoint_dir"
#: Where savepoints go when neither the request nor ``savepoint.dir`` names a directory.
DEFAULT_SUBDIR = "savepoints"


def savepoint_directory(root: str, checkpoint: CompletedCheckpoint) -> str:
    """The directory a savepoint of *root* goes into: the requested one (target or
    ``savepoint.dir``), else ``<root>/savepoints``."""
    directory = checkpoint.properties.get(SAVEPOINT_DIR) or join(root, DEFAULT_SUBDIR)
    return normalized(directory)


def savepoint_path(directory: str, pipeline: str, checkpoint_id: int) -> str:
    """``<directory>/savepoint-<pipeline>-<id>``."""
    return join(directory, f"savepoint-{pipeline}-{checkpoint_id}")


@dataclass(frozen=True)
class Savepoint:
    """A savepoint directory and the savepoint it holds."""

    path: str
    checkpoint: CompletedCheckpoint

    @property
    def pipeline(self) -> str:
        return self.checkpoint.properties.get(PIPELINE, "")


def export_savepoint(
    source: StateStorage,
    checkpoint: CompletedCheckpoint,
    directory: str,
    *,
    pipeline: str,
    max_parallelism: int,
    root: str | None = None,
) -> Savepoint:
    """Write *checkpoint* (a completed savepoint of a pipeline's root, read from *source*)
    into its own directory under *directory*; idempotent (a savepoint already exported
    there is returned as it is). Raises :class:`StoreError` if the directory holds
    something else. The files source's listing of the pipeline root *root*, if any, goes
    with it (:func:`~spark_ckpt.sources.files.file_listing.export_listing`), before the
    savepoint's log row that makes the copy complete."""
    path = savepoint_path(directory, pipeline, checkpoint.checkpoint_id)
    store = DeltaCheckpointStore(path)
    existing = store.list_completed()
    if existing:
        if [c.checkpoint_id for c in existing] != [checkpoint.checkpoint_id]:
            raise StoreError(f"{path} holds other checkpoints: not exporting savepoint there")
        return Savepoint(path, existing[0])
    properties = dict(checkpoint.properties)
    properties.update(
        {PIPELINE: pipeline, MAX_PARALLELISM: str(max_parallelism), FORMAT: FORMAT_VERSION}
    )
    properties.pop(SAVEPOINT_PATH, None)
    if root is not None:
        export_listing(root, path)
    lease = store.acquire()
    copy = copy_checkpoint(
        source,
        checkpoint,
        store,
        store,
        lease,
        checkpoint_id=checkpoint.checkpoint_id,
        snapshot_type=SnapshotType.SAVEPOINT,
        properties=properties,
    )
    log.info("savepoint %d exported to %s", checkpoint.checkpoint_id, path)
    return Savepoint(path, copy)


def _exists(path: str) -> bool:
    fs, where = filesystem(path)
    return fs.get_file_info(where).type is not pafs.FileType.NotFound


#: What only a pipeline's root holds (runs, mailbox): never mistaken for a savepoint.
ROOT_MARKERS = ("_runs", "_mailbox", "_spark")


def _is_pipeline_root(path: str) -> bool:
    return any(_exists(join(path, marker)) for marker in ROOT_MARKERS)


@contextmanager
def _naming(path: str) -> Iterator[None]:
    """A :class:`StoreError` raised inside names the savepoint directory *path* (a damaged
    data file is otherwise named by its file name only), keeping its class and checkpoint."""
    try:
        yield
    except StoreError as e:
        if path in str(e):
            raise
        message = f"savepoint {path}: {e}"
        if isinstance(e, CorruptCheckpointError):
            raise CorruptCheckpointError(message, checkpoint_id=e.checkpoint_id) from e
        if isinstance(e, CheckpointNotFoundError):
            raise CheckpointNotFoundError(message) from e
        raise StoreError(message) from e


class SavepointStore(DeltaCheckpointStore):
    """The checkpoint store of a savepoint directory (see :func:`open_savepoint`): what it
    reads for a restore or offline (the listing, verification, blobs) raises errors naming
    the directory."""

    def list_completed(self) -> list[CompletedCheckpoint]:
        with _naming(self.root):
            return super().list_completed()

    def verify(self, checkpoint: CompletedCheckpoint) -> None:
        with _naming(self.root):
            super().verify(checkpoint)

    def read_blob(self, ref: BlobRef) -> pa.Table:
        with _naming(self.root):
            return super().read_blob(ref)

    def read_blobs(self, refs: Sequence[BlobRef]) -> list[pa.Table]:
        with _naming(self.root):
            return super().read_blobs(refs)


def open_savepoint(path: str) -> tuple[DeltaCheckpointStore, Savepoint]:
    """The store of the savepoint directory *path* (a :class:`SavepointStore`) and the
    savepoint in it. Raises :class:`RestoreError` if *path* does not exist or holds no
    savepoint, a :class:`StoreError` naming *path* (:class:`CorruptCheckpointError` for a
    damaged data file) if its checkpoint log cannot be read."""
    if not _exists(path):
        raise RestoreError(f"no savepoint at {path}: the directory does not exist")
    store = SavepointStore(path)
    try:
        found = store.list_completed()
    except CheckpointNotFoundError:
        found = []
    savepoints = [c for c in found if c.is_savepoint and FORMAT in c.properties]
    if len(savepoints) != 1 or len(found) != 1 or _is_pipeline_root(path):
        raise RestoreError(
            f"{path} is not a savepoint directory (no single exported savepoint in it)"
        )
    return store, Savepoint(path, savepoints[0])


def list_savepoints(directory: str) -> list[Savepoint]:
    """The savepoint directories directly under *directory*, oldest savepoint first
    (directories that are not savepoints are skipped). Empty if *directory* is absent."""
    if not _exists(directory):
        return []
    fs, where = filesystem(directory)
    found: list[Savepoint] = []
    for info in fs.get_file_info(pafs.FileSelector(where)):
        if info.type is not pafs.FileType.Directory or not info.base_name.startswith("savepoint-"):
            continue
        path = join(directory, info.base_name)
        try:
            found.append(open_savepoint(path)[1])
        except (RestoreError, StoreError) as e:
            log.warning("skipping %s: %s", path, e)
    return sorted(found, key=lambda s: (s.checkpoint.stats.completed_ms, s.path))


def dispose_savepoint(path: str) -> Savepoint:
    """Delete the savepoint directory *path* (Flink's ``savepoint --dispose``); refuses a
    directory that is not a savepoint. Returns what was deleted."""
    _, savepoint = open_savepoint(path)
    fs, where = filesystem(path)
    with delta_boundary(f"dispose savepoint {path}", StoreError):
        fs.delete_dir(where)
    return savepoint


def checkpoint_as_of(root: str, time: datetime) -> int:
    """The id of the latest checkpoint that had completed at or before *time* in the root
    *root*, from the completion times its log and its statistics history record
    (:func:`~spark_ckpt.storage.history.completed_as_of`: a checkpoint retention removed
    later is found too, and then refused by the caller as not retained). Raises
    :class:`RestoreError` if the root has no checkpoint log, or no checkpoint it knows had
    completed then."""
    times, floor = DeltaCheckpointStore(root).completion_times()
    at = time.isoformat()
    if not times and floor == 0:
        raise RestoreError(f"no checkpoint of {root} had completed at or before {at}")
    return completed_as_of(times, floor, int(time.timestamp() * 1000), f"{root} (as of {at})")

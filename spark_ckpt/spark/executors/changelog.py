"""The durable changelog of subtasks on the executors: a subtask rebuilds its state anywhere.

Every micro-batch, a subtask on the executors publishes a segment into this changelog, under
the (local) pipeline root, which outlives the executor and its Python workers. A segment is
the whole state (:data:`~spark_ckpt.runtime.subtask_image.FULL`: the run's first
micro-batch, or when a subtask cannot fold), or what the micro-batch changed
(:data:`~spark_ckpt.runtime.subtask_image.DELTA`: the changed keys, the operator state, the
sink transactions), whether or not it took a checkpoint. Each segment names its predecessor
and the full segment its chain starts at. Once a chain holds :data:`MAX_CHAIN` segments, the
next one is a *fold*: every change since the chain's full segment in one delta, linked
straight to it (a chain of two), naming the segments it replaced. A fold costs what changed
since the full segment, not the state: a large state whose updates keep to a set of keys
never writes itself whole again (the full segment is rewritten only when the subtask cannot
fold: it was rebuilt since, or the fold would hold half its keys,
:func:`~spark_ckpt.runtime.image_history.folded_blobs`).

The subtask's task stays alive in the Python worker that ran it
(:class:`~spark_ckpt.spark.executors.subtask_function.LiveSubtasks`). A worker whose task stands at
an earlier segment of the chain the fence names catches up by the deltas since
(:meth:`SubtaskChangelog.since`, :func:`~spark_ckpt.runtime.subtask_image.catch_up`): the cost
follows what changed. A worker without it (the subtask moved to another executor, its executor was
lost, its worker restarted) rebuilds from the chain the fence names: the full segment, then every
delta in order, exactly its own key groups
(:func:`~spark_ckpt.runtime.subtask_image.import_images`). A segment is named by the fence —
(micro-batch, attempt token) — so both follow exactly the chain of the attempts Spark committed,
never a zombie's.

**Layout.** ``<root>/_changelog/<run id>/<subtask>/b<batch>-<token>/``: an entry in the
executor cache's format (an Arrow IPC file per table, ``meta.json``). On a local root it is
written under a temporary name and renamed into place; on an object store (no rename) each
file is one PUT of the whole file, ``meta.json`` last: a segment without it is incomplete,
and is read as missing (:class:`ObjectSegments`). Cost on an object store: a publish is a
PUT per table plus one, an eviction a listing and a DELETE per object; a rebuild reads the
chain's objects once. **Eviction.** Publishing a segment removes the
subtask's segments older than the full segment its predecessor's chain starts at, and, after
a fold, the segments it replaced (a retry of this micro-batch still finds its predecessor's
chain; a Python worker whose task stands on a replaced segment catches up by the fold,
:meth:`SubtaskChangelog.since`); a run's changelog goes when the run is retired
(:meth:`~spark_ckpt.pipeline.pipeline_run.PipelineRun.retire`) or pruned.

Local and object-store roots alike: a lost executor's subtasks are rebuilt from the root on
any other executor, without restarting the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.fs as pafs

from spark_ckpt.errors import StoreError
from spark_ckpt.locations.objects import write_whole
from spark_ckpt.locations.uris import filesystem, is_remote, join
from spark_ckpt.runtime.stage import FIRST_STAGE_VERTEX
from spark_ckpt.runtime.subtask_image import FULL, SubtaskImage
from spark_ckpt.spark.executors.executor_cache import (
    ENTRY_META,
    Fence,
    StateImage,
    encode_entry,
    entry_name,
    parse_entry_meta,
    published_entry_batch,
    read_entry,
    read_entry_meta,
    write_entry,
)

CHANGELOG_DIR = "_changelog"
#: Segments after which a subtask folds its chain (bounds a rebuild's chain).
MAX_CHAIN = 20
#: The executor name in a changelog segment's fence (segments belong to no executor).
DURABLE = "durable"


@dataclass(frozen=True)
class Segment:
    """A published segment: its fence's (batch, token), and the (batch, token) of the full
    segment its chain starts at, with the chain's length."""

    batch_id: int
    token: str
    base: tuple[int, str]
    length: int


class SegmentFiles(Protocol):
    """Where one subtask's segments live: named entries (see the module docstring). Reads
    raise ``OSError`` (``FileNotFoundError``: missing), ``ValueError`` or Arrow's errors;
    :meth:`publish` raises :class:`StoreError`."""

    where: str

    def publish(self, name: str, fence: Fence, image: StateImage) -> None: ...

    def meta(self, name: str) -> dict[str, Any]: ...

    def read(self, name: str, fence: Fence) -> StateImage: ...

    def names(self) -> list[str]: ...

    def remove(self, name: str) -> None: ...


class LocalSegments:
    """A local root's segments: directories renamed into place, tables memory-mapped."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.where = str(directory)

    def publish(self, name: str, fence: Fence, image: StateImage) -> None:
        final = self.directory / name
        tmp = self.directory / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir(parents=True)
            write_entry(tmp, fence, image)
            os.rename(tmp, final)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StoreError(f"changelog: cannot publish {final}: {e}") from e

    def meta(self, name: str) -> dict[str, Any]:
        return read_entry_meta(self.directory / name)

    def read(self, name: str, fence: Fence) -> StateImage:
        return read_entry(self.directory / name, fence)[0]

    def names(self) -> list[str]:
        try:
            return os.listdir(self.directory)
        except OSError:
            return []

    def remove(self, name: str) -> None:
        shutil.rmtree(self.directory / name, ignore_errors=True)


class ObjectSegments:
    """An object-store root's segments: each file one whole PUT, ``meta.json`` last."""

    def __init__(self, uri: str) -> None:
        self.where = uri
        self._fs, self._base = filesystem(uri)

    def publish(self, name: str, fence: Fence, image: StateImage) -> None:
        for file, data in encode_entry(fence, image):  # meta.json last
            write_whole(self._fs, f"{self._base}/{name}/{file}", data)

    def _bytes(self, path: str) -> bytes:
        with self._fs.open_input_stream(path) as f:
            return bytes(f.read())

    def meta(self, name: str) -> dict[str, Any]:
        return dict(parse_entry_meta(self._bytes(f"{self._base}/{name}/{ENTRY_META}"))["meta"])

    def read(self, name: str, fence: Fence) -> StateImage:
        meta = parse_entry_meta(self._bytes(f"{self._base}/{name}/{ENTRY_META}"), fence)
        tables = {
            entry["name"]: pa.ipc.open_file(
                pa.BufferReader(self._bytes(f"{self._base}/{name}/{entry['file']}"))
            ).read_all()
            for entry in meta["tables"]
        }
        return StateImage(tables, dict(meta["meta"]))

    def names(self) -> list[str]:
        try:
            infos = self._fs.get_file_info(pafs.FileSelector(self._base, allow_not_found=True))
        except OSError:
            return []
        return [i.base_name for i in infos if i.type is pafs.FileType.Directory]

    def remove(self, name: str) -> None:
        with contextlib.suppress(OSError):  # gone already, or the next eviction tries again
            self._fs.delete_dir(f"{self._base}/{name}")


def segment_files(
    root: str, run_id: str, subtask: int, vertex: str = FIRST_STAGE_VERTEX
) -> SegmentFiles:
    """The segments of subtask *subtask* of *vertex* (a stage) of run *run_id* under the
    pipeline root *root*: ``<run>/<subtask>`` for the first stage, ``<run>/<vertex>-<subtask>``
    (the vertex made a file name) for a later one."""
    name = str(subtask)
    if vertex != FIRST_STAGE_VERTEX:
        name = f"{vertex.replace(':', '_')}-{subtask}"
    if is_remote(root):
        return ObjectSegments(join(root, CHANGELOG_DIR, run_id, name))
    return LocalSegments(Path(root) / CHANGELOG_DIR / run_id / name)


class SubtaskChangelog:
    """The changelog of one subtask of one run (see the module docstring). Runs on the
    executors (publish, rebuild) and in the driver (:func:`remove_run`)."""

    def __init__(
        self, root: str, run_id: str, subtask: int, vertex: str = FIRST_STAGE_VERTEX
    ) -> None:
        self.run_id = run_id
        self._files = segment_files(root, run_id, subtask, vertex)
        self.directory = self._files.where

    def publish(
        self,
        batch_id: int,
        token: str,
        image: SubtaskImage,
        previous: Segment | None,
        *,
        executor: str = DURABLE,
        folded: bool = False,
    ) -> Segment:
        """Publish *image* (full, or the changes since *previous*, the segment the
        micro-batch started from) as micro-batch *batch_id*'s segment of attempt *token*,
        written on *executor* (recorded for diagnostics); evicts what no retry can need.
        *folded*: *image* holds every change since the full segment of *previous*'s chain
        (:func:`~spark_ckpt.runtime.subtask_image.export_folded_image`), and is linked
        straight to it (a chain of two), naming the segments it folds so a task standing at
        one of them can still catch up. Raises :class:`StoreError`."""
        full = image.meta.get("kind") == FULL
        if not full and previous is None:
            raise StoreError("a changelog starts with a full segment")
        if folded and (full or previous is None):
            raise StoreError("only a delta segment after another one folds")
        base = (batch_id, token) if full or previous is None else previous.base
        length = 1 if full or previous is None else 2 if folded else previous.length + 1
        link: dict[str, Any] = {"base": list(base), "length": length, "executor": executor}
        meta = {**image.meta, "changelog": link}
        if previous is not None and folded:
            link["previous"] = list(previous.base)
            link["folded"] = [list(at) for at in self._members(previous)]
        elif previous is not None:
            link["previous"] = [previous.batch_id, previous.token]
        fence = Fence(self.run_id, batch_id, token, DURABLE)
        self._files.publish(entry_name(batch_id, token), fence, StateImage(image.tables, meta))
        if previous is not None:
            if previous.length == 2:  # its chain: its full segment and itself
                self._evict(before=previous.batch_id, keep=entry_name(*previous.base))
            else:
                self._evict(before=previous.base[0])
        return Segment(batch_id, token, base, length)

    def _members(self, segment: Segment) -> list[tuple[int, str]]:
        """The segments of *segment*'s chain after its full segment, newest first (read
        from their links)."""
        members: list[tuple[int, str]] = []
        at: tuple[int, str] | None = (segment.batch_id, segment.token)
        while at is not None and at != segment.base:
            members.append(at)
            try:
                link = self._files.meta(entry_name(*at))["changelog"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise StoreError(f"changelog segment {at} is missing or unreadable: {e}") from e
            members.extend((int(b), str(t)) for b, t in link.get("folded", []))
            previous = link.get("previous")
            at = None if previous is None else (int(previous[0]), str(previous[1]))
        return members

    def segment_meta(self, batch_id: int, token: str) -> dict[str, Any]:
        """The metadata of segment (*batch_id*, *token*) ({} when it is missing or
        unreadable)."""
        try:
            return dict(self._files.meta(entry_name(batch_id, token)))
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def newest_segment_metas(self) -> list[dict[str, Any]]:
        """The metadata of the segments of the newest micro-batch in the changelog, one per
        attempt that published it ([] when there is none): where the driver looks for the
        writer of the subtask's last checkpoints
        (:class:`~spark_ckpt.spark.executors.snapshot_threads.LostWriterScan`)."""
        segments = self._segments()
        newest = max((batch for batch, _ in segments), default=None)
        metas = []
        for batch, name in sorted(segments):
            if batch != newest:
                continue
            try:
                metas.append(dict(self._files.meta(name)))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # evicted or half-removed since the listing
        return metas

    def _segments(self) -> list[tuple[int, str]]:
        """The published segments: (micro-batch, directory name)."""
        found = ((published_entry_batch(n), n) for n in self._files.names())
        return [(batch, name) for batch, name in found if batch is not None]

    def chain(self, batch_id: int, token: str) -> tuple[list[SubtaskImage], Segment]:
        """The images of the chain ending at segment (*batch_id*, *token*), full segment
        first, and that segment. Raises :class:`StoreError` when a segment of it is missing
        or unreadable."""
        images: list[SubtaskImage] = []
        at: tuple[int, str] | None = (batch_id, token)
        segment: Segment | None = None
        while at is not None:
            path = f"{self.directory}/{entry_name(*at)}"
            try:
                image = self._files.read(entry_name(*at), Fence(self.run_id, at[0], at[1], DURABLE))
            except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as e:
                raise StoreError(f"changelog segment {path} is missing or unreadable: {e}") from e
            link = image.meta["changelog"]
            if segment is None:
                base = link["base"]
                segment = Segment(at[0], at[1], (int(base[0]), str(base[1])), int(link["length"]))
            images.append(SubtaskImage(image.tables, image.meta))
            if image.meta.get("kind") == FULL:
                break
            previous = link.get("previous")
            at = None if previous is None else (int(previous[0]), str(previous[1]))
        if not images or images[-1].meta.get("kind") != FULL or segment is None:
            raise StoreError(f"changelog of {self.directory} has no full segment before {batch_id}")
        return images[::-1], segment

    def since(
        self, batch_id: int, token: str, after: tuple[int, str]
    ) -> tuple[list[SubtaskImage], Segment] | None:
        """The :data:`~spark_ckpt.runtime.subtask_image.DELTA` images from the segment after
        *after* (a (batch, token) of this subtask's chain) to segment (*batch_id*, *token*),
        oldest first, and that segment: what a task that stands at *after* applies to catch
        up. None when *after* is not on that chain by deltas alone (a full segment in
        between, another attempt's segment, evicted) or a segment is unreadable."""
        images: list[SubtaskImage] = []
        at: tuple[int, str] | None = (batch_id, token)
        segment: Segment | None = None
        while at is not None and at != after:
            if at[0] <= after[0]:
                return None
            try:
                image = self._files.read(entry_name(*at), Fence(self.run_id, at[0], at[1], DURABLE))
            except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
                return None
            if image.meta.get("kind") == FULL:
                return None
            link = image.meta["changelog"]
            if segment is None:
                base = link["base"]
                segment = Segment(at[0], at[1], (int(base[0]), str(base[1])), int(link["length"]))
            images.append(SubtaskImage(image.tables, image.meta))
            if list(after) in link.get("folded", []):
                at = after  # a fold of the chain *after* stands on: it holds every change
                break
            previous = link.get("previous")
            at = None if previous is None else (int(previous[0]), str(previous[1]))
        if at is None or segment is None:
            return None
        return images[::-1], segment

    def _evict(self, before: int, keep: str = "") -> None:
        for batch, name in self._segments():
            if name != keep and batch < before:
                self._files.remove(name)


def remove_run(root: str, run_id: str) -> None:
    """Delete the changelog of run *run_id* (after it ended). Idempotent; a failure on an
    object store leaves objects that the next prune of ended runs deletes."""
    if not is_remote(root):
        shutil.rmtree(Path(root) / CHANGELOG_DIR / run_id, ignore_errors=True)
        return
    with contextlib.suppress(OSError, StoreError):
        fs, base = filesystem(join(root, CHANGELOG_DIR, run_id))
        fs.delete_dir(base)

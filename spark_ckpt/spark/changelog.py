"""The durable changelog of subtasks on the executors: a subtask rebuilds its state anywhere.

Every micro-batch, a subtask on the executors publishes a segment into this changelog, under
the (local) pipeline root, which outlives the executor and its Python workers. A segment is
either the whole state (:data:`~spark_ckpt.runtime.subtask_image.FULL`: the run's first
micro-batch, or every :data:`MAX_CHAIN`-th) or what the micro-batch changed
(:data:`~spark_ckpt.runtime.subtask_image.DELTA`: the changed keys, the operator state, the
sink transactions), whether or not it took a checkpoint. Each segment names its predecessor
and the full segment its chain starts at.

The subtask's task stays alive in the Python worker that ran it
(:class:`~spark_ckpt.spark.executor_subtasks.LiveSubtasks`). A worker whose task stands at an
earlier segment of the chain the fence names catches up by the deltas since
(:meth:`SubtaskChangelog.since`, :func:`~spark_ckpt.runtime.subtask_image.catch_up`): the
cost follows what changed. A worker without it (the subtask moved to another executor, its
executor was lost, its worker restarted) rebuilds from the chain the fence names: the full
segment, then every delta in order, exactly its own key groups
(:func:`~spark_ckpt.runtime.subtask_image.import_images`). A segment is named by the fence —
(micro-batch, attempt token) — so both follow exactly the chain of the attempts Spark
committed, never a zombie's.

**Layout.** ``<root>/_changelog/<run id>/<subtask>/b<batch>-<token>/``: an entry in the
executor cache's format (an Arrow IPC file per table, ``meta.json``), written under a
temporary name and renamed into place. **Eviction.** Publishing a segment removes the
subtask's segments older than the full segment its predecessor's chain starts at (a retry of
this micro-batch still finds that chain); a run's changelog goes when the run is retired
(:meth:`~spark_ckpt.spark.pipeline_run.PipelineRun.retire`) or pruned.

Local pipeline roots only (the executor cache's entry format, local files): on a remote root
the subtask publishes its whole image into its executor's cache
(:mod:`spark_ckpt.spark.executor_cache`) every micro-batch instead, and a lost image fails
the micro-batch: the run restarts from the latest checkpoint.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from spark_ckpt.errors import StoreError
from spark_ckpt.runtime.subtask_image import FULL, SubtaskImage
from spark_ckpt.spark.executor_cache import Fence, StateImage, entry_name, read_entry, write_entry

CHANGELOG_DIR = "_changelog"
#: Deltas after which a subtask writes a full segment again (bounds a rebuild's chain).
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


class SubtaskChangelog:
    """The changelog of one subtask of one run (see the module docstring). Runs on the
    executors (publish, rebuild) and in the driver (:func:`remove_run`)."""

    def __init__(self, root: str, run_id: str, subtask: int) -> None:
        self.run_id = run_id
        self.directory = Path(root) / CHANGELOG_DIR / run_id / str(subtask)

    @staticmethod
    def available(root: str) -> bool:
        """Whether the pipeline root can hold a changelog (a local path)."""
        return "://" not in root or root.startswith("file://")

    def publish(
        self,
        batch_id: int,
        token: str,
        image: SubtaskImage,
        previous: Segment | None,
        *,
        executor: str = DURABLE,
    ) -> Segment:
        """Publish *image* (full, or the changes since *previous*, the segment the
        micro-batch started from) as micro-batch *batch_id*'s segment of attempt *token*,
        written on *executor* (recorded for diagnostics); evicts what no retry can need.
        Raises :class:`StoreError`."""
        full = image.meta.get("kind") == FULL
        if not full and previous is None:
            raise StoreError("a changelog starts with a full segment")
        base = (batch_id, token) if full or previous is None else previous.base
        length = 1 if full or previous is None else previous.length + 1
        link = {"base": list(base), "length": length, "executor": executor}
        meta = {**image.meta, "changelog": link}
        if previous is not None:
            meta["changelog"]["previous"] = [previous.batch_id, previous.token]
        fence = Fence(self.run_id, batch_id, token, DURABLE)
        final = self.directory / entry_name(batch_id, token)
        tmp = self.directory / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir(parents=True)
            write_entry(tmp, fence, StateImage(image.tables, meta))
            os.rename(tmp, final)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StoreError(f"changelog: cannot publish {final}: {e}") from e
        if previous is not None:
            self._evict(before=previous.base[0])
        return Segment(batch_id, token, base, length)

    def chain(self, batch_id: int, token: str) -> tuple[list[SubtaskImage], Segment]:
        """The images of the chain ending at segment (*batch_id*, *token*), full segment
        first, and that segment. Raises :class:`StoreError` when a segment of it is missing
        or unreadable."""
        images: list[SubtaskImage] = []
        at: tuple[int, str] | None = (batch_id, token)
        segment: Segment | None = None
        while at is not None:
            path = self.directory / entry_name(*at)
            try:
                image, _ = read_entry(path, Fence(self.run_id, at[0], at[1], DURABLE))
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
                image, _ = read_entry(
                    self.directory / entry_name(*at), Fence(self.run_id, at[0], at[1], DURABLE)
                )
            except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
                return None
            if image.meta.get("kind") == FULL:
                return None
            link = image.meta["changelog"]
            if segment is None:
                base = link["base"]
                segment = Segment(at[0], at[1], (int(base[0]), str(base[1])), int(link["length"]))
            images.append(SubtaskImage(image.tables, image.meta))
            previous = link.get("previous")
            at = None if previous is None else (int(previous[0]), str(previous[1]))
        if at is None or segment is None:
            return None
        return images[::-1], segment

    def _evict(self, before: int) -> None:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            if name.startswith("b") and "-" in name:
                try:
                    batch = int(name[1:].split("-", 1)[0])
                except ValueError:
                    continue
                if batch < before:
                    shutil.rmtree(self.directory / name, ignore_errors=True)


def remove_run(root: str, run_id: str) -> None:
    """Delete the changelog of run *run_id* (after it ended). Idempotent."""
    if SubtaskChangelog.available(root):
        shutil.rmtree(Path(root) / CHANGELOG_DIR / run_id, ignore_errors=True)

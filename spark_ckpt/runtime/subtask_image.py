"""A subtask's whole state as an image, so it can run one micro-batch per Spark task.

On executors (``docs/design/executors.md``) a subtask of the operator chain runs inside a
Spark task, one per micro-batch, in whichever Python worker Spark picks. Between
micro-batches its state leaves the process as an image, which the next micro-batch's task
loads (from the executor's cache, :mod:`spark_ckpt.spark.executors.executor_cache`).

Because the source aligns (:mod:`spark_ckpt.sources.stream_offset`), every checkpoint falls
on a micro-batch boundary: after a micro-batch a subtask has no alignment state (no blocked
channel, no buffered row, no snapshot in progress), so its image is only

* its operators' keyed and operator state, as the blobs of a full snapshot
  (:meth:`~spark_ckpt.state.snapshot.strategy.SnapshotStrategy.full_blobs`), one table each;
* the sink transactions it sealed and whose commit it has not seen yet;
* its sink's open transaction: the files staged since the last barrier (and those of its
  late rows, with a late-output table)
  (:class:`~spark_ckpt.sinks.two_phase_commit.DetachableWriter`);
* with time, its watermark valve and what it counted (metadata); its operators' timers are
  keyed state.

A subtask built fresh from an image has no incremental base; one kept alive in its Python
worker between micro-batches (:class:`~spark_ckpt.spark.executors.subtask_function.LiveSubtasks`)
keeps its base. Either can build on the latest completed checkpoint instead
(:meth:`~spark_ckpt.runtime.task.OperatorTask.rebase`): what changed since is known from the
changelog's segments, each tagged with the newest snapshot at its end (the image metadata's
``last_snapshot``; :class:`~spark_ckpt.runtime.image_history.ImageHistory`, kept per operator
in :attr:`OperatorTask.image_histories <spark_ckpt.runtime.task.OperatorTask.image_histories>`).

The image's metadata is JSON-compatible (``version`` :data:`IMAGE_VERSION`); nothing in it
is pickled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ProtocolError, StateError
from spark_ckpt.protocol.state_handles import (
    BlobKind,
    BlobRef,
    CacheMetrics,
    StateBlob,
)
from spark_ckpt.runtime.image_history import (
    ImageHistory,
    changed_blobs,
    folded_blobs,
    full_image_taken,
    segment_done,
)
from spark_ckpt.runtime.task import OperatorTask
from spark_ckpt.sinks.two_phase_commit import DetachableWriter, Transaction
from spark_ckpt.state.state_restore import apply_segment, restore_backend

IMAGE_VERSION = 1
#: An image's kind: the whole state, or what changed since the previous image (a segment of
#: a subtask's changelog).
FULL = "full"
DELTA = "delta"
#: Image metadata: a DELTA image that holds every change since the chain's FULL image.
FOLD = "fold"


@dataclass(frozen=True)
class SubtaskImage:
    """Named Arrow tables and JSON-compatible metadata (see the module docstring)."""

    tables: Mapping[str, pa.Table]
    meta: Mapping[str, Any]


def export_image(
    task: OperatorTask, writer: DetachableWriter | None, *, changes: bool = False
) -> SubtaskImage:
    """The image of *task* after a micro-batch: with *changes*, a :data:`DELTA` image of what
    changed since the previous export, load or restore (a changelog segment: the changed keys
    of every keyed state, the whole operator state, the sink transactions; snapshots taken
    meanwhile do not matter), else the :data:`FULL` image (its whole state). Only what is
    asked for is built: a delta costs what changed. Either way the next segment starts
    here. Hands *writer*'s open transaction of the task over into it (the writer forgets
    it). :class:`ProtocolError` if the task is still aligning (the source did not align the
    micro-batch)."""
    _check_aligned(task)
    tag = task.last_snapshot_id
    backends = [(op.uid, task.backends[op.uid]) for op in task.operators]
    if changes:
        histories = task.image_histories
        blobs = [blob for uid, b in backends for blob in changed_blobs(b, histories.get(uid), tag)]
    else:
        taken = {uid: full_image_taken(b, tag) for uid, b in backends}
        task.image_histories.update(taken)
        rebase_from = max((h.rebase_from for h in taken.values()), default=tag + 1)
        blobs = [blob for _, b in backends for blob in b.snapshots.full_blobs()]
    staged: tuple[str, ...] = ()
    if writer is not None:
        staged = writer.detach(task.sink_uid, task.task_id.subtask)
    image = _image(task, DELTA if changes else FULL, blobs, staged)
    if not changes:  # the oldest checkpoint holding this image's state (a rebuild's rebase)
        image = SubtaskImage(image.tables, {**image.meta, "rebase_from": rebase_from})
    return image


def export_folded_image(task: OperatorTask, writer: DetachableWriter | None) -> SubtaskImage | None:
    """A :data:`DELTA` image of what changed since the last :data:`FULL` image *task*
    exported (the changelog's delta segments since, folded into one: a changelog can link
    it straight to that full image), or None, with nothing touched, when the task cannot
    fold (:func:`~spark_ckpt.runtime.image_history.folded_blobs`): the caller must export a
    full image then. Otherwise as :func:`export_image`."""
    _check_aligned(task)
    blobs: list[StateBlob] = []
    for op in task.operators:
        backend = task.backends[op.uid]
        folded = folded_blobs(backend, task.image_histories.get(op.uid), task.last_snapshot_id)
        if folded is None:  # earlier backends started their next segment: harmless, the
            return None  # caller exports a full image, which starts every segment anew
        blobs.extend(folded)
    staged: tuple[str, ...] = ()
    if writer is not None:
        staged = writer.detach(task.sink_uid, task.task_id.subtask)
    image = _image(task, DELTA, blobs, staged)
    return SubtaskImage(image.tables, {**image.meta, FOLD: True})


def _check_aligned(task: OperatorTask) -> None:
    aligner = task.aligner
    if aligner.pending_checkpoints or aligner.buffered_rows:
        raise ProtocolError(
            f"subtask {task.task_id.subtask} ends a micro-batch while aligning checkpoints "
            f"{list(aligner.pending_checkpoints)}: every barrier must reach every channel in "
            "one micro-batch (alignment at the source)"
        )


def _image(
    task: OperatorTask, kind: str, state: list[StateBlob], staged: tuple[str, ...]
) -> SubtaskImage:
    tables: dict[str, pa.Table] = {}
    blobs: list[dict[str, Any]] = []
    for blob in state:
        name = f"s{len(blobs)}"
        tables[name] = blob.table
        blobs.append(
            {
                "table": name,
                "uid": blob.operator_uid,
                "kind": blob.kind.value,
                "state": blob.state_name,
                "kg": [blob.key_group_start, blob.key_group_end],
            }
        )
    meta = {
        "version": IMAGE_VERSION,
        "kind": kind,
        "subtask": task.task_id.subtask,
        "blobs": blobs,
        "sealed": [t.to_json() for t in task.sealed_transactions()],
        "open": list(staged),
        "open_late": list(_detach_late(task)),
        "open_sides": _detach_sides(task),
        "cache": None if task.cache is None else task.cache.to_dict(),
        "last_snapshot": task.last_snapshot_id,
    }
    if task.time is not None:
        meta.update(task.time.image_meta())
    return SubtaskImage(tables, meta)


def import_image(task: OperatorTask, writer: DetachableWriter | None, image: SubtaskImage) -> None:
    """Load *image* (:data:`FULL`) into *task*, freshly built for the same subtask, before its
    first input; gives *writer* the open transaction back."""
    import_images(task, writer, [image])


def import_images(
    task: OperatorTask, writer: DetachableWriter | None, images: Sequence[SubtaskImage]
) -> None:
    """Load a chain of images into *task*, freshly built for the same subtask, before its
    first input: a :data:`FULL` image, then :data:`DELTA` images in the order they were
    taken (a changelog). Keyed state is the full image's with every delta applied in turn;
    operator state, sink transactions and cache metrics are the newest image's. Gives
    *writer* the newest open transaction back."""
    _check_images(task, images, first=FULL)
    refs: dict[str, list[BlobRef]] = {}
    tables: dict[tuple[Any, ...], pa.Table] = {}
    seqs: dict[tuple[str, str], int] = {}
    newest = len(images) - 1
    for position, image in enumerate(images):
        for found, whole in _blobs(task, image, seqs):
            ref, table = found, whole
            if ref.kind is BlobKind.OPERATOR and position != newest:
                continue  # operator state: the newest image's, whole
            if ref.kind is BlobKind.KEYED_DELTA and ref.seq == 0:
                # a state first registered after the full image: its first delta applies to
                # nothing, so it is the full blob of its live rows
                live = pc.invert(table.column("deleted"))
                table = table.filter(live).drop_columns(["deleted"])
                ref = replace(ref, kind=BlobKind.KEYED_FULL, rows=table.num_rows)
            refs.setdefault(ref.operator_uid, []).append(ref)
            tables[ref.key] = table
    unknown = sorted(set(refs) - set(task.backends))
    if unknown:
        raise StateError(f"the image holds state of operators {unknown} the chain does not have")
    for uid, backend in task.backends.items():
        restore_backend(
            backend, refs.get(uid, []), lambda ref: tables[ref.key], incremental_base=False
        )
    # what the delta images changed since the full one: folds and rebases work from here
    first = images[0].meta
    image_tag = int(first.get("last_snapshot", 0))
    rebase_from = int(first.get("rebase_from", image_tag + 1))
    for uid in task.backends:
        segments = [
            (int(image.meta.get("last_snapshot", 0)), bool(image.meta.get(FOLD)), deltas)
            for image in images[1:]
            for deltas in [_keyed_deltas(image, uid)]
        ]
        task.image_histories[uid] = ImageHistory.loaded(image_tag, rebase_from, segments)
    _adopt_newest(task, writer, images[newest], detach=False)


def catch_up(
    task: OperatorTask, writer: DetachableWriter | None, images: Sequence[SubtaskImage]
) -> None:
    """Bring *task* — alive since an earlier micro-batch of its subtask — forward by the
    :data:`DELTA` images that other processes running the subtask published since (a
    changelog, oldest first): their keyed changes are applied and recorded as changes of
    *task* (its next incremental snapshot and changelog segment hold them); operator state,
    sink transactions, cache metrics and *writer*'s open transaction become the newest
    image's. If checkpoints were snapshotted meanwhile, the task's snapshot history is
    forgotten (:meth:`~spark_ckpt.runtime.task.OperatorTask.forget_snapshot_history`: its
    next snapshot is full). A failure leaves *task* half-updated: discard it then."""
    _check_images(task, images, first=DELTA)
    _check_aligned(task)
    seqs: dict[tuple[str, str], int] = {}
    for image in images:
        blobs = _blobs(task, image, seqs)
        unknown = sorted({ref.operator_uid for ref, _ in blobs} - set(task.backends))
        if unknown:
            raise StateError(
                f"the image holds state of operators {unknown} the chain does not have"
            )
        tag = int(image.meta.get("last_snapshot", 0))
        for uid, backend in task.backends.items():
            apply_segment(backend, blobs)
            segment_done(
                backend, task.image_histories.get(uid), tag, folds=bool(image.meta.get(FOLD))
            )
    _adopt_newest(task, writer, images[-1], detach=True)


def _keyed_deltas(image: SubtaskImage, uid: str) -> dict[str, list[pa.Table]]:
    """The keyed DELTA tables of operator *uid* in *image*, by state name."""
    out: dict[str, list[pa.Table]] = {}
    for b in image.meta["blobs"]:
        if b["uid"] == uid and BlobKind(b["kind"]) is BlobKind.KEYED_DELTA:
            out.setdefault(b["state"], []).append(image.tables[b["table"]])
    return out


def _check_images(task: OperatorTask, images: Sequence[SubtaskImage], *, first: str) -> None:
    if not images:
        raise StateError("no image to load")
    for i, image in enumerate(images):
        meta = image.meta
        if meta.get("version") != IMAGE_VERSION:
            raise StateError(f"unsupported subtask image version {meta.get('version')!r}")
        if meta.get("subtask") != task.task_id.subtask:
            raise StateError(
                f"the image of subtask {meta.get('subtask')} cannot load into subtask "
                f"{task.task_id.subtask}"
            )
        if meta.get("kind", FULL) != (first if i == 0 else DELTA):
            raise StateError(
                f"a changelog is one {FULL} image, then {DELTA} images"
                if first == FULL
                else f"a task catches up by {DELTA} images only"
            )


def _blobs(
    task: OperatorTask, image: SubtaskImage, seqs: dict[tuple[str, str], int]
) -> list[tuple[BlobRef, pa.Table]]:
    """The blobs of *image* as refs (a keyed state's chain numbered on in *seqs*) with
    their tables."""
    blobs: list[tuple[BlobRef, pa.Table]] = []
    for b in image.meta["blobs"]:
        kind = BlobKind(b["kind"])
        chain = (b["uid"], b["state"])
        seq = seqs[chain] = seqs.get(chain, -1) + 1 if kind is BlobKind.KEYED_DELTA else 0
        table = image.tables[b["table"]]
        ref = BlobRef(
            checkpoint_id=0,
            operator_uid=b["uid"],
            subtask=task.task_id.subtask,
            kind=kind,
            state_name=b["state"],
            key_group_start=int(b["kg"][0]),
            key_group_end=int(b["kg"][1]),
            channel=-1,
            seq=seq,
            rows=table.num_rows,
            nbytes=table.nbytes,
            checksum="",
        )
        blobs.append((ref, table))
    return blobs


def _adopt_newest(
    task: OperatorTask, writer: DetachableWriter | None, image: SubtaskImage, *, detach: bool
) -> None:
    """What *task* takes whole from the newest image: sealed transactions, cache metrics,
    the watermark valve and time counts, the snapshot history's end, the open
    transaction (*detach*: dropping the one *writer* holds for the task)."""
    meta = image.meta
    task.adopt_sealed([Transaction.from_json(t) for t in meta["sealed"]], replace=True)
    cache = meta.get("cache")
    task.cache = None if cache is None else CacheMetrics.from_dict(cache)
    if task.time is not None:
        task.time.load_image_meta(meta)
        task.time.state_replaced()  # the keyed state, timers included, is the images'
    last = int(meta.get("last_snapshot", 0))
    if detach and last > task.last_snapshot_id:
        task.forget_snapshot_history(last)
    task.last_snapshot_id = max(task.last_snapshot_id, last)
    if writer is not None:
        if detach:
            writer.detach(task.sink_uid, task.task_id.subtask)
        writer.attach(task.sink_uid, task.task_id.subtask, tuple(meta["open"]))
    late = _late_writer(task)
    if late is not None:
        if detach:
            late.detach(task.late_uid, task.task_id.subtask)
        late.attach(task.late_uid, task.task_id.subtask, tuple(meta.get("open_late", ())))
    _attach_sides(task, meta, detach=detach)


def reattach(task: OperatorTask, writer: DetachableWriter | None, image: SubtaskImage) -> None:
    """Give the open transactions *image* took over (:func:`export_image`) back to the
    writers of *task*, which lives on in this process."""
    if writer is not None:
        writer.attach(task.sink_uid, task.task_id.subtask, tuple(image.meta["open"]))
    late = _late_writer(task)
    if late is not None:
        late.attach(task.late_uid, task.task_id.subtask, tuple(image.meta.get("open_late", ())))
    _attach_sides(task, image.meta, detach=False)


def _side_writers(task: OperatorTask) -> dict[str, DetachableWriter]:
    """The writers of *task*'s named outputs that hand their open files over."""
    return {
        name: sink.writer
        for name, sink in task.side_sinks.items()
        if isinstance(sink.writer, DetachableWriter)
    }


def _detach_sides(task: OperatorTask) -> dict[str, list[str]]:
    """The files of *task*'s open transactions of its named outputs, per output."""
    return {
        name: list(writer.detach(task.side_uid(name), task.task_id.subtask))
        for name, writer in _side_writers(task).items()
    }


def _attach_sides(task: OperatorTask, meta: Mapping[str, Any], *, detach: bool) -> None:
    """Give *task*'s named outputs' writers the open files the image holds (*detach*: first
    dropping those they hold)."""
    opened = meta.get("open_sides", {})
    for name, writer in _side_writers(task).items():
        if detach:
            writer.detach(task.side_uid(name), task.task_id.subtask)
        writer.attach(task.side_uid(name), task.task_id.subtask, tuple(opened.get(name, ())))


def _late_writer(task: OperatorTask) -> DetachableWriter | None:
    """The writer of *task*'s late rows, when it has one that hands its open files over."""
    sink = task.late_sink
    if sink is None:
        return None
    writer = sink.writer
    return writer if isinstance(writer, DetachableWriter) else None


def _detach_late(task: OperatorTask) -> tuple[str, ...]:
    """The files of *task*'s open late-rows transaction, handed over into its image."""
    late = _late_writer(task)
    return () if late is None else late.detach(task.late_uid, task.task_id.subtask)

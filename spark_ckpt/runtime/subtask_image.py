"""A subtask's whole state as an image, so it can run one micro-batch per Spark task.

On executors (``docs/design/executors.md``) a subtask of the operator chain runs inside a
Spark task, one per micro-batch, in whichever Python worker Spark picks. Between
micro-batches its state leaves the process as an image, which the next micro-batch's task
loads (from the executor's cache, :mod:`spark_ckpt.spark.executor_cache`).

Because the source aligns (:mod:`spark_ckpt.sources.stream_offset`), every checkpoint falls
on a micro-batch boundary: after a micro-batch a subtask has no alignment state (no blocked
channel, no buffered row, no snapshot in progress), so its image is only

* its operators' keyed and operator state, as the blobs of a full snapshot
  (:meth:`~spark_ckpt.state.backend.KeyedStateBackend.full_blobs`), one table each;
* the sink transactions it sealed and whose commit it has not seen yet;
* its sink's open transaction: the files staged since the last barrier
  (:class:`~spark_ckpt.sinks.sink.DetachableWriter`).

A subtask built fresh from an image has no incremental base, so its next snapshot is full.

The image's metadata is JSON-compatible (``version`` :data:`IMAGE_VERSION`); nothing in it
is pickled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spark_ckpt.errors import ProtocolError, StateError
from spark_ckpt.protocol.handle import BlobKind, BlobRef, CacheMetrics
from spark_ckpt.runtime.task import OperatorTask
from spark_ckpt.sinks.sink import DetachableWriter, Transaction
from spark_ckpt.state.restore import restore_backend

IMAGE_VERSION = 1


@dataclass(frozen=True)
class SubtaskImage:
    """Named Arrow tables and JSON-compatible metadata (see the module docstring)."""

    tables: Mapping[str, pa.Table]
    meta: Mapping[str, Any]


def export_image(task: OperatorTask, writer: DetachableWriter | None) -> SubtaskImage:
    """The image of *task* after a micro-batch; hands *writer*'s open transaction of the
    task over into it (the writer forgets it). :class:`ProtocolError` if the task is
    still aligning (the source did not align the micro-batch)."""
    aligner = task.aligner
    if aligner.pending_checkpoints or aligner.buffered_rows:
        raise ProtocolError(
            f"subtask {task.task_id.subtask} ends a micro-batch while aligning checkpoints "
            f"{list(aligner.pending_checkpoints)}: every barrier must reach every channel in "
            "one micro-batch (alignment at the source)"
        )
    tables: dict[str, pa.Table] = {}
    blobs: list[dict[str, Any]] = []
    for op in task.operators:
        for blob in task.backends[op.uid].full_blobs():
            name = f"s{len(blobs)}"
            tables[name] = blob.table
            blobs.append(
                {
                    "table": name,
                    "uid": op.uid,
                    "kind": blob.kind.value,
                    "state": blob.state_name,
                    "kg": [blob.key_group_start, blob.key_group_end],
                }
            )
    staged: tuple[str, ...] = ()
    if writer is not None:
        staged = writer.detach(task.sink_uid, task.task_id.subtask)
    meta = {
        "version": IMAGE_VERSION,
        "subtask": task.task_id.subtask,
        "blobs": blobs,
        "sealed": [t.to_json() for t in task.sealed_transactions()],
        "open": list(staged),
        "cache": None if task.cache is None else task.cache.to_dict(),
    }
    return SubtaskImage(tables, meta)


def import_image(task: OperatorTask, writer: DetachableWriter | None, image: SubtaskImage) -> None:
    """Load *image* into *task*, freshly built for the same subtask, before its first
    input; gives *writer* the open transaction back."""
    meta = image.meta
    if meta.get("version") != IMAGE_VERSION:
        raise StateError(f"unsupported subtask image version {meta.get('version')!r}")
    if meta.get("subtask") != task.task_id.subtask:
        raise StateError(
            f"the image of subtask {meta.get('subtask')} cannot load into subtask "
            f"{task.task_id.subtask}"
        )
    refs: dict[str, list[tuple[BlobRef, pa.Table]]] = {}
    for b in meta["blobs"]:
        table = image.tables[b["table"]]
        ref = BlobRef(
            checkpoint_id=0,
            operator_uid=b["uid"],
            subtask=task.task_id.subtask,
            kind=BlobKind(b["kind"]),
            state_name=b["state"],
            key_group_start=int(b["kg"][0]),
            key_group_end=int(b["kg"][1]),
            channel=-1,
            seq=0,
            rows=table.num_rows,
            nbytes=table.nbytes,
            checksum="",
        )
        refs.setdefault(b["uid"], []).append((ref, table))
    unknown = sorted(set(refs) - set(task.backends))
    if unknown:
        raise StateError(f"the image holds state of operators {unknown} the chain does not have")
    by_key = {ref.key: table for mine in refs.values() for ref, table in mine}
    for uid, backend in task.backends.items():
        restore_backend(
            backend,
            [ref for ref, _ in refs.get(uid, [])],
            lambda ref: by_key[ref.key],
            incremental_base=False,
        )
    task.adopt_sealed([Transaction.from_json(t) for t in meta["sealed"]])
    cache = meta.get("cache")
    task.cache = None if cache is None else CacheMetrics.from_dict(cache)
    if writer is not None:
        writer.attach(task.sink_uid, task.task_id.subtask, tuple(meta["open"]))

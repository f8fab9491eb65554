"""The restore a pipeline starts from, prepared in the user's driver process before its first
run (Flink: the job submission with ``-s <path>``).

:func:`prepare_restore` resolves :class:`~spark_ckpt.runtime.restore_settings.RestoreSettings`
to one completed checkpoint, checks it against the pipeline
(:func:`~spark_ckpt.runtime.restore_settings.check_restorable`: operator uids, channel counts,
max parallelism, pipeline identity) and, unless it is the root's latest already, makes it the
root's latest completed checkpoint under a fresh id:

* a **savepoint** (or another root's checkpoint) is *copied* into the root
  (:func:`~spark_ckpt.storage.transfer.copy_checkpoint`): the savepoint is read, never
  modified or deleted (Flink's NO_CLAIM), and the copy references nothing of it;
* an older checkpoint of the root itself (by id or as of a time) is *derived*
  (:func:`~spark_ckpt.storage.transfer.derive_checkpoint`): a new checkpoint referencing its
  blobs.

A copy also seeds the root with the files source's listing of the savepoint or root it
comes from (:func:`~spark_ckpt.sources.files.file_listing.seed_listing`), or refuses when
the root already lists other files. Either way the new checkpoint carries
``restored_from`` and the runs restore "the latest" as they always do — the first run from
it, a restart after a failure from whatever the new lineage completed since. Taking the
lease for it fences any coordinator still running on the root. Nothing is written when the
check fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.delta.savepoint import checkpoint_as_of, open_savepoint
from spark_ckpt.errors import CheckpointNotFoundError, RestoreError, StoreError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.clock import Clock, SystemClock
from spark_ckpt.protocol.state_handles import BlobKind, BlobRef, TimeMetrics
from spark_ckpt.runtime.restore_settings import (
    OUTPUT_AS_OF,
    PIPELINE,
    RESTORED_FROM,
    PipelineShape,
    RestoreKind,
    RestoreSettings,
    check_restorable,
    output_checkpoint,
    without_uids,
)
from spark_ckpt.runtime.task import sealed_transactions
from spark_ckpt.sinks.two_phase_commit import Transaction
from spark_ckpt.sources.files.file_listing import seed_listing
from spark_ckpt.sources.kafka_options import CHANNEL_NAMES
from spark_ckpt.state.descriptor import META_MAX_PARALLELISM
from spark_ckpt.storage.checkpoint_store import CheckpointStore
from spark_ckpt.storage.transfer import copy_checkpoint, derive_checkpoint

log = logging.getLogger(__name__)


def stored_max_parallelism(
    store: CheckpointStore, checkpoint: CompletedCheckpoint
) -> list[tuple[str, int]]:
    """(uid, max parallelism) from the first keyed blob of each operator of *checkpoint*."""
    first: dict[str, BlobRef] = {}
    for ref in checkpoint.blobs():
        if ref.kind in (BlobKind.KEYED_FULL, BlobKind.KEYED_DELTA):
            first.setdefault(ref.operator_uid, ref)
    out: list[tuple[str, int]] = []
    for uid, ref in sorted(first.items()):
        meta = store.read_blob(ref).schema.metadata or {}
        value = meta.get(META_MAX_PARALLELISM)
        if value is not None:
            out.append((uid, int(value)))
    return out


def _resolve(
    settings: RestoreSettings, root: DeltaCheckpointStore
) -> tuple[CheckpointStore, CompletedCheckpoint]:
    if settings.kind is RestoreKind.SAVEPOINT:
        assert settings.path is not None
        store, savepoint = open_savepoint(settings.path)
        return store, savepoint.checkpoint
    other = settings.path is not None and settings.path.rstrip("/") != root.root.rstrip("/")
    store = DeltaCheckpointStore(settings.path) if other and settings.path else root
    if settings.kind is RestoreKind.AS_OF:
        assert settings.time is not None
        cid = checkpoint_as_of(store.root, settings.time)
    else:
        assert settings.checkpoint_id is not None
        cid = settings.checkpoint_id
    try:
        return store, store.get(cid)
    except CheckpointNotFoundError as e:
        raise RestoreError(
            f"{settings.describe()}: checkpoint {cid} is not retained under {store.root}"
        ) from e


def prepare_restore(
    root: DeltaCheckpointStore,
    shape: PipelineShape,
    settings: RestoreSettings,
    clock: Clock | None = None,
    *,
    check_output: Callable[[int, Sequence[Transaction]], None] | None = None,
) -> CompletedCheckpoint | None:
    """See the module docstring; returns the checkpoint the first run will restore (None: it
    starts empty). Raises :class:`RestoreError` for a source that does not exist or a
    checkpoint that does not fit the pipeline. *check_output* is called with the checkpoint
    id the output will be rolled back to and the sink transactions the checkpoint sealed
    (its recovery commits them), before anything is written: it raises
    :class:`RestoreError` when the output table cannot hold that checkpoint's output
    (:meth:`DeltaSinkRollback.check_output_restorable
    <spark_ckpt.delta.sink_rollback.DeltaSinkRollback.check_output_restorable>`)."""
    clock = clock or SystemClock()
    if settings.kind is RestoreKind.LATEST:
        good, _ = root.list_completed_lenient()
        if not good:
            return None
        latest = good[-1]
        try:
            parallelism = stored_max_parallelism(root, latest)
        except StoreError:  # damaged: the coordinator will skip it; checked when it restores
            parallelism = []
        check_restorable(latest, shape, settings, stored_max_parallelism=parallelism)
        return latest
    source, checkpoint = _resolve(settings, root)
    source.verify(checkpoint)
    dropped = check_restorable(
        checkpoint,
        shape,
        settings,
        stored_max_parallelism=stored_max_parallelism(source, checkpoint),
    )
    if dropped:
        log.warning(
            "restore drops the state of operator uids %s (allow_non_restored_state)", dropped
        )
    checkpoint = without_uids(checkpoint, dropped)
    if check_output is not None:
        check_output(output_checkpoint(checkpoint), sealed_transactions(checkpoint, source))
    if source is not root and settings.path is not None:
        seed_listing(root.root, settings.path)  # the files source's positions mean its files
    lease = root.acquire()  # fences any coordinator still running on the root
    # the new lineage's ids exceed the source's: the sink's Delta app transaction versions
    # are checkpoint ids, and its output is rolled back to the source's id on restore
    while lease.first_id <= checkpoint.checkpoint_id:
        lease = root.allocate_ids(lease)
    now = clock.now_ms()
    properties = {
        RESTORED_FROM: settings.describe(),
        PIPELINE: shape.pipeline,
        OUTPUT_AS_OF: str(output_checkpoint(checkpoint)),
    }
    names = checkpoint.properties.get(CHANNEL_NAMES)
    if names is not None:  # channels resume by name (Kafka partitions, several inputs)
        properties[CHANNEL_NAMES] = names
    # the restore point holds the restored watermarks (its own counts are nothing yet)
    time = {
        t: TimeMetrics().at(m.watermark_ms, m.processing_ms)
        for t, m in checkpoint.stats.task_time.items()
    }
    stats = CheckpointStats(trigger_ms=now, completed_ms=now, task_time=time)
    if source is root:
        restored = derive_checkpoint(
            root,
            lease,
            checkpoint,
            checkpoint_id=lease.first_id,
            properties=properties,
            stats=stats,
        )
    else:
        restored = copy_checkpoint(
            source,
            checkpoint,
            root,
            root,
            lease,
            checkpoint_id=lease.first_id,
            snapshot_type=SnapshotType.CHECKPOINT,
            properties=properties,
            stats=stats,
        )
    log.info(
        "restore: %s is checkpoint %d of %s", settings.describe(), restored.checkpoint_id, root.root
    )
    return restored

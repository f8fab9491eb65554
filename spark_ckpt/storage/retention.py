"""Retention: which completed checkpoints a store keeps, and which blobs are then garbage.

Pure functions shared by every store
(:meth:`~spark_ckpt.storage.checkpoint_store.CheckpointLog.retain` and
:meth:`~spark_ckpt.storage.checkpoint_store.CheckpointLog.discard` apply them): the newest *n*
checkpoints, every savepoint and every checkpoint from ``keep_from`` on are kept; a blob is garbage
when no kept checkpoint references it and it is not newer than the latest kept checkpoint (newer
blobs may belong to a checkpoint still pending).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from spark_ckpt.errors import StoreError
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.state_handles import BlobRef


def retention_plan(
    completed: Sequence[CompletedCheckpoint], retained: int, keep_from: int | None = None
) -> tuple[list[CompletedCheckpoint], list[CompletedCheckpoint]]:
    """Split *completed* into (kept, dropped): the newest *retained* checkpoints, all
    savepoints and every checkpoint with an id >= *keep_from* are kept."""
    if retained < 1:
        raise StoreError("at least one checkpoint must be retained")
    checkpoints = sorted(
        (c for c in completed if not c.is_savepoint), key=lambda c: c.checkpoint_id
    )
    dropped = checkpoints[:-retained] if len(checkpoints) > retained else []
    if keep_from is not None:
        dropped = [c for c in dropped if c.checkpoint_id < keep_from]
    dropped_ids = {c.checkpoint_id for c in dropped}
    kept = [c for c in completed if c.checkpoint_id not in dropped_ids]
    return sorted(kept, key=lambda c: c.checkpoint_id), dropped


def garbage_blobs(stored: Iterable[BlobRef], kept: Sequence[CompletedCheckpoint]) -> list[BlobRef]:
    """Blobs among *stored* that no kept checkpoint references and that are not newer than
    the latest kept checkpoint (newer ones may belong to a pending checkpoint)."""
    referenced = {b.key for c in kept for b in c.blobs()}
    horizon = max((c.checkpoint_id for c in kept), default=0)
    return [b for b in stored if b.key not in referenced and b.checkpoint_id <= horizon]

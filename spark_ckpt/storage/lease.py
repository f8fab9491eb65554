"""The coordinator lease: the right of one coordinator *epoch* to write the checkpoint log.

A lease comes from :meth:`~spark_ckpt.storage.checkpoint_store.CheckpointLog.acquire`, which fences
out every earlier epoch, and carries the block of checkpoint ids reserved for its epoch
(:meth:`~spark_ckpt.storage.checkpoint_store.CheckpointLog.allocate_ids` reserves the next block).
Ids are never handed out twice, across coordinators and restarts.
"""

from __future__ import annotations

from dataclasses import dataclass

#: How many checkpoint ids a lease reserves at a time.
ID_BLOCK = 1000


@dataclass(frozen=True)
class CoordinatorLease:
    """The right of one coordinator *epoch* to commit, with its reserved ids
    ``[first_id, end_id)``."""

    epoch: int
    first_id: int
    end_id: int

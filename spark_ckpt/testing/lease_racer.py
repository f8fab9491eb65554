"""A coordinator racing others for one checkpoint log, as a process of its own::

    python -m spark_ckpt.testing.lease_racer ROOT ROUNDS

Each round takes the lease (fencing every earlier epoch) and commits two checkpoints under
it. Prints one JSON line: ``[epoch, checkpoint id, "won" | "fenced"]`` per commit. Tests run
several at once on one root and replay the log by hand: a fenced coordinator must never have
committed (``tests/delta/test_delta_store.py``, ``tests/integration/test_object_store.py``).
"""

from __future__ import annotations

import json
import sys

from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.errors import FencedError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import TaskId, TaskStateHandle


def race(root: str, rounds: int) -> list[tuple[int, int, str]]:
    store = DeltaCheckpointStore(root)
    outcomes: list[tuple[int, int, str]] = []
    for _ in range(rounds):
        lease = store.acquire()
        for cid in (lease.first_id, lease.first_id + 1):
            handle = TaskStateHandle(TaskId("t"))
            checkpoint = CompletedCheckpoint(
                cid, SnapshotType.CHECKPOINT, (handle,), CheckpointStats(0, 1)
            )
            try:
                store.commit(lease, checkpoint)
                outcomes.append((lease.epoch, cid, "won"))
            except FencedError:
                outcomes.append((lease.epoch, cid, "fenced"))
    return outcomes


if __name__ == "__main__":
    print(json.dumps(race(sys.argv[1], int(sys.argv[2]))))

"""After a restore a user asked for (a savepoint, an older checkpoint), the next snapshot is
full: the new lineage never builds on the restored chains (Flink's NO_CLAIM). A restart's
restore keeps building on them."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_ckpt.protocol.state_handles import BlobKind
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.descriptor import ValueStateDescriptor
from spark_ckpt.state.state_restore import restore_backend
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

COUNT = ValueStateDescriptor("count", pa.int64())


@pytest.mark.parametrize("incremental_base", [True, False])
def test_the_next_snapshot_after_a_restore_without_base_is_full(incremental_base: bool) -> None:
    store = InMemoryCheckpointStore()
    old = KeyedStateBackend.for_subtask("op", 0, 1, pa.int64(), 128)
    keys = pa.array(range(50), pa.int64())
    old.put_values(COUNT, keys, keys)
    handle = store.write_task_state(1, old.snapshots.snapshot(1))
    new = KeyedStateBackend.for_subtask("op", 0, 1, pa.int64(), 128)
    new.value_state(COUNT)
    restore_backend(new, handle.blobs, store.read_blob, incremental_base=incremental_base)
    new.put_values(COUNT, pa.array([7], pa.int64()), pa.array([70], pa.int64()))
    snap = new.snapshots.snapshot(2)
    kinds = {b.kind for b in snap.new_blobs}
    if incremental_base:
        assert kinds == {BlobKind.KEYED_DELTA} and snap.reused
    else:
        assert kinds == {BlobKind.KEYED_FULL} and not snap.reused
        [full] = snap.new_blobs
        assert full.table.num_rows == 50

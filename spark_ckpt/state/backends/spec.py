"""Which state backend a pipeline's subtasks keep their keyed state in, as a picklable value
(Flink's ``state.backend.type``): :class:`StateBackendSpec` travels in the run's spec to
wherever the subtasks run (executors, or the driver's foreachBatch) and builds each subtask
backend's storage there (:meth:`StateBackendSpec.storage`).

* ``hashmap`` (default): keyed state as Python objects in the host's memory
  (:mod:`~spark_ckpt.state.backends.heap`);
* ``rocksdb``: an embedded RocksDB on the local disk (:mod:`~spark_ckpt.state.backends.rocksdb`).

A checkpoint's format does not depend on the backend: checkpoints and savepoints of either
restore on the other, so switching backends at a restore needs nothing but the new option.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import pyarrow as pa

from spark_ckpt.state.backends.heap import HeapStorage
from spark_ckpt.state.backends.rocksdb import RocksDBOptions, RocksDBStorage
from spark_ckpt.state.backends.table import StateStorage


class StateBackendType(StrEnum):
    """The values of ``state.backend.type``."""

    HASHMAP = "hashmap"
    ROCKSDB = "rocksdb"


@dataclass(frozen=True)
class StateBackendSpec:
    """The state backend of a pipeline's subtasks (see the module docstring)."""

    type: StateBackendType = StateBackendType.HASHMAP
    rocksdb: RocksDBOptions = field(default_factory=RocksDBOptions)

    def storage(self, operator_uid: str, subtask: int, key_type: pa.DataType) -> StateStorage:
        """A new storage for the keyed state of subtask *subtask* of *operator_uid*, made
        where the subtask runs (``rocksdb``: its instance opens on the first state)."""
        if self.type is StateBackendType.ROCKSDB:
            return RocksDBStorage(self.rocksdb, f"{operator_uid}-{subtask}", key_type)
        return HeapStorage(key_type)


#: The default: every keyed state in the host's memory.
HASHMAP: StateBackendSpec = StateBackendSpec()

"""Builders of checkpoint stores for the offline tests, and their oracles.

:func:`run_incremental` drives :class:`KeyedStateBackend` subtasks through random updates and
incremental checkpoints (chains of a FULL blob and DELTAs) into a store, keeping in plain
Python dicts what each checkpoint must hold (the oracle: a fold of the same updates, no
spark-ckpt code involved). :func:`restored` loads a checkpoint with ``restore_backend`` at any
parallelism and returns what the backends hold, as plain dicts.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import BlobRef, SourceOffset, TaskStateHandle
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.descriptor import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateKind,
    ValueStateDescriptor,
)
from spark_ckpt.state.keygroup import key_group_indices, subtask_for_key_group
from spark_ckpt.state.state_restore import restore_backend
from spark_ckpt.storage.checkpoint_store import CheckpointStore

COUNT = ValueStateDescriptor("count", pa.int64())
EVENTS = ListStateDescriptor("events", pa.string())
ATTRS = MapStateDescriptor("attrs", pa.string(), pa.int64())
OPS = "pending"  # operator list state, int64 elements
SOURCE = "source"
CHANNELS = 4


@dataclass
class Oracle:
    """What a checkpoint holds, as plain Python values."""

    count: dict[Any, int] = field(default_factory=dict)
    events: dict[Any, list[str]] = field(default_factory=dict)
    attrs: dict[Any, dict[str, int]] = field(default_factory=dict)
    ops: dict[int, list[int]] = field(default_factory=dict)  # subtask -> elements
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def state(self, name: str) -> dict[Any, Any]:
        return {"count": self.count, "events": self.events, "attrs": self.attrs}[name]


def subtask_of(key: Any, key_type: pa.DataType, max_parallelism: int, parallelism: int) -> int:
    kg = int(key_group_indices(pa.array([key], key_type), max_parallelism)[0])
    return subtask_for_key_group(max_parallelism, parallelism, kg)


def run_incremental(
    store: CheckpointStore,
    *,
    uid: str = "op",
    parallelism: int = 2,
    max_parallelism: int = 128,
    rounds: int = 5,
    keys: int = 300,
    seed: int = 7,
) -> list[tuple[CompletedCheckpoint, Oracle]]:
    """Random updates of value, list, map and operator state of *uid* (int64 keys) over
    *rounds* incremental checkpoints; returns each completed checkpoint with its oracle."""
    rng = random.Random(seed)
    key_type = pa.int64()
    backends = [
        KeyedStateBackend.for_subtask(uid, i, parallelism, key_type, max_parallelism)
        for i in range(parallelism)
    ]
    oracle = Oracle()
    lease = store.acquire()
    out: list[tuple[CompletedCheckpoint, Oracle]] = []
    for r in range(rounds):
        touched = rng.sample(range(keys), keys // 3 if r == 0 else keys // 8)
        by_subtask: dict[int, list[int]] = {}
        for k in touched:
            by_subtask.setdefault(subtask_of(k, key_type, max_parallelism, parallelism), []).append(
                k
            )
        for subtask, ks in by_subtask.items():
            b = backends[subtask]
            # value state: vectorized on even rounds (change log), per record on odd ones
            values: list[int | None] = []
            for k in ks:
                v = None if (k in oracle.count and rng.random() < 0.25) else rng.randrange(10**6)
                values.append(v)
                if v is None:
                    oracle.count.pop(k, None)
                else:
                    oracle.count[k] = v
            if r % 2 == 0:
                b.put_values(COUNT, pa.array(ks, key_type), pa.array(values, pa.int64()))
            else:
                for k, v in zip(ks, values, strict=True):
                    b.set_current_key(k)
                    b.value_state(COUNT).update(v)
            for k in ks:
                b.set_current_key(k)
                events = b.list_state(EVENTS)
                if k in oracle.events and rng.random() < 0.2:
                    events.clear()
                    oracle.events.pop(k)
                else:
                    e = f"e{r}-{rng.randrange(100)}"
                    events.add(e)
                    oracle.events.setdefault(k, []).append(e)
                attrs = b.map_state(ATTRS)
                name = rng.choice("abc")
                current = oracle.attrs.get(k, {})
                if name in current and rng.random() < 0.3:
                    attrs.remove(name)
                    del current[name]
                else:
                    n = rng.randrange(1000)
                    attrs.put(name, n)
                    current[name] = n
                if current:
                    oracle.attrs[k] = current
                else:
                    oracle.attrs.pop(k, None)
        for i, b in enumerate(backends):
            elements = [rng.randrange(100) for _ in range(rng.randrange(1, 4))]
            b.operator_list_state(OPS, pa.int64()).update(elements)
            oracle.ops[i] = elements
        cid = lease.first_id + r
        offsets = tuple(SourceOffset(SOURCE, c, 100 * (r + 1) + c) for c in range(CHANNELS))
        oracle.offsets = {(o.source, o.channel): o.offset for o in offsets}
        handles: list[TaskStateHandle] = []
        for b in backends:
            snap = b.snapshots.snapshot(cid)
            snap = type(snap)(snap.task, snap.new_blobs, snap.reused, offsets)
            handles.append(store.write_task_state(cid, snap))
        checkpoint = CompletedCheckpoint(
            cid,
            SnapshotType.CHECKPOINT,
            tuple(sorted(handles, key=lambda h: h.task)),
            CheckpointStats(trigger_ms=r, completed_ms=r + 1),
        )
        store.commit(lease, checkpoint)
        for b, h in zip(backends, handles, strict=True):
            b.snapshots.notify_checkpoint_complete(cid, h)
        out.append((checkpoint, copy.deepcopy(oracle)))
    return out


def as_dict(table: pa.Table, kind: StateKind | str = StateKind.VALUE) -> dict[Any, Any]:
    """A state table (``key``, ``value``) as a dict (map values as dicts)."""
    values = table.column("value").to_pylist()
    if StateKind(kind) is StateKind.MAP:
        values = [dict(v) for v in values]
    return dict(zip(table.column("key").to_pylist(), values, strict=True))


def restored(
    refs: Sequence[BlobRef],
    read_blob: Any,
    uid: str,
    key_type: pa.DataType,
    parallelism: int,
    max_parallelism: int,
) -> tuple[dict[str, dict[Any, Any]], list[list[Any]]]:
    """Restore *uid* from *refs* into *parallelism* fresh backends (``restore_backend``):
    every keyed state merged over the backends (each key must be in exactly one, the one
    owning its key group), and each backend's operator list state."""
    states: dict[str, dict[Any, Any]] = {}
    ops: list[list[Any]] = []
    for i in range(parallelism):
        b = KeyedStateBackend.for_subtask(uid, i, parallelism, key_type, max_parallelism)
        restore_backend(b, refs, read_blob)
        for desc in b.descriptors():
            table = b.to_table(desc)
            kgs = table.column("key_group").to_pylist()
            assert all(kg in b.key_group_range for kg in kgs)
            got = as_dict(table, desc.kind)
            merged = states.setdefault(desc.name, {})
            assert not merged.keys() & got.keys(), "a key restored into two subtasks"
            merged.update(got)
        ops.append(b.operator_list_state(OPS, pa.int64()).get() if _has_ops(refs, uid) else [])
    return states, ops


def _has_ops(refs: Sequence[BlobRef], uid: str) -> bool:
    return any(r.operator_uid == uid and r.state_name == OPS for r in refs)

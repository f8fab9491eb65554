"""The two state backends are one contract: a random sequence of per-record and vectorized
reads, writes and deletes, snapshots (full and incremental) and restores at another
parallelism gives the same reads and the same snapshots on ``hashmap`` and ``rocksdb``, and
both agree with a plain dict model. A snapshot taken on one backend restores on the other.
(TTL expiries: ``test_ttl.py`` runs its model test on both backends.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.protocol.state_handles import BlobRef, TaskStateHandle
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.backends.heap import HeapStorage
from spark_ckpt.state.backends.rocksdb import RocksDBOptions, RocksDBStorage
from spark_ckpt.state.backends.table import StateStorage
from spark_ckpt.state.descriptor import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from spark_ckpt.state.state_restore import restore_backend
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

MAX_P = 16
COUNT = ValueStateDescriptor("count", pa.int64())
NAME = ValueStateDescriptor("name", pa.string())
EVENTS = ListStateDescriptor("events", pa.string())
ATTRS = MapStateDescriptor("attrs", pa.string(), pa.float64())
WINDOWS = ValueStateDescriptor(
    "windows", pa.list_(pa.struct([("start", pa.int64()), ("sum", pa.float64())]))
)
DESCRIPTORS = (COUNT, NAME, EVENTS, ATTRS, WINDOWS)

keys = st.integers(-(2**40), 2**40)
small_keys = st.integers(0, 30)
op = st.one_of(
    st.tuples(
        st.just("put"), st.lists(st.tuples(small_keys, st.integers(-(2**62), 2**62) | st.none()))
    ),
    st.tuples(st.just("name"), st.lists(st.tuples(keys, st.text(max_size=5) | st.none()))),
    st.tuples(st.just("clear"), st.lists(small_keys, max_size=5)),
    st.tuples(st.just("add"), small_keys, st.text(max_size=3)),
    st.tuples(st.just("attr"), small_keys, st.sampled_from("abc"), st.floats(allow_nan=False)),
    st.tuples(st.just("unattr"), small_keys, st.sampled_from("abc")),
    st.tuples(st.just("window"), small_keys, st.integers(0, 5)),
    st.tuples(st.just("drop"), small_keys),
    st.tuples(st.just("snapshot"), st.booleans()),
    st.tuples(st.just("restore"), st.integers(1, 3)),
)


class Subject:
    """One backend kind's subtasks, restored and rescaled as the sequence says."""

    def __init__(self, make: Any) -> None:
        self.make = make
        self.store = InMemoryCheckpointStore()
        self.backends = self._fresh(1)
        self.cid = 0
        self.handles: list[TaskStateHandle] = []

    def _fresh(self, parallelism: int) -> list[KeyedStateBackend]:
        return [
            KeyedStateBackend.for_subtask(
                "op", i, parallelism, pa.int64(), MAX_P, storage=self.make()
            )
            for i in range(parallelism)
        ]

    def owner(self, key: int) -> KeyedStateBackend:
        for b in self.backends:
            try:
                b.set_current_key(key)
            except Exception:
                continue
            return b
        raise AssertionError(key)

    def snapshot(self, full: bool) -> list[pa.Table]:
        self.cid += 1
        tables: list[pa.Table] = []
        self.handles = []
        for b in self.backends:
            snap = b.snapshots.snapshot(self.cid, full=full)
            tables.extend(
                _canonical(blob.table) for blob in sorted(snap.new_blobs, key=_blob_order)
            )
            handle = self.store.write_task_state(self.cid, snap)
            b.snapshots.notify_checkpoint_complete(self.cid, handle)
            self.handles.append(handle)
        return tables

    def restore(self, parallelism: int, refs: tuple[BlobRef, ...]) -> None:
        for b in self.backends:
            b.close()
        self.backends = self._fresh(parallelism)
        for b in self.backends:
            restore_backend(b, refs, self.store.read_blob)

    def refs(self) -> tuple[BlobRef, ...]:
        return tuple(r for h in self.handles for r in h.blobs)

    def contents(self) -> dict[str, dict[Any, Any]]:
        out: dict[str, dict[Any, Any]] = {}
        for d in DESCRIPTORS:
            rows: dict[Any, Any] = {}
            for b in self.backends:
                for r in b.to_table(d).to_pylist():
                    value = r["value"]
                    rows[r["key"]] = dict(value) if d is ATTRS else value
            out[d.name] = rows
        return out


def _blob_order(blob: Any) -> tuple[str, str, int]:
    return (blob.state_name, blob.kind.value, blob.key_group_start)


def _canonical(table: pa.Table) -> pa.Table:
    """A blob's rows in (key group, key) order (rows of a key group have no order)."""
    if "key" not in table.column_names:
        return table
    return table.sort_by([("key_group", "ascending"), ("key", "ascending")])


def apply(subject: Subject, step: tuple[Any, ...]) -> Any:
    kind = step[0]
    if kind == "put":
        by_owner: dict[int, list[tuple[int, int | None]]] = {}
        for k, v in step[1]:
            by_owner.setdefault(id(subject.owner(k)), []).append((k, v))
        for b in subject.backends:
            pairs = by_owner.get(id(b), [])
            if pairs:
                b.put_values(COUNT, [k for k, _ in pairs], [v for _, v in pairs])
        return [subject.owner(k).get_values(COUNT, [k]).to_pylist() for k, _ in step[1]]
    if kind == "name":
        got = []
        for k, v in step[1]:
            b = subject.owner(k)
            b.value_state(NAME).update(v)
            got.append(b.value_state(NAME).value())
        return got
    if kind == "clear":
        for k in step[1]:
            subject.owner(k).clear_values(COUNT, [k])
        return None
    b = subject.owner(step[1]) if kind in {"add", "attr", "unattr", "window", "drop"} else None
    if kind == "add":
        assert b is not None
        b.list_state(EVENTS).add(step[2])
        return b.list_state(EVENTS).get()
    if kind == "attr":
        assert b is not None
        b.map_state(ATTRS).put(step[2], step[3])
        return b.map_state(ATTRS).items()
    if kind == "unattr":
        assert b is not None
        b.map_state(ATTRS).remove(step[2])
        return b.map_state(ATTRS).items()
    if kind == "window":
        assert b is not None
        old = b.get_values(WINDOWS, [step[1]]).to_pylist()[0] or []
        new = [*old, {"start": step[2], "sum": float(step[2])}][-3:]
        b.put_values(WINDOWS, pa.array([step[1]]), pa.array([new], WINDOWS.value_type))
        return b.get_values(WINDOWS, [step[1]]).to_pylist()
    if kind == "drop":
        assert b is not None
        for d in (EVENTS, ATTRS, WINDOWS):
            b.clear_values(d, [step[1]])
        return None
    if kind == "snapshot":
        return subject.snapshot(step[1])
    if kind == "restore":
        if subject.handles:
            subject.restore(step[1], subject.refs())
        return None
    raise AssertionError(kind)


@settings(max_examples=40)
@given(st.lists(op, max_size=25))
def test_both_backends_give_identical_results_and_snapshots(
    tmp_path_factory: Any, steps: list[tuple[Any, ...]]
) -> None:
    local = str(tmp_path_factory.mktemp("rocksdb"))
    heap = Subject(lambda: HeapStorage(pa.int64()))
    rocks = Subject(
        lambda: RocksDBStorage(RocksDBOptions(local, 1 << 20, 1 << 20), "op", pa.int64())
    )
    for step in steps:
        assert apply(heap, step) == apply(rocks, step), step
        assert heap.contents() == rocks.contents()
    for b in rocks.backends:
        b.close()


def test_a_snapshot_of_one_backend_restores_on_the_other(tmp_path: Path) -> None:
    def rocksdb() -> StateStorage:
        return RocksDBStorage(RocksDBOptions(str(tmp_path)), "op", pa.int64())

    def hashmap() -> StateStorage:
        return HeapStorage(pa.int64())

    for source, target in ((hashmap, rocksdb), (rocksdb, hashmap)):
        first = Subject(source)
        for k in range(200):
            apply(first, ("put", [(k, k * 7)]))
            apply(first, ("add", k % 31, f"e{k}"))
            apply(first, ("window", k % 17, k % 5))
        first.snapshot(False)
        apply(first, ("clear", [1, 2, 3]))
        first.snapshot(False)  # incremental: a delta on the full blob
        expected = first.contents()
        second = Subject(target)
        second.store = first.store
        second.restore(3, first.refs())
        assert second.contents() == expected
        assert all(b.storage.name != first.backends[0].storage.name for b in second.backends)

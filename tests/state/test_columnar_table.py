"""The compact layout of ``hashmap`` (:mod:`spark_ckpt.state.backends.columnar`) against a
plain dict: random batches of writes, clears and per-record updates over enough keys to
rebuild its index many times (tombstones included), for the key and value types it holds;
snapshots restore on the dict layout and back; a schema change moves a state between the
layouts."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.protocol.state_handles import BlobRef
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.backends.columnar import ColumnarStateTable, HashIndex, holds
from spark_ckpt.state.backends.heap import HeapStateTable
from spark_ckpt.state.descriptor import ListStateDescriptor, ValueStateDescriptor
from spark_ckpt.state.state_restore import restore_backend
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

MAX_P = 128


def test_the_layout_follows_the_types() -> None:
    count = ValueStateDescriptor("c", pa.int64())
    assert holds(count, pa.int64()) and holds(count, pa.uint8())
    assert holds(ValueStateDescriptor("t", pa.timestamp("us", "UTC")), pa.int32())
    assert not holds(count, pa.string())
    assert not holds(ValueStateDescriptor("b", pa.bool_()), pa.int64())
    assert not holds(ValueStateDescriptor("s", pa.string()), pa.int64())
    assert not holds(ListStateDescriptor("l", pa.int64()), pa.int64())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 3000), max_size=300),
        max_size=12,
    ),
    st.data(),
)
def test_the_hash_index_finds_what_was_inserted_and_not_what_was_removed(
    batches: list[list[int]], data: st.DataObject
) -> None:
    index, model = HashIndex(), {}
    value = index.payload(np.int64)
    for batch in batches:
        keys = np.array(list(dict.fromkeys(batch)), dtype=np.int64)
        slots = index.find(keys)
        fresh = keys[slots < 0]
        index.columns[value][index.insert(fresh)] = fresh ^ 0x55
        model.update({int(k): int(k) ^ 0x55 for k in fresh})
        gone = data.draw(
            st.lists(st.sampled_from(sorted(model)), unique=True) if model else st.just([])
        )
        index.remove(index.find(np.array(gone, dtype=np.int64)))
        for k in gone:
            del model[k]
        assert index.size == len(model)
        probe = np.array([*model, *gone, 7, -7], dtype=np.int64)
        found = index.find(probe)
        assert [index.find_one(int(k)) for k in probe] == found.tolist()
        present = [k in model for k in probe.tolist()]
        assert (found >= 0).tolist() == present
        assert index.columns[value][found[found >= 0]].tolist() == [
            k ^ 0x55 for k in probe.tolist() if k in model
        ]


_INVERSE = pow(0x9E3779B97F4A7C15, -1, 1 << 64)  # of the index's hash multiplier


def _signed(k: int) -> int:
    return k - (1 << 64) if k >= 1 << 63 else k


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 2**32 - 1) | st.integers(0, 5))
        | st.tuples(st.just(-1), st.integers(-(2**63), 2**63 - 1)),
        max_size=400,
    ),
    st.booleans(),
)
def test_keys_placed_into_an_empty_index_are_found_and_a_repeat_keeps_its_last_row(
    drawn: list[tuple[int, int]], sort_first: bool
) -> None:
    """Keys whose hashes share their top half (the placement sorts by it, then by the
    whole hash), repeats, and input already in hash order (the timsort path)."""
    keys_list = [
        v if top < 0 else _signed((((top << 32) | v) * _INVERSE) % (1 << 64)) for top, v in drawn
    ]
    if sort_first:  # in hash order, as a snapshot of this layout gives them
        keys_list.sort(key=lambda k: (k * 0x9E3779B97F4A7C15) % (1 << 64))
    keys = np.array(keys_list, dtype=np.int64)
    rows = np.arange(len(keys), dtype=np.int64)
    index = HashIndex()
    value = index.payload(np.int64)
    taken, slots = index.place(keys)
    index.columns[value][slots] = rows[taken]
    last = {k: i for i, k in enumerate(keys_list)}
    assert index.size == len(last) == len(taken) == len(set(slots.tolist()))
    found = index.find(np.array(list(last), dtype=np.int64))
    assert index.columns[value][found].tolist() == list(last.values())
    again = HashIndex()
    assert (again.insert(keys) == again.find(keys)).all()
    assert again.size == len(last)


KEY_TYPES = {"int64": pa.int64(), "uint64": pa.uint64(), "int16": pa.int16()}
VALUE_TYPES = {
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "float64": (pa.float64(), st.floats(allow_nan=False)),
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "timestamp": (
        pa.timestamp("us", "UTC"),
        st.datetimes(timezones=st.just(UTC), min_value=datetime(1970, 1, 2)),
    ),
}
KEY_RANGES = {
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
    "int16": (-(2**15), 2**15 - 1),
}


def snapshot(b: KeyedStateBackend, store: InMemoryCheckpointStore) -> tuple[BlobRef, ...]:
    """A full snapshot of *b*, written to *store*: the refs a restore reads."""
    snap = b.snapshots.snapshot(1, full=True)
    handle = store.write_task_state(1, snap)
    b.snapshots.notify_checkpoint_complete(1, handle)
    return tuple(handle.blobs)


def backend(key_type: pa.DataType, subtask: int = 0, parallelism: int = 1) -> KeyedStateBackend:
    return KeyedStateBackend.for_subtask("op", subtask, parallelism, key_type, MAX_P)


@pytest.mark.parametrize("key_name", sorted(KEY_TYPES))
@pytest.mark.parametrize("value_name", sorted(VALUE_TYPES))
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_columnar_state_is_the_dict_fold_of_its_writes(
    key_name: str, value_name: str, data: st.DataObject
) -> None:
    key_type, (value_type, values) = KEY_TYPES[key_name], VALUE_TYPES[value_name]
    lo, hi = KEY_RANGES[key_name]
    keys = st.integers(lo, hi) | st.integers(max(lo, 0), min(hi, 2000))
    desc = ValueStateDescriptor("v", value_type)
    b, model = backend(key_type), {}
    for _ in range(data.draw(st.integers(1, 8))):
        batch = data.draw(st.lists(st.tuples(keys, values | st.none()), max_size=400))
        b.put_values(desc, [k for k, _ in batch], pa.array([v for _, v in batch], type=value_type))
        for k, v in batch:
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
        if model:
            cleared = data.draw(st.lists(st.sampled_from(sorted(model)), max_size=20))
            b.clear_values(desc, cleared)
            for k in cleared:
                model.pop(k, None)
        one = data.draw(st.tuples(keys, values | st.none()))
        b.set_current_key(one[0])
        view = b.value_state(desc)
        view.update(one[1]) if one[1] is not None else view.clear()
        model.pop(one[0], None) if one[1] is None else model.__setitem__(one[0], one[1])
        assert isinstance(b.tables["v"], ColumnarStateTable)
        assert b.value_count(desc) == len(model)
        probe = [*model, *data.draw(st.lists(keys, max_size=10))]
        assert b.get_values(desc, probe).to_pylist() == [model.get(k) for k in probe]
        assert b.get_entries(desc, probe) == [model.get(k) for k in probe]
        table = b.to_table(desc)
        assert dict(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True)) == model
        assert table["key_group"].to_pylist() == sorted(table["key_group"].to_pylist())
    for k in list(model)[:3]:
        b.set_current_key(k)
        assert b.value_state(desc).value() == model[k]


def test_a_write_of_old_and_new_keys_that_rebuilds_the_index_keeps_every_value() -> None:
    """The rebuild a batch's new keys cause moves the slots of its old keys too: growing
    (the index fills up) and shrinking (deletes left it mostly tombstones)."""
    count = ValueStateDescriptor("v", pa.int64())
    b = backend(pa.int64())
    b.put_values(count, list(range(700)), pa.array(range(700)))
    b.put_values(count, list(range(800)), pa.array([k + 10_000 for k in range(800)]))
    assert b.get_values(count, list(range(800))).to_pylist() == [k + 10_000 for k in range(800)]
    b = backend(pa.int64())
    b.put_values(count, np.arange(3000), pa.array(np.arange(3000)))
    b.clear_values(count, np.arange(50, 3000))
    b.put_values(count, np.arange(1750), pa.array(np.arange(1750) + 7))
    assert b.get_values(count, np.arange(3000)).to_pylist() == [
        *(k + 7 for k in range(1750)),
        *([None] * 1250),
    ]
    assert b.value_count(count) == 1750


def test_per_record_updates_of_new_keys_rebuild_the_index_and_keep_every_value() -> None:
    count = ValueStateDescriptor("v", pa.int64())
    b = backend(pa.int64())
    view = b.value_state(count)
    for k in range(3000):  # past two rebuilds of the index, one key at a time
        b.set_current_key(k * 7919)
        view.update(k)
    for k in range(0, 3000, 2):
        b.set_current_key(k * 7919)
        view.clear()
    keys = [k * 7919 for k in range(3000)]
    assert b.get_values(count, keys).to_pylist() == [k if k % 2 else None for k in range(3000)]
    assert b.value_count(count) == 1500


def test_a_columnar_snapshot_restores_at_another_parallelism_and_on_the_dict_layout() -> None:
    store = InMemoryCheckpointStore()
    count = ValueStateDescriptor("count", pa.int64())
    first = backend(pa.int64())
    keys = np.arange(0, 50_000, 3, dtype=np.int64)
    first.put_values(count, keys, pa.array(keys * 2))
    first.clear_values(count, keys[::5])
    expected = {int(k): int(k) * 2 for i, k in enumerate(keys) if i % 5}
    refs = snapshot(first, store)
    for p in (1, 3):
        restored = [backend(pa.int64(), s, p) for s in range(p)]
        for r in restored:
            restore_backend(r, refs, store.read_blob)
        got: dict[int, int] = {}
        for r in restored:
            t = r.to_table(count)
            got.update(zip(t["key"].to_pylist(), t["value"].to_pylist(), strict=True))
            assert isinstance(r.tables["count"], ColumnarStateTable)
        assert got == expected


def test_a_schema_change_moves_the_state_between_layouts() -> None:
    """A restored int32 state claimed as int64 stays columnar; a float16 state (which the
    columns do not hold) claimed as float32 moves into them, values migrated."""
    for old, new, before in (
        (
            ValueStateDescriptor("n", pa.int32()),
            ValueStateDescriptor("n", pa.int64()),
            ColumnarStateTable,
        ),
        (
            ValueStateDescriptor("n", pa.float16()),
            ValueStateDescriptor("n", pa.float32()),
            HeapStateTable,
        ),
    ):
        store = InMemoryCheckpointStore()
        first = backend(pa.int64())
        first.put_values(
            old,
            [1, 2, 3],
            pa.array(np.array([10, 20, 30]).astype(old.value_type.to_pandas_dtype())),
        )
        refs = snapshot(first, store)
        second = backend(pa.int64())
        restore_backend(second, refs, store.read_blob)
        assert isinstance(second.tables["n"], before)
        got = second.get_values(new, [1, 2, 3, 4])
        assert isinstance(second.tables["n"], ColumnarStateTable)
        assert got.type == new.value_type and got.to_pylist() == [10, 20, 30, None]
        second.put_values(new, [4], pa.array([40], type=new.value_type))
        assert second.value_count(new) == 4
        assert sorted(second.to_table(new)["value"].to_pylist()) == [10, 20, 30, 40]


def test_the_columns_cost_far_less_than_dict_entries() -> None:
    """The memory the metrics report: at most 64 bytes per int64 -> int64 entry (the index
    never fills less than a third of its slots once it grows)."""
    b = backend(pa.int64())
    count = ValueStateDescriptor("count", pa.int64())
    keys = np.arange(1_000_000, dtype=np.int64) * 7919
    b.put_values(count, keys, pa.array(keys))
    stats = b.storage_stats()
    assert stats.entries == 1_000_000
    assert stats.memory_bytes / stats.entries <= 64

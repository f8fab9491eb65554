"""Value state of a nested type lives in an Arrow arena (``spark_ckpt.state.backends.value_store``):
per-record and vectorized writes interleaved, overwrites and clears, compactions, snapshots
and restores give what a plain dict of the written values gives."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.backends.columnar import ColumnarStateTable
from spark_ckpt.state.backends.value_store import ArrowValues, PythonValues
from spark_ckpt.state.descriptor import ValueStateDescriptor
from spark_ckpt.state.state_restore import restore_backends
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

WINDOW = pa.struct([("start", pa.int64()), ("end", pa.int64()), ("n", pa.int64())])
WINDOWS = ValueStateDescriptor("windows", pa.list_(WINDOW))
KEYS = 40

windows = st.one_of(
    st.none(),
    st.lists(
        st.fixed_dictionaries(
            {"start": st.integers(0, 99), "end": st.integers(100, 199), "n": st.integers(0, 9)}
        ),
        max_size=3,
    ),
)
put = st.tuples(st.just("put"), st.lists(st.tuples(st.integers(0, KEYS - 1), windows)))
one = st.tuples(st.just("one"), st.tuples(st.integers(0, KEYS - 1), windows))
snapshot = st.tuples(st.just("snapshot"), st.booleans())
step = st.one_of(put, one, snapshot)


def test_each_state_is_held_in_the_layout_of_its_types() -> None:
    """Nested values in Arrow, other values of a string key in Python objects, primitive
    values of an integer key in the compact columns."""
    b = KeyedStateBackend.for_subtask("op", 0, 1, pa.int64(), 128)
    b.get_values(WINDOWS, [1])
    b.get_values(ValueStateDescriptor("count", pa.int64()), [1])
    b.get_values(ValueStateDescriptor("name", pa.string()), [1])
    assert isinstance(b.tables["windows"].values, ArrowValues)
    assert isinstance(b.tables["name"].values, PythonValues)
    assert isinstance(b.tables["count"], ColumnarStateTable)
    by_name = KeyedStateBackend.for_subtask("op", 0, 1, pa.string(), 128)
    by_name.get_values(ValueStateDescriptor("count", pa.int64()), ["a"])
    assert isinstance(by_name.tables["count"].values, PythonValues)


def write(model: dict[int, Any], key: int, value: Any) -> None:
    if value is None:
        model.pop(key, None)
    else:
        model[key] = value


def read_all(b: KeyedStateBackend) -> dict[int, Any]:
    keys = list(range(KEYS))
    values = b.get_values(WINDOWS, keys).to_pylist()
    return {k: v for k, v in zip(keys, values, strict=True) if v is not None}


@settings(max_examples=150, deadline=None)
@given(st.lists(step, max_size=40))
def test_arena_values_match_a_dict_through_snapshots_and_restores(steps: list[Any]) -> None:
    b = KeyedStateBackend.for_subtask("op", 0, 1, pa.int64(), 128)
    store = InMemoryCheckpointStore()
    model: dict[int, Any] = {}
    view = b.value_state(WINDOWS)
    checkpoints: list[tuple[Any, dict[int, Any]]] = []
    for cid, (kind, arg) in enumerate(steps, start=1):
        if kind == "put":
            for k, v in arg:  # the last occurrence of a key wins, as put_values says
                write(model, k, v)
            keys = pa.array([k for k, _ in arg], pa.int64())
            b.put_values(WINDOWS, keys, pa.array([v for _, v in arg], WINDOWS.value_type))
        elif kind == "one":
            k, v = arg
            b.set_current_key(k)
            view.update(v)
            write(model, k, v)
            b.set_current_key((k + 1) % KEYS)
            assert view.value() == model.get((k + 1) % KEYS)
        else:
            handle = store.write_task_state(cid, b.snapshots.snapshot(cid, full=arg))
            b.snapshots.notify_checkpoint_complete(cid, handle)
            checkpoints.append((handle, dict(model)))
        assert read_all(b) == model
    assert {r["key"]: r["value"] for r in b.to_table(WINDOWS).to_pylist()} == model
    for handle, expected in checkpoints[-3:]:
        for p in (1, 2):
            restored = restore_backends("op", pa.int64(), p, handle.blobs, store.read_blob, 128)
            found: dict[int, Any] = {}
            for r in restored:
                found.update({row["key"]: row["value"] for row in r.to_table(WINDOWS).to_pylist()})
            assert found == expected


def test_overwrites_are_compacted_and_reads_span_many_arrays() -> None:
    b = KeyedStateBackend.for_subtask("op", 0, 1, pa.int64(), 128)
    keys = pa.array(range(10_000), pa.int64())
    for i in range(40):  # every key overwritten, and a slice of them, many times
        some = keys if i % 4 == 0 else keys.slice(i * 100, 500)
        values = pa.array([[{"start": i, "end": k, "n": 1}] for k in some.to_pylist()])
        b.put_values(WINDOWS, some, values.cast(WINDOWS.value_type))
        arena = b.tables["windows"].values
        assert isinstance(arena, ArrowValues)
        assert arena._size <= 2 * 10_000 + 4096 + len(some)
    got = b.get_values(WINDOWS, keys).to_pylist()
    last = {k: 36 for k in range(10_000)}
    for i in range(37, 40):
        last.update({k: i for k in range(i * 100, i * 100 + 500)})
    assert [w[0]["start"] for w in got] == [last[k] for k in range(10_000)]

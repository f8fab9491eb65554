"""State schema evolution on restore (:mod:`spark_ckpt.state.schema_evolution`).

Every case snapshots a backend written with the *old* descriptor into an
``InMemoryCheckpointStore`` and restores it into a backend with the *new* one, in both ways
a restore meets a descriptor: registered before the restore (what a task does: ``open``
runs first) and registered after it (lazy claim). Oracle: the expected values are written
out in the test as plain Python (old value -> new value), never computed by the code under
test.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import StateError
from spark_ckpt.protocol.state_handles import BlobKind, BlobRef
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.descriptor import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from spark_ckpt.state.schema_evolution import plan_migration
from spark_ckpt.state.state_restore import restore_backend
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

UID = "counter"
MAX_P = 8
KEYS = range(40)
INT64 = pa.int64()


def fresh(key_type: pa.DataType = INT64) -> KeyedStateBackend:
    return KeyedStateBackend.for_subtask(UID, 0, 1, key_type, MAX_P)


def register(b: KeyedStateBackend, d: StateDescriptor) -> None:
    if isinstance(d, ValueStateDescriptor):
        b.value_state(d)
    elif isinstance(d, ListStateDescriptor):
        b.list_state(d)
    else:
        b.map_state(d)


def write(b: KeyedStateBackend, d: StateDescriptor, values: dict[int, Any]) -> None:
    """Store *values* (key -> value / list / dict) under *d* with the per-record API."""
    for k, v in values.items():
        b.set_current_key(k)
        if isinstance(d, ValueStateDescriptor):
            b.value_state(d).update(v)
        elif isinstance(d, ListStateDescriptor):
            b.list_state(d).update(v)
        else:
            b.map_state(d).put_all(v.items())


def read(b: KeyedStateBackend, d: StateDescriptor) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for k in b.keys(d).to_pylist():
        b.set_current_key(k)
        if isinstance(d, ValueStateDescriptor):
            out[k] = b.value_state(d).value()
        elif isinstance(d, ListStateDescriptor):
            out[k] = b.list_state(d).get()
        else:
            out[k] = dict(b.map_state(d).items())
    return out


def checkpoint(
    old: StateDescriptor, values: dict[int, Any], store: InMemoryCheckpointStore | None = None
) -> tuple[InMemoryCheckpointStore, tuple[BlobRef, ...]]:
    store = store or InMemoryCheckpointStore()
    b = fresh()
    register(b, old)
    write(b, old, values)
    handle = store.write_task_state(1, b.snapshots.snapshot(1))
    return store, handle.blobs


def restore(
    new: StateDescriptor, store: InMemoryCheckpointStore, refs: tuple[BlobRef, ...], *, eager: bool
) -> KeyedStateBackend:
    """Restore with *new* registered before (eager: the task's order) or after the restore."""
    b = fresh()
    if eager:
        register(b, new)
    restore_backend(b, refs, store.read_blob)
    if not eager:
        register(b, new)
    return b


# -- allowed changes ---------------------------------------------------------------------------

S = pa.string()
STRUCT_OLD = pa.struct([("total", pa.int32()), ("label", S)])
STRUCT_NEW = pa.struct([("total", pa.int64()), ("label", S), ("avg", pa.float64())])
NESTED_OLD = pa.struct([("stats", pa.struct([("total", pa.int32())])), ("tag", S)])
NESTED_NEW = pa.struct(
    [
        ("stats", pa.struct([("total", pa.int64()), ("n", pa.int16())])),
        ("tag", S),
        ("extra", pa.list_(pa.int64())),
    ]
)
REQUIRED = pa.struct([pa.field("a", pa.int32(), nullable=False)])
RELAXED = pa.struct([pa.field("a", pa.int64(), nullable=True)])


def ints(k: int) -> int:
    return k * 3 - 50


#: (id, old descriptor, new descriptor, stored value of key k, expected value of key k)
ALLOWED: list[
    tuple[str, StateDescriptor, StateDescriptor, Callable[[int], Any], Callable[[int], Any]]
] = [
    (
        "int8->int16",
        ValueStateDescriptor("v", pa.int8()),
        ValueStateDescriptor("v", pa.int16()),
        ints,
        ints,
    ),
    (
        "int16->int32",
        ValueStateDescriptor("v", pa.int16()),
        ValueStateDescriptor("v", pa.int32()),
        ints,
        ints,
    ),
    (
        "int32->int64",
        ValueStateDescriptor("v", pa.int32()),
        ValueStateDescriptor("v", pa.int64()),
        lambda k: k * 5 * 10**7,
        lambda k: k * 5 * 10**7,
    ),
    (
        "uint8->uint32",
        ValueStateDescriptor("v", pa.uint8()),
        ValueStateDescriptor("v", pa.uint32()),
        lambda k: k + 200,
        lambda k: k + 200,
    ),
    (
        "uint16->int32",
        ValueStateDescriptor("v", pa.uint16()),
        ValueStateDescriptor("v", pa.int32()),
        lambda k: 65000 + k,
        lambda k: 65000 + k,
    ),
    (
        "uint32->uint64",
        ValueStateDescriptor("v", pa.uint32()),
        ValueStateDescriptor("v", pa.uint64()),
        lambda k: 4_000_000_000 + k,
        lambda k: 4_000_000_000 + k,
    ),
    (
        "float32->float64",
        ValueStateDescriptor("v", pa.float32()),
        ValueStateDescriptor("v", pa.float64()),
        lambda k: k / 4,
        lambda k: k / 4,
    ),
    (
        "int32->float64",
        ValueStateDescriptor("v", pa.int32()),
        ValueStateDescriptor("v", pa.float64()),
        ints,
        lambda k: float(ints(k)),
    ),
    (
        "int16->float32",
        ValueStateDescriptor("v", pa.int16()),
        ValueStateDescriptor("v", pa.float32()),
        ints,
        lambda k: float(ints(k)),
    ),
    (
        "struct: widened field, new nullable field",
        ValueStateDescriptor("stats", STRUCT_OLD),
        ValueStateDescriptor("stats", STRUCT_NEW),
        lambda k: {"total": k, "label": f"l{k}" if k % 3 else None},
        lambda k: {"total": k, "label": f"l{k}" if k % 3 else None, "avg": None},
    ),
    (
        "nested struct: new fields at two levels",
        ValueStateDescriptor("stats", NESTED_OLD),
        ValueStateDescriptor("stats", NESTED_NEW),
        lambda k: {"stats": None if k % 5 == 0 else {"total": k}, "tag": "t"},
        lambda k: {
            "stats": None if k % 5 == 0 else {"total": k, "n": None},
            "tag": "t",
            "extra": None,
        },
    ),
    (
        "struct: fields reordered",
        ValueStateDescriptor("pair", pa.struct([("a", pa.int32()), ("b", S)])),
        ValueStateDescriptor("pair", pa.struct([("b", S), ("a", pa.int32())])),
        lambda k: {"a": k, "b": str(k)},
        lambda k: {"b": str(k), "a": k},
    ),
    (
        "struct: non-nullable field becomes nullable and wider",
        ValueStateDescriptor("req", REQUIRED),
        ValueStateDescriptor("req", RELAXED),
        lambda k: {"a": k},
        lambda k: {"a": k},
    ),
    (
        "list: widened elements",
        ListStateDescriptor("events", pa.int32()),
        ListStateDescriptor("events", pa.int64()),
        lambda k: list(range(k % 4 + 1)),
        lambda k: list(range(k % 4 + 1)),
    ),
    (
        "list: struct elements gain a nullable field",
        ListStateDescriptor("events", pa.struct([("x", pa.int8())])),
        ListStateDescriptor("events", pa.struct([("x", pa.int32()), ("y", S)])),
        lambda k: [{"x": i} for i in range(k % 3 + 1)],
        lambda k: [{"x": i, "y": None} for i in range(k % 3 + 1)],
    ),
    (
        "map: widened values (nulls stay null)",
        MapStateDescriptor("attrs", S, pa.int32()),
        MapStateDescriptor("attrs", S, pa.int64()),
        lambda k: {"a": k, "b": None} if k % 2 else {"c": -k},
        lambda k: {"a": k, "b": None} if k % 2 else {"c": -k},
    ),
    (
        "map: struct values gain a nullable field",
        MapStateDescriptor("attrs", pa.int64(), pa.struct([("n", pa.float32())])),
        MapStateDescriptor("attrs", pa.int64(), pa.struct([("n", pa.float64()), ("m", S)])),
        lambda k: {k: {"n": 0.5}, k + 1: None},
        lambda k: {k: {"n": 0.5, "m": None}, k + 1: None},
    ),
]


@pytest.mark.parametrize("eager", [True, False], ids=["registered-before", "registered-after"])
@pytest.mark.parametrize(
    ("old", "new", "stored", "expected"),
    [case[1:] for case in ALLOWED],
    ids=[case[0] for case in ALLOWED],
)
def test_compatible_change_restores_migrated_values(
    old: StateDescriptor,
    new: StateDescriptor,
    stored: Callable[[int], Any],
    expected: Callable[[int], Any],
    eager: bool,
) -> None:
    store, refs = checkpoint(old, {k: stored(k) for k in KEYS})
    b = restore(new, store, refs, eager=eager)
    oracle = {k: expected(k) for k in KEYS}
    assert read(b, new) == oracle
    assert b.descriptors() == [new]
    assert b.to_table(new).schema.field("value").type == new.column_type
    # the next checkpoint holds the new type, and restores as is
    snap = b.snapshots.snapshot(2)
    kinds = {(x.kind, x.table.schema.field("value").type) for x in snap.new_blobs}
    if eager:  # migrated at restore: a new chain starts
        assert kinds == {(BlobKind.KEYED_FULL, new.column_type)}
    handle = store.write_task_state(2, snap)
    again = restore(new, store, handle.blobs, eager=True)
    assert read(again, new) == oracle


def test_widened_value_state_works_with_the_vectorized_api() -> None:
    old, new = ValueStateDescriptor("count", pa.int32()), ValueStateDescriptor("count", pa.int64())
    store, refs = checkpoint(old, {k: k for k in KEYS})
    b = restore(new, store, refs, eager=True)
    keys = pa.array(list(KEYS), pa.int64())
    got = b.get_values(new, keys)
    assert got.type == pa.int64() and got.to_pylist() == list(KEYS)
    b.put_values(new, keys, pa.array([k + 2**40 for k in KEYS], pa.int64()))
    handle = store.write_task_state(2, b.snapshots.snapshot(2))
    assert read(restore(new, store, handle.blobs, eager=True), new) == {k: k + 2**40 for k in KEYS}


def test_chain_across_a_lazy_migration_restores_in_both_orders() -> None:
    """Registered after the restore, a migrated state keeps its old chain as the base: the
    next delta (new type) is appended to a FULL blob of the old type. Such a mixed chain
    restores whichever way the descriptor meets it."""
    old, new = ValueStateDescriptor("v", pa.int32()), ValueStateDescriptor("v", pa.int64())
    store, refs = checkpoint(old, {k: k for k in KEYS})
    b = restore(new, store, refs, eager=False)
    b.put_values(new, pa.array([1, 2]), pa.array([2**40, 2**41]))
    snap = b.snapshots.snapshot(2)
    assert [x.kind for x in snap.new_blobs] == [BlobKind.KEYED_DELTA]
    handle = store.write_task_state(2, snap)
    oracle = {k: k for k in KEYS} | {1: 2**40, 2: 2**41}
    assert read(restore(new, store, handle.blobs, eager=True), new) == oracle
    assert read(restore(new, store, handle.blobs, eager=False), new) == oracle
    lazily = fresh()
    restore_backend(lazily, handle.blobs, store.read_blob)  # nothing registered: adopt the join
    assert lazily.descriptors() == [new] and lazily.unclaimed_states() == ["v"]


def test_integer_beyond_float64_precision_is_refused() -> None:
    old, new = ValueStateDescriptor("v", pa.int64()), ValueStateDescriptor("v", pa.float64())
    store, refs = checkpoint(old, {1: 2**53 + 1})
    with pytest.raises(StateError, match="state 'v' of operator 'counter'"):
        restore(new, store, refs, eager=True)
    store, refs = checkpoint(old, {1: 2**53})  # exact: fine
    assert read(restore(new, store, refs, eager=True), new) == {1: float(2**53)}


# -- added and removed states ----------------------------------------------------------------


def test_added_state_starts_empty_and_removed_state_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kept = ValueStateDescriptor("kept", pa.int64())
    removed = ListStateDescriptor("removed", S)
    added = MapStateDescriptor("added", S, pa.int64())
    store = InMemoryCheckpointStore()
    b = fresh()
    write(b, kept, {k: k for k in KEYS})
    write(b, removed, {k: ["x"] for k in KEYS})
    b.operator_list_state("old_offsets", pa.int64()).add_all([1, 2])
    refs = store.write_task_state(1, b.snapshots.snapshot(1)).blobs

    new = fresh()
    register(new, kept)
    register(new, added)
    with caplog.at_level(logging.INFO, logger="spark_ckpt.state.state_restore"):
        restore_backend(new, refs, store.read_blob)
    assert read(new, kept) == {k: k for k in KEYS}
    assert new.value_count(added) == 0
    assert [d.name for d in new.descriptors()] == ["added", "kept"]
    assert new.operator_state_types() == {} and new.unclaimed_states() == []
    logged = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert "state 'removed' of operator 'counter'" in logged and "dropped" in logged
    assert "'old_offsets'" in logged
    snap = new.snapshots.snapshot(2)
    assert {x.state_name for x in snap.new_blobs} | {x.state_name for x in snap.reused} == {"kept"}


def test_without_registrations_every_stored_state_is_adopted_unclaimed() -> None:
    store, refs = checkpoint(ValueStateDescriptor("v", pa.int32()), {1: 1})
    b = fresh()
    restore_backend(b, refs, store.read_blob)
    assert b.unclaimed_states() == ["v"]
    b.value_state(ValueStateDescriptor("v", pa.int64()))  # claims (and migrates)
    assert b.unclaimed_states() == []
    with pytest.raises(StateError):  # claimed: its descriptor is fixed now
        b.value_state(ValueStateDescriptor("v", pa.float64()))


# -- operator list state -----------------------------------------------------------------------


@pytest.mark.parametrize("eager", [True, False])
def test_operator_list_state_elements_widen(eager: bool) -> None:
    store = InMemoryCheckpointStore()
    b = fresh()
    b.operator_list_state("offsets", pa.int32()).add_all([3, 1, 2])
    refs = store.write_task_state(1, b.snapshots.snapshot(1)).blobs
    r = fresh()
    if eager:
        r.operator_list_state("offsets", pa.int64())
    restore_backend(r, refs, store.read_blob)
    state = r.operator_list_state("offsets", pa.int64())
    assert state.get() == [3, 1, 2] and state.element_type == pa.int64()
    bad = fresh()
    if eager:
        bad.operator_list_state("offsets", S)
        with pytest.raises(StateError, match="operator state 'offsets' of operator 'counter'"):
            restore_backend(bad, refs, store.read_blob)
    else:
        restore_backend(bad, refs, store.read_blob)
        with pytest.raises(StateError, match="operator state 'offsets' of operator 'counter'"):
            bad.operator_list_state("offsets", S)


# -- refused changes ---------------------------------------------------------------------------

V = ValueStateDescriptor
REFUSED: list[tuple[str, StateDescriptor, StateDescriptor, Any, str]] = [
    (
        "string->int64",
        V("count", S),
        V("count", pa.int64()),
        "7",
        "value type changed from string to int64: incompatible",
    ),
    (
        "narrowing int64->int32",
        V("count", pa.int64()),
        V("count", pa.int32()),
        7,
        "changed from int64 to int32",
    ),
    (
        "uint32->int32",
        V("count", pa.uint32()),
        V("count", pa.int32()),
        7,
        "changed from uint32 to int32",
    ),
    (
        "int32->uint64",
        V("count", pa.int32()),
        V("count", pa.uint64()),
        7,
        "changed from int32 to uint64",
    ),
    (
        "int64->float32",
        V("count", pa.int64()),
        V("count", pa.float32()),
        7,
        "changed from int64 to float: incompatible",
    ),
    (
        "float64->float32",
        V("count", pa.float64()),
        V("count", pa.float32()),
        0.5,
        "changed from double to float",
    ),
    (
        "struct field string->int64",
        V("count", pa.struct([("stats", pa.struct([("total", S)]))])),
        V("count", pa.struct([("stats", pa.struct([("total", pa.int64())]))])),
        {"stats": {"total": "1"}},
        "state 'count' of operator 'counter': field 'stats.total' changed from string to int64: "
        "incompatible",
    ),
    (
        "new non-nullable field",
        V("count", pa.struct([("stats", pa.struct([("total", pa.int64())]))])),
        V(
            "count",
            pa.struct(
                [("stats", pa.struct([("total", pa.int64()), pa.field("n", pa.int64(), False)]))]
            ),
        ),
        {"stats": {"total": 1}},
        "field 'stats.n' was added as non-nullable",
    ),
    (
        "removed struct field",
        V("count", pa.struct([("total", pa.int64()), ("label", S)])),
        V("count", pa.struct([("total", pa.int64())])),
        {"total": 1, "label": "x"},
        "field 'label' (string) was removed",
    ),
    (
        "nullable field becomes non-nullable",
        V("count", pa.struct([("total", pa.int64())])),
        V("count", pa.struct([pa.field("total", pa.int64(), False)])),
        {"total": 1},
        "field 'total' changed from nullable to non-nullable",
    ),
    (
        "list element narrowing",
        ListStateDescriptor("count", pa.int64()),
        ListStateDescriptor("count", pa.int8()),
        [1],
        "field 'element' changed from int64 to int8",
    ),
    (
        "list element struct field type",
        ListStateDescriptor("count", pa.struct([("x", pa.int64())])),
        ListStateDescriptor("count", pa.struct([("x", S)])),
        [{"x": 1}],
        "field 'element.x' changed from int64 to string",
    ),
    (
        "map key type",
        MapStateDescriptor("count", pa.int32(), pa.int64()),
        MapStateDescriptor("count", pa.int64(), pa.int64()),
        {1: 1},
        "field 'key' changed from int32 to int64",
    ),
    (
        "map value type",
        MapStateDescriptor("count", S, pa.int64()),
        MapStateDescriptor("count", S, S),
        {"a": 1},
        "field 'value' changed from int64 to string",
    ),
    (
        "value -> list",
        V("count", pa.int64()),
        ListStateDescriptor("count", pa.int64()),
        1,
        "changed from value state to list state",
    ),
    (
        "map -> value",
        MapStateDescriptor("count", S, pa.int64()),
        V("count", pa.map_(S, pa.int64())),
        {"a": 1},
        "changed from map state to value state",
    ),
    (
        "list -> large_list",
        V("count", pa.list_(pa.int64())),
        V("count", pa.large_list(pa.int64())),
        [1],
        "changed from list<item: int64> to large_list",
    ),
]


@pytest.mark.parametrize("eager", [True, False], ids=["registered-before", "registered-after"])
@pytest.mark.parametrize(
    ("old", "new", "value", "message"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
def test_incompatible_change_is_refused_naming_state_and_field(
    old: StateDescriptor, new: StateDescriptor, value: Any, message: str, eager: bool
) -> None:
    store, refs = checkpoint(old, {1: value})
    with pytest.raises(StateError) as raised:
        restore(new, store, refs, eager=eager)
    text = str(raised.value)
    assert "state 'count' of operator 'counter'" in text, text
    assert message in text, text


def test_changed_key_type_is_refused_naming_the_state() -> None:
    store, refs = checkpoint(ValueStateDescriptor("count", pa.int64()), {1: 1})
    b = fresh(pa.int32())
    b.value_state(ValueStateDescriptor("count", pa.int64()))
    with pytest.raises(StateError, match="state 'count' of operator 'counter': key type changed"):
        restore_backend(b, refs, store.read_blob)


def test_keyed_state_redeclared_as_operator_state_is_refused() -> None:
    store, refs = checkpoint(ValueStateDescriptor("count", pa.int64()), {1: 1})
    b = fresh()
    b.operator_list_state("count", pa.int64())
    with pytest.raises(StateError, match="changed from keyed state to operator list state"):
        restore_backend(b, refs, store.read_blob)


# -- the migration itself (pure) ------------------------------------------------------------


def test_migration_handles_slices_chunks_and_nulls() -> None:
    old = pa.struct([("xs", pa.list_(pa.int32())), ("m", pa.map_(S, pa.int8()))])
    new = pa.struct(
        [("xs", pa.list_(pa.int64())), ("m", pa.map_(S, pa.int64())), ("z", pa.bool_())]
    )
    rows = [
        {"xs": [1, 2], "m": [("a", 1)]},
        None,
        {"xs": None, "m": None},
        {"xs": [], "m": [("b", None)]},
        {"xs": [3], "m": []},
    ]
    expected = [
        {"xs": [1, 2], "m": [("a", 1)], "z": None},
        None,
        {"xs": None, "m": None, "z": None},
        {"xs": [], "m": [("b", None)], "z": None},
        {"xs": [3], "m": [], "z": None},
    ]
    arr = pa.array(rows, type=old)
    m = plan_migration(old, new, state="s")
    assert not m.is_identity and plan_migration(old, old, state="s").is_identity
    for start in range(len(rows)):
        for stop in range(start, len(rows) + 1):
            out = m(arr.slice(start, stop - start))
            assert out.type == new
            assert out.to_pylist() == expected[start:stop]
    chunked = pa.chunked_array([arr.slice(0, 2), arr.slice(2)])
    out = m(chunked)
    assert isinstance(out, pa.ChunkedArray) and out.to_pylist() == expected


# -- property: integer widths ------------------------------------------------------------------

INT_TYPES = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint16(),
    pa.uint32(),
    pa.uint64(),
]


def bounds(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    if pa.types.is_signed_integer(t):
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def widens(src: pa.DataType, dst: pa.DataType) -> bool:
    """Oracle: *dst* holds every value of *src* (range inclusion)."""
    lo, hi = bounds(src)
    dlo, dhi = bounds(dst)
    return dlo <= lo and hi <= dhi


@settings(max_examples=60, deadline=None)
@given(
    src=st.sampled_from(INT_TYPES),
    dst=st.sampled_from(INT_TYPES),
    data=st.data(),
)
def test_integer_width_changes_restore_iff_they_widen(
    src: pa.DataType, dst: pa.DataType, data: st.DataObject
) -> None:
    lo, hi = bounds(src)
    values = data.draw(st.dictionaries(st.integers(0, 30), st.integers(lo, hi), min_size=1))
    store, refs = checkpoint(ValueStateDescriptor("n", src), values)
    new = ValueStateDescriptor("n", dst)
    if widens(src, dst):
        assert read(restore(new, store, refs, eager=True), new) == values
    else:
        with pytest.raises(
            StateError,
            match=f"state 'n' of operator 'counter': value type changed from {src} to {dst}",
        ):
            restore(new, store, refs, eager=True)

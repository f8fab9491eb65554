"""The keyed/operator state backend and its (incremental) snapshots.

Oracle everywhere: plain Python dicts updated alongside the backend (key -> value,
key -> list, key -> {map key: value}); snapshots are checked by writing them to an
``InMemoryCheckpointStore`` and restoring fresh backends from the handles.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import CorruptCheckpointError, StateError
from spark_ckpt.protocol.state_handles import BlobKind, BlobRef, TaskSnapshot, TaskStateHandle
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.descriptor import (
    META_KEY_GROUP_HASH,
    META_STATE_KIND,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from spark_ckpt.state.keygroup import (
    HASH_NAME,
    KeyGroupRange,
    key_group_indices,
    key_groups,
    range_for_subtask,
)
from spark_ckpt.state.snapshot.chain_rules import MAX_CHAIN_DELTAS
from spark_ckpt.state.state_restore import restore_backend, restore_backends
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

INT64 = pa.int64()
COUNT = ValueStateDescriptor("count", pa.int64())
EVENTS = ListStateDescriptor("events", pa.string())
ATTRS = MapStateDescriptor("attrs", pa.string(), pa.int64())


def backend(
    parallelism: int = 1, subtask: int = 0, max_p: int = 128, key_type: pa.DataType = INT64
) -> KeyedStateBackend:
    return KeyedStateBackend.for_subtask("op", subtask, parallelism, key_type, max_p)


def complete(
    store: InMemoryCheckpointStore, b: KeyedStateBackend, snap: TaskSnapshot, cid: int
) -> TaskStateHandle:
    handle = store.write_task_state(cid, snap)
    b.snapshots.notify_checkpoint_complete(cid, handle)
    return handle


def checkpoint(
    store: InMemoryCheckpointStore, b: KeyedStateBackend, cid: int, full: bool = False
) -> TaskStateHandle:
    return complete(store, b, b.snapshots.snapshot(cid, full=full), cid)


def table_dict(t: pa.Table, kind: str = "value") -> dict[Any, Any]:
    rows = t.to_pylist()
    if kind == "map":
        return {r["key"]: dict(r["value"]) for r in rows}
    return {r["key"]: r["value"] for r in rows}


def contents(
    backends: list[KeyedStateBackend],
) -> tuple[dict[Any, Any], dict[Any, Any], dict[Any, Any]]:
    values: dict[Any, Any] = {}
    lists: dict[Any, Any] = {}
    maps: dict[Any, Any] = {}
    for b in backends:
        values.update(table_dict(b.to_table(COUNT)))
        lists.update(table_dict(b.to_table(EVENTS)))
        maps.update(table_dict(b.to_table(ATTRS), "map"))
    return values, lists, maps


def restored(
    store: InMemoryCheckpointStore, refs: tuple[BlobRef, ...], p: int = 1, max_p: int = 128
) -> list[KeyedStateBackend]:
    return restore_backends("op", pa.int64(), p, refs, store.read_blob, max_p)


# -- per-record and vectorized access ------------------------------------------------------


def test_per_record_api_matches_dict_model() -> None:
    b = backend()
    v, lst, m = b.value_state(COUNT), b.list_state(EVENTS), b.map_state(ATTRS)
    model_v: dict[int, int] = {}
    model_l: dict[int, list[str]] = {}
    model_m: dict[int, dict[str, int | None]] = {}
    for i in range(200):
        k = i % 17
        b.set_current_key(k)
        model_v[k] = model_v.get(k, 0) + i
        v.update((v.value() or 0) + i)
        lst.add(f"e{i}")
        model_l.setdefault(k, []).append(f"e{i}")
        if i % 3 == 0:
            m.put(f"a{i % 5}", i)
            model_m.setdefault(k, {})[f"a{i % 5}"] = i
        if i % 7 == 0:
            m.remove(f"a{(i + 1) % 5}")
            model_m.get(k, {}).pop(f"a{(i + 1) % 5}", None)
            if k in model_m and not model_m[k]:
                del model_m[k]
        if i % 11 == 0:
            v.clear()
            model_v.pop(k)
    b.set_current_key(3)
    m.put("nullable", None)
    model_m.setdefault(3, {})["nullable"] = None
    assert m.contains("nullable") and m.get("nullable") is None and not m.contains("zz")
    assert dict(m.items()) == model_m[3]
    assert m.keys() == list(model_m[3]) and m.values() == list(model_m[3].values())
    lst.update(["x", "y"])
    model_l[3] = ["x", "y"]
    assert lst.get() == ["x", "y"]
    b.set_current_key(4)
    lst.update([])
    model_l.pop(4)
    assert lst.get() == [] and b.current_key == 4
    assert contents([b]) == (model_v, model_l, model_m)
    assert b.value_count(COUNT) == len(model_v)
    assert b.value_count() == len(model_v) + len(model_l) + len(model_m)
    b.set_current_key(999)
    assert m.is_empty() and v.value() is None


@pytest.mark.parametrize("key_type", [pa.int64(), pa.string()])
def test_vectorized_get_put_clear(key_type: pa.DataType) -> None:
    b = backend(key_type=key_type)

    def key(i: int) -> Any:
        return i if key_type == pa.int64() else f"k{i}"

    model: dict[Any, int] = {}
    for batch in range(5):
        ids = list(range(batch * 30, batch * 30 + 100))
        keys = pa.array([key(i) for i in ids], key_type)
        current = b.get_values(COUNT, keys)
        assert current.to_pylist() == [model.get(key(i)) for i in ids]
        b.put_values(COUNT, keys, pc.add(pc.fill_null(current, 0), 1))
        for i in ids:
            model[key(i)] = model.get(key(i), 0) + 1
    # null value clears; duplicates: the last occurrence wins
    b.put_values(COUNT, [key(1), key(2), key(1)], pa.array([None, 7, 9], pa.int64()))
    model[key(1)] = 9
    model[key(2)] = 7
    b.put_values(COUNT, [key(3), key(3)], pa.array([4, None], pa.int64()))
    model.pop(key(3))
    b.clear_values(COUNT, pa.array([key(10), key(11), key(10_000)], key_type))
    model.pop(key(10))
    model.pop(key(11))
    probe = [key(i) for i in (1, 1, 2, 3, 10, 50, 10_000)]
    assert b.get_values(COUNT, pa.array(probe, key_type)).to_pylist() == [
        model.get(k) for k in probe
    ]
    assert table_dict(b.to_table(COUNT)) == model
    assert sorted(b.keys(COUNT).to_pylist()) == sorted(model)
    # chunked keys work too
    chunked = pa.chunked_array([pa.array(probe[:3], key_type), pa.array(probe[3:], key_type)])
    assert b.get_values(COUNT, chunked).to_pylist() == [model.get(k) for k in probe]


def test_misuse_raises_state_error() -> None:
    b = backend(parallelism=2, subtask=0)
    v = b.value_state(COUNT)
    with pytest.raises(StateError):
        v.value()  # no current key
    mine = [k for k, kg in enumerate(key_groups(pa.array(range(50)), 128).to_pylist()) if kg < 64]
    foreign = [k for k in range(50) if k not in mine]
    with pytest.raises(StateError):
        b.set_current_key(foreign[0])
    with pytest.raises(StateError):
        b.set_current_key(None)
    with pytest.raises(StateError):
        b.set_current_key("not an int")
    with pytest.raises(StateError):
        b.get_values(COUNT, pa.array([mine[0], foreign[0]]))
    with pytest.raises(StateError):
        b.put_values(COUNT, pa.array([foreign[0]]), pa.array([1]))
    with pytest.raises(StateError):
        b.put_values(COUNT, pa.array([mine[0], None]), pa.array([1, 2]))
    with pytest.raises(StateError):
        b.put_values(COUNT, pa.array([mine[0]]), pa.array([1, 2]))
    with pytest.raises(StateError):
        b.put_values(COUNT, pa.array([mine[0]]), pa.array(["x"]))
    assert b.value_count() == 0  # nothing applied by the failed calls
    with pytest.raises(StateError):
        b.value_state(ValueStateDescriptor("count", pa.string()))
    with pytest.raises(StateError):
        b.list_state(ListStateDescriptor("count", pa.int64()))
    with pytest.raises(StateError):
        b.operator_list_state("count", pa.int64())
    with pytest.raises(StateError):
        b.get_values(EVENTS, pa.array([mine[0]]))  # type: ignore[arg-type]
    b.set_current_key(mine[0])
    with pytest.raises(StateError):
        v.update("x")
    with pytest.raises(StateError):
        b.list_state(EVENTS).add(None)
    with pytest.raises(StateError):
        b.map_state(ATTRS).put(None, 1)
    with pytest.raises(StateError):
        KeyedStateBackend("op", 0, pa.float64(), KeyGroupRange(0, 127))
    with pytest.raises(StateError):
        KeyedStateBackend("op", 1, pa.int64(), KeyGroupRange(0, 63), parallelism=2)
    b.snapshots.snapshot(5)
    with pytest.raises(StateError):
        b.snapshots.snapshot(5)
    with pytest.raises(StateError):
        b.snapshots.notify_checkpoint_complete(4, TaskStateHandle(b.task_id))


# -- snapshots -----------------------------------------------------------------------------


def test_blob_schemas_carry_metadata() -> None:
    store = InMemoryCheckpointStore()
    b = backend(max_p=4)
    b.put_values(COUNT, pa.array(range(40)), pa.array(range(40)))
    for k in range(3):
        b.set_current_key(k)
        b.list_state(EVENTS).add("e")
        b.map_state(ATTRS).put("a", 1)
    b.operator_list_state("offsets", pa.int64()).add(7)
    snap = b.snapshots.snapshot(1)
    kinds = {(x.kind, x.state_name) for x in snap.new_blobs}
    assert kinds == {
        (BlobKind.KEYED_FULL, "count"),
        (BlobKind.KEYED_FULL, "events"),
        (BlobKind.KEYED_FULL, "attrs"),
        (BlobKind.OPERATOR, "offsets"),
    }
    for blob in snap.new_blobs:
        meta = blob.table.schema.metadata
        if blob.kind is BlobKind.OPERATOR:
            assert blob.table.schema.names == ["value"] and blob.key_group_start == -1
            continue
        assert meta[META_KEY_GROUP_HASH] == HASH_NAME.encode()
        assert blob.table.schema.names == ["key_group", "key", "value"]
        assert (blob.key_group_start, blob.key_group_end) == (0, 3)  # the subtask's range
        kgs = blob.table.column("key_group").to_pylist()
        assert kgs == sorted(kgs)  # rows sorted by key group
        assert blob.table.schema.field("key").type == pa.int64()
    by_name = {x.state_name: x for x in snap.new_blobs}
    assert by_name["events"].table.schema.field("value").type == pa.list_(pa.string())
    assert by_name["attrs"].table.schema.field("value").type == pa.map_(pa.string(), pa.int64())
    assert by_name["count"].table.schema.metadata[META_STATE_KIND] == b"value"
    complete(store, b, snap, 1)
    b.put_values(COUNT, pa.array([0]), pa.array([None], pa.int64()))
    delta = [x for x in b.snapshots.snapshot(2).new_blobs if x.kind is BlobKind.KEYED_DELTA]
    assert len(delta) == 1
    assert delta[0].table.schema.names == ["key_group", "key", "value", "deleted"]
    kg0 = int(key_group_indices(pa.array([0], pa.int64()), 4)[0])
    assert delta[0].table.to_pylist() == [
        {"key_group": kg0, "key": 0, "value": None, "deleted": True}
    ]
    assert delta[0].seq == 1


def test_snapshot_isolation() -> None:
    store = InMemoryCheckpointStore()
    b = backend()
    b.put_values(COUNT, pa.array(range(100)), pa.array(range(100)))
    for k in range(5):
        b.set_current_key(k)
        b.list_state(EVENTS).add_all(["a", "b"])
        b.map_state(ATTRS).put("x", k)
    expected = contents([b])
    snap = b.snapshots.snapshot(1)
    tables_before = [x.table.to_pylist() for x in snap.new_blobs]
    # mutate in every way, including the in-place paths of list and map state
    b.put_values(COUNT, pa.array(range(50, 150)), pa.array([0] * 100))
    b.clear_values(COUNT, pa.array(range(10)))
    for k in range(5):
        b.set_current_key(k)
        b.list_state(EVENTS).add("c")
        b.map_state(ATTRS).put("y", 1)
        b.map_state(ATTRS).remove("x")
    assert [x.table.to_pylist() for x in snap.new_blobs] == tables_before
    handle = complete(store, b, snap, 1)
    assert contents(restored(store, handle.blobs)) == expected


def test_incremental_snapshot_writes_only_changed_keys() -> None:
    store = InMemoryCheckpointStore()
    b = backend()
    n = 100_000
    model = {k: k for k in range(n)}
    b.put_values(COUNT, pa.array(range(n)), pa.array(range(n)))
    first = checkpoint(store, b, 1)
    full_rows = sum(r.rows for r in first.blobs)
    assert full_rows == n
    # 1% churn: 500 updates, 250 deletes, 250 inserts
    updates, deletes = list(range(0, 1000, 2)), list(range(1, 1000, 4))
    inserts = list(range(n, n + 250))
    b.put_values(COUNT, pa.array(updates + inserts), pa.array([-1] * 750))
    b.clear_values(COUNT, pa.array(deletes))
    for k in updates + inserts:
        model[k] = -1
    for k in deletes:
        model.pop(k)
    snap = b.snapshots.snapshot(2)
    written = sum(x.table.num_rows for x in snap.new_blobs)
    assert written == 1000 and written <= 0.05 * full_rows
    assert all(x.kind is BlobKind.KEYED_DELTA and x.seq == 1 for x in snap.new_blobs)
    tombstones = sum(pc.sum(x.table.column("deleted")).as_py() or 0 for x in snap.new_blobs)
    assert tombstones == len(deletes)
    handle = complete(store, b, snap, 2)
    assert table_dict(restored(store, handle.blobs)[0].to_table(COUNT)) == model
    # unchanged key groups are reused: a snapshot without changes writes nothing keyed
    quiet = b.snapshots.snapshot(3)
    assert quiet.new_blobs == () and set(quiet.reused) == set(handle.blobs)


def test_chains_rebase_after_too_many_deltas_and_restore_correctly() -> None:
    store = InMemoryCheckpointStore()
    b = backend(max_p=2)
    model = {k: 0 for k in range(400)}
    b.put_values(COUNT, pa.array(list(model)), pa.array(list(model.values())))
    handle = checkpoint(store, b, 1)
    seqs_seen: set[int] = set()
    for cid in range(2, 25):
        changed = [(cid * 7 + j) % 450 for j in range(6)]
        for k in changed[:4]:
            model[k] = cid
        for k in changed[4:]:
            model.pop(k, None)
        b.put_values(COUNT, pa.array(changed[:4]), pa.array([cid] * 4))
        b.clear_values(COUNT, pa.array(changed[4:]))
        handle = checkpoint(store, b, cid)
        chains: dict[str, list[BlobRef]] = {}
        for ref in handle.blobs:
            chains.setdefault(ref.state_name, []).append(ref)
        for chain in chains.values():
            seqs = sorted(r.seq for r in chain)
            assert seqs == list(range(len(seqs))) and len(seqs) <= MAX_CHAIN_DELTAS + 1
            seqs_seen.update(seqs)
        assert table_dict(restored(store, handle.blobs, max_p=2)[0].to_table(COUNT)) == model
    assert max(seqs_seen) == MAX_CHAIN_DELTAS  # chains grew to the limit, then restarted


def test_a_hot_set_on_a_large_state_folds_its_deltas_and_never_rewrites_the_full_blob() -> None:
    # the same 500 keys of a 20k-key state change between checkpoints: every checkpoint
    # writes about the hot set, however long the run, and restores the model
    store = InMemoryCheckpointStore()
    b = backend(max_p=8)
    n, hot = 20_000, list(range(0, 20_000, 40))
    model = dict.fromkeys(range(n), 0)
    b.put_values(COUNT, pa.array(list(model)), pa.array(list(model.values())))
    first = checkpoint(store, b, 1)
    [full] = [r for r in first.blobs if r.kind is BlobKind.KEYED_FULL]
    written: list[int] = []
    for cid in range(2, 3 * MAX_CHAIN_DELTAS + 4):
        values = [cid * 1000 + k for k in hot]
        b.put_values(COUNT, pa.array(hot), pa.array(values))
        model.update(zip(hot, values, strict=True))
        if cid % 5 == 0:  # a key deleted, then written again later: tombstones fold too
            b.clear_values(COUNT, pa.array([hot[cid]]))
            model.pop(hot[cid])
        handle = checkpoint(store, b, cid)
        fulls = [r for r in handle.blobs if r.kind is BlobKind.KEYED_FULL]
        assert fulls == [full]  # the FULL blob of checkpoint 1, reused
        new = [r for r in handle.blobs if r.checkpoint_id == cid]
        written.append(sum(r.rows for r in new))
        assert len(handle.blobs) <= MAX_CHAIN_DELTAS + 1
        assert table_dict(restored(store, handle.blobs, max_p=8)[0].to_table(COUNT)) == model
    assert max(written) <= len(hot)
    folded = [r for r in store_refs(store) if r.kind is BlobKind.KEYED_DELTA and r.seq == 1]
    assert len(folded) >= 3  # the chain was folded back to one delta, more than once


def test_a_changing_set_larger_than_the_ratio_still_gets_a_full_blob() -> None:
    store = InMemoryCheckpointStore()
    b = backend(max_p=8)
    b.put_values(COUNT, pa.array(range(1000)), pa.array([0] * 1000))
    checkpoint(store, b, 1)
    model = dict.fromkeys(range(1000), 0)
    kinds: list[set[BlobKind]] = []
    for cid in range(2, 14):
        keys = list(range((cid - 2) * 100, (cid - 1) * 100))  # 100 new keys each time
        b.put_values(COUNT, pa.array([k % 1000 for k in keys]), pa.array([cid] * 100))
        model.update(dict.fromkeys([k % 1000 for k in keys], cid))
        handle = checkpoint(store, b, cid)
        kinds.append({r.kind for r in handle.blobs if r.checkpoint_id == cid})
        assert table_dict(restored(store, handle.blobs, max_p=8)[0].to_table(COUNT)) == model
    # after half the state changed since the FULL blob, a new one is written
    assert {BlobKind.KEYED_FULL} in kinds and kinds[0] == {BlobKind.KEYED_DELTA}


def store_refs(store: InMemoryCheckpointStore) -> list[BlobRef]:
    return list(store.stored_blobs())


hot_step = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 12), st.integers(-5, 5)),
    st.tuples(st.just("clear"), st.integers(0, 12), st.just(0)),
    st.tuples(st.just("vput"), st.integers(0, 12), st.integers(-5, 5)),
    st.tuples(st.just("bput"), st.integers(0, 12), st.integers(-5, 5)),
    st.tuples(st.just("add"), st.integers(0, 12), st.integers(0, 3)),
    st.just("snap"),
    st.just("complete"),
    st.just("abort"),
)


every_key_step = st.one_of(
    st.tuples(st.just("all"), st.integers(0, 6), st.integers(-5, 5)),  # every key, and one more
    st.tuples(st.just("put"), st.integers(0, 6), st.integers(-5, 5)),
    st.tuples(st.just("clear"), st.integers(0, 6), st.just(0)),
    st.tuples(st.just("vput"), st.integers(0, 6), st.integers(-5, 5)),
    st.tuples(st.just("vclear"), st.integers(0, 6), st.just(0)),
    st.tuples(st.just("bput"), st.integers(0, 6), st.integers(-5, 5)),
    st.just("snap"),
    st.just("complete"),
    st.just("abort"),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(every_key_step, min_size=5, max_size=80))
def test_snapshots_of_a_state_whose_every_key_changes_restore_it(steps: list[Any]) -> None:
    """A small state whose keys all change between checkpoints (a running count over few
    keys): its FULL blobs come from the change log (``full_table_from_changes``) when the
    log holds every key, else from the entries; every completed checkpoint restores what a
    plain fold over the operations says, with per-record updates, clears and repeated keys
    mixed in."""
    assert_every_checkpoint_restores(backend(max_p=4), Model(), steps)


def test_a_full_blob_of_a_state_whose_every_key_changed_comes_from_its_change_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every key changed since the last checkpoint: the FULL blob is the compacted log
    sorted by key group, the same rows :func:`full_table` reads from the entries; a key
    left unchanged, or changed through the per-record API, takes the entries' way."""
    from spark_ckpt.state.snapshot import strategy as strategy_module

    walked: list[int] = []
    full_table = strategy_module.full_table

    def counting_full_table(*args: Any) -> pa.Table:
        walked.append(1)
        return full_table(*args)

    monkeypatch.setattr(strategy_module, "full_table", counting_full_table)
    store = InMemoryCheckpointStore()
    b = backend(max_p=16)
    keys = pa.array(range(50), pa.int64())
    b.put_values(COUNT, keys, pa.array(range(50), pa.int64()))
    checkpoint(store, b, 1)
    assert walked == []  # the first snapshot: the log holds every key
    b.put_values(COUNT, keys, pa.array(range(100, 150), pa.int64()))
    b.put_values(COUNT, pa.array([7, 3], pa.int64()), pa.array([1, 2], pa.int64()))
    handle = checkpoint(store, b, 2)
    assert walked == []
    [ref] = [r for r in handle.blobs if r.checkpoint_id == 2]
    blob = store.read_blob(ref)
    assert blob.column("key_group").to_pylist() == sorted(blob.column("key_group").to_pylist())
    assert blob.schema.equals(full_table(b._states["count"], pa.int64(), 16).schema)
    expected = {k: 100 + k for k in range(50)} | {7: 1, 3: 2}
    got = dict(zip(blob.column("key").to_pylist(), blob.column("value").to_pylist(), strict=True))
    assert got == expected
    b.put_values(COUNT, pa.array(range(49), pa.int64()), pa.array(range(49), pa.int64()))
    checkpoint(store, b, 3, full=True)  # key 49 did not change
    assert walked == [1]
    b.put_values(COUNT, keys, pa.array(range(50), pa.int64()))
    b.set_current_key(5)
    b.value_state(COUNT).update(9)
    checkpoint(store, b, 4, full=True)
    assert walked == [1, 1]


@settings(max_examples=40, deadline=None)
@given(st.lists(hot_step, min_size=20, max_size=200))
def test_long_chains_fold_and_restore_every_completed_checkpoint(steps: list[Any]) -> None:
    # few keys change over many checkpoints of a larger state: chains grow past the limit
    # and fold, with snapshots pending, completed out of order and aborted meanwhile
    b = backend(max_p=4)
    model = Model()
    b.put_values(COUNT, pa.array(range(100, 400)), pa.array(range(300)))
    model.values.update(zip(range(100, 400), range(300), strict=True))
    assert_every_checkpoint_restores(b, model, steps)


def assert_every_checkpoint_restores(b: KeyedStateBackend, model: Model, steps: list[Any]) -> None:
    """Play *steps* (operations on *b* and *model*, snapshots, completions out of order,
    aborts), then one more checkpoint: every completed checkpoint restores what *model*
    held when it was snapshotted."""
    store = InMemoryCheckpointStore()
    pending: list[tuple[int, TaskSnapshot, Model]] = []
    verified: list[tuple[TaskStateHandle, Model]] = []
    cid = 0
    for step in steps:
        if step == "snap" or (step == "complete" and not pending):
            cid += 1
            pending.append((cid, b.snapshots.snapshot(cid), copy.deepcopy(model)))
        if step == "complete":
            c, snap, expected = pending.pop((cid * 5) % len(pending))
            verified.append((complete(store, b, snap, c), expected))
        elif step == "abort" and pending:
            c, _, _ = pending.pop(0)
            b.snapshots.notify_checkpoint_aborted(c)
        elif isinstance(step, tuple):
            apply(step, b, model)
    cid += 1
    verified.append((checkpoint(store, b, cid), model))
    for handle, expected in verified:
        assert contents(restored(store, handle.blobs, max_p=4)) == expected.as_tuple()


def test_full_snapshot_writes_only_full_blobs() -> None:
    store = InMemoryCheckpointStore()
    b = backend()
    b.put_values(COUNT, pa.array(range(1000)), pa.array(range(1000)))
    checkpoint(store, b, 1)
    b.put_values(COUNT, pa.array([1]), pa.array([5]))
    snap = b.snapshots.snapshot(2, full=True)
    assert snap.reused == ()
    assert {x.kind for x in snap.new_blobs} == {BlobKind.KEYED_FULL}
    assert sum(x.table.num_rows for x in snap.new_blobs) == 1000


def test_aborted_and_concurrent_checkpoints_lose_nothing() -> None:
    store = InMemoryCheckpointStore()
    b = backend(max_p=4)
    model = {k: 0 for k in range(200)}
    b.put_values(COUNT, pa.array(list(model)), pa.array([0] * 200))
    checkpoint(store, b, 1)

    def change(keys: list[int], value: int) -> None:
        b.put_values(COUNT, pa.array(keys), pa.array([value] * len(keys)))
        for k in keys:
            model[k] = value

    change([1, 2], 2)
    s2 = b.snapshots.snapshot(2)
    model_2 = dict(model)
    change([3], 3)
    s3 = b.snapshots.snapshot(3)  # taken while 2 is pending
    model_3 = dict(model)
    change([4], 4)
    b.snapshots.notify_checkpoint_aborted(2)
    s4 = b.snapshots.snapshot(4)
    model_4 = dict(model)
    h3 = complete(store, b, s3, 3)  # 3 completes before 4, after 2 aborted
    change([5], 5)
    h4 = complete(store, b, s4, 4)
    h2 = store.write_task_state(2, s2)
    b.snapshots.notify_checkpoint_complete(2, h2)  # stale notification: ignored
    b.snapshots.notify_checkpoint_aborted(99)  # unknown: ignored
    s6 = b.snapshots.snapshot(6)
    h6 = complete(store, b, s6, 6)
    for handle, expected in ((h2, model_2), (h3, model_3), (h4, model_4), (h6, model)):
        assert table_dict(restored(store, handle.blobs, max_p=4)[0].to_table(COUNT)) == expected
    assert b.snapshots.pending_snapshots() == [] and b.snapshots.base_checkpoint_id == 6


def test_corruption_and_broken_chains_are_detected() -> None:
    store = InMemoryCheckpointStore()
    b = backend(max_p=2)
    b.put_values(COUNT, pa.array(range(100)), pa.array(range(100)))
    checkpoint(store, b, 1)
    b.put_values(COUNT, pa.array([0, 2, 4]), pa.array([9, 9, 9]))
    checkpoint(store, b, 2)
    b.put_values(COUNT, pa.array([0, 2, 4]), pa.array([8, 8, 8]))
    h3 = checkpoint(store, b, 3)
    deltas = [r for r in h3.blobs if r.kind is BlobKind.KEYED_DELTA]
    assert deltas
    missing_seq = tuple(r for r in h3.blobs if not (r.kind is BlobKind.KEYED_DELTA and r.seq == 1))
    with pytest.raises(CorruptCheckpointError):
        restored(store, missing_seq, max_p=2)
    no_full = tuple(r for r in h3.blobs if r.kind is not BlobKind.KEYED_FULL)
    with pytest.raises(CorruptCheckpointError):
        restored(store, no_full, max_p=2)
    store.corrupt_blob(deltas[0])
    with pytest.raises(CorruptCheckpointError):
        restored(store, h3.blobs, max_p=2)


def test_restore_refuses_state_that_does_not_fit() -> None:
    store = InMemoryCheckpointStore()
    b = backend(max_p=8)
    b.put_values(COUNT, pa.array(range(20)), pa.array(range(20)))
    b.operator_list_state("offsets", pa.int64()).add(1)
    h = checkpoint(store, b, 1)
    fresh = backend(max_p=8)
    fresh.value_state(ValueStateDescriptor("count", pa.string()))
    with pytest.raises(StateError):
        restore_backend(fresh, h.blobs, store.read_blob)
    with pytest.raises(StateError):  # another max_parallelism
        restore_backends("op", pa.int64(), 1, h.blobs, store.read_blob, 16)
    with pytest.raises(StateError):  # another key type
        restore_backends("op", pa.string(), 1, h.blobs, store.read_blob, 8)
    no_parallelism = KeyedStateBackend("op", 0, pa.int64(), KeyGroupRange(0, 7), 8)
    with pytest.raises(StateError):  # operator state needs the parallelism
        restore_backend(no_parallelism, h.blobs, store.read_blob)
    with pytest.raises(StateError):  # not a fresh backend
        restore_backend(b, h.blobs, store.read_blob)
    other = KeyedStateBackend.for_subtask("other-op", 0, 1, pa.int64(), 8)
    restore_backend(other, h.blobs, store.read_blob)  # blobs of other operators are ignored
    assert other.value_count() == 0


def test_restored_state_continues_incremental_chains() -> None:
    store = InMemoryCheckpointStore()
    b = backend(max_p=8)
    model = {k: k for k in range(300)}
    b.put_values(COUNT, pa.array(list(model)), pa.array(list(model.values())))
    h1 = checkpoint(store, b, 1)
    [r] = restored(store, h1.blobs, max_p=8)
    r.put_values(COUNT, pa.array([5]), pa.array([-5]))
    model[5] = -5
    snap = r.snapshots.snapshot(2)
    assert [(x.kind, x.seq) for x in snap.new_blobs] == [(BlobKind.KEYED_DELTA, 1)]
    h2 = complete(store, r, snap, 2)
    assert table_dict(restored(store, h2.blobs, max_p=8)[0].to_table(COUNT)) == model


# -- rescaling and interleavings (hypothesis) ---------------------------------------------


@dataclass
class Model:
    values: dict[int, int] = field(default_factory=dict)
    lists: dict[int, list[str]] = field(default_factory=dict)
    maps: dict[int, dict[str, int]] = field(default_factory=dict)

    def as_tuple(self) -> tuple[dict[Any, Any], dict[Any, Any], dict[Any, Any]]:
        return (self.values, self.lists, self.maps)


op_strategy = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 40), st.integers(-5, 5)),
    st.tuples(st.just("clear"), st.integers(0, 40), st.just(0)),
    st.tuples(st.just("add"), st.integers(0, 40), st.integers(0, 3)),
    st.tuples(st.just("mput"), st.integers(0, 40), st.integers(0, 3)),
    st.tuples(st.just("mdel"), st.integers(0, 40), st.integers(0, 3)),
    # the per-record API on the state the vectorized API also writes, and repeated keys
    st.tuples(st.just("vput"), st.integers(0, 40), st.integers(-5, 5)),
    st.tuples(st.just("vclear"), st.integers(0, 40), st.just(0)),
    st.tuples(st.just("bput"), st.integers(0, 40), st.integers(-5, 5)),
)


def apply(op: tuple[str, int, int], b: KeyedStateBackend, model: Model) -> None:
    kind, key, arg = op
    if kind == "all":  # every key the state holds, and *key*: set to *arg*
        keys = sorted({*model.values, key})
        b.put_values(COUNT, pa.array(keys, pa.int64()), pa.array([arg] * len(keys)))
        model.values.update(dict.fromkeys(keys, arg))
        return
    if kind == "put":
        b.put_values(COUNT, pa.array([key]), pa.array([arg]))
        model.values[key] = arg
        return
    if kind == "clear":
        b.clear_values(COUNT, pa.array([key]))
        model.values.pop(key, None)
        return
    if kind == "bput":  # one batch repeating a key, with a clear: the last occurrence wins
        values = [arg, None, arg + 1] if arg >= 0 else [arg, arg + 1, None]
        b.put_values(COUNT, pa.array([key, key, key]), pa.array(values, pa.int64()))
        if values[-1] is None:
            model.values.pop(key, None)
        else:
            model.values[key] = values[-1]
        return
    b.set_current_key(key)
    if kind == "vput":
        b.value_state(COUNT).update(arg)
        model.values[key] = arg
        return
    if kind == "vclear":
        b.value_state(COUNT).clear()
        model.values.pop(key, None)
        return
    if kind == "add":
        b.list_state(EVENTS).add(f"e{arg}")
        model.lists.setdefault(key, []).append(f"e{arg}")
    elif kind == "mput":
        b.map_state(ATTRS).put(f"m{arg}", arg)
        model.maps.setdefault(key, {})[f"m{arg}"] = arg
    else:
        b.map_state(ATTRS).remove(f"m{arg}")
        model.maps.get(key, {}).pop(f"m{arg}", None)
        if key in model.maps and not model.maps[key]:
            del model.maps[key]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.one_of(op_strategy, st.sampled_from(["snap", "complete", "abort"])), max_size=60)
)
def test_interleaved_snapshots_completions_and_aborts(steps: list[Any]) -> None:
    store = InMemoryCheckpointStore()
    b = backend(max_p=4)
    model = Model()
    # a larger value state, so that its snapshots are deltas (few changed keys)
    b.put_values(COUNT, pa.array(range(100, 1100)), pa.array(range(1000)))
    model.values.update(zip(range(100, 1100), range(1000), strict=True))
    pending: list[tuple[int, TaskSnapshot, Model]] = []
    verified: list[tuple[TaskStateHandle, Model]] = []
    cid = 0
    for step in steps:
        if step == "snap":
            cid += 1
            pending.append((cid, b.snapshots.snapshot(cid), copy.deepcopy(model)))
        elif step == "complete" and pending:
            i = (cid * 7) % len(pending)  # complete some pending snapshot, not always the oldest
            c, snap, expected = pending.pop(i)
            verified.append((complete(store, b, snap, c), expected))
        elif step == "abort" and pending:
            c, _, _ = pending.pop(0)
            b.snapshots.notify_checkpoint_aborted(c)
        elif isinstance(step, tuple):
            apply(step, b, model)
    cid += 1
    verified.append((checkpoint(store, b, cid), model))
    for handle, expected in verified:
        assert contents(restored(store, handle.blobs, max_p=4)) == expected.as_tuple()


@settings(max_examples=30, deadline=None)
@given(
    old_p=st.integers(1, 4),
    new_p=st.integers(1, 4),
    batches=st.lists(st.lists(op_strategy, max_size=25), min_size=1, max_size=3),
    elements=st.lists(st.integers(0, 100), max_size=12),
)
def test_rescale_restore_matches_model(
    old_p: int, new_p: int, batches: list[list[tuple[str, int, int]]], elements: list[int]
) -> None:
    max_p = 8
    store = InMemoryCheckpointStore()
    olds = [backend(old_p, i, max_p) for i in range(old_p)]
    model = Model()
    for i, e in enumerate(elements):
        olds[i % old_p].operator_list_state("offsets", pa.int64()).add(e)
    owner = {}
    for k, kg in enumerate(key_groups(pa.array(range(41)), max_p).to_pylist()):
        owner[k] = next(i for i in range(old_p) if kg in range_for_subtask(max_p, old_p, i))
    handles: list[TaskStateHandle] = []
    for cid, batch in enumerate(batches, start=1):
        for op in batch:
            apply(op, olds[owner[op[1]]], model)
        handles = [checkpoint(store, b, cid) for b in olds]
    refs = tuple(r for h in handles for r in h.blobs)
    news = restored(store, refs, new_p, max_p)
    assert contents(news) == model.as_tuple()
    for i, nb in enumerate(news):
        kgs = key_groups(nb.keys(COUNT), max_p).to_pylist() if nb.value_count(COUNT) else []
        assert all(kg in range_for_subtask(max_p, new_p, i) for kg in kgs)
    if elements:
        parts = [nb.operator_list_state("offsets", pa.int64()).get() for nb in news]
        assert sorted(x for part in parts for x in part) == sorted(elements)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1

"""SavepointWriter: bootstrap a savepoint from tables, and transform existing checkpoints
(drop, rename, edit values, change the max parallelism, source positions). Every result is
read back with StateReader and restored with ``restore_backend`` at parallelism 1 and 3, and
compared with plain-dict oracles."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from state_builders import OPS, Oracle, as_dict, restored, run_incremental

from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.errors import ConfigError, StateError, StoreError
from spark_ckpt.offline import SavepointWriter, StateReader, chains, write_savepoint
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.state_handles import BlobKind, StateBlob, TaskId, TaskSnapshot
from spark_ckpt.state.descriptor import StateKind, ValueStateDescriptor
from spark_ckpt.state.keygroup import range_for_subtask
from spark_ckpt.testing.state_backends import BACKENDS, use_state_backend

INT64 = pa.int64()
KINDS = {"count": StateKind.VALUE, "events": StateKind.LIST, "attrs": StateKind.MAP}


@pytest.fixture(scope="module")
def source_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Oracle]:
    root = str(tmp_path_factory.mktemp("writer") / "root")
    runs = run_incremental(DeltaCheckpointStore(root), rounds=4, seed=3)
    return root, runs[-1][1]


def check_savepoint_format(path: str) -> StateReader:
    """The directory holds exactly one completed SAVEPOINT, all of its blobs FULL (or
    operator/channel state) and written by it."""
    store = DeltaCheckpointStore(path)
    completed = store.list_completed()
    assert len(completed) == 1
    (sp,) = completed
    assert sp.snapshot_type is SnapshotType.SAVEPOINT
    assert sp.properties["format"] == "1"
    assert sp.properties["pipeline"]
    for ref in sp.blobs():
        assert ref.checkpoint_id == sp.checkpoint_id
        assert ref.kind is not BlobKind.KEYED_DELTA
        assert ref.seq == 0
    store.verify(sp)
    return StateReader.open(path)


def restored_at(
    reader: StateReader, uid: str, parallelism: int, key_type: pa.DataType = INT64
) -> tuple[dict[str, dict[Any, Any]], list[list[Any]]]:
    assert reader.max_parallelism is not None
    refs = list(reader.checkpoint.blobs())
    return restored(
        refs, reader.store.read_blob, uid, key_type, parallelism, reader.max_parallelism
    )


def assert_state(reader: StateReader, uid: str, expected: dict[str, dict[Any, Any]]) -> None:
    """Read back and restored at parallelism 1 and 3, the keyed state of *uid* is
    *expected*."""
    key_type = reader.key_type(uid)
    assert key_type is not None
    assert reader.keyed_state_names(uid) == sorted(expected)
    for name, oracle in expected.items():
        kind = reader.state_kind(uid, name)
        assert as_dict(reader.keyed(uid, name), kind) == oracle, name
    for p in (1, 3):
        states, _ = restored_at(reader, uid, p, key_type)
        assert states == expected, p


# -- bootstrap -------------------------------------------------------------------------------


def test_bootstrap_from_tables(tmp_path: Path) -> None:
    count = {f"user-{i}": i * 10 for i in range(200)}
    events = {f"user-{i}": [f"e{j}" for j in range(i % 4 + 1)] for i in range(0, 200, 3)}
    attrs = {f"user-{i}": {"a": i, "b": -i} for i in range(0, 200, 7)}
    writer = (
        SavepointWriter.new("orders", max_parallelism=64, parallelism=2)
        .with_keyed_state(
            "counter", "count", pa.table({"key": list(count), "value": list(count.values())})
        )
        .with_keyed_state(
            "counter",
            "events",
            pa.table({"key": list(events), "value": list(events.values())}),
            "list",
        )
        .with_keyed_state(
            "counter",
            "attrs",
            pa.table(
                {
                    "key": list(attrs),
                    "value": pa.array(
                        [list(m.items()) for m in attrs.values()], pa.map_(pa.string(), pa.int64())
                    ),
                }
            ),
            "map",
        )
    )
    path = str(tmp_path / "sp")
    written = writer.write(path)
    assert written.is_savepoint
    assert written.properties == {"pipeline": "orders", "max_parallelism": "64", "format": "1"}
    reader = check_savepoint_format(path)
    assert reader.is_savepoint
    assert reader.max_parallelism == 64
    assert reader.parallelism("counter") == 2
    assert reader.key_type("counter") == pa.string()
    assert reader.source_offsets().num_rows == 0  # bootstrap: sources start at the beginning
    assert_state(reader, "counter", {"count": count, "events": events, "attrs": attrs})


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_large_state_is_written_in_key_group_slices_that_restore_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """A subtask's share above the blob target is cut into FULL blobs of whole, disjoint key
    groups; read back, and restored at parallelism 1 and 3 on either backend, they hold the
    table."""
    use_state_backend(monkeypatch, backend, str(tmp_path / "rocksdb"))
    monkeypatch.setattr(chains, "FULL_BLOB_TARGET_BYTES", 2_000)
    rng = random.Random(7)
    count = {rng.randrange(-(10**12), 10**12): rng.randrange(10**6) for _ in range(3_000)}
    events = {f"k{i}": [f"e{j}" for j in range(i % 3 + 1)] for i in range(0, 900, 2)}
    path = str(tmp_path / "sp")
    SavepointWriter.new("p", max_parallelism=32, parallelism=2).with_keyed_state(
        "ints", "count", pa.table({"key": list(count), "value": list(count.values())})
    ).with_keyed_state(
        "strs", "events", pa.table({"key": list(events), "value": list(events.values())}), "list"
    ).write(path)
    reader = check_savepoint_format(path)
    for uid in ("ints", "strs"):
        refs = [r for r in reader.checkpoint.blobs() if r.operator_uid == uid]
        assert len(refs) > 2 * 2  # more than one slice per subtask
        ranges = sorted((r.key_group_start, r.key_group_end) for r in refs)
        assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))
        for r in refs:
            owner = range_for_subtask(32, 2, r.subtask)
            assert owner.start <= r.key_group_start <= r.key_group_end <= owner.end
        assert reader.parallelism(uid) == 2
    assert_state(reader, "ints", {"count": count})
    assert_state(reader, "strs", {"events": events})


def test_bootstrap_takes_pandas_and_drops_rows_without_state(tmp_path: Path) -> None:
    df = pd.DataFrame({"key": [1, 2, 3], "value": [5.0, None, 7.0]})
    path = str(tmp_path / "sp")
    SavepointWriter.new("p").with_keyed_state(
        "op", "count", df, ValueStateDescriptor("count", pa.int64())
    ).write(path)
    reader = check_savepoint_format(path)
    assert as_dict(reader.keyed("op", "count")) == {1: 5, 3: 7}
    assert reader.descriptor("op", "count") == ValueStateDescriptor("count", pa.int64())


def test_bad_input_is_refused(tmp_path: Path) -> None:
    writer = SavepointWriter.new("p")
    with pytest.raises(StateError, match="not unique"):
        writer.with_keyed_state("op", "s", pa.table({"key": [1, 1], "value": [1, 2]}))
    with pytest.raises(StateError, match="null key"):
        writer.with_keyed_state("op", "s", pa.table({"key": [1, None], "value": [1, 2]}))
    with pytest.raises(StateError, match="'key' and 'value'"):
        writer.with_keyed_state("op", "s", pa.table({"k": [1], "value": [1]}))
    writer.with_keyed_state("op", "s", pa.table({"key": [1], "value": [1]}))
    with pytest.raises(StateError, match="same key type"):
        writer.with_keyed_state(
            "op", "t", pa.table({"key": ["x"], "value": [1]}), key_type=pa.string()
        )
    with pytest.raises(ConfigError):
        SavepointWriter.new("p", max_parallelism=4, parallelism=8)


# -- transformations of an existing checkpoint -----------------------------------------------


def test_from_existing_copies_everything_and_leaves_the_source_alone(
    source_root: tuple[str, Oracle], tmp_path: Path
) -> None:
    root, oracle = source_root
    source = DeltaCheckpointStore(root)
    before = (source.list_completed(), sorted(source.stored_blobs(), key=lambda r: r.key))
    path = str(tmp_path / "sp")
    sp = SavepointWriter.from_existing(root, pipeline="orders").write(path)
    assert sp.checkpoint_id == before[0][-1].checkpoint_id
    assert (source.list_completed(), sorted(source.stored_blobs(), key=lambda r: r.key)) == before
    reader = check_savepoint_format(path)
    assert reader.properties["max_parallelism"] == "128"
    assert_state(reader, "op", {n: oracle.state(n) for n in KINDS})
    ops = reader.operator_state("op", OPS)
    by_subtask: dict[int, list[int]] = {}
    for row in ops.to_pylist():
        by_subtask.setdefault(row["subtask"], []).append(row["value"])
    assert by_subtask == oracle.ops
    offsets = reader.source_offsets().to_pylist()
    assert {(r["source"], r["channel"]): r["offset"] for r in offsets} == oracle.offsets
    # operator list state is carried over: a restore at 3 deals every element once
    _, dealt = restored_at(reader, "op", 3)
    assert sorted(e for d in dealt for e in d) == sorted(e for v in oracle.ops.values() for e in v)


def test_a_savepoint_of_a_savepoint_is_the_same_state(
    source_root: tuple[str, Oracle], tmp_path: Path
) -> None:
    root, oracle = source_root
    first = str(tmp_path / "sp1")
    SavepointWriter.from_existing(root, pipeline="orders").write(first)
    second = str(tmp_path / "sp2")
    sp = SavepointWriter.from_existing(first).write(second)  # pipeline read from the properties
    assert sp.properties["pipeline"] == "orders"
    assert_state(check_savepoint_format(second), "op", {n: oracle.state(n) for n in KINDS})


def test_remove_and_rename_operators(source_root: tuple[str, Oracle], tmp_path: Path) -> None:
    root, oracle = source_root
    path = str(tmp_path / "sp")
    (
        SavepointWriter.from_existing(root, pipeline="orders")
        .with_keyed_state("other", "x", pa.table({"key": [1, 2], "value": [3, 4]}))
        .rename_operator("op", "op-v2")
        .remove_operator("other")
        .write(path)
    )
    reader = check_savepoint_format(path)
    assert reader.uids() == ["op-v2"]
    assert_state(reader, "op-v2", {n: oracle.state(n) for n in KINDS})
    assert reader.operator_state("op-v2", OPS).num_rows == sum(len(v) for v in oracle.ops.values())
    with pytest.raises(StateError, match="no operator uid 'nope'"):
        SavepointWriter.from_existing(root, pipeline="x").remove_operator("nope")
    with pytest.raises(StateError, match="already holds state"):
        SavepointWriter.new("p").with_keyed_state(
            "a", "s", pa.table({"key": [1], "value": [1]})
        ).with_keyed_state("b", "s", pa.table({"key": [1], "value": [1]})).rename_operator("a", "b")


def test_edit_values(source_root: tuple[str, Oracle], tmp_path: Path) -> None:
    root, oracle = source_root
    path = str(tmp_path / "sp")

    def double_the_big_ones(t: pa.Table) -> pa.Table:
        big = t.filter(pc.greater(t["value"], 500_000))
        return big.set_column(1, "value", pc.multiply(big["value"], 2))

    (
        SavepointWriter.from_existing(root, pipeline="orders")
        .map_values("op", "count", double_the_big_ones)
        .map_values(
            "op", "events", lambda t: t.set_column(1, "value", pc.list_slice(t["value"], 0, 1))
        )
        .remove_state("op", "attrs")
        .write(path)
    )
    expected = {
        "count": {k: v * 2 for k, v in oracle.count.items() if v > 500_000},
        "events": {k: v[:1] for k, v in oracle.events.items()},
    }
    assert_state(check_savepoint_format(path), "op", expected)


def test_edit_values_to_another_type(source_root: tuple[str, Oracle], tmp_path: Path) -> None:
    root, oracle = source_root
    path = str(tmp_path / "sp")
    (
        SavepointWriter.from_existing(root, pipeline="orders")
        .map_values(
            "op", "count", lambda t: t.set_column(1, "value", pc.cast(t["value"], pa.string()))
        )
        .write(path)
    )
    reader = check_savepoint_format(path)
    assert reader.descriptor("op", "count") == ValueStateDescriptor("count", pa.string())
    assert as_dict(reader.keyed("op", "count")) == {k: str(v) for k, v in oracle.count.items()}


@pytest.mark.parametrize("max_parallelism", [4, 32, 256])
def test_change_max_parallelism(
    source_root: tuple[str, Oracle], tmp_path: Path, max_parallelism: int
) -> None:
    root, oracle = source_root
    path = str(tmp_path / "sp")
    sp = (
        SavepointWriter.from_existing(root, pipeline="orders")
        .with_max_parallelism(max_parallelism)
        .write(path)
    )
    assert sp.properties["max_parallelism"] == str(max_parallelism)
    reader = check_savepoint_format(path)
    assert reader.max_parallelism == max_parallelism
    for ref in reader.checkpoint.blobs():
        if ref.kind is BlobKind.KEYED_FULL:
            assert ref.key_group_end < max_parallelism
    assert_state(reader, "op", {n: oracle.state(n) for n in KINDS})


def test_max_parallelism_below_the_parallelism_is_refused(
    source_root: tuple[str, Oracle],
) -> None:
    root, _ = source_root
    with pytest.raises(ConfigError, match="parallelism 2"):
        SavepointWriter.from_existing(root, pipeline="orders").with_max_parallelism(1)
    writer = SavepointWriter.from_existing(root, pipeline="orders").with_parallelism(1)
    writer.with_max_parallelism(1)  # fine once the operator runs at 1


def test_source_offsets(source_root: tuple[str, Oracle], tmp_path: Path) -> None:
    root, _ = source_root
    cleared = str(tmp_path / "cleared")
    SavepointWriter.from_existing(root, pipeline="o").with_source_offsets(None).write(cleared)
    assert StateReader.open(cleared).source_offsets().num_rows == 0
    moved = str(tmp_path / "moved")
    SavepointWriter.from_existing(root, pipeline="o").with_source_offsets(
        {("source", 0): 5, ("source", 1): 6}
    ).write(moved)
    rows = StateReader.open(moved).source_offsets().to_pylist()
    assert [(r["source"], r["channel"], r["offset"]) for r in rows] == [
        ("source", 0, 5),
        ("source", 1, 6),
    ]
    only = str(tmp_path / "only-offsets")
    SavepointWriter.new("o").with_source_offsets(StateReader.open(moved).source_offsets()).write(
        only
    )
    assert StateReader.open(only).source_offsets().to_pylist() == rows


# -- the directory format --------------------------------------------------------------------


def test_a_non_empty_target_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "sp"
    target.mkdir()
    (target / "something").write_text("x")
    writer = SavepointWriter.new("p").with_keyed_state(
        "op", "s", pa.table({"key": [1], "value": [1]})
    )
    with pytest.raises(StoreError, match="not empty"):
        writer.write(str(target))
    assert sorted(p.name for p in target.iterdir()) == ["something"]
    empty = tmp_path / "empty"
    empty.mkdir()
    writer.write(str(empty))  # an empty directory is fine
    with pytest.raises(StoreError, match="not empty"):
        writer.write(str(empty))  # but not twice


def test_pipeline_is_required(source_root: tuple[str, Oracle], tmp_path: Path) -> None:
    root, _ = source_root
    with pytest.raises(StoreError, match="pipeline"):
        SavepointWriter.from_existing(root).write(str(tmp_path / "sp"))


def test_write_savepoint_refuses_what_breaks_the_format(tmp_path: Path) -> None:
    table = pa.table({"value": [1]})
    delta = StateBlob("op", 0, BlobKind.KEYED_DELTA, "s", table, 0, 127, seq=1)
    props = {"pipeline": "p", "max_parallelism": "128"}
    with pytest.raises(StoreError, match="full keyed blobs only"):
        write_savepoint(str(tmp_path / "a"), 1, [TaskSnapshot(TaskId("op"), (delta,))], props)
    with pytest.raises(StoreError, match="needs the property 'pipeline'"):
        write_savepoint(str(tmp_path / "b"), 1, [], {"max_parallelism": "128"})
    assert not (tmp_path / "a").exists()
    done = write_savepoint(str(tmp_path / "c"), 5, [], props)
    assert done.checkpoint_id == 5
    assert done.properties["format"] == "1"


def test_timers_are_written_and_listed_offline_and_fire_after_a_restore(tmp_path: Path) -> None:
    """Timers bootstrapped with the writer read back as rows, edit with ``from_existing``,
    and a task's timer service restored from the savepoint at another parallelism fires
    exactly them."""
    from spark_ckpt.state.backend import KeyedStateBackend
    from spark_ckpt.state.state_restore import restore_backend
    from spark_ckpt.state.timers import TimeDomain, TimerService

    timers = pd.DataFrame(
        {
            "key": [1, 2, 2, 3, 1, 1],
            "timestamp": [500, 100, 300, 100, 7000, 500],  # (1, 500) twice: one timer
            "domain": ["event", "event", "event", "event", "processing", "event"],
        }
    )
    path = str(tmp_path / "sp")
    SavepointWriter.new("sessions", max_parallelism=32, parallelism=2).with_keyed_state(
        "op", "count", pa.table({"key": [1, 2, 3], "value": [1, 1, 1]})
    ).with_timers("op", timers).write(path)
    reader = StateReader.open(path)
    assert "_event_timers" in reader.state_names("op")
    rows = reader.timers("op").to_pylist()
    assert rows == [
        {"key": 2, "timestamp": 100, "domain": "event"},
        {"key": 3, "timestamp": 100, "domain": "event"},
        {"key": 2, "timestamp": 300, "domain": "event"},
        {"key": 1, "timestamp": 500, "domain": "event"},
        {"key": 1, "timestamp": 7000, "domain": "processing"},
    ]
    # edit: drop key 2's timers, move every processing-time timer a second later
    edited = reader.timers("op").to_pandas()
    edited = edited[edited["key"] != 2]
    edited.loc[edited["domain"] == "processing", "timestamp"] += 1000
    second = str(tmp_path / "sp2")
    SavepointWriter.from_existing(path).with_timers("op", edited).write(second)
    fired: list[tuple[int, int]] = []
    checkpoint = StateReader.open(second)
    for subtask in range(3):
        backend = KeyedStateBackend.for_subtask("op", subtask, 3, pa.int64(), 32)
        service = TimerService(backend)
        refs = [b for t in checkpoint.checkpoint.tasks for b in t.blobs]
        restore_backend(backend, refs, checkpoint.store.read_blob)
        for domain in TimeDomain:
            due = service.pop_due(domain, 10_000)
            fired.extend(
                zip(due.column("key").to_pylist(), due.column("ts").to_pylist(), strict=True)
            )
    assert sorted(fired) == [(1, 500), (1, 8000), (3, 100)]
    with pytest.raises(StateError, match="unknown timer domains"):
        SavepointWriter.from_existing(path).with_timers(
            "op", {"key": [1], "timestamp": [1], "domain": ["wall"]}
        )
    SavepointWriter.from_existing(path).with_timers(
        "op",
        {"key": pa.array([], pa.int64()), "timestamp": [], "domain": pa.array([], pa.string())},
    ).write(str(tmp_path / "sp3"))
    assert StateReader.open(str(tmp_path / "sp3")).timers("op").num_rows == 0

"""StateReader: the state of any completed checkpoint, read offline, equals what the updates
that made it say (a plain-dict oracle) and what a restore at parallelism 1 loads — for
incremental chains (FULL + DELTAs) written by 2 subtasks, in memory and on Delta."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from state_builders import (
    OPS,
    as_dict,
    restored,
    run_incremental,
)

from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.errors import CheckpointNotFoundError, StateError
from spark_ckpt.offline import StateReader
from spark_ckpt.protocol.state_handles import BlobKind
from spark_ckpt.state.descriptor import StateKind
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

KINDS = {"count": StateKind.VALUE, "events": StateKind.LIST, "attrs": StateKind.MAP}


@pytest.fixture(scope="module")
def memory_run() -> tuple[InMemoryCheckpointStore, list]:  # type: ignore[type-arg]
    store = InMemoryCheckpointStore()
    return store, run_incremental(store, rounds=6)


@pytest.fixture(scope="module")
def delta_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list]:  # type: ignore[type-arg]
    root = str(tmp_path_factory.mktemp("offline") / "root")
    return root, run_incremental(DeltaCheckpointStore(root), rounds=4, seed=11)


def test_the_runs_build_incremental_chains(memory_run) -> None:  # type: ignore[no-untyped-def]
    _, runs = memory_run
    last, _ = runs[-1]
    kinds = {b.kind for b in last.blobs()}
    assert BlobKind.KEYED_DELTA in kinds
    assert {b.subtask for b in last.blobs()} == {0, 1}
    assert any(b.checkpoint_id != last.checkpoint_id for b in last.blobs())  # reused blobs


def test_keyed_state_of_every_checkpoint_equals_the_oracle(memory_run) -> None:  # type: ignore[no-untyped-def]
    store, runs = memory_run
    for checkpoint, oracle in runs:
        reader = StateReader.from_store(store, checkpoint.checkpoint_id)
        assert reader.uids() == ["op"]
        assert reader.state_names("op") == ["attrs", "count", "events", OPS]
        assert reader.keyed_state_names("op") == ["attrs", "count", "events"]
        assert reader.max_parallelism == 128
        assert reader.parallelism("op") == 2
        assert reader.key_type("op") == pa.int64()
        for name, kind in KINDS.items():
            table = reader.keyed("op", name)
            assert table.column_names == ["key", "value"]
            assert reader.state_kind("op", name) is kind
            assert as_dict(table, kind) == oracle.state(name), (checkpoint.checkpoint_id, name)
            assert table.num_rows == len(oracle.state(name))


def test_keyed_state_equals_a_restore_at_parallelism_1(memory_run) -> None:  # type: ignore[no-untyped-def]
    store, runs = memory_run
    checkpoint, _ = runs[-1]
    reader = StateReader.from_store(store)
    assert reader.checkpoint_id == checkpoint.checkpoint_id  # the latest by default
    states, ops = restored(list(checkpoint.blobs()), store.read_blob, "op", pa.int64(), 1, 128)
    for name, kind in KINDS.items():
        assert as_dict(reader.keyed("op", name), kind) == states[name]
    assert reader.operator_state("op", OPS).column("value").to_pylist() == ops[0]


def test_rows_are_sorted_by_key_group_and_ranges_partition_the_state(memory_run) -> None:  # type: ignore[no-untyped-def]
    store, runs = memory_run
    _, oracle = runs[-1]
    reader = StateReader.from_store(store)
    full = reader.keyed("op", "count", with_key_group=True)
    kgs = full.column("key_group").to_pylist()
    assert kgs == sorted(kgs)
    assert reader.key_group_ranges("op", "count") == [(0, 63), (64, 127)]
    pieces: dict[int, int] = {}
    for lo, hi in [(0, 10), (11, 63), (64, 100), (101, 127)]:
        part = reader.keyed("op", "count", key_group_range=(lo, hi), with_key_group=True)
        assert all(lo <= kg <= hi for kg in part.column("key_group").to_pylist())
        got = as_dict(part)
        assert not pieces.keys() & got.keys()
        pieces.update(got)
    assert pieces == oracle.count


def test_operator_state_and_source_offsets(memory_run) -> None:  # type: ignore[no-untyped-def]
    store, runs = memory_run
    for checkpoint, oracle in runs:
        reader = StateReader.from_store(store, checkpoint.checkpoint_id)
        ops = reader.operator_state("op", OPS)
        assert ops.column_names == ["subtask", "value"]
        by_subtask: dict[int, list[int]] = {}
        for row in ops.to_pylist():
            by_subtask.setdefault(row["subtask"], []).append(row["value"])
        assert by_subtask == oracle.ops
        offsets = reader.source_offsets()
        assert offsets.column_names == ["source", "channel", "offset"]
        assert {(r["source"], r["channel"]): r["offset"] for r in offsets.to_pylist()} == (
            oracle.offsets
        )


def test_pandas_is_one_call_away(memory_run) -> None:  # type: ignore[no-untyped-def]
    store, runs = memory_run
    _, oracle = runs[-1]
    df = StateReader.from_store(store).keyed("op", "count").to_pandas()
    assert dict(zip(df["key"], df["value"], strict=True)) == oracle.count


def test_a_delta_root_reads_like_the_oracle(delta_root) -> None:  # type: ignore[no-untyped-def]
    root, runs = delta_root
    for checkpoint, oracle in runs:
        reader = StateReader.open(root, checkpoint.checkpoint_id)
        assert not reader.is_savepoint
        for name, kind in KINDS.items():
            assert as_dict(reader.keyed("op", name), kind) == oracle.state(name)
    latest = StateReader.open(root)
    assert latest.checkpoint_id == runs[-1][0].checkpoint_id
    assert BlobKind.KEYED_DELTA.value in latest.blobs().column("kind").to_pylist()


def test_errors_name_what_is_missing(delta_root, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root, _ = delta_root
    missing = str(tmp_path / "nowhere")
    with pytest.raises(CheckpointNotFoundError, match="nowhere"):
        StateReader.open(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointNotFoundError, match="no completed checkpoint"):
        StateReader.open(str(empty))
    with pytest.raises(CheckpointNotFoundError, match="no completed checkpoint 999999"):
        StateReader.open(root, 999_999)
    reader = StateReader.open(root)
    with pytest.raises(StateError, match="no state of operator uid 'nope'"):
        reader.keyed("nope", "count")
    with pytest.raises(StateError, match="no state 'nope' of operator 'op'"):
        reader.keyed("op", "nope")
    with pytest.raises(StateError, match="'count' of operator 'op' is keyed state"):
        reader.operator_state("op", "count")
    assert not list(tmp_path.glob("nowhere*"))  # reading created nothing

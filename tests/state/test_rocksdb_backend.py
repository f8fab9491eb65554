"""What is particular to the ``rocksdb`` backend: its byte encodings round-trip every
supported type, its files live where the options and Spark say and go when it closes, and a
local directory it cannot write or a full disk is one clear StateBackendError that loses
no state already written."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import StateBackendError, StateError
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.backends import rocksdb
from spark_ckpt.state.backends.codecs import KeyCodec, ValueCodec
from spark_ckpt.state.backends.rocksdb import DIR_PREFIX, RocksDBOptions, RocksDBStorage
from spark_ckpt.state.backends.spec import StateBackendSpec, StateBackendType
from spark_ckpt.state.descriptor import ValueStateDescriptor

VALUES = [
    (pa.int64(), [0, -1, 2**62, None, -(2**63)]),
    (pa.int8(), [1, None, -128]),
    (pa.uint64(), [0, 2**64 - 1, None]),
    (pa.float64(), [1.5, None, -0.0, float("inf")]),
    (pa.bool_(), [True, False, None]),
    (pa.string(), ["", "é", None, "x" * 300]),
    (pa.binary(), [b"", b"\x00\x01", None]),
    (pa.date32(), [dt.date(2026, 12, 3), None]),
    (pa.timestamp("us", tz="UTC"), [dt.datetime(2026, 1, 1, tzinfo=dt.UTC), None]),
    (pa.decimal128(12, 3), [decimal.Decimal("12.345"), None]),
    (pa.list_(pa.int64()), [[1, 2], [], None]),
    (pa.map_(pa.string(), pa.float64()), [[("a", 1.0), ("b", None)], None]),
    (pa.struct([("s", pa.int64()), ("w", pa.list_(pa.string()))]), [{"s": 1, "w": ["x"]}, None]),
]


@pytest.mark.parametrize(("arrow_type", "values"), VALUES, ids=[str(t) for t, _ in VALUES])
def test_values_round_trip_through_their_byte_encoding(
    arrow_type: pa.DataType, values: list[object]
) -> None:
    codec = ValueCodec(arrow_type)
    column = pa.array(values, arrow_type)
    stored = codec.encode(column.slice(0))
    assert [s is None for s in stored] == [v is None for v in values]
    assert codec.decode(stored).equals(column)
    assert codec.decode(codec.encode(column.slice(1))).equals(column.slice(1))  # an offset


@pytest.mark.parametrize(
    ("key_type", "keys"),
    [
        (pa.int64(), [-(2**63), -5, 0, 7, 2**63 - 1]),
        (pa.int32(), [-3, 0, 3]),
        (pa.uint32(), [0, 2**32 - 1]),
        (pa.string(), ["", "a", "b", "é"]),
        (pa.binary(), [b"", b"\x00", b"\xff"]),
        (pa.bool_(), [False, True]),
    ],
)
def test_keys_round_trip_in_key_group_then_key_order(
    key_type: pa.DataType, keys: list[object]
) -> None:
    codec = KeyCodec(key_type)
    groups = np.asarray([3] * len(keys) + [1] * len(keys), dtype=np.int64)
    array = pa.array(keys + keys, key_type)
    stored = codec.encode(groups, array)
    decoded_groups, decoded = codec.decode(stored)
    assert decoded_groups.tolist() == groups.tolist() and decoded.equals(array)
    assert [codec.one(int(g), k) for g, k in zip(groups, keys + keys, strict=True)] == stored
    # byte order is (key group, key) order: a key group is one range, keys ordered in it
    ordered = sorted(range(len(stored)), key=stored.__getitem__)
    assert [int(groups[i]) for i in ordered] == sorted(groups.tolist())
    if not pa.types.is_string(key_type):  # strings: byte order, not code point order
        assert [array[i].as_py() for i in ordered[: len(keys)]] == sorted(keys)  # type: ignore[type-var]


def _backend(local_dir: str | None) -> KeyedStateBackend:
    options = RocksDBOptions(local_dir, 1 << 20, 1 << 20)
    storage = StateBackendSpec(StateBackendType.ROCKSDB, options).storage("op", 0, pa.int64())
    return KeyedStateBackend.for_subtask("op", 0, 1, pa.int64(), 128, storage=storage)


COUNT = ValueStateDescriptor("count", pa.int64())


def test_files_live_under_spark_local_dirs_and_go_when_the_backend_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path}/a,{tmp_path}/b")
    (tmp_path / "a").mkdir()
    b = _backend(None)
    b.put_values(COUNT, [1, 2, 3], [10, 20, 30])
    [made] = list((tmp_path / "a").iterdir())
    assert made.name.startswith(f"{DIR_PREFIX}op-0-{os.getpid()}-")
    assert b.storage_stats().backend == "rocksdb" and b.storage_stats().entries == 3
    b.close()
    b.close()  # idempotent
    assert list((tmp_path / "a").iterdir()) == []


def test_a_local_directory_that_is_not_writable_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    b = _backend(str(blocker / "state"))
    with pytest.raises(StateBackendError, match="is not writable") as e:
        b.put_values(COUNT, [1], [1])
    assert isinstance(e.value, StateError) and str(blocker) in str(e.value)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs (root only: skipped elsewhere)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_one_clear_error_and_loses_no_state_written(tiny_disk: Path) -> None:
    b = _backend(str(tiny_disk))
    names = ValueStateDescriptor("names", pa.string())
    written = 0
    with pytest.raises(StateBackendError, match="local disk is full"):
        for i in range(1_000):
            keys = pa.array(np.arange(i * 10_000, (i + 1) * 10_000))
            b.put_values(names, keys, pa.array(["x" * 100] * 10_000))
            written = (i + 1) * 10_000
    assert written > 0
    assert b.get_values(names, [0, written - 1]).to_pylist() == ["x" * 100] * 2
    b.close()
    assert list(tiny_disk.iterdir()) == []


def test_a_killed_process_directory_is_removed_by_the_next_instance(tmp_path: Path) -> None:
    child = subprocess.Popen(["sleep", "0"])
    child.wait()
    orphan = tmp_path / f"{DIR_PREFIX}op-1-{child.pid}-0123456789ab"
    (orphan / "sub").mkdir(parents=True)
    live = tmp_path / f"{DIR_PREFIX}op-2-{os.getpid()}-0123456789ab"
    live.mkdir()
    other = tmp_path / "not-ours"
    other.mkdir()
    b = _backend(str(tmp_path))
    b.put_values(COUNT, [1], [1])
    assert not orphan.exists() and live.exists() and other.exists()
    b.close()


_LOAD_KEYS = {
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "string": (pa.string(), st.text(max_size=4)),
    "bool": (pa.bool_(), st.booleans()),
}


@pytest.mark.parametrize("kind", sorted(_LOAD_KEYS))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_restored_blobs_hold_what_a_fold_over_them_holds(
    kind: str, data: st.DataObject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blobs loaded into a table (ingested as sorted files while their key groups are new,
    written key by key otherwise, deletions included) hold what a dict folded over their
    rows holds; a key repeated in one blob keeps its last row. Loads and scans go in
    slices of rows: some examples cut them into slices of 3."""
    monkeypatch.setattr(rocksdb, "_LOAD_SLICE", data.draw(st.sampled_from([3, 500_000])))
    key_type, key_strategy = _LOAD_KEYS[kind]
    row = st.tuples(st.integers(0, 5), key_strategy, st.integers(-9, 9), st.booleans())
    blobs = data.draw(st.lists(st.lists(row, max_size=12), min_size=1, max_size=4))
    storage = RocksDBStorage(RocksDBOptions(str(tmp_path), 1 << 20, 1 << 20), "op", key_type)
    table = storage.new_table(COUNT)
    model: dict[tuple[int, object], int] = {}
    try:
        for i, rows in enumerate(blobs):
            rows = sorted(rows, key=lambda r: r[0])  # a blob arrives by key group
            full = i == 0 or data.draw(st.booleans())
            for g, k, v, gone in rows:
                if full or not gone:
                    model[(g, k)] = v
                else:
                    model.pop((g, k), None)
            table.load(
                np.asarray([r[0] for r in rows], dtype=np.int64),
                pa.array([r[1] for r in rows], key_type),
                pa.array([r[2] for r in rows], pa.int64()),
                None if full else np.asarray([r[3] for r in rows], dtype=np.bool_),
            )
        groups, keys, values = table.entries()
        pairs = zip(groups.tolist(), keys.to_pylist(), strict=True)
        held = dict(zip(pairs, values.to_pylist(), strict=True))
        assert held == model
        assert table.count() == len(model)
    finally:
        storage.close()

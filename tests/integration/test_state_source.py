"""The ``ckpt-state`` batch data source and ``state_dataframe`` on a real SparkSession: the
rows of a store root's keyed and operator state equal plain-dict oracles (the state is built
with the state backend and an incremental chain, no Spark involved)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.errors import StateError
from spark_ckpt.offline import SavepointWriter
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.descriptor import MapStateDescriptor, ValueStateDescriptor

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

COUNT = ValueStateDescriptor("count", pa.int64())
ATTRS = MapStateDescriptor("attrs", pa.string(), pa.int64())


def _checkpoint(store: DeltaCheckpointStore, backends: list[KeyedStateBackend], cid: int) -> None:
    lease = store.acquire()
    handles = [store.write_task_state(cid, b.snapshots.snapshot(cid)) for b in backends]
    store.commit(
        lease,
        CompletedCheckpoint(cid, SnapshotType.CHECKPOINT, tuple(handles), CheckpointStats(0, 1)),
    )
    for b, h in zip(backends, handles, strict=True):
        b.snapshots.notify_checkpoint_complete(cid, h)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    """A root with 2 subtasks of operator ``counter``: a full checkpoint 1, then an
    incremental checkpoint 2 (updates and deletes); the oracle of checkpoint 2."""
    path = str(tmp_path_factory.mktemp("state-source") / "root")
    store = DeltaCheckpointStore(path)
    backends = [KeyedStateBackend.for_subtask("counter", i, 2, pa.int64()) for i in range(2)]
    count: dict[int, int] = {}
    attrs: dict[int, dict[str, int]] = {}

    def put(keys: list[int], value: int | None) -> None:
        for k in keys:
            owner = next(b for b in backends if _owns(b, k))
            owner.set_current_key(k)
            owner.value_state(COUNT).update(value)
            if value is None:
                count.pop(k, None)
            else:
                count[k] = value
                owner.map_state(ATTRS).put(f"a{k % 3}", value)
                attrs.setdefault(k, {})[f"a{k % 3}"] = value

    put(list(range(500)), 1)
    for i, b in enumerate(backends):
        b.operator_list_state("pending", pa.int64()).update([i, 10 + i])
    _checkpoint(store, backends, 1)
    put(list(range(0, 500, 5)), 7)
    put(list(range(1, 500, 50)), None)
    _checkpoint(store, backends, 2)
    yield path, {"count": count, "attrs": attrs, "pending": [0, 10, 1, 11]}


def _owns(backend: KeyedStateBackend, key: int) -> bool:
    try:
        backend.set_current_key(key)
    except StateError:
        return False
    return True


def test_the_data_source_reads_keyed_state(spark: SparkSession, root) -> None:  # type: ignore[no-untyped-def]
    from spark_ckpt.pipeline.pipeline import register_data_sources

    path, oracle = root
    register_data_sources(spark)
    df = (
        spark.read.format("ckpt-state")
        .option("path", path)
        .option("uid", "counter")
        .option("state", "count")
        .load()
    )
    assert df.columns == ["key", "value"]
    assert df.rdd.getNumPartitions() == 2  # one per stored key-group range
    assert {r["key"]: r["value"] for r in df.collect()} == oracle["count"]
    maps = (
        spark.read.format("ckpt-state")
        .options(path=path, uid="counter", state="attrs", partitions="5")
        .load()
    )
    assert maps.rdd.getNumPartitions() == 5
    assert {r["key"]: dict(r["value"]) for r in maps.collect()} == oracle["attrs"]
    earlier = (
        spark.read.format("ckpt-state")
        .options(path=path, uid="counter", state="count", checkpoint="1")
        .load()
    )
    assert {r["key"]: r["value"] for r in earlier.collect()} == dict.fromkeys(range(500), 1)
    ops = spark.read.format("ckpt-state").options(path=path, uid="counter", state="pending").load()
    assert sorted(r["value"] for r in ops.collect()) == sorted(oracle["pending"])


def test_state_dataframe(spark: SparkSession, root, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from spark_ckpt.spark.datasource.state_frames import state_dataframe

    path, oracle = root
    df = state_dataframe(spark, path, "counter", "count")
    assert {r["key"]: r["value"] for r in df.collect()} == oracle["count"]
    sp = str(tmp_path / "sp")
    SavepointWriter.from_existing(path, pipeline="p").with_max_parallelism(32).write(sp)
    df = state_dataframe(spark, sp, "counter", "attrs")
    assert {r["key"]: dict(r["value"]) for r in df.collect()} == oracle["attrs"]


def test_a_missing_state_fails_at_load(spark: SparkSession, root) -> None:  # type: ignore[no-untyped-def]
    from spark_ckpt.pipeline.pipeline import register_data_sources

    path, _ = root
    register_data_sources(spark)
    with pytest.raises(Exception, match="no state 'nope'"):
        spark.read.format("ckpt-state").options(path=path, uid="counter", state="nope").load()

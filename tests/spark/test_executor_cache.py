"""The executor-wide state cache (spark_ckpt/spark/executors/executor_cache.py).

Without Spark: the fence decides (a matching fence hits; another batch, run, attempt or executor
misses with its reason), publishing is atomic under concurrent writers in separate processes
(a reader gets a complete image of exactly the attempt its fence names, or a miss), eviction
keeps what a retry needs, the counters add up, reads are memory-mapped.

With Spark (``spark`` + ``slow``): a streaming query ``groupBy("sub").applyInPandasWithState``
under ``local[2]`` with ``spark.python.worker.reuse=false`` — every task gets a new Python worker,
so a subtask never runs in the same Python process twice — in a child process of its own (this
file run as a script). After warm-up every micro-batch must find its state in the cache, which
only a cache shared by the executor's Python workers can do, and the state must equal a plain
fold over the source's rows.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spark_ckpt.errors import EnvironmentSetupError, StateError, StoreError
from spark_ckpt.spark.executors.executor_cache import (
    ABANDONED_AFTER_S,
    CACHE_DIR_NAME,
    CacheCounters,
    CacheKey,
    ExecutorStateCache,
    Fence,
    MissReason,
    StateImage,
    executor_cache_dir,
    executor_identity,
)

KEY = CacheKey("/lake/pipeline", "run-1", 3)


def _image(value: int, rows: int = 100) -> StateImage:
    return StateImage(
        {
            "counts": pa.table({"key": pa.array(range(rows), pa.int64()), "v": [value] * rows}),
            "meta_rows": pa.table({"x": pa.array([value], pa.int64())}),
        },
        {"value": value},
    )


@pytest.fixture
def cache(tmp_path: Path) -> ExecutorStateCache:
    return ExecutorStateCache(tmp_path / "blockmgr-a" / CACHE_DIR_NAME, "blockmgr-a")


# -- fence semantics ------------------------------------------------------------------------


def test_matching_fence_hits_with_the_published_image(cache: ExecutorStateCache) -> None:
    fence = cache.publish(KEY, 7, _image(7), token="tA", previous=None)
    assert fence == Fence("run-1", 7, "tA", "blockmgr-a")
    found = cache.lookup(KEY, fence)
    assert found.hit and found.miss is None
    assert found.image is not None
    assert found.image.tables["counts"].equals(_image(7).tables["counts"])
    assert found.image.tables["meta_rows"].column("x").to_pylist() == [7]
    assert found.image.meta == {"value": 7}
    # another worker of the same executor: another object on the same directory
    other_worker = ExecutorStateCache(cache.directory, cache.executor)
    assert other_worker.lookup(KEY, fence).hit


def test_fence_round_trips_through_a_group_state_row() -> None:
    fence = Fence("r", 12, "t1a0-abc", "blockmgr-x")
    assert Fence.from_row(fence.to_row()) == fence
    assert Fence.from_row(None) is None


@pytest.mark.parametrize(
    ("fence", "reason"),
    [
        (None, MissReason.NO_FENCE),
        (Fence("run-1", 6, "tA", "blockmgr-a"), MissReason.STALE_FENCE),  # an older batch
        (Fence("run-1", 8, "tA", "blockmgr-a"), MissReason.STALE_FENCE),  # a batch not published
        (Fence("run-1", 7, "tB", "blockmgr-a"), MissReason.STALE_FENCE),  # another attempt
        (Fence("run-0", 7, "tA", "blockmgr-a"), MissReason.STALE_FENCE),  # another run
        (Fence("run-1", 7, "tA", "blockmgr-b"), MissReason.OTHER_EXECUTOR),
        (Fence("run-1", 7, "../../x", "blockmgr-a"), MissReason.STALE_FENCE),  # not a token
    ],
)
def test_a_fence_that_is_not_the_entry_s_misses(
    cache: ExecutorStateCache, fence: Fence | None, reason: MissReason
) -> None:
    cache.publish(KEY, 7, _image(7), token="tA", previous=None)
    found = cache.lookup(KEY, fence)
    assert not found.hit and found.image is None
    assert found.miss is reason


def test_no_entry_of_the_subtask_on_this_executor(cache: ExecutorStateCache) -> None:
    cache.publish(KEY, 7, _image(7), token="tA", previous=None)
    other_subtask = CacheKey(KEY.root, KEY.run_id, 2)
    assert cache.lookup(other_subtask, Fence("run-1", 7, "tA", "blockmgr-a")).miss is (
        MissReason.NO_ENTRY
    )
    other_root = CacheKey("/lake/other", KEY.run_id, KEY.subtask)
    assert cache.lookup(other_root, Fence("run-1", 7, "tA", "blockmgr-a")).miss is (
        MissReason.NO_ENTRY
    )


def test_a_second_executor_does_not_see_the_first_s_entries(tmp_path: Path) -> None:
    a = ExecutorStateCache(tmp_path / "blockmgr-a" / CACHE_DIR_NAME, "blockmgr-a")
    b = ExecutorStateCache(tmp_path / "blockmgr-b" / CACHE_DIR_NAME, "blockmgr-b")
    fence = a.publish(KEY, 1, _image(1), token="tA", previous=None)
    assert b.lookup(KEY, fence).miss is MissReason.OTHER_EXECUTOR
    # b rebuilds and publishes; a later lookup on a with b's fence is another executor's
    fence_b = b.publish(KEY, 2, _image(2), token="tB", previous=fence)
    assert b.lookup(KEY, fence_b).hit
    assert a.lookup(KEY, fence_b).miss is MissReason.OTHER_EXECUTOR


def test_a_damaged_entry_is_a_miss_never_an_error(cache: ExecutorStateCache) -> None:
    fence = cache.publish(KEY, 1, _image(1), token="tA", previous=None)
    entry = next(cache.directory.rglob("b000000000001-tA"))
    (entry / "t0.arrow").write_bytes(b"not arrow")
    assert cache.lookup(KEY, fence).miss is MissReason.UNREADABLE
    (entry / "meta.json").unlink()
    assert cache.lookup(KEY, fence).miss is MissReason.UNREADABLE


def test_publish_refuses_bad_tokens_and_reports_io_errors(tmp_path: Path) -> None:
    cache = ExecutorStateCache(tmp_path / "c", "e")
    with pytest.raises(StateError, match="token"):
        cache.publish(KEY, 1, _image(1), token="a/b", previous=None)
    with pytest.raises(StateError, match="batch id"):
        cache.publish(KEY, -1, _image(1), token="t", previous=None)
    (tmp_path / "file").write_text("x")
    blocked = ExecutorStateCache(tmp_path / "file", "e")  # the cache directory is a file
    with pytest.raises(StoreError, match="cannot publish subtask 3 batch 1"):
        blocked.publish(KEY, 1, _image(1), token="t", previous=None)


# -- eviction -------------------------------------------------------------------------------


def test_eviction_keeps_the_fence_read_and_drops_older_batches_and_other_runs(
    cache: ExecutorStateCache,
) -> None:
    f0 = cache.publish(KEY, 0, _image(0), token="a0", previous=None)
    f1 = cache.publish(KEY, 1, _image(1), token="a1", previous=f0)
    assert cache.entries(KEY) == [(0, "a0"), (1, "a1")]
    f2 = cache.publish(KEY, 2, _image(2), token="a2", previous=f1)
    assert cache.entries(KEY) == [(1, "a1"), (2, "a2")]
    assert cache.counters.evicted == 1
    # a retry of batch 2 (another attempt) reads f1 again: still there
    assert cache.lookup(KEY, f1).hit
    retry = cache.publish(KEY, 2, _image(20), token="b2", previous=f1)
    assert cache.entries(KEY) == [(1, "a1"), (2, "a2"), (2, "b2")]
    # each attempt's entry is its own
    assert cache.lookup(KEY, f2).image.meta == {"value": 2}  # type: ignore[union-attr]
    assert cache.lookup(KEY, retry).image.meta == {"value": 20}  # type: ignore[union-attr]
    # the next batch reads f2: batch 1 goes, and so does an abandoned temporary entry of an
    # older batch (a writer that died before its rename)
    run_dir = next(cache.directory.glob("*/3/r-*"))
    (run_dir / ".tmp-b000000000000-dead-1234").mkdir()
    old = time.time() - ABANDONED_AFTER_S - 1
    os.utime(run_dir / ".tmp-b000000000000-dead-1234", (old, old))
    (run_dir / ".tmp-b000000000001-slow-1234").mkdir()  # still being written: kept
    cache.publish(KEY, 3, _image(3), token="a3", previous=f2)
    assert cache.entries(KEY) == [(2, "a2"), (2, "b2"), (3, "a3")]
    temporary = sorted(p.name for p in run_dir.iterdir() if p.name.startswith("."))
    assert temporary == [".tmp-b000000000001-slow-1234"]
    assert cache.counters.evicted == 2
    # a new run of the pipeline: its first publish drops every entry of the old run
    new_run = CacheKey(KEY.root, "run-2", KEY.subtask)
    n0 = cache.publish(new_run, 0, _image(0), token="n0", previous=None)
    assert cache.entries(KEY) == []
    assert cache.entries(new_run) == [(0, "n0")]
    assert cache.counters.evicted == 2 + 3
    assert not any(p.name.startswith(".trash-") for p in cache.directory.iterdir())
    cache.publish(new_run, 1, _image(1), token="n1", previous=n0)
    assert cache.entries(new_run) == [(0, "n0"), (1, "n1")]


def test_without_a_fence_of_this_run_publish_keeps_only_its_batch(
    cache: ExecutorStateCache,
) -> None:
    cache.publish(KEY, 4, _image(4), token="a4", previous=None)
    cache.publish(KEY, 5, _image(5), token="a5", previous=Fence("run-0", 4, "x", "e"))
    assert cache.entries(KEY) == [(5, "a5")]


# -- counters -------------------------------------------------------------------------------


def test_counters_count_hits_and_misses_by_reason(cache: ExecutorStateCache) -> None:
    fence = cache.publish(KEY, 1, _image(1), token="tA", previous=None)
    cache.lookup(KEY, fence)
    cache.lookup(KEY, fence)
    cache.lookup(KEY, None)
    cache.lookup(KEY, Fence("run-1", 1, "tB", "blockmgr-a"))
    cache.lookup(KEY, Fence("run-1", 1, "tA", "blockmgr-z"))
    cache.lookup(CacheKey(KEY.root, KEY.run_id, 0), fence)
    c = cache.counters
    assert c.hits == 2
    assert c.misses == {
        "no_fence": 1,
        "no_entry": 1,
        "stale_fence": 1,
        "other_executor": 1,
        "unreadable": 0,
    }
    assert c.lookups == 6 and c.publishes == 1
    written = sum(p.stat().st_size for p in cache.directory.rglob("*") if p.is_file())
    assert c.bytes_written == written
    mapped = sum(p.stat().st_size for p in cache.directory.rglob("*.arrow"))
    assert c.bytes_mapped == 2 * mapped
    total = c + c
    assert total.hits == 4 and total.misses["stale_fence"] == 2 and total.publishes == 2
    assert total.as_dict()["misses"]["no_fence"] == 2
    assert CacheCounters().as_dict()["hits"] == 0


def test_reads_are_memory_mapped_not_copied(cache: ExecutorStateCache) -> None:
    rows = 2_000_000  # 16 MB per column
    big = pa.table({"k": pa.array(range(rows), pa.int64())})
    fence = cache.publish(KEY, 1, StateImage({"big": big}), token="t", previous=None)
    del big
    before = pa.total_allocated_bytes()
    found = cache.lookup(KEY, fence)
    assert found.image is not None
    assert found.image.tables["big"].num_rows == rows
    assert pa.total_allocated_bytes() - before < 1_000_000


# -- where the cache lives --------------------------------------------------------------------


def test_the_cache_lives_in_the_executor_s_first_local_dir() -> None:
    env = {"SPARK_LOCAL_DIRS": "/tmp/x/blockmgr-1234,/disk2/blockmgr-5678"}
    assert executor_cache_dir(env) == Path("/tmp/x/blockmgr-1234") / CACHE_DIR_NAME
    assert executor_identity(env) == "blockmgr-1234"
    with pytest.raises(EnvironmentSetupError, match="SPARK_LOCAL_DIRS"):
        executor_cache_dir({})


# -- atomic publish under concurrent writers ----------------------------------------------------

ROUNDS = 12
WRITERS = 3
ROWS = 200_000


def _writer_image(writer: int, batch: int) -> StateImage:
    # every value names the attempt: a reader can tell a mix of attempts from one image
    tag = writer * 1000 + batch
    return StateImage(
        {
            "a": pa.table({"v": pa.array([tag] * ROWS, pa.int64())}),
            "b": pa.table({"w": pa.array([tag] * (ROWS // 2), pa.int64())}),
        },
        {"tag": tag},
    )


def _writer(directory: str, writer: int) -> None:
    cache = ExecutorStateCache(directory, "exec")
    previous: Fence | None = None
    for batch in range(ROUNDS):
        # every writer publishes every batch of the same subtask: retried/speculative attempts
        previous = cache.publish(
            KEY, batch, _writer_image(writer, batch), token=f"w{writer}b{batch}", previous=previous
        )


def _reader(directory: str, stop: Any, out: Any) -> None:
    cache = ExecutorStateCache(directory, "exec")
    seen: Counter[str] = Counter()
    bad: list[str] = []
    last_pass = False
    while not last_pass:
        last_pass = stop.is_set()  # one whole pass after the writers ended
        for batch in range(ROUNDS):
            for writer in range(WRITERS):
                fence = Fence(KEY.run_id, batch, f"w{writer}b{batch}", "exec")
                found = cache.lookup(KEY, fence)
                if found.image is None:
                    seen[str(found.miss)] += 1
                    continue
                tag = writer * 1000 + batch
                a, b = found.image.tables["a"], found.image.tables["b"]
                ok = (
                    found.image.meta == {"tag": tag}
                    and a.num_rows == ROWS
                    and b.num_rows == ROWS // 2
                    and a.column("v").unique().to_pylist() == [tag]
                    and b.column("w").unique().to_pylist() == [tag]
                )
                seen["hit" if ok else "bad"] += 1
                if not ok:
                    bad.append(f"w{writer}b{batch}")
    out.put((dict(seen), bad))


@pytest.mark.slow  # several Python processes
def test_concurrent_writers_publish_whole_images_of_one_attempt(tmp_path: Path) -> None:
    directory = str(tmp_path / "cache")
    ctx = multiprocessing.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    reader = ctx.Process(target=_reader, args=(directory, stop, out))
    writers = [ctx.Process(target=_writer, args=(directory, w)) for w in range(WRITERS)]
    reader.start()
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
        assert w.exitcode == 0
    stop.set()
    seen, bad = out.get(timeout=120)
    reader.join(10)
    assert bad == []
    assert seen.get("bad", 0) == 0
    assert seen.get("hit", 0) > 0
    assert set(seen) <= {"hit", "no_entry", "stale_fence", "unreadable"}
    # afterwards: each writer's last two batches are there, whole, and only those
    cache = ExecutorStateCache(directory, "exec")
    entries = cache.entries(KEY)
    assert {(ROUNDS - 1, f"w{w}b{ROUNDS - 1}") for w in range(WRITERS)} <= set(entries)
    assert all(batch >= ROUNDS - 3 for batch, _ in entries)
    for w in range(WRITERS):
        found = cache.lookup(KEY, Fence(KEY.run_id, ROUNDS - 1, f"w{w}b{ROUNDS - 1}", "exec"))
        assert found.image is not None and found.image.meta == {"tag": w * 1000 + ROUNDS - 1}
    leftovers = [p for p in Path(directory).rglob("*") if p.name.startswith((".tmp-", ".trash-"))]
    assert leftovers == []


# -- under Spark: shared by the executor's Python workers -------------------------------------

SPARK_BATCHES = 15  # 3 of warm-up, 12 measured
SPARK_ROWS = 400  # rows per micro-batch: values [b*400, (b+1)*400) in micro-batch b
SPARK_KEYS = 16  # keys per subtask
SUBTASKS = 2  # a fresh Python worker per task (no reuse): each subtask costs one per batch
WARMUP = 3


def _subtask_fn(root: str, run_id: str) -> Any:
    """The applyInPandasWithState function: state image from the executor cache by the fence in
    Spark's state, else rebuilt from the durable copy the fence names; per-key counts added;
    durable copy written, image published, new fence kept."""

    def fn(key: Any, pdfs: Any, state: Any) -> Any:
        import pandas as pd
        import pyarrow as pa

        from spark_ckpt.spark.executors.executor_cache import (
            CacheKey,
            ExecutorStateCache,
            Fence,
            StateImage,
            attempt_token,
            current_batch_id,
            executor_cache_dir,
            executor_identity,
        )

        sub, batch = int(key[0]), current_batch_id()
        assert batch is not None
        fence = Fence.from_row(state.get if state.exists else None)
        cache, ckey = ExecutorStateCache.for_this_executor(), CacheKey(root, run_id, sub)
        found = cache.lookup(ckey, fence)
        if found.image is not None:
            counts = found.image.tables["counts"]
        elif fence is None:
            counts = pa.table({"key": pa.array([], pa.int64()), "count": pa.array([], pa.int64())})
        else:
            path = f"{root}/durable/{sub}/b{fence.batch_id}-{fence.token}.arrow"
            with pa.memory_map(path, "r") as source:
                counts = pa.ipc.open_file(source).read_all()
        rows = pa.Table.from_pandas(pd.concat(list(pdfs)), preserve_index=False)
        delta = rows.group_by("key").aggregate([("key", "count")]).rename_columns(["key", "count"])
        merged = (
            pa.concat_tables([counts, delta.cast(counts.schema)])
            .group_by("key")
            .aggregate([("count", "sum")])
            .rename_columns(["key", "count"])
        )
        token = attempt_token()
        os.makedirs(f"{root}/durable/{sub}", exist_ok=True)
        tmp = f"{root}/durable/{sub}/.tmp-{token}"
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, merged.schema) as writer:
            writer.write_table(merged)
        os.rename(tmp, f"{root}/durable/{sub}/b{batch}-{token}.arrow")
        new = cache.publish(
            ckey, batch, StateImage({"counts": merged}), token=token, previous=fence
        )
        state.update(new.to_row())
        n = merged.num_rows
        yield pd.DataFrame(
            {
                "sub": [sub] * n,
                "batch": [batch] * n,
                "outcome": ["hit" if found.miss is None else found.miss.value] * n,
                "rows": [rows.num_rows] * n,
                "worker_pid": [os.getpid()] * n,
                "executor": [executor_identity()] * n,
                "cache_dir": [str(executor_cache_dir())] * n,
                "key": merged.column("key").to_pylist(),
                "count": merged.column("count").to_pylist(),
            }
        )

    return fn


def _spark_job(out: str, workdir: str) -> None:
    """Run the query under local[2] with a new Python worker per task; write every output row
    with the batch id foreachBatch got to *out*."""
    import threading
    import uuid

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from spark_ckpt.spark.driver.batch_aligner import collect_arrow
    from spark_ckpt.spark.executors.executor_cache import FENCE_SCHEMA

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.python.worker.reuse", "false")
        .config("spark.sql.shuffle.partitions", str(SUBTASKS))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
        .getOrCreate()
    )
    src = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", SPARK_ROWS)
        .option("numPartitions", 2)
        .load()
        .select(
            (F.col("value") % SUBTASKS).alias("sub"),
            ((F.col("value") / SUBTASKS).cast("long") % SPARK_KEYS).alias("key"),
        )
    )
    records: list[dict[str, Any]] = []
    done = threading.Event()

    def sink(df: Any, batch_id: int) -> None:
        records.extend({**r, "spark_batch": batch_id} for r in collect_arrow(df).to_pylist())
        if batch_id + 1 >= SPARK_BATCHES:
            done.set()

    schema = (
        "sub long, batch long, outcome string, rows long, worker_pid long, executor string,"
        " cache_dir string, key long, count long"
    )
    fn = _subtask_fn(f"{workdir}/pipeline", uuid.uuid4().hex)
    query = (
        src.groupBy("sub")
        .applyInPandasWithState(fn, schema, FENCE_SCHEMA, "append", GroupStateTimeout.NoTimeout)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", f"{workdir}/spark-checkpoint")
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        while not done.wait(1.0):
            assert query.isActive, f"query failed: {query.exception()}"
    finally:
        query.stop()
        spark.stop()
    Path(out).write_text(json.dumps(records))


@pytest.mark.spark
@pytest.mark.slow
def test_under_local2_every_python_worker_of_the_executor_finds_the_state(
    tmp_path: Path,
) -> None:
    out = tmp_path / "records.json"
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONWARNINGS": "ignore::FutureWarning",
    }
    proc = subprocess.run(
        [sys.executable, __file__, str(out), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(out.read_text())

    # the oracle: a plain fold over the source's rows [0, (b+1)*R) after micro-batch b
    cells: dict[tuple[int, int], dict[str, Any]] = {}
    for r in records:
        assert r["batch"] == r["spark_batch"]
        cell = cells.setdefault((r["sub"], r["batch"]), {**r, "state": {}})
        cell["state"][r["key"]] = r["count"]
    for b in range(SPARK_BATCHES):
        expected: dict[int, Counter[int]] = {s: Counter() for s in range(SUBTASKS)}
        for v in range((b + 1) * SPARK_ROWS):
            expected[v % SUBTASKS][(v // SUBTASKS) % SPARK_KEYS] += 1
        for s in range(SUBTASKS):
            assert cells[(s, b)]["rows"] == SPARK_ROWS // SUBTASKS
            assert cells[(s, b)]["state"] == dict(expected[s]), (s, b)

    # locality: one executor; every Python worker of it finds what another one published
    assert len({c["executor"] for c in cells.values()}) == 1
    cache_dir = Path(next(iter(cells.values()))["cache_dir"])
    assert cache_dir.name == CACHE_DIR_NAME and cache_dir.parent.name.startswith("blockmgr-")
    measured = [c for (s, b), c in cells.items() if b >= WARMUP]
    assert len(measured) == SUBTASKS * (SPARK_BATCHES - WARMUP)
    hits = [c for c in measured if c["outcome"] == "hit"]
    assert len(hits) >= 0.9 * len(measured), Counter(c["outcome"] for c in measured)
    worker_changes = 0
    for s in range(SUBTASKS):
        for b in range(WARMUP, SPARK_BATCHES):
            before, now = cells[(s, b - 1)], cells[(s, b)]
            if now["worker_pid"] != before["worker_pid"]:
                worker_changes += 1
                # the structural property: another Python process, same executor -> a hit
                assert now["outcome"] == "hit", (s, b, now["outcome"])
    assert worker_changes > 0  # no reused worker: a per-worker cache could not hit at all


if __name__ == "__main__":  # the Spark job of the test above, in a process of its own
    _spark_job(sys.argv[1], sys.argv[2])

"""State backends bench: ``hashmap`` against ``rocksdb`` for the keyed running count (int64
key, int64 count), with Spark's own ``groupBy(key).count()`` on its RocksDB state store as the
anchor of the throughput figures::

    .venv/bin/python bench/state_backends.py            # full, ~20 min, state_backends.json
    .venv/bin/python bench/state_backends.py --quick --out /tmp/x.json   # smoke run, ~1 min
    .venv/bin/python bench/state_backends.py --no-spark  # without the Spark anchor

Every measurement runs in a fresh Python process of its own (this script with ``--child``),
so that one measurement's memory (the RSS of a 10M-key ``hashmap``, RocksDB's caches) is not
the next one's. The running count of one batch is the same everywhere: the batch's distinct
keys and their counts (``pyarrow.compute.value_counts``), ``counts = get_values(keys)``, add
the batch's counts, ``put_values(keys, counts)`` on one subtask's
:class:`~spark_ckpt.state.backend.KeyedStateBackend` (parallelism 1, max parallelism 128).

1. **Memory** (``memory``): bytes of host memory per key, the process's RSS (``VmRSS``) after
   loading *N* distinct keys (batches of 100k new keys, each counted once) minus its RSS
   before (the backend built, its state registered, ``rocksdb``'s instance open, one batch
   run on a throwaway backend), over *N*; sampled at each milestone of one load (100k, 1M,
   10M, then for ``rocksdb`` 20M, 30M, ... while the load's projected time stays within a
   budget, 4 minutes by default). Also after handing the allocators' free memory back
   (``malloc_trim``, Arrow's ``release_unused``: ``*_trimmed``). Two modes, each backend in
   a process of its own: ``direct``, the backend alone, no checkpoint (its change logs then
   hold every key loaded); ``pipeline``, as a pipeline runs it (:class:`PipelineCuts`: an
   incremental checkpoint every 10 batches, the changelog segment cut after every batch).
2. **Throughput** (``throughput``): rows/s of the running count over batches of 100k rows
   drawn uniformly over 100k keys and over 10M keys (seeded, the same rows for every backend
   and for Spark), the first batches unmeasured; over 10M keys both from an empty state (as
   Spark's query starts) and from a state prefilled with all 10M keys. The anchor: Spark's
   ``groupBy("key").count()`` in a streaming query over the same rows as Parquet files (one
   file of 100k rows per micro-batch, ``maxFilesPerTrigger`` 1), ``local[2]``, 2 shuffle
   partitions, ``RocksDBStateStoreProvider``, update mode, 1 s processing-time trigger, into
   ``noop``, with a ``checkpointLocation``; its rows/s are rows per busy second (the measured
   batches' ``numInputRows`` over their ``durationMs.triggerExecution``). Ratios:
   backend / Spark, per repetition (the cases run in reversed order in every other
   repetition), median.
3. **Checkpoint** (``checkpoint``): 10M keys loaded, a full checkpoint (synchronous
   ``snapshot`` + ``write_task_state`` into an ``InMemoryCheckpointStore``, then
   ``notify_checkpoint_complete``); then rounds of 1% churn (1% of the keys counted once
   more) each followed by an incremental checkpoint; then a full one after the churn. Time and
   bytes written by each.
4. **Restore** (``restore``): the first full checkpoint of 3. restored with
   :func:`~spark_ckpt.state.state_restore.restore_backend` into a fresh backend of the same
   kind in the same process (reading and checking the blobs included); seconds per GB
   (10^9 bytes) of the checkpoint's blob bytes. A sample of keys is checked after it.

Targets (from the state backends' issue): ``rocksdb``'s RSS flat within 1.5x from 10M keys to
100M (here: to the largest *N* the budget allowed; per memory mode); restore <= 10 s/GB for
each backend.
Writes ``bench/results/state_backends.json`` unless ``--out`` says otherwise; see
``bench/README.md``, section "State backends".
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from timeit import default_timer as perf_counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: benchcommon

from benchcommon import git_info, machine_info, spark_machine_info

from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.descriptor import ValueStateDescriptor

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "state_backends.json"
BACKENDS = ("hashmap", "rocksdb")
#: ``direct``: the backend alone, no checkpoint; ``pipeline``: as a pipeline runs it
#: (:class:`PipelineCuts`)
MEMORY_MODES = ("direct", "pipeline")
COUNT = ValueStateDescriptor("count", pa.int64())
OPERATOR = "counter"
MAX_PARALLELISM = 128
#: new keys per batch while loading a state
LOAD_CHUNK = 100_000
SEED = 7
SPARK_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: the targets this bench checks
RSS_FLAT_TARGET = 1.5  # rocksdb RSS at the largest N / RSS at 10M
RESTORE_TARGET_S_PER_GB = 10.0
GB = 1e9


@dataclass(frozen=True)
class Settings:
    """Sizes of one run."""

    memory_milestones: dict[str, tuple[int, ...]]  # per backend: keys at which RSS is read
    memory_budget_s: float  # a memory load stops before a milestone projected past this
    checkpoint_every_batches: int  # the ``pipeline`` memory mode's checkpoint interval
    batch_rows: int  # rows per running-count batch
    key_spaces: tuple[int, ...]  # the throughput's key spaces (small, big)
    warmup_batches: int
    measured_batches: int
    reps: int  # repetitions of the throughput cases (from empty state) and of Spark
    prefilled_keys: int  # the key space of the prefilled throughput case (0: none)
    checkpoint_keys: int
    churn: float
    churn_rounds: int
    spark: bool
    spark_prefill: bool  # Spark's query over the big key space after a 1-batch prefill
    child_timeout_s: float


FULL = Settings(
    memory_milestones={
        "hashmap": (100_000, 1_000_000, 10_000_000),
        "rocksdb": (
            100_000,
            1_000_000,
            10_000_000,
            20_000_000,
            30_000_000,
            50_000_000,
            100_000_000,
        ),
    },
    memory_budget_s=240.0,
    checkpoint_every_batches=10,
    batch_rows=100_000,
    key_spaces=(100_000, 10_000_000),
    warmup_batches=5,
    measured_batches=15,
    reps=2,
    prefilled_keys=10_000_000,
    checkpoint_keys=10_000_000,
    churn=0.01,
    churn_rounds=3,
    spark=True,
    spark_prefill=False,
    child_timeout_s=900.0,
)
QUICK = Settings(
    memory_milestones={"hashmap": (10_000, 100_000), "rocksdb": (10_000, 100_000, 200_000)},
    memory_budget_s=60.0,
    checkpoint_every_batches=2,
    batch_rows=10_000,
    key_spaces=(10_000, 200_000),
    warmup_batches=2,
    measured_batches=3,
    reps=1,
    prefilled_keys=200_000,
    checkpoint_keys=200_000,
    churn=0.01,
    churn_rounds=2,
    spark=True,
    spark_prefill=False,
    child_timeout_s=300.0,
)


# --- measuring ------------------------------------------------------------------------------


def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident set (*field* ``VmHWM``: its peak), from ``/proc/self/status``
    (psutil where there is no ``/proc``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    info = psutil.Process().memory_info()
    return int(info.rss)


def release_unused() -> None:
    """Hand what the allocators keep free back to the system: glibc's ``malloc_trim`` and
    Arrow's memory pool (the ``*_trimmed`` RSS figures: what the state itself holds)."""
    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def make_backend(kind: str, local_dir: str) -> KeyedStateBackend:
    """One subtask's backend of *kind* (``rocksdb``: its instance under *local_dir*), with the
    count state registered."""
    from spark_ckpt.state.backends.heap import HeapStorage
    from spark_ckpt.state.backends.rocksdb import RocksDBOptions
    from spark_ckpt.state.backends.spec import StateBackendSpec, StateBackendType

    key_type = pa.int64()
    if kind == "rocksdb":
        spec = StateBackendSpec(StateBackendType.ROCKSDB, RocksDBOptions(local_dir))
        storage = spec.storage(OPERATOR, 0, key_type)
    elif kind == "hashmap":
        storage = HeapStorage(key_type)
    else:
        raise ValueError(f"unknown backend {kind!r}")
    backend = KeyedStateBackend.for_subtask(
        OPERATOR, 0, 1, key_type, MAX_PARALLELISM, storage=storage
    )
    backend.register(COUNT)
    return backend


@dataclass
class Phases:
    """Seconds of the running count, by phase."""

    count: float = 0.0  # value_counts of the batch, and the addition
    get: float = 0.0  # get_values
    put: float = 0.0  # put_values

    @property
    def total(self) -> float:
        return self.count + self.get + self.put


def count_batch(backend: KeyedStateBackend, keys: pa.Array, phases: Phases) -> None:
    """The running count of one batch of keys (see the module docstring)."""
    t0 = perf_counter()
    vc = pc.value_counts(keys)
    unique, counts = vc.field("values"), vc.field("counts")
    t1 = perf_counter()
    current = backend.get_values(COUNT, unique)
    t2 = perf_counter()
    updated = pc.add(pc.fill_null(current, 0), counts)
    t3 = perf_counter()
    backend.put_values(COUNT, unique, updated)
    t4 = perf_counter()
    phases.count += (t1 - t0) + (t3 - t2)
    phases.get += t2 - t1
    phases.put += t4 - t3


def load_keys(
    backend: KeyedStateBackend,
    start: int,
    stop: int,
    after_batch: Callable[[], None] | None = None,
) -> float:
    """Count keys ``start .. stop - 1`` once each, in batches of :data:`LOAD_CHUNK`, calling
    *after_batch* after each; wall seconds."""
    t0 = perf_counter()
    phases = Phases()
    for lo in range(start, stop, LOAD_CHUNK):
        count_batch(
            backend, pa.array(np.arange(lo, min(stop, lo + LOAD_CHUNK), dtype=np.int64)), phases
        )
        if after_batch is not None:
            after_batch()
    return perf_counter() - t0


class PipelineCuts:
    """What a running pipeline does to a backend between batches, for the ``pipeline`` memory
    mode: the changelog segment cut after every batch (``start_segment``, as the executor
    placement's changelog does after every micro-batch) and an incremental checkpoint every
    *every* batches (snapshot, written into a throwaway ``InMemoryCheckpointStore``, notified
    complete), so that the change logs hold what a pipeline's hold."""

    def __init__(self, backend: KeyedStateBackend, every: int) -> None:
        self.backend = backend
        self.every = every
        self.batches = 0
        self.checkpoints = 0
        self.checkpoint_s = 0.0
        self.last_blobs: list[dict[str, Any]] = []

    def __call__(self) -> None:
        from spark_ckpt.state.backends.memory import release_free_memory
        from spark_ckpt.state.snapshot.changes import start_segment
        from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

        start_segment(self.backend.tables)
        self.batches += 1
        if self.batches % self.every:
            return
        t0 = perf_counter()
        self.checkpoints += 1
        snap = self.backend.snapshots.snapshot(self.checkpoints)
        handle = InMemoryCheckpointStore().write_task_state(self.checkpoints, snap)
        self.backend.snapshots.notify_checkpoint_complete(self.checkpoints, handle)
        release_free_memory()  # as the task does after a completion
        self.checkpoint_s += perf_counter() - t0
        self.last_blobs = [
            {"kind": b.kind.value, "seq": b.seq, "rows": b.rows} for b in handle.blobs
        ]


def batch_keys(key_space: int, batches: int, rows: int, seed: int = SEED) -> list[np.ndarray]:
    """The throughput's input: *batches* batches of *rows* keys uniform over
    ``[0, key_space)``, the same for every backend and for Spark."""
    rng = np.random.default_rng([seed, key_space])
    return [rng.integers(0, key_space, rows, dtype=np.int64) for _ in range(batches)]


def storage_stats(backend: KeyedStateBackend) -> dict[str, Any]:
    return dict(backend.storage_stats().to_dict())


# --- the children: one measurement each ------------------------------------------------------


def child_memory(
    task: dict[str, Any], local_dir: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """Measurement 1 for one backend: RSS at each milestone of one load."""
    kind, mode = str(task["backend"]), str(task["mode"])
    milestones = [int(m) for m in task["milestones"]]
    budget = float(task["budget_s"])
    # one batch on a throwaway backend first: what the first batch loads once (compute
    # kernels, Arrow's memory pool, rocksdict) is not charged to the keys
    scratch = make_backend(kind, local_dir)
    load_keys(scratch, 0, LOAD_CHUNK)
    scratch.close()
    del scratch
    backend = make_backend(kind, local_dir)
    cuts = PipelineCuts(backend, int(task["checkpoint_every"])) if mode == "pipeline" else None
    gc.collect()
    release_unused()  # the throwaway backend's memory is not the baseline's
    before = before_trimmed = rss_bytes()
    loaded = last_start = 0
    load_s = last_segment_s = 0.0
    points: list[dict[str, Any]] = []
    stopped: str | None = None
    for target in milestones:
        if points:  # at the rate of the last segment (the load slows down as it grows)
            per_key = last_segment_s / (loaded - last_start)
            projected = load_s + per_key * (target - loaded)
            if projected > budget:
                stopped = (
                    f"{target:,} keys not run: projected load time {projected:.0f} s "
                    f"(at {per_key * 1e6:.2f} us/key) exceeds the budget of {budget:.0f} s"
                )
                log(f"  [{kind}/{mode}] {stopped}")
                break
        last_segment_s = load_keys(backend, loaded, target, cuts)
        load_s += last_segment_s
        last_start, loaded = loaded, target
        gc.collect()
        now = rss_bytes()
        release_unused()
        trimmed = rss_bytes()
        point = {
            "keys": target,
            "rss_bytes": now,
            "rss_delta_bytes": now - before,
            "bytes_per_key": (now - before) / target,
            "rss_trimmed_bytes": trimmed,
            "bytes_per_key_trimmed": (trimmed - before_trimmed) / target,
            "peak_rss_bytes": rss_bytes("VmHWM"),
            "load_s": load_s,
            "load_us_per_key": load_s / target * 1e6,
            "storage": storage_stats(backend),
            "load_average": load_average(),
        }
        if cuts is not None:
            point["checkpoints"] = cuts.checkpoints
            point["checkpoint_s"] = cuts.checkpoint_s
            point["last_checkpoint_blobs"] = cuts.last_blobs
        points.append(point)
        log(
            f"  [{kind}/{mode}] {target:>12,} keys: RSS {now / 1e6:8.1f} MB, "
            f"{point['bytes_per_key']:6.1f} B/key ({point['bytes_per_key_trimmed']:6.1f} "
            f"trimmed), loaded in {load_s:6.1f} s"
        )
    backend.close()
    return {
        "backend": kind,
        "mode": mode,
        "checkpoint_every_batches": None if cuts is None else cuts.every,
        "rss_before_bytes": before,
        "rss_before_trimmed_bytes": before_trimmed,
        "milestones_requested": milestones,
        "points": points,
        "largest_keys": points[-1]["keys"] if points else 0,
        "stopped": stopped,
        "budget_s": budget,
    }


def _run_batches(
    backend: KeyedStateBackend, batches: Sequence[np.ndarray], warmup: int
) -> dict[str, Any]:
    arrays = [pa.array(b) for b in batches]
    for keys in arrays[:warmup]:
        count_batch(backend, keys, Phases())
    gc.collect()
    phases = Phases()
    per_batch: list[float] = []
    rows = 0
    for keys in arrays[warmup:]:
        before = phases.total
        count_batch(backend, keys, phases)
        per_batch.append(len(keys) / (phases.total - before))
        rows += len(keys)
    return {
        "rows": rows,
        "batches": len(arrays) - warmup,
        "seconds": phases.total,
        "rows_per_s": rows / phases.total,
        "batch_rows_per_s": {
            "median": statistics.median(per_batch),
            "min": min(per_batch),
            "max": max(per_batch),
        },
        "phase_s": {"count": phases.count, "get_values": phases.get, "put_values": phases.put},
        "entries_after": backend.storage_stats().entries,
    }


def child_throughput(
    task: dict[str, Any], local_dir: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """Measurement 2 for one backend: each case (key space, prefilled or not) on a fresh
    backend."""
    kind = str(task["backend"])
    out: list[dict[str, Any]] = []
    for case in task["cases"]:
        key_space, prefill = int(case["key_space"]), bool(case["prefill"])
        backend = make_backend(kind, local_dir)
        prefill_s = load_keys(backend, 0, key_space) if prefill else 0.0
        batches = batch_keys(
            key_space, int(task["warmup"]) + int(task["measured"]), int(task["batch_rows"])
        )
        result = _run_batches(backend, batches, int(task["warmup"]))
        backend.close()
        result.update(
            key_space=key_space, prefill=prefill, prefill_s=prefill_s, load_average=load_average()
        )
        log(
            f"  [{kind}] {key_space:>11,} keys{' (prefilled)' if prefill else ''}: "
            f"{result['rows_per_s']:>10,.0f} rows/s"
        )
        out.append(result)
    return {"backend": kind, "cases": out}


def _checkpoint(backend: KeyedStateBackend, store: Any, cid: int, full: bool) -> dict[str, Any]:
    gc.collect()
    t0 = perf_counter()
    snap = backend.snapshots.snapshot(cid, full=full)
    t1 = perf_counter()
    handle = store.write_task_state(cid, snap)
    t2 = perf_counter()
    backend.snapshots.notify_checkpoint_complete(cid, handle)
    return {
        "checkpoint_id": cid,
        "full": full,
        "snapshot_s": t1 - t0,
        "write_s": t2 - t1,
        "total_s": t2 - t0,
        "bytes_written": handle.bytes_written_by(cid),
        "state_bytes": handle.state_bytes(),
        "blobs": len(handle.blobs),
        "handle": handle,
    }


def child_checkpoint(
    task: dict[str, Any], local_dir: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """Measurements 3 and 4 for one backend."""
    from spark_ckpt.state.state_restore import restore_backend
    from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

    kind, keys = str(task["backend"]), int(task["keys"])
    churn, rounds = float(task["churn"]), int(task["rounds"])
    backend = make_backend(kind, local_dir)
    load_s = load_keys(backend, 0, keys)
    log(f"  [{kind}] {keys:,} keys loaded in {load_s:.1f} s")
    store = InMemoryCheckpointStore()
    rng = np.random.default_rng([SEED, 99])
    sample = pa.array(np.sort(rng.choice(keys, min(keys, 10_000), replace=False)).astype(np.int64))
    sample_values = backend.get_values(COUNT, sample)
    first = _checkpoint(backend, store, 1, full=True)
    log(f"  [{kind}] full checkpoint: {first['total_s']:.2f} s, {first['bytes_written']:,} B")
    incremental: list[dict[str, Any]] = []
    churn_keys = int(keys * churn)
    for r in range(rounds):
        changed = rng.choice(keys, churn_keys, replace=False).astype(np.int64)
        for lo in range(0, len(changed), LOAD_CHUNK):
            count_batch(backend, pa.array(changed[lo : lo + LOAD_CHUNK]), Phases())
        incremental.append(_checkpoint(backend, store, 2 + r, full=False))
    changed = rng.choice(keys, churn_keys, replace=False).astype(np.int64)
    for lo in range(0, len(changed), LOAD_CHUNK):
        count_batch(backend, pa.array(changed[lo : lo + LOAD_CHUNK]), Phases())
    last_full = _checkpoint(backend, store, 2 + rounds, full=True)
    log(
        f"  [{kind}] incremental: {statistics.median(i['total_s'] for i in incremental):.3f} s, "
        f"full after churn: {last_full['total_s']:.2f} s"
    )
    backend.close()
    del backend
    gc.collect()

    handle = first["handle"]
    restored = make_backend(kind, local_dir)
    gc.collect()
    t0 = perf_counter()
    restore_backend(restored, handle.blobs, store.read_blob)
    restore_s = perf_counter() - t0
    check = restored.get_values(COUNT, sample)
    entries = restored.storage_stats().entries
    restored.close()
    blob_bytes = int(handle.state_bytes())
    log(
        f"  [{kind}] restore of {blob_bytes:,} B: {restore_s:.1f} s, "
        f"{restore_s / (blob_bytes / GB):.1f} s/GB"
    )

    def clean(c: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in c.items() if k != "handle"}

    incs = [clean(i) for i in incremental]
    inc_total = statistics.median(i["total_s"] for i in incs)
    inc_bytes = statistics.median(i["bytes_written"] for i in incs)
    return {
        "backend": kind,
        "checkpoint": {
            "keys": keys,
            "churn": churn,
            "churn_keys": churn_keys,
            "load_s": load_s,
            "first_full": clean(first),
            "incremental": incs,
            "incremental_median": {"total_s": inc_total, "bytes_written": inc_bytes},
            "full_after_churn": clean(last_full),
            "incremental_to_full": {
                "time": inc_total / last_full["total_s"],
                "bytes": inc_bytes / last_full["bytes_written"],
            },
        },
        "restore": {
            "keys": keys,
            "blob_bytes": blob_bytes,
            "blobs": len(handle.blobs),
            "seconds": restore_s,
            "s_per_gb": restore_s / (blob_bytes / GB),
            "entries": entries,
            "sample_checked": len(sample),
            "sample_ok": bool(check.equals(sample_values)) and entries == keys,
            "peak_rss_bytes": rss_bytes("VmHWM"),
        },
        "load_average": load_average(),
    }


def child_spark(task: dict[str, Any], local_dir: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The anchor of measurement 2: Spark's ``groupBy(key).count()`` over each case's rows
    (one query per case, one SparkSession)."""
    import pyarrow.parquet as pq

    from spark_ckpt.spark.session.builders import local_session

    conf = {
        "spark.sql.streaming.stateStore.providerClass": SPARK_PROVIDER,
        "spark.sql.shuffle.partitions": "2",
    }
    spark = local_session("state-backends-bench", "local[2]", 2, "ERROR", conf=conf)
    warmup, measured, rows = int(task["warmup"]), int(task["measured"]), int(task["batch_rows"])
    out: list[dict[str, Any]] = []
    try:
        for case in task["cases"]:
            key_space, prefill = int(case["key_space"]), bool(case["prefill"])
            root = tempfile.mkdtemp(prefix=f"spark-{key_space}-", dir=local_dir)
            src = os.path.join(root, "in")
            os.makedirs(src)
            files = 0
            if prefill:  # one micro-batch of every key once
                keys = np.arange(key_space, dtype=np.int64)
                pq.write_table(
                    pa.table({"key": keys}), os.path.join(src, f"part-{files:05d}.parquet")
                )
                files += 1
            for b in batch_keys(key_space, warmup + measured, rows):
                pq.write_table(pa.table({"key": b}), os.path.join(src, f"part-{files:05d}.parquet"))
                files += 1
            df = spark.readStream.schema("key long").option("maxFilesPerTrigger", 1).parquet(src)
            started = perf_counter()
            query = (
                df.groupBy("key")
                .count()
                .writeStream.outputMode("update")
                .format("noop")
                .option("checkpointLocation", os.path.join(root, "checkpoint"))
                .trigger(processingTime="1 second")
                .start()
            )
            timeout = float(task["query_timeout_s"])
            progress: list[dict[str, Any]] = []
            try:
                while True:
                    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
                    if len(progress) >= files:
                        break
                    if query.exception() is not None:
                        raise RuntimeError(f"Spark's query failed: {query.exception()}")
                    if perf_counter() - started > timeout:
                        raise TimeoutError(f"{len(progress)} of {files} batches in {timeout:.0f} s")
                    query.awaitTermination(1)
            finally:
                query.stop()
            wall_s = perf_counter() - started
            skip = files - measured  # the prefill and the warm-up batches
            timed = progress[skip:files]
            busy_ms = [float(p["durationMs"]["triggerExecution"]) for p in timed]
            n_rows = sum(int(p["numInputRows"]) for p in timed)
            state_ops = [p["stateOperators"][0] for p in timed if p.get("stateOperators")]
            phases_ms = {
                name: statistics.median(float(p["durationMs"].get(name, 0)) for p in timed)
                for name in sorted({n for p in timed for n in p["durationMs"]})
            }
            state_metrics = {
                name: statistics.median(
                    float(o.get("customMetrics", {}).get(name, 0)) for o in state_ops
                )
                for name in sorted({n for o in state_ops for n in o.get("customMetrics", {})})
            }
            result: dict[str, Any] = {
                "key_space": key_space,
                "prefill": prefill,
                "rows": n_rows,
                "batches": len(timed),
                "busy_s": sum(busy_ms) / 1e3,
                "rows_per_s": n_rows / (sum(busy_ms) / 1e3),
                "batch_ms": {
                    "median": statistics.median(busy_ms),
                    "min": min(busy_ms),
                    "max": max(busy_ms),
                },
                "prefill_batch_ms": (
                    float(progress[0]["durationMs"]["triggerExecution"]) if prefill else None
                ),
                "state_rows_total_after": int(state_ops[-1].get("numRowsTotal", -1))
                if state_ops
                else None,
                "state_commit_ms_median": statistics.median(
                    float(o.get("commitTimeMs", 0)) for o in state_ops
                )
                if state_ops
                else None,
                "duration_ms_median": phases_ms,
                "state_operator_metrics_median": state_metrics,
                "query_wall_s": wall_s,
                "load_average": load_average(),
            }
            log(
                f"  [spark] {key_space:>11,} keys{' (prefilled)' if prefill else ''}: "
                f"{result['rows_per_s']:>10,.0f} rows/s (busy), batch p50 "
                f"{result['batch_ms']['median']:.0f} ms"
            )
            out.append(result)
            shutil.rmtree(root, ignore_errors=True)
    finally:
        spark.stop()
    return {
        "backend": "spark",
        "conf": {
            **conf,
            "master": "local[2]",
            "trigger": "processingTime 1 second",
            "outputMode": "update",
            "sink": "noop",
            "source": "parquet files, maxFilesPerTrigger 1",
        },
        "cases": out,
    }


CHILDREN: dict[str, Callable[[dict[str, Any], str, Callable[[str], None]], dict[str, Any]]] = {
    "memory": child_memory,
    "throughput": child_throughput,
    "checkpoint": child_checkpoint,
    "spark": child_spark,
}


def child_main(spec: str) -> int:
    """Run one measurement (``--child``): its JSON result is the last line of stdout."""
    task = json.loads(spec)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    local_dir = tempfile.mkdtemp(prefix="state-backends-bench-")
    try:
        result = CHILDREN[task["kind"]](task, local_dir, log)
    finally:
        shutil.rmtree(local_dir, ignore_errors=True)
    print(json.dumps(result))
    return 0


def run_child(task: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """*task* in a fresh process of this script; its result."""
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    started = perf_counter()
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(task)],
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {task['kind']} exited with {proc.returncode}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["child_wall_s"] = perf_counter() - started
    return result


# --- the run ------------------------------------------------------------------------------------


def run_memory(s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Measurement 1, per mode and backend (see the module docstring)."""
    out: dict[str, Any] = {}
    for mode in MEMORY_MODES:
        for kind in BACKENDS:
            log(f"memory [{kind}/{mode}] ...")
            task = {
                "kind": "memory",
                "backend": kind,
                "mode": mode,
                "milestones": list(s.memory_milestones[kind]),
                "budget_s": s.memory_budget_s,
                "checkpoint_every": s.checkpoint_every_batches,
            }
            r = run_child(task, s.child_timeout_s)
            r["bytes_per_key"] = {str(p["keys"]): p["bytes_per_key"] for p in r["points"]}
            out.setdefault(mode, {})[kind] = r
    return out


def _case_key(key_space: int, prefill: bool) -> str:
    return f"{key_space}{'/prefilled' if prefill else ''}"


def run_throughput(s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Measurement 2: per repetition every backend's cases from empty state and Spark's, in
    reversed order in every other repetition; then the prefilled case once per backend."""
    common = {
        "batch_rows": s.batch_rows,
        "warmup": s.warmup_batches,
        "measured": s.measured_batches,
    }
    cases = [{"key_space": k, "prefill": False} for k in s.key_spaces]
    order: list[str] = [*BACKENDS, *(("spark",) if s.spark else ())]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in order}
    for rep in range(s.reps):
        names = order if rep % 2 == 0 else list(reversed(order))
        for name in names:
            log(f"throughput rep {rep + 1}/{s.reps} [{name}] ...")
            if name == "spark":
                spark_cases = [*cases]
                if s.spark_prefill:
                    spark_cases.append({"key_space": max(s.key_spaces), "prefill": True})
                task = {
                    "kind": "spark",
                    "cases": spark_cases,
                    "query_timeout_s": s.child_timeout_s / 2,
                    **common,
                }
            else:
                task = {"kind": "throughput", "backend": name, "cases": cases, **common}
            r = run_child(task, s.child_timeout_s)
            runs[name].append(r)
    prefilled: dict[str, Any] = {}
    if s.prefilled_keys:
        for kind in BACKENDS:
            log(f"throughput [{kind}] over {s.prefilled_keys:,} prefilled keys ...")
            task = {
                "kind": "throughput",
                "backend": kind,
                "cases": [{"key_space": s.prefilled_keys, "prefill": True}],
                **common,
            }
            prefilled[kind] = run_child(task, s.child_timeout_s)["cases"][0]

    # per case: every repetition's rows/s, and the ratios backend / Spark per repetition
    table: dict[str, dict[str, Any]] = {}
    for name, reps in runs.items():
        for r in reps:
            for c in r["cases"]:
                entry = table.setdefault(name, {}).setdefault(
                    _case_key(c["key_space"], c["prefill"]), {"runs": []}
                )
                entry["runs"].append(c)
    for kind, c in prefilled.items():
        table[kind][_case_key(c["key_space"], True)] = {"runs": [c]}
    for per_case in table.values():
        for entry in per_case.values():
            rates = [c["rows_per_s"] for c in entry["runs"]]
            entry["rows_per_s_median"] = statistics.median(rates)
            entry["rows_per_s_min"] = min(rates)
            entry["rows_per_s_max"] = max(rates)
    ratios: dict[str, dict[str, Any]] = {}
    spark_runs = table.get("spark", {})
    for kind in BACKENDS:
        for key, entry in table[kind].items():
            if key not in spark_runs:
                continue
            mine = [c["rows_per_s"] for c in entry["runs"]]
            theirs = [c["rows_per_s"] for c in spark_runs[key]["runs"]]
            per_rep = [a / b for a, b in zip(mine, theirs, strict=False)]
            ratios.setdefault(kind, {})[key] = {
                "ratio": statistics.median(per_rep),
                "per_rep": per_rep,
            }
        for key in list(table[kind]):
            if key.endswith("/prefilled"):
                base = table[kind].get(key.removesuffix("/prefilled"))
                if base is not None:
                    table[kind][key]["to_empty_state"] = (
                        table[kind][key]["rows_per_s_median"] / base["rows_per_s_median"]
                    )
    result: dict[str, Any] = {
        "batch_rows": s.batch_rows,
        "warmup_batches": s.warmup_batches,
        "measured_batches": s.measured_batches,
        "reps": s.reps,
        "cases": table,
        "ratios_to_spark": ratios,
    }
    if s.spark and runs["spark"]:
        result["spark_conf"] = runs["spark"][0]["conf"]
    if not s.spark:
        result["spark_anchor"] = "not run (--no-spark)"
    elif not s.spark_prefill:
        big = max(s.key_spaces)
        result["spark_anchor"] = (
            f"Spark's query runs over the {big:,}-key space from an empty state only: "
            f"prefilling its RocksDB state with all {big:,} keys is one micro-batch of "
            f"{big:,} rows, minutes on this machine (--spark-prefill runs it); the "
            "backends' ratios to Spark are for the same rows from the same empty state"
        )
    return result


def run_checkpoints(s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in BACKENDS:
        log(f"checkpoint + restore [{kind}] over {s.checkpoint_keys:,} keys ...")
        task = {
            "kind": "checkpoint",
            "backend": kind,
            "keys": s.checkpoint_keys,
            "churn": s.churn,
            "rounds": s.churn_rounds,
        }
        out[kind] = run_child(task, s.child_timeout_s)
    return out


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets and whether each is met."""
    out: list[dict[str, Any]] = []
    for mode in MEMORY_MODES:
        memory = result["memory"][mode]["rocksdb"]
        rocks = memory["points"]
        name = f"rocksdb RSS flat from 10M keys to 100M ({mode})"
        target = f"RSS(100M) / RSS(10M) <= {RSS_FLAT_TARGET}"
        ten = next((p for p in rocks if p["keys"] == 10_000_000), None)
        last = rocks[-1] if rocks else None
        if ten is None or last is None or last["keys"] <= ten["keys"]:
            out.append(
                {
                    "name": name,
                    "target": target,
                    "value": None,
                    "met": None,
                    "note": "no milestone above 10M keys was measured",
                }
            )
            continue
        growth = last["rss_bytes"] / ten["rss_bytes"]
        reached = last["keys"] >= 100_000_000
        out.append(
            {
                "name": name,
                "target": target,
                "measured": f"RSS({last['keys']:,}) / RSS(10,000,000)",
                "value": growth,
                "value_trimmed": last["rss_trimmed_bytes"] / ten["rss_trimmed_bytes"],
                "met": growth <= RSS_FLAT_TARGET if reached else None,
                "met_up_to_measured": growth <= RSS_FLAT_TARGET,
                "note": None
                if reached
                else f"100M keys not run ({memory['stopped']}); measured up to {last['keys']:,}",
            }
        )
    for kind in BACKENDS:
        r = result["checkpoints"][kind]["restore"]
        out.append(
            {
                "name": f"{kind} restore time per GB of checkpoint",
                "target": f"<= {RESTORE_TARGET_S_PER_GB} s/GB",
                "value": r["s_per_gb"],
                "met": r["s_per_gb"] <= RESTORE_TARGET_S_PER_GB,
                "note": f"{r['keys']:,} keys, {r['blob_bytes']:,} B of blobs",
            }
        )
    return out


def render(result: dict[str, Any]) -> str:
    lines: list[str] = []
    lines.append("Memory (RSS after loading N keys minus before, per key):")
    for mode in MEMORY_MODES:
        for kind in BACKENDS:
            m = result["memory"][mode][kind]
            for p in m["points"]:
                lines.append(
                    f"  {mode:<8} {kind:<8} {p['keys']:>12,} keys  {p['bytes_per_key']:7.1f} "
                    f"B/key ({p['bytes_per_key_trimmed']:6.1f} trimmed)  RSS "
                    f"{p['rss_bytes'] / 1e6:8.1f} MB  load {p['load_us_per_key']:.2f} us/key"
                )
            if m["stopped"]:
                lines.append(f"  {mode:<8} {kind:<8} stopped: {m['stopped']}")
    tp = result["throughput"]
    lines.append(f"Throughput (batches of {tp['batch_rows']:,} rows), rows/s median of runs:")
    for name, per_case in tp["cases"].items():
        for key, entry in per_case.items():
            ratio = tp["ratios_to_spark"].get(name, {}).get(key)
            extra = f"  x{ratio['ratio']:.2f} Spark" if ratio else ""
            lines.append(f"  {name:<8} {key:<20} {entry['rows_per_s_median']:>12,.0f}{extra}")
    lines.append("Checkpoints and restore:")
    for kind in BACKENDS:
        c = result["checkpoints"][kind]["checkpoint"]
        r = result["checkpoints"][kind]["restore"]
        lines.append(
            f"  {kind:<8} full {c['first_full']['total_s']:.2f} s / "
            f"{c['first_full']['bytes_written']:,} B; incremental at {c['churn']:.0%} churn "
            f"{c['incremental_median']['total_s'] * 1e3:.1f} ms / "
            f"{c['incremental_median']['bytes_written']:,.0f} B; restore {r['seconds']:.1f} s = "
            f"{r['s_per_gb']:.1f} s/GB (sample ok: {r['sample_ok']})"
        )
    lines.append("Targets:")
    for t in result["targets"]:
        lines.append(f"  {t['name']}: {t['value']} ({t['target']}) met={t['met']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (~1 min)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument("--no-spark", action="store_true", help="without Spark's anchor")
    parser.add_argument(
        "--spark-prefill",
        action="store_true",
        help="also Spark's query over the big key space after prefilling all its keys",
    )
    parser.add_argument("--reps", type=int, help="repetitions of the throughput cases")
    parser.add_argument("--memory-budget", type=float, help="seconds per memory load")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args.child)
    s = QUICK if args.quick else FULL
    if args.no_spark:
        s = replace(s, spark=False)
    if args.spark_prefill:
        s = replace(s, spark_prefill=True)
    if args.reps:
        s = replace(s, reps=args.reps)
    if args.memory_budget:
        s = replace(s, memory_budget_s=args.memory_budget)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    started = perf_counter()
    machine = spark_machine_info() if s.spark else machine_info()
    with open("/proc/meminfo") as f:
        mem_total = next((int(x.split()[1]) * 1024 for x in f if x.startswith("MemTotal")), None)
    result: dict[str, Any] = {
        "bench": "state_backends",
        "quick": args.quick,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {**machine, "rocksdict": version("rocksdict"), "mem_total_bytes": mem_total},
        "git": git_info(),
        "load_average_start": load_average(),
        "settings": asdict(s),
    }
    result["memory"] = run_memory(s, log)
    result["throughput"] = run_throughput(s, log)
    result["checkpoints"] = run_checkpoints(s, log)
    result["targets"] = targets(result)
    result["load_average_end"] = load_average()
    result["elapsed_s"] = perf_counter() - started
    print(render(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} in {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

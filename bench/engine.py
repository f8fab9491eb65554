"""Engine benchmark: checkpointing overhead of the pure-Python engine, measured side by side.

Three measurements, all in one run, each reported as a ratio against a baseline measured in
the same run (repetitions are interleaved — every repetition runs every case once, in a
shuffled order — so that the noise of a shared machine hits all cases alike; the reported
figure is the median over the repetitions):

1. **Throughput** (rows/s) of 4-channel input, in batches that mix the channels, with a
   checkpoint every *K* rows, in ``ALIGNED`` and ``UNALIGNED`` mode, versus the same pipeline
   fed the same data rows without barriers. Variants:

   * ``aligner``  — :class:`~spark_ckpt.runtime.aligner.BarrierAligner` alone (no operator): the
   pure
     cost of alignment, a diagnostic (its baseline does almost nothing);
   * ``pipeline`` — aligner + :class:`~spark_ckpt.runtime.operator.RunningCount` on a
     :class:`~spark_ckpt.state.backend.KeyedStateBackend`; ``Snapshot``/``Complete`` steps are
     ignored
     (alignment overhead only, no state snapshot);
   * ``task``     — :class:`~spark_ckpt.runtime.task.OperatorTask` end to end: synchronous snapshot,
     state + channel state written into an
     :class:`~spark_ckpt.storage.memory_store.InMemoryCheckpointStore`
     (Arrow IPC + SHA-256), acknowledgement, and ``notify_complete`` right after the ack (so
     snapshots are incremental against the previous checkpoint).

2. **Full vs incremental snapshot** of 1M keys at 1% key churn: bytes written and time
   (``snapshot`` + ``write_task_state``) of an incremental snapshot versus a full one.

3. **Delta store latency**: p50/p95 of ``DeltaCheckpointStore.write_task_state`` (a small
   incremental snapshot) and of ``DeltaCheckpointStore.commit`` over consecutive
   checkpoints in a temporary directory.

Run ``python bench/engine.py`` (full, a few minutes) or ``python bench/engine.py --quick``
(smoke run, < 60 s). Writes JSON to ``bench/results/engine.json`` unless ``--out`` says
otherwise. See ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from benchcommon import machine_info

from spark_ckpt.protocol.barrier import CheckpointBarrier, SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import (
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    TaskId,
    TaskStateHandle,
)
from spark_ckpt.runtime.aligner import AlignmentMode, BarrierAligner, Records
from spark_ckpt.runtime.operator import RunningCount
from spark_ckpt.runtime.task import OperatorTask
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import ValueStateDescriptor
from spark_ckpt.state.keygroup import KeyGroupRange
from spark_ckpt.storage.checkpoint_store import StateStorage
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore
from spark_ckpt.testing.simulation import barrier_table, stream_rows

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "engine.json"
CHANNELS = 4
#: Each channel's share of a batch is cut into this many runs, interleaved round-robin.
RUNS_PER_CHANNEL = 4
MAX_PARALLELISM = 128
COUNT = ValueStateDescriptor("count", pa.int64())


@dataclass(frozen=True)
class Settings:
    """Sizes of one benchmark run."""

    rows: int  # total data rows of the throughput input (all channels)
    batch_rows: int  # rows per input batch (all channels)
    keys: int  # distinct keys of the throughput input
    intervals: tuple[int, ...]  # checkpoint every K rows (all channels)
    lag_runs: int  # the last channel's barriers arrive this many runs late (4 runs = 1 batch)
    reps: int  # repetitions of the throughput cases
    state_keys: int  # keys of the snapshot measurement
    churn: float  # fraction of keys updated between snapshots
    snapshot_reps: int
    delta_checkpoints: int
    delta_state_keys: int


FULL = Settings(
    rows=5_000_000,
    batch_rows=100_000,
    keys=1_000_000,
    intervals=(100_000, 1_000_000),
    lag_runs=2,
    reps=5,
    state_keys=1_000_000,
    churn=0.01,
    snapshot_reps=5,
    delta_checkpoints=30,
    delta_state_keys=100_000,
)
QUICK = Settings(
    rows=800_000,
    batch_rows=100_000,
    keys=100_000,
    intervals=(100_000, 400_000),
    lag_runs=2,
    reps=2,
    state_keys=200_000,
    churn=0.01,
    snapshot_reps=2,
    delta_checkpoints=6,
    delta_state_keys=20_000,
)


# --- input -------------------------------------------------------------------------------


def make_logs(rows_per_channel: int, keys: int, seed: int = 7) -> list[pa.Table]:
    """One replayable log per channel: ``user_id`` uniform in ``[0, keys)``, ``amount``."""
    rng = np.random.default_rng(seed)
    return [
        pa.table(
            {
                "user_id": rng.integers(0, keys, rows_per_channel, dtype=np.int64),
                "amount": rng.integers(1, 100, rows_per_channel, dtype=np.int64),
            }
        )
        for _ in range(CHANNELS)
    ]


def build_stream(
    logs: Sequence[pa.Table], batch_rows: int, interval_rows: int | None, lag_runs: int
) -> tuple[list[pa.Table], int]:
    """The input batches (single-chunk tables mixing all channels) and the number of
    checkpoints whose barriers they carry.

    Each channel's share of a batch is cut into :data:`RUNS_PER_CHANNEL` runs, interleaved
    round-robin across channels. Checkpoint *n* is injected every ``interval_rows`` rows: on
    every channel before the middle run of the same batch (the same per-channel offset),
    except the last channel, whose barrier comes ``lag_runs`` runs later (possibly in the
    next batch), so that the other channels wait for it. ``interval_rows=None``: the same
    data rows without barriers."""
    per_channel = batch_rows // CHANNELS
    run = per_channel // RUNS_PER_CHANNEL
    n_batches = logs[0].num_rows // per_channel
    every = None if interval_rows is None else max(1, interval_rows // batch_rows)
    barriers: dict[tuple[int, int], CheckpointBarrier] = {}  # (global run, channel) -> barrier
    checkpoints = 0
    if every is not None:
        last_run = n_batches * RUNS_PER_CHANNEL
        for b in range(every - 1, n_batches, every):
            at = b * RUNS_PER_CHANNEL + RUNS_PER_CHANNEL // 2
            if at + lag_runs >= last_run:
                break
            checkpoints += 1
            barrier = CheckpointBarrier(checkpoints, timestamp_ms=0)
            for c in range(CHANNELS):
                barriers[(at + (lag_runs if c == CHANNELS - 1 else 0), c)] = barrier
    batches = []
    for b in range(n_batches):
        pieces = []
        for r in range(RUNS_PER_CHANNEL):
            for c in range(CHANNELS):
                start = b * per_channel + r * run
                barrier_here = barriers.get((b * RUNS_PER_CHANNEL + r, c))
                if barrier_here is not None:
                    pieces.append(barrier_table(barrier_here, c, start))
                pieces.append(stream_rows(logs[c], c, start, start + run))
        batches.append(pa.concat_tables(pieces).combine_chunks())
    return batches, checkpoints


# --- throughput pipelines -----------------------------------------------------------------


def run_aligner(batches: Sequence[pa.Table], mode: AlignmentMode) -> int:
    """Feed *batches* through an aligner alone; returns the data rows emitted."""
    aligner = BarrierAligner(range(CHANNELS), mode, ManualClock(0))
    rows = 0
    for batch in batches:
        for step in aligner.process(batch):
            if isinstance(step, Records):
                rows += step.table.num_rows
    return rows


def run_pipeline(batches: Sequence[pa.Table], mode: AlignmentMode) -> int:
    """Aligner + RunningCount on a keyed state backend; snapshot steps are ignored."""
    aligner = BarrierAligner(range(CHANNELS), mode, ManualClock(0))
    op = RunningCount("counter", "user_id")
    state = StateContext(KeyedStateBackend.for_subtask(op.uid, 0, 1, op.key_type, MAX_PARALLELISM))
    op.open(state)
    rows = 0
    for batch in batches:
        for step in aligner.process(batch):
            if isinstance(step, Records):
                op.process_batch(step.table, state)
                rows += step.table.num_rows
    return rows


def run_task(batches: Sequence[pa.Table], mode: AlignmentMode) -> int:
    """OperatorTask end to end with an in-memory store; every acknowledged checkpoint is
    notified complete at once (as a coordinator would after committing it)."""
    inbox: list[AcknowledgeCheckpoint | DeclineCheckpoint] = []
    task = OperatorTask(
        TaskId("counter", 0),
        channels=range(CHANNELS),
        operators=[RunningCount("counter", "user_id")],
        parallelism=1,
        store=InMemoryCheckpointStore(),
        respond=inbox.append,
        clock=ManualClock(0),
        mode=mode,
        max_parallelism=MAX_PARALLELISM,
    )
    for batch in batches:
        task.process(batch)
        while inbox:
            msg = inbox.pop(0)
            if isinstance(msg, AcknowledgeCheckpoint):
                task.notify_complete(msg.checkpoint_id)
    return task.rows_processed


VARIANTS: dict[str, Callable[[Sequence[pa.Table], AlignmentMode], int]] = {
    "aligner": run_aligner,
    "pipeline": run_pipeline,
    "task": run_task,
}


def timed(fn: Callable[[], Any]) -> float:
    """Wall time of one call (garbage of earlier runs collected first)."""
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_throughput(s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Measurement 1 (see module docstring)."""
    logs = make_logs(s.rows // CHANNELS, s.keys)
    clean, _ = build_stream(logs, s.batch_rows, None, 0)
    data_rows = sum(b.num_rows for b in clean)
    streams: dict[int, list[pa.Table]] = {}
    checkpoints: dict[int, int] = {}
    for k in s.intervals:
        streams[k], checkpoints[k] = build_stream(logs, s.batch_rows, k, s.lag_runs)
    cases: list[tuple[str, str, AlignmentMode, int | None]] = []  # (id, variant, mode, K)
    for variant in VARIANTS:
        cases.append((f"{variant}/baseline", variant, AlignmentMode.ALIGNED, None))
        for mode in (AlignmentMode.ALIGNED, AlignmentMode.UNALIGNED):
            for k in s.intervals:
                cases.append((f"{variant}/{mode.value}/K={k}", variant, mode, k))
    times: dict[str, list[float]] = {c[0]: [] for c in cases}
    rng = random.Random(1)
    for rep in range(s.reps):
        order = list(cases)
        rng.shuffle(order)
        for case_id, variant, mode, interval in order:
            stream = clean if interval is None else streams[interval]
            times[case_id].append(timed(partial(VARIANTS[variant], stream, mode)))
        log(f"  throughput rep {rep + 1}/{s.reps} done")
    results = []
    light = times["pipeline/baseline"]
    for case_id, variant, mode, interval in cases:
        base = times[f"{variant}/baseline"]
        mine = times[case_id]
        if variant == "aligner":
            # the aligner's extra time, charged to the lightest real pipeline
            ratios = [p / (p + t - b) for p, b, t in zip(light, base, mine, strict=True)]
        else:
            ratios = [b / t for b, t in zip(base, mine, strict=True)]
        results.append(
            {
                "case": case_id,
                "variant": variant,
                "mode": None if interval is None else mode.value,
                "interval_rows": interval,
                "checkpoints": 0 if interval is None else checkpoints[interval],
                "median_s": statistics.median(mine),
                "rows_per_s": data_rows / statistics.median(mine),
                "ratio": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
            }
        )
    return {
        "rows": data_rows,
        "batches": len(clean),
        "batch_rows": s.batch_rows,
        "channels": CHANNELS,
        "keys": s.keys,
        "lag_runs": s.lag_runs,
        "runs_per_channel": RUNS_PER_CHANNEL,
        "reps": s.reps,
        "cases": results,
    }


# --- snapshots ----------------------------------------------------------------------------


def _fill(backend: KeyedStateBackend, keys: int, chunk: int = 200_000) -> None:
    for start in range(0, keys, chunk):
        ks = pa.array(np.arange(start, min(keys, start + chunk), dtype=np.int64))
        backend.put_values(COUNT, ks, pa.array(np.ones(len(ks), dtype=np.int64)))


def _churn(
    backend: KeyedStateBackend, keys: int, fraction: float, rng: np.random.Generator
) -> None:
    ks = rng.choice(keys, int(keys * fraction), replace=False).astype(np.int64)
    backend.put_values(COUNT, pa.array(ks), pa.array(rng.integers(2, 1000, len(ks))))


def _snapshot_and_write(
    backend: KeyedStateBackend, store: StateStorage, cid: int, full: bool
) -> tuple[TaskStateHandle, float, float]:
    """(handle, snapshot seconds, write seconds); the checkpoint is then notified complete."""
    t0 = time.perf_counter()
    snap = backend.snapshots.snapshot(cid, full=full)
    t1 = time.perf_counter()
    handle = store.write_task_state(cid, snap)
    t2 = time.perf_counter()
    backend.snapshots.notify_checkpoint_complete(cid, handle)
    return handle, t1 - t0, t2 - t1


def bench_snapshots(s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Measurement 2: per repetition, 1% churn then an incremental snapshot, 1% churn then
    a full one (both after the same amount of churn, alternating)."""
    backend = KeyedStateBackend("counter", 0, pa.int64(), KeyGroupRange(0, MAX_PARALLELISM - 1))
    backend.value_state(COUNT)
    _fill(backend, s.state_keys)
    store = InMemoryCheckpointStore()
    rng = np.random.default_rng(3)
    cid = 1
    _snapshot_and_write(backend, store, cid, full=True)  # the base
    samples: dict[str, list[tuple[int, float, float]]] = {"full": [], "incremental": []}
    for _ in range(s.snapshot_reps):
        for kind in ("incremental", "full"):
            _churn(backend, s.state_keys, s.churn, rng)
            cid += 1
            gc.collect()
            handle, snap_s, write_s = _snapshot_and_write(backend, store, cid, full=kind == "full")
            samples[kind].append((handle.bytes_written_by(cid), snap_s, write_s))
    log("  snapshots done")

    def summary(kind: str) -> dict[str, float]:
        rows = samples[kind]
        return {
            "bytes": statistics.median(r[0] for r in rows),
            "snapshot_s": statistics.median(r[1] for r in rows),
            "write_s": statistics.median(r[2] for r in rows),
            "total_s": statistics.median(r[1] + r[2] for r in rows),
        }

    full, inc = summary("full"), summary("incremental")
    return {
        "keys": s.state_keys,
        "churn": s.churn,
        "reps": s.snapshot_reps,
        "full": full,
        "incremental": inc,
        "bytes_ratio": inc["bytes"] / full["bytes"],
        "time_ratio": inc["total_s"] / full["total_s"],
        "snapshot_time_ratio": inc["snapshot_s"] / full["snapshot_s"],
    }


# --- delta store ----------------------------------------------------------------------------


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def bench_delta(s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Measurement 3: consecutive checkpoints of one task into a DeltaCheckpointStore: the
    task writes an incremental snapshot (1% churn of ``delta_state_keys`` keys; the first
    checkpoint writes the full state and is not sampled), the coordinator commits it."""
    from spark_ckpt.delta.delta_store import DeltaCheckpointStore

    writes: list[float] = []
    commits: list[float] = []
    sizes: list[int] = []
    task = TaskId("counter", 0)
    with tempfile.TemporaryDirectory(prefix="spark-ckpt-bench-") as root:
        store = DeltaCheckpointStore(root)
        lease = store.acquire()
        backend = KeyedStateBackend("counter", 0, pa.int64(), KeyGroupRange(0, 127))
        backend.value_state(COUNT)
        _fill(backend, s.delta_state_keys)
        rng = np.random.default_rng(5)
        for i in range(s.delta_checkpoints + 1):
            if i:
                _churn(backend, s.delta_state_keys, s.churn, rng)
            cid = lease.first_id + i
            snap = backend.snapshots.snapshot(cid)
            t0 = time.perf_counter()
            handle = store.write_task_state(cid, snap)
            t1 = time.perf_counter()
            assert handle.task == task
            stats = CheckpointStats(
                trigger_ms=0,
                completed_ms=0,
                state_bytes=handle.state_bytes(),
                bytes_written=handle.bytes_written_by(cid),
            )
            checkpoint = CompletedCheckpoint(cid, SnapshotType.CHECKPOINT, (handle,), stats)
            t2 = time.perf_counter()
            store.commit(lease, checkpoint)
            t3 = time.perf_counter()
            backend.snapshots.notify_checkpoint_complete(cid, handle)
            if i:
                writes.append(t1 - t0)
                commits.append(t3 - t2)
                sizes.append(handle.bytes_written_by(cid))
    log("  delta store done")
    return {
        "checkpoints": s.delta_checkpoints,
        "state_keys": s.delta_state_keys,
        "churn": s.churn,
        "median_bytes_written": statistics.median(sizes),
        "write_task_state_ms": {"p50": _pct(writes, 50) * 1e3, "p95": _pct(writes, 95) * 1e3},
        "commit_ms": {"p50": _pct(commits, 50) * 1e3, "p95": _pct(commits, 95) * 1e3},
    }


# --- report ---------------------------------------------------------------------------------


def render(result: dict[str, Any]) -> str:
    """The human-readable table."""
    lines = []
    tp = result["throughput"]
    lines.append(
        f"Throughput: {tp['rows']:,} rows, {tp['channels']} channels, batches of "
        f"{tp['batch_rows']:,}, {tp['keys']:,} keys, last channel's barriers "
        f"{tp['lag_runs']}/{tp['runs_per_channel']} batch late, "
        f"median of {tp['reps']} interleaved reps"
    )
    lines.append(f"  {'case':<34} {'ckpts':>5} {'rows/s':>12} {'ratio':>7} {'(min-max)':>13}")
    for c in tp["cases"]:
        lines.append(
            f"  {c['case']:<34} {c['checkpoints']:>5} {c['rows_per_s']:>12,.0f} "
            f"{c['ratio']:>7.3f} ({c['ratio_min']:.2f}-{c['ratio_max']:.2f})"
        )
    sn = result["snapshots"]
    lines.append(f"Snapshots: {sn['keys']:,} keys, {sn['churn']:.0%} churn, median of {sn['reps']}")
    for kind in ("full", "incremental"):
        d = sn[kind]
        lines.append(
            f"  {kind:<12} {d['bytes']:>12,.0f} B  snapshot {d['snapshot_s'] * 1e3:8.1f} ms  "
            f"write {d['write_s'] * 1e3:8.1f} ms"
        )
    lines.append(
        f"  incremental/full: bytes {sn['bytes_ratio']:.4f}, time {sn['time_ratio']:.4f} "
        f"(snapshot phase only {sn['snapshot_time_ratio']:.4f})"
    )
    de = result["delta"]
    lines.append(
        f"Delta store: {de['checkpoints']} checkpoints, {de['state_keys']:,} keys at "
        f"{de['churn']:.0%} churn (median {de['median_bytes_written']:,.0f} B written)"
    )
    for what in ("write_task_state_ms", "commit_ms"):
        lines.append(f"  {what:<22} p50 {de[what]['p50']:8.1f}  p95 {de[what]['p95']:8.1f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (< 60 s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument("--reps", type=int, help="override the throughput repetitions")
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    if args.reps:
        s = Settings(**{**s.__dict__, "reps": args.reps})

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    started = time.perf_counter()
    result: dict[str, Any] = {
        "quick": args.quick,
        "machine": machine_info(),
        "settings": s.__dict__,
    }
    log("throughput ...")
    result["throughput"] = bench_throughput(s, log)
    log("snapshots ...")
    result["snapshots"] = bench_snapshots(s, log)
    log("delta store ...")
    result["delta"] = bench_delta(s, log)
    result["elapsed_s"] = time.perf_counter() - started
    print(render(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=list) + "\n")
    print(f"wrote {args.out} in {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

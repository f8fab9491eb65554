"""One measured run of one variant (:func:`measure_variant`): start its query on a fresh
root, poll its progress until the measured window closed, stop it, and record the window's
rows/s next to what else happened meanwhile (CPU of the benchmark and of other work, JVM and
Python GC, checkpoints, RSS). Shared by the overhead and scaling benches."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runbench.procstat import CpuSample, PyGcTimer, RssSampler, cpu_between, jvm_collect
from runbench.procstat import jvm_gc_ms as read_jvm_gc_ms
from runbench.steady import ProgressLog, Window
from runbench.variants import Started, VariantStart, Workload

#: How often the driver loop polls the query's progress and the pipeline's checkpoints.
POLL_S = 1.0


@dataclass(frozen=True)
class Sample:
    """What the driver loop read at one poll (for the diagnostics of the window)."""

    wall_s: float  # time.time()
    cpu: CpuSample
    jvm_gc_ms: float | None
    py_gc_collections: int
    py_gc_s: float


def _sample(spark: Any, py_gc: PyGcTimer) -> Sample:
    return Sample(
        time.time(), CpuSample.take(), read_jvm_gc_ms(spark), py_gc.collections, py_gc.seconds
    )


def window_diagnostics(samples: Sequence[Sample], window: Window) -> dict[str, Any] | None:
    """CPU and GC between the first poll inside the window and the last one inside it."""
    end = window.start_s + window.seconds
    inside = [s for s in samples if window.start_s <= s.wall_s <= end]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    return {
        **cpu_between(a.cpu, b.cpu),
        "jvm_gc_ms": None
        if a.jvm_gc_ms is None or b.jvm_gc_ms is None
        else b.jvm_gc_ms - a.jvm_gc_ms,
        "py_gc_collections": b.py_gc_collections - a.py_gc_collections,
        "py_gc_ms": (b.py_gc_s - a.py_gc_s) * 1000,
    }


def measure_variant(
    spark: Any,
    name: str,
    start: VariantStart,
    workload: Workload,
    *,
    window: Callable[[list[dict[str, Any]]], Window | None],
    timeout_s: float,
    py_gc: PyGcTimer,
    rss: RssSampler | None = None,
    extra: Callable[[Started, Window, list[dict[str, Any]]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run variant *name* until ``window(progress)`` returns its measured window, then stop
    it. Before the start: Python and JVM garbage collected (so no run inherits another's
    garbage). *extra*: called once the query stopped, with the started variant, the window
    and every batch's progress; what it returns is added to the result. The root is deleted
    afterwards."""
    root = tempfile.mkdtemp(prefix=f"spark-ckpt-bench-{name.replace('/', '-')}-")
    try:
        gc.collect()
        jvm_collect(spark)
        load = os.getloadavg()
        rss_start = rss.window() if rss else None
        begun = time.perf_counter()
        started = start(spark, root, workload)
        log = ProgressLog()
        samples: list[Sample] = []
        found: Window | None = None
        try:
            deadline = time.monotonic() + timeout_s
            while found is None:
                time.sleep(POLL_S)
                samples.append(_sample(spark, py_gc))
                log.poll(started.query)
                started.poll_checkpoints()
                found = window(log.ordered())
                if found is None and not started.query.isActive:
                    raise RuntimeError(f"{name}: query ended early: {started.query.exception()}")
                if found is None and time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: no measured window within {timeout_s} s")
            wall = time.perf_counter() - begun
        finally:
            started.stop()
        rss_peak = rss.peak() if rss else None
        started.poll_checkpoints()
        start_ms = found.start_s * 1000
        cps = started.checkpoints_between(start_ms, start_ms + found.seconds * 1000)
        more = extra(started, found, log.ordered()) if extra is not None else {}
        e2e = sorted(c.stats.end_to_end_ms for c in cps)
        written = sorted(c.stats.bytes_written for c in cps)
        return {
            "variant": name,
            "rows_per_s": found.rows_per_s,
            "window": found.as_dict(),
            "checkpoints": len(cps),
            "checkpoint_end_to_end_ms_p50": e2e[len(e2e) // 2] if e2e else None,
            "checkpoint_bytes_written_p50": written[len(written) // 2] if cps else None,
            "task_cache": task_cache_summary(cps),
            "diagnostics": window_diagnostics(samples, found),
            "loadavg_start": load,
            "rss_mb_start": rss_start,
            "rss_mb_peak": rss_peak,
            "query_wall_s": wall,
            **more,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def task_cache_summary(cps: list[Any]) -> dict[str, Any] | None:
    """Where the subtasks found their state over *cps* (subtasks on the executors): the
    micro-batches that found it in their Python worker (hits, caught-up included) and
    those that rebuilt it, with the hit rate; None for subtasks in the driver."""
    hits = rebuilds = hit_ms = rebuild_ms = 0
    for c in cps:
        for m in c.stats.task_cache.values():
            hits, rebuilds = hits + m.hits, rebuilds + m.rebuilds
            hit_ms, rebuild_ms = hit_ms + m.hit_ms, rebuild_ms + m.rebuild_ms
    if hits + rebuilds == 0:
        return None
    return {
        "hits": hits,
        "rebuilds": rebuilds,
        "hit_rate": round(hits / (hits + rebuilds), 4),
        "hit_ms": hit_ms,
        "rebuild_ms": rebuild_ms,
    }


def abba(names: Sequence[str], rep: int) -> list[str]:
    """The order of repetition *rep*: the table's order on even repetitions, reversed on odd
    ones (ABBA...), so that a drift over the run (the JVM's JIT, the machine's load) hits
    every variant alike."""
    return list(names) if rep % 2 == 0 else list(reversed(names))

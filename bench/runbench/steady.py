"""Steady-state throughput from Spark's query progress, and the spread of repeated figures.

Every variant a bench compares — spark-ckpt with its subtasks in the driver or on the
executors, and Spark's own JVM aggregation — runs as a Spark streaming query, so its
throughput is read the same way: from ``StreamingQueryProgress`` (``batchId``,
``timestamp`` = when the trigger started, the rows read), not from a probe inside
``foreachBatch`` (on the executor path no data row passes through the driver). The rows a
batch read are the difference of ``ckpt-source``'s channel positions between the batch's
start and end offsets (:func:`batch_rows`): Spark's ``numInputRows`` counts the rows the
source emitted, and on the executor path those are routed payloads, a few per channel. With
batches back to back (a backlog and a read limit), the batches that start in a window
``[t0, t1)`` processed their rows in ``t1 - t0`` seconds, where ``t1`` is the start of the
first batch after them: that excludes the query's start-up (the first batches, Python workers
and planning) and its stop.

(On the pipelined driver path a batch's ``foreachBatch`` call returns once the *previous*
batch was processed, so a window of *n* batches measures *n* batches of processing shifted
by one: its error is at most one batch's processing time over the window, the same for
every configuration.)

The statistics (:func:`spread`, :func:`paired_ratios`) are what the overhead and scaling
reports print: median, mean, min, max, stdev of each variant, and the per-repetition ratio's
median with a bootstrap confidence interval.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any


def progress_start_s(progress: dict[str, Any]) -> float:
    """When the batch's trigger started (epoch seconds), from the progress' ``timestamp``."""
    return datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00")).timestamp()


def _positions(offset: Any) -> list[int] | None:
    if offset is None:
        return None
    d = json.loads(offset) if isinstance(offset, str) else offset
    positions = d.get("positions") if isinstance(d, dict) else None
    return None if positions is None else [int(x) for x in positions]


def batch_rows(progress: dict[str, Any]) -> int:
    """The data rows the batch read: from ``ckpt-source``'s channel positions (end offset
    minus start offset, a first batch's start being the channels' zeros), summed over every
    ``ckpt-source`` the query reads (Spark's stream-stream join reads two), else Spark's
    ``numInputRows``."""
    rows: int | None = None
    for source in progress.get("sources") or ():
        end = _positions(source.get("endOffset"))
        if end is not None:
            start = _positions(source.get("startOffset")) or [0] * len(end)
            rows = (rows or 0) + sum(e - s for e, s in zip(end, start, strict=True))
    return int(progress.get("numInputRows", 0)) if rows is None else rows


class ProgressLog:
    """The progress of every batch of one query, collected by polling (Spark keeps only the
    last ``spark.sql.streaming.numRecentProgressUpdates`` = 100 by default)."""

    def __init__(self) -> None:
        self.batches: dict[int, dict[str, Any]] = {}

    def poll(self, query: Any) -> int:
        """Collect what the query reported since the last poll; returns the batch count."""
        for p in query.recentProgress:
            d = p if isinstance(p, dict) else json.loads(p.json)
            self.batches.setdefault(int(d["batchId"]), d)
        return len(self.batches)

    def ordered(self) -> list[dict[str, Any]]:
        return [self.batches[k] for k in sorted(self.batches)]

    def input_rows(self) -> int:
        return sum(batch_rows(p) for p in self.batches.values())


@dataclass(frozen=True)
class Window:
    """Batches ``first .. last`` (batch ids) processed ``rows`` in ``seconds``: from the
    trigger of ``first`` to the trigger of the batch after ``last``."""

    first: int
    last: int
    rows: int
    seconds: float
    start_s: float  # epoch seconds
    batch_rows: tuple[int, ...]
    batch_ms: tuple[float, ...]  # triggerExecution of each batch

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "first_batch": self.first,
            "last_batch": self.last,
            "batches": len(self.batch_rows),
            "rows": self.rows,
            "seconds": self.seconds,
            "rows_per_s": self.rows_per_s,
            "batch_rows": list(self.batch_rows),
            "batch_ms": list(self.batch_ms),
        }


def _batch_ms(p: dict[str, Any]) -> float:
    return float(p.get("durationMs", {}).get("triggerExecution", 0))


def _window(batches: Sequence[dict[str, Any]], i: int, j: int) -> Window:
    """Batches ``i .. j - 1`` of *batches*, closed by the start of batch ``j`` (or, when
    there is no batch ``j``, by the end of batch ``j - 1``)."""
    inside = batches[i:j]
    start = progress_start_s(batches[i])
    if j < len(batches):
        end = progress_start_s(batches[j])
    else:
        end = progress_start_s(batches[j - 1]) + _batch_ms(batches[j - 1]) / 1000
    return Window(
        int(batches[i]["batchId"]),
        int(batches[j - 1]["batchId"]),
        sum(batch_rows(p) for p in inside),
        end - start,
        start,
        tuple(batch_rows(p) for p in inside),
        tuple(_batch_ms(p) for p in inside),
    )


def _data_from(batches: Sequence[dict[str, Any]], skip: int) -> int | None:
    """Index of the first batch after the first *skip* batches with data (None: not yet)."""
    seen = 0
    for i, p in enumerate(batches):
        if batch_rows(p) > 0:
            if seen == skip:
                return i
            seen += 1
    return None


def steady_window(
    batches: Sequence[dict[str, Any]], *, warmup_batches: int, warmup_s: float, window_s: float
) -> Window | None:
    """The measured window of a saturated query: it starts at the first batch that comes
    after *warmup_batches* batches with data **and** at least *warmup_s* after the first
    batch with data started; it holds the batches that start within *window_s* of it and is
    closed by the next batch's start. None until that closing batch reported."""
    i = _data_from(batches, warmup_batches)
    if i is None:
        return None
    t_data = progress_start_s(batches[_data_from(batches, 0) or 0])
    while i < len(batches) and progress_start_s(batches[i]) < t_data + warmup_s:
        i += 1
    if i >= len(batches):
        return None
    t0 = progress_start_s(batches[i])
    for j in range(i + 1, len(batches)):
        if progress_start_s(batches[j]) >= t0 + window_s:
            return _window(batches, i, j)
    return None


def drained_window(
    batches: Sequence[dict[str, Any]], *, warmup_batches: int, total_rows: int
) -> Window | None:
    """The measured window of a query working off a fixed backlog of *total_rows*: the
    batches after the first *warmup_batches* with data, up to the batch that read the last
    input rows, closed by that batch's end (its start + ``triggerExecution``: no batch may
    follow). None until then. ValueError when the warm-up batches read all of it (no
    window can follow)."""
    read = 0
    for j, p in enumerate(batches):
        read += batch_rows(p)
        if read >= total_rows:
            i = _data_from(batches[: j + 1], warmup_batches)
            if i is None:
                raise ValueError(
                    f"the first {warmup_batches} batches with data read all {total_rows:,} "
                    "rows: no measured window (more rows, or fewer warm-up batches)"
                )
            return _window(batches[: j + 1], i, j + 1)
    return None


# -- spread of repeated figures ----------------------------------------------------------------
def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, median, mean, min, max, sample stdev and coefficient of variation of *values*."""
    n = len(values)
    if not n:
        return {"n": 0, "median": None, "mean": None, "min": None, "max": None, "stdev": None}
    mean = statistics.fmean(values)
    stdev = statistics.stdev(values) if n > 1 else 0.0
    return {
        "n": n,
        "median": statistics.median(values),
        "mean": mean,
        "min": min(values),
        "max": max(values),
        "stdev": stdev,
        "cv": stdev / mean if mean else None,
    }


def bootstrap_median_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap confidence interval of the median of *values* (resampled with
    replacement, fixed *seed*). None for fewer than 2 values."""
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    lo = medians[int((1 - level) / 2 * resamples)]
    hi = medians[min(int((1 + level) / 2 * resamples), resamples - 1)]
    return (lo, hi)


def paired_ratios(
    numerators: Sequence[float], denominators: Sequence[float], *, seed: int = 0
) -> dict[str, Any]:
    """Per-repetition ratios ``numerators[i] / denominators[i]`` (the two variants of one
    repetition ran next to each other): their spread, the bootstrap 95% interval of their
    median, the ratio of the variants' medians, and the interval's width (what the run can
    tell apart)."""
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True)]
    ci = bootstrap_median_ci(ratios, seed=seed)
    med_a, med_b = spread(numerators)["median"], spread(denominators)["median"]
    return {
        "per_rep": ratios,
        **spread(ratios),
        "median_ci95": list(ci) if ci else None,
        "ci95_width": ci[1] - ci[0] if ci else None,
        "ratio_of_medians": med_a / med_b if med_a and med_b else None,
    }

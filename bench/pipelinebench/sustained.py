"""Section 0a, ``sustained``: the production path offered a fixed rate, no read limit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipelinebench.pipelined import pipelined_pairs
from pipelinebench.settings import Settings, source_options


def bench_sustained(spark: Any, s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """End-to-end throughput of the production path — the aligner as a pipeline run builds
    it (pipelined: Spark reads batch *b + 1* while the operators process *b*; asynchronous
    snapshots) — offered ``sustained_rate`` rows/s, with checkpoints every ``interval_ms``
    against checkpointing off.

    Batches run back to back without a read limit, so each reads everything produced while
    the previous one ran. A pipeline that keeps up processes the offered rate with bounded
    batches; one that does not falls behind and its batches grow
    (:func:`~pipelinebench.pipelined.pipelined_window` defines the measured window)."""
    result = pipelined_pairs(
        spark,
        s,
        "sustained",
        source_options(s, [0] * s.channels, s.sustained_rate / s.channels, None),
        s.sustained_warmup,
        s.sustained_measured,
        s.sustained_reps,
        log,
    )
    return {"offered_rows_per_s": s.sustained_rate, **result}

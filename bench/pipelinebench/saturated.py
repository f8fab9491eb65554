"""Section 0b, ``saturated``: the production path over a backlog, identical batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipelinebench.pipelined import pipelined_pairs
from pipelinebench.settings import Settings, source_options


def bench_saturated(spark: Any, s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """The production path saturated. Every channel starts with a backlog longer than the
    query reads, batches of ``saturated_batch_rows`` (``maxRowsPerTrigger``) run back to back,
    and barriers go at the read position (``barrierPlacement=read``, the default), so each
    checkpoint's barriers are in the batch that takes its trigger. Both configurations read
    identical batches as fast as they can: the ratio of their rows per wall-clock second is
    what checkpointing costs a job that has no spare capacity."""
    share = s.saturated_batch_rows // s.channels
    need = max(s.sustained_warmup + s.sustained_measured, s.pipelined_warmup_batches)
    backlog = share * (need + 8)
    result = pipelined_pairs(
        spark,
        s,
        "saturated",
        source_options(s, [backlog] * s.channels, 0.0, s.saturated_batch_rows),
        s.sustained_warmup,
        s.sustained_measured,
        s.sustained_reps,
        log,
    )
    return {"batch_rows": s.saturated_batch_rows, "backlog_per_channel": backlog, **result}

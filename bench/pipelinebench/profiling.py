"""``--profile``: one checkpointing query of the throughput section under cProfile."""

from __future__ import annotations

import cProfile
import pstats
from pathlib import Path
from typing import Any

from pipelinebench.query import steady_query
from pipelinebench.settings import Settings


def profile_foreach_batch(spark: Any, s: Settings, top: int = 30) -> dict[str, Any]:
    """One extra checkpointing query with cProfile enabled inside foreachBatch only."""
    profiler = cProfile.Profile()
    run = steady_query(
        spark,
        s,
        "checkpoints",
        trigger_s=s.trigger_s,
        rate=s.rate,
        max_rows=s.max_rows_per_trigger,
        profiler=profiler,
    )
    stats = pstats.Stats(profiler)
    raw: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    entries = [
        {
            "function": f"{Path(filename).parent.name}/{Path(filename).name}:{line}({func})",
            "calls": nc,
            "tottime_s": tt,
            "cumtime_s": ct,
        }
        for (filename, line, func), (_cc, nc, tt, ct, _callers) in raw.items()
    ]
    return {
        "rows": run.probe.data_rows,
        "batches": len(run.probe.batches),
        "profiled_s": sum(b.end - b.start for b in run.probe.batches),
        "top_cumulative": sorted(entries, key=lambda e: -e["cumtime_s"])[:top],
        "top_tottime": sorted(entries, key=lambda e: -e["tottime_s"])[:top],
    }

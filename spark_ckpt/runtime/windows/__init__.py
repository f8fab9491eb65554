"""Event-time windows on keyed state and timers: the assigners (tumbling, sliding, session),
vectorized mergeable aggregates, and the window operator that emits each window once the
watermark passes it (``docs/time.md``)."""

from spark_ckpt.runtime.windows.aggregates import Accumulator, Agg, Aggregate
from spark_ckpt.runtime.windows.assigners import (
    SessionWindows,
    SlidingWindows,
    TumblingWindows,
    WindowAssigner,
    Windows,
)
from spark_ckpt.runtime.windows.window_aggregate import WindowAggregate

__all__ = [
    "Accumulator",
    "Agg",
    "Aggregate",
    "SessionWindows",
    "SlidingWindows",
    "TumblingWindows",
    "WindowAggregate",
    "WindowAssigner",
    "Windows",
]

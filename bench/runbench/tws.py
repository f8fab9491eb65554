"""The ``transformWithStateInPandas`` baseline of the time bench (:mod:`runbench.timebench`):
Spark's own arbitrary-state API v2 doing what ``WindowAggregate`` with a tumbling window and
``Agg.count()`` does, per key per window, with an event-time timer at each window's end.

:class:`WindowCounter` keeps, per grouping key, a map state ``window_end -> count``. For each
micro-batch's rows of a key it adds each window's rows to its count and, for a window it had
no count for, registers an event-time timer at ``window_end - 1`` (a window ``[start, end)``
is complete once the watermark reaches ``end - 1``, as ``WindowAggregate`` emits it). When a
timer fires it emits the key's ``(user_id, window_end, count)`` and removes the window.

This module imports nothing of the bench or of spark-ckpt: Spark's Python workers unpickle
the processor, and the bench ships this module by value
(``cloudpickle.register_pickle_by_value``) since ``bench/`` is not on their path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

#: The output schema (DDL) of :class:`WindowCounter`.
OUTPUT_DDL = "user_id long, window_end long, count long"


class WindowCounter(StatefulProcessor):
    """Counts each key's rows per tumbling event-time window of *window_ms* (aligned to the
    epoch) from the timestamp column *time_column*; emits a window's count when the
    event-time timer at its end fires."""

    def __init__(self, window_ms: int, time_column: str = "ts") -> None:
        self.window_ms = window_ms
        self.time_column = time_column

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.counts = handle.getMapState("counts", "window_end long", "n long")

    def handleInputRows(
        self, key: Any, rows: Any, timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        """*rows*: an iterator of pandas DataFrames (the key's rows of the micro-batch)."""
        times = pd.concat([frame[self.time_column] for frame in rows])
        # UTC instants, naive or not: numpy's datetime64 of the values, in ms
        ms = pd.Series(pd.to_datetime(times).values.astype("datetime64[ms]").astype("int64"))
        per_end = (ms - ms % self.window_ms + self.window_ms).value_counts()
        for end, n in zip(per_end.index.to_numpy(), per_end.to_numpy(), strict=True):
            window = (int(end),)
            old = self.counts.getValue(window)
            if old is None:
                self.counts.updateValue(window, (int(n),))
                self.handle.registerTimer(int(end) - 1)
            else:
                self.counts.updateValue(window, (int(old[0]) + int(n),))
        return iter(())

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        window = (expiredTimerInfo.getExpiryTimeInMs() + 1,)
        old = self.counts.getValue(window)
        self.counts.removeKey(window)
        if old is not None:
            yield pd.DataFrame(
                {"user_id": [int(key[0])], "window_end": [window[0]], "count": [int(old[0])]}
            )

    def close(self) -> None:
        """Nothing to release."""

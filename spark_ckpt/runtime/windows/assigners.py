"""Which event-time windows a row belongs to (Flink's ``WindowAssigner``): tumbling, sliding
and session windows, vectorized over a batch's event times.

A window is ``[start, end)`` in milliseconds since the epoch. Tumbling and sliding windows
are fixed by the clock (aligned to the epoch plus an offset); a session window starts as
``[t, t + gap)`` for each row and merges with every window of its key it touches
(:meth:`WindowAssigner.merges`), as Flink's ``EventTimeSessionWindows`` do.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import numpy.typing as npt

from spark_ckpt.errors import ConfigError

#: A duration as the assigners take it: milliseconds or a ``timedelta``.
Millis = int | timedelta

Int64s = npt.NDArray[np.int64]


def _ms(what: str, value: Millis, *, zero: bool = False) -> int:
    if isinstance(value, timedelta):
        value = value // timedelta(milliseconds=1)
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise ConfigError(what, value, "a positive duration (ms or a timedelta)")
    return value


class WindowAssigner(ABC):
    """The windows of event times (see the module docstring). Frozen and picklable."""

    @abstractmethod
    def assign(self, times_ms: Int64s) -> tuple[Int64s, Int64s, Int64s]:
        """Per window a row belongs to: (the row's index, window start, window end).
        Vectorized: O(rows * windows per row)."""

    @property
    def merges(self) -> bool:
        """Whether windows of a key that touch merge into one (session windows)."""
        return False


@dataclass(frozen=True)
class TumblingWindows(WindowAssigner):
    """Back-to-back windows of *size_ms*, starting at multiples of it plus *offset_ms*
    (Flink's ``TumblingEventTimeWindows``, Spark's ``window(col, size)``)."""

    size_ms: int
    offset_ms: int = 0

    def assign(self, times_ms: Int64s) -> tuple[Int64s, Int64s, Int64s]:
        start = times_ms - np.mod(times_ms - self.offset_ms, self.size_ms)
        return np.arange(len(times_ms), dtype=np.int64), start, start + self.size_ms


@dataclass(frozen=True)
class SlidingWindows(WindowAssigner):
    """Windows of *size_ms* starting every *slide_ms* (plus *offset_ms*): each row is in
    ``size / slide`` of them (Flink's ``SlidingEventTimeWindows``, Spark's ``window(col,
    size, slide)``)."""

    size_ms: int
    slide_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms % self.slide_ms:
            raise ConfigError("slide", self.slide_ms, f"a divisor of the size {self.size_ms} ms")

    def assign(self, times_ms: Int64s) -> tuple[Int64s, Int64s, Int64s]:
        per_row = self.size_ms // self.slide_ms
        last = times_ms - np.mod(times_ms - self.offset_ms, self.slide_ms)
        rows = np.repeat(np.arange(len(times_ms), dtype=np.int64), per_row)
        back = np.tile(np.arange(per_row, dtype=np.int64) * self.slide_ms, len(times_ms))
        start = np.repeat(last, per_row) - back
        return rows, start, start + self.size_ms


@dataclass(frozen=True)
class SessionWindows(WindowAssigner):
    """Per key, a window that lasts while rows keep coming less than *gap_ms* apart (Flink's
    ``EventTimeSessionWindows.withGap``, Spark's ``session_window``): each row opens
    ``[t, t + gap)``, and windows of a key that touch merge."""

    gap_ms: int

    def assign(self, times_ms: Int64s) -> tuple[Int64s, Int64s, Int64s]:
        return np.arange(len(times_ms), dtype=np.int64), times_ms, times_ms + self.gap_ms

    @property
    def merges(self) -> bool:
        return True


class Windows:
    """The window assigners, by name."""

    @staticmethod
    def tumbling(size: Millis, offset: Millis = 0) -> TumblingWindows:
        return TumblingWindows(_ms("size", size), _ms("offset", offset, zero=True))

    @staticmethod
    def sliding(size: Millis, slide: Millis, offset: Millis = 0) -> SlidingWindows:
        return SlidingWindows(
            _ms("size", size), _ms("slide", slide), _ms("offset", offset, zero=True)
        )

    @staticmethod
    def session(gap: Millis) -> SessionWindows:
        return SessionWindows(_ms("gap", gap))


def merged_groups(keys: Int64s, starts: Int64s, ends: Int64s) -> Int64s:
    """For windows sorted by (key, start), the id of the merged window each belongs to:
    windows of a key that touch (a start at or before the largest end so far) share it.
    Vectorized: the ends are offset per key so one running maximum serves every key."""
    n = len(keys)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    base = int(starts.min())
    span = int(ends.max()) - base + 1
    codes = np.concatenate([[0], np.cumsum(keys[1:] != keys[:-1])]).astype(np.int64)
    if span * (int(codes[-1]) + 1) >= 2**62:  # offsets would overflow: one key at a time
        return _merged_groups_by_key(codes, starts, ends)
    shifted_start = starts - base + codes * span
    shifted_end = ends - base + codes * span
    reach = np.maximum.accumulate(shifted_end)
    new = np.ones(n, dtype=bool)
    new[1:] = shifted_start[1:] > reach[:-1]
    return np.cumsum(new) - 1


def _merged_groups_by_key(codes: Int64s, starts: Int64s, ends: Int64s) -> Int64s:
    out = np.empty(len(codes), dtype=np.int64)
    group, reach, previous = -1, 0, -1
    for i in range(len(codes)):
        if codes[i] != previous or starts[i] > reach:
            group += 1
            reach = int(ends[i])
        else:
            reach = max(reach, int(ends[i]))
        previous = int(codes[i])
        out[i] = group
    return out

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


def _ms(what: str, value: Millis) -> int:
    """A duration in whole milliseconds, any sign (the caller checks the range)."""
    if isinstance(value, timedelta):
        value = value // timedelta(milliseconds=1)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(what, value, "a duration (ms or a timedelta)")
    return value


def _positive(what: str, value: Millis) -> int:
    ms = _ms(what, value)
    if ms < 1:
        raise ConfigError(what, value, "a positive duration (ms or a timedelta)")
    return ms


def _offset(value: Millis, period: int, of: str) -> int:
    """An offset of windows that repeat every *period* ms, as Flink takes it: any duration
    with ``|offset| < period`` (``of`` names the period), normalized into ``[0, period)``
    (offsets a whole period apart give the same windows)."""
    ms = _ms("offset", value)
    if abs(ms) >= period:
        raise ConfigError(
            "offset", value, f"a duration with |offset| < the {of} ({period} ms), as in Flink"
        )
    return ms % period


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
        """Windows of *size*, starting at the epoch plus *offset* and every *size* after:
        Flink's ``TumblingEventTimeWindows.of(size, offset)``. *offset* may be negative,
        with ``|offset| < size`` (``timedelta(hours=-8)`` gives days of UTC+8); -100 gives
        the windows of ``size - 100``."""
        ms = _positive("size", size)
        return TumblingWindows(ms, _offset(offset, ms, "size"))

    @staticmethod
    def sliding(size: Millis, slide: Millis, offset: Millis = 0) -> SlidingWindows:
        """Windows of *size* starting every *slide* (which divides the size), at the epoch
        plus *offset*: Flink's ``SlidingEventTimeWindows.of(size, slide, offset)``.
        *offset* may be negative, with ``|offset| < size``, the rule of Flink's docs
        (``of(hours(12), hours(1), hours(-8))``; its code asks ``|offset| < slide``): the
        windows repeat every slide, so offsets a whole slide apart give the same ones."""
        ms = _positive("size", size)
        step = _positive("slide", slide)
        return SlidingWindows(ms, step, _offset(offset, ms, "size") % step)

    @staticmethod
    def session(gap: Millis) -> SessionWindows:
        """Per key, windows that last while rows come less than *gap* apart: Flink's
        ``EventTimeSessionWindows.withGap(gap)``."""
        return SessionWindows(_positive("gap", gap))


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

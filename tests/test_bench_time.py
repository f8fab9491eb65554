"""The time bench's arithmetic (``bench/runbench/timestats.py``) on hand-made checkpoint
points, and its ``transformWithStateInPandas`` baseline (``bench/runbench/tws.py``) on a
stand-in for Spark's state handle: the oracle is the arithmetic of the listed points and
rows."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from runbench.timestats import Point, growth, rate_between, state_series
from runbench.tws import WindowCounter

T0 = 1_800_000_000_000  # epoch ms


def point(i: int, at_s: float, **counters: Any) -> Point:
    trigger = T0 + int(at_s * 1000)
    return Point(checkpoint_id=i, trigger_ms=trigger, completed_ms=trigger + 200, **counters)


def test_rate_between_counts_from_the_second_checkpoint_of_the_window() -> None:
    points = [
        point(1, 0.0, timers_fired=1000),  # before the window
        point(2, 1.0, timers_fired=5),  # the first in the window: counts what came before it
        point(3, 2.0, timers_fired=10),
        point(4, 3.0, timers_fired=20),
        point(5, 4.5, timers_fired=30),
        point(6, 9.0, timers_fired=1000),  # after the window
    ]
    rate = rate_between(points, T0 + 500, T0 + 5000, "timers_fired")
    assert rate == {
        "count": 60,
        "seconds": 3.5,
        "per_s": 60 / 3.5,
        "checkpoints": 4,
        "widened": False,
    }


def test_rate_between_widens_to_the_checkpoints_around_a_short_window() -> None:
    points = [
        point(1, 0.0, timers_fired=1000),
        point(2, 2.0, timers_fired=8),  # the one before the window
        point(3, 6.0, timers_fired=12),  # the only one in it
        point(4, 12.0, timers_fired=20),  # the first after it
        point(5, 15.0, timers_fired=1000),
    ]
    rate = rate_between(points, T0 + 5000, T0 + 10_000, "timers_fired")
    assert rate == {"count": 32, "seconds": 10.0, "per_s": 3.2, "checkpoints": 3, "widened": True}
    assert rate_between(points[3:4], T0 + 5000, T0 + 10_000, "timers_fired") is None


def test_rate_between_needs_two_checkpoints_and_a_counter() -> None:
    points = [point(1, 0.0, late_rows=3), point(2, 1.0, late_rows=4)]
    assert rate_between(points[1:], T0, T0 + 5000, "late_rows") is None
    assert rate_between(points, T0, T0 + 5000, "late_rows") == {
        "count": 4,
        "seconds": 1.0,
        "per_s": 4.0,
        "checkpoints": 2,
        "widened": False,
    }
    with pytest.raises(ValueError, match="not a counter"):
        rate_between(points, T0, T0 + 5000, "state_bytes")


def test_state_series_keys_are_rows_read_less_every_entry_expired_so_far() -> None:
    points = [
        point(3, 3.0, ttl_expired=50, rows_before=None, state_bytes=30),
        point(1, 1.0, ttl_expired=0, rows_before=100, state_bytes=10, bytes_written=10),
        point(2, 2.0, ttl_expired=20, rows_before=200, state_bytes=20, bytes_written=4),
        point(4, 4.0, ttl_expired=30, rows_before=400, state_bytes=40),
    ]
    series = state_series(points, T0)
    assert [s["checkpoint_id"] for s in series] == [1, 2, 3, 4]  # by id
    assert [s["state_keys"] for s in series] == [100, 180, None, 300]  # 400 - (20 + 50 + 30)
    assert [s["t_s"] for s in series] == [1.2, 2.2, 3.2, 4.2]  # to the completion
    assert series[1]["bytes_written"] == 4 and series[1]["rows_read"] == 200


def test_growth_tells_flat_from_linear() -> None:
    duration = 100.0
    linear = [{"t_s": float(t), "v": 10.0 * t} for t in range(101)]
    flat = [{"t_s": float(t), "v": 7.0} for t in range(101)]
    g = growth(linear, "v", duration)
    assert g["mid"] == pytest.approx(500.0)  # t 45..55
    assert g["end"] == pytest.approx(950.0)  # t 90..100
    assert g["end_over_mid"] == pytest.approx(1.9)
    assert g["slope_per_min"] == pytest.approx(600.0)  # 10 per second
    assert g["second_half"] == pytest.approx(750.0)  # t 50..100
    f = growth(flat, "v", duration)
    assert f["end_over_mid"] == pytest.approx(1.0)
    assert f["slope_per_min"] == pytest.approx(0.0)
    assert f["slope_per_min_of_end"] == pytest.approx(0.0)


def test_growth_of_an_empty_or_unknown_series_is_none() -> None:
    g = growth([{"t_s": 1.0, "v": None}], "v", 10.0)
    assert g["mid"] is None and g["end"] is None and g["end_over_mid"] is None
    assert g["slope_per_min"] is None and g["second_half"] is None


class FakeMapState:
    def __init__(self) -> None:
        self.entries: dict[tuple[int, ...], tuple[int, ...]] = {}

    def getValue(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        return self.entries.get(key)

    def updateValue(self, key: tuple[int, ...], value: tuple[int, ...]) -> None:
        self.entries[key] = value

    def removeKey(self, key: tuple[int, ...]) -> None:
        self.entries.pop(key, None)


class FakeHandle:
    """One grouping key's view of Spark's state handle: a map state, and its timers."""

    def __init__(self) -> None:
        self.map = FakeMapState()
        self.timers: list[int] = []

    def getMapState(self, name: str, key_schema: str, value_schema: str) -> FakeMapState:
        return self.map

    def registerTimer(self, ms: int) -> None:
        self.timers.append(ms)


class Expired:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def getExpiryTimeInMs(self) -> int:
        return self.ms


def times(*ms: int) -> pd.DataFrame:
    return pd.DataFrame({"ts": pd.to_datetime(list(ms), unit="ms")})


def test_window_counter_counts_per_window_and_emits_when_its_timer_fires() -> None:
    handle = FakeHandle()
    counter = WindowCounter(10_000)
    counter.init(handle)  # type: ignore[arg-type]
    base = 1_704_067_200_000  # a multiple of 10 s
    out = counter.handleInputRows((7,), iter([times(base + 1, base + 9_999)]), None)  # type: ignore[arg-type]
    assert list(out) == []
    out = counter.handleInputRows(
        (7,),
        iter([times(base + 5_000), times(base + 10_000, base - 1)]),
        None,  # type: ignore[arg-type]
    )
    assert list(out) == []
    end = base + 10_000
    assert handle.map.entries == {(end,): (3,), (end + 10_000,): (1,), (base,): (1,)}
    assert sorted(handle.timers) == [base - 1, end - 1, end + 9_999]  # once per window
    [frame] = list(counter.handleExpiredTimer((7,), None, Expired(end - 1)))  # type: ignore[arg-type]
    assert frame.to_dict("records") == [{"user_id": 7, "window_end": end, "count": 3}]
    assert (end,) not in handle.map.entries
    assert list(counter.handleExpiredTimer((7,), None, Expired(end - 1))) == []  # type: ignore[arg-type]

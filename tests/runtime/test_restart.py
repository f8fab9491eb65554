"""Restart strategies and the RestartTracker (Flink semantics), driven by a ManualClock."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.runtime.restart import (
    FailureRateRestart,
    FixedDelayRestart,
    NoRestart,
    RestartDecision,
    RestartStrategies,
    RestartStrategy,
    RestartTracker,
    restart_strategy_from_dict,
)

# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("build", "option"),
    [
        (lambda: FixedDelayRestart(-1, 0), "attempts"),
        (lambda: FixedDelayRestart(1, -5), "delay_ms"),
        (lambda: FixedDelayRestart(True, 0), "attempts"),
        (lambda: FixedDelayRestart(1.5, 0), "attempts"),  # type: ignore[arg-type]
        (lambda: FailureRateRestart(0, 1000, 0), "max_failures_per_interval"),
        (lambda: FailureRateRestart(1, 0, 0), "failure_interval_ms"),
        (lambda: FailureRateRestart(1, 1000, -1), "delay_ms"),
    ],
)
def test_invalid_strategy_raises_config_error_naming_option(
    build: Callable[[], object], option: str
) -> None:
    with pytest.raises(ConfigError) as info:
        build()
    assert info.value.option == option
    assert option in str(info.value)


def test_factories_build_the_dataclasses() -> None:
    assert RestartStrategies.no_restart() == NoRestart()
    assert RestartStrategies.fixed_delay_restart(3, 500) == FixedDelayRestart(3, 500)
    assert RestartStrategies.failure_rate_restart(2, 60_000, 10) == FailureRateRestart(
        2, 60_000, 10
    )


# ------------------------------------------------------------------ JSON

_STRATEGIES = st.one_of(
    st.just(NoRestart()),
    st.builds(
        FixedDelayRestart,
        st.integers(0, 2**63 - 1),
        st.integers(0, 2**63 - 1),
    ),
    st.builds(
        FailureRateRestart,
        st.integers(1, 2**31),
        st.integers(1, 2**63 - 1),
        st.integers(0, 2**63 - 1),
    ),
)


@given(_STRATEGIES)
def test_strategy_json_round_trip(strategy: RestartStrategy) -> None:
    encoded = json.dumps(strategy.to_dict())
    assert restart_strategy_from_dict(json.loads(encoded)) == strategy


def test_strategy_json_shape() -> None:
    assert FixedDelayRestart(3, 1000).to_dict() == {
        "type": "fixed-delay",
        "attempts": 3,
        "delay_ms": 1000,
    }
    assert NoRestart().to_dict() == {"type": "none"}


@pytest.mark.parametrize(
    ("d", "option"),
    [
        ({"type": "exponential-delay"}, "type"),
        ({}, "type"),
        ({"type": "fixed-delay", "attempts": 1}, "delay_ms"),
        ({"type": "fixed-delay", "attempts": "1", "delay_ms": 0}, "attempts"),
        ({"type": "fixed-delay", "attempts": 1, "delay_ms": 0, "extra": 1}, "extra"),
        ({"type": "none", "attempts": 1}, "attempts"),
        ({"type": "failure-rate", "max_failures_per_interval": 0, "failure_interval_ms": 1,
          "delay_ms": 0}, "max_failures_per_interval"),
    ],
)  # fmt: skip
def test_strategy_from_dict_rejects(d: dict[str, Any], option: str) -> None:
    with pytest.raises(ConfigError) as info:
        restart_strategy_from_dict(d)
    assert info.value.option == option


# ------------------------------------------------------------------ no restart


def test_no_restart_never_restarts() -> None:
    tracker = RestartTracker(NoRestart(), ManualClock())
    decision = tracker.record_failure("task crashed")
    assert decision.restart is False
    assert decision.delay_ms == 0
    assert "task crashed" in decision.reason
    assert "none" in decision.reason
    assert (tracker.failures, tracker.restarts) == (1, 0)


# ------------------------------------------------------------------ fixed delay


def test_fixed_delay_allows_exactly_attempts_restarts() -> None:
    clock = ManualClock(1_000)
    tracker = RestartTracker(FixedDelayRestart(attempts=3, delay_ms=250), clock)
    decisions = []
    for i in range(5):
        decisions.append(tracker.record_failure(f"boom {i}"))
        clock.advance(10_000_000)  # time does not matter for fixed-delay
    # Hand-computed: failures 1, 2, 3 restart after 250 ms; 4 and 5 do not.
    assert [d.restart for d in decisions] == [True, True, True, False, False]
    assert [d.delay_ms for d in decisions] == [250, 250, 250, 0, 0]
    assert "boom 3" in decisions[3].reason
    assert "exhausted" in decisions[3].reason
    assert (tracker.failures, tracker.restarts) == (5, 3)


def test_fixed_delay_zero_attempts_fails_first() -> None:
    tracker = RestartTracker(FixedDelayRestart(0, 1000), ManualClock())
    decision = tracker.record_failure("x")
    assert decision == RestartDecision(False, 0, decision.reason)
    assert "x" in decision.reason
    assert tracker.restarts == 0


@given(st.integers(0, 20), st.integers(0, 10_000), st.integers(1, 40))
def test_fixed_delay_matches_counting_oracle(attempts: int, delay: int, n: int) -> None:
    tracker = RestartTracker(FixedDelayRestart(attempts, delay), ManualClock())
    got = [tracker.record_failure("f").restart for _ in range(n)]
    assert got == [i <= attempts for i in range(1, n + 1)]


# ------------------------------------------------------------------ failure rate


def test_failure_rate_flink_many_failures_within_rate() -> None:
    # Flink's testManyFailuresWithinRate: 1 failure per 1 ms, failures 2 ms apart.
    clock = ManualClock()
    tracker = RestartTracker(FailureRateRestart(1, 1, 0), clock)
    for _ in range(3):
        assert tracker.record_failure("f").restart
        clock.advance(2)


def test_failure_rate_flink_failures_exceeding_rate() -> None:
    # Flink's testFailuresExceedingRate: 3 per 10 s; the 4th failure at the same instant fails.
    tracker = RestartTracker(FailureRateRestart(3, 10_000, 0), ManualClock())
    assert [tracker.record_failure("f").restart for _ in range(4)] == [True, True, True, False]


def test_failure_rate_window_is_inclusive_and_slides() -> None:
    clock = ManualClock(0)
    tracker = RestartTracker(FailureRateRestart(2, 100, 7), clock)
    # Hand-computed: a failure at t restarts iff at most 2 failures lie in [t - 100, t].
    times_and_expected = [
        (0, True),  # {0}
        (50, True),  # {0, 50}
        (100, False),  # {0, 50, 100}: 100 - 0 == 100 is inside the window
        (150, False),  # {50, 100, 150}
        (251, True),  # {251}: 150 is 101 ms ago, outside
        (252, True),  # {251, 252}
    ]
    for t, expected in times_and_expected:
        clock.set(t)
        decision = tracker.record_failure(f"at {t}")
        assert decision.restart is expected, t
        assert decision.delay_ms == (7 if expected else 0)
        assert f"at {t}" in decision.reason
    clock.set(253)  # within [153, 253]: 251, 252, 253 -> 3 > 2
    decision = tracker.record_failure("third")
    assert not decision.restart
    assert "failure rate exceeded" in decision.reason
    assert "third" in decision.reason


def test_failure_rate_recovers_after_quiet_period() -> None:
    clock = ManualClock(0)
    tracker = RestartTracker(FailureRateRestart(1, 1_000, 0), clock)
    assert tracker.record_failure("a").restart
    clock.advance(1_000)
    assert not tracker.record_failure("b").restart  # 2 failures within 1000 ms (inclusive)
    clock.advance(1_001)
    assert tracker.record_failure("c").restart  # b is now out of the window
    assert (tracker.failures, tracker.restarts) == (3, 2)


@given(
    st.integers(1, 5),
    st.integers(1, 50),
    st.lists(st.integers(0, 60), min_size=1, max_size=40),
)
def test_failure_rate_matches_window_count_oracle(
    max_failures: int, interval: int, gaps: list[int]
) -> None:
    clock = ManualClock(0)
    tracker = RestartTracker(FailureRateRestart(max_failures, interval, 3), clock)
    times: list[int] = []
    got: list[bool] = []
    for gap in gaps:
        clock.advance(gap)
        times.append(clock.now_ms())
        got.append(tracker.record_failure("f").restart)
    # Oracle: a failure at t restarts iff at most max_failures failures (itself included)
    # happened at times in [t - interval, t].
    expected = [
        sum(1 for s in times[: i + 1] if t - s <= interval) <= max_failures
        for i, t in enumerate(times)
    ]
    assert got == expected

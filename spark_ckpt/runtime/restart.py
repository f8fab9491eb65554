"""Restart strategies: whether a failed pipeline is restarted (from its latest completed
checkpoint), and after what delay.

Three strategies, with Flink's semantics (``RestartBackoffTimeStrategy`` implementations):

* :class:`NoRestart` — the first failure fails the job.
* :class:`FixedDelayRestart` ``(attempts, delay_ms)`` — at most ``attempts`` restarts over the
  lifetime of the job, each after ``delay_ms``: failures ``1..attempts`` restart, failure
  ``attempts + 1`` fails the job.
* :class:`FailureRateRestart` ``(max_failures_per_interval, failure_interval_ms, delay_ms)``
  — restart after ``delay_ms`` unless the job failed *more than* ``max_failures_per_interval``
  times within ``failure_interval_ms``. Exactly as Flink's
  ``FailureRateRestartBackoffTimeStrategy`` (since FLINK-20752): the timestamps of the last
  ``max_failures_per_interval + 1`` failures are kept; a failure is not restarted when that
  many failures are recorded and ``now - oldest <= failure_interval_ms`` (the window is
  inclusive at its far end). Every failure is recorded, also one that fails the job.

The strategies are frozen, validated values with a JSON encoding (``to_dict`` /
:func:`restart_strategy_from_dict`); the state (failure counts and timestamps) lives in a
:class:`RestartTracker`, which the job driver owns.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeAlias

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.clock import Clock
from spark_ckpt.protocol.option import MAX_LONG, check_int


@dataclass(frozen=True)
class NoRestart:
    """Never restart: the first failure fails the job."""

    TYPE: ClassVar[str] = "none"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE}


@dataclass(frozen=True)
class FixedDelayRestart:
    """Restart at most ``attempts`` times in total, each after ``delay_ms``.

    ``attempts`` counts restarts, not failures: failure number ``attempts + 1`` fails the job
    (``attempts=0`` behaves like :class:`NoRestart`)."""

    attempts: int
    delay_ms: int
    TYPE: ClassVar[str] = "fixed-delay"

    def __post_init__(self) -> None:
        check_int("attempts", self.attempts, 0)
        check_int("delay_ms", self.delay_ms, 0, unit="milliseconds")

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "attempts": self.attempts, "delay_ms": self.delay_ms}


@dataclass(frozen=True)
class FailureRateRestart:
    """Restart after ``delay_ms`` unless more than ``max_failures_per_interval`` failures
    (counting the current one) happened within the last ``failure_interval_ms``."""

    max_failures_per_interval: int
    failure_interval_ms: int
    delay_ms: int
    TYPE: ClassVar[str] = "failure-rate"

    def __post_init__(self) -> None:
        check_int("max_failures_per_interval", self.max_failures_per_interval, 1)
        check_int("failure_interval_ms", self.failure_interval_ms, 1, unit="milliseconds")
        check_int("delay_ms", self.delay_ms, 0, unit="milliseconds")

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "max_failures_per_interval": self.max_failures_per_interval,
            "failure_interval_ms": self.failure_interval_ms,
            "delay_ms": self.delay_ms,
        }


RestartStrategy: TypeAlias = NoRestart | FixedDelayRestart | FailureRateRestart

_STRATEGY_TYPES: Final = ("none", "fixed-delay", "failure-rate")


def _int_field(d: dict[str, Any], name: str) -> int:
    """``d[name]`` if it is an integer; the range is checked by the strategy itself."""
    value = d.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, value, "an integer")
    return value


def restart_strategy_from_dict(d: dict[str, Any]) -> RestartStrategy:
    """Decode the output of ``to_dict`` of any strategy. Raises :class:`ConfigError` for an
    unknown ``type``, a missing or unknown key, or an invalid value."""
    if not isinstance(d, dict):
        raise ConfigError("restart_strategy", d, "a JSON object with a 'type' key")
    kind = d.get("type")
    expected: dict[str, tuple[str, ...]] = {
        "none": (),
        "fixed-delay": ("attempts", "delay_ms"),
        "failure-rate": ("max_failures_per_interval", "failure_interval_ms", "delay_ms"),
    }
    if kind not in expected:
        raise ConfigError("type", kind, f"one of {', '.join(_STRATEGY_TYPES)}")
    unknown = sorted(set(d) - {"type", *expected[kind]})
    if unknown:
        raise ConfigError(unknown[0], d[unknown[0]], f"no such key for restart strategy {kind!r}")
    if kind == "none":
        return NoRestart()
    if kind == "fixed-delay":
        return FixedDelayRestart(_int_field(d, "attempts"), _int_field(d, "delay_ms"))
    return FailureRateRestart(
        _int_field(d, "max_failures_per_interval"),
        _int_field(d, "failure_interval_ms"),
        _int_field(d, "delay_ms"),
    )


class RestartStrategies:
    """Factories named like Flink's ``RestartStrategies`` (durations in ms; see the
    ``seconds``/``minutes``/... helpers in :mod:`spark_ckpt.runtime.config`)."""

    @staticmethod
    def no_restart() -> NoRestart:
        return NoRestart()

    @staticmethod
    def fixed_delay_restart(attempts: int, delay_ms: int) -> FixedDelayRestart:
        return FixedDelayRestart(attempts, delay_ms)

    @staticmethod
    def failure_rate_restart(
        max_failures_per_interval: int, interval_ms: int, delay_ms: int
    ) -> FailureRateRestart:
        return FailureRateRestart(max_failures_per_interval, interval_ms, delay_ms)


@dataclass(frozen=True)
class RestartDecision:
    """The verdict on one failure. ``delay_ms`` is how long to wait before restarting (0 when
    not restarting). ``reason`` always contains the failure's reason; when ``restart`` is
    false it also says which limit was exceeded."""

    restart: bool
    delay_ms: int
    reason: str


class RestartTracker:
    """Applies a :class:`RestartStrategy` to the failures of one job, in the order they are
    reported.

    Runs on the job driver; not thread-safe (one owner calls :meth:`record_failure`). The
    clock is read once per failure. Decisions are not sticky: a tracker asked again after a
    "no restart" decides by the same rules (for fixed-delay, always no restart again; for
    failure-rate, possibly restart once older failures left the window) — the caller stops
    the job on the first "no restart".
    """

    def __init__(self, strategy: RestartStrategy, clock: Clock) -> None:
        self._strategy = strategy
        self._clock = clock
        self._failures = 0
        self._restarts = 0
        limit = (
            strategy.max_failures_per_interval + 1
            if isinstance(strategy, FailureRateRestart)
            else 1
        )
        self._timestamps: deque[int] = deque(maxlen=limit)

    @property
    def strategy(self) -> RestartStrategy:
        return self._strategy

    @property
    def failures(self) -> int:
        """Failures recorded so far (restarted or not)."""
        return self._failures

    @property
    def restarts(self) -> int:
        """Failures that were granted a restart."""
        return self._restarts

    def record_failure(self, reason: str) -> RestartDecision:
        """Record one failure now and decide whether to restart."""
        now = self._clock.now_ms()
        self._failures += 1
        self._timestamps.append(now)
        decision = self._decide(now, reason)
        if decision.restart:
            self._restarts += 1
        return decision

    def _decide(self, now: int, reason: str) -> RestartDecision:
        s = self._strategy
        if isinstance(s, NoRestart):
            return RestartDecision(False, 0, f"restart strategy is 'none'; failure: {reason}")
        if isinstance(s, FixedDelayRestart):
            if self._failures <= s.attempts:
                return RestartDecision(
                    True,
                    s.delay_ms,
                    f"restart {self._failures} of {s.attempts} (fixed-delay); failure: {reason}",
                )
            return RestartDecision(
                False,
                0,
                f"fixed-delay restart attempts exhausted ({s.attempts} restarts used); "
                f"failure: {reason}",
            )
        window = self._timestamps
        if len(window) == window.maxlen and now - window[0] <= s.failure_interval_ms:
            return RestartDecision(
                False,
                0,
                f"failure rate exceeded: {len(window)} failures within "
                f"{now - window[0]} ms, more than {s.max_failures_per_interval} allowed per "
                f"{s.failure_interval_ms} ms; failure: {reason}",
            )
        return RestartDecision(True, s.delay_ms, f"restart (failure-rate); failure: {reason}")


__all__ = [
    "MAX_LONG",
    "FailureRateRestart",
    "FixedDelayRestart",
    "NoRestart",
    "RestartDecision",
    "RestartStrategies",
    "RestartStrategy",
    "RestartTracker",
    "check_int",
    "restart_strategy_from_dict",
]

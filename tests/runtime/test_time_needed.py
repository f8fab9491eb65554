"""Which operators need a pipeline that keeps time, found before anything runs without
calling any of their code (``docs/time.md``: a TTL or timers without a watermark strategy
is a ConfigError up front)."""

from __future__ import annotations

import pyarrow as pa

from spark_ckpt.runtime.operator import KeyedOperator
from spark_ckpt.runtime.task_time import time_needed
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

TTL = StateTtlConfig.of(1000)


class Loud(KeyedOperator):
    """Fails the test if any of its code runs: open, close or a copy."""

    def __init__(self, **held: object) -> None:
        super().__init__("loud", "k", pa.int64())
        self.__dict__.update(held)

    def open(self, state: StateContext) -> None:
        raise AssertionError("open ran")

    def close(self) -> None:
        raise AssertionError("close ran")

    def __deepcopy__(self, memo: object) -> Loud:
        raise AssertionError("copied")

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        return None


class ClassHeld(Loud):
    SEEN = ListStateDescriptor("seen", pa.int64(), ttl=TTL)


class Timed(Loud):
    def on_timers(self, timers: pa.Table, state: StateContext) -> pa.Table | None:
        return None


def test_descriptors_with_a_ttl_are_found_wherever_the_operator_holds_them() -> None:
    plain = ValueStateDescriptor("count", pa.int64())
    expiring = ValueStateDescriptor("last", pa.int64(), ttl=TTL)
    mapped = MapStateDescriptor("m", pa.string(), pa.int64(), ttl=TTL)
    assert time_needed(Loud(a=plain)) is None
    assert time_needed(Loud(a=expiring)) == "has states with a TTL (last)"
    assert time_needed(Loud(a=[plain, (mapped,)], b={"x": expiring})) == (
        "has states with a TTL (last, m)"
    )
    assert time_needed(ClassHeld()) == "has states with a TTL (seen)"


def test_operators_with_timers_need_time() -> None:
    assert time_needed(Timed()) == "handles timers"

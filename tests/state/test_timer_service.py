"""Timers as keyed state: the timer service against a plain model (a set of (key, time) per
domain), its state through snapshots and a restore at another parallelism, and the state
context's timer calls. Hypothesis drives the operations."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import StateError
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.keygroup import range_for_subtask, subtasks_for_keys
from spark_ckpt.state.state_restore import restore_backend
from spark_ckpt.state.timers import EVENT_TIMERS, TimeDomain, TimerService
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

MAX_PARALLELISM = 16


def backend(subtask: int = 0, parallelism: int = 1) -> KeyedStateBackend:
    return KeyedStateBackend(
        "op",
        subtask,
        pa.int64(),
        range_for_subtask(MAX_PARALLELISM, parallelism, subtask),
        MAX_PARALLELISM,
        parallelism=parallelism,
    )


def pairs(table: pa.Table) -> list[tuple[int, int]]:
    return list(zip(table.column("key").to_pylist(), table.column("ts").to_pylist(), strict=True))


keys = st.integers(0, 12)
times = st.integers(0, 40)
timer_lists = st.lists(st.tuples(keys, times), max_size=8)
operation = st.one_of(
    st.tuples(st.just("register"), st.sampled_from(TimeDomain), timer_lists),
    st.tuples(st.just("delete"), st.sampled_from(TimeDomain), timer_lists),
    st.tuples(st.just("fire"), st.sampled_from(TimeDomain), times),
    st.tuples(st.just("forget"), st.sampled_from(TimeDomain), st.just(0)),
)


@settings(max_examples=200)
@given(st.lists(operation, max_size=30))
def test_the_service_fires_what_a_set_of_timers_would(ops: list) -> None:
    """Each timer fires once, at the first firing at or after its time, in (time, key)
    order; a deleted timer never fires; registering twice keeps one."""
    service = TimerService(backend())
    model: dict[TimeDomain, set[tuple[int, int]]] = {d: set() for d in TimeDomain}
    registered = fired = 0
    for name, domain, arg in ops:
        if name == "register":
            new = set(arg) - model[domain]
            registered += len(new)
            model[domain] |= set(arg)
            service.register(domain, [k for k, _ in arg], [t for _, t in arg])
        elif name == "delete":
            model[domain] -= set(arg)
            service.delete(domain, [k for k, _ in arg], [t for _, t in arg])
        elif name == "fire":
            due = sorted((t, k) for k, t in model[domain] if t <= arg)
            model[domain] -= {(k, t) for t, k in due}
            fired += len(due)
            assert pairs(service.pop_due(domain, arg)) == [(k, t) for t, k in due]
        else:
            service.forget_index()  # as after a restore: rebuilt from the state
        for d in TimeDomain:
            assert service.count(d) == len(model[d])
    assert service.take_counts() == (registered, fired)
    assert service.take_counts() == (0, 0)


@settings(max_examples=60)
@given(
    st.lists(st.tuples(keys, times), max_size=40),
    st.integers(1, 3),
    st.integers(1, 4),
    times,
)
def test_timers_are_restored_and_rescaled_by_key_group(
    timers: list[tuple[int, int]], old_parallelism: int, new_parallelism: int, upto: int
) -> None:
    """Timers registered at one parallelism, snapshotted, restored at another: each new
    subtask fires exactly the timers of its keys."""
    store = InMemoryCheckpointStore()
    owners = subtasks_for_keys(
        pa.array([k for k, _ in timers], pa.int64()), MAX_PARALLELISM, old_parallelism
    ).to_pylist()
    refs = []
    for subtask in range(old_parallelism):
        b = backend(subtask, old_parallelism)
        mine = [t for t, o in zip(timers, owners, strict=True) if o == subtask]
        TimerService(b).register(TimeDomain.EVENT, [k for k, _ in mine], [t for _, t in mine])
        snap = b.snapshots.snapshot(1, full=True)
        refs.extend(store.write_task_state(1, snap).blobs)
    fired: list[tuple[int, int]] = []
    for subtask in range(new_parallelism):
        b = backend(subtask, new_parallelism)
        service = TimerService(b)
        restore_backend(b, refs, store.read_blob)
        got = pairs(service.pop_due(TimeDomain.EVENT, upto))
        new_owner = subtasks_for_keys(
            pa.array([key for key, _ in got], pa.int64()), MAX_PARALLELISM, new_parallelism
        )
        assert set(new_owner.to_pylist()) <= {subtask}
        fired.extend(got)
    assert sorted(fired) == sorted({(k, t) for k, t in timers if t <= upto})


def test_timers_are_a_keyed_state_of_the_operator() -> None:
    b = backend()
    TimerService(b).register(TimeDomain.EVENT, [3, 3, 4], [10, 5, 7])
    [descriptor] = [d for d in b.descriptors() if d.name == EVENT_TIMERS]
    table = b.to_table(descriptor)
    assert dict(
        zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)
    ) == {
        3: [5, 10],
        4: [7],
    }


class Time:
    def __init__(self, event_time: bool = True) -> None:
        self.watermark_ms: int | None = 100
        self.processing_ms = 5000
        self.event_time = event_time


def test_the_state_context_registers_per_key_and_vectorized() -> None:
    b = backend()
    service = TimerService(b)
    ctx = StateContext(b, service, Time())
    assert (ctx.current_watermark, ctx.current_processing_time) == (100, 5000)
    ctx.register_event_time_timers(pa.array([1, 2], pa.int64()), [10, 20])
    ctx.set_current_key(7)
    ctx.register_event_time_timer(30)
    ctx.register_processing_time_timer(6000)
    ctx.delete_event_time_timer(30)
    ctx.register_event_time_timers(
        [9], pa.array([40_000], pa.timestamp("us", tz="UTC"))
    )  # an Arrow timestamp: 40 ms
    assert pairs(service.pop_due(TimeDomain.EVENT, 1000)) == [(1, 10), (2, 20), (9, 40)]
    assert pairs(service.pop_due(TimeDomain.PROCESSING, 6000)) == [(7, 6000)]


def test_timer_calls_fail_clearly_without_time() -> None:
    b = backend()
    with pytest.raises(StateError, match="keeps time"):
        StateContext(b).register_event_time_timers([1], [1])
    with pytest.raises(StateError, match="on_timers"):
        StateContext(b, None, Time()).register_processing_time_timers([1], [1])
    ctx = StateContext(b, TimerService(b), Time(event_time=False))
    with pytest.raises(StateError, match="event-time column"):
        ctx.register_event_time_timers([1], [1])
    ctx.register_processing_time_timers([1], [1])  # processing time needs no column
    with pytest.raises(StateError, match="null"):
        ctx.register_processing_time_timers([1], [None])
    with pytest.raises(StateError, match="2 keys but 1"):
        ctx.register_processing_time_timers([1, 2], [1])

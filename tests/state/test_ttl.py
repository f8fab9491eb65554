"""State TTL against a plain model: per key (or list element, or map entry) the value and
the time of its last update; an entry is gone once ``update + ttl <= now``. Hypothesis
drives reads, writes, purges, the passing of time, and snapshots restored into a fresh
backend (the update times survive)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import StateError
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from spark_ckpt.state.state_restore import restore_backend
from spark_ckpt.state.ttl import TtlStates
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

TTL = 100


class Clock:
    def __init__(self) -> None:
        self.ms = 1000
        self.watermark_ms: int | None = None
        self.event_time = False

    @property
    def processing_ms(self) -> int:
        return self.ms


def context(clock: Clock, on_read: bool = False) -> tuple[StateContext, TtlStates, tuple]:
    backend = KeyedStateBackend.for_subtask("op", 0, 1, pa.int64(), 16)
    states = TtlStates(backend, lambda: clock.ms)
    config = StateTtlConfig.of(TTL)
    if on_read:
        config = config.refreshed_on_read()
    descriptors = (
        ValueStateDescriptor("v", pa.string(), ttl=config),
        ListStateDescriptor("l", pa.int64(), ttl=config),
        MapStateDescriptor("m", pa.string(), pa.int64(), ttl=config),
    )
    for d in descriptors:  # as an operator's open() registers them
        states.storage(d)
    return StateContext(backend, None, clock, states), states, descriptors


keys = st.integers(0, 5)
op = st.one_of(
    st.tuples(st.just("put"), keys, st.text(max_size=2)),
    st.tuples(st.just("put_vec"), st.lists(keys, max_size=4, unique=True), st.text(max_size=2)),
    st.tuples(st.just("get"), keys, st.none()),
    st.tuples(st.just("get_vec"), st.lists(keys, max_size=4), st.none()),
    st.tuples(st.just("add"), keys, st.integers(0, 9)),
    st.tuples(st.just("list"), keys, st.none()),
    st.tuples(st.just("mput"), keys, st.sampled_from("abc")),
    st.tuples(st.just("mget"), keys, st.sampled_from("abc")),
    st.tuples(st.just("items"), keys, st.none()),
    st.tuples(st.just("wait"), st.integers(0, 80), st.none()),
    st.tuples(st.just("purge"), st.none(), st.none()),
    st.tuples(st.just("restore"), st.none(), st.none()),
)


@settings(max_examples=300)
@given(st.lists(op, max_size=40), st.booleans())
def test_ttl_states_behave_like_the_model(ops: list[tuple[Any, Any, Any]], on_read: bool) -> None:
    clock = Clock()
    ctx, states, (vd, ld, md) = context(clock, on_read)
    value: dict[int, tuple[str, int]] = {}
    lists: dict[int, list[tuple[int, int]]] = {}
    maps: dict[int, dict[str, tuple[int, int]]] = {}
    store = InMemoryCheckpointStore()
    cid = 0

    def live(t: int) -> bool:
        return t + TTL > clock.ms

    def entries() -> int:
        return len(value) + sum(len(x) for x in lists.values()) + sum(len(m) for m in maps.values())

    for name, a, b in ops:
        now = clock.ms
        if name == "put":
            ctx.set_current_key(a)
            ctx.value_state(vd).update(b)
            value[a] = (b, now)
        elif name == "put_vec":
            ctx.put_values(vd, pa.array(a, pa.int64()), [b] * len(a))
            value.update({k: (b, now) for k in a})
        elif name == "get":
            ctx.set_current_key(a)
            got = ctx.value_state(vd).value()
            found = value.get(a)
            if found is not None and not live(found[1]):
                del value[a]
                found = None
            assert got == (None if found is None else found[0])
            if found is not None and on_read:
                value[a] = (found[0], now)
        elif name == "get_vec":
            got = ctx.get_values(vd, pa.array(a, pa.int64())).to_pylist()
            expected = []
            for k in a:
                found = value.get(k)
                if found is not None and not live(found[1]):
                    del value[k]
                    found = None
                expected.append(None if found is None else found[0])
            assert got == expected
            if on_read:
                value.update({k: (value[k][0], now) for k in a if k in value})
        elif name == "add":
            ctx.set_current_key(a)
            ctx.list_state(ld).add(b)
            lists[a] = [e for e in lists.get(a, []) if live(e[1])] + [(b, now)]
        elif name == "list":
            ctx.set_current_key(a)
            got = ctx.list_state(ld).get()
            kept = [e for e in lists.get(a, []) if live(e[1])]
            assert got == [v for v, _ in kept]
            lists[a] = [(v, now) for v, _ in kept] if on_read else kept
        elif name == "mput":
            ctx.set_current_key(a)
            ctx.map_state(md).put(b, len(b))
            maps.setdefault(a, {})[b] = (len(b), now)
        elif name == "mget":
            ctx.set_current_key(a)
            got = ctx.map_state(md).get(b)
            m = {k: e for k, e in maps.get(a, {}).items() if live(e[1])}
            assert got == (m[b][0] if b in m else None)
            if on_read and b in m:
                m[b] = (m[b][0], now)
            maps[a] = m
        elif name == "items":
            ctx.set_current_key(a)
            got = dict(ctx.map_state(md).items())
            m = {k: e for k, e in maps.get(a, {}).items() if live(e[1])}
            assert got == {k: v for k, (v, _) in m.items()}
            maps[a] = {k: (v, now) for k, (v, _) in m.items()} if on_read else m
        elif name == "wait":
            clock.ms += a
        elif name == "purge":
            states.purge()
            value = {k: e for k, e in value.items() if live(e[1])}
            lists = {k: [e for e in x if live(e[1])] for k, x in lists.items()}
            maps = {k: {j: e for j, e in m.items() if live(e[1])} for k, m in maps.items()}
            assert states.backend.value_count("v") == len(value)  # purged from the state
        elif name == "restore":  # a snapshot into a fresh backend: the update times survive
            cid += 1
            backend = states.backend
            handle = store.write_task_state(cid, backend.snapshots.snapshot(cid, full=True))
            ctx, states, (vd, ld, md) = context(clock, on_read)
            restore_backend(states.backend, handle.blobs, store.read_blob)
            states.forget_index()
        lists = {k: x for k, x in lists.items() if x}
        maps = {k: m for k, m in maps.items() if m}
    # everything expires in the end, and a purge finds every entry
    clock.ms += TTL
    states.purge()
    for d in (vd, ld, md):
        assert states.backend.value_count(states.storage(d)) == 0
    assert entries() >= 0


def test_a_purge_shrinks_the_state_and_the_snapshot() -> None:
    clock = Clock()
    ctx, states, (vd, _, _) = context(clock)
    ctx.put_values(vd, pa.array(range(100), pa.int64()), ["x"] * 100)
    clock.ms += 50
    ctx.put_values(vd, pa.array(range(100, 150), pa.int64()), ["y"] * 50)
    clock.ms += 60  # the first 100 expired, the last 50 live
    assert states.purge() == 100
    assert states.take_expired() == 100
    stored = states.storage(vd)
    assert states.backend.value_count(stored) == 50
    snap = states.backend.snapshots.snapshot(1, full=True)
    assert sum(b.table.num_rows for b in snap.new_blobs) == 50


def test_adding_or_removing_a_ttl_on_restored_state_is_refused_clearly() -> None:
    store = InMemoryCheckpointStore()
    plain = KeyedStateBackend.for_subtask("op", 0, 1, pa.int64(), 16)
    plain.put_values(ValueStateDescriptor("v", pa.string()), [1], ["a"])
    handle = store.write_task_state(1, plain.snapshots.snapshot(1, full=True))
    clock = Clock()
    _, states, (vd, _, _) = context(clock)
    states.storage(vd)
    with pytest.raises(StateError, match="written without one"):
        restore_backend(states.backend, handle.blobs, store.read_blob)
    # and the other way round
    _, states, (vd, _, _) = context(clock)
    StateContext(states.backend, None, clock, states).put_values(vd, [1], ["a"])
    handle = store.write_task_state(2, states.backend.snapshots.snapshot(2, full=True))
    fresh = KeyedStateBackend.for_subtask("op", 0, 1, pa.int64(), 16)
    fresh.register(ValueStateDescriptor("v", pa.string()))
    with pytest.raises(StateError, match="written with a TTL"):
        restore_backend(fresh, handle.blobs, store.read_blob)


def test_a_ttl_needs_a_pipeline_that_keeps_time() -> None:
    backend = KeyedStateBackend.for_subtask("op", 0, 1, pa.int64(), 16)
    ttl = ValueStateDescriptor("v", pa.string(), ttl=StateTtlConfig.of(TTL))
    with pytest.raises(StateError, match="keeps time"):
        StateContext(backend).value_state(ttl)
    with pytest.raises(StateError, match="TTL"):
        backend.register(ttl)
    with pytest.raises(StateError, match="positive"):
        StateTtlConfig.of(0)

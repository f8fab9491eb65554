"""The change log of a keyed state (``StateChanges``): whatever the appends, merges and
compactions, it says what a plain fold over the changes says (last value per key), and a
compaction is paid once and never changes another holder's changes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.state.snapshot import changes as changes_module
from spark_ckpt.state.snapshot.changes import StateChanges, log_table

Change = tuple[int, int | None]  # key, value (None: cleared)


def table(changes: list[Change]) -> pa.Table:
    keys = pa.array([k for k, _ in changes], pa.int64())
    values = pa.array([v for _, v in changes], pa.int64())
    return log_table(np.zeros(len(changes), dtype=np.int32), keys, values)


def as_dict(changes: StateChanges) -> dict[int, Any]:
    if not changes.log:
        return {}
    t = changes.compacted_log()
    keys = t.column("key").to_pylist()
    assert len(keys) == len(set(keys)), "one row per key"
    return dict(zip(keys, t.column("value").to_pylist(), strict=True))


def fold(events: list[Change]) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for k, v in events:
        out[k] = v
    return out


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.integers(0, 2),
            st.lists(st.tuples(st.integers(0, 30), st.none() | st.integers(0, 9)), max_size=12),
            st.integers(0, 40),  # live rows (bounds the log)
        ),
        st.tuples(st.just("then"), st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
        st.tuples(st.just("compacted"), st.integers(0, 2)),
        st.tuples(st.just("bounded"), st.integers(0, 2)),
    ),
    max_size=30,
)


@settings(max_examples=300)
@given(ops)
def test_the_log_says_what_a_fold_over_the_changes_says(program: list[tuple[Any, ...]]) -> None:
    objects = [StateChanges() for _ in range(3)]
    events: list[list[Change]] = [[] for _ in range(3)]
    for op in program:
        if op[0] == "append":
            _, i, changes, live = op
            if changes:
                objects[i].append_table(table(changes), live)
                events[i] = [*events[i], *changes]
        elif op[0] == "then":
            _, a, b, into = op
            objects[into] = objects[a].then(objects[b])
            events[into] = [*events[a], *events[b]]
        elif op[0] == "compacted":
            assert objects[op[1]].compacted() is objects[op[1]]
        else:
            assert objects[op[1]].bounded() is objects[op[1]]
        for obj, evs in zip(objects, events, strict=True):
            # read through a merge with nothing (which shares the tables), so that checking
            # does not compact the object itself
            assert as_dict(obj.then(StateChanges())) == fold(evs)
            assert bool(obj) == bool(evs)
    for obj, evs in zip(objects, events, strict=True):
        assert as_dict(obj) == fold(evs)


def test_a_compaction_is_paid_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = changes_module.last_occurrences

    def counting(keys: pa.Array) -> Any:
        calls.append(len(keys))
        return real(keys)

    monkeypatch.setattr(changes_module, "last_occurrences", counting)
    changes = StateChanges()
    changes.append_table(table([(1, 1), (2, 2)]), 100)
    changes.append_table(table([(1, 3)]), 100)
    shared = changes.then(StateChanges())
    assert as_dict(changes) == {1: 3, 2: 2}
    assert as_dict(changes) == {1: 3, 2: 2}
    assert changes.compacted().compacted_log().num_rows == 2
    assert calls == [3]  # once, for the two tables
    assert shared.log_rows == 3 and as_dict(shared) == {1: 3, 2: 2}  # its own, unchanged


def test_merging_again_and_again_stays_bounded() -> None:
    since = StateChanges()
    for i in range(40):
        step = StateChanges()
        step.append_table(table([(k, i) for k in range(2_000)]), 10**6)
        since = since.then(step).bounded()
        assert since.log_rows <= 65_536 + 2 * 2_000 + 2_000
    assert as_dict(since) == {k: 39 for k in range(2_000)}


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.tuples(st.integers(0, 20), st.none() | st.integers(0, 3)), max_size=12),
        max_size=4,
    ),
    touched=st.lists(st.integers(0, 30), max_size=8),
)
def test_key_count_is_the_distinct_keys_written_or_cleared(
    batches: list[list[Change]], touched: list[int]
) -> None:
    changes = StateChanges()
    for batch in batches:
        if batch:
            changes.append_table(table(batch), live_rows=1)
    for key in touched:
        changes.touch(0, key)  # every key of `table` is in key group 0
    expected = {k for batch in batches for k, _ in batch} | set(touched)
    assert changes.key_count() == len(expected)

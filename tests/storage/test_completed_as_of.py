"""``completed_as_of``: the checkpoint a restore as of a time picks from the completion times a
store still knows and its history's floor, against a plain oracle over every completion."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_ckpt.errors import RestoreError
from spark_ckpt.storage.history import completed_as_of

#: (id, completion time) of every checkpoint that ever completed, ids increasing.
completions = st.lists(st.integers(0, 50), min_size=1, max_size=30).map(
    lambda gaps: [(i + 1, 1_000 + sum(gaps[: i + 1])) for i in range(len(gaps))]
)


@given(completions, st.integers(0, 35), st.integers(0, 4), st.integers(900, 2_600))
def test_the_answer_is_the_one_time_travel_gives_or_a_refusal(
    done: list[tuple[int, int]], forgotten: int, retained: int, at_ms: int
) -> None:
    """The history forgot the ids below *forgotten* (its floor), retention kept the newest
    *retained* in the log: the answer is the latest id completed by *at_ms* over every
    completion (the oracle), or a refusal when that one may be forgotten."""
    floor = min(forgotten, len(done))
    known = {cid: t for cid, t in done if cid >= floor or cid > len(done) - retained}
    truth = max((cid for cid, t in done if t <= at_ms), default=None)
    try:
        answer = completed_as_of(known, floor, at_ms, "root")
    except RestoreError:
        assert truth is None or truth < floor or truth not in known
        return
    assert answer == truth


def test_refusals_say_why() -> None:
    with pytest.raises(RestoreError, match="no checkpoint of root"):
        completed_as_of({5: 2_000}, 0, 1_999, "root")
    with pytest.raises(RestoreError, match="forgot the checkpoints below id 4"):
        completed_as_of({5: 2_000}, 4, 1_999, "root")
    with pytest.raises(RestoreError, match=r"not known any more.*restore it by id"):
        completed_as_of({1: 1_000, 9: 2_000}, 6, 1_500, "root")
    assert completed_as_of({1: 1_000, 9: 2_000}, 2, 1_500, "root") == 1

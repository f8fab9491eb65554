"""Event-time windows in operator tasks: tumbling, sliding and session windows with count,
sum, min, max, mean and a user's aggregate, each window emitted once when the watermark
passes its end plus the allowed lateness — through crashes past the last checkpoint,
restores at another parallelism and subtasks rebuilt from images.

Oracles: a plain loop applying the documented rules (``docs/time.md``) — lateness per window,
as Flink decides it: a row counts in each of its windows not yet emitted (end - 1 + lateness
above the previous batches' watermark) and goes to the late output when it has none; a
window takes the rows of its span (session windows: of a key, rows less than a gap apart,
a late row kept when its merged session is open), and fires once the watermark reaches its
end - 1 + lateness; and, where disorder stays within the bound, pandas' per-window
aggregates of the input."""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from timed_jobs import CHANNELS, Batch, Job, run, streams, value_of, watermarks

from spark_ckpt.errors import ConfigError
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.runtime.windows import (
    Accumulator,
    Agg,
    WindowAggregate,
    WindowAssigner,
    Windows,
)
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.testing.state_backends import examples

BOUND_MS = 2000
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
AGGREGATES = (
    Agg.count(),
    Agg.sum("v"),
    Agg.min("v"),
    Agg.max("v"),
    Agg.mean("v"),
    Agg.of(  # a user's: the sum of squares
        "squares",
        [Accumulator("q", lambda rows: pc.multiply(rows["v"], rows["v"]), "sum", "sum")],
        lambda acc: acc["q"],
    ),
)
ASSIGNERS = {
    "tumbling": Windows.tumbling(3000),
    "sliding": Windows.sliding(4000, 2000),
    "session": Windows.session(1500),
}

Row = tuple[int, int, int, int, int, int, int, float, int]


def operator(assigner: WindowAssigner) -> WindowAggregate:
    return WindowAggregate("windows", "k", assigner, AGGREGATES)


def result(key: int, start: int, end: int, values: list[int]) -> Row:
    return (
        key,
        start,
        end,
        len(values),
        sum(values),
        min(values),
        max(values),
        round(sum(values) / len(values), 9),
        sum(v * v for v in values),
    )


def spans_of(name: str, t: int) -> list[tuple[int, int]]:
    """The windows of a row at *t* (ms) by the assigners of :data:`ASSIGNERS`."""
    if name == "tumbling":
        return [(t - t % 3000, t - t % 3000 + 3000)]
    if name == "sliding":
        last = t - t % 2000
        return [(last, last + 4000), (last - 2000, last + 2000)]
    return [(t, t + 1500)]


def merge_sessions(windows: list[list]) -> list[list]:
    """Session windows ``[start, end, times, held]`` of one key merged while any two touch
    (a start at or before the other's end): ``held`` when any merged one was."""
    merged: list[list] = []
    for w in sorted(windows, key=lambda w: w[0]):
        if merged and w[0] <= merged[-1][1]:
            last = merged[-1]
            merged[-1] = [last[0], max(last[1], w[1]), last[2] + w[2], last[3] or w[3]]
        else:
            merged.append(list(w))
    return merged


def oracle(
    batches: list[Batch], name: str, allowed: int | list[int]
) -> tuple[list[Row], list[tuple[int, int]]]:
    """The windows a plain loop emits over *batches* (see the module docstring), and the
    rows it drops as late (key, event time); *allowed*: the allowed lateness, or the one in
    force at each batch. Lateness is decided per window against the watermark the previous
    batches left: a row counts in each of its windows whose end - 1 + lateness is above it,
    and is dropped when it has none; a session row counts when its session — merged with
    the key's open sessions and the batch's other rows — is open (holds an open session, or
    ends above it)."""
    marks = watermarks(batches, BOUND_MS)
    open_windows: dict[int, list[list]] = defaultdict(list)  # key -> [[start, end, times]]
    out: list[Row] = []
    dropped: list[tuple[int, int]] = []
    for index, batch in enumerate(batches):
        lateness = allowed if isinstance(allowed, int) else allowed[index]
        before = marks[index - 1] if index else None

        def emitted(end: int, lateness: int = lateness, before: int | None = before) -> bool:
            return before is not None and end - 1 + lateness <= before

        arrived: dict[int, list[int]] = defaultdict(list)  # key -> event times
        for rows in batch.rows.values():
            for k, t in rows:
                arrived[k].append(t)
        for k, times in arrived.items():
            mine = open_windows[k]
            if name == "session":
                windows = [[s, e, v, True] for s, e, v in mine]
                windows += [[t, t + 1500, [t], False] for t in times]
                mine.clear()
                for s, e, members, held in merge_sessions(windows):
                    if not held and emitted(e):
                        dropped += [(k, t) for t in members]
                    else:
                        mine.append([s, e, members])
                continue
            for t in times:
                spans = [(s, e) for s, e in spans_of(name, t) if not emitted(e)]
                if not spans:
                    dropped.append((k, t))
                for s, e in spans:
                    found = [w for w in mine if w[0] == s]
                    if found:
                        found[0][2].append(t)
                    else:
                        mine.append([s, e, [t]])
        mark = marks[index]
        if mark is None:
            continue
        for k, mine in open_windows.items():
            for w in [w for w in mine if w[1] - 1 + lateness <= mark]:
                out.append(result(k, w[0], w[1], [value_of(t) for t in w[2]]))
                mine.remove(w)
    return sorted(out), sorted(dropped)


def late_output(job: Job) -> list[tuple[int, int]]:
    """The (key, event time) of the rows the job committed to its late output."""
    assert job.late is not None
    table = job.late.committer.output()
    if table is None:
        return []
    return sorted(zip(table["k"].to_pylist(), map(millis, table["ts"].to_pylist()), strict=True))


def millis(when: dt.datetime) -> int:
    return (when - EPOCH) // dt.timedelta(milliseconds=1)


def emitted(job: Job) -> list[Row]:
    table = job.sink.committer.output()
    if table is None:
        return []
    return sorted(
        (
            r["k"],
            millis(r["window_start"]),
            millis(r["window_end"]),
            r["count"],
            r["sum_v"],
            r["min_v"],
            r["max_v"],
            round(r["mean_v"], 9),
            r["squares"],
        )
        for r in table.to_pylist()
    )


STREAMS = streams(batches=8, clock=10_000, step=3000, keys=4, behind=4000, ahead=500)


def test_windows_are_emitted_once_as_the_loop_says(state_backend: str) -> None:
    """Windows through crashes and rescales, as the loop says (fewer examples on
    ``rocksdb``: :func:`~spark_ckpt.testing.state_backends.examples`)."""

    @settings(max_examples=examples(150, state_backend))
    @given(
        STREAMS,
        st.sampled_from(sorted(ASSIGNERS)),
        st.sampled_from([0, 1000]),
        st.sampled_from([None, "image", "workers"]),
    )
    def check(
        case: tuple[list[Batch], int | None, int, int],
        name: str,
        lateness: int,
        rebuild: str | None,
    ) -> None:
        _check_windows(case, name, lateness, rebuild)

    check()


def _check_windows(
    case: tuple[list[Batch], int | None, int, int], name: str, lateness: int, rebuild: str | None
) -> None:
    batches, crash, parallelism, new_parallelism = case
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS)
    if lateness:
        strategy = strategy.with_allowed_lateness(lateness)
    assigner = ASSIGNERS[name]
    job = Job(lambda: operator(assigner), strategy, parallelism, rebuild=rebuild)
    job.late = MemorySink("late")
    run(job, batches, crash, new_parallelism)
    windows, dropped = oracle(batches, name, lateness)
    assert emitted(job) == windows
    assert late_output(job) == dropped  # each row in no open window, once


def run_relaxed(name: str, case: tuple[list[Batch], int | None, int, int]) -> None:
    """Run *case* with no allowed lateness up to its crash, then restore with 1 s of it;
    assert the windows emitted against the loop's, the lateness changing at the restore."""
    batches, crash, parallelism, new_parallelism = case
    crash = len(batches) - 2 if crash is None else crash
    bounded = WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS)
    job = Job(lambda: operator(ASSIGNERS[name]), bounded, parallelism)
    job.start(parallelism)
    positions = dict.fromkeys(CHANNELS, 0)
    history = []
    for index in range(crash + 1):
        history.append(dict(positions))
        job.feed(index, batches[index], positions)
    resume = job.crash()
    job.strategy = bounded.with_allowed_lateness(1000)
    job.start(new_parallelism)
    positions = dict(history[resume]) if resume < len(history) else positions
    for index in range(resume, len(batches)):
        job.feed(index, batches[index], positions)
    allowed = [0 if index < resume else 1000 for index in range(len(batches))]
    assert emitted(job) == oracle(batches, name, allowed)[0]


def test_a_larger_allowed_lateness_at_a_restore_holds_the_open_windows_longer(
    state_backend: str,
) -> None:
    """Restored with 1 s more allowed lateness (:func:`_check_relaxed`)."""
    settings(max_examples=examples(100, state_backend))(
        given(STREAMS, st.sampled_from(sorted(ASSIGNERS)))(_check_relaxed)
    )()


def _check_relaxed(case: tuple[list[Batch], int | None, int, int], name: str) -> None:
    """Restored with 1 s more allowed lateness: windows emitted before the checkpoint stay
    emitted; those open in it fire at the new time (their timers were set for the old
    one), as do the windows opened after the restore."""
    run_relaxed(name, case)


def test_a_window_whose_old_timer_fired_after_a_restore_still_fires() -> None:
    """Key 0's window [0, 3 s) is open in the checkpoint, its timer set for 2.999 s. After a
    restore with 1 s of allowed lateness that timer fires for no window that is due; the
    window must still fire at 3.999 s, though no other row of key 0 ever comes."""
    both = dict.fromkeys(CHANNELS)
    batches = [
        Batch({c: [(0, 1000)] for c in both}, {}, True),
        Batch({c: [(1, 4500)] for c in both}, {}, False),
        Batch({c: [(1, 5200)] for c in both}, {}, False),
        Batch({c: [(1, 6500)] for c in both}, {}, True),
    ]
    run_relaxed("tumbling", (batches, 1, 1, 2))


def test_within_the_bound_windows_equal_pandas_aggregates() -> None:
    """Rows at most 2 s out of order against a 2 s bound: nothing is late, and the windows
    emitted are pandas' tumbling and sliding aggregates of every window that ended."""
    import random

    rng = random.Random(7)
    batches = []
    clock = 10_000
    for _ in range(30):
        clock += rng.randrange(200, 900)
        rows = {
            c: [(rng.randrange(6), clock - rng.randrange(0, 2000)) for _ in range(8)]
            for c in CHANNELS
        }
        batches.append(Batch(rows, {}, rng.random() < 0.3))
    batches[-1].checkpoint = True
    final = watermarks(batches, BOUND_MS)[-1]
    assert final is not None
    frame = pd.DataFrame(
        [(k, t, value_of(t)) for b in batches for rows in b.rows.values() for k, t in rows],
        columns=["k", "ts", "v"],
    )
    for name, size, slide in (("tumbling", 3000, 3000), ("sliding", 4000, 2000)):
        job = Job(
            lambda a=ASSIGNERS[name]: operator(a),
            WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS),
            2,
        )
        run(job, batches, None, 2)
        pieces = []
        for back in range(0, size, slide):
            f = frame.assign(start=frame.ts - frame.ts % slide - back)
            pieces.append(f)
        spread = pd.concat(pieces)
        spread["end"] = spread.start + size
        spread = spread[(spread.ts >= spread.start) & (spread.ts < spread.end)]
        grouped = spread.assign(sq=spread.v * spread.v).groupby(["k", "start", "end"])
        expected = sorted(
            (
                k,
                s,
                e,
                int(g.v.count()),
                int(g.v.sum()),
                int(g.v.min()),
                int(g.v.max()),
                round(float(g.v.mean()), 9),
                int(g.sq.sum()),
            )
            for (k, s, e), g in grouped
            if e - 1 <= final
        )
        got = emitted(job)
        assert got == expected and len(got) > 20
        assert not any(math.isnan(r[7]) for r in got)


def pandas_windows(
    batches: list[Batch], name: str, lateness: int
) -> tuple[list[Row], list[tuple[int, int]]]:
    """The windows emitted and the rows dropped as late, by pandas: per (row, window) the
    watermark the row's batch arrived under; a row counts in the windows whose end - 1 +
    lateness is above it and is dropped with none left; windows fire once a watermark
    reaches that. Session windows batch by batch, merged by pandas' gaps and islands."""
    marks = watermarks(batches, BOUND_MS)
    frame = pd.DataFrame(
        [
            (i, k, t, marks[i - 1] if i and marks[i - 1] is not None else -(2**62))
            for i, b in enumerate(batches)
            for rows in b.rows.values()
            for k, t in rows
        ],
        columns=["batch", "k", "ts", "before"],
    )
    frame["row"] = range(len(frame))
    frame["v"] = frame.ts % 13 - 4
    final = marks[-1] if marks[-1] is not None else -(2**62)
    if name == "session":
        return _pandas_sessions(frame, marks, lateness)
    size, slide = (3000, 3000) if name == "tumbling" else (4000, 2000)
    pairs = pd.concat(
        [frame.assign(start=frame.ts - frame.ts % slide - back) for back in range(0, size, slide)]
    )
    pairs["end"] = pairs.start + size
    kept = pairs[pairs.end - 1 + lateness > pairs.before]
    dropped = frame[~frame.row.isin(kept.row)]
    grouped = kept.assign(sq=kept.v * kept.v).groupby(["k", "start", "end"])
    windows = [
        (
            int(k),
            int(s),
            int(e),
            *_aggregates(g.v.count(), g.v.sum(), g.v.min(), g.v.max(), g.sq.sum()),
        )
        for (k, s, e), g in grouped
        if e - 1 + lateness <= final
    ]
    return sorted(windows), sorted(zip(dropped.k.tolist(), dropped.ts.tolist(), strict=True))


def _aggregates(count: int, total: int, low: int, high: int, squares: int) -> tuple:
    return (int(count), int(total), int(low), int(high), round(total / count, 9), int(squares))


def _pandas_sessions(
    frame: pd.DataFrame, marks: list[int | None], lateness: int
) -> tuple[list[Row], list[tuple[int, int]]]:
    columns = ["k", "start", "end", "count", "sum", "min", "max", "sq", "ts", "held"]
    never = -(2**62)
    open_sessions = pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    windows: list[Row] = []
    dropped: list[tuple[int, int]] = []
    for index, mark in enumerate(marks):
        before = marks[index - 1] if index and marks[index - 1] is not None else never
        rows = frame[frame.batch == index]
        arrived = pd.DataFrame(
            {
                "k": rows.k,
                "start": rows.ts,
                "end": rows.ts + 1500,
                "count": 1,
                "sum": rows.v,
                "min": rows.v,
                "max": rows.v,
                "sq": rows.v * rows.v,
                "ts": rows.ts,
                "held": 0,
            }
        ).astype("int64")
        both = pd.concat([open_sessions.assign(held=1), arrived], ignore_index=True)
        if len(both):
            both = both.sort_values(["k", "start"], kind="stable").reset_index(drop=True)
            reach = both.groupby("k").end.cummax().groupby(both.k).shift()
            both["group"] = (reach.isna() | (both.start > reach)).cumsum()
            sessions = both.groupby("group").agg(
                k=("k", "first"),
                start=("start", "min"),
                end=("end", "max"),
                count=("count", "sum"),
                sum=("sum", "sum"),
                min=("min", "min"),
                max=("max", "max"),
                sq=("sq", "sum"),
                ts=("ts", "max"),
                held=("held", "max"),
            )
            closed = (sessions.held == 0) & (sessions.end - 1 + lateness <= before)
            late = both[both.group.isin(sessions.index[closed])]
            dropped += list(zip(late.k.tolist(), late.ts.tolist(), strict=True))
            live = sessions[~closed]
        else:
            live = open_sessions
        due = live.end - 1 + lateness <= (never if mark is None else mark)
        for r in live[due].itertuples():
            aggs = _aggregates(r.count, r.sum, r.min, r.max, r.sq)
            windows.append((int(r.k), int(r.start), int(r.end), *aggs))
        open_sessions = live[~due][columns].reset_index(drop=True)
    return sorted(windows), sorted(dropped)


def test_late_rows_count_in_their_open_windows_as_pandas_says(state_backend: str) -> None:
    """Late rows against pandas (:func:`_check_late_rows`)."""
    settings(max_examples=examples(120, state_backend))(
        given(STREAMS, st.sampled_from(sorted(ASSIGNERS)), st.sampled_from([0, 1000]))(
            _check_late_rows
        )
    )()


def _check_late_rows(
    case: tuple[list[Batch], int | None, int, int], name: str, lateness: int
) -> None:
    """Rows up to 4 s out of order against a 2 s bound, through a crash and a restore at
    another parallelism: a row behind the watermark still counts in its windows not yet
    emitted (a sliding window's later ones, a session it extends or joins), and goes to the
    late output only when it has none, each once; against pandas."""
    batches, crash, parallelism, new_parallelism = case
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS)
    if lateness:
        strategy = strategy.with_allowed_lateness(lateness)
    job = Job(lambda: operator(ASSIGNERS[name]), strategy, parallelism, late=MemorySink("late"))
    run(job, batches, crash, new_parallelism)
    windows, dropped = pandas_windows(batches, name, lateness)
    assert emitted(job) == windows
    assert late_output(job) == dropped


def test_a_sliding_row_behind_the_watermark_counts_in_its_windows_still_open() -> None:
    """Sliding 4 s windows every 2 s, a 2 s bound: after batch 1 the watermark is 6.999 s.
    A row at 5.5 s is behind it: window [2 s, 6 s) was emitted (it fired at 5.999 s), so the
    row is dropped from it, but [4 s, 8 s) is open and counts it (Flink's rule; a per-row
    rule dropped it from both)."""
    batches = [
        Batch({0: [(1, 2100), (1, 5000), (3, 9000)], 1: [(2, 9000)]}, {}, False),
        Batch({0: [(1, 5500)], 1: [(2, 9000)]}, {}, False),
        Batch({0: [(1, 30_000)], 1: [(2, 30_000)]}, {}, True),
    ]
    job = Job(
        lambda: operator(Windows.sliding(4000, 2000)),
        WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS),
        1,
        late=MemorySink("late"),
    )
    run(job, batches, None, 1)
    counts = {(r[0], r[1], r[2]): r[3] for r in emitted(job)}
    assert counts[(1, 2000, 6000)] == 2  # 2.1 s and 5 s: 5.5 s came after it was emitted
    assert counts[(1, 4000, 8000)] == 2  # 5 s and the late 5.5 s
    assert late_output(job) == []  # 5.5 s had a window open: not late for the late output


def test_a_session_row_behind_the_watermark_extends_an_open_session() -> None:
    """Sessions with a 1.5 s gap, a 2 s bound: after batch 1 the watermark is 6.999 s and
    key 1's session [6.5 s, 8 s) is open. A row at 5.2 s is behind the watermark, and its own
    window [5.2 s, 6.7 s) would have closed; it touches the open session, which it extends
    to start at 5.2 s. A row at 1 s touches nothing open: late."""
    batches = [
        Batch({0: [(1, 6500), (3, 9000)], 1: [(2, 9000)]}, {}, False),
        Batch({0: [(1, 5200), (1, 1000)], 1: [(2, 9000)]}, {}, False),
        Batch({0: [(1, 30_000)], 1: [(2, 30_000)]}, {}, True),
    ]
    job = Job(
        lambda: operator(Windows.session(1500)),
        WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS),
        1,
        late=MemorySink("late"),
    )
    run(job, batches, None, 1)
    sessions = [(r[0], r[1], r[2], r[3]) for r in emitted(job) if r[0] == 1]
    assert sessions == [(1, 5200, 8000, 2)]
    assert late_output(job) == [(1, 1000)]


def test_bad_window_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="slide"):
        Windows.sliding(5000, 2000)
    with pytest.raises(ConfigError, match="size"):
        Windows.tumbling(0)
    with pytest.raises(ConfigError, match="aggregates"):
        WindowAggregate("w", "k", Windows.tumbling(10), [])
    with pytest.raises(ConfigError, match="distinct names"):
        WindowAggregate("w", "k", Windows.tumbling(10), [Agg.count(), Agg.count()])
    with pytest.raises(ConfigError, match="partial"):
        Accumulator("x", "v", "median", "sum")


# -- offsets, as Flink takes them -------------------------------------------------------------


def windows_of(assigner: WindowAssigner, t: int) -> list[tuple[int, int]]:
    _, starts, ends = assigner.assign(np.array([t], dtype=np.int64))
    return sorted(zip(starts.tolist(), ends.tolist(), strict=True))


def test_tumbling_windows_take_flinks_negative_offset() -> None:
    """Flink's ``TumblingEventTimeWindowsTest``: of(5000, -100)."""
    assigner = Windows.tumbling(5000, -100)
    assert windows_of(assigner, 0) == [(-100, 4900)]
    assert windows_of(assigner, 4899) == [(-100, 4900)]
    assert windows_of(assigner, 4900) == [(4900, 9900)]
    assert assigner == Windows.tumbling(5000, 4900)  # the same windows as size - 100
    assert windows_of(Windows.tumbling(5000, 100), 5099) == [(100, 5100)]


def test_daily_windows_of_utc_plus_8_as_in_flinks_docs() -> None:
    """``TumblingEventTimeWindows.of(Time.days(1), Time.hours(-8))``: days from midnight in
    UTC+8, i.e. from 16:00 UTC of the day before."""
    assigner = Windows.tumbling(dt.timedelta(days=1), dt.timedelta(hours=-8))
    morning = millis(dt.datetime(2026, 3, 1, 3, 0, tzinfo=dt.UTC))  # 11:00 in UTC+8
    evening = millis(dt.datetime(2026, 3, 1, 17, 0, tzinfo=dt.UTC))  # 01:00 next day
    day = millis(dt.datetime(2026, 2, 28, 16, 0, tzinfo=dt.UTC))
    assert windows_of(assigner, morning) == [(day, day + 86_400_000)]
    assert windows_of(assigner, evening) == [(day + 86_400_000, day + 2 * 86_400_000)]


def test_sliding_windows_take_flinks_negative_offset() -> None:
    """Flink's ``SlidingEventTimeWindowsTest``: of(5000, 1000, -100)."""
    assigner = Windows.sliding(5000, 1000, -100)
    assert windows_of(assigner, 0) == [
        (-4100, 900),
        (-3100, 1900),
        (-2100, 2900),
        (-1100, 3900),
        (-100, 4900),
    ]
    assert windows_of(assigner, 4899) == [
        (-100, 4900),
        (900, 5900),
        (1900, 6900),
        (2900, 7900),
        (3900, 8900),
    ]
    assert windows_of(assigner, 4900) == [
        (900, 5900),
        (1900, 6900),
        (2900, 7900),
        (3900, 8900),
        (4900, 9900),
    ]
    assert assigner == Windows.sliding(5000, 1000, 900)
    # the example of Flink's docs: 12 h windows every hour, offset by -8 h (whole slides)
    hour = 3_600_000
    hours = Windows.sliding(dt.timedelta(hours=12), dt.timedelta(hours=1), dt.timedelta(hours=-8))
    assert windows_of(hours, 5 * hour + 1) == [(s * hour, (s + 12) * hour) for s in range(-6, 6)]
    assert Windows.sliding(20_000, 10_000, -11_000) == Windows.sliding(20_000, 10_000, 9_000)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Windows.tumbling(10_000, 20_000),  # Flink's invalid parameters
        lambda: Windows.tumbling(10_000, -11_000),
        lambda: Windows.tumbling(10_000, 10_000),
        lambda: Windows.sliding(20_000, 10_000, -20_000),
        lambda: Windows.sliding(20_000, 10_000, 25_000),
    ],
)
def test_offsets_of_a_whole_period_or_more_are_refused(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=r"\|offset\| <"):
        make()


def test_a_window_operator_with_a_negative_offset_emits_flinks_windows() -> None:
    """Tumbling 3 s windows with offset -100 through a job: the windows emitted start at
    multiples of 3000 less 100, and hold the rows of their span."""
    rows = {0: [(1, 10_050), (1, 11_899), (1, 11_900)], 1: [(1, 10_100)]}
    later = {0: [(2, 30_000)], 1: [(2, 30_000)]}
    batches = [Batch(rows, {}, False), Batch(later, {}, True)]
    job = Job(
        lambda: operator(Windows.tumbling(3000, -100)),
        WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND_MS),
        1,
    )
    run(job, batches, None, 1)
    spans = [(r[1], r[2], r[3]) for r in emitted(job)]
    assert spans == [(8900, 11_900, 3), (11_900, 14_900, 1)]

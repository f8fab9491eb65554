"""Model-based tests of the whole protocol on the simulated job.

Hypothesis drives sources, deliveries, message delivery, time, manual checkpoints, declines
and crashes (with restarts at other parallelisms) in random interleavings, for every
alignment mode and both checkpoint stores. The oracle is a plain fold over the input prefix:

(a) every completed checkpoint holds exactly the state of the records before each channel's
    barrier (unaligned: state + channel state); at-least-once: at least that;
(b) after crashes, restore + replay commit output identical to a failure-free run
    (exactly-once), or lose nothing (at-least-once);
(c) checkpoint ids are never reused;
(d) a checkpoint restored at another parallelism gives the same per-key state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint, task_state_uid
from spark_ckpt.protocol.state_handles import BlobKind
from spark_ckpt.runtime.aligner import AlignmentMode
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.operator import RunningCount
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.keygroup import range_for_subtask
from spark_ckpt.state.state_restore import restore_backend
from spark_ckpt.storage.checkpoint_store import CheckpointStore, StateStorage
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore
from spark_ckpt.testing.simulation import SOURCE, VERTEX, AmountTotals, SimulatedJob, SimulationSpec

CHANNELS = 3
MODES = [
    AlignmentMode.ALIGNED,
    AlignmentMode.UNALIGNED,
    AlignmentMode.AT_LEAST_ONCE,
    "aligned_timeout",
]

# (share in %, action): progress is common, failures are rare but present in most runs
WEIGHTS = [
    (25, "emit"),
    (35, "deliver"),
    (12, "acks"),
    (8, "notify"),
    (8, "advance"),
    (7, "checkpoint"),
    (2, "decline"),
    (3, "crash"),
]


def _kind(roll: int) -> str:
    for share, kind in WEIGHTS:
        if roll < share:
            return kind
        roll -= share
    raise AssertionError(roll)


#: What each kind of action draws besides its kind: only its own fields (drawing every
#: kind's fields for each action made generating the scripts cost as much as running them).
_FIELDS: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "emit": st.tuples(st.just("emit"), st.integers(0, CHANNELS - 1), st.integers(1, 25)),
    "deliver": st.tuples(
        st.just("deliver"),
        st.integers(0, 3),
        st.lists(st.integers(0, CHANNELS - 1), min_size=1, max_size=CHANNELS, unique=True),
        st.integers(1, 8),
    ),
    "acks": st.tuples(st.just("acks"), st.integers(1, 8)),
    "notify": st.tuples(st.just("notify"), st.integers(1, 8)),
    "advance": st.tuples(st.just("advance"), st.integers(1, 120)),
    "checkpoint": st.just(("checkpoint",)),
    "decline": st.just(("decline",)),
    "crash": st.tuples(st.just("crash"), st.integers(1, 3)),
}

action = st.integers(0, 99).flatmap(lambda roll: _FIELDS[_kind(roll)])


def fold(
    job: SimulatedJob, offsets: dict[tuple[str, int], int]
) -> tuple[Counter[int], Counter[int]]:
    """Reference: counts and amount totals per key over each channel's prefix."""
    counts: Counter[int] = Counter()
    totals: Counter[int] = Counter()
    for c, log in enumerate(job.logs):
        rows = log.to_pylist()[: offsets.get((SOURCE, c), 0)]
        for r in rows:
            counts[r["user_id"]] += 1
            totals[r["user_id"]] += r["amount"]
    return counts, totals


def restored_state(
    store: StateStorage, cp: CompletedCheckpoint, parallelism: int
) -> tuple[Counter[int], Counter[int]]:
    """Per-key state of *cp* restored into *parallelism* fresh subtasks."""
    counts: Counter[int] = Counter()
    totals: Counter[int] = Counter()
    for s in range(parallelism):
        kgr = range_for_subtask(128, parallelism, s)
        for op, out in ((RunningCount("counter", "user_id"), counts), (AmountTotals(), totals)):
            backend = KeyedStateBackend(op.uid, s, pa.int64(), kgr, 128, parallelism=parallelism)
            op.open(StateContext(backend))
            restore_backend(backend, cp.operator_blobs(op.uid), store.read_blob)
            desc = RunningCount.COUNT if op.uid == "counter" else AmountTotals.TOTAL
            table = backend.to_table(desc)
            for k, v in zip(
                table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True
            ):
                assert k not in out, "a key restored into two subtasks"
                out[k] = v
    return counts, totals


def channel_state(
    store: StateStorage, cp: CompletedCheckpoint
) -> tuple[Counter[int], Counter[int]]:
    counts: Counter[int] = Counter()
    totals: Counter[int] = Counter()
    for ref in cp.operator_blobs(task_state_uid(VERTEX)):
        if ref.kind is BlobKind.CHANNEL:
            for r in store.read_blob(ref).select(["user_id", "amount"]).to_pylist():
                counts[r["user_id"]] += 1
                totals[r["user_id"]] += r["amount"]
    return counts, totals


def verify_checkpoint(job: SimulatedJob, cp: CompletedCheckpoint, exactly_once: bool) -> None:
    exp_counts, exp_totals = fold(job, cp.offsets())
    for p in sorted({1, job.parallelism, 3}):  # (d): any parallelism gives the same state
        counts, totals = restored_state(job.store, cp, p)
        ch_counts, ch_totals = channel_state(job.store, cp)
        if exactly_once:
            assert counts + ch_counts == exp_counts, f"checkpoint {cp.checkpoint_id} counts"
            assert totals + ch_totals == exp_totals, f"checkpoint {cp.checkpoint_id} totals"
        else:
            assert not ch_counts
            assert all(counts[k] >= n for k, n in exp_counts.items())
            assert all(totals[k] >= n for k, n in exp_totals.items())


def run(actions: list[tuple[Any, ...]], mode: AlignmentMode | str, store: CheckpointStore) -> None:
    timeout = 0
    if mode == "aligned_timeout":
        mode, timeout = AlignmentMode.ALIGNED, 30
    assert isinstance(mode, AlignmentMode)
    spec = SimulationSpec(
        channels=CHANNELS,
        parallelism=2,
        rows_per_channel=60,
        keys=12,
        mode=mode,
        aligned_timeout_ms=timeout,
        config=CheckpointConfig(
            interval_ms=100,
            max_concurrent=1 if mode is AlignmentMode.UNALIGNED else 2,
            retained_checkpoints=2,
            tolerable_failed_checkpoints=1_000_000,
        ),
    )
    job = SimulatedJob(spec, store)
    exactly_once = mode is not AlignmentMode.AT_LEAST_ONCE
    verified: set[int] = set()

    def check_new() -> None:
        for cp in store.list_completed():
            if cp.checkpoint_id not in verified:
                verify_checkpoint(job, cp, exactly_once)
                verified.add(cp.checkpoint_id)

    for a in actions:
        kind = a[0]
        if kind == "emit":
            job.emit(a[1], a[2])
        elif kind == "deliver":
            job.deliver(a[1], a[2], a[3])
        elif kind == "acks":
            job.deliver_acks(a[1])
            check_new()
        elif kind == "notify":
            job.deliver_notifications(a[1])
        elif kind == "advance":
            job.advance(a[1])
        elif kind == "checkpoint":
            job.coordinator.trigger_checkpoint()
        elif kind == "decline":
            job.decline_pending()
        elif kind == "crash":
            job.crash(parallelism=a[1])
    job.finish()
    check_new()

    # (c) ids strictly increase across restarts: never reused
    assert job.triggered_ids == sorted(set(job.triggered_ids))
    # (b) the committed output against the fold over the whole input
    counts, _ = fold(job, {(SOURCE, c): log.num_rows for c, log in enumerate(job.logs)})
    expected = Counter((k, i) for k, n in counts.items() for i in range(1, n + 1))
    out = job.sink.committer.output()
    got: Counter[tuple[int, int]] = Counter(
        zip(out.column("user_id").to_pylist(), out.column("count").to_pylist(), strict=True)
        if out
        else ()
    )
    if exactly_once:
        assert got == expected
    else:
        assert set(expected) <= set(got)


StoreFactory = Callable[[], CheckpointStore]


@pytest.mark.parametrize("mode", MODES, ids=str)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=st.lists(action, min_size=30, max_size=120))
def test_protocol_in_memory(mode: AlignmentMode | str, actions: list[tuple[Any, ...]]) -> None:
    run(actions, mode, InMemoryCheckpointStore())


# the same model on Delta: the fast lane has it in memory, and the Delta store's contract
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES, ids=str)
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(actions=st.lists(action, max_size=30))
def test_protocol_on_delta(
    mode: AlignmentMode | str,
    actions: list[tuple[Any, ...]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root: Path = tmp_path_factory.mktemp("pipeline")
    run(actions, mode, DeltaCheckpointStore(str(root)))


def test_failure_free_run_equals_fold() -> None:
    """Sanity: with no interleaving chosen at all, finish() alone yields the exact output."""
    run([], AlignmentMode.ALIGNED, InMemoryCheckpointStore())


def test_crash_heavy_scripted_run() -> None:
    script: list[tuple[Any, ...]] = []
    for i in range(6):
        script += [
            ("emit", i % CHANNELS, 25),
            ("emit", (i + 1) % CHANNELS, 10),
            ("checkpoint",),
            ("deliver", 0, [0, 1, 2], 2),
            ("deliver", 1, [0, 1, 2], 2),
            ("acks", 6),
            ("notify", 3),
            ("deliver", 0, [0, 1, 2], 3),
            ("deliver", 1, [2], 3),
            ("acks", 6),
            ("crash", 1 + i % 3),
        ]
    for mode in MODES:
        run(script, mode, InMemoryCheckpointStore())


def test_completed_but_uncommitted_output_is_recovered_and_committed() -> None:
    """Crash after checkpoint completion, before any task heard of it: the sink transactions
    recorded in the checkpoint are committed on restart (recover-and-commit)."""
    store = InMemoryCheckpointStore()
    job = SimulatedJob(
        SimulationSpec(channels=2, parallelism=2, rows_per_channel=30, keys=5), store
    )
    for c in range(2):
        job.emit(c, 30)
    req = job.coordinator.trigger_checkpoint()
    for s in range(2):
        job.deliver(s, [0, 1], 100)
    job.deliver_acks(100)
    assert (
        req.completed is not None and job.sink.committer.output() is None
    )  # completed, not committed
    job.crash()
    out = job.sink.committer.output()
    assert out is not None and out.num_rows == 60  # committed by recovery, before any replay
    job.finish()
    run_counts = Counter(
        zip(
            *(job.sink.committer.output().column(c).to_pylist() for c in ("user_id", "count")),
            strict=True,
        )
    )  # type: ignore[union-attr]
    assert all(n == 1 for n in run_counts.values())

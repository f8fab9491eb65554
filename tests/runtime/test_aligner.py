"""Tests of the barrier aligner (spark_ckpt.runtime.aligner).

The oracle is a plain Python model of the channels: each channel is a list of events (data row
ids, barriers, cancels). The expected content of checkpoint *n* is computed from those lists
alone (rows before barrier *n* on every channel), never from the aligner's output."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import ConfigError, ProtocolError
from spark_ckpt.protocol.barrier import (
    BARRIER_FIELDS,
    CHANNEL,
    KIND,
    OFFSET,
    CancelCheckpointMarker,
    CheckpointBarrier,
    SnapshotType,
    barrier_row_values,
)
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.runtime.aligner import (
    MAX_TRACKED_CHECKPOINTS,
    Abort,
    AbortReason,
    AlignerState,
    AlignmentMode,
    BarrierAligner,
    Complete,
    Records,
    Snapshot,
    Step,
)
from spark_ckpt.runtime.alignment.alignment_context import AlignmentContext
from spark_ckpt.runtime.alignment.barrier_handler import create_barrier_handler
from spark_ckpt.runtime.alignment.barrier_handler_state import (
    AlternatingCollectingBarriers,
    AlternatingWaitingForFirstBarrier,
    BarrierHandlerState,
    CollectingBarriers,
    CollectingBarriersUnaligned,
    WaitingForFirstBarrier,
    WaitingForFirstBarrierUnaligned,
)
from spark_ckpt.runtime.alignment.barrier_ledger import BarrierLedger
from spark_ckpt.runtime.alignment.barrier_tracker import BarrierTracker
from spark_ckpt.runtime.alignment.channel_buffer import ChannelBuffer
from spark_ckpt.runtime.alignment.single_checkpoint_handler import (
    SingleCheckpointBarrierHandler,
)
from spark_ckpt.runtime.alignment.step_output import StepOutput

SCHEMA = pa.schema([pa.field("v", pa.int64()), *BARRIER_FIELDS])
ALIGNED, UNALIGNED, ALO = (
    AlignmentMode.ALIGNED,
    AlignmentMode.UNALIGNED,
    AlignmentMode.AT_LEAST_ONCE,
)


# --- stream builder --------------------------------------------------------------------------


@dataclass
class Stream:
    """Rows in arrival order, plus the per-channel event lists the oracle reads.

    Channel events: ``("d", id)`` data, ``("b", n)`` barrier, ``("c", n)`` cancel."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    events: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    next_id: int = 0

    def _count(self, ch: int) -> int:
        return sum(1 for kind, _ in self.events.get(ch, []) if kind == "d")

    def data(self, ch: int, k: int = 1) -> Stream:
        for _ in range(k):
            off = self._count(ch)
            self.rows.append(
                {"v": self.next_id, CHANNEL: ch, OFFSET: off, KIND: 0}
                | dict.fromkeys([f.name for f in BARRIER_FIELDS[3:]])
            )
            self.events.setdefault(ch, []).append(("d", self.next_id))
            self.next_id += 1
        return self

    def barrier(
        self,
        ch: int,
        n: int,
        ts: int = 0,
        unaligned: bool = False,
        savepoint: bool = False,
        final: bool = False,
    ) -> Stream:
        kind = SnapshotType.SAVEPOINT if savepoint else SnapshotType.CHECKPOINT
        b = CheckpointBarrier(n, ts, snapshot_type=kind, unaligned=unaligned, final=final)
        self.rows.append({"v": None} | barrier_row_values(b, ch, self._count(ch)))
        self.events.setdefault(ch, []).append(("b", n))
        return self

    def cancel(self, ch: int, n: int) -> Stream:
        m = CancelCheckpointMarker(n)
        self.rows.append({"v": None} | barrier_row_values(m, ch, self._count(ch)))
        self.events.setdefault(ch, []).append(("c", n))
        return self

    def mark(self) -> int:
        return len(self.rows)

    def table(self, start: int = 0, end: int | None = None) -> pa.Table:
        return pa.Table.from_pylist(self.rows[start:end], schema=SCHEMA)

    # -- oracle -----------------------------------------------------------------------------

    def ids(self, ch: int) -> list[int]:
        return [x for kind, x in self.events.get(ch, []) if kind == "d"]

    def before(self, ch: int, n: int) -> list[int]:
        """Data ids on *ch* before its barrier *n* (all of them if it has none: it ended)."""
        out: list[int] = []
        for kind, x in self.events.get(ch, []):
            if kind == "b" and x == n:
                return out
            if kind == "d":
                out.append(x)
        return out


def data_ids(steps: Sequence[Step]) -> list[int]:
    return [v for s in steps if isinstance(s, Records) for v in s.table.column("v").to_pylist()]


def state_of(a: BarrierAligner) -> AlignerState:
    """``a.state``, read through a call so that type checkers do not narrow it across steps."""
    return a.state


def kinds(steps: Sequence[Step]) -> list[str]:
    return [type(s).__name__ for s in steps]


# --- the operator model: consumes steps, checks them against the oracle ---------------------


class Harness:
    """Plays the task: feeds steps to a model operator (a list of processed rows) and checks
    every Snapshot/Complete against the oracle of *stream* once the stream is known."""

    def __init__(self, aligner: BarrierAligner) -> None:
        self.aligner = aligner
        self.processed: list[tuple[int, int, int]] = []  # (id, channel, offset)
        self.snapshots: dict[int, tuple[Snapshot, Counter[int]]] = {}
        self.completes: dict[int, Complete] = {}
        self.aborts: dict[int, Abort] = {}
        self.terminal: set[int] = set()

    def take(self, steps: list[Step]) -> list[Step]:
        for s in steps:
            if isinstance(s, Records):
                t = s.table
                assert t.num_rows > 0
                assert t.column_names == ["v", CHANNEL, OFFSET]
                self.processed.extend(
                    zip(
                        t.column("v").to_pylist(),
                        t.column(CHANNEL).to_pylist(),
                        t.column(OFFSET).to_pylist(),
                        strict=True,
                    )
                )
            elif isinstance(s, Snapshot):
                n = s.checkpoint_id
                assert n not in self.snapshots and n not in self.terminal
                self.snapshots[n] = (s, Counter(v for v, _, _ in self.processed))
            elif isinstance(s, Complete):
                n = s.checkpoint_id
                assert n in self.snapshots and n not in self.terminal
                self.completes[n] = s
                self.terminal.add(n)
            else:
                assert isinstance(s, Abort)
                assert s.checkpoint_id not in self.terminal
                self.aborts[s.checkpoint_id] = s
                self.terminal.add(s.checkpoint_id)
        # adjacent Records are always merged
        for a, b in itertools.pairwise(steps):
            assert not (isinstance(a, Records) and isinstance(b, Records))
        return steps

    def check(self, stream: Stream, mode: AlignmentMode, finished: bool) -> None:
        channels = self.aligner.channels
        # per-channel order of processed rows is the channel order, without gaps
        for ch in channels:
            offs = [o for _, c, o in self.processed if c == ch]
            assert offs == list(range(len(offs)))
            assert [v for v, c, _ in self.processed if c == ch] == stream.ids(ch)[: len(offs)]
        ids = [v for v, _, _ in self.processed]
        assert len(ids) == len(set(ids)), "a row was emitted twice"
        if finished:
            assert sorted(ids) == sorted(x for ch in channels for x in stream.ids(ch))
            assert self.aligner.pending_checkpoint is None
            assert set(self.snapshots) <= self.terminal
        for n, done in self.completes.items():
            snap, state = self.snapshots[n]
            expected = Counter(x for ch in channels for x in stream.before(ch, n))
            assert dict(done.barrier_offsets) == {ch: len(stream.before(ch, n)) for ch in channels}
            if mode is ALO:
                assert not snap.unaligned and not done.channel_state
                assert not (expected - state), "at-least-once snapshot misses pre-barrier rows"
            elif not snap.unaligned:
                assert not done.channel_state
                assert state == expected
            else:
                in_flight: Counter[int] = Counter()
                for ch, t in done.channel_state.items():
                    assert t.column_names == ["v", CHANNEL, OFFSET]
                    assert set(t.column(CHANNEL).to_pylist()) == {ch}
                    got = t.column("v").to_pylist()
                    pre = stream.before(ch, n)
                    assert got == pre[len(pre) - len(got) :]  # a suffix, in channel order
                    in_flight.update(got)
                assert state + in_flight == expected
                assert not (state & in_flight)


def run(
    stream: Stream,
    channels: Sequence[int],
    mode: AlignmentMode,
    cuts: Sequence[int] = (),
    timeout: int = 0,
    clock: ManualClock | None = None,
) -> tuple[Harness, list[list[Step]]]:
    clock = clock or ManualClock()
    h = Harness(BarrierAligner(channels, mode, clock, timeout))
    bounds = [0, *sorted(cuts), len(stream.rows)]
    outs = [h.take(h.aligner.process(stream.table(a, b))) for a, b in itertools.pairwise(bounds)]
    return h, outs


# --- basics ----------------------------------------------------------------------------------


def test_no_barriers_is_one_records_step_with_control_columns_dropped() -> None:
    s = Stream().data(0, 3).data(1, 2).data(0, 1)
    h, [out] = run(s, [0, 1], ALIGNED)
    assert kinds(out) == ["Records"]
    assert data_ids(out) == list(range(6))
    assert h.aligner.state is AlignerState.IDLE


def test_record_batch_input_is_accepted() -> None:
    s = Stream().data(0, 2).barrier(0, 1)
    a = BarrierAligner([0], ALIGNED, ManualClock())
    out = a.process(s.table().to_batches()[0])
    assert kinds(out) == ["Records", "Snapshot", "Complete"]


def test_single_channel_snapshots_at_the_barrier() -> None:
    s = Stream().data(0, 2).barrier(0, 1, ts=0).data(0, 3).barrier(0, 2).data(0, 1)
    clock = ManualClock(5)
    h, [out] = run(s, [0], ALIGNED, clock=clock)
    assert kinds(out) == [
        "Records",
        "Snapshot",
        "Complete",
        "Records",
        "Snapshot",
        "Complete",
        "Records",
    ]
    assert data_ids(out[:1]) == [0, 1]
    snap = out[1]
    assert isinstance(snap, Snapshot)
    assert (snap.unaligned, snap.alignment_ms, snap.start_delay_ms) == (False, 0, 5)
    assert out[2] == Complete(1, {}, {0: 2})
    h.check(s, ALIGNED, finished=False)


def test_aligned_blocks_early_channel_until_last_barrier() -> None:
    s = Stream().data(0, 2).data(1, 1).barrier(0, 1).data(0, 3).data(1, 2)
    m = s.mark()
    s.barrier(1, 1).data(1, 1).data(0, 1)
    clock = ManualClock(100)
    a = BarrierAligner([0, 1], ALIGNED, clock)
    h = Harness(a)
    out1 = h.take(a.process(s.table(0, m)))
    assert kinds(out1) == ["Records"]
    assert data_ids(out1) == [0, 1, 2, 6, 7]  # channel 0's rows after its barrier held back
    assert a.state is AlignerState.ALIGNING
    assert a.pending_checkpoint == 1
    assert a.blocked_channels == {0}
    assert a.buffered_rows == 3 and a.buffered_bytes > 0
    clock.advance(7)
    out2 = h.take(a.process(s.table(m)))
    assert kinds(out2) == ["Snapshot", "Complete", "Records"]
    snap, done = out2[0], out2[1]
    assert isinstance(snap, Snapshot) and isinstance(done, Complete)
    assert (snap.unaligned, snap.alignment_ms, snap.start_delay_ms) == (False, 7, 100)
    assert dict(done.barrier_offsets) == {0: 2, 1: 3}
    assert sorted(data_ids(out2)) == [3, 4, 5, 8, 9]
    assert state_of(a) is AlignerState.IDLE and a.buffered_rows == 0 and not a.blocked_channels
    h.check(s, ALIGNED, finished=False)


def test_released_buffer_with_next_barrier_is_processed_again() -> None:
    # channel 0 runs two checkpoints ahead; its barrier 2 sits in the buffer of checkpoint 1
    s = Stream().data(0, 1).barrier(0, 1).data(0, 1).barrier(0, 2).data(0, 1).data(1, 1)
    s.barrier(1, 1).data(1, 1)
    m = s.mark()
    s.barrier(1, 2).data(1, 1)
    a = BarrierAligner([0, 1], ALIGNED, ManualClock())
    h = Harness(a)
    out = h.take(a.process(s.table(0, m)))
    assert kinds(out) == ["Records", "Snapshot", "Complete", "Records"]
    assert a.pending_checkpoint == 2 and a.blocked_channels == {0}
    assert a.buffered_rows == 1  # channel 0's row after barrier 2
    out = h.take(a.process(s.table(m)))
    assert kinds(out) == ["Snapshot", "Complete", "Records"]
    h.check(s, ALIGNED, finished=False)
    assert set(h.completes) == {1, 2}


def test_unaligned_snapshots_at_first_barrier_and_collects_channel_state() -> None:
    s = Stream().data(0, 2).data(1, 2).barrier(0, 1).data(0, 2).data(1, 3).data(2, 1)
    s.barrier(2, 1).data(1, 1).barrier(1, 1).data(1, 1)
    h, [out] = run(s, [0, 1, 2], UNALIGNED)
    assert kinds(out) == ["Records", "Snapshot", "Records", "Complete", "Records"]
    snap, done = out[1], out[3]
    assert isinstance(snap, Snapshot) and isinstance(done, Complete)
    assert snap.unaligned and snap.alignment_ms == 0
    # rows of channels 1 and 2 after the snapshot and before their barrier are channel state
    assert {ch: t.column("v").to_pylist() for ch, t in done.channel_state.items()} == {
        1: [6, 7, 8, 10],
        2: [9],
    }
    assert dict(done.barrier_offsets) == {0: 2, 1: 6, 2: 1}
    h.check(s, UNALIGNED, finished=False)


def test_at_least_once_snapshot_includes_post_barrier_rows() -> None:
    s = Stream().data(0, 1).data(1, 1).barrier(0, 1).data(0, 2).barrier(1, 1).data(1, 1)
    h, [out] = run(s, [0, 1], ALO)
    assert kinds(out) == ["Records", "Snapshot", "Complete", "Records"]
    assert h.snapshots[1][1] == Counter([0, 1, 2, 3])  # 2, 3 are after channel 0's barrier
    h.check(s, ALO, finished=False)


def test_at_least_once_tracks_concurrent_checkpoints() -> None:
    s = Stream().barrier(0, 1).data(0, 1).barrier(0, 2).data(0, 1).barrier(0, 3)
    a = BarrierAligner([0, 1], ALO, ManualClock())
    h = Harness(a)
    h.take(a.process(s.table()))
    assert a.pending_checkpoints == (1, 2, 3) and a.state is AlignerState.TRACKING
    m = s.mark()
    s.data(1, 1).barrier(1, 1).barrier(1, 3)  # channel 1 skips barrier 2
    out = h.take(a.process(s.table(m)))
    assert kinds(out) == ["Records", "Snapshot", "Complete", "Snapshot", "Complete", "Abort"]
    abort = out[-1]
    assert isinstance(abort, Abort) and abort.checkpoint_id == 2
    assert abort.reason is AbortReason.SUBSUMED
    h.check(s, ALO, finished=False)


# --- timeouts, flags, aborts -----------------------------------------------------------------


def test_aligned_timeout_switches_to_unaligned_on_tick() -> None:
    s = Stream().data(0, 1).data(1, 1).barrier(0, 1, ts=1000).data(0, 2).data(1, 1)
    m = s.mark()
    s.data(1, 2).barrier(1, 1, ts=1000).data(0, 1)
    clock = ManualClock(1010)
    a = BarrierAligner([0, 1], ALIGNED, clock, aligned_timeout_ms=50)
    h = Harness(a)
    h.take(a.process(s.table(0, m)))
    assert a.state is AlignerState.ALIGNING and a.buffered_rows == 2
    clock.set(1049)
    assert a.tick() == []
    clock.set(1050)
    out = h.take(a.tick())
    assert kinds(out) == ["Snapshot", "Records"]
    snap = out[0]
    assert isinstance(snap, Snapshot)
    assert (snap.unaligned, snap.alignment_ms, snap.start_delay_ms) == (True, 40, 10)
    assert data_ids(out) == [2, 3]  # released post-barrier rows: processed, not channel state
    assert state_of(a) is AlignerState.UNALIGNED_COLLECTING and a.buffered_rows == 0
    out = h.take(a.process(s.table(m)))
    assert kinds(out) == ["Records", "Complete", "Records"]
    done = out[1]
    assert isinstance(done, Complete)
    assert {ch: t.column("v").to_pylist() for ch, t in done.channel_state.items()} == {1: [5, 6]}
    h.check(s, ALIGNED, finished=False)


def test_aligned_timeout_already_expired_at_first_barrier_goes_unaligned() -> None:
    s = Stream().data(0, 1).barrier(0, 1, ts=0).data(1, 1).barrier(1, 1)
    h, [out] = run(s, [0, 1], ALIGNED, timeout=10, clock=ManualClock(10))
    assert kinds(out) == ["Records", "Snapshot", "Records", "Complete"]
    assert isinstance(out[1], Snapshot) and out[1].unaligned
    h.check(s, ALIGNED, finished=False)


def test_barrier_with_unaligned_flag_is_unaligned_in_aligned_mode() -> None:
    s = Stream().barrier(0, 1, unaligned=True).data(0, 1).data(1, 1).barrier(1, 1, unaligned=True)
    h, [out] = run(s, [0, 1], ALIGNED)
    assert kinds(out) == ["Snapshot", "Records", "Complete"]
    done = out[2]
    assert isinstance(done, Complete) and list(done.channel_state) == [1]
    h.check(s, ALIGNED, finished=False)


@pytest.mark.parametrize("timeout", [0, 1000])
def test_an_unaligned_barrier_switches_the_aligning_checkpoint_to_unaligned(timeout: int) -> None:
    # Flink's AlternatingCheckpointsTest.testTimeoutAlignmentOnUnalignedCheckpoint: channel 0
    # is aligned and blocked; channel 1's barrier of the same checkpoint comes unaligned
    s = Stream().data(0, 1).barrier(0, 1).data(0, 2).data(1, 1).data(2, 1)
    s.barrier(1, 1, unaligned=True).data(2, 2).barrier(2, 1).data(1, 1)
    m = s.mark()
    clock = ManualClock(5)
    h = Harness(BarrierAligner([0, 1, 2], ALIGNED, clock, timeout))
    out = h.take(h.aligner.process(s.table(0, 6)))
    assert kinds(out) == ["Records"] and h.aligner.buffered_rows == 2
    clock.advance(7)
    out = h.take(h.aligner.process(s.table(6, m)))
    assert kinds(out) == ["Snapshot", "Records", "Complete", "Records"]
    snap, done = out[0], out[2]
    assert isinstance(snap, Snapshot) and snap.unaligned and snap.alignment_ms == 7
    assert isinstance(done, Complete)
    # the blocked channel's rows are processed, not channel state; channel 2's are both
    assert {ch: t.column("v").to_pylist() for ch, t in done.channel_state.items()} == {2: [5, 6]}
    h.check(s, ALIGNED, finished=False)


def test_an_unaligned_barrier_does_not_switch_a_savepoint() -> None:
    s = Stream().barrier(0, 1, savepoint=True).data(0, 1).data(1, 1)
    s.barrier(1, 1, savepoint=True, unaligned=True)
    h, [out] = run(s, [0, 1], ALIGNED, timeout=10)
    assert kinds(out) == ["Records", "Snapshot", "Complete", "Records"]
    snap = out[1]
    assert isinstance(snap, Snapshot) and not snap.unaligned
    h.check(s, ALIGNED, finished=False)


@pytest.mark.parametrize(("mode", "timeout"), [(UNALIGNED, 0), (ALIGNED, 10)])
def test_savepoints_are_always_aligned(mode: AlignmentMode, timeout: int) -> None:
    s = Stream().data(0, 1).barrier(0, 1, ts=0, savepoint=True).data(0, 2).data(1, 1)
    m = s.mark()
    s.barrier(1, 1, ts=0, savepoint=True).data(1, 1)
    clock = ManualClock()
    a = BarrierAligner([0, 1], mode, clock, timeout)
    h = Harness(a)
    out = h.take(a.process(s.table(0, m)))
    assert kinds(out) == ["Records"] and a.blocked_channels == {0}
    clock.advance(100)  # far beyond the aligned timeout: a savepoint still waits
    assert a.tick() == [] and a.state is AlignerState.ALIGNING
    out = h.take(a.process(s.table(m)))
    assert kinds(out) == ["Snapshot", "Complete", "Records"]
    snap = out[0]
    assert isinstance(snap, Snapshot) and not snap.unaligned and snap.barrier.is_savepoint
    assert snap.alignment_ms == 100
    h.check(s, mode, finished=False)


@pytest.mark.parametrize(("mode", "timeout"), [(UNALIGNED, 0), (ALIGNED, 10)])
def test_final_checkpoints_are_always_aligned(mode: AlignmentMode, timeout: int) -> None:
    """The checkpoint ending a run must leave no channel state: rows in flight at an unaligned
    snapshot would produce output no later checkpoint commits."""
    s = Stream().data(0, 1).barrier(0, 1, final=True).data(0, 2).data(1, 1)
    m = s.mark()
    s.barrier(1, 1, final=True).data(1, 1)
    clock = ManualClock()
    a = BarrierAligner([0, 1], mode, clock, timeout)
    h = Harness(a)
    out = h.take(a.process(s.table(0, m)))
    assert kinds(out) == ["Records"] and a.blocked_channels == {0}
    clock.advance(100)
    assert a.tick() == [] and a.state is AlignerState.ALIGNING
    out = h.take(a.process(s.table(m)))
    assert kinds(out) == ["Snapshot", "Complete", "Records"]
    done = out[1]
    assert isinstance(done, Complete) and not done.channel_state
    h.check(s, mode, finished=False)


def test_empty_input_and_tick_while_idle_do_nothing() -> None:
    a = BarrierAligner([0, 1], ALIGNED, ManualClock(), aligned_timeout_ms=5)
    assert a.process(Stream().table()) == []
    assert a.tick() == []
    assert a.state is AlignerState.IDLE and a.pending_checkpoint is None


def test_rows_split_across_chunks_are_handled() -> None:
    s = Stream().data(0, 2).data(1, 1).barrier(0, 1).data(0, 1).data(1, 2).barrier(1, 1)
    s.data(0, 1)
    t = pa.concat_tables([s.table(0, 4), s.table(4, 6), s.table(6)])
    assert t.column(CHANNEL).num_chunks == 3
    a = BarrierAligner([0, 1], ALIGNED, ManualClock())
    h = Harness(a)
    out = h.take(a.process(t))
    assert kinds(out) == ["Records", "Snapshot", "Complete", "Records"]
    h.check(s, ALIGNED, finished=False)


def test_newer_barrier_subsumes_pending_and_late_barrier_is_ignored() -> None:
    s = Stream().barrier(0, 1).data(0, 2).barrier(0, 2).data(0, 1).data(1, 1)
    m1 = s.mark()
    s.data(2, 1).barrier(2, 2)
    m2 = s.mark()
    s.barrier(1, 1).data(1, 1).barrier(1, 2)
    a = BarrierAligner([0, 1, 2], ALIGNED, ManualClock())
    h = Harness(a)
    out = h.take(a.process(s.table(0, m1)))
    assert kinds(out) == ["Records"] and data_ids(out) == [3]
    assert a.pending_checkpoint == 1 and a.blocked_channels == {0} and a.buffered_rows == 4
    # channel 2 delivers barrier 2 first: 1 is subsumed, channel 0's buffer replays (its
    # barrier 2 blocks it again for checkpoint 2)
    out = h.take(a.process(s.table(m1, m2)))
    assert kinds(out) == ["Records", "Abort", "Records"]
    assert (h.aborts[1].reason, data_ids(out)) == (AbortReason.SUBSUMED, [4, 0, 1])
    assert a.pending_checkpoint == 2 and a.blocked_channels == {0, 2} and a.buffered_rows == 1
    # channel 1's barrier 1 is late (aborted): ignored
    out = h.take(a.process(s.table(m2)))
    assert kinds(out) == ["Records", "Snapshot", "Complete", "Records"]
    h.check(s, ALIGNED, finished=False)
    # every channel has passed checkpoint 1 now: a barrier 1 again is a protocol error
    with pytest.raises(ProtocolError):
        a.process(Stream().barrier(2, 1).table())


def test_late_barrier_of_aborted_checkpoint_is_ignored() -> None:
    s = Stream().barrier(0, 1).data(0, 1).barrier(0, 2).data(1, 1).barrier(1, 1).barrier(1, 2)
    h, [out] = run(s, [0, 1], UNALIGNED)
    assert kinds(out) == ["Snapshot", "Records", "Abort", "Snapshot", "Records", "Complete"]
    assert set(h.completes) == {2} and h.aborts[1].reason is AbortReason.SUBSUMED
    h.check(s, UNALIGNED, finished=False)


def test_cancel_marker_aborts_pending_and_releases_buffer() -> None:
    s = Stream().barrier(0, 1).data(0, 2).data(1, 1).cancel(1, 1).barrier(1, 1).data(1, 1)
    h, [out] = run(s, [0, 1], ALIGNED)
    assert kinds(out) == ["Records", "Abort", "Records"]
    assert h.aborts[1].reason is AbortReason.CANCELLED
    assert sorted(data_ids(out)) == [0, 1, 2, 3]
    h.check(s, ALIGNED, finished=False)


def test_cancel_of_future_checkpoint_is_reported_once_and_its_barriers_ignored() -> None:
    s = Stream().cancel(0, 3).cancel(1, 3).barrier(0, 3).data(0, 1).barrier(0, 4).barrier(1, 3)
    s.data(1, 1).barrier(1, 4)
    h, [out] = run(s, [0, 1], ALIGNED)
    assert kinds(out) == ["Abort", "Records", "Snapshot", "Complete"]
    assert h.aborts[3].reason is AbortReason.CANCELLED
    assert set(h.completes) == {4}
    h.check(s, ALIGNED, finished=False)


def test_repeated_cancel_is_reported_once_even_after_its_barrier_passed() -> None:
    s = Stream().cancel(0, 1).barrier(0, 1).data(0, 1).cancel(0, 1).barrier(0, 2)
    h, [out] = run(s, [0], ALIGNED)
    assert kinds(out) == ["Abort", "Records", "Snapshot", "Complete"]
    assert set(h.aborts) == {1} and set(h.completes) == {2}


def test_at_least_once_bounds_tracked_checkpoints() -> None:
    s = Stream()
    for n in range(1, MAX_TRACKED_CHECKPOINTS + 3):
        s.barrier(0, n)
    a = BarrierAligner([0, 1], ALO, ManualClock())
    out = a.process(s.table())
    assert [x.checkpoint_id for x in out if isinstance(x, Abort)] == [1, 2]
    assert a.pending_checkpoints == tuple(range(3, MAX_TRACKED_CHECKPOINTS + 3))


def test_coordinator_abort_releases_and_remembers_future_ids() -> None:
    s = Stream().barrier(0, 1).data(0, 2).data(1, 1)
    a = BarrierAligner([0, 1], ALIGNED, ManualClock())
    h = Harness(a)
    h.take(a.process(s.table()))
    assert a.buffered_rows == 2
    out = h.take(a.abort(1))
    assert kinds(out) == ["Abort", "Records"] and data_ids(out) == [0, 1]
    assert h.aborts[1].reason is AbortReason.COORDINATOR
    assert a.abort(1) == [] and a.abort(5) == []
    m = s.mark()
    s.barrier(1, 1).barrier(0, 5).barrier(1, 5).data(0, 1)  # 1 and 5 are ignored
    out = h.take(a.process(s.table(m)))
    assert kinds(out) == ["Records"] and a.state is AlignerState.IDLE


# --- end of input ----------------------------------------------------------------------------


def test_end_of_input_completes_pending_checkpoint() -> None:
    s = Stream().data(1, 2).barrier(0, 1).data(0, 1)
    a = BarrierAligner([0, 1], ALIGNED, ManualClock())
    h = Harness(a)
    h.take(a.process(s.table()))
    out = h.take(a.end_of_input(1, 2))
    assert kinds(out) == ["Snapshot", "Complete", "Records"]
    assert h.completes[1].barrier_offsets == {0: 0, 1: 2}
    assert a.ended_channels == {1}
    with pytest.raises(ProtocolError, match="ended"):
        a.process(Stream().data(0, 1).data(1, 1).table())


def test_end_of_input_of_blocked_channel_waits_for_its_buffer() -> None:
    s = Stream().barrier(0, 1).data(0, 2).barrier(0, 2).data(0, 1)
    a = BarrierAligner([0, 1], ALIGNED, ManualClock())
    h = Harness(a)
    h.take(a.process(s.table()))
    assert h.take(a.end_of_input(0, 3)) == []  # queued behind channel 0's buffered rows
    assert a.ended_channels == frozenset()
    out = h.take(a.end_of_input(1, 0))
    # 1 completes, buffer replays, 2 completes (channel 1 ended), then channel 0 ends
    assert kinds(out) == ["Snapshot", "Complete", "Records", "Snapshot", "Complete", "Records"]
    assert a.state is AlignerState.FINISHED
    h.check(s, ALIGNED, finished=True)


# --- protocol errors -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [ALIGNED, UNALIGNED, ALO])
@pytest.mark.parametrize(
    ("build", "match"),
    [
        # (in aligned mode the second barrier is buffered and fails when channel 1 releases it)
        (lambda s: s.barrier(0, 1).barrier(0, 1).barrier(1, 1), "after barrier 1"),
        (lambda s: s.barrier(0, 2).data(0, 1).barrier(0, 1).barrier(1, 2), "after barrier 2"),
        (lambda s: s.barrier(5, 1), "unknown"),
        (lambda s: s.data(7, 1), "unknown"),
        (lambda s: s.data(0, 1).data(-1, 1), "unknown"),
    ],
)
def test_protocol_errors(mode: AlignmentMode, build: Any, match: str) -> None:
    a = BarrierAligner([0, 1], mode, ManualClock())
    with pytest.raises(ProtocolError, match=match):
        a.process(build(Stream()).table())
    assert a.state is AlignerState.FAILED
    with pytest.raises(ProtocolError, match="failed"):
        a.tick()


def test_duplicate_barrier_in_later_batch_is_a_protocol_error() -> None:
    a = BarrierAligner([0, 1], UNALIGNED, ManualClock())
    a.process(Stream().barrier(0, 1).table())
    with pytest.raises(ProtocolError):
        a.process(Stream().barrier(0, 1).table())


def test_schema_errors() -> None:
    a = BarrierAligner([0], ALIGNED, ManualClock())
    with pytest.raises(ProtocolError, match="lacks"):
        a.process(pa.table({"v": [1]}))
    b = BarrierAligner([0], ALIGNED, ManualClock())
    b.process(Stream().data(0, 1).table())
    with pytest.raises(ProtocolError, match="schema changed"):
        b.process(Stream().data(0, 1).table().drop_columns(["v"]))


def test_data_row_with_checkpoint_id_is_a_protocol_error() -> None:
    s = Stream().data(0, 1)
    s.rows[0]["_ckpt_checkpoint_id"] = 3
    with pytest.raises(ProtocolError, match="data row"):
        BarrierAligner([0], ALIGNED, ManualClock()).process(s.table())


def test_config_errors() -> None:
    with pytest.raises(ConfigError):
        BarrierAligner([], ALIGNED, ManualClock())
    with pytest.raises(ConfigError):
        BarrierAligner([0, 0], ALIGNED, ManualClock())
    with pytest.raises(ConfigError):
        BarrierAligner([0], UNALIGNED, ManualClock(), aligned_timeout_ms=5)
    with pytest.raises(ConfigError):
        BarrierAligner([0], ALIGNED, ManualClock(), aligned_timeout_ms=-1)


# --- one channel lagging three input batches behind ------------------------------------------


def lagging_stream() -> tuple[Stream, list[int]]:
    """Channels 0 and 1 deliver barrier 1 in batch 1; channel 2 only in batch 4."""
    s = Stream()
    cuts = []
    s.data(0, 2).data(1, 2).data(2, 2).barrier(0, 1, ts=0).barrier(1, 1, ts=0)
    for _ in range(3):
        s.data(0, 3).data(2, 2).data(1, 3)
        cuts.append(s.mark())
    s.data(2, 1).barrier(2, 1, ts=0).data(2, 1).data(0, 1)
    return s, cuts


@pytest.mark.parametrize(("mode", "timeout"), [(ALIGNED, 0), (UNALIGNED, 0), (ALIGNED, 25)])
def test_channel_lagging_three_batches(mode: AlignmentMode, timeout: int) -> None:
    s, cuts = lagging_stream()
    clock = ManualClock()
    a = BarrierAligner([0, 1, 2], mode, clock, timeout)
    h = Harness(a)
    bounds = [0, *cuts, len(s.rows)]
    outs = []
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        outs.append(h.take(a.process(s.table(lo, hi))))
        if i < 3:
            assert a.pending_checkpoint == 1
        clock.advance(10)
    assert list(h.completes) == [1]
    snap = h.snapshots[1][0]
    done = h.completes[1]
    pre_lag = set(s.before(2, 1))
    if mode is ALIGNED and timeout == 0:
        # channels 0 and 1 stay blocked for three batches; nothing of theirs is emitted
        assert not snap.unaligned and snap.alignment_ms == 30
        assert all(set(data_ids(o)) <= pre_lag | {0, 1, 2, 3} for o in outs[:3])
        assert not done.channel_state
    elif mode is UNALIGNED:
        assert snap.unaligned and kinds(outs[0])[:2] == ["Records", "Snapshot"]
        assert set(done.channel_state) == {2}
        assert done.channel_state[2].num_rows == 7  # 3 x 2 rows + 1, all after the snapshot
    else:
        # the timeout (25 ms after the barrier timestamp) hits before batch 4 (clock = 30)
        assert snap.unaligned and snap.alignment_ms == 30
        assert kinds(outs[3])[0] == "Snapshot"
        assert done.channel_state[2].num_rows == 1
    assert dict(done.barrier_offsets) == {0: 2, 1: 2, 2: 9}
    for ch in (0, 1, 2):
        h.take(a.end_of_input(ch, len(s.ids(ch))))
    h.check(s, mode, finished=True)


# --- property test over random interleavings -------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    mode = draw(st.sampled_from([ALIGNED, UNALIGNED, ALO]))
    n_channels = draw(st.integers(1, 4))
    n_ckpts = draw(st.integers(0, 4))
    full = draw(st.booleans())  # every channel carries every barrier, no cancels
    unaligned_ids = (
        draw(st.sets(st.integers(1, n_ckpts)))
        if mode is ALIGNED and n_ckpts and not full
        else set()
    )
    # the channels whose barrier of such a checkpoint carries the flag: all of them, or
    # some (an input that timed out: the rest switches the aligning checkpoint over)
    unaligned_on = {
        (c, n)
        for n in unaligned_ids
        for c in draw(st.sets(st.integers(0, n_channels - 1), min_size=1))
    }
    per_channel: list[list[tuple[str, int]]] = []
    for _ in range(n_channels):
        evs: list[tuple[str, int]] = [("d", 0)] * draw(st.integers(0, 4))
        for n in range(1, n_ckpts + 1):
            if not full and draw(st.integers(0, 9)) == 0:
                evs.append(("c", draw(st.integers(1, n_ckpts + 1))))
            if full or draw(st.integers(0, 5)) > 0:
                evs.append(("b", n))
            evs.extend([("d", 0)] * draw(st.integers(0, 4)))
        per_channel.append(evs)
    order = draw(st.permutations([c for c, evs in enumerate(per_channel) for _ in evs]))
    total = len(order)
    cuts = sorted(draw(st.sets(st.integers(1, max(1, total - 1)), max_size=5))) if total else []
    advances = draw(st.lists(st.integers(0, 30), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    timeout = draw(st.sampled_from([0, 0, 1, 20, 50])) if mode is ALIGNED else 0
    ticks = draw(st.lists(st.booleans(), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    coord_aborts = [
        False if full else x
        for x in draw(st.lists(st.booleans(), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    ]
    end_order = draw(st.permutations(list(range(n_channels))))
    return {
        "mode": mode,
        "per_channel": per_channel,
        "order": order,
        "cuts": cuts,
        "advances": advances,
        "timeout": timeout,
        "ticks": ticks,
        "coord_aborts": coord_aborts,
        "unaligned_on": unaligned_on,
        "full": full,
        "end_order": end_order,
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_interleavings_against_oracle(sc: dict[str, Any]) -> None:
    mode: AlignmentMode = sc["mode"]
    per_channel = sc["per_channel"]
    # channel ids need not start at 0 nor be contiguous
    ids = [0, 1, 3, 4][: len(per_channel)]
    s = Stream()
    cursor = [0] * len(per_channel)
    for c in sc["order"]:
        kind, n = per_channel[c][cursor[c]]
        cursor[c] += 1
        if kind == "d":
            s.data(ids[c])
        elif kind == "b":
            s.barrier(ids[c], n, ts=10 * n, unaligned=(c, n) in sc["unaligned_on"])
        else:
            s.cancel(ids[c], n)
    clock = ManualClock()
    a = BarrierAligner(ids, mode, clock, sc["timeout"])
    h = Harness(a)
    bounds = [0, *sc["cuts"], len(s.rows)]
    for (lo, hi), adv, tick, coord in zip(
        itertools.pairwise(bounds),
        sc["advances"],
        sc["ticks"],
        sc["coord_aborts"],
        strict=True,
    ):
        clock.advance(adv)
        if tick:
            h.take(a.tick())
        if coord and a.pending_checkpoint is not None:
            h.take(a.abort(a.pending_checkpoint))
        if hi > lo:
            h.take(a.process(s.table(lo, hi)))
        assert a.state in set(AlignerState) - {AlignerState.FAILED, AlignerState.FINISHED}
        if mode is not ALIGNED:
            assert a.buffered_rows == 0
        h.check(s, mode, finished=False)
    for ch in sc["end_order"]:
        h.take(a.end_of_input(ids[ch], len(s.ids(ids[ch]))))
    assert a.state is AlignerState.FINISHED
    h.check(s, mode, finished=True)
    for snap, _ in h.snapshots.values():
        event(f"{mode.value} snapshot unaligned={snap.unaligned}")
    for ab in h.aborts.values():
        event(f"{mode.value} abort {ab.reason.value}")
    if any(c.channel_state for c in h.completes.values()):
        event(f"{mode.value} channel state")
    n_ckpts = max((n for evs in per_channel for k, n in evs if k == "b"), default=0)
    if sc["full"] and (mode is ALO or sc["timeout"] == 0) and mode is not UNALIGNED:
        # no cancels, every barrier everywhere, nothing unaligned: blocking (aligned) or
        # tracking (at-least-once) completes every checkpoint, none is subsumed
        assert set(h.completes) == set(range(1, n_ckpts + 1))
        assert not h.aborts
        assert all(not snap.unaligned for snap, _ in h.snapshots.values())


# --- the handler's lifecycle as state objects (spark_ckpt.runtime.alignment) ----------------


class _Handlers:
    """A barrier handler with its context, driven directly (events admitted by the ledger)."""

    def __init__(self, mode: AlignmentMode, timeout: int = 0, channels: int = 2) -> None:
        self.clock = ManualClock()
        chans = tuple(range(channels))
        self.ctx = AlignmentContext(
            chans, self.clock, BarrierLedger(chans), ChannelBuffer(), StepOutput()
        )
        self.handler = create_barrier_handler(mode, self.ctx, timeout)

    @property
    def state(self) -> BarrierHandlerState:
        assert isinstance(self.handler, SingleCheckpointBarrierHandler)
        return self.handler.state

    def kind(self) -> type[BarrierHandlerState]:
        """The current state's class, read through a call so that mypy does not narrow it."""
        return type(self.state)

    def barrier(self, ch: int, n: int, ts: int = 0, **flags: Any) -> list[Step]:
        b = CheckpointBarrier(n, ts, **flags)
        if self.ctx.ledger.admit_barrier(ch, n):
            self.handler.barrier_received(ch, 0, b)
        return self.ctx.output.take()


def test_aligned_with_timeout_states_alternate() -> None:
    h = _Handlers(ALIGNED, timeout=10)
    idle = h.state
    assert type(idle) is AlternatingWaitingForFirstBarrier and idle.phase is AlignerState.IDLE
    assert h.barrier(0, 1) == []
    assert h.kind() is AlternatingCollectingBarriers and h.handler.blocked_channels == {0}
    h.clock.advance(10)
    h.handler.check_timeout()
    assert kinds(h.ctx.output.take()) == ["Snapshot"]
    assert h.kind() is CollectingBarriersUnaligned and not h.handler.blocked_channels
    assert kinds(h.barrier(1, 1)) == ["Complete"]
    assert h.state is idle  # every collecting state returns to the idle state it came from
    assert kinds(h.barrier(0, 2, ts=10, snapshot_type=SnapshotType.SAVEPOINT)) == []
    assert h.kind() is CollectingBarriers  # savepoints: plain, no timeout
    h.clock.advance(100)
    h.handler.check_timeout()
    assert h.kind() is CollectingBarriers and h.ctx.output.take() == []
    assert kinds(h.barrier(1, 3, ts=110)) == ["Abort"]  # subsumed: idle receives barrier 3
    assert h.kind() is AlternatingCollectingBarriers
    assert h.handler.pending_checkpoints == (3,)


def test_unaligned_states() -> None:
    h = _Handlers(UNALIGNED)
    idle = h.state
    assert type(idle) is WaitingForFirstBarrierUnaligned
    assert kinds(h.barrier(0, 1)) == ["Snapshot"]
    assert h.kind() is CollectingBarriersUnaligned
    assert h.handler.abort(2, AbortReason.COORDINATOR, "") is False  # not the pending one
    assert h.handler.abort(1, AbortReason.COORDINATOR, "") is True
    assert kinds(h.ctx.output.take()) == ["Abort"] and h.state is idle
    assert kinds(h.barrier(0, 2, final=True)) == [] and h.kind() is CollectingBarriers
    h.handler.end_of_input(1, 0)
    assert kinds(h.ctx.output.take()) == ["Snapshot", "Complete"] and h.state is idle


def test_aligned_without_timeout_and_at_least_once_handlers() -> None:
    h = _Handlers(ALIGNED)
    assert h.kind() is WaitingForFirstBarrier
    h.barrier(0, 1)
    assert h.kind() is CollectingBarriers
    h.clock.advance(10**6)
    h.handler.check_timeout()
    assert h.kind() is CollectingBarriers
    assert kinds(h.barrier(0, 2, unaligned=True)) == ["Abort", "Snapshot"]
    assert h.kind() is CollectingBarriersUnaligned
    t = _Handlers(ALO)
    tracker = t.handler
    assert isinstance(tracker, BarrierTracker) and tracker.phase is AlignerState.IDLE
    t.barrier(0, 1)
    t.barrier(0, 2)
    assert t.handler.phase is AlignerState.TRACKING and t.handler.pending_checkpoints == (1, 2)
    assert kinds(t.barrier(1, 2)) == ["Snapshot", "Complete", "Abort"]
    assert not t.handler.pending_checkpoints

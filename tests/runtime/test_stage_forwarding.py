"""Two keyed stages as the tasks run them, without Spark: per-user running totals, then,
re-keyed by country, per-country running counts (:mod:`spark_ckpt.runtime.stage`).

Hypothesis draws the input (per micro-batch and channel, its rows), where each channel's
barrier falls inside its rows (so the first stage snapshots mid-batch and forwards rows
after its barrier), the alignment mode, a crash and the parallelism of each stage after
it. Each stage's subtasks forward to the next through
:class:`~spark_ckpt.runtime.stage_output.StageOutput` and
:func:`~spark_ckpt.runtime.stage_output.split_for_subtasks`, as both placements do. The
oracle is a plain fold over the input: the committed output holds each (country, running
count) exactly once."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt import RunningCount
from spark_ckpt.demo import COUNTRIES, UserTotals
from spark_ckpt.protocol.barrier import KIND, ChannelProgress, CheckpointBarrier, SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.protocol.state_handles import AcknowledgeCheckpoint, TaskId
from spark_ckpt.runtime.aligner import AlignmentMode
from spark_ckpt.runtime.stage_output import StageOutput, split_for_subtasks
from spark_ckpt.runtime.task import OperatorTask, commit_checkpoint, recover_sink
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.sources.channel_batch import channel_rows, stream_schema
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore

#: the last micro-batch's barriers: it reads what is left of every channel, then checkpoints
FINAL = {0: 10**6, 1: 10**6}
USERS = pa.schema([("user_id", pa.int64()), ("amount", pa.int64())])
SCHEMA = stream_schema(USERS)
CHANNELS = (0, 1)
MAX_PARALLELISM = 16
#: the second stage's own max parallelism
STAGE_MAX_PARALLELISM = 8


@dataclass
class Batch:
    """Per channel its (user, amount) rows and, with a checkpoint, where its barrier falls
    among them (0..len)."""

    rows: dict[int, list[tuple[int, int]]]
    barriers: dict[int, int] | None


@dataclass
class TwoStages:
    mode: AlignmentMode
    store: InMemoryCheckpointStore = field(default_factory=InMemoryCheckpointStore)
    sink: MemorySink = field(default_factory=MemorySink)
    first: list[OperatorTask] = field(default_factory=list)
    second: list[OperatorTask] = field(default_factory=list)
    acks: list[AcknowledgeCheckpoint] = field(default_factory=list)
    completed: CompletedCheckpoint | None = None
    batch_of: dict[int, int] = field(default_factory=dict)

    def start(self, users: int, countries: int) -> None:
        self.acks.clear()

        def task(
            vertex: str, s: int, p: int, op: object, mp: int = MAX_PARALLELISM, **more: object
        ) -> OperatorTask:
            return OperatorTask(
                TaskId(vertex, s),
                operators=[op],  # type: ignore[list-item]
                parallelism=p,
                max_parallelism=mp,
                store=self.store,
                respond=self.acks.append,  # type: ignore[arg-type]
                clock=ManualClock(0),
                mode=self.mode,
                **more,  # type: ignore[arg-type]
            )

        self.first = [
            task(
                "chain",
                s,
                users,
                UserTotals(),
                channels=list(CHANNELS),
                source_vertex="source",
                forward=StageOutput(s),
            )
            for s in range(users)
        ]
        self.second = [
            task(
                "stage:countries",
                s,
                countries,
                RunningCount("countries", "country"),
                STAGE_MAX_PARALLELISM,
                channels=list(range(users)),
                sink=self.sink,
            )
            for s in range(countries)
        ]
        recover_sink(self.sink.committer, self.completed, self.store)
        for t in [*self.first, *self.second]:
            t.restore(self.completed)

    def crash(self) -> int:
        self.sink.crash()
        cp = self.completed
        return 0 if cp is None else self.batch_of[cp.checkpoint_id] + 1

    def resume_at(self) -> dict[int, int]:
        """Where each channel resumes after a crash: the completed checkpoint's positions."""
        if self.completed is None:
            return dict.fromkeys(CHANNELS, 0)
        offsets = self.completed.offsets()
        return {c: offsets[("source", c)] for c in CHANNELS}

    def feed(
        self,
        index: int,
        batch: Batch,
        logs: dict[int, list[tuple[int, int]]],
        positions: dict[int, int],
    ) -> None:
        """Micro-batch *index*: each channel's next rows of its log (as many as *batch* has,
        all that is left in the last one), its barrier among them."""
        cid = index + 1
        pieces = []
        for channel in CHANNELS:
            start = positions[channel]
            take = (
                len(batch.rows.get(channel, [])) if batch.barriers != FINAL else len(logs[channel])
            )
            rows = logs[channel][start : start + take]
            own = pa.table(
                [pa.array([u for u, _ in rows], pa.int64()), pa.array([a for _, a in rows])],
                schema=USERS,
            )
            marks = []
            if batch.barriers is not None:
                at = start + min(batch.barriers.get(channel, 0), len(rows))
                final = batch.barriers is FINAL  # aligned, as a run's final checkpoint is
                marks = [(at, CheckpointBarrier(cid, cid, final=final))]
            progress = ChannelProgress(1000 * (index + 1))
            pieces.append(channel_rows(own, SCHEMA, channel, start, marks, progress=progress))
            positions[channel] = start + len(rows)
        table = pa.concat_tables(pieces)
        parts = split_for_subtasks(table, "user_id", MAX_PARALLELISM, len(self.first))
        for task, part in zip(self.first, parts, strict=True):
            task.process(part)
        forwarded = [t.forwarded() for t in self.first]
        channels = pa.concat_tables(
            [f for f in forwarded if f is not None], promote_options="default"
        )
        parts = split_for_subtasks(channels, "country", STAGE_MAX_PARALLELISM, len(self.second))
        for task, part in zip(self.second, parts, strict=True):
            if part.num_rows:
                task.process(part)
        tasks = len(self.first) + len(self.second)
        mine = [a for a in self.acks if a.checkpoint_id == cid]
        if batch.barriers is not None and len(mine) == tasks:
            cp = CompletedCheckpoint(
                cid,
                SnapshotType.CHECKPOINT,
                tuple(a.state for a in mine),
                CheckpointStats(cid, cid),
            )
            self.store.commit(self.store.acquire(), cp)
            commit_checkpoint(self.sink.committer, cp, self.store)
            for task in [*self.first, *self.second]:
                task.notify_complete(cid)
            self.completed = cp
            self.batch_of[cid] = index

    def output(self) -> Counter[tuple[int, int]]:
        out = self.sink.committer.output()
        if out is None:
            return Counter()
        return Counter(zip(out["country"].to_pylist(), out["count"].to_pylist(), strict=True))


@st.composite
def runs(
    draw: st.DrawFn,
) -> tuple[list[Batch], AlignmentMode, int | None, tuple[int, int], tuple[int, int]]:
    n = draw(st.integers(2, 7))
    batches = []
    for _ in range(n):
        rows = {
            c: draw(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 9)), max_size=8))
            for c in CHANNELS
        }
        checkpoint = draw(st.booleans())
        barriers = {c: draw(st.integers(0, 8)) for c in CHANNELS} if checkpoint else None
        batches.append(Batch(rows, barriers))
    batches.append(Batch({c: [] for c in CHANNELS}, FINAL))
    mode = draw(st.sampled_from([AlignmentMode.ALIGNED, AlignmentMode.UNALIGNED]))
    crash = draw(st.one_of(st.none(), st.integers(0, n - 1)))
    before = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    after = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    return batches, mode, crash, before, after


def fold(batches: list[Batch]) -> Counter[tuple[int, int]]:
    """Per country, its running counts over every input row, in channel order per channel:
    the counts' multiset does not depend on the interleaving."""
    per: Counter[int] = Counter()
    for batch in batches:
        for c in CHANNELS:
            for user, _ in batch.rows.get(c, []):
                per[user % COUNTRIES] += 1
    return Counter((country, k) for country, n in per.items() for k in range(1, n + 1))


@settings(max_examples=40, deadline=None)
@given(runs())
def test_two_stages_are_exactly_once_through_crashes_and_rescales(
    drawn: tuple[list[Batch], AlignmentMode, int | None, tuple[int, int], tuple[int, int]],
) -> None:
    batches, mode, crash, before, after = drawn
    logs = {c: [r for b in batches for r in b.rows.get(c, [])] for c in CHANNELS}
    job = TwoStages(mode)
    job.start(*before)
    positions = dict.fromkeys(CHANNELS, 0)
    index, crashed = 0, False
    while index < len(batches):
        job.feed(index, batches[index], logs, positions)
        if crash is not None and index == crash and not crashed:
            crashed = True
            index = job.crash()
            positions = job.resume_at()
            job.start(*after)
            continue
        index += 1
    assert job.completed is not None and positions == {c: len(logs[c]) for c in CHANNELS}
    assert job.completed.offsets() == {("source", c): len(logs[c]) for c in CHANNELS}
    assert job.output() == fold(batches)


def test_a_stage_forwards_its_rows_watermark_and_barriers_in_order() -> None:
    """The channel a subtask forwards: rows, then a progress row carrying its watermark,
    then the barrier, then what it emitted after the snapshot, closed by a progress row."""
    out = StageOutput(1)
    out.rows(pa.table({"country": pa.array([3, 4], pa.int64())}))
    out.barrier(CheckpointBarrier(7, 70), watermark_us=5_000, batch_ms=9)
    out.rows(pa.table({"country": pa.array([5], pa.int64())}))
    table = out.drain(watermark_us=6_000, batch_ms=9)
    kinds = table.column(KIND).to_pylist()
    assert kinds == [0, 0, 3, 1, 0, 3]
    assert table.column("_ckpt_channel").to_pylist() == [1] * 6
    assert table.column("country").to_pylist() == [3, 4, None, None, 5, None]
    assert table.column("_ckpt_offset").to_pylist() == [0, 1, 2, 2, 2, 3]
    assert '"max": 7000' in str(table.column("_ckpt_barrier_options")[5])  # + the 1 ms gap
    assert out.drain(None, 9).num_rows == 1  # afterwards: only the closing progress row

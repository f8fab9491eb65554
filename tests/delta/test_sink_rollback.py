"""Rolling a two-phase-commit sink back to a restored checkpoint: afterwards the table holds
exactly the output of checkpoints <= it (a restore that fell back past a damaged newest
checkpoint replays the rest). Checked against a plain model with a log replay of our own
and with polars as a second reader. (DeltaSink specifics — other writers, compaction, commit
races, cleaned-up logs — are in test_delta_sink.py.)"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from test_delta_sink import (
    OP,
    T0,
    Row,
    Step,
    append_foreign,
    assert_table,
    batch,
    content,
    log_actions,
    make_sink,
    parquet_files,
    polars_rows,
    replay,
    restore_steps,
    rows,
    run_restore_model,
    seal,
)

from spark_ckpt.delta.delta_sink import DeltaSink
from spark_ckpt.delta.staged_file import staged_files
from spark_ckpt.errors import RestoreError
from spark_ckpt.runtime import task
from spark_ckpt.sinks.memory_sink import MemorySink
from spark_ckpt.sinks.two_phase_commit import Transaction, TransactionalSink


def commit(sink: TransactionalSink, checkpoint_id: int, first: int, n: int) -> list[Row]:
    sink.writer.write(OP, 0, batch(rows(first, n)))
    txn = sink.writer.pre_commit(OP, 0, checkpoint_id)
    assert sink.committer.commit_checkpoint(checkpoint_id, [txn])
    return rows(first, n)


def test_roll_back_withdraws_later_output_only(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    out = {c: commit(sink, c, 100 * c, 3) for c in (1, 2, 3, 4)}
    other = pa.table(
        {
            "id": [999],
            "name": ["other"],
            "ts": batch(rows(0, 1)).column("ts").cast(pa.timestamp("us", "UTC")),
        }
    )
    write_deltalake(str(root), other, mode="append")  # another writer, after checkpoint 4
    withdrawn = sink.committer.roll_back_to(2)
    assert len(withdrawn) == 2
    expected = [*out[1], *out[2], (999, "other", rows(0, 1)[0][2])]
    assert content(replay(root)) == sorted(expected)
    assert sorted(pl.read_delta(str(root)).get_column("id").to_list()) == sorted(
        r[0] for r in expected
    )
    assert sink.committer.committed_checkpoint() == 2
    assert sink.committer.roll_back_to(2) == [] and make_sink(root).committer.roll_back_to(2) == []
    out[5] = commit(sink, 5, 500, 2)  # later checkpoints commit normally
    assert content(replay(root)) == sorted(expected + out[5])
    protocol = [a["protocol"] for _, acts in log_actions(root) for a in acts if "protocol" in a]
    assert all((p["minReaderVersion"], p["minWriterVersion"]) == (1, 2) for p in protocol)
    assert DeltaTable(str(root)).protocol().min_writer_version == 2


def test_roll_back_without_table_or_later_output_is_a_no_op(tmp_path: Path) -> None:
    sink = make_sink(tmp_path / "t")
    assert sink.committer.roll_back_to(3) == []
    commit(sink, 3, 0, 2)
    assert sink.committer.roll_back_to(3) == [] and sink.committer.roll_back_to(7) == []
    assert sink.committer.committed_checkpoint() == 3


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=5),
    st.data(),
)
def test_roll_back_matches_a_plain_model(
    tmp_path_factory: object, sizes: list[int], data: st.DataObject
) -> None:
    root = tmp_path_factory.mktemp("t")  # type: ignore[attr-defined]
    sinks = (make_sink(root), MemorySink())
    model: list[tuple[int, list]] = []  # type: ignore[type-arg]
    for c, n in enumerate(sizes, start=1):
        model.append((c, commit(sinks[0], c, 10 * c, n)))
        commit(sinks[1], c, 10 * c, n)
    back = data.draw(st.integers(0, len(sizes)))
    for sink in sinks:
        sink.committer.roll_back_to(back)
        assert sink.committer.committed_checkpoint() == (back if back < len(sizes) else len(sizes))
    expected = sorted(r for c, rs in model if c <= back for r in rs)
    assert content(replay(root)) == expected
    memory = sinks[1].committer.output()
    ids = [] if memory is None else sorted(memory.column("id").to_pylist())
    assert ids == [r[0] for r in expected]


def memory_ids(sink: MemorySink) -> list[int]:
    out = sink.committer.output()
    return [] if out is None else sorted(out.column("id").to_pylist())


def test_memory_sink_roll_back() -> None:
    sink = MemorySink()
    for c in (1, 2, 3, 4):
        commit(sink, c, 10 * c, 2)
    assert sink.committer.roll_back_to(2) == [f"{OP}/0/3", f"{OP}/0/4"]
    assert memory_ids(sink) == [10, 11, 20, 21]
    assert sink.committer.committed_checkpoint() == 2
    assert (
        sink.committer.roll_back_to(2) == [] and sink.committer.roll_back_to(3) == []
    )  # idempotent
    commit(sink, 5, 50, 1)  # later checkpoints commit normally
    assert memory_ids(sink) == [10, 11, 20, 21, 50]
    sink.committer.recover([])  # the withdrawn transactions are discarded like other staged ones
    assert sink.committer.roll_back_to(0) == [f"{OP}/0/1", f"{OP}/0/2", f"{OP}/0/5"]
    assert memory_ids(sink) == [] and sink.committer.committed_checkpoint() == 0


def test_memory_sink_recover_after_roll_back_commits_the_restored_transactions() -> None:
    """Checkpoint 2's commit was lost and checkpoint 3's carried its transaction: the roll
    back to 2 withdraws it with 3's, and recovery with 2's state must commit it again even
    though the committed checkpoint already reads 2."""
    sink = MemorySink()
    commit(sink, 1, 10, 2)
    sink.writer.write(OP, 0, batch(rows(20, 2)))
    t2 = sink.writer.pre_commit(OP, 0, 2)
    sink.writer.write(OP, 0, batch(rows(30, 2)))
    t3 = sink.writer.pre_commit(OP, 0, 3)
    assert sink.committer.commit_checkpoint(3, [t2, t3])
    sink.crash()
    assert sink.committer.roll_back_to(2) == [t2.txn_id, t3.txn_id]
    sink.committer.recover([t2])
    assert memory_ids(sink) == [10, 11, 20, 21]
    assert sink.committer.committed_checkpoint() == 2
    sink.committer.recover([t2])  # idempotent
    assert memory_ids(sink) == [10, 11, 20, 21]


@pytest.mark.parametrize("kind", ["memory", "delta"])
def test_recover_sink_rolls_back_before_committing_the_restored_checkpoint(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """recover_sink on a sink whose restored checkpoint (2) was committed only by a later
    one (3): the result is exactly the output of checkpoints <= 2. Without a checkpoint (a
    fresh start) nothing is rolled back."""
    root = tmp_path / "t"
    sink: TransactionalSink = MemorySink() if kind == "memory" else make_sink(root)

    def ids() -> list[int]:
        if isinstance(sink, MemorySink):
            return memory_ids(sink)
        return sorted(r[0] for r in content(replay(root)))

    t1 = seal(sink, 1, rows(10, 2))
    assert sink.committer.commit_checkpoint(1, t1)
    t2 = seal(sink, 2, rows(20, 2))  # checkpoint 2 completed, its commit was lost
    t3 = seal(sink, 3, rows(30, 2))
    assert sink.committer.commit_checkpoint(3, [*t2, *t3])
    states = {2: t2, 3: [*t2, *t3]}  # what each checkpoint's state records
    monkeypatch.setattr(task, "sealed_transactions", lambda cp, store: states[cp.checkpoint_id])
    store = SimpleNamespace()  # unused: sealed_transactions is replaced

    task.recover_sink(sink.committer, None, store)  # type: ignore[arg-type]
    assert ids() == [10, 11, 20, 21, 30, 31] and sink.committer.committed_checkpoint() == 3
    restored = SimpleNamespace(checkpoint_id=2, properties={})  # the newest (3) was damaged
    assert task.recover_sink(sink.committer, restored, store) == t2  # type: ignore[arg-type]
    assert ids() == [10, 11, 20, 21] and sink.committer.committed_checkpoint() == 2
    task.recover_sink(sink.committer, restored, store)  # type: ignore[arg-type]
    assert ids() == [10, 11, 20, 21] and sink.committer.committed_checkpoint() == 2


@settings(max_examples=200, deadline=None)
@given(steps=restore_steps)
def test_memory_sink_restores_match_a_plain_model(steps: list[Step]) -> None:
    sink = MemorySink()

    def restarted() -> MemorySink:
        sink.crash()  # staged and committed data are external storage: they survive
        return sink

    run_restore_model(steps, restarted, lambda: memory_ids(sink), None, lazy_table=False)


def legacy_sink(root: Path, vertex: str) -> DeltaSink:
    """A sink committing as versions before 0.2 did: under ``spark-ckpt/<pipeline>/<vertex>``,
    the first operator's uid of the chain that wrote the output."""
    sink = make_sink(root)
    sink.target.app_id = f"spark-ckpt/pipe/{vertex}"
    return sink


def test_roll_back_withdraws_what_every_version_of_the_job_committed(tmp_path: Path) -> None:
    """A table written by v1 (chain 'counter') up to 2, by v2 (chain 'totals') from 3, both
    as versions before 0.2 committed them, and by the current version from 5: a restore of
    checkpoint 2 withdraws everything from 3 on, whichever version wrote it, and leaves no
    app id of the pipeline above 2."""
    root = tmp_path / "t"
    v1, v2 = legacy_sink(root, "counter"), legacy_sink(root, "totals")
    out = {c: commit(v1, c, 10 * c, 2) for c in (1, 2)}
    for c in (3, 4):
        commit(v2, c, 10 * c, 2)
    now = make_sink(root)
    commit(now, 5, 50, 2)
    foreign = batch(rows(900, 1))
    foreign = foreign.set_column(2, "ts", foreign.column("ts").cast(pa.timestamp("us", "UTC")))
    write_deltalake(str(root), foreign, mode="append")  # another writer
    withdrawn = now.committer.roll_back_to(2)
    assert len(withdrawn) == 3  # the files of checkpoints 3, 4 and 5
    assert [r[0] for r in content(replay(root))] == [10, 11, 20, 21, 900]
    assert sorted(r[0] for r in content(pl.read_delta(str(root)).to_arrow())) == [
        r[0] for r in [*out[1], *out[2], *rows(900, 1)]
    ]
    dt = DeltaTable(str(root))
    for app in ("spark-ckpt/pipe", "spark-ckpt/pipe/counter", "spark-ckpt/pipe/totals"):
        assert (dt.transaction_version(app) or 0) <= 2, app
    assert now.committer.roll_back_to(2) == []  # idempotent


def test_roll_back_of_a_table_written_only_by_an_older_version(tmp_path: Path) -> None:
    """The current app id has no version yet: the older ids above the target are rolled
    back; another pipeline's commits are never touched."""
    root = tmp_path / "t"
    old = legacy_sink(root, "counter")
    for c in (1, 2, 3):
        commit(old, c, 10 * c, 1)
    other = DeltaSink(str(root), pipeline="another")
    commit(other, 7, 70, 1)
    assert len(make_sink(root).committer.roll_back_to(1)) == 2
    assert [r[0] for r in content(replay(root))] == [10, 70]
    assert len(make_sink(root).committer.roll_back_to(0)) == 1  # the first's, not another's
    assert [r[0] for r in content(replay(root))] == [70]


def test_transactions_sealed_for_another_table_are_not_recovered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restore into another output table, the restored checkpoint's transactions
    belong to the first table: recover_sink commits none of them into the second; those of
    versions before 0.2 (no table recorded) are taken as this table's."""
    first, second = make_sink(tmp_path / "first"), make_sink(tmp_path / "second")
    sealed = seal(first, 4, rows(40, 2))
    assert all(t.sink == first.committer.sink_id for t in sealed)
    unrecorded = [replace(t, sink="") for t in seal(second, 4, rows(60, 2))]
    monkeypatch.setattr(task, "sealed_transactions", lambda cp, store: [*sealed, *unrecorded])
    restored = SimpleNamespace(checkpoint_id=4, properties={})
    assert task.recover_sink(second.committer, restored, SimpleNamespace()) == unrecorded  # type: ignore[arg-type]
    assert [r[0] for r in content(replay(tmp_path / "second"))] == [60, 61]
    assert not (tmp_path / "first" / "_delta_log").exists()


def every_version_reads(root: Path) -> None:
    """Every version of the table reads, with delta-rs and with polars, and both agree with
    the independent log replay up to that version."""
    for version, _ in log_actions(root):
        want = content(replay(root, upto=version))
        table = DeltaTable(str(root), version=version).to_pyarrow_table()
        assert content(table) == want, version
        frame = pl.read_delta(str(root), version=version)
        assert sorted(frame["id"].to_list()) == [r[0] for r in want], version


def staged_paths(txns: list[Transaction]) -> set[str]:
    return {f.path for t in txns for f in staged_files(t)}


def test_a_checkpoint_whose_output_a_later_roll_back_withdrew_comes_back(tmp_path: Path) -> None:
    """Checkpoints 1-4, then the restore of 2 (roll back and recovery, as recover_sink does),
    then a new lineage (1001, 1002). The roll back only removed 3's and 4's files from the
    table: every version still reads, and restoring 4 brings them back and withdraws the new
    lineage's; restoring 1002 then swaps back. Once a VACUUM deleted 3's and 4's files, the
    restore of 4 is refused, naming the checkpoint, with the table untouched."""
    root = tmp_path / "t"
    sink = make_sink(root)
    sealed = {c: seal(sink, c, rows(10 * c, 2)) for c in (1, 2, 3, 4)}
    for c in (1, 2, 3, 4):
        assert sink.committer.commit_checkpoint(c, sealed[c])
    assert len(sink.committer.roll_back_to(2)) == 4
    sink.committer.recover(sealed[2])
    assert staged_paths(sealed[3]) | staged_paths(sealed[4]) <= parquet_files(root)
    for c in (1001, 1002):
        sealed[c] = seal(sink, c, rows(c, 2))
        assert sink.committer.commit_checkpoint(c, sealed[c])
    every_version_reads(root)

    def restore(c: int) -> list[str]:
        new = make_sink(root)  # the restarted job
        new.committer.rollback.check_output_restorable(c, sealed[c])
        withdrawn = new.committer.roll_back_to(c)
        new.committer.recover(sealed[c])
        return withdrawn

    withdrawn = restore(4)
    assert set(withdrawn) == staged_paths(sealed[1001]) | staged_paths(sealed[1002])
    assert_table(root, [r for c in (1, 2, 3, 4) for r in rows(10 * c, 2)], 4)
    assert restore(4) == []  # idempotent
    restore(1002)
    assert_table(root, [*rows(10, 2), *rows(20, 2), *rows(1001, 2), *rows(1002, 2)], 1002)
    every_version_reads(root)

    before = content(replay(root))
    assert DeltaTable(str(root)).vacuum(0, dry_run=False, enforce_retention_duration=False)
    with pytest.raises(RestoreError, match=r"gone from storage .* checkpoint 4 cannot"):
        make_sink(root).committer.rollback.check_output_restorable(4)
    with pytest.raises(RestoreError, match="gone from storage"):
        make_sink(root).committer.roll_back_to(4)
    assert content(replay(root)) == before
    for fine in (1, 2, 1001, 1002):
        make_sink(root).committer.rollback.check_output_restorable(fine)


def test_a_lost_commit_behind_a_roll_back_is_refused(tmp_path: Path) -> None:
    """Checkpoints 1-3 committed, 4 completed but its commit was lost; then the restore of 2.
    Nothing in the table tells whether a restore of 4 would need the output of 3 back (4 of
    the old lineage) or not (4 of a new one): refused, naming both checkpoints, with the
    table untouched. A restart that restores 4 keeps the table as the roll back left it."""
    root = tmp_path / "t"
    sink = make_sink(root)
    sealed = {c: seal(sink, c, rows(10 * c, 2)) for c in (1, 2, 3, 4)}
    for c in (1, 2, 3):
        assert sink.committer.commit_checkpoint(c, sealed[c])
    assert len(sink.committer.roll_back_to(2)) == 2
    sink.committer.recover(sealed[2])
    before = content(replay(root))
    with pytest.raises(RestoreError, match=r"checkpoints 3\.\.4: the restore of checkpoint 2"):
        make_sink(root).committer.rollback.check_output_restorable(4)
    assert make_sink(root).committer.roll_back_to(4) == []
    assert content(replay(root)) == before

    crashed = make_sink(tmp_path / "crashed")
    for c in (1, 2):
        assert crashed.committer.commit_checkpoint(c, seal(crashed, c, rows(10 * c, 2)))
    lost = seal(crashed, 3, rows(30, 2))  # 3 completed, its commit was lost
    crashed.committer.rollback.check_output_restorable(3, lost)  # no roll back in between: fine
    make_sink(tmp_path / "empty").committer.rollback.check_output_restorable(3)  # no table yet

    # The restore of 2 swept 3's files as orphans (nothing ever added them): 3 is refused.
    make_sink(tmp_path / "crashed").committer.recover([])
    with pytest.raises(RestoreError, match="checkpoint 3 that its commit never made visible"):
        make_sink(tmp_path / "crashed").committer.rollback.check_output_restorable(3, lost)


def test_a_reader_of_an_earlier_version_reads_it_after_a_restore(tmp_path: Path) -> None:
    """A reader opens the table at version v (a dashboard, a downstream stream), a restore
    withdraws v's newest output and its recovery sweeps orphans, then the reader reads its
    snapshot: it gets v's rows, with delta-rs and with polars."""
    root = tmp_path / "t"
    sink = make_sink(root)
    sealed = {c: seal(sink, c, rows(10 * c, 3)) for c in (1, 2, 3)}
    for c in (1, 2, 3):
        assert sink.committer.commit_checkpoint(c, sealed[c])
    seal(sink, 4, rows(40, 2))  # staged, never committed: a true orphan
    reader = DeltaTable(str(root))
    v = reader.version()
    want = sorted(r[0] for c in (1, 2, 3) for r in rows(10 * c, 3))

    restarted = make_sink(root)
    assert len(restarted.committer.roll_back_to(1)) == 4
    restarted.committer.recover(sealed[1])
    assert sorted(r[0] for r in content(replay(root))) == [r[0] for r in rows(10, 3)]

    assert sorted(reader.to_pyarrow_table().column("id").to_pylist()) == want
    assert sorted(pl.read_delta(str(root), version=v)["id"].to_list()) == want
    committed = {a["add"]["path"] for _, acts in log_actions(root) for a in acts if "add" in a}
    assert parquet_files(root) == committed  # only the never-committed files were swept


def test_a_second_attempt_at_a_committed_checkpoint_is_never_added(tmp_path: Path) -> None:
    """A task retried after it sealed checkpoint 1's output (or a zombie attempt) seals the
    same rows again, in other files. The first attempt's transaction was committed with
    checkpoint 1; the second one travels on in its subtask's later checkpoints and must stay
    an orphan: only checkpoint 2's own output is added with checkpoint 2."""
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.writer.write(OP, 0, batch(rows(0, 3)))
    first = sink.writer.pre_commit(OP, 0, 1)
    sink.writer.write(OP, 0, batch(rows(0, 3)))  # the retry: the same rows, new files
    second = sink.writer.pre_commit(OP, 0, 1)
    assert first.payload != second.payload
    assert sink.committer.commit_checkpoint(1, [first])
    sink.writer.write(OP, 0, batch(rows(3, 2)))
    own = sink.writer.pre_commit(OP, 0, 2)
    assert sink.committer.commit_checkpoint(2, [second, own])
    assert content(DeltaTable(str(root)).to_pyarrow_table()) == rows(0, 5)
    assert sorted(pl.read_delta(str(root)).get_column("id").to_list()) == list(range(5))


# Restores across lineages: any checkpoint ever completed may be restored, also one that a
# later restore left behind, and a VACUUM may delete what the table no longer references.
lineage_steps = st.lists(
    st.tuples(
        st.sampled_from(["checkpoint"] * 4 + ["lost", "foreign", "vacuum"] + ["restore"] * 4),
        st.integers(0, 6),  # rows, or which checkpoint to restore
    ),
    min_size=4,
    max_size=16,
)


# 30 drawn examples (each restore that brings output back reads the table's older versions):
# make test-fast's time; the examples below pin the defects the search found
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=lineage_steps)
# a lost checkpoint of a lineage an earlier restore left, restored after a restore past it
@example(
    steps=[
        ("checkpoint", 0),
        ("checkpoint", 0),
        ("checkpoint", 1),
        ("lost", 0),
        ("checkpoint", 0),
        ("restore", 0),
        ("restore", 4),
        ("restore", 3),
    ]
)
# a checkpoint with no output of that lineage, restored likewise
@example(
    steps=[
        ("checkpoint", 0),
        ("checkpoint", 0),
        ("checkpoint", 0),
        ("checkpoint", 0),
        ("checkpoint", 1),
        ("restore", 0),
        ("restore", 4),
        ("restore", 1),
    ]
)
def test_restores_across_lineages_match_a_plain_model(steps: list[Step]) -> None:
    """The model: a checkpoint's output is its lineage's rows up to it (a plain fold over the
    steps); a restore of *r* leaves the table holding exactly *r*'s output and the other
    writer's rows. A restore may be refused only for a checkpoint off the current lineage
    (its files vacuumed), or one whose own commit was lost; a refused one of the current
    lineage still restores as a restart does (no check). Every version of the table reads
    after every step, unless a VACUUM deleted what it needs."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "t"
        sink = make_sink(root)
        rows_of: dict[int, list[Row]] = {}
        ancestry: dict[int, frozenset[int]] = {}  # checkpoint -> its lineage up to it
        head: frozenset[int] = frozenset()
        states: dict[int, list[Transaction]] = {}
        pending: list[Transaction] = []
        lost: set[int] = set()
        other: list[Row] = []
        last = next_row = 0
        vacuumed = False
        for kind, a in steps:
            if kind in ("checkpoint", "lost"):
                last += 1
                rows_of[last] = rows(next_row, a)
                next_row += a
                pending += seal(sink, last, rows_of[last])
                head = ancestry[last] = head | {last}
                states[last] = list(pending)
                if kind == "checkpoint":
                    sink.committer.commit_checkpoint(last, pending)
                    pending = []
                else:
                    lost.add(last)
            elif kind == "foreign":
                rs = [(10_000 + next_row, "other", T0)]
                next_row += 1
                append_foreign(root, rs)
                other += rs
            elif kind == "vacuum" and (root / "_delta_log").exists():
                DeltaTable(str(root)).vacuum(0, dry_run=False, enforce_retention_duration=False)
                vacuumed = True
            elif kind == "restore" and ancestry:
                r = sorted(ancestry)[a % len(ancestry)]
                new = make_sink(root)  # the restarted job
                try:
                    new.committer.rollback.check_output_restorable(r, states[r])
                except RestoreError:
                    assert r in lost or r not in head, (r, sorted(head))
                    event("restore refused")
                    if r not in head:
                        continue  # refused: nothing changed
                else:
                    event("restore " + ("on the lineage" if r in head else "off the lineage"))
                new.committer.roll_back_to(r)
                new.committer.recover(states[r])
                sink, head, pending = new, ancestry[r], []
            waiting = {t.checkpoint_id for t in pending}
            want = sorted(
                [r[0] for c in head if c not in waiting for r in rows_of[c]] + [r[0] for r in other]
            )
            if not (root / "_delta_log").exists():
                assert want == []
                continue
            assert sorted(r[0] for r in content(replay(root))) == want
            assert sorted(r[0] for r in polars_rows(root)) == want
            if not vacuumed:
                every_version_reads(root)

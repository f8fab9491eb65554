"""DeltaSink: exactly-once output into a real Delta table (delta-rs, no Spark).

Oracles are independent of the sink: the expected content is a plain Python fold over the
input rows, and the table is read back by second readers — polars' Delta reader and a
hand-written replay of ``_delta_log`` whose active Parquet files pyarrow reads directly.
Crashes and races use real processes (SIGKILL, two committers released together by a
stdin handshake, no sleeps).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_ckpt.delta.delta_sink import DeltaSink
from spark_ckpt.delta.rollback_plan import RollbackPlan
from spark_ckpt.delta.staged_file import StagedFile, staged_files
from spark_ckpt.delta.stats import DeltaStats, delta_stats
from spark_ckpt.errors import ProtocolError, StoreError
from spark_ckpt.protocol.barrier import BARRIER_COLUMNS
from spark_ckpt.sinks.two_phase_commit import Transaction, TransactionalSink

OP = "out"
T0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)

Row = tuple[int, str, dt.datetime]


def rows(first: int, n: int) -> list[Row]:
    return [
        (i, f"name-{i}", T0 + dt.timedelta(microseconds=7 * i)) for i in range(first, first + n)
    ]


def batch(rs: Sequence[Row], *, barrier_columns: bool = False) -> pa.Table:
    """User rows as the operator chain emits them (naive-ns timestamps on purpose: the sink
    must coerce them to UTC microseconds)."""
    t = pa.table(
        {
            "id": pa.array([r[0] for r in rs], pa.int64()),
            "name": pa.array([r[1] for r in rs], pa.string()),
            "ts": pa.array([r[2].replace(tzinfo=None) for r in rs], pa.timestamp("ns")),
        }
    )
    if barrier_columns:
        t = t.append_column("_ckpt_channel", pa.array([0] * len(rs), pa.int32()))
        t = t.append_column("_ckpt_offset", pa.array(range(len(rs)), pa.int64()))
    return t


def content(table: pa.Table) -> list[Row]:
    """Rows of a table read back, sorted (the sink does not promise an order)."""
    if table.num_rows == 0:
        return []
    return sorted(
        zip(
            table.column("id").to_pylist(),
            table.column("name").to_pylist(),
            table.column("ts").to_pylist(),
            strict=True,
        )
    )


def make_sink(root: Path, **kw: Any) -> DeltaSink:
    return DeltaSink(str(root), pipeline="pipe", **kw)


# ------------------------------------------------------------- independent log replay


def log_actions(table: Path) -> list[tuple[int, list[dict[str, Any]]]]:
    out = []
    for f in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        out.append((int(f.stem), actions))
    return out


def replay(table: Path, upto: int | None = None) -> pa.Table:
    """The table's content from the log (up to version *upto*), read without delta-rs:
    active adds minus removes."""
    active: dict[str, None] = {}
    for version, actions in log_actions(table):
        if upto is not None and version > upto:
            break
        for a in actions:
            if "add" in a:
                active[a["add"]["path"]] = None
            elif "remove" in a:
                active.pop(a["remove"]["path"], None)
    tables = [pq.read_table(table / p) for p in active]
    return pa.concat_tables(tables) if tables else pa.table({})


def parquet_files(table: Path) -> set[str]:
    return {p.name for p in table.glob("*.parquet")}


def committed_paths(table: Path) -> set[str]:
    paths: set[str] = set()
    for _, actions in log_actions(table):
        paths |= {a["add"]["path"] for a in actions if "add" in a}
    return paths


# ------------------------------------------------------------------------ round trip


def test_round_trip_one_atomic_commit_per_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    _: TransactionalSink = sink  # structurally a 2PC sink (checked by mypy)
    expected: list[Row] = []
    for subtask, (first, n) in enumerate([(0, 3), (100, 5)]):
        for part in (rows(first, n - 1), rows(first + n - 1, 1)):
            sink.writer.write(OP, subtask, batch(part, barrier_columns=True))
            expected += part
    sink.writer.write(OP, 1, batch([]))  # empty batches stage nothing
    txns = [sink.writer.pre_commit(OP, s, 1) for s in (0, 1)]
    assert [len(t.payload) for t in txns] == [1, 1]
    # Staged, sealed, but invisible: no table yet, only loose files.
    assert not (root / "_delta_log").exists()
    assert sink.committer.read().num_rows == 0 and sink.committer.committed_checkpoint() == 0
    assert len(parquet_files(root)) == 2

    assert sink.committer.commit_checkpoint(1, txns) is True
    assert content(replay(root)) == sorted(expected)
    assert content(sink.committer.read()) == sorted(expected)
    assert sink.committer.committed_checkpoint() == 1
    assert [v for v, _ in log_actions(root)] == [0]  # both subtasks in one commit

    # Checkpoint 2: staged data stays invisible until its commit.
    more = rows(200, 4)
    sink.writer.write(OP, 0, batch(more))
    txn2 = [sink.writer.pre_commit(OP, s, 2) for s in (0, 1)]
    assert txn2[1].payload == ()  # an empty transaction is fine
    assert content(replay(root)) == sorted(expected)
    assert sink.committer.commit_checkpoint(2, txn2) is True
    assert content(replay(root)) == sorted(expected + more)
    assert [v for v, _ in log_actions(root)] == [0, 1]
    app = [a["txn"] for _, acts in log_actions(root) for a in acts if "txn" in a]
    assert app == [
        {"appId": "spark-ckpt/pipe", "version": 1},
        {"appId": "spark-ckpt/pipe", "version": 2},
    ]


def test_buffering_stages_files_at_the_target_size(tmp_path: Path) -> None:
    sink = make_sink(tmp_path / "t", target_file_bytes=1)  # every write is its own file
    for i in range(3):
        sink.writer.write(OP, 0, batch(rows(10 * i, 2)))
    assert len(parquet_files(tmp_path / "t")) == 3  # staged before the seal
    txn = sink.writer.pre_commit(OP, 0, 1)
    assert len(txn.payload) == 3
    assert sum(f.rows for f in staged_files(txn)) == 6
    sink.committer.commit_checkpoint(1, [txn])
    assert content(replay(tmp_path / "t")) == sorted(rows(0, 2) + rows(10, 2) + rows(20, 2))


def test_writes_are_encoded_into_one_in_progress_file_per_subtask(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    for i in range(3):
        sink.writer.write(OP, 0, batch(rows(10 * i, 2)))
    sink.writer.write(OP, 1, batch(rows(100, 1)))
    assert len(parquet_files(root)) == 2  # encoded as written, before the seal
    txn = sink.writer.pre_commit(OP, 0, 1)
    [f] = staged_files(txn)
    meta = pq.read_metadata(root / f.path)
    assert (meta.num_rows, meta.num_row_groups) == (6, 3)  # a row group per write
    stats = json.loads(f.stats)
    assert (stats["numRecords"], stats["minValues"]["id"], stats["maxValues"]["id"]) == (6, 0, 21)
    # a schema change rolls the file: one file per schema
    sink.writer.write(OP, 0, batch(rows(30, 1)))
    sink.writer.write(OP, 0, batch(rows(40, 1)).drop_columns(["name"]))
    assert [g.rows for g in staged_files(sink.writer.pre_commit(OP, 0, 2))] == [1, 1]
    sink.committer.commit_checkpoint(1, [txn, sink.writer.pre_commit(OP, 1, 1)])
    assert content(replay(root)) == sorted(rows(0, 2) + rows(10, 2) + rows(20, 2) + rows(100, 1))


def test_recover_deletes_in_progress_files(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.writer.write(OP, 0, batch(rows(0, 2)))
    assert len(parquet_files(root)) == 1
    sink.writer.discard(OP)  # the writer's open transaction ...
    sink.committer.recover([])  # ... and the committer's orphan sweep
    assert parquet_files(root) == set()
    assert sink.writer.pre_commit(OP, 0, 1).payload == ()  # nothing left open


@settings(max_examples=100, deadline=None)
@given(
    parts=st.lists(
        st.lists(
            st.tuples(
                st.one_of(st.none(), st.integers(-(2**40), 2**40)),
                st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
                st.one_of(st.none(), st.text(max_size=40)),
                st.one_of(st.none(), st.integers(-(2**50), 2**50)),
            ),
            min_size=1,
            max_size=6,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_statistics_accumulated_over_writes_equal_those_of_the_whole_file(
    parts: list[list[tuple[Any, Any, Any, Any]]],
) -> None:
    def table(rs: list[tuple[Any, Any, Any, Any]]) -> pa.Table:
        return pa.table(
            {
                "i": pa.array([r[0] for r in rs], pa.int64()),
                "f": pa.array([r[1] for r in rs], pa.float64()),
                "s": pa.array([r[2] for r in rs], pa.string()),
                "ts": pa.array([r[3] for r in rs], pa.timestamp("us", tz="UTC")),
            }
        )

    acc = DeltaStats()
    for rs in parts:
        acc.add(table(rs))
    whole = table([r for rs in parts for r in rs])
    assert json.loads(acc.to_json()) == json.loads(delta_stats(whole))


# ----------------------------------------------------------------------- idempotency


def test_commits_are_idempotent(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.writer.write(OP, 0, batch(rows(0, 3)))
    a = sink.writer.pre_commit(OP, 0, 1)
    assert sink.committer.commit_checkpoint(1, [a]) is True
    assert sink.committer.commit_checkpoint(1, [a]) is False  # replay of the same checkpoint
    assert make_sink(root).committer.commit_checkpoint(1, [a]) is False  # ... by another instance
    sink.committer.commit(a)  # per-transaction commit of a committed transaction: no-op
    assert len(log_actions(root)) == 1

    # A committed transaction included again in a later checkpoint is not added twice.
    sink.writer.write(OP, 0, batch(rows(10, 2)))
    b = sink.writer.pre_commit(OP, 0, 2)
    assert sink.committer.commit_checkpoint(2, [a, b]) is True
    assert content(replay(root)) == sorted(rows(0, 3) + rows(10, 2))

    # An older checkpoint after a newer one: a no-op (the newer one contained it).
    assert sink.committer.commit_checkpoint(1, [a]) is False
    assert sink.committer.committed_checkpoint() == 2


def test_per_subtask_commit_keeps_the_checkpoint_version(tmp_path: Path) -> None:
    """``commit(txn)`` (what tasks call on notify-complete) must not claim the checkpoint:
    a later ``commit_checkpoint`` of it still adds the other subtasks' files."""
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.writer.write(OP, 0, batch(rows(0, 2)))
    sink.writer.write(OP, 1, batch(rows(50, 2)))
    t0, t1 = sink.writer.pre_commit(OP, 0, 3), sink.writer.pre_commit(OP, 1, 3)
    sink.committer.commit(t0)
    sink.committer.commit(t0)
    assert sink.committer.committed_checkpoint() == 0
    assert content(replay(root)) == sorted(rows(0, 2))
    assert sink.committer.commit_checkpoint(3, [t0, t1]) is True
    assert content(replay(root)) == sorted(rows(0, 2) + rows(50, 2))
    assert sink.committer.committed_checkpoint() == 3


# --------------------------------------------------------------- abort and recovery


def test_abort_deletes_staged_files_but_never_committed_ones(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.writer.write(OP, 0, batch(rows(0, 2)))
    kept = sink.writer.pre_commit(OP, 0, 1)
    sink.committer.commit_checkpoint(1, [kept])
    sink.writer.write(OP, 0, batch(rows(10, 2)))
    dropped = sink.writer.pre_commit(OP, 0, 2)
    assert len(parquet_files(root)) == 2
    sink.committer.abort(dropped)
    sink.committer.abort(dropped)  # missing files are fine
    sink.committer.abort(kept)  # referenced by the table: kept
    assert parquet_files(root) == committed_paths(root)
    assert content(replay(root)) == sorted(rows(0, 2))
    with pytest.raises(StoreError, match="gone"):
        sink.committer.commit_checkpoint(2, [dropped])
    assert content(replay(root)) == sorted(rows(0, 2))


def test_recover_commits_restored_transactions_and_deletes_orphans(tmp_path: Path) -> None:
    root = tmp_path / "t"
    old = make_sink(root, target_file_bytes=1)
    old.writer.write(OP, 0, batch(rows(0, 2)))
    old.writer.write(OP, 1, batch(rows(20, 2)))
    restored = [old.writer.pre_commit(OP, 0, 4), old.writer.pre_commit(OP, 1, 4)]  # in checkpoint 4
    old.writer.write(OP, 0, batch(rows(40, 2)))
    orphan_sealed = old.writer.pre_commit(OP, 0, 5)  # checkpoint 5 never completed
    old.writer.write(OP, 1, batch(rows(60, 2)))  # staged, never sealed
    assert len(parquet_files(root)) == 4
    foreign = root / "part-00000-someone-else.c000.snappy.parquet"
    pq.write_table(batch(rows(99, 1)), foreign)  # not this sink's: never touched

    new = make_sink(root)  # the restarted job
    new.committer.recover(restored)
    assert content(replay(root)) == sorted(rows(0, 2) + rows(20, 2))
    assert new.committer.committed_checkpoint() == 4
    assert parquet_files(root) == committed_paths(root) | {foreign.name}
    new.committer.recover(restored)  # idempotent
    assert content(replay(root)) == sorted(rows(0, 2) + rows(20, 2))
    assert len(log_actions(root)) == 1
    with pytest.raises(StoreError):
        new.committer.commit_checkpoint(5, [orphan_sealed])


def test_recover_spares_files_staged_by_the_starting_run(tmp_path: Path) -> None:
    """A ckpt-sink query stages its first micro-batch before the coordinator installs the
    sink and recovers it: recovery with a cutoff deletes only files staged before it."""
    root = tmp_path / "t"
    old = make_sink(root, target_file_bytes=1)
    old.writer.write(OP, 0, batch(rows(0, 2)))
    old.writer.pre_commit(OP, 0, 1)  # staged by an earlier run, never committed: an orphan
    (orphan,) = parquet_files(root)
    os.utime(root / orphan, (1_000, 1_000))  # long ago
    cutoff_ms = 2_000_000
    current = make_sink(root).writer.stage(batch(rows(10, 2)), subtask=0)  # the starting run (now)
    make_sink(root).committer.recover([], staged_before_ms=cutoff_ms)
    assert parquet_files(root) == {current.path}


def test_schema_mismatch_is_a_protocol_error_naming_the_columns(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.writer.write(OP, 0, batch(rows(0, 2)))
    sink.committer.commit_checkpoint(1, [sink.writer.pre_commit(OP, 0, 1)])
    sink.writer.write(OP, 0, pa.table({"id": ["x"], "extra": [1.5]}))
    bad = sink.writer.pre_commit(OP, 0, 2)
    with pytest.raises(ProtocolError) as err:
        sink.committer.commit_checkpoint(2, [bad])
    for word in ("extra", "name", "ts", "id"):
        assert word in str(err.value)
    assert content(replay(root)) == sorted(rows(0, 2))
    with pytest.raises(ProtocolError, match="Delta"):
        sink.writer.stage(pa.table({"d": pa.array([1], pa.duration("s"))}), subtask=0)
    with pytest.raises(TypeError, match="partition_by"):  # unpartitioned tables only
        make_sink(tmp_path / "p", partition_by=["id"])


def test_staged_file_json_and_statistics() -> None:
    f = StagedFile("part-x.parquet", 10, 2, '{"numRecords":2}', 1234)
    assert StagedFile.from_json(f.to_json()) == f
    with pytest.raises(ProtocolError):
        StagedFile.from_json('{"path": 1}')
    t = pa.table(
        {
            "i": pa.array([3, None, -1], pa.int64()),
            "f": pa.array([1.0, float("nan"), 2.0]),
            "s": ["b", "a", None],
            "long": ["x" * 40, "y", "z"],
            "longmax": ["a", "b" * 40, "a"],
            "ts": pa.array([1_500, 2_500, None], pa.timestamp("us", tz="UTC")),
            "lst": pa.array([[1], [], None]),
        }
    )
    stats = json.loads(delta_stats(t))
    assert stats["numRecords"] == 3
    assert stats["minValues"] == {
        "i": -1,
        "s": "a",
        "long": "x" * 32,  # cut to Spark's prefix length: still <= every value
        "ts": "1970-01-01T00:00:00.001Z",  # rounded down to milliseconds
    }
    # Timestamps rounded up; "longmax": a truncated max would be below the real one, so the
    # column gets no min/max at all; "f" has NaN, "lst" is nested: none either.
    assert stats["maxValues"] == {
        "i": 3,
        "s": "b",
        "long": "z",
        "ts": "1970-01-01T00:00:00.003Z",
    }
    assert stats["nullCount"] == {"i": 1, "f": 0, "s": 1, "long": 0, "longmax": 0, "ts": 1}


# ---------------------------------------------------------------- real processes

CHILD = """
import json, os, signal, sys
import pyarrow as pa
from spark_ckpt.delta.delta_sink import DeltaSink
from spark_ckpt.sinks.two_phase_commit import Transaction
sink = DeltaSink(sys.argv[1], pipeline="pipe", target_file_bytes=1)
mode = sys.argv[2]

def batch(first, n):
    return pa.table({"id": pa.array(range(first, first + n), pa.int64()),
                     "name": [f"name-{i}" for i in range(first, first + n)],
                     "ts": pa.array([0] * n, pa.timestamp("us", tz="UTC"))})

if mode == "crash":
    sink.writer.write("out", 0, batch(100, 3))
    sealed = sink.writer.pre_commit("out", 0, 7)
    sink.writer.write("out", 1, batch(200, 3))
    sink.writer.write("out", 1, batch(300, 3))   # staged, never sealed
    print(sealed.to_json(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
else:
    txns = [[Transaction.from_json(t) for t in ts] for ts in json.loads(sys.argv[3])]
    print("ready", flush=True)
    sys.stdin.readline()                  # released together with the other committer
    out = [sink.committer.commit_checkpoint(cid + 1, ts) for cid, ts in enumerate(txns)]
    print(json.dumps(out), flush=True)
"""


def run_child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_killed_writer_leaves_the_table_unchanged(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.writer.write(OP, 0, batch(rows(0, 2)))
    sink.committer.commit_checkpoint(1, [sink.writer.pre_commit(OP, 0, 1)])
    before = log_actions(root)

    child = run_child(str(root), "crash")
    out, _ = child.communicate()
    assert child.returncode == -signal.SIGKILL
    sealed = Transaction.from_json(out.strip())
    assert log_actions(root) == before  # nothing of the killed writer is visible
    assert content(replay(root)) == sorted(rows(0, 2))
    assert len(parquet_files(root)) == 4  # 1 committed + 3 staged by the child

    # Restart from a checkpoint that recorded nothing of the child: all orphans go.
    make_sink(root).committer.recover([])
    assert parquet_files(root) == committed_paths(root)
    assert content(replay(root)) == sorted(rows(0, 2))
    with pytest.raises(StoreError):
        make_sink(root).committer.commit(sealed)


def test_killed_writer_sealed_transaction_is_recovered(tmp_path: Path) -> None:
    root = tmp_path / "t"
    child = run_child(str(root), "crash")
    out, _ = child.communicate()
    assert child.returncode == -signal.SIGKILL
    sealed = Transaction.from_json(out.strip())
    make_sink(root).committer.recover([sealed])  # restored checkpoint 7 recorded it
    assert content(replay(root))[0][0] == 100
    assert sorted(r[0] for r in content(replay(root))) == [100, 101, 102]
    assert parquet_files(root) == committed_paths(root)


def test_racing_committers_add_the_data_once(tmp_path: Path) -> None:
    """Two processes commit checkpoint 1 (creating the table) and then checkpoint 2
    (appending) at the same time: each checkpoint is committed by exactly one of them."""
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.writer.write(OP, 0, batch(rows(0, 3)))
    sink.writer.write(OP, 1, batch(rows(10, 3)))
    cp1 = [sink.writer.pre_commit(OP, 0, 1), sink.writer.pre_commit(OP, 1, 1)]
    sink.writer.write(OP, 0, batch(rows(20, 3)))
    cp2 = [sink.writer.pre_commit(OP, 0, 2), sink.writer.pre_commit(OP, 1, 2)]
    arg = json.dumps([[t.to_json() for t in cp1], [t.to_json() for t in cp2]])
    children = [run_child(str(root), "commit", arg) for _ in range(2)]
    for c in children:
        assert c.stdout is not None and c.stdout.readline().strip() == "ready"
    for c in children:
        assert c.stdin is not None
        c.stdin.write("go\n")
        c.stdin.flush()
    results = []
    for c in children:
        out, _ = c.communicate()
        assert c.returncode == 0
        results.append(json.loads(out))
    assert [sum(r[i] for r in results) for i in (0, 1)] == [1, 1]
    expected = sorted(rows(0, 3) + rows(10, 3) + rows(20, 3))
    assert content(replay(root)) == expected
    assert content(sink.committer.read()) == expected
    assert sink.committer.committed_checkpoint() == 2


# ----------------------------------------------------------------- second readers


def test_second_readers_and_protocol(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.writer.write(OP, 0, batch(rows(0, 4), barrier_columns=True))
    sink.writer.write(OP, 1, batch(rows(9, 2), barrier_columns=True))
    sink.committer.commit_checkpoint(1, [sink.writer.pre_commit(OP, s, 1) for s in (0, 1)])

    df = pl.read_delta(str(root))
    assert df.columns == ["id", "name", "ts"]  # barrier columns dropped
    assert not set(BARRIER_COLUMNS) & set(df.columns)
    assert df.schema["ts"] == pl.Datetime("us", "UTC")
    got = sorted(zip(df["id"].to_list(), df["name"].to_list(), df["ts"].to_list(), strict=True))
    assert got == sorted(rows(0, 4) + rows(9, 2))

    actions = [a for _, acts in log_actions(root) for a in acts]
    (protocol,) = [a["protocol"] for a in actions if "protocol" in a]
    assert protocol == {"minReaderVersion": 1, "minWriterVersion": 2}
    (meta,) = [a["metaData"] for a in actions if "metaData" in a]
    fields = {f["name"]: f["type"] for f in json.loads(meta["schemaString"])["fields"]}
    assert fields == {"id": "long", "name": "string", "ts": "timestamp"}
    assert meta["partitionColumns"] == []
    assert "deletionVector" not in json.dumps(actions)
    adds = [a["add"] for a in actions if "add" in a]
    assert sorted(json.loads(a["stats"])["numRecords"] for a in adds) == [2, 4]
    for a in adds:
        schema = pq.read_schema(root / a["path"])
        assert schema.field("ts").type == pa.timestamp("us", tz="UTC")


# -------------------------------------------------------- model-based interleavings

Op = tuple[str, int, int]

#: Operation kinds, weighted towards the ones that make data to commit.
KINDS = ["write"] * 4 + ["checkpoint"] * 2 + ["complete"] * 2 + ["commit_one", "abort_one", "crash"]

ops = st.lists(
    st.tuples(st.sampled_from(KINDS), st.integers(0, 5), st.integers(0, 4)), min_size=3, max_size=20
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(ops=ops, small_files=st.booleans())
def test_model(ops: list[Op], small_files: bool) -> None:
    """Random interleavings of write / checkpoint (pre-commit of every subtask) / complete
    (commit of a checkpoint with every pending transaction up to it, as the checkpoint's
    state records them) / per-transaction commit / abort / crash + recover, against a plain
    model: the committed rows."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "t"
        kw: dict[str, Any] = {"target_file_bytes": 1} if small_files else {}
        sink = make_sink(root, **kw)
        committed: list[Row] = []  # the model
        open_rows: dict[int, list[Row]] = {0: [], 1: []}
        pending: list[tuple[Transaction, list[Row]]] = []  # sealed, not committed
        cid = 0
        next_id = 0
        for kind, a, b in ops:
            if kind == "write":
                rs = rows(next_id, b)
                next_id += b
                sink.writer.write(OP, a % 2, batch(rs))
                open_rows[a % 2] += rs
            elif kind == "checkpoint":
                cid += 1
                for s in (0, 1):
                    pending.append((sink.writer.pre_commit(OP, s, cid), open_rows[s]))
                    open_rows[s] = []
            elif kind == "complete" and pending:
                ids = sorted({t.checkpoint_id for t, _ in pending})
                n = ids[a % len(ids)]
                upto = [(t, r) for t, r in pending if t.checkpoint_id <= n]
                sink.committer.commit_checkpoint(n, [t for t, _ in upto])
                committed += [r for _, rs in upto for r in rs]
                pending = [(t, r) for t, r in pending if t.checkpoint_id > n]
            elif kind == "commit_one" and pending:
                t, rs = pending.pop(a % len(pending))
                sink.committer.commit(t)
                committed += rs
            elif kind == "abort_one" and pending:
                t, _ = pending.pop(a % len(pending))
                sink.committer.abort(t)
            elif kind == "crash":
                # The restored checkpoint recorded the pending transactions up to some id.
                ids = sorted({t.checkpoint_id for t, _ in pending})
                limit = ids[(a - 1) % len(ids)] if ids and a else 0
                restored = [(t, r) for t, r in pending if t.checkpoint_id <= limit]
                sink = make_sink(root, **kw)
                sink.committer.recover([t for t, _ in restored])
                committed += [r for _, rs in restored for r in rs]
                pending, open_rows = [], {0: [], 1: []}
                assert parquet_files(root) == (committed_paths(root) if root.exists() else set())
            assert content(replay(root) if root.exists() else pa.table({})) == sorted(committed)
        assert content(sink.committer.read()) == sorted(committed)


# ------------------------------------------------------------------------ roll back
# After a restore from checkpoint r the table holds exactly the output of checkpoints <= r
# (a restore that fell back past a damaged newest checkpoint replays the rest).

APP = "spark-ckpt/pipe"


def foreign(rs: Sequence[Row]) -> pa.Table:
    """Rows as another writer appends them (already in the table's types)."""
    return pa.table(
        {
            "id": pa.array([r[0] for r in rs], pa.int64()),
            "name": pa.array([r[1] for r in rs], pa.string()),
            "ts": pa.array([r[2] for r in rs], pa.timestamp("us", "UTC")),
        }
    )


def append_foreign(root: Path, rs: Sequence[Row]) -> None:
    write_deltalake(str(root), foreign(rs), mode="append")  # a plain append, no app id


def seal(sink: TransactionalSink, cid: int, rs: Sequence[Row]) -> list[Transaction]:
    """Stage *rs* split over two subtasks and seal both transactions of checkpoint *cid*."""
    half = len(rs) // 2
    for subtask, part in enumerate((rs[:half], rs[half:])):
        sink.writer.write(OP, subtask, batch(part))
    return [sink.writer.pre_commit(OP, s, cid) for s in (0, 1)]


def polars_rows(root: Path, version: int | None = None) -> list[Row]:
    df = pl.read_delta(str(root), version=version)
    return sorted(zip(df["id"].to_list(), df["name"].to_list(), df["ts"].to_list(), strict=True))


def deltalake_rows(root: Path) -> list[Row]:
    fs = pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem())
    return content(DeltaTable(str(root)).to_pyarrow_dataset(filesystem=fs).to_table())


def assert_table(root: Path, expected: Sequence[Row], version: int) -> None:
    """Three readers agree on the content; the app version and the protocol are right."""
    want = sorted(expected)
    assert content(replay(root)) == want  # our own log replay
    assert polars_rows(root) == want
    assert deltalake_rows(root) == want
    table = DeltaTable(str(root))
    assert (table.transaction_version(APP) or 0) == version
    p = table.protocol()
    assert (p.min_reader_version, p.min_writer_version) == (1, 2)
    assert not p.reader_features and not p.writer_features
    actions = [a for _, acts in log_actions(root) for a in acts]
    assert all(
        (a["protocol"]["minReaderVersion"], a["protocol"]["minWriterVersion"]) == (1, 2)
        for a in actions
        if "protocol" in a
    )
    assert "deletionVector" not in json.dumps(actions)


def added_by_commit(root: Path) -> dict[int, set[str]]:
    """Version -> the paths its commit added."""
    return {v: {a["add"]["path"] for a in acts if "add" in a} for v, acts in log_actions(root)}


def test_roll_back_removes_the_output_of_later_checkpoints_only(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    out: dict[int, list[Row]] = {}
    other = [(900 + i, f"other-{i}", T0) for i in range(2)]
    for c in (1, 2, 3, 4):
        out[c] = rows(100 * c, c + 1)
        assert sink.committer.commit_checkpoint(c, seal(sink, c, out[c]))
        if c == 3:
            append_foreign(root, other)  # another writer, between checkpoints 3 and 4
    adds = added_by_commit(root)  # versions: 0..2 = checkpoints 1..3, 3 = other, 4 = ckpt 4
    assert_table(root, [*out[1], *out[2], *out[3], *out[4], *other], 4)

    removed = sink.committer.roll_back_to(2)
    assert sorted(removed) == sorted(adds[2] | adds[4])  # both files of checkpoints 3 and 4
    assert_table(root, [*out[1], *out[2], *other], 2)
    assert sink.committer.committed_checkpoint() == 2
    (version, last), *_ = reversed(log_actions(root))
    assert version == 5  # one commit: the removes and the app transaction
    assert sorted(a["remove"]["path"] for a in last if "remove" in a) == sorted(removed)
    assert all(a["remove"]["dataChange"] is True for a in last if "remove" in a)
    assert [a["txn"]["version"] for a in last if "txn" in a] == [2]
    assert not [a for a in last if "add" in a]
    assert all((root / p).exists() for p in removed)  # logically removed, still on disk

    # Idempotent: no new commit.
    assert sink.committer.roll_back_to(2) == []
    assert make_sink(root).committer.roll_back_to(2) == []
    assert len(log_actions(root)) == 6

    # The next checkpoint (ids are never reused) commits normally and is visible.
    out[5] = rows(500, 3)
    assert sink.committer.commit_checkpoint(5, seal(sink, 5, out[5])) is True
    assert_table(root, [*out[1], *out[2], *out[5], *other], 5)

    # Recovery's orphan sweep keeps the removed files: earlier versions still read them.
    make_sink(root).committer.recover([])
    assert all((root / p).exists() for p in removed)
    assert_table(root, [*out[1], *out[2], *out[5], *other], 5)
    assert sorted(r[0] for r in polars_rows(root, version=4)) == sorted(
        r[0] for r in [*out[1], *out[2], *out[3], *out[4], *other]
    )
    # A VACUUM (here with no retention) deletes them; the current version is unchanged.
    assert set(DeltaTable(str(root)).vacuum(0, dry_run=False, enforce_retention_duration=False))
    assert not any((root / p).exists() for p in removed)
    assert_table(root, [*out[1], *out[2], *out[5], *other], 5)


def test_roll_back_is_a_no_op_without_a_table_or_later_output(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    assert sink.committer.roll_back_to(3) == []
    assert not root.exists()
    append_foreign(root, rows(0, 1))  # a table without this sink's app id
    assert sink.committer.roll_back_to(3) == [] and sink.committer.roll_back_to(0) == []
    assert sink.committer.commit_checkpoint(3, seal(sink, 3, rows(10, 2)))
    assert sink.committer.roll_back_to(3) == [] and sink.committer.roll_back_to(7) == []
    assert len(log_actions(root)) == 2
    assert_table(root, rows(0, 1) + rows(10, 2), 3)
    with pytest.raises(ProtocolError):
        sink.committer.roll_back_to(-1)


def test_roll_back_to_before_the_first_commit_removes_all_output(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    append_foreign(root, rows(0, 1))
    for c in (3, 4):
        sink.committer.commit_checkpoint(c, seal(sink, c, rows(10 * c, 2)))
    assert len(sink.committer.roll_back_to(2)) == 4
    assert_table(root, rows(0, 1), 2)
    assert len(sink.committer.roll_back_to(0)) == 0  # version 2 -> 0: nothing left to remove
    assert sink.committer.committed_checkpoint() == 0


def test_roll_back_then_recover_restores_a_checkpoint_whose_commit_was_lost(
    tmp_path: Path,
) -> None:
    """Checkpoint 2 completed but its commit was lost; checkpoint 3's commit carried 2's
    transactions. Restoring 2 (3 is damaged) removes both, and recovery with 2's
    transactions — in that order, as ``recover_sink`` does — adds 2's back."""
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.committer.commit_checkpoint(1, seal(sink, 1, rows(10, 2)))
    t2 = seal(sink, 2, rows(20, 2))  # checkpoint 2's state: t2
    t3 = seal(sink, 3, rows(30, 2))
    sink.committer.commit_checkpoint(3, [*t2, *t3])  # checkpoint 3's state: t2 + t3
    assert_table(root, rows(10, 2) + rows(20, 2) + rows(30, 2), 3)

    new = make_sink(root)  # the restarted job
    assert len(new.committer.roll_back_to(2)) == 4
    new.committer.recover(t2)
    assert_table(root, rows(10, 2) + rows(20, 2), 2)
    active = pa.table(DeltaTable(str(root)).get_add_actions(flatten=True)).column("path")
    t3_files = {f.path for t in t3 for f in staged_files(t)}
    # checkpoint 3's files stay (version 2 of the table reads them) until a VACUUM
    assert parquet_files(root) == set(active.to_pylist()) | t3_files
    new.committer.recover(t2)  # idempotent
    assert new.committer.roll_back_to(2) == []
    assert new.committer.commit_checkpoint(4, seal(new, 4, rows(40, 2)))
    assert_table(root, rows(10, 2) + rows(20, 2) + rows(40, 2), 4)


def test_roll_back_skips_output_that_another_writer_compacted(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    for c in (1, 2):
        sink.committer.commit_checkpoint(c, seal(sink, c, rows(10 * c, 2)))
    DeltaTable(str(root)).optimize.compact()  # rewrites 1 and 2: not ours any more
    for c in (3, 4):
        sink.committer.commit_checkpoint(c, seal(sink, c, rows(10 * c, 2)))
    assert len(sink.committer.roll_back_to(2)) == 4
    assert_table(root, rows(10, 2) + rows(20, 2), 2)

    for c in (5, 6):
        sink.committer.commit_checkpoint(c, seal(sink, c, rows(10 * c, 2)))
    DeltaTable(str(root)).optimize.compact()  # 6's output compacted: cannot be rolled back
    assert sink.committer.roll_back_to(5) == []
    assert sink.committer.committed_checkpoint() == 5
    assert_table(root, rows(10, 2) + rows(20, 2) + rows(50, 2) + rows(60, 2), 5)


def test_roll_back_redoes_its_work_after_losing_a_commit_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits are never rebased: a commit landing between the roll back's read and its
    commit makes it re-read the table and recompute what to remove."""
    root = tmp_path / "t"
    sink = make_sink(root)
    for c in (1, 2, 3):
        sink.committer.commit_checkpoint(c, seal(sink, c, rows(10 * c, 2)))
    racer = make_sink(root)  # another committer of the same sink (a late global committer)
    staged = seal(racer, 4, rows(40, 2))
    calls = []
    real = sink.committer.rollback._plan

    def interleaved(*args: Any, **kw: Any) -> RollbackPlan:
        found = real(*args, **kw)
        calls.append(len(found.added_after))
        if len(calls) == 1:
            racer.committer.commit_checkpoint(4, staged)
            append_foreign(root, rows(90, 1))
        return found

    monkeypatch.setattr(sink.committer.rollback, "_plan", interleaved)
    assert len(sink.committer.roll_back_to(1)) == 6  # checkpoints 2, 3 and the racing 4
    assert calls == [4, 6]
    assert_table(root, rows(10, 2) + rows(90, 1), 1)
    assert len(log_actions(root)) == 6  # 3 + racer + foreign + one roll back


def test_roll_back_gives_up_after_max_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "t"
    sink = make_sink(root, max_attempts=3)
    for c in (1, 2):
        sink.committer.commit_checkpoint(c, seal(sink, c, rows(10 * c, 2)))
    real = sink.committer.rollback._plan
    n = iter(range(100))

    def always_beaten(*args: Any, **kw: Any) -> RollbackPlan:
        found = real(*args, **kw)
        append_foreign(root, rows(90 + next(n), 1))
        return found

    monkeypatch.setattr(sink.committer.rollback, "_plan", always_beaten)
    with pytest.raises(StoreError, match="lost 3 commit races"):
        sink.committer.roll_back_to(1)
    assert_table(root, rows(10, 2) + rows(20, 2) + rows(90, 3), 2)


def test_roll_back_reads_past_a_cleaned_up_log_only_when_it_can(tmp_path: Path) -> None:
    def clean_up_log(root: Path) -> None:
        DeltaTable(str(root)).create_checkpoint()  # at the current version
        *old, _ = sorted((root / "_delta_log").glob("*.json"))
        for f in old:
            f.unlink()

    # Another writer's history was cleaned up before this sink's first commit: fine.
    a = tmp_path / "a"
    for i in range(3):
        append_foreign(a, rows(1000 + i, 1))
    clean_up_log(a)
    sink = make_sink(a)
    for c in (3, 4):
        sink.committer.commit_checkpoint(c, seal(sink, c, rows(10 * c, 2)))
    assert len(sink.committer.roll_back_to(2)) == 4
    assert polars_rows(a) == sorted(rows(1000, 1) + rows(1001, 1) + rows(1002, 1))
    assert deltalake_rows(a) == polars_rows(a)
    assert sink.committer.committed_checkpoint() == 2

    # The commit that says where to stop has been cleaned up: a clear StoreError.
    b = tmp_path / "b"
    sink = make_sink(b)
    for c in (1, 2, 3):
        sink.committer.commit_checkpoint(c, seal(sink, c, rows(10 * c, 2)))
    clean_up_log(b)  # keeps only commit 2 (checkpoint 3) and its log checkpoint
    sink.committer.commit_checkpoint(4, seal(sink, 4, rows(40, 2)))
    for back in (1, 2):
        with pytest.raises(StoreError, match=r"commit 1 .* has been cleaned up"):
            make_sink(b).committer.roll_back_to(back)
    assert make_sink(b).committer.committed_checkpoint() == 4
    assert len(make_sink(b).committer.roll_back_to(3)) == 2  # only needs commits 2 and 3
    assert polars_rows(b) == sorted(rows(10, 2) + rows(20, 2) + rows(30, 2))

    # Every commit of this sink has been cleaned up, only another writer's is left.
    c = tmp_path / "c"
    sink = make_sink(c)
    for cid in (1, 2):
        sink.committer.commit_checkpoint(cid, seal(sink, cid, rows(10 * cid, 2)))
    append_foreign(c, rows(90, 1))
    clean_up_log(c)
    with pytest.raises(StoreError, match=r"commit 1 .* has been cleaned up"):
        make_sink(c).committer.roll_back_to(1)
    assert polars_rows(c) == sorted(rows(10, 2) + rows(20, 2) + rows(90, 1))
    assert make_sink(c).committer.committed_checkpoint() == 2


# A model of restores: each step is a checkpoint (committed, or its commit lost in a crash),
# a plain append by another writer, or a restore of a retained checkpoint of the current
# lineage (roll back, then recover with the checkpoint's transactions, as recover_sink does).
Step = tuple[str, int]
restore_steps = st.lists(
    st.tuples(
        st.sampled_from(["checkpoint"] * 3 + ["lost", "foreign"] + ["restore"] * 2),
        st.integers(0, 4),  # rows, or which retained checkpoint to restore
    ),
    min_size=1,
    max_size=10,
)


def run_restore_model(
    steps: Sequence[Step],
    new_sink: Callable[[], TransactionalSink],
    read_ids: Callable[[], list[int]],
    append: Callable[[list[Row]], None] | None,
    *,
    lazy_table: bool,
) -> None:
    """Drive a sink through *steps*, comparing after each step the ids *read_ids* returns
    and the committed checkpoint with a plain model: the rows of the committed checkpoints
    of the current lineage plus the other writer's. *lazy_table*: the sink makes no commit
    (keeps version 0) until there is a table or a file to create it from."""
    sink = new_sink()
    sealed: dict[int, list[Row]] = {}  # checkpoint id -> its rows, on the current lineage
    committed: set[int] = set()  # checkpoints whose rows are in the table
    states: dict[int, list[Transaction]] = {}  # checkpoint id -> transactions in its state
    pending: list[Transaction] = []  # sealed, not committed: the next checkpoint records them
    other: list[Row] = []
    exists = not lazy_table
    version = last = next_row = 0
    for kind, a in steps:
        if kind in ("checkpoint", "lost"):
            last += 1
            rs = rows(next_row, a)
            next_row += a
            pending += seal(sink, last, rs)
            sealed[last] = rs
            states[last] = list(pending)
            if kind == "checkpoint":
                exists |= any(sealed[t.checkpoint_id] for t in pending)
                assert sink.committer.commit_checkpoint(last, pending) is exists
                committed |= {t.checkpoint_id for t in pending}
                pending = []
                version = last if exists else version
        elif kind == "foreign" and append is not None:
            rs = [(10_000 + next_row, "other", T0)]
            next_row += 1
            append(rs)
            other += rs
            exists = True
        elif kind == "restore" and sealed:
            r = sorted(sealed)[a % len(sealed)]
            sink = new_sink()  # the restarted job
            sink.committer.roll_back_to(r)
            sink.committer.recover(states[r])
            sealed = {c: rs for c, rs in sealed.items() if c <= r}
            states = {c: t for c, t in states.items() if c <= r}
            committed = set(sealed)  # what r's commits and r's state hold
            pending = []
            exists |= any(sealed[t.checkpoint_id] for t in states[r])
            version = r if exists else version
        assert sink.committer.committed_checkpoint() == version
        want = [r[0] for c in committed for r in sealed[c]] + [r[0] for r in other]
        assert read_ids() == sorted(want)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=restore_steps)
def test_restores_match_a_plain_model(steps: list[Step]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "t"

        def read_ids() -> list[int]:
            if not (root / "_delta_log").exists():
                return []
            ids = sorted(r[0] for r in content(replay(root)))
            assert sorted(r[0] for r in polars_rows(root)) == ids  # a second reader agrees
            return ids

        run_restore_model(
            steps,
            lambda: make_sink(root),
            read_ids,
            lambda rs: append_foreign(root, rs),
            lazy_table=True,
        )
        if (root / "_delta_log").exists():
            p = DeltaTable(str(root)).protocol()
            assert (p.min_reader_version, p.min_writer_version) == (1, 2)

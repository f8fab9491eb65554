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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_ckpt.barrier import BARRIER_COLUMNS
from spark_ckpt.delta_sink import DeltaSink, DeltaStats, StagedFile, delta_stats, staged_files
from spark_ckpt.errors import ConfigError, ProtocolError, StoreError
from spark_ckpt.sink import Transaction, TwoPhaseCommitSink

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
    return DeltaSink(str(root), pipeline="pipe", sink_uid="sink", **kw)


# ------------------------------------------------------------- independent log replay


def log_actions(table: Path) -> list[tuple[int, list[dict[str, Any]]]]:
    out = []
    for f in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        out.append((int(f.stem), actions))
    return out


def replay(table: Path) -> pa.Table:
    """The table's content from the log, read without delta-rs: active adds minus removes."""
    active: dict[str, None] = {}
    for _, actions in log_actions(table):
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
    _: TwoPhaseCommitSink = sink  # structurally a 2PC sink (checked by mypy)
    expected: list[Row] = []
    for subtask, (first, n) in enumerate([(0, 3), (100, 5)]):
        for part in (rows(first, n - 1), rows(first + n - 1, 1)):
            sink.write(OP, subtask, batch(part, barrier_columns=True))
            expected += part
    sink.write(OP, 1, batch([]))  # empty batches stage nothing
    txns = [sink.pre_commit(OP, s, 1) for s in (0, 1)]
    assert [len(t.payload) for t in txns] == [1, 1]
    # Staged, sealed, but invisible: no table yet, only loose files.
    assert not (root / "_delta_log").exists()
    assert sink.read().num_rows == 0 and sink.committed_checkpoint() == 0
    assert len(parquet_files(root)) == 2

    assert sink.commit_checkpoint(1, txns) is True
    assert content(replay(root)) == sorted(expected)
    assert content(sink.read()) == sorted(expected)
    assert sink.committed_checkpoint() == 1
    assert [v for v, _ in log_actions(root)] == [0]  # both subtasks in one commit

    # Checkpoint 2: staged data stays invisible until its commit.
    more = rows(200, 4)
    sink.write(OP, 0, batch(more))
    txn2 = [sink.pre_commit(OP, s, 2) for s in (0, 1)]
    assert txn2[1].payload == ()  # an empty transaction is fine
    assert content(replay(root)) == sorted(expected)
    assert sink.commit_checkpoint(2, txn2) is True
    assert content(replay(root)) == sorted(expected + more)
    assert [v for v, _ in log_actions(root)] == [0, 1]
    app = [a["txn"] for _, acts in log_actions(root) for a in acts if "txn" in a]
    assert app == [
        {"appId": "spark-ckpt/pipe/sink", "version": 1},
        {"appId": "spark-ckpt/pipe/sink", "version": 2},
    ]


def test_buffering_stages_files_at_the_target_size(tmp_path: Path) -> None:
    sink = make_sink(tmp_path / "t", target_file_bytes=1)  # every write is its own file
    for i in range(3):
        sink.write(OP, 0, batch(rows(10 * i, 2)))
    assert len(parquet_files(tmp_path / "t")) == 3  # staged before the seal
    txn = sink.pre_commit(OP, 0, 1)
    assert len(txn.payload) == 3
    assert sum(f.rows for f in staged_files(txn)) == 6
    sink.commit_checkpoint(1, [txn])
    assert content(replay(tmp_path / "t")) == sorted(rows(0, 2) + rows(10, 2) + rows(20, 2))


def test_writes_are_encoded_into_one_in_progress_file_per_subtask(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    for i in range(3):
        sink.write(OP, 0, batch(rows(10 * i, 2)))
    sink.write(OP, 1, batch(rows(100, 1)))
    assert len(parquet_files(root)) == 2  # encoded as written, before the seal
    txn = sink.pre_commit(OP, 0, 1)
    [f] = staged_files(txn)
    meta = pq.read_metadata(root / f.path)
    assert (meta.num_rows, meta.num_row_groups) == (6, 3)  # a row group per write
    stats = json.loads(f.stats)
    assert (stats["numRecords"], stats["minValues"]["id"], stats["maxValues"]["id"]) == (6, 0, 21)
    # a schema change rolls the file: one file per schema
    sink.write(OP, 0, batch(rows(30, 1)))
    sink.write(OP, 0, batch(rows(40, 1)).drop_columns(["name"]))
    assert [g.rows for g in staged_files(sink.pre_commit(OP, 0, 2))] == [1, 1]
    sink.commit_checkpoint(1, [txn, sink.pre_commit(OP, 1, 1)])
    assert content(replay(root)) == sorted(rows(0, 2) + rows(10, 2) + rows(20, 2) + rows(100, 1))


def test_recover_deletes_in_progress_files(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.write(OP, 0, batch(rows(0, 2)))
    assert len(parquet_files(root)) == 1
    sink.recover(OP, [])
    assert parquet_files(root) == set()
    assert sink.pre_commit(OP, 0, 1).payload == ()  # nothing left open


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
    sink.write(OP, 0, batch(rows(0, 3)))
    a = sink.pre_commit(OP, 0, 1)
    assert sink.commit_checkpoint(1, [a]) is True
    assert sink.commit_checkpoint(1, [a]) is False  # replay of the same checkpoint
    assert make_sink(root).commit_checkpoint(1, [a]) is False  # ... by another instance
    sink.commit(a)  # per-transaction commit of a committed transaction: no-op
    assert len(log_actions(root)) == 1

    # A committed transaction included again in a later checkpoint is not added twice.
    sink.write(OP, 0, batch(rows(10, 2)))
    b = sink.pre_commit(OP, 0, 2)
    assert sink.commit_checkpoint(2, [a, b]) is True
    assert content(replay(root)) == sorted(rows(0, 3) + rows(10, 2))

    # An older checkpoint after a newer one: a no-op (the newer one contained it).
    assert sink.commit_checkpoint(1, [a]) is False
    assert sink.committed_checkpoint() == 2


def test_per_subtask_commit_keeps_the_checkpoint_version(tmp_path: Path) -> None:
    """``commit(txn)`` (what tasks call on notify-complete) must not claim the checkpoint:
    a later ``commit_checkpoint`` of it still adds the other subtasks' files."""
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.write(OP, 0, batch(rows(0, 2)))
    sink.write(OP, 1, batch(rows(50, 2)))
    t0, t1 = sink.pre_commit(OP, 0, 3), sink.pre_commit(OP, 1, 3)
    sink.commit(t0)
    sink.commit(t0)
    assert sink.committed_checkpoint() == 0
    assert content(replay(root)) == sorted(rows(0, 2))
    assert sink.commit_checkpoint(3, [t0, t1]) is True
    assert content(replay(root)) == sorted(rows(0, 2) + rows(50, 2))
    assert sink.committed_checkpoint() == 3


# --------------------------------------------------------------- abort and recovery


def test_abort_deletes_staged_files_but_never_committed_ones(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.write(OP, 0, batch(rows(0, 2)))
    kept = sink.pre_commit(OP, 0, 1)
    sink.commit_checkpoint(1, [kept])
    sink.write(OP, 0, batch(rows(10, 2)))
    dropped = sink.pre_commit(OP, 0, 2)
    assert len(parquet_files(root)) == 2
    sink.abort(dropped)
    sink.abort(dropped)  # missing files are fine
    sink.abort(kept)  # referenced by the table: kept
    assert parquet_files(root) == committed_paths(root)
    assert content(replay(root)) == sorted(rows(0, 2))
    with pytest.raises(StoreError, match="gone"):
        sink.commit_checkpoint(2, [dropped])
    assert content(replay(root)) == sorted(rows(0, 2))


def test_recover_commits_restored_transactions_and_deletes_orphans(tmp_path: Path) -> None:
    root = tmp_path / "t"
    old = make_sink(root, target_file_bytes=1)
    old.write(OP, 0, batch(rows(0, 2)))
    old.write(OP, 1, batch(rows(20, 2)))
    restored = [old.pre_commit(OP, 0, 4), old.pre_commit(OP, 1, 4)]  # in checkpoint 4
    old.write(OP, 0, batch(rows(40, 2)))
    orphan_sealed = old.pre_commit(OP, 0, 5)  # checkpoint 5 never completed
    old.write(OP, 1, batch(rows(60, 2)))  # staged, never sealed
    assert len(parquet_files(root)) == 4
    foreign = root / "part-00000-someone-else.c000.snappy.parquet"
    pq.write_table(batch(rows(99, 1)), foreign)  # not this sink's: never touched

    new = make_sink(root)  # the restarted job
    new.recover(OP, restored)
    assert content(replay(root)) == sorted(rows(0, 2) + rows(20, 2))
    assert new.committed_checkpoint() == 4
    assert parquet_files(root) == committed_paths(root) | {foreign.name}
    new.recover(OP, restored)  # idempotent
    assert content(replay(root)) == sorted(rows(0, 2) + rows(20, 2))
    assert len(log_actions(root)) == 1
    with pytest.raises(StoreError):
        new.commit_checkpoint(5, [orphan_sealed])


def test_recover_spares_files_staged_by_the_starting_run(tmp_path: Path) -> None:
    """A ckpt-sink query stages its first micro-batch before the coordinator installs the
    sink and recovers it: recovery with a cutoff deletes only files staged before it."""
    root = tmp_path / "t"
    old = make_sink(root, target_file_bytes=1)
    old.write(OP, 0, batch(rows(0, 2)))
    old.pre_commit(OP, 0, 1)  # staged by an earlier run, never committed: an orphan
    (orphan,) = parquet_files(root)
    os.utime(root / orphan, (1_000, 1_000))  # long ago
    cutoff_ms = 2_000_000
    current = make_sink(root).stage(batch(rows(10, 2)), subtask=0)  # the starting run (now)
    make_sink(root).recover(OP, [], staged_before_ms=cutoff_ms)
    assert parquet_files(root) == {current.path}


def test_schema_mismatch_is_a_protocol_error_naming_the_columns(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.write(OP, 0, batch(rows(0, 2)))
    sink.commit_checkpoint(1, [sink.pre_commit(OP, 0, 1)])
    sink.write(OP, 0, pa.table({"id": ["x"], "extra": [1.5]}))
    bad = sink.pre_commit(OP, 0, 2)
    with pytest.raises(ProtocolError) as err:
        sink.commit_checkpoint(2, [bad])
    for word in ("extra", "name", "ts", "id"):
        assert word in str(err.value)
    assert content(replay(root)) == sorted(rows(0, 2))
    with pytest.raises(ProtocolError, match="Delta"):
        sink.stage(pa.table({"d": pa.array([1], pa.duration("s"))}), subtask=0)
    with pytest.raises(ConfigError):
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
from spark_ckpt.delta_sink import DeltaSink
from spark_ckpt.sink import Transaction, TwoPhaseCommitSink
sink = DeltaSink(sys.argv[1], pipeline="pipe", sink_uid="sink", target_file_bytes=1)
mode = sys.argv[2]

def batch(first, n):
    return pa.table({"id": pa.array(range(first, first + n), pa.int64()),
                     "name": [f"name-{i}" for i in range(first, first + n)],
                     "ts": pa.array([0] * n, pa.timestamp("us", tz="UTC"))})

if mode == "crash":
    sink.write("out", 0, batch(100, 3))
    sealed = sink.pre_commit("out", 0, 7)
    sink.write("out", 1, batch(200, 3))
    sink.write("out", 1, batch(300, 3))   # staged, never sealed
    print(sealed.to_json(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
else:
    txns = [[Transaction.from_json(t) for t in ts] for ts in json.loads(sys.argv[3])]
    print("ready", flush=True)
    sys.stdin.readline()                  # released together with the other committer
    out = [sink.commit_checkpoint(cid + 1, ts) for cid, ts in enumerate(txns)]
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
    sink.write(OP, 0, batch(rows(0, 2)))
    sink.commit_checkpoint(1, [sink.pre_commit(OP, 0, 1)])
    before = log_actions(root)

    child = run_child(str(root), "crash")
    out, _ = child.communicate()
    assert child.returncode == -signal.SIGKILL
    sealed = Transaction.from_json(out.strip())
    assert log_actions(root) == before  # nothing of the killed writer is visible
    assert content(replay(root)) == sorted(rows(0, 2))
    assert len(parquet_files(root)) == 4  # 1 committed + 3 staged by the child

    # Restart from a checkpoint that recorded nothing of the child: all orphans go.
    make_sink(root).recover(OP, [])
    assert parquet_files(root) == committed_paths(root)
    assert content(replay(root)) == sorted(rows(0, 2))
    with pytest.raises(StoreError):
        make_sink(root).commit(sealed)


def test_killed_writer_sealed_transaction_is_recovered(tmp_path: Path) -> None:
    root = tmp_path / "t"
    child = run_child(str(root), "crash")
    out, _ = child.communicate()
    assert child.returncode == -signal.SIGKILL
    sealed = Transaction.from_json(out.strip())
    make_sink(root).recover(OP, [sealed])  # restored checkpoint 7 recorded it
    assert content(replay(root))[0][0] == 100
    assert sorted(r[0] for r in content(replay(root))) == [100, 101, 102]
    assert parquet_files(root) == committed_paths(root)


def test_racing_committers_add_the_data_once(tmp_path: Path) -> None:
    """Two processes commit checkpoint 1 (creating the table) and then checkpoint 2
    (appending) at the same time: each checkpoint is committed by exactly one of them."""
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.write(OP, 0, batch(rows(0, 3)))
    sink.write(OP, 1, batch(rows(10, 3)))
    cp1 = [sink.pre_commit(OP, 0, 1), sink.pre_commit(OP, 1, 1)]
    sink.write(OP, 0, batch(rows(20, 3)))
    cp2 = [sink.pre_commit(OP, 0, 2), sink.pre_commit(OP, 1, 2)]
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
    assert content(sink.read()) == expected
    assert sink.committed_checkpoint() == 2


# ----------------------------------------------------------------- second readers


def test_second_readers_and_protocol(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    sink.write(OP, 0, batch(rows(0, 4), barrier_columns=True))
    sink.write(OP, 1, batch(rows(9, 2), barrier_columns=True))
    sink.commit_checkpoint(1, [sink.pre_commit(OP, s, 1) for s in (0, 1)])

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
                sink.write(OP, a % 2, batch(rs))
                open_rows[a % 2] += rs
            elif kind == "checkpoint":
                cid += 1
                for s in (0, 1):
                    pending.append((sink.pre_commit(OP, s, cid), open_rows[s]))
                    open_rows[s] = []
            elif kind == "complete" and pending:
                ids = sorted({t.checkpoint_id for t, _ in pending})
                n = ids[a % len(ids)]
                upto = [(t, r) for t, r in pending if t.checkpoint_id <= n]
                sink.commit_checkpoint(n, [t for t, _ in upto])
                committed += [r for _, rs in upto for r in rs]
                pending = [(t, r) for t, r in pending if t.checkpoint_id > n]
            elif kind == "commit_one" and pending:
                t, rs = pending.pop(a % len(pending))
                sink.commit(t)
                committed += rs
            elif kind == "abort_one" and pending:
                t, _ = pending.pop(a % len(pending))
                sink.abort(t)
            elif kind == "crash":
                # The restored checkpoint recorded the pending transactions up to some id.
                ids = sorted({t.checkpoint_id for t, _ in pending})
                limit = ids[(a - 1) % len(ids)] if ids and a else 0
                restored = [(t, r) for t, r in pending if t.checkpoint_id <= limit]
                sink = make_sink(root, **kw)
                sink.recover(OP, [t for t, _ in restored])
                committed += [r for _, rs in restored for r in rs]
                pending, open_rows = [], {0: [], 1: []}
                assert parquet_files(root) == (committed_paths(root) if root.exists() else set())
            assert content(replay(root) if root.exists() else pa.table({})) == sorted(committed)
        assert content(sink.read()) == sorted(committed)

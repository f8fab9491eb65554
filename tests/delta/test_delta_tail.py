"""DeltaTailSource on real Delta tables written with delta-rs.

Oracles are plain Python models of the writes performed here (one list entry per appended
table, in version order), never derived from the source under test.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_ckpt.delta.tail_driver import DeltaTailSource
from spark_ckpt.delta.tail_executors import DeltaReadPlan
from spark_ckpt.delta.upstream_columns import upstream_name
from spark_ckpt.errors import ConfigError, ProtocolError
from spark_ckpt.protocol.barrier import BARRIER_COLUMNS

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("id", pa.int64()), ("write", pa.int64()), ("name", pa.string()), ("ts", TS)])


def batch(write: int, first_id: int, rows: int) -> pa.Table:
    """Rows ``first_id .. first_id + rows - 1`` of write number *write*."""
    ids = list(range(first_id, first_id + rows))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "write": pa.array([write] * rows, pa.int64()),
            "name": pa.array([f"w{write}-r{i}" for i in ids]),
            "ts": pa.array([1_700_000_000_000_000 + i for i in ids], TS),
        },
        schema=SCHEMA,
    )


class Writer:
    """Appends to a Delta table and records the oracle: the tables of each version."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.versions: list[list[pa.Table]] = []  # index = table version
        self.next_id = 0

    def _table(self, rows: int) -> pa.Table:
        table = batch(len(self.versions), self.next_id, rows)
        self.next_id += rows
        return table

    def append(self, rows: int) -> pa.Table:
        """One write_deltalake commit (one data file)."""
        table = self._table(rows)
        write_deltalake(self.path, table, mode="append")
        self.versions.append([table])
        return table

    def append_files(self, sizes: Sequence[int], row_group_size: int = 3) -> None:
        """One commit adding several self-written files without stats (names given in
        reverse order so that commit order differs from path order); the oracle keeps them
        in path order."""
        dt = DeltaTable(self.path)
        tables, actions = [], []
        version = len(self.versions)
        for i, rows in enumerate(sizes):
            table = self._table(rows)
            name = f"v{version:04d}-f{i:03d}.parquet"
            pq.write_table(table, f"{self.path}/{name}", row_group_size=row_group_size)
            size = os.path.getsize(f"{self.path}/{name}")
            actions.append(AddAction(name, size, {}, int(time.time() * 1000), True, ""))
            tables.append(table)
        dt.create_write_transaction(list(reversed(actions)), mode="append", schema=SCHEMA)
        self.versions.append(tables)

    def rows(self, from_version: int = 0) -> pa.Table:
        return pa.concat_tables(
            [t for tables in self.versions[from_version:] for t in tables], promote_options="none"
        ).cast(SCHEMA)


def read_all(source: DeltaTailSource, channel: int) -> pa.Table:
    return source.plan(channel, 0, source.heads()[channel]).read()


def by_id(table: pa.Table) -> pa.Table:
    return table.sort_by("id")


def log_paths(path: str, version: int) -> list[str]:
    """Independent reader of one Delta commit file: the added paths, in file order."""
    with open(f"{path}/_delta_log/{version:020d}.json") as f:
        actions = [json.loads(line) for line in f if line.strip()]
    return [a["add"]["path"] for a in actions if "add" in a]


@pytest.fixture
def writer(tmp_path: Path) -> Writer:
    w = Writer(tmp_path / "table")
    w.append(5)  # version 0: the initial data
    return w


def test_is_a_channel_source(writer: Writer) -> None:
    # (A static ``source: ChannelSource = ...`` needs ReadPlan's attributes to be read-only
    # properties: frozen dataclasses cannot satisfy settable protocol members.)
    source = DeltaTailSource(writer.path)
    assert all(callable(getattr(source, m)) for m in ("heads", "plan"))
    assert source.channels == 1
    assert source.schema == SCHEMA


def test_single_channel_is_the_appended_rows_in_commit_order(writer: Writer) -> None:
    writer.append(3)
    writer.append_files([4, 0, 7, 2])
    writer.append(1)
    source = DeltaTailSource(writer.path)
    assert source.heads() == [writer.rows().num_rows]
    got = read_all(source, 0)
    assert got.schema == SCHEMA
    assert got.equals(writer.rows())


@pytest.mark.parametrize("channels", [2, 3, 5])
def test_channels_partition_the_rows_in_file_order(tmp_path: Path, channels: int) -> None:
    writer = Writer(tmp_path / "t")
    for rows in [4, 1, 6, 3, 2, 5, 2, 3]:
        writer.append(rows)
    source = DeltaTailSource(writer.path, channels=channels)
    heads = source.heads()
    parts = [read_all(source, c) for c in range(channels)]
    assert [p.num_rows for p in parts] == heads
    assert by_id(pa.concat_tables(parts)).equals(by_id(writer.rows()))
    # Each write is one file: its rows sit contiguously in one channel, in order, and the
    # writes of a channel follow version order. The channel is the documented hash of the
    # file's log path.
    for c, part in enumerate(parts):
        expected_writes = [
            v
            for v in range(len(writer.versions))
            if int.from_bytes(hashlib.sha256(log_paths(writer.path, v)[0].encode()).digest()[:8])
            % channels
            == c
        ]
        expected = [writer.versions[v][0] for v in expected_writes]
        assert part.equals(pa.concat_tables(expected) if expected else SCHEMA.empty_table())


def test_heads_grow_with_appends_and_are_incremental(writer: Writer) -> None:
    source = DeltaTailSource(writer.path, channels=2)
    seen = []
    for rows in [3, 0, 4]:
        before = source.heads()
        writer.append(rows) if rows else writer.append_files([])
        after = source.heads()
        assert all(a >= b for a, b in zip(after, before, strict=True))
        assert sum(after) == writer.rows().num_rows
        seen.append(sum(after))
    assert source.next_version == len(writer.versions)
    assert seen == [8, 8, 12]
    assert source.heads() == after  # no new version: unchanged


def test_starting_version_skips_earlier_versions(writer: Writer) -> None:
    writer.append(2)
    writer.append(3)
    source = DeltaTailSource(writer.path, starting_version=2)
    assert read_all(source, 0).equals(writer.rows(from_version=2))
    future = DeltaTailSource(writer.path, starting_version=5)
    assert future.heads() == [0]
    writer.append(1)  # version 3
    writer.append(4)  # version 4
    assert future.heads() == [0]
    writer.append(2)  # version 5
    assert future.heads() == [2]
    assert read_all(future, 0).equals(writer.rows(from_version=5))


@pytest.fixture(scope="module")
def replay_table(tmp_path_factory: pytest.TempPathFactory) -> Writer:
    writer = Writer(tmp_path_factory.mktemp("replay") / "t")
    writer.append(7)
    writer.append_files([5, 9, 1, 6], row_group_size=2)
    writer.append(4)
    writer.append_files([8, 3], row_group_size=3)
    return writer


@settings(
    deadline=None, max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(channels=st.integers(1, 3), data=st.data())
def test_any_split_replays_the_same_rows(
    replay_table: Writer, channels: int, data: st.DataObject
) -> None:
    source = DeltaTailSource(replay_table.path, channels=channels)
    heads = source.heads()
    whole = []
    for c, head in enumerate(heads):
        cuts = sorted(data.draw(st.lists(st.integers(0, head), max_size=6), label=f"cuts{c}"))
        bounds = [0, *cuts, head]
        pieces = [source.plan(c, a, b).read() for a, b in itertools.pairwise(bounds)]
        assert all(
            p.num_rows == b - a
            for p, (a, b) in zip(pieces, itertools.pairwise(bounds), strict=True)
        )
        joined = pa.concat_tables(pieces)
        assert joined.equals(read_all(source, c))
        whole.append(joined)
    if channels == 1:
        assert whole[0].equals(replay_table.rows())
    assert by_id(pa.concat_tables(whole)).equals(by_id(replay_table.rows()))


_CHILD = """
import pickle, sys
import pyarrow as pa
plan = pickle.loads(sys.stdin.buffer.read())
table = plan.read()
with pa.ipc.new_stream(sys.stdout.buffer, table.schema) as w:
    w.write_table(table)
"""


def test_plans_are_picklable_and_read_in_a_fresh_process(writer: Writer) -> None:
    writer.append_files([4, 6], row_group_size=2)
    source = DeltaTailSource(writer.path)
    assert source.heads() == [15]
    plan = source.plan(0, 3, 12)
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert DeltaReadPlan.from_json(plan.to_json()) == plan
    assert len(pickle.dumps(plan)) < 4096
    expected = writer.rows().slice(3, 9)
    assert plan.read().equals(expected)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=pickle.dumps(plan),
        capture_output=True,
        check=True,
    ).stdout
    assert pa.ipc.open_stream(out).read_all().equals(expected)


def test_plan_rejects_ranges_past_the_head(writer: Writer) -> None:
    source = DeltaTailSource(writer.path, channels=2)
    heads = source.heads()
    with pytest.raises(ProtocolError):
        source.plan(0, 0, heads[0] + 1)
    with pytest.raises(ProtocolError):
        source.plan(2, 0, 0)
    assert source.plan(1, heads[1], heads[1]).read().equals(SCHEMA.empty_table())


@pytest.mark.parametrize("change", ["delete", "overwrite"])
def test_removing_data_is_a_protocol_error(writer: Writer, change: str) -> None:
    writer.append(3)
    source = DeltaTailSource(writer.path)
    assert source.heads() == [8]
    if change == "delete":
        DeltaTable(writer.path).delete("id = 1")
        operation = "DELETE"
    else:
        write_deltalake(writer.path, batch(9, 100, 2), mode="overwrite")
        operation = "WRITE"
    for _ in range(2):  # the source stays stuck at the offending version
        with pytest.raises(ProtocolError, match="append-only") as info:
            source.heads()
        assert "version 2" in str(info.value)
        assert operation in str(info.value)
    assert source.next_version == 2
    assert source.plan(0, 0, 8).read().equals(writer.rows())  # earlier rows stay readable


def test_optimize_is_ignored(writer: Writer) -> None:
    writer.append(3)
    writer.append(2)
    metrics = DeltaTable(writer.path).optimize.compact()
    assert metrics["numFilesRemoved"] == 3  # a real rewrite happened (dataChange = false)
    writer.versions.append([])  # the OPTIMIZE version adds no rows
    writer.append(4)
    source = DeltaTailSource(writer.path, channels=2)
    parts = [read_all(source, c) for c in range(2)]
    assert by_id(pa.concat_tables(parts)).equals(by_id(writer.rows()))
    assert source.next_version == 5


def test_upstream_barrier_columns_are_renamed(tmp_path: Path) -> None:
    table = pa.table(
        {
            "x": [1, 2, 3],
            "_ckpt_kind": ["data", "barrier", "data"],
            "_ckpt_offset": [0, 1, 1],
            "_upstream_ckpt_channel": [7, 7, 7],
            "ckpt_kind": ["a", "b", "c"],
        }
    )
    write_deltalake(str(tmp_path / "t"), table)
    source = DeltaTailSource(str(tmp_path / "t"))
    assert source.schema.names == [
        "x",
        "_upstream_ckpt_kind",
        "_upstream_ckpt_offset",
        "_upstream_upstream_ckpt_channel",
        "ckpt_kind",
    ]
    got = read_all(source, 0)
    assert got.schema == source.schema
    assert got.to_pydict() == {
        "x": [1, 2, 3],
        "_upstream_ckpt_kind": ["data", "barrier", "data"],
        "_upstream_ckpt_offset": [0, 1, 1],
        "_upstream_upstream_ckpt_channel": [7, 7, 7],
        "ckpt_kind": ["a", "b", "c"],
    }
    assert all(upstream_name(c) == "_upstream" + c for c in BARRIER_COLUMNS)
    assert not set(source.schema.names) & set(BARRIER_COLUMNS)


def test_added_columns_are_ignored_and_empty_tables_start_at_zero(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    DeltaTable.create(path, SCHEMA)
    source = DeltaTailSource(path)
    assert source.heads() == [0]
    first = batch(0, 0, 3)
    write_deltalake(path, first, mode="append")
    wider = batch(1, 3, 2).append_column("extra", pa.array([1.5, 2.5]))
    write_deltalake(path, wider, mode="append", schema_mode="merge")
    assert source.heads() == [5]
    assert read_all(source, 0).equals(pa.concat_tables([first, batch(1, 3, 2)]))


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({}, "path"),
        ({"path": "  "}, "path"),
        ({"path": "<missing>"}, "path"),
        ({"path": "<table>", "channels": "0"}, "channels"),
        ({"path": "<table>", "Channels": "two"}, "channels"),
        ({"path": "<table>", "startingversion": "-1"}, "startingVersion"),
        ({"path": "<table>", "StartingVersion": "1.5"}, "startingVersion"),
        ({"path": "<partitioned>"}, "path"),
    ],
)
def test_bad_options_name_the_option(
    writer: Writer, tmp_path: Path, options: dict[str, str], option: str
) -> None:
    partitioned = str(tmp_path / "partitioned")
    write_deltalake(partitioned, batch(0, 0, 2), partition_by=["write"])
    places = {
        "<table>": writer.path,
        "<missing>": str(tmp_path / "nope"),
        "<partitioned>": partitioned,
    }
    resolved = {k: places.get(v, v) for k, v in options.items()}
    with pytest.raises(ConfigError) as info:
        DeltaTailSource.from_options(resolved)
    assert info.value.option == option


def test_options_are_case_insensitive(writer: Writer) -> None:
    writer.append(2)
    source = DeltaTailSource.from_options(
        {"PATH": writer.path, "Channels": "3", "startingVersion": "1", "other": "x"}
    )
    assert source.channels == 3
    assert source.starting_version == 1
    assert sum(source.heads()) == 2

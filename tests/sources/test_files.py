"""``source=files`` without Spark: the recorded listing, row ranges of JSON lines, CSV and
Parquet files, malformed records (named, or set aside), files that change after they were
listed, and cleanSource after a checkpoint."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_ckpt.errors import ConfigError, SourceError
from spark_ckpt.sources.files.ddl_schema import parse_schema
from spark_ckpt.sources.files.file_listing import LISTING
from spark_ckpt.sources.files.files_options import FilesSpec
from spark_ckpt.sources.files.files_source import FilesChannelSource


def spec(directory: Path, fmt: str = "json", **more: str) -> FilesSpec:
    return FilesSpec.from_options({"path": str(directory), "format": fmt, **more})


def land(directory: Path, name: str, text: str) -> Path:
    """Write *text* under a hidden name, then rename it into place (as a writer should)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_text(text)
    target = directory / name
    os.replace(tmp, target)
    time.sleep(0.01)  # distinct modification times: the listing orders by them
    return target


def json_lines(rows: list[dict[str, object]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def read_channel(
    source: FilesChannelSource, channel: int, start: int, end: int
) -> list[dict[str, object]]:
    table, positions = source.plan(channel, start, end).read_positioned()
    assert len(positions) == table.num_rows
    return table.to_pylist()


def test_files_are_listed_once_in_order_and_replayed_identically(tmp_path: Path) -> None:
    d, root = tmp_path / "in", str(tmp_path / "root")
    land(d, "b.json", json_lines([{"user_id": 1, "v": "x"}, {"user_id": 2, "v": "y"}]))
    land(d, "a.json", json_lines([{"user_id": 3, "v": "z"}]))
    land(d, ".hidden.json", json_lines([{"user_id": 9, "v": "no"}]))
    source = FilesChannelSource(spec(d, channels="2"), root)
    assert source.heads() == [2, 1]  # b (first landed) on channel 0, a on channel 1
    assert source.schema.names == ["user_id", "v"]
    assert read_channel(source, 0, 0, 2) == [{"user_id": 1, "v": "x"}, {"user_id": 2, "v": "y"}]
    assert read_channel(source, 0, 1, 2) == [{"user_id": 2, "v": "y"}]
    land(d, "c.json", json_lines([{"user_id": 4, "v": "w"}]))
    assert source.heads() == [3, 1]
    # a restart reads the recorded listing: the same files, the same order, the same schema
    again = FilesChannelSource(spec(d, channels="2"), root)
    assert [f.path for f in again.listing.files] == ["b.json", "a.json", "c.json"]
    assert read_channel(again, 0, 0, 3) == read_channel(source, 0, 0, 3)
    with pytest.raises(ConfigError, match="2 channels"):
        FilesChannelSource(spec(d, channels="3"), root)


def test_max_files_per_trigger_records_that_many_per_call(tmp_path: Path) -> None:
    d = tmp_path / "in"
    for i in range(5):
        land(d, f"f{i}.json", json_lines([{"k": i}]))
    source = FilesChannelSource(spec(d, maxFilesPerTrigger="2"), str(tmp_path / "root"))
    assert [source.heads() for _ in range(4)] == [[2], [4], [5], [5]]


def test_available_now_admits_max_files_per_trigger_per_batch(tmp_path: Path) -> None:
    d = tmp_path / "in"
    for i, rows in enumerate([2, 0, 3, 1, 4]):  # f1 is empty: it takes no share
        land(d, f"f{i}.json", json_lines([{"k": i}] * rows))
    source = FilesChannelSource(
        spec(d, channels="2", maxFilesPerTrigger="2"), str(tmp_path / "root")
    )
    target = source.heads_available_now()  # channel 0: f0 f2 f4; channel 1: f1 f3
    assert target == [9, 1]
    assert source.admit([0, 0], target) == [5, 0]  # f0, f2 (f1 empty)
    assert source.admit([5, 0], target) == [9, 1]  # f3, f4
    assert source.admit([1, 0], target) == [5, 0]  # f0 partly read counts as one
    assert source.admit([5, 0], [7, 1]) == [7, 1]  # never past the target
    unlimited = FilesChannelSource(spec(d, channels="2"), str(tmp_path / "root"))
    assert unlimited.admit([0, 0], target) == target


def test_csv_with_a_given_schema_and_parquet_with_an_inferred_one(tmp_path: Path) -> None:
    d = tmp_path / "csv"
    land(d, "x.csv", "user_id,amount\n1,2.5\n\n2,3.0\n")
    source = FilesChannelSource(
        spec(d, "csv", schema="user_id long, amount double"), str(tmp_path / "r1")
    )
    assert source.heads() == [2]
    assert read_channel(source, 0, 0, 2) == [
        {"user_id": 1, "amount": 2.5},
        {"user_id": 2, "amount": 3.0},
    ]
    p = tmp_path / "pq"
    p.mkdir()
    pq.write_table(pa.table({"user_id": [5, 6, 7]}), p / "x.parquet")
    source = FilesChannelSource(spec(p, "parquet"), str(tmp_path / "r2"))
    assert source.heads() == [3]
    assert read_channel(source, 0, 1, 3) == [{"user_id": 6}, {"user_id": 7}]


def test_a_malformed_line_is_named_or_set_aside(tmp_path: Path) -> None:
    d = tmp_path / "in"
    land(d, "x.json", '{"k": 1}\n{"k": 2\n{"k": "three"}\n{"k": 4}\n')
    strict = FilesChannelSource(spec(d, schema="k long"), str(tmp_path / "r1"))
    assert strict.heads() == [4]
    with pytest.raises(SourceError, match=r"x.json, line 2"):
        read_channel(strict, 0, 0, 4)
    bad = tmp_path / "bad"
    lenient = FilesChannelSource(
        spec(d, schema="k long", badRecordsPath=str(bad)), str(tmp_path / "r2")
    )
    lenient.heads()
    table, positions = lenient.plan(0, 0, 4).read_positioned()
    assert table.to_pylist() == [{"k": 1}, {"k": 4}]
    assert positions.to_pylist() == [0, 3]  # the bad records leave gaps
    aside = pq.read_table(bad)
    assert sorted(aside.column("line").to_pylist()) == [2, 3]
    assert all("x.json" in p for p in aside.column("path").to_pylist())
    lenient.plan(0, 0, 4).read_positioned()  # a replay rewrites the same file
    assert pq.read_table(bad).num_rows == 2


def test_a_file_changed_after_it_was_listed_is_named(tmp_path: Path) -> None:
    d = tmp_path / "in"
    f = land(d, "x.json", json_lines([{"k": 1}]))
    source = FilesChannelSource(spec(d), str(tmp_path / "root"))
    source.heads()
    f.write_text(json_lines([{"k": 1}, {"k": 2}]))
    with pytest.raises(SourceError, match=r"x\.json changed after it was listed"):
        read_channel(source, 0, 0, 1)


@pytest.mark.parametrize("mode", ["delete", "archive"])
def test_clean_source_acts_only_on_files_a_checkpoint_covers(tmp_path: Path, mode: str) -> None:
    d, archive = tmp_path / "in", tmp_path / "archive"
    for i in range(3):
        land(d, f"f{i}.json", json_lines([{"k": i}, {"k": i}]))
    options = {
        "cleanSource": mode,
        **({"sourceArchiveDir": str(archive)} if mode == "archive" else {}),
    }
    source = FilesChannelSource(spec(d, **options), str(tmp_path / "root"))
    assert source.heads() == [6]
    assert source.clean([3]) == ["f0.json"]  # f1 is half covered: kept
    assert sorted(p.name for p in d.iterdir()) == ["f1.json", "f2.json"]
    assert source.clean([6]) == ["f1.json", "f2.json"]
    if mode == "archive":
        assert sorted(p.name for p in archive.iterdir()) == ["f0.json", "f1.json", "f2.json"]


def test_an_archive_that_fails_is_logged_and_done_after_a_later_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d, archive = tmp_path / "in", tmp_path / "archive"
    land(d, "f0.json", json_lines([{"k": 0}]))
    archive.write_text("a file where the archive directory should be")
    source = FilesChannelSource(
        spec(d, cleanSource="archive", sourceArchiveDir=str(archive)), str(tmp_path / "root")
    )
    assert source.heads() == [1]
    source.checkpoint_completed(1, [1])  # no error: the run goes on
    assert "cleanSource=archive of" in caplog.text
    assert [p.name for p in d.iterdir()] == ["f0.json"]  # nothing lost
    archive.unlink()
    source.checkpoint_completed(2, [1])
    assert [p.name for p in archive.iterdir()] == ["f0.json"] and not list(d.iterdir())


def test_a_torn_listing_line_is_ignored_and_overwritten(tmp_path: Path) -> None:
    d, root = tmp_path / "in", tmp_path / "root"
    land(d, "a.json", json_lines([{"k": 1}]))
    FilesChannelSource(spec(d), str(root)).heads()
    with open(root / LISTING, "a") as f:
        f.write('{"seq": 1, "path": "b.js')  # killed while appending
    land(d, "b.json", json_lines([{"k": 2}]))
    source = FilesChannelSource(spec(d), str(root))
    assert source.heads() == [2]
    assert [f.path for f in FilesChannelSource(spec(d), str(root)).listing.files] == [
        "a.json",
        "b.json",
    ]


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="format"):
        FilesSpec.from_options({"path": "/x", "format": "xml"})
    with pytest.raises(ConfigError, match="sourceArchiveDir"):
        FilesSpec.from_options({"path": "/x", "format": "json", "cleansource": "archive"})
    with pytest.raises(ConfigError, match="known type"):
        parse_schema("a long, b varchar2")
    assert parse_schema("a long, b decimal(10, 2), c timestamp").types == [
        pa.int64(),
        pa.decimal128(10, 2),
        pa.timestamp("us", tz="UTC"),
    ]


def test_a_parquet_file_that_does_not_fit_the_schema_is_named(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(pa.table({"user_id": ["seven"]}), d / "bad.parquet")
    source = FilesChannelSource(spec(d, "parquet", schema="user_id long"), str(tmp_path / "r"))
    source.heads()
    with pytest.raises(SourceError, match=r"bad\.parquet: column 'user_id' is string"):
        read_channel(source, 0, 0, 1)
    pq.write_table(pa.table({"other": [1]}), d / "lacks.parquet")
    source.heads()
    with pytest.raises(SourceError, match=r"lacks\.parquet lacks the columns \['user_id'\]"):
        read_channel(source, 0, 1, 2)


def test_a_malformed_csv_row_is_named_or_set_aside(tmp_path: Path) -> None:
    d = tmp_path / "in"
    land(d, "x.csv", "user_id,amount\n1,2.5\n2,not-a-number\n3,1.0\n")
    strict = FilesChannelSource(
        spec(d, "csv", schema="user_id long, amount double"), str(tmp_path / "r1")
    )
    assert strict.heads() == [3]
    with pytest.raises(SourceError, match=r"malformed csv record in .*x\.csv, line 3"):
        read_channel(strict, 0, 0, 3)
    bad = tmp_path / "bad"
    lenient = FilesChannelSource(
        spec(d, "csv", schema="user_id long, amount double", badRecordsPath=str(bad)),
        str(tmp_path / "r2"),
    )
    lenient.heads()
    table, positions = lenient.plan(0, 0, 3).read_positioned()
    assert table.to_pylist() == [{"user_id": 1, "amount": 2.5}, {"user_id": 3, "amount": 1.0}]
    assert positions.to_pylist() == [0, 2]
    assert pq.read_table(bad).column("record").to_pylist() == ["2,not-a-number"]

"""The files source's listing and directory on a real S3 endpoint (moto's server) and the
listing a savepoint carries: segments written whole and compacted, a bounded open, damage
named, ``cleanSource`` on the store, and a restore seeding a root or refusing one that
lists other files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from spark_ckpt.errors import RestoreError, SourceError
from spark_ckpt.locations.uris import filesystem
from spark_ckpt.sources.files.file_listing import (
    COMPACT_EVERY,
    SEGMENTS,
    FileListing,
    export_listing,
    seed_listing,
)
from spark_ckpt.sources.files.files_options import FilesSpec
from spark_ckpt.sources.files.files_source import FilesChannelSource
from spark_ckpt.testing.s3_endpoint import S3Endpoint

BUCKET = "listing"


def land(uri: str, name: str, keys: list[int]) -> None:
    fs, base = filesystem(uri)
    with fs.open_output_stream(f"{base}/{name}") as out:
        out.write("".join(json.dumps({"user_id": k}) + "\n" for k in keys).encode())


def spec(path: str, **more: str) -> FilesSpec:
    options = {"path": path, "format": "json", "schema": "user_id long", **more}
    return FilesSpec.from_options(options)


def names(uri: str) -> list[str]:
    fs, base = filesystem(uri)
    infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    return sorted(i.base_name for i in infos)


def rows(source: FilesChannelSource, channel: int, end: int) -> list[int]:
    return [r["user_id"] for r in source.plan(channel, 0, end).read().to_pylist()]


def test_files_on_s3_are_listed_read_and_replayed_from_the_stored_listing(
    on_s3: S3Endpoint,
) -> None:
    landing, root = f"s3://{BUCKET}/a/landing", f"s3://{BUCKET}/a/root"
    land(landing, "one.json", [1, 2, 3])
    land(landing, "_hidden.json", [9])
    source = FilesChannelSource(spec(landing, channels="2"), root)
    assert source.heads() == [3, 0]
    land(landing, "two.json", [4, 5])
    assert source.heads() == [3, 2]
    assert rows(source, 0, 3) == [1, 2, 3] and rows(source, 1, 2) == [4, 5]
    # another process opens the same listing: the same files, in the same order
    again = FilesChannelSource(spec(landing, channels="2"), root)
    assert [f.path for f in again.listing.files] == ["one.json", "two.json"]
    assert again.heads() == [3, 2]
    assert "files.jsonl" not in names(f"{root}/_sources")  # segments, not an appended file


def test_the_listing_is_compacted_so_opening_it_stays_bounded(on_s3: S3Endpoint) -> None:
    landing, root = f"s3://{BUCKET}/b/landing", f"s3://{BUCKET}/b/root"
    source = FilesChannelSource(spec(landing), root)
    appended = COMPACT_EVERY * 2 + 5
    for i in range(appended):
        land(landing, f"f{i:03d}.json", [i])
        source.heads()
    stored = names(f"{root}/{SEGMENTS}")
    assert len(stored) <= COMPACT_EVERY + 1
    assert [s for s in stored if s.startswith("base-")]
    before = len(on_s3.requests())
    reopened = FileListing(root)
    served = on_s3.requests()[before:]
    assert [f.path for f in reopened.files] == [f"f{i:03d}.json" for i in range(appended)]
    assert [s.method for s in served].count("LIST") == 1
    assert len(served) <= COMPACT_EVERY + 2  # one listing, a base and the segments after it


def test_a_compaction_cut_short_leaves_a_listing_that_reads_the_same(on_s3: S3Endpoint) -> None:
    """Killed between writing a base and deleting what it covers: readers skip the
    covered segments."""
    landing, root = f"s3://{BUCKET}/c/landing", f"s3://{BUCKET}/c/root"
    source = FilesChannelSource(spec(landing), root)
    for i in range(3):
        land(landing, f"f{i}.json", [i])
        source.heads()
    fs, base = filesystem(f"{root}/{SEGMENTS}")
    lines = FileListing(root).lines()
    with fs.open_output_stream(f"{base}/base-{len(lines):012d}.jsonl") as out:
        out.write(b"".join(x + b"\n" for x in lines))
    assert [f.path for f in FileListing(root).files] == ["f0.json", "f1.json", "f2.json"]
    land(landing, "f3.json", [3])
    FilesChannelSource(spec(landing), root).heads()
    assert [f.path for f in FileListing(root).files] == [f"f{i}.json" for i in range(4)]


def test_a_gap_in_the_listing_is_named(on_s3: S3Endpoint) -> None:
    landing, root = f"s3://{BUCKET}/d/landing", f"s3://{BUCKET}/d/root"
    source = FilesChannelSource(spec(landing), root)
    for i in range(3):
        land(landing, f"f{i}.json", [i])
        source.heads()
    fs, base = filesystem(f"{root}/{SEGMENTS}")
    fs.delete_file(f"{base}/{2:012d}.jsonl")  # the second file's line
    with pytest.raises(SourceError, match=r"listing .* is damaged: segment 000000000003"):
        FileListing(root)


def test_clean_source_deletes_and_archives_on_s3(on_s3: S3Endpoint) -> None:
    landing, root = f"s3://{BUCKET}/e/landing", f"s3://{BUCKET}/e/root"
    archive = f"s3://{BUCKET}/e/archive"
    for name in ("a.json", "b.json"):
        land(landing, name, [1, 2])
    source = FilesChannelSource(
        spec(landing, cleanSource="archive", sourceArchiveDir=archive), root
    )
    assert source.heads() == [4]
    assert source.clean([2]) == ["a.json"]  # only what the positions cover
    assert names(landing) == ["b.json"] and names(archive) == ["a.json"]
    assert source.clean([2]) == []  # idempotent
    deleting = FilesChannelSource(spec(landing, cleanSource="delete"), root)
    assert deleting.clean([4]) == ["b.json"]
    assert names(landing) == []


def listing_of(root: Path, directory: Path, files: list[str]) -> None:
    """A local root whose listing records *files* (one row each) of *directory*."""
    directory.mkdir(parents=True, exist_ok=True)
    source = FilesChannelSource(spec(str(directory)), str(root))
    for name in files:
        (directory / name).write_text(json.dumps({"user_id": 1}) + "\n")
        source.heads()


def test_a_savepoint_carries_the_listing_and_a_restore_seeds_or_extends_it(
    tmp_path: Path,
) -> None:
    landing = tmp_path / "landing"
    listing_of(tmp_path / "root", landing, ["a.json", "b.json"])
    savepoint = tmp_path / "savepoint"
    assert export_listing(str(tmp_path / "root"), str(savepoint))
    assert not export_listing(str(tmp_path / "empty"), str(tmp_path / "sp2"))
    # a new root gets it whole; a root that lists fewer of the same gets the rest
    assert seed_listing(str(tmp_path / "new"), str(savepoint))
    assert [f.path for f in FileListing(str(tmp_path / "new")).files] == ["a.json", "b.json"]
    (landing / "a.json").unlink()  # cleaned: the seeded listing still has it, in order
    FilesChannelSource(spec(str(landing)), str(tmp_path / "new")).heads()
    assert not seed_listing(str(tmp_path / "new"), str(savepoint))  # nothing to add
    assert not seed_listing(str(tmp_path / "root"), str(savepoint))  # its own savepoint


def test_a_restore_into_a_root_that_lists_other_files_is_refused(tmp_path: Path) -> None:
    listing_of(tmp_path / "root", tmp_path / "landing", ["a.json", "b.json"])
    export_listing(str(tmp_path / "root"), str(tmp_path / "savepoint"))
    for name in ("a.json", "b.json"):  # cleaned before another pipeline listed the directory
        (tmp_path / "landing" / name).unlink()
    listing_of(tmp_path / "other", tmp_path / "landing", ["c.json"])
    before = (tmp_path / "other" / "_sources" / "files.jsonl").read_bytes()
    with pytest.raises(RestoreError, match="differs from the one restored"):
        seed_listing(str(tmp_path / "other"), str(tmp_path / "savepoint"))
    assert (tmp_path / "other" / "_sources" / "files.jsonl").read_bytes() == before


def test_a_savepoint_on_s3_seeds_a_local_root(on_s3: S3Endpoint, tmp_path: Path) -> None:
    landing = f"s3://{BUCKET}/f/landing"
    root, savepoint = f"s3://{BUCKET}/f/root", f"s3://{BUCKET}/f/savepoint"
    source = FilesChannelSource(spec(landing), root)
    for name in ("x.json", "y.json"):
        land(landing, name, [7])
        source.heads()
    assert export_listing(root, savepoint)
    assert seed_listing(str(tmp_path / "local"), savepoint)
    assert [f.path for f in FileListing(str(tmp_path / "local")).files] == ["x.json", "y.json"]
    assert seed_listing(f"s3://{BUCKET}/f/root2", root)  # from another root's own listing
    assert [f.path for f in FileListing(f"s3://{BUCKET}/f/root2").files] == ["x.json", "y.json"]

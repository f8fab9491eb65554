"""Locations (:mod:`spark_ckpt.locations`): resolving paths and URIs, the one-line errors of
the store, whole-file writes, and delta-rs's commit safety on S3."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from spark_ckpt.delta.commit_safety import check_commit_safety
from spark_ckpt.errors import StoreError
from spark_ckpt.locations.objects import READ_ATTEMPTS, read_json, write_whole, writes_whole
from spark_ckpt.locations.uris import (
    bucket,
    explain,
    filesystem,
    is_remote,
    join,
    normalized,
    sibling,
    store_errors,
)


def test_local_paths_and_uris_are_told_apart(tmp_path: Path) -> None:
    assert not is_remote(str(tmp_path)) and not is_remote("file:///x")
    assert all(is_remote(u) for u in ("s3://b/k", "S3A://b/k", "gs://b/k", "abfss://c@a/k"))
    assert normalized("s3a://lake/root/") == "s3://lake/root"
    assert normalized("rel/dir") == os.path.abspath("rel/dir")
    assert join("s3://lake/root", "a", "b.json") == "s3://lake/root/a/b.json"
    assert join(str(tmp_path), "a") == str(tmp_path / "a")
    assert sibling("s3://lake/root", "out") == "s3://lake/out"
    assert sibling(str(tmp_path / "root"), "out") == str(tmp_path / "out")
    assert bucket("s3://lake/root") == "lake" and bucket("abfss://c@acct/x") == "c"
    assert bucket(str(tmp_path)) is None


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (
            "AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not"
            " connect to server",
            "cannot reach the endpoint http://127.0.0.1:9",
        ),
        ("AWS Error NO_SUCH_BUCKET during CreateMultipartUpload", "the bucket 'lake' does not"),
        ("AWS Error ACCESS_DENIED during HeadObject operation: No response body.", "access denied"),
        ("AWS Error UNKNOWN (HTTP status 500) during HeadObject: No response body.", "credentials"),
        ("something else\nand more", "something else"),
    ],
)
def test_a_store_error_is_explained_in_one_line(
    message: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert why in explain("s3://lake/root", OSError(message))
    with pytest.raises(StoreError) as raised, store_errors("s3://lake/root", "read"):
        raise OSError(message)
    text = str(raised.value)
    assert text.startswith("cannot read s3://lake/root: ") and "\n" not in text


def test_an_unknown_scheme_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="cannot open nosuch://x"):
        filesystem("nosuch://x")


def test_a_whole_file_replaces_the_old_one_and_leaves_no_temporary(tmp_path: Path) -> None:
    fs = pafs.LocalFileSystem()
    assert not writes_whole(fs)
    target = tmp_path / "d" / "f.json"
    write_whole(fs, str(target), b"one")
    write_whole(fs, str(target), b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]


@pytest.mark.parametrize("value", ["disabled", "Disabled", "none", ""])
def test_s3_commits_without_conditional_writes_are_refused(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_CONDITIONAL_PUT", value)
    with pytest.raises(StoreError, match="AWS_CONDITIONAL_PUT=etag"):
        check_commit_safety("s3://lake/root")
    check_commit_safety("gs://lake/root")  # not S3: its own preconditions
    check_commit_safety("/local/root")


def test_s3_commits_with_conditional_writes_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_CONDITIONAL_PUT", raising=False)
    check_commit_safety("s3://lake/root")  # delta-rs's default
    monkeypatch.setenv("AWS_CONDITIONAL_PUT", "etag")
    check_commit_safety("s3a://lake/root")
    monkeypatch.setenv("AWS_CONDITIONAL_PUT", "disabled")
    check_commit_safety("s3://lake/root", {"conditional_put": "etag"})  # the options win
    with pytest.raises(StoreError):
        check_commit_safety("s3://lake/root", {"CONDITIONAL_PUT": "disabled"})


def test_a_missing_bucket_is_named_for_a_path_in_a_store_too() -> None:
    error = OSError("AWS Error NO_SUCH_BUCKET during PutObject operation")
    assert explain("nolake/x/o.json", error) == "the bucket 'nolake' does not exist"


class _TornOnce(pafs.FileSystemHandler):  # type: ignore[misc]
    """A file system whose first reads of a file return a prefix of it, as a ranged GET
    sized by a HEAD of the version the writer just replaced does."""

    def __init__(self, data: bytes, torn: int) -> None:
        self.data, self.torn, self.reads = data, torn, 0

    def open_input_stream(self, path: str) -> pa.NativeFile:
        self.reads += 1
        cut = self.data[: len(self.data) // 2] if self.reads <= self.torn else self.data
        return pa.BufferReader(cut)

    def get_type_name(self) -> str:
        return "torn"

    def normalize_path(self, path: str) -> str:
        return path


def _unused(self: Any, *args: Any) -> Any:
    raise NotImplementedError


for _name in _TornOnce.__abstractmethods__:  # the rest of the interface: unused here
    setattr(_TornOnce, _name, _unused)
_TornOnce.__abstractmethods__ = frozenset()


def test_a_json_file_replaced_while_read_is_read_again_until_whole() -> None:
    handler = _TornOnce(json.dumps({"checkpoint_id": 12345}).encode(), torn=2)
    assert read_json(pafs.PyFileSystem(handler), "x/committed.json") == {"checkpoint_id": 12345}
    assert handler.reads == 3
    always = _TornOnce(b'{"a": 1}', torn=READ_ATTEMPTS)
    with pytest.raises(ValueError):
        read_json(pafs.PyFileSystem(always), "x/committed.json")
    assert always.reads == READ_ATTEMPTS

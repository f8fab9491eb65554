"""Explicit storage options: their encoding, that they never show, and that an installed set
reaches pyarrow and delta-rs for its buckets only, against a real S3 endpoint with no
``AWS_*`` variable in the environment."""

from __future__ import annotations

import os
import pickle

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_ckpt.errors import ConfigError
from spark_ckpt.locations.credentials import (
    StorageOptions,
    bucket_of,
    for_delta,
    installed_for,
)
from spark_ckpt.locations.objects import write_whole
from spark_ckpt.locations.uris import filesystem
from spark_ckpt.testing.s3_endpoint import S3Endpoint

BUCKET = "creds"


@pytest.fixture
def no_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role lookups


def test_buckets_are_named_by_scheme_and_bucket() -> None:
    assert bucket_of("s3a://lake/a/b") == "s3://lake"
    assert bucket_of("gs://lake/x") == "gs://lake"
    assert (
        bucket_of("abfss://c@acct.dfs.core.windows.net/p") == "abfss://c@acct.dfs.core.windows.net"
    )
    assert bucket_of("/tmp/x") is None and bucket_of("file:///tmp/x") is None


def test_options_round_trip_and_never_show_their_values() -> None:
    options = StorageOptions.of(
        {"AWS_SECRET_ACCESS_KEY": "hush", "AWS_ALLOW_HTTP": True}, ["s3://a/x", "/local", None]
    )
    assert options.buckets == ("s3://a",)
    assert StorageOptions.from_json(options.to_json()) == options
    assert pickle.loads(pickle.dumps(options)) == options
    assert "hush" not in repr(options) and "AWS_SECRET_ACCESS_KEY" in repr(options)
    assert options.as_dict()["AWS_ALLOW_HTTP"] == "true"
    assert options.covering("s3://b/y").buckets == ("s3://a", "s3://b")
    assert not StorageOptions.of(None)
    with pytest.raises(ConfigError) as bad:
        StorageOptions.from_json('{"options": "hush"')
    assert "hush" not in str(bad.value)
    with pytest.raises(ConfigError):
        StorageOptions.of({"": "x"})


def test_installed_options_reach_pyarrow_and_delta_rs_for_their_buckets_only(
    s3: S3Endpoint, no_aws_env: None
) -> None:
    StorageOptions.of(s3.storage_options(), ["s3://creds/root"]).install()
    assert installed_for("s3a://creds/other") == s3.storage_options()
    assert installed_for("s3://elsewhere/x") is None
    assert for_delta("s3://creds/t", {"aws_region": "eu-west-1"}) == {
        **s3.storage_options(),
        "aws_region": "eu-west-1",
    }
    assert for_delta("s3://elsewhere/t") is None
    fs, base = filesystem("s3://creds/root")
    write_whole(fs, f"{base}/probe.json", b"{}")
    with fs.open_input_stream(f"{base}/probe.json") as f:
        assert f.read() == b"{}"
    uri = "s3://creds/root/table"
    write_deltalake(uri, pa.table({"a": [1, 2]}), storage_options=for_delta(uri))
    assert DeltaTable(uri, storage_options=for_delta(uri)).to_pyarrow_table()["a"].to_pylist() == [
        1,
        2,
    ]

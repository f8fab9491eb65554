"""A subtask's durable changelog: the chain a fence names (for a rebuild), and the deltas
since an earlier segment of it (for a worker that catches up) — never through a full
segment, another attempt's segment or an evicted one."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from spark_ckpt.errors import StoreError
from spark_ckpt.locations.uris import filesystem
from spark_ckpt.runtime.subtask_image import DELTA, FULL, SubtaskImage
from spark_ckpt.spark.executors.changelog import SubtaskChangelog, remove_run
from spark_ckpt.spark.executors.executor_cache import ENTRY_META, entry_name

BUCKET = "changelog"


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A pipeline root on local disk, or on a real S3 endpoint."""
    if request.param == "local":
        return str(tmp_path)
    request.getfixturevalue("s3")
    request.getfixturevalue("s3_environment")
    return f"s3://changelog/{tmp_path.name}"


def image(kind: str, n: int) -> SubtaskImage:
    return SubtaskImage({"s0": pa.table({"n": [n]})}, {"kind": kind, "n": n})


def numbers(images: list[SubtaskImage]) -> list[int]:
    return [int(i.meta["n"]) for i in images]


def test_since_follows_the_fenced_chain_by_deltas_only(root: str) -> None:
    log = SubtaskChangelog(root, "run-1", 0)
    s1 = log.publish(1, "a", image(FULL, 1), None)
    s2 = log.publish(2, "a", image(DELTA, 2), s1)
    log.publish(3, "zombie", image(DELTA, 99), s2)  # an attempt Spark did not keep
    s3 = log.publish(3, "b", image(DELTA, 3), s2)
    s4 = log.publish(4, "a", image(DELTA, 4), s3)
    assert (s4.base, s4.length) == ((1, "a"), 4)
    images, segment = log.chain(4, "a")
    assert numbers(images) == [1, 2, 3, 4] and segment == s4
    found = log.since(4, "a", (2, "a"))
    assert found is not None and numbers(found[0]) == [3, 4] and found[1] == s4
    assert log.since(4, "a", (4, "a")) is None  # nothing to catch up: the caller continues
    assert log.since(4, "a", (3, "zombie")) is None  # not on the chain
    assert log.since(4, "a", (1, "a")) is not None  # from the full segment itself
    s5 = log.publish(5, "a", image(FULL, 5), s4)
    s6 = log.publish(6, "a", image(DELTA, 6), s5)
    assert log.since(6, "a", (4, "a")) is None  # a full segment in between: rebuild
    # publishing after the new full segment evicted what no retry can need
    s7 = log.publish(7, "a", image(DELTA, 7), s6)
    assert log.since(7, "a", (2, "a")) is None
    assert numbers(log.chain(7, "a")[0]) == [5, 6, 7] and s7.length == 3
    remove_run(root, "run-1")
    assert log.since(7, "a", (6, "a")) is None


def test_a_segment_without_its_meta_on_s3_is_missing(root: str) -> None:
    """On an object store a segment is complete once its ``meta.json`` (written last) is
    there: a publish cut short before it reads as missing, never as a half image."""
    log = SubtaskChangelog(root, "run-1", 0)
    s1 = log.publish(1, "a", image(FULL, 1), None)
    log.publish(2, "a", image(DELTA, 2), s1)
    if root.startswith("s3://"):
        fs, base = filesystem(f"{root}/_changelog/run-1/0/{entry_name(2, 'a')}")
        fs.delete_file(f"{base}/{ENTRY_META}")
    else:
        (Path(root) / "_changelog/run-1/0" / entry_name(2, "a") / ENTRY_META).unlink()
    with pytest.raises(StoreError, match="missing or unreadable"):
        log.chain(2, "a")
    assert numbers(log.chain(1, "a")[0]) == [1]
    assert log.segment_meta(2, "a") == {}


def test_a_fold_links_to_the_full_segment_and_names_what_it_replaced(tmp_path: Path) -> None:
    log = SubtaskChangelog(str(tmp_path), "run-1", 0)
    s1 = log.publish(1, "a", image(FULL, 1), None)
    s2 = log.publish(2, "a", image(DELTA, 2), s1)
    s3 = log.publish(3, "a", image(DELTA, 3), s2)
    s4 = log.publish(4, "a", image(DELTA, 40), s3, folded=True)  # every change since 1
    assert (s4.base, s4.length) == ((1, "a"), 2)
    images, segment = log.chain(4, "a")
    assert numbers(images) == [1, 40] and segment == s4
    # a task standing on a segment the fold replaced catches up by the fold alone
    for at in [(2, "a"), (3, "a")]:
        found = log.since(4, "a", at)
        assert found is not None and numbers(found[0]) == [40]
    assert log.since(4, "a", (3, "zombie")) is None  # never on the chain
    found = log.since(4, "a", (1, "a"))
    assert found is not None and numbers(found[0]) == [40]
    s5 = log.publish(5, "a", image(DELTA, 5), s4)
    # the next segment evicted the replaced ones: a retry of micro-batch 5 needs [1, 4]
    assert sorted(p.name for p in Path(log.directory).iterdir()) == [
        entry_name(1, "a"),
        entry_name(4, "a"),
        entry_name(5, "a"),
    ]
    found = log.since(5, "a", (2, "a"))  # a task holding segment 2 in memory still can
    assert found is not None and numbers(found[0]) == [40, 5]
    s6 = log.publish(6, "a", image(DELTA, 6), s5)
    s7 = log.publish(7, "a", image(DELTA, 70), s6, folded=True)
    # a second fold also replaces what the first one did
    for at in [(3, "a"), (4, "a"), (6, "a")]:
        found = log.since(7, "a", at)
        assert found is not None and numbers(found[0]) == [70]
    assert s7.length == 2
    assert numbers(log.chain(7, "a")[0]) == [1, 70]


def test_only_a_delta_after_another_segment_folds(tmp_path: Path) -> None:
    log = SubtaskChangelog(str(tmp_path), "run-1", 0)
    with pytest.raises(StoreError):
        log.publish(1, "a", image(DELTA, 1), None, folded=True)
    s1 = log.publish(1, "a", image(FULL, 1), None)
    with pytest.raises(StoreError):
        log.publish(2, "a", image(FULL, 2), s1, folded=True)

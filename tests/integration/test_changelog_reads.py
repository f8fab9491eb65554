"""Readers of the executors' changelog while the product folds and evicts it: a segment
listed, then gone before it is read, is passed over — by the product's reader of the newest
segments (the driver's scan for lost writers) and by the tests' own helper (the crash tests
of executor faults read which executor wrote the newest segment while the job runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import newest_segment_meta

from spark_ckpt.runtime.subtask_image import DELTA, FULL, SubtaskImage
from spark_ckpt.spark.executors.changelog import SubtaskChangelog
from spark_ckpt.spark.executors.executor_cache import ENTRY_META, entry_name


def image(kind: str, n: int) -> SubtaskImage:
    return SubtaskImage({"s0": pa.table({"n": [n]})}, {"kind": kind, "n": n})


def segment(root: Path, subtask: int, batch: int, executor: str) -> Path:
    meta = root / "_changelog" / "run-1" / str(subtask) / f"b{batch}-a" / ENTRY_META
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"meta": {"changelog": {"executor": executor}}}))
    return meta


def test_the_tests_helper_passes_over_a_segment_gone_after_the_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    segment(tmp_path, 0, 1, "one")
    newest = segment(tmp_path, 1, 2, "two")
    assert newest_segment_meta(tmp_path) == {"changelog": {"executor": "two"}}
    # listed, then evicted before its stat: a dangling entry the listing still finds
    gone = tmp_path / "_changelog" / "run-1" / "0" / "b3-a"
    gone.mkdir()
    (gone / ENTRY_META).symlink_to(tmp_path / "nowhere")
    assert newest_segment_meta(tmp_path) == {"changelog": {"executor": "two"}}
    # stat'ed, then evicted before its read
    read_text = Path.read_text

    def evicted_first(self: Path, *args: object, **kwargs: object) -> str:
        if self == newest:
            self.unlink()
        return read_text(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", evicted_first)
    assert newest_segment_meta(tmp_path) == {"changelog": {"executor": "one"}}
    assert newest_segment_meta(tmp_path / "no-root") is None


def test_the_newest_segments_pass_over_one_evicted_after_the_listing(tmp_path: Path) -> None:
    log = SubtaskChangelog(str(tmp_path), "run-1", 0)
    s1 = log.publish(1, "a", image(FULL, 1), None, executor="e1")
    log.publish(2, "a", image(DELTA, 2), s1, executor="e1")
    log.publish(2, "b", image(DELTA, 2), s1, executor="e2")  # a retried attempt
    listed = log._files.names

    def evicting_after_listing() -> list[str]:
        names = listed()
        log._files.remove(entry_name(2, "a"))  # folded away meanwhile
        return names

    log._files.names = evicting_after_listing  # type: ignore[method-assign]
    metas = log.newest_segment_metas()
    assert [m["changelog"]["executor"] for m in metas] == ["e2"]

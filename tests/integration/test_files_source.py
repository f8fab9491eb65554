"""``source=files`` end to end under Spark: JSON-lines files landing in a directory, counted per
key exactly once across runs; a malformed line set aside (``badRecordsPath``); files deleted
by ``cleanSource`` only once a checkpoint covers them; and SIGKILLs of the main job while files
keep landing. The oracle is a plain fold over the files written."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest
from conftest import DemoArgs, DemoLauncher, output_rows, read_delta, running_count_rows

from spark_ckpt import CheckpointConfig, Pipeline, RunningCount
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.sources.files.file_listing import FileListing

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def land(directory: Path, name: str, keys: list[int], extra: str = "") -> None:
    """Write a JSON-lines file of ``user_id`` rows under a hidden name, then rename it in."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}"
    tmp.write_text("".join(json.dumps({"user_id": k}) + "\n" for k in keys) + extra)
    os.replace(tmp, directory / name)


def test_files_are_counted_exactly_once_and_cleaned_after_their_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing, bad = tmp_path / "landing", tmp_path / "bad"
    written: Counter[int] = Counter()
    rng = random.Random(3)
    for i in range(6):
        keys = [rng.randrange(20) for _ in range(50)]
        land(landing, f"part-{i}.json", keys)
        written.update(keys)
    pipeline = Pipeline(
        spark, "files", config=CheckpointConfig(interval_ms=500), root=str(tmp_path / "root")
    )
    source = {
        "source": "files",
        "path": str(landing),
        "format": "json",
        "schema": "user_id long",
        "channels": 2,
        "maxFilesPerTrigger": 2,
        "cleanSource": "delete",
        "badRecordsPath": str(bad),
    }
    out = tmp_path / "out"
    first = pipeline.run(source, RunningCount(), output=str(out), available_now=True)
    assert first.failures == ()
    assert output_rows(read_delta(out)) == running_count_rows(written)
    # more files, one with a malformed line; the next run resumes after the checkpoint
    land(landing, "part-6.json", [1, 2, 3], extra='{"user_id": oops}\n')
    land(landing, "part-7.json", [4, 4])
    written.update([1, 2, 3, 4, 4])
    second = pipeline.run(source, RunningCount(), output=str(out), available_now=True)
    assert second.restored_from[0] == first.last_checkpoint.checkpoint_id  # type: ignore[union-attr]
    assert output_rows(read_delta(out)) == running_count_rows(written)
    aside = pq.read_table(bad).to_pylist()
    assert [(Path(r["path"]).name, r["line"]) for r in aside] == [("part-6.json", 4)]
    # every file is covered by the final checkpoint: cleaned (the next run's first batch
    # cleans what the previous run's last checkpoint covered)
    pipeline.run(source, RunningCount(), output=str(out), available_now=True)
    assert sorted(p.name for p in landing.iterdir() if not p.name.startswith(".")) == []


def test_available_now_reads_max_files_per_trigger_per_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    """As Spark's ``Trigger.AvailableNow``: everything there at the start, in several
    batches of at most ``maxFilesPerTrigger`` files (one channel: a batch's rows are the
    difference of its source offsets)."""
    landing = tmp_path / "landing"
    written: Counter[int] = Counter()
    for i in range(5):
        keys = [i * 10 + k for k in range(10)]
        land(landing, f"part-{i}.json", keys)
        written.update(keys)
    pipeline = Pipeline(spark, "files-now", root=str(tmp_path / "root"))
    source = {
        "source": "files",
        "path": str(landing),
        "format": "json",
        "schema": "user_id long",
        "channels": 1,
        "maxFilesPerTrigger": 2,
    }
    run = pipeline.start(source, RunningCount(), output=str(tmp_path / "out"), available_now=True)
    run.await_termination()
    read = []
    for progress in run.query.recentProgress:
        [s] = progress.sources
        begin, end = (json.loads(o or "null") for o in (s.startOffset, s.endOffset))
        read.append(end["positions"][0] - (begin["positions"][0] if begin else 0))
    assert [r for r in read if r] == [20, 20, 10]
    assert output_rows(read_delta(tmp_path / "out")) == running_count_rows(written)


def covered(root: Path, files: list[str]) -> list[str]:
    """Of *files* (names), those whose rows all lie before the latest completed
    checkpoint's positions, by the source's own listing."""
    latest = DeltaCheckpointStore(str(root)).latest_completed()
    if latest is None:
        return []
    positions = latest.offsets()
    listing = FileListing(str(root))
    at: Counter[int] = Counter()
    done = set()
    for f in listing.files:
        at[f.channel] += f.rows
        if at[f.channel] <= positions.get(("source", f.channel), 0):
            done.add(f.path)
    return [f for f in files if f in done]


def test_exactly_once_from_files_under_sigkill(demo: DemoLauncher, tmp_path: Path) -> None:
    """Files keep landing while the job is killed and restarted; ``cleanSource=archive``
    never archives a file before a completed checkpoint covers it."""
    landing, archive = tmp_path / "landing", tmp_path / "archive"
    landing.mkdir()
    args = DemoArgs(
        root=tmp_path / "root",
        output=tmp_path / "out",
        pipeline="files-crash",
        interval="300ms",
        channels=2,
        files=landing,
        files_archive=archive,
        max_rows_per_trigger=3,  # maxFilesPerTrigger
    )

    def archived() -> list[str]:
        return sorted(p.name for p in archive.iterdir()) if archive.exists() else []

    written: Counter[int] = Counter()
    stop = threading.Event()
    rng = random.Random(5)

    def writer() -> None:
        n = 0
        while not stop.is_set():
            keys = [rng.randrange(30) for _ in range(20)]
            land(landing, f"f-{n:05d}.json", keys)
            written.update(keys)
            n += 1
            time.sleep(0.1)

    def latest_id() -> int:
        if not (args.root / "checkpoints").exists():
            return 0
        latest = DeltaCheckpointStore(str(args.root)).latest_completed()
        return latest.checkpoint_id if latest else 0

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        for i in range(3):
            before = latest_id()
            run = demo.start(args)
            demo.wait_until(run, lambda: latest_id() > before, 240.0, f"a checkpoint in run {i}")  # noqa: B023
            time.sleep(rng.uniform(0.0, 2.0))
            run.kill()
            gone = archived()  # archived after a completion: covered by the latest one
            assert covered(args.root, gone) == gone, f"archived before its checkpoint: {gone}"
    finally:
        stop.set()
        thread.join(30)
    # the drain reads what landed meanwhile in large micro-batches: the kills are behind
    final = demo.start(replace(args, available_now=True, max_rows_per_trigger=200))
    assert final.wait(300) == 0, final.tail()
    assert output_rows(read_delta(args.output)) == running_count_rows(written)
    gone = archived()
    assert gone and covered(args.root, gone) == gone
    assert not set(gone) & {p.name for p in landing.iterdir()}  # moved, not copied

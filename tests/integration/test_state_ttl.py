"""State TTL on real Spark: deduplication whose memory of a key expires. The oracle is a
plain loop over the micro-batches Spark logged (their rows and processing times): a key is
emitted when it has no entry, or its entry (the time it was last emitted) is at least the
TTL old. Expired entries leave the state, so a checkpoint's key count falls to zero while the
output stays exact; a savepoint restored at another parallelism keeps each entry's time."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pytest
from conftest import LoggedBatch, logged_batches, stop_with_savepoint
from ttl_jobs import CHANNELS, KEYS, SEED, Dedup, source, users_in, watch_expiry

from spark_ckpt import (
    CheckpointConfig,
    Pipeline,
    PipelineClient,
    RestoreSettings,
    StateReader,
    WatermarkStrategy,
)
from spark_ckpt.errors import ConfigError, SparkCkptError
from spark_ckpt.sources.generator import GeneratorSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def oracle(runs: list[tuple[int, list[LoggedBatch]]], ttl_ms: int) -> Counter[tuple[int, int]]:
    seen: dict[int, int] = {}
    emitted: Counter[tuple[int, int]] = Counter()
    for backlog, batch in ((b, batch) for b, run in runs for batch in run):
        spec = GeneratorSpec(SEED, CHANNELS, 0.0, backlog, KEYS)
        now = batch.batch_ms
        users = {
            u
            for channel, (start, end) in enumerate(batch.slices)
            for u in spec.rows(channel, start, end).column("user_id").to_pylist()
        }
        for user in users:
            if user not in seen or seen[user] + ttl_ms <= now:
                emitted[(user, now)] += 1
                seen[user] = now
    return emitted


def output(path: Path) -> Counter[tuple[int, int]]:
    return Counter(pl.read_delta(str(path)).select("user_id", "at").iter_rows())


def held_at(runs: list[tuple[int, list[LoggedBatch]]], ttl_ms: int, now: int) -> int:
    """The keys whose entry a loop over *runs* holds live at processing time *now*."""
    seen: dict[int, int] = {}
    for (user, at), _ in oracle(runs, ttl_ms).items():
        if at <= now:
            seen[user] = max(seen.get(user, at), at)
    return sum(1 for at in seen.values() if at + ttl_ms > now)


def check_expiry(root: str, out: Path, ttl_ms: int, held: list[tuple[int, int]]) -> None:
    """The output and the watched key counts (:func:`ttl_jobs.watch_expiry`) as the loop
    over the logged micro-batches says: a checkpoint while the entries live holds every key;
    once they expired, the checkpoints hold none."""
    [logged] = logged_batches(root, CHANNELS)
    assert output(out) == oracle([(60, logged)], ttl_ms)
    assert [k for _, k in held] == [held_at([(60, logged)], ttl_ms, now) for now, _ in held]
    assert held[0][1] == users_in(60) and held[-1][1] == 0  # the key count fell after expiry
    stats = [r.stats for r in PipelineClient(root).history() if r.stats is not None]
    assert sum(s.ttl_expired for s in stats) == users_in(60)


#: Long enough for a loaded machine to take its first requested checkpoint before it ends.
TTL_MS = 20_000


@pytest.mark.parametrize("placement", ["executors", "driver"])
def test_expired_entries_leave_the_state_and_the_output_stays_exact(
    spark: SparkSession, tmp_path: Path, placement: str
) -> None:
    root = str(tmp_path / "root")
    held = watch_expiry(root, tmp_path / "out", TTL_MS, placement, spark)
    check_expiry(root, tmp_path / "out", TTL_MS, held)


@pytest.mark.slow
def test_expired_entries_leave_the_state_under_spark_connect(tmp_path: Path) -> None:
    """The same job under Spark Connect (its script starts a local Connect server, in its
    own process), subtasks on the executors."""
    root, held_json = str(tmp_path / "root"), tmp_path / "held.json"
    script = Path(__file__).with_name("ttl_jobs.py")
    args = [root, str(tmp_path / "out"), str(TTL_MS), "executors", str(held_json)]
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=420
    )
    assert done.returncode == 0, done.stderr[-4000:]
    held = [(int(now), int(keys)) for now, keys in json.loads(held_json.read_text())]
    check_expiry(root, tmp_path / "out", TTL_MS, held)


def test_a_restore_at_another_parallelism_keeps_each_entrys_time(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Entries live at the savepoint stay live after a restore at parallelism 3 (the
    repeated users are not emitted again), as the loop over both runs says."""
    ttl_ms = 120_000
    config = CheckpointConfig.from_options(
        {"checkpoint.interval": "300ms", "savepoint.dir": str(tmp_path / "sp")}
    )
    p = Pipeline(spark, "keep", config=config, root=str(tmp_path / "root"))
    out = tmp_path / "out"
    run = p.start(
        source(60),
        Dedup(ttl_ms),
        output=str(out),
        watermark=WatermarkStrategy.no_watermarks(),
        trigger_s=0.2,
        parallelism=2,
    )
    sp = stop_with_savepoint(run, tmp_path / "sp")
    stored = StateReader.open(sp.path).keyed("dedup", "seen")
    assert stored.num_rows > 0 and "_ttl_updated_ms" in str(stored.schema.field("value").type)
    p.run(
        source(120),
        Dedup(ttl_ms),
        output=str(out),
        available_now=True,
        watermark=WatermarkStrategy.no_watermarks(),
        parallelism=3,
        restore=RestoreSettings.savepoint(sp.path),
    )
    first, second = logged_batches(p.root, CHANNELS)
    expected = oracle([(60, first), (120, second)], ttl_ms)
    assert output(out) == expected
    assert sum(expected.values()) == len({u for u, _ in expected})  # nobody emitted twice


def test_a_ttl_without_a_time_keeping_pipeline_is_refused_before_anything_runs(
    spark: SparkSession, tmp_path: Path
) -> None:
    p = Pipeline(spark, "untimed", root=str(tmp_path / "root"))
    with pytest.raises(ConfigError, match=r"states with a TTL \(seen\)"):
        p.run(source(10), Dedup(1000), output=str(tmp_path / "out"), available_now=True)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change", ["added", "removed"])
def test_a_ttl_added_or_removed_at_a_restore_is_one_clear_error(
    spark: SparkSession, tmp_path: Path, change: str
) -> None:
    """A state written without a TTL has no times of last update to restore a TTL from (and
    one written with a TTL would lose them): the restore fails the run at once, naming the
    operator and the state, however many restarts the strategy allows; the output keeps
    only what the first run committed."""
    before, after = (None, 60_000) if change == "added" else (60_000, None)
    p = Pipeline(spark, "ttl-change", root=str(tmp_path / "root"))
    out = tmp_path / "out"
    time_kept = WatermarkStrategy.no_watermarks()
    p.run(source(30), Dedup(before), output=str(out), available_now=True, watermark=time_kept)
    committed = output(out)
    restarts = CheckpointConfig.from_options(
        {
            "restart-strategy": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": "3",
            "restart-strategy.fixed-delay.delay": "100ms",
        }
    )
    p = Pipeline(spark, "ttl-change", config=restarts, root=str(tmp_path / "root"))
    with pytest.raises(SparkCkptError) as failed:
        p.run(source(60), Dedup(after), output=str(out), available_now=True, watermark=time_kept)
    message = str(failed.value)
    assert "state 'seen' of operator 'dedup'" in message, message
    assert ("written without one" if change == "added" else "written with a TTL") in message
    assert output(out) == committed

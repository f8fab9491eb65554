"""State TTL on real Spark: deduplication whose memory of a key expires. The oracle is a
plain loop over the micro-batches Spark logged (their rows and processing times): a key is
emitted when it has no entry, or its entry (the time it was last emitted) is at least the
TTL old. Expired entries leave the state, so a checkpoint's key count falls to zero while the
output stays exact; a savepoint restored at another parallelism keeps each entry's time."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import LoggedBatch, logged_batches, stop_with_savepoint

from spark_ckpt import (
    CheckpointConfig,
    KeyedOperator,
    Pipeline,
    RestoreSettings,
    StateContext,
    StateReader,
    StateTtlConfig,
    ValueStateDescriptor,
    WatermarkStrategy,
)
from spark_ckpt.errors import ConfigError
from spark_ckpt.sources.generator import GeneratorSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

SEED, CHANNELS, KEYS = 13, 2, 20


class Dedup(KeyedOperator):
    """Emits a user the first time it is seen, and again once its entry expired."""

    def __init__(self, ttl_ms: int) -> None:
        super().__init__("dedup", "user_id", pa.int64())
        self.seen = ValueStateDescriptor("seen", pa.bool_(), ttl=StateTtlConfig.of(ttl_ms))

    def open(self, state: StateContext) -> None:
        state.value_state(self.seen)  # registered up front: a restore keeps it

    @property
    def output_schema(self) -> pa.Schema:
        return pa.schema([("user_id", pa.int64()), ("at", pa.int64())])

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        keys = pc.unique(batch.column("user_id"))
        new = keys.filter(pc.is_null(state.get_values(self.seen, keys)))
        state.put_values(self.seen, new, pa.array([True] * len(new)))
        at = pa.array([state.current_processing_time] * len(new), pa.int64())
        return pa.table([new, at], schema=self.output_schema)


def source(backlog: int) -> dict[str, object]:
    return {
        "source": "generator",
        "seed": SEED,
        "channels": CHANNELS,
        "rate": 0,
        "backlog": backlog,
        "keys": KEYS,
    }


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


def keys_held(reader: StateReader) -> int:
    """The keys of the dedup state a checkpoint holds (an operator without any has none)."""
    if "dedup" not in reader.uids() or "seen" not in reader.state_names("dedup"):
        return 0
    return reader.keyed("dedup", "seen").num_rows


def output(path: Path) -> Counter[tuple[int, int]]:
    return Counter(pl.read_delta(str(path)).select("user_id", "at").iter_rows())


def held_at(runs: list[tuple[int, list[LoggedBatch]]], ttl_ms: int, now: int) -> int:
    """The keys whose entry a loop over *runs* holds live at processing time *now*."""
    seen: dict[int, int] = {}
    for (user, at), _ in oracle(runs, ttl_ms).items():
        if at <= now:
            seen[user] = max(seen.get(user, at), at)
    return sum(1 for at in seen.values() if at + ttl_ms > now)


@pytest.mark.parametrize("placement", ["executors", "driver"])
def test_expired_entries_leave_the_state_and_the_output_stays_exact(
    spark: SparkSession, tmp_path: Path, placement: str
) -> None:
    """A checkpoint while the entries live holds every key; once they expired, the
    checkpoints hold none (each as the loop says at the checkpoint's processing time). The
    TTL is long enough for a loaded machine to take the first checkpoint before it ends."""
    ttl_ms = 20_000
    config = CheckpointConfig.from_options({"checkpoint.interval": "300ms"})
    p = Pipeline(spark, "dedup", config=config, root=str(tmp_path / "root"))
    out = tmp_path / "out"
    spec = GeneratorSpec(SEED, CHANNELS, 0.0, 60, KEYS)
    users = len({u for c in range(CHANNELS) for u in spec.rows(c, 0, 60)["user_id"].to_pylist()})
    run = p.start(
        source(60),
        Dedup(ttl_ms),
        output=str(out),
        watermark=WatermarkStrategy.no_watermarks(),
        trigger_s=0.2,
        placement=placement,
    )
    held: list[tuple[int, int]] = []  # (processing time, keys) of requested checkpoints
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # waits, not timed assertions
            if (out / "_delta_log").exists() and pl.read_delta(str(out)).height >= users:
                break
            time.sleep(0.2)
        while time.monotonic() < deadline:
            cp = p.client.checkpoint()
            [now] = {m.processing_ms for m in cp.stats.task_time.values()}
            held.append((now, keys_held(StateReader.open(p.root, cp.checkpoint_id))))
            if held[-1][1] == 0:
                break
            time.sleep(1)
        run.stop(timeout_s=120)
    finally:
        if run.query.isActive:
            run.query.stop()
    [logged] = logged_batches(p.root, CHANNELS)
    assert output(out) == oracle([(60, logged)], ttl_ms)
    assert [k for _, k in held] == [held_at([(60, logged)], ttl_ms, now) for now, _ in held]
    assert held[0][1] == users and held[-1][1] == 0  # the key count fell after expiry
    stats = [r.stats for r in p.client.history() if r.stats is not None]
    assert sum(s.ttl_expired for s in stats) == users


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

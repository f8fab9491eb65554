"""The state-TTL job of ``test_state_ttl.py``: a dedup whose memory of a key expires, the
generator input it reads, and the watch that requests checkpoints until every entry has
expired. Run as a script it is that job under Spark Connect (``connect_session("local[2]")``
starts a local Connect server in the script's process, which a test process holding a
classic session cannot)::

    python tests/integration/ttl_jobs.py ROOT OUT TTL_MS PLACEMENT HELD_JSON

It writes the watch's ``[processing time, keys held]`` pairs to HELD_JSON; the test checks
them and the output against its loop."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt import (
    CheckpointConfig,
    KeyedOperator,
    Pipeline,
    StateContext,
    StateReader,
    StateTtlConfig,
    ValueStateDescriptor,
    WatermarkStrategy,
)
from spark_ckpt.sources.generator import GeneratorSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SEED, CHANNELS, KEYS = 13, 2, 20


class Dedup(KeyedOperator):
    """Emits a user the first time it is seen, and again once its entry expired (*ttl_ms*
    None: never)."""

    def __init__(self, ttl_ms: int | None) -> None:
        super().__init__("dedup", "user_id", pa.int64())
        ttl = None if ttl_ms is None else StateTtlConfig.of(ttl_ms)
        self.seen = ValueStateDescriptor("seen", pa.bool_(), ttl=ttl)

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


def users_in(backlog: int) -> int:
    """The distinct users of the first *backlog* rows of every channel."""
    spec = GeneratorSpec(SEED, CHANNELS, 0.0, backlog, KEYS)
    return len(
        {u for c in range(CHANNELS) for u in spec.rows(c, 0, backlog)["user_id"].to_pylist()}
    )


def keys_held(reader: StateReader) -> int:
    """The keys of the dedup state a checkpoint holds (an operator without any has none)."""
    if "dedup" not in reader.uids() or "seen" not in reader.state_names("dedup"):
        return 0
    return reader.keyed("dedup", "seen").num_rows


def watch_expiry(
    root: str, out: Path, ttl_ms: int, placement: str, spark: SparkSession
) -> list[tuple[int, int]]:
    """Run the dedup over 60 rows per channel (a pipeline at *root* on *spark*, into
    *out*); once every user was emitted, watch the checkpoint that committed the last of
    them (its barrier followed the emissions within one interval, so it holds every key
    however long it took to complete), then request a checkpoint every second until one
    holds no key; stop. Returns each watched checkpoint's (processing time, keys held)."""
    config = CheckpointConfig.from_options({"checkpoint.interval": "300ms"})
    p = Pipeline(spark, "dedup", config=config, root=root)
    run = p.start(
        source(60),
        Dedup(ttl_ms),
        output=str(out),
        watermark=WatermarkStrategy.no_watermarks(),
        trigger_s=0.2,
        placement=placement,
    )
    users = users_in(60)
    held: list[tuple[int, int]] = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # waits, not timed assertions
            if (out / "_delta_log").exists() and pl.read_delta(str(out)).height >= users:
                break
            time.sleep(0.2)
        cp = p.client.latest()
        while cp is not None and time.monotonic() < deadline:
            [now] = {m.processing_ms for m in cp.stats.task_time.values()}
            held.append((now, keys_held(StateReader.open(p.root, cp.checkpoint_id))))
            if held[-1][1] == 0:
                break
            time.sleep(1)
            cp = p.client.checkpoint()
        run.stop(timeout_s=120)
    finally:
        if run.query.isActive:
            run.query.stop()
    return held


def main(argv: list[str]) -> int:
    from spark_ckpt import connect_session

    root, out, ttl_ms, placement, held_json = argv
    spark = connect_session("local[2]", "ttl-connect")
    try:
        held = watch_expiry(root, Path(out), int(ttl_ms), placement, spark)
    finally:
        spark.stop()
    Path(held_json).write_text(json.dumps(held))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

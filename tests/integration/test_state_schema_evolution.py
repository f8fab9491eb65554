"""State schema evolution through a real Spark pipeline (local SparkSession, Delta tables).

Three runs on one pipeline root, each with more input (``rate 0`` generator backlogs that
extend each other), and the same operator uid ``counter``:

1. keyed state ``count`` int32 and ``stats`` ``struct<n: int32>``;
2. ``count`` widened to int64, ``stats`` to ``struct<n: int64, runs: int64 (nullable)>``: the
   counts continue from the restored state (oracle: a plain fold over all input), keys not
   seen again keep a null ``runs``;
3. ``count`` changed to string: refused — the run fails with the StateError naming the
   operator, the state and the change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from spark_ckpt import CheckpointConfig, KeyedOperator, Pipeline, StateContext, ValueStateDescriptor
from spark_ckpt.errors import PipelineFencedError
from spark_ckpt.runtime.operator import rank_within_key
from spark_ckpt.sources.generator import GeneratorSpec
from spark_ckpt.state.state_restore import restore_backends

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

SEED, KEYS = 5, 25


class EvolvingCount(KeyedOperator):
    """Running count per ``user_id`` kept in value state ``count`` of type *count_type*, and
    ``stats`` of type *stats_type* (``n``: the count; ``runs``, when the type has it: set
    to *run* for keys this run saw). Emits ``(user_id, count)`` per row."""

    def __init__(self, count_type: pa.DataType, stats_type: pa.DataType, run: int) -> None:
        super().__init__("counter", "user_id", pa.int64())
        self.count = ValueStateDescriptor("count", count_type)
        self.stats = ValueStateDescriptor("stats", stats_type)
        self.run = run

    @property
    def output_schema(self) -> pa.Schema:
        return pa.schema([("user_id", pa.int64()), ("count", pa.int64())])

    def open(self, state: StateContext) -> None:
        state.value_state(self.count)
        state.value_state(self.stats)

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        if batch.num_rows == 0:
            return None
        keys = batch.column("user_id")
        distinct, codes, rank = rank_within_key(keys)
        stored = state.get_values(self.count, distinct).fill_null(0).cast(pa.int64())
        before = stored.to_numpy(zero_copy_only=False)
        after = before + np.bincount(codes, minlength=len(distinct))
        state.put_values(self.count, distinct, pa.array(after).cast(self.count.value_type))
        n_type = self.stats.value_type.field("n").type
        fields = [pa.array(after).cast(n_type)]
        if self.stats.value_type.get_field_index("runs") >= 0:
            fields.append(pa.array(np.full(len(distinct), self.run), pa.int64()))
        state.put_values(
            self.stats,
            distinct,
            pa.StructArray.from_arrays(fields, fields=list(self.stats.value_type)),
        )
        counts = before[codes] + rank + 1
        return pa.table(
            [keys.cast(pa.int64()), pa.array(counts, pa.int64())], schema=self.output_schema
        )


OLD_STATS = pa.struct([("n", pa.int32())])
NEW_STATS = pa.struct([("n", pa.int64()), ("runs", pa.int64())])


def key_counts(
    spec: GeneratorSpec, ends: Sequence[int], begins: Sequence[int] = ()
) -> Counter[int]:
    """Rows per key in rows ``[begins[c], ends[c])`` of every channel *c*: a plain fold."""
    counts: Counter[int] = Counter()
    for channel, end in enumerate(ends):
        begin = begins[channel] if begins else 0
        counts.update(spec.rows(channel, begin, end).column("user_id").to_pylist())
    return counts


def running_counts(counts: Counter[int]) -> Counter[tuple[int, int]]:
    return Counter((k, i) for k, n in counts.items() for i in range(1, n + 1))


def run(
    spark: SparkSession, base: Path, backlog: tuple[int, ...], op: EvolvingCount, **options: str
) -> Any:
    config = CheckpointConfig.from_options({"checkpoint.interval": "300ms", **options})
    pipeline = Pipeline(spark, "evolve", config=config, root=str(base / "root"))
    source = {
        "source": "generator",
        "seed": SEED,
        "channels": len(backlog),
        "rate": 0,
        "backlog": ",".join(map(str, backlog)),
        "keys": KEYS,
    }
    result = pipeline.run(source, op, output=str(base / "out"), parallelism=2, available_now=True)
    return pipeline, result


def test_widened_state_continues_and_incompatible_change_fails_the_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    first, second, third = (300, 200), (650, 420), (700, 500)
    run(spark, tmp_path, first, EvolvingCount(pa.int32(), OLD_STATS, 1))
    pipeline, result = run(spark, tmp_path, second, EvolvingCount(pa.int64(), NEW_STATS, 2))
    assert result.restarts == 0 and result.restored_from[0] is not None

    spec = GeneratorSpec(SEED, 2, 0.0, second, KEYS)
    folded = key_counts(spec, second)
    out = pl.read_delta(str(tmp_path / "out"))
    assert Counter(out.select("user_id", "count").iter_rows()) == running_counts(folded)

    # the restored state of the last checkpoint, read with the new descriptors
    latest = pipeline.store.latest_completed()
    assert latest is not None
    [backend] = restore_backends(
        "counter",
        pa.int64(),
        1,
        latest.operator_blobs("counter"),
        pipeline.store.read_blob,
        max_parallelism=pipeline.config.max_parallelism,
    )
    count = ValueStateDescriptor("count", pa.int64())
    stats = ValueStateDescriptor("stats", NEW_STATS)
    keys = backend.keys(count)
    got = dict(zip(keys.to_pylist(), backend.get_values(count, keys).to_pylist(), strict=True))
    assert got == dict(folded)
    seen_again = set(key_counts(spec, second, begins=first))
    expected_stats = {
        k: {"n": n, "runs": 2 if k in seen_again else None} for k, n in folded.items()
    }
    got_stats = dict(
        zip(keys.to_pylist(), backend.get_values(stats, keys).to_pylist(), strict=True)
    )
    assert got_stats == expected_stats

    # an incompatible change: the run fails naming operator, state and change, at once
    # although the restart strategy would allow restarts (a restart cannot mend it)
    restarts = {
        "restart-strategy": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "3",
        "restart-strategy.fixed-delay.delay": "100ms",
    }
    with pytest.raises(PipelineFencedError) as failed:
        run(spark, tmp_path, third, EvolvingCount(pa.string(), NEW_STATS, 3), **restarts)
    message = str(failed.value)
    assert "cannot restore its state" in message, message
    assert (
        "StateError: state 'count' of operator 'counter': value type changed from int64 to "
        "string: incompatible"
    ) in message, message

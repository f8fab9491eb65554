"""Upgrades that change the operator chain, and their roll backs, on real Spark and Delta.

The identity of the output belongs to the pipeline and the table, never to the operator
chain: a version with an operator added in front, reordered or removed commits into the same
table under the same app transaction, and a restore withdraws every later commit, whichever
version wrote it. Operators restore their state by uid wherever they stand in the chain.

Oracles are plain folds over the generator's input (``GeneratorSpec.rows``); output is read
with polars, state with :class:`~spark_ckpt.StateReader`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import delta_txn_versions, output_rows, read_delta
from deltalake import DeltaTable

from spark_ckpt import (
    CheckpointConfig,
    KeyedOperator,
    Pipeline,
    RestoreSettings,
    RunningCount,
    StateContext,
    StateReader,
    ValueStateDescriptor,
    list_savepoints,
)
from spark_ckpt.errors import ConfigError, RestoreError
from spark_ckpt.sources.generator import GeneratorSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

TIMEOUT_S = 240
SEED, KEYS, CHANNELS = 11, 20, 2


class Tally(KeyedOperator):
    """Counts the rows of each key in its state and passes its input on unchanged."""

    SEEN = ValueStateDescriptor("seen", pa.int64())

    def __init__(self, uid: str) -> None:
        super().__init__(uid, "user_id", pa.int64())

    def open(self, state: StateContext) -> None:
        state.value_state(self.SEEN)

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        per_key = batch.group_by("user_id").aggregate([("user_id", "count")])
        keys = per_key.column("user_id")
        before = state.get_values(self.SEEN, keys).fill_null(0)
        state.put_values(self.SEEN, keys, pc.add(before, per_key.column("user_id_count")))
        return batch


def source(backlog: int) -> dict[str, object]:
    return {
        "source": "generator",
        "seed": SEED,
        "channels": CHANNELS,
        "rate": 0,
        "backlog": backlog,
        "keys": KEYS,
    }


def keys_between(start: int, end: int) -> Counter[int]:
    """Rows per key in rows ``[start, end)`` of every channel (the generator's input)."""
    spec = GeneratorSpec(SEED, CHANNELS, 0.0, end, KEYS)
    counts: Counter[int] = Counter()
    for channel in range(CHANNELS):
        counts.update(spec.rows(channel, start, end).column("user_id").to_pylist())
    return counts


def running_counts(start: int, end: int, base: int = 0) -> Counter[tuple[int, int]]:
    """A running count's output over rows ``[start, end)`` when it had counted the rows
    ``[base, start)`` before (a plain fold)."""
    before = keys_between(base, start) if start > base else Counter()
    return Counter(
        (k, i)
        for k, n in keys_between(start, end).items()
        for i in range(before[k] + 1, before[k] + n + 1)
    )


def output(path: Path) -> Counter[tuple[int, int]]:
    return Counter(pl.read_delta(str(path)).select("user_id", "count").iter_rows())


def pipeline(spark: SparkSession, base: Path) -> Pipeline:
    config = CheckpointConfig.from_options(
        {"checkpoint.interval": "300ms", "savepoint.dir": str(base / "savepoints")}
    )
    return Pipeline(spark, "orders", config=config, root=str(base / "root"))


def bounded(
    p: Pipeline,
    backlog: int,
    operators: Sequence[KeyedOperator],
    out: Path,
    restore: RestoreSettings | None = None,
) -> None:
    result = p.run(
        source(backlog), list(operators), output=str(out), available_now=True, restore=restore
    )
    assert result.restarts == 0 and not result.failures, result


def stop_with_savepoint(
    p: Pipeline, backlog: int, operators: Sequence[KeyedOperator], out: Path
) -> str:
    """Run *operators* over *backlog* rows per channel, stop with a drained savepoint; its
    directory."""
    run = p.start(source(backlog), list(operators), output=str(out), trigger_s=0.3)
    try:
        final = run.stop(savepoint=True, drain=True, timeout_s=TIMEOUT_S)
    finally:
        if run.query.isActive:
            run.query.stop()
    assert final is not None and final.is_savepoint
    [sp] = [
        s
        for s in list_savepoints(p.config.savepoint_dir or "")
        if s.checkpoint.checkpoint_id == final.checkpoint_id
    ]
    assert sorted(sp.checkpoint.offsets().values()) == [backlog] * CHANNELS  # drained
    return sp.path


def tallies(root: str, uid: str) -> dict[int, int]:
    table = StateReader.open(root).keyed(uid, "seen")
    return dict(
        zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)
    )


def age(path: Path) -> None:
    """Make the table's files look as old as a real job's (recovery keeps files staged in
    the last seconds before a run, a margin for clock skew): a minute older."""
    for f in path.glob("*.parquet"):
        t = f.stat().st_mtime - 60
        os.utime(f, (t, t))


def versions(path: Path) -> int:
    return DeltaTable(str(path)).version()


def every_version_reads(path: Path) -> None:
    """Every version of the table, from the first to the last, reads with deltalake and
    with polars, and both agree with an independent replay of the log up to it."""
    for version in range(versions(path) + 1):
        want = output_rows(read_delta(path, version))
        table = DeltaTable(str(path), version=version).to_pyarrow_table()
        assert output_rows(table) == want, version
        frame = pl.read_delta(str(path), version=version).select("user_id", "count")
        assert Counter(frame.iter_rows()) == want, version


def test_a_rolled_back_upgrade_leaves_the_output_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    """v1 → savepoint → v2 with a new operator in front (no escape hatch needed) → v1
    restored from the savepoint into the same table: exactly one (key, i) per input row, and
    every version of the table still reads, also for a reader that opened the version
    before the roll back (the withdrawn files stay on storage until a VACUUM)."""
    p = pipeline(spark, tmp_path)
    out = tmp_path / "out"
    sp1 = stop_with_savepoint(p, 200, [RunningCount("counter", "user_id")], out)
    assert output(out) == running_counts(0, 200)

    # v2: a stateful operator added in front of the counter; the counter keeps its state
    bounded(
        p,
        400,
        [Tally("tally"), RunningCount("counter", "user_id")],
        out,
        RestoreSettings.savepoint(sp1),
    )
    assert output(out) == running_counts(0, 400)
    assert tallies(p.root, "tally") == dict(keys_between(200, 400))  # it started empty

    # a reader of v2's last version, opened before the roll back
    reader = DeltaTable(str(out))
    v2_rows = output_rows(reader.to_pyarrow_table())
    assert v2_rows == running_counts(0, 400)

    # roll back to v1 from the savepoint: v2's output is withdrawn, v1 counts on
    age(out)
    bounded(p, 500, [RunningCount("counter", "user_id")], out, RestoreSettings.savepoint(sp1))
    assert output(out) == running_counts(0, 500)
    assert output_rows(read_delta(out)) == running_counts(0, 500)
    # every version committed under the pipeline's one app transaction
    assert {app for app, _ in delta_txn_versions(out)} == {"spark-ckpt/orders"}
    every_version_reads(out)
    assert output_rows(reader.to_pyarrow_table()) == v2_rows  # its snapshot, read after
    assert (
        Counter(
            pl.read_delta(str(out), version=reader.version()).select("user_id", "count").iter_rows()
        )
        == v2_rows
    )


def test_operators_reordered_or_removed_restore_by_uid(spark: SparkSession, tmp_path: Path) -> None:
    p = pipeline(spark, tmp_path)
    out = tmp_path / "out"
    sp = stop_with_savepoint(p, 150, [Tally("tally"), RunningCount("counter", "user_id")], out)
    assert tallies(sp, "tally") == dict(keys_between(0, 150))

    # reordered: each operator finds its own state
    bounded(
        p,
        300,
        [RunningCount("counter", "user_id"), Tally("tally")],
        out,
        RestoreSettings.savepoint(sp),
    )
    assert output(out) == running_counts(0, 300)
    assert tallies(p.root, "tally") == dict(keys_between(0, 300))

    # removed: refused, naming the user's uid and nothing internal ...
    with pytest.raises(RestoreError, match="'tally'") as refused:
        bounded(p, 350, [RunningCount("counter", "user_id")], out, RestoreSettings.savepoint(sp))
    assert "_task" not in str(refused.value) and "'counter'" not in str(refused.value)
    # ... unless its state may be dropped; the output rolls back to the savepoint's
    bounded(
        p,
        350,
        [RunningCount("counter", "user_id")],
        out,
        RestoreSettings.savepoint(sp, allow_non_restored_state=True),
    )
    assert output(out) == running_counts(0, 350)


def test_a_restore_into_another_table_starts_it_at_the_restored_positions(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The savepoint's sink state belongs to the first table: the second receives the output
    from the restored positions on, and the first is left as it was."""
    p = pipeline(spark, tmp_path)
    first, second = tmp_path / "first", tmp_path / "second"
    sp = stop_with_savepoint(p, 120, [RunningCount("counter", "user_id")], first)
    before = output(first)
    assert before == running_counts(0, 120)
    bounded(p, 260, [RunningCount("counter", "user_id")], second, RestoreSettings.savepoint(sp))
    assert output(second) == running_counts(120, 260, base=0)
    assert output(first) == before


def test_operators_must_have_distinct_uids_and_one_key(spark: SparkSession, tmp_path: Path) -> None:
    p = pipeline(spark, tmp_path)
    with pytest.raises(ConfigError, match="distinct uids"):
        bounded(p, 10, [Tally("same"), Tally("same")], tmp_path / "out")
    with pytest.raises(ConfigError, match="keyed by one column"):
        bounded(p, 10, [Tally("a"), RunningCount("b", "amount")], tmp_path / "out")
    # the job's options are keywords of run/start/prepare: a misspelt one is refused
    with pytest.raises(TypeError, match="'paralellism'"):
        p.run({}, Tally("a"), output=str(tmp_path / "out"), paralellism=3)  # type: ignore[call-arg]
    assert not (tmp_path / "out").exists()


def test_a_restore_past_an_earlier_roll_back_is_exact_until_a_vacuum(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Savepoints at 100 and 200 rows per channel, then the one at 100 restored (the output
    is rolled back to it and continues to 250), then the one at 200 restored past it: the
    output it had comes back and continues to 300, exactly once. Every version still reads.
    Once a VACUUM deleted what the table no longer references, restoring a savepoint whose
    output is gone is refused before anything changes; into another table it restores."""
    p = pipeline(spark, tmp_path)
    out, other = tmp_path / "out", tmp_path / "other"
    early = stop_with_savepoint(p, 100, [RunningCount("counter", "user_id")], out)
    late = stop_with_savepoint(p, 200, [RunningCount("counter", "user_id")], out)
    assert output(out) == running_counts(0, 200)
    age(out)
    bounded(p, 250, [RunningCount("counter", "user_id")], out, RestoreSettings.savepoint(early))
    assert output(out) == running_counts(0, 250)
    age(out)
    bounded(p, 300, [RunningCount("counter", "user_id")], out, RestoreSettings.savepoint(late))
    assert output(out) == running_counts(0, 300)
    assert output_rows(read_delta(out)) == running_counts(0, 300)
    every_version_reads(out)

    # back to the early one, then a VACUUM with no retention: the late output is gone
    age(out)
    bounded(p, 120, [RunningCount("counter", "user_id")], out, RestoreSettings.savepoint(early))
    assert output(out) == running_counts(0, 120)
    assert DeltaTable(str(out)).vacuum(0, dry_run=False, enforce_retention_duration=False)
    latest = p.client.latest()
    with pytest.raises(RestoreError, match="gone from storage"):
        bounded(p, 300, [RunningCount("counter", "user_id")], out, RestoreSettings.savepoint(late))
    assert output(out) == running_counts(0, 120)
    assert p.client.latest() == latest  # nothing was installed
    bounded(p, 300, [RunningCount("counter", "user_id")], other, RestoreSettings.savepoint(late))
    assert output(other) == running_counts(200, 300)

"""Functional tests of the Spark integration on a real local SparkSession and real Delta tables.

Every pipeline reads the deterministic generator with ``rate 0`` (a finite backlog per
channel), so the input is known up front: the oracles are plain folds over
``GeneratorSpec(...).rows(...)``, and the outputs are read back with a second Delta reader
(``polars.read_delta``) or from the ``_delta_log`` JSON itself -- never through spark-ckpt.

Covered: ``Trigger.AvailableNow`` through the foreachBatch aligner (final checkpoint, keyed
state, exactly-once output), resuming a second run with more input, the stateless
``ckpt-sink`` (no ``_ckpt_*`` columns, only completed checkpoints visible), a lagging channel
under a read limit, the checkpoint store's tables as seen by another reader, the Delta tail
source, option validation, and a savepoint taken while a query runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa
import pytest

from spark_ckpt.coordination.requests import STOP
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.errors import ConfigError
from spark_ckpt.pipeline.pipeline import Pipeline
from spark_ckpt.protocol.barrier import BARRIER_COLUMNS, SnapshotType
from spark_ckpt.protocol.trace import Phase
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.operator import RunningCount
from spark_ckpt.sources.generator import GeneratorSpec
from spark_ckpt.state.state_restore import restore_backends
from spark_ckpt.testing import faults

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

pytestmark = pytest.mark.spark

USER_COLUMNS = ("user_id", "amount", "event_ts")
#: Liveness bound of one query run (never an assertion about speed).
RUN_TIMEOUT_S = 240
SOURCE = "source"  # the vertex name under which source positions are recorded


# -- oracles (independent of the code under test) ------------------------------------------


def key_counts(spec: GeneratorSpec, ends: Sequence[int]) -> Counter[int]:
    """Rows per key in rows ``[0, ends[c])`` of every channel *c*: a plain fold."""
    counts: Counter[int] = Counter()
    for channel, end in enumerate(ends):
        counts.update(spec.rows(channel, 0, end).column("user_id").to_pylist())
    return counts


def running_counts(counts: Counter[int]) -> Counter[tuple[int, int]]:
    """Output of a keyed running count: every ``(key, i)`` with ``1 <= i <= n_key`` once."""
    return Counter((k, i) for k, n in counts.items() for i in range(1, n + 1))


def input_rows(spec: GeneratorSpec, ends: Sequence[int]) -> Counter[tuple[int, int, int]]:
    """Multiset of ``(user_id, amount, event_ts in µs)`` of rows ``[0, ends[c])``."""
    rows: Counter[tuple[int, int, int]] = Counter()
    for channel, end in enumerate(ends):
        t = spec.rows(channel, 0, end)
        rows.update(
            zip(
                t.column("user_id").to_pylist(),
                t.column("amount").to_pylist(),
                t.column("event_ts").cast(pa.int64()).to_pylist(),
                strict=True,
            )
        )
    return rows


# -- second readers --------------------------------------------------------------------------


def read_table(path: Path, version: int | None = None) -> pl.DataFrame:
    return pl.read_delta(str(path), version=version)


def count_rows(df: pl.DataFrame) -> Counter[tuple[int, int]]:
    return Counter(df.select("user_id", "count").iter_rows())


def event_rows(df: pl.DataFrame) -> Counter[tuple[int, int, int]]:
    df = df.select("user_id", "amount", pl.col("event_ts").dt.epoch("us"))
    return Counter(df.iter_rows())


def log_commits(path: Path) -> list[list[dict[str, Any]]]:
    """The actions of every commit file of ``_delta_log``, version order."""
    commits = sorted((path / "_delta_log").glob("*.json"))
    assert commits and commits[0].name == f"{0:020d}.json"
    return [
        [json.loads(line) for line in c.read_text().splitlines() if line.strip()] for c in commits
    ]


def assert_delta_compatible(path: Path) -> None:
    """Protocol reader 1 / writer 2 and only UTC ``timestamp`` columns (no ``timestamp_ntz``)
    in every protocol/metaData action of the table's log."""
    protocols = [a["protocol"] for c in log_commits(path) for a in c if "protocol" in a]
    metadata = [a["metaData"] for c in log_commits(path) for a in c if "metaData" in a]
    assert protocols and metadata, path
    for p in protocols:
        assert (p["minReaderVersion"], p["minWriterVersion"]) == (1, 2), (path, p)
        assert not p.get("readerFeatures") and not p.get("writerFeatures"), (path, p)
    for m in metadata:
        types = [f["type"] for f in json.loads(m["schemaString"])["fields"]]
        assert "timestamp_ntz" not in types, (path, types)
    for name, dtype in read_table(path).schema.items():
        if isinstance(dtype, pl.Datetime):
            assert dtype.time_zone == "UTC", (path, name, dtype)


# -- running pipelines -----------------------------------------------------------------------


def config(**options: str) -> CheckpointConfig:
    return CheckpointConfig.from_options({"checkpoint.interval": "300ms", **options})


@dataclass
class Bounded:
    """One generator pipeline with a finite input (``rate 0``)."""

    pipeline: Pipeline
    spec: GeneratorSpec
    output: Path

    @property
    def ends(self) -> tuple[int, ...]:
        return self.spec.backlogs

    def source(self, **extra: object) -> dict[str, object]:
        """The ``ckpt-source`` options of this pipeline's input."""
        s = self.spec
        return {
            "source": "generator",
            "seed": s.seed,
            "channels": s.channels,
            "rate": 0,
            "backlog": ",".join(str(b) for b in s.backlogs),
            "keys": s.key_cardinality,
            **extra,
        }

    def read(self, **extra: object) -> Any:
        return self.pipeline.read(**self.source(**extra))


def generator(
    spark: SparkSession,
    base: Path,
    name: str,
    backlog: tuple[int, ...],
    *,
    seed: int = 11,
    keys: int = 30,
    cfg: CheckpointConfig | None = None,
) -> Bounded:
    pipeline = Pipeline(spark, name, config=cfg or config(), root=str(base / "root"))
    spec = GeneratorSpec(seed, len(backlog), 0.0, backlog, keys)
    return Bounded(pipeline, spec, base / "out")


def finish(query: StreamingQuery) -> None:
    """Wait for an AvailableNow query to end; a failure raises with Spark's message."""
    assert query.awaitTermination(RUN_TIMEOUT_S), "the AvailableNow query did not finish"
    assert query.exception() is None


def run_counts(job: Bounded, parallelism: int = 2, **read_options: object) -> StreamingQuery:
    """generator -> RunningCount(user_id) -> Delta via the foreachBatch aligner, AvailableNow."""
    run = job.pipeline.start(
        job.source(**read_options),
        RunningCount("counter", "user_id"),
        output=str(job.output),
        parallelism=parallelism,
        available_now=True,
    )
    finish(run.query)
    run.retire()
    return run.query


def restored_counts(job: Bounded) -> dict[int, int]:
    """The ``count`` keyed state of the latest completed checkpoint, restored at parallelism 1."""
    latest = job.pipeline.store.latest_completed()
    assert latest is not None
    [backend] = restore_backends(
        "counter",
        pa.int64(),
        1,
        latest.operator_blobs("counter"),
        job.pipeline.store.read_blob,
        max_parallelism=job.pipeline.config.max_parallelism,
    )
    keys = backend.keys(RunningCount.COUNT)
    values = backend.get_values(RunningCount.COUNT, keys)
    return dict(zip(keys.to_pylist(), values.to_pylist(), strict=True))


def final_offsets(job: Bounded) -> dict[tuple[str, int], int]:
    latest = job.pipeline.store.latest_completed()
    assert latest is not None
    return latest.offsets()


def at(ends: Sequence[int]) -> dict[tuple[str, int], int]:
    return {(SOURCE, c): e for c, e in enumerate(ends)}


@pytest.fixture(scope="module")
def counted(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Bounded:
    """One AvailableNow run of the running count (3 channels, 2 subtasks, 2 retained
    checkpoints), shared by the tests that only inspect its results."""
    job = generator(
        spark,
        tmp_path_factory.mktemp("counted"),
        "counted",
        (900, 500, 700),
        cfg=config(**{"checkpoint.retained": "2"}),
    )
    run_counts(job)
    return job


# -- (e) AvailableNow through the foreachBatch aligner ---------------------------------------


def test_available_now_ends_with_final_checkpoint_and_exactly_once_output(
    counted: Bounded,
) -> None:
    latest = counted.pipeline.store.latest_completed()
    assert latest is not None
    assert latest.snapshot_type is SnapshotType.CHECKPOINT
    assert latest.properties.get(STOP) == "available-now"
    assert latest.offsets() == at(counted.ends)
    folded = key_counts(counted.spec, counted.ends)
    assert count_rows(read_table(counted.output)) == running_counts(folded)
    assert restored_counts(counted) == dict(folded)


def test_second_available_now_run_resumes_with_more_input(
    spark: SparkSession, tmp_path: Path
) -> None:
    first = generator(spark, tmp_path, "resume", (400, 250, 300))
    run_counts(first)
    assert final_offsets(first) == at(first.ends)
    assert count_rows(read_table(first.output)) == running_counts(
        key_counts(first.spec, first.ends)
    )
    first_checkpoint = first.pipeline.store.latest_completed()
    assert first_checkpoint is not None

    # rows are a pure function of (seed, channel, offset): the longer backlog extends the input
    second = generator(spark, tmp_path, "resume", (700, 250, 650))
    for c, end in enumerate(first.ends):
        assert second.spec.rows(c, 0, end).column("user_id") == first.spec.rows(c, 0, end).column(
            "user_id"
        )
    run_counts(second)
    latest = second.pipeline.store.latest_completed()
    assert latest is not None and latest.checkpoint_id > first_checkpoint.checkpoint_id
    assert latest.offsets() == at(second.ends)
    folded = key_counts(second.spec, second.ends)
    assert count_rows(read_table(second.output)) == running_counts(folded)
    assert restored_counts(second) == dict(folded)


# -- the stateless ckpt-sink -------------------------------------------------------------------


def test_ckpt_sink_writes_input_exactly_once_and_only_completed_checkpoints(
    spark: SparkSession, tmp_path: Path
) -> None:
    job = generator(
        spark, tmp_path, "sinked", (700, 400), cfg=config(**{"checkpoint.retained": "100"})
    )
    events = job.read(maxRowsPerTrigger=300)
    query = (
        events.select(*USER_COLUMNS, *BARRIER_COLUMNS)
        .writeStream.format("ckpt-sink")
        .option("pipeline", job.pipeline.name)
        .option("store", job.pipeline.root)
        .option("path", str(job.output))
        .option("checkpointLocation", job.pipeline.spark_checkpoint_location())
        .trigger(availableNow=True)
        .start()
    )
    finish(query)

    completed = {c.checkpoint_id: c for c in job.pipeline.client.checkpoints()}
    assert final_offsets(job) == at(job.ends)
    table = read_table(job.output)
    assert set(table.columns) == set(USER_COLUMNS)
    assert not [c for c in table.columns if c.startswith("_ckpt_")]
    assert event_rows(table) == input_rows(job.spec, job.ends)

    # every version of the table holds exactly the input before the barriers of the
    # checkpoint its app transaction names: nothing of a checkpoint in progress is visible
    versions = 0
    for version, actions in enumerate(log_commits(job.output)):
        txns = [a["txn"] for a in actions if "txn" in a]
        if not txns:
            continue
        [txn] = txns
        checkpoint = completed[int(txn["version"])]
        ends = [checkpoint.offsets()[(SOURCE, c)] for c in range(job.spec.channels)]
        assert event_rows(read_table(job.output, version)) == input_rows(job.spec, ends)
        versions += 1
    assert versions >= 1


# -- a lagging channel under a read limit ------------------------------------------------------


def test_lagging_channel_aligns_over_several_batches_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    # 3 channels x 100 rows per micro-batch; channel 0 is 5 micro-batches deeper; barriers at
    # the channels' heads, so channel 0 reaches each of them micro-batches after the others
    job = generator(spark, tmp_path, "lagging", (700, 200, 200))
    query = run_counts(job, maxRowsPerTrigger=300, barrierPlacement="head")
    assert final_offsets(job) == at(job.ends)
    folded = key_counts(job.spec, job.ends)
    assert count_rows(read_table(job.output)) == running_counts(folded)
    assert restored_counts(job) == dict(folded)

    # from Spark's own offsets log (progress): batches that ended with some checkpoint's
    # barrier reached by channels 1 and 2, which the source held there, but not yet by
    # channel 0 (alignment at the source); each barrier was emitted on all channels at once
    waiting: Counter[int] = Counter()
    for progress in query.recentProgress:
        for source in progress.sources:
            end = json.loads(source.endOffset)
            assert len(set(end["emitted"])) == 1, end
            for barrier in end["barriers"]:
                held = barrier["positions"][1:] == end["positions"][1:]
                if barrier["id"] > end["emitted"][0] and held:
                    assert end["positions"][0] < barrier["positions"][0], end
                    waiting[barrier["id"]] += 1
    assert waiting and max(waiting.values()) >= 3, waiting


def test_barriers_at_the_read_position_complete_checkpoints_during_a_backlog(
    spark: SparkSession, tmp_path: Path
) -> None:
    # the same backlogs under the default placement: every barrier goes at the end of the
    # micro-batch that took the trigger, on every channel, so checkpoints complete while
    # channel 0 still works off its backlog (a job catching up keeps checkpointing)
    job = generator(spark, tmp_path, "catching_up", (1500, 200, 200))
    query = run_counts(job, maxRowsPerTrigger=300)
    assert final_offsets(job) == at(job.ends)
    folded = key_counts(job.spec, job.ends)
    assert count_rows(read_table(job.output)) == running_counts(folded)
    assert restored_counts(job) == dict(folded)

    ends = [
        json.loads(source.endOffset)
        for progress in query.recentProgress
        for source in progress.sources
    ]
    for end in ends:  # a barrier is emitted on all channels by the batch that places it
        assert len(set(end["emitted"])) == 1, end
    # and some checkpoint's barriers were emitted before channel 0's backlog was read
    assert any(end["emitted"][0] > 0 and end["positions"][0] < 1500 for end in ends), ends


# -- (f) the store tables and the output through another reader --------------------------------


def test_store_tables_agree_with_list_completed_for_another_reader(counted: Bounded) -> None:
    store = counted.pipeline.store
    completed = {c.checkpoint_id: c for c in store.list_completed()}
    assert completed
    root = Path(counted.pipeline.root)

    log = read_table(root / "checkpoints").filter(pl.col("record") == "completed")
    assert sorted(log["checkpoint_id"].to_list()) == sorted(completed)
    for row in log.iter_rows(named=True):
        c = completed[row["checkpoint_id"]]
        assert hashlib.sha256(row["metadata"].encode()).hexdigest() == row["checksum"]
        assert json.loads(row["metadata"])["checkpoint_id"] == c.checkpoint_id
        assert row["snapshot_type"] == c.snapshot_type.value
        assert row["trigger_ts"] <= row["completed_ts"]

    offsets = read_table(root / "source_offsets")
    for cid, c in completed.items():
        mine = offsets.filter(pl.col("checkpoint_id") == cid)
        assert mine.height > 0
        reported = {(r["source"], r["channel"]): r["offset"] for r in mine.iter_rows(named=True)}
        assert reported == c.offsets()

    state = read_table(root / "operator_state")
    stored = {
        (
            r["checkpoint_id"],
            r["operator_uid"],
            r["subtask"],
            r["kind"],
            r["state_name"],
            r["key_group_start"],
            r["key_group_end"],
            r["channel"],
            r["seq"],
        ): r["checksum"]
        for r in state.drop("payload").iter_rows(named=True)
    }
    for c in completed.values():
        blobs = list(c.blobs())
        assert blobs
        for b in blobs:
            assert stored.get(b.key) == b.checksum, b

    for table in ("checkpoints", "operator_state", "source_offsets"):
        assert_delta_compatible(root / table)
    assert_delta_compatible(counted.output)


# -- the Delta tail source ---------------------------------------------------------------------


def test_delta_tail_reads_another_pipelines_output_exactly_once(
    spark: SparkSession, counted: Bounded, tmp_path: Path
) -> None:
    upstream = read_table(counted.output)
    pipeline = Pipeline(spark, "tail", config=config(), root=str(tmp_path / "root"))
    events = pipeline.read(source="delta", path=str(counted.output), channels=2)
    assert events.columns[:2] == ["user_id", "count"]
    output = tmp_path / "out"
    query = (
        events.select("user_id", "count", *BARRIER_COLUMNS)
        .writeStream.format("ckpt-sink")
        .option("pipeline", "tail")
        .option("store", pipeline.root)
        .option("path", str(output))
        .option("checkpointLocation", pipeline.spark_checkpoint_location())
        .trigger(availableNow=True)
        .start()
    )
    finish(query)
    downstream = read_table(output)
    assert set(downstream.columns) == {"user_id", "count"}
    assert count_rows(downstream) == count_rows(upstream)
    assert downstream.height == upstream.height > 0


# -- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"bogus": "1"}, "bogus"),
        ({"rate": "fast"}, "rate"),
        ({"maxRowsPerTrigger": "0"}, "maxRowsPerTrigger"),
        ({"barrierPlacement": "tail"}, "barrierPlacement"),
        ({"source": "kinesis"}, "source"),
        ({"checkpoint.intervall": "1s"}, "checkpoint.intervall"),
    ],
)
def test_invalid_source_options_are_named(
    spark: SparkSession, tmp_path: Path, options: dict[str, str], option: str
) -> None:
    from pyspark.errors import AnalysisException

    pipeline = Pipeline(spark, "options", root=str(tmp_path / "root"))
    with pytest.raises(ConfigError) as config_error:
        pipeline.read(**{"source": "generator", **options})
    assert config_error.value.option.lower() == option.lower()

    reader = spark.readStream.format("ckpt-source").option("pipeline", "options")
    reader = reader.option("store", str(tmp_path / "root"))
    with pytest.raises(AnalysisException) as analysis_error:
        reader.options(**options).load()
    assert option.lower() in str(analysis_error.value).lower()


def test_source_options_that_contradict_the_pipeline_are_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The pipeline's configuration is not silently overridden: Pipeline.read and the source
    of Pipeline.run refuse a different checkpoint interval (nothing is started: no run), and
    an invalid one gets its usual error; the same value, spelled otherwise, is accepted."""
    cfg = CheckpointConfig.from_options({"checkpoint.interval": "2s"})
    pipeline = Pipeline(spark, "conflicts", config=cfg, root=str(tmp_path / "root"))
    with pytest.raises(ConfigError) as invalid:
        pipeline.read(**{"checkpoint.interval": "abc"})
    assert (invalid.value.option, invalid.value.value) == ("checkpoint.interval", "abc")
    assert "duration" in invalid.value.accepted
    with pytest.raises(ConfigError) as conflict:
        pipeline.read(source="generator", **{"checkpoint.interval": "5s"})
    assert "'5s'" in str(conflict.value) and "'2s'" in str(conflict.value)
    assert "CheckpointConfig" in str(conflict.value)
    with pytest.raises(ConfigError) as in_run:
        pipeline.run(
            {"source": "generator", "rate": 0, "execution.checkpointing.interval": "1s"},
            RunningCount("counter", "user_id"),
            output=str(tmp_path / "out"),
            available_now=True,
        )
    assert in_run.value.option == "execution.checkpointing.interval"
    assert pipeline.client.runs() == []  # refused before any run started
    assert pipeline.read(source="generator", **{"checkpoint.interval": "2000"}).isStreaming


# -- a savepoint while the query runs -----------------------------------------------------------


def test_savepoint_while_running_survives_retention_and_stop_takes_final_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    pipeline = Pipeline(
        spark, "running", config=config(**{"checkpoint.retained": "1"}), root=str(tmp_path / "root")
    )
    spec = GeneratorSpec(5, 2, 200.0, 100, 20)
    run = pipeline.start(
        {"source": "generator", "seed": 5, "channels": 2, "rate": 200, "backlog": 100, "keys": 20},
        RunningCount("counter", "user_id"),
        output=str(tmp_path / "out"),
        trigger_s=0.5,
    )
    query = run.query
    try:
        savepoint = pipeline.client.savepoint(timeout_s=RUN_TIMEOUT_S)
        assert savepoint.snapshot_type is SnapshotType.SAVEPOINT and savepoint.is_savepoint
        assert savepoint in pipeline.client.checkpoints()
        later = [pipeline.client.checkpoint(timeout_s=RUN_TIMEOUT_S) for _ in range(2)]
        assert all(c.checkpoint_id > savepoint.checkpoint_id for c in later)
        final = run.stop(timeout_s=RUN_TIMEOUT_S)
    finally:
        if query.isActive:
            query.stop()
    assert final is not None and STOP in final.properties
    assert final.checkpoint_id > later[-1].checkpoint_id
    assert not query.isActive and query.exception() is None

    kept = {c.checkpoint_id for c in pipeline.client.checkpoints()}
    assert savepoint.checkpoint_id in kept  # savepoints are never retired
    assert later[0].checkpoint_id not in kept  # ... while checkpoints are (1 retained)
    assert final.checkpoint_id in kept

    # output is exactly the input up to the final checkpoint's positions
    ends = [final.offsets()[(SOURCE, c)] for c in range(spec.channels)]
    assert all(e > 100 for e in ends)  # the query went on producing past the backlog
    output = read_table(tmp_path / "out")
    assert count_rows(output) == running_counts(key_counts(spec, ends))


# -- options that take effect under Spark ------------------------------------------------------


def test_checkpoint_storage_decides_where_the_store_is(spark: SparkSession, tmp_path: Path) -> None:
    """``checkpoint.storage`` is the pipeline root when none is given: the checkpoint tables
    are written there, and a second pipeline object configured the same way resumes there."""
    storage = tmp_path / "storage"
    cfg = config(**{"checkpoint.storage": str(storage)})
    spec = GeneratorSpec(3, 2, 0.0, (200, 100), 10)
    job = Bounded(Pipeline(spark, "stored", config=cfg), spec, tmp_path / "out")
    assert job.pipeline.root == str(storage)
    run_counts(job)
    assert (storage / "checkpoints" / "_delta_log").is_dir()
    assert (storage / "operator_state" / "_delta_log").is_dir()
    assert not (Path.cwd() / "spark-ckpt-data" / "stored").exists()
    latest = DeltaCheckpointStore(str(storage)).latest_completed()
    assert latest is not None and latest.offsets() == at(spec.backlogs)


@pytest.mark.parametrize("placement", ["driver", "executors"])
def test_abort_notifications_reach_the_tasks(
    spark: SparkSession, tmp_path: Path, placement: str
) -> None:
    """A checkpoint the coordinator aborts (a task's state write is refused, so the task
    declines it) is announced to every task of the run: the aligner's tasks receive it (in
    the driver; on the executors a checkpoint is over when its micro-batch ends, and a later
    one completes), and the job goes on to complete later checkpoints exactly-once."""
    job = generator(
        spark,
        tmp_path,
        "aborting",
        (600, 600),
        cfg=config(**{"checkpoint.tolerable-failures": "5"}),
    )
    faults.arm(job.pipeline.root, faults.Fault.STORE_WRITE, faults.Action.RAISE, times=1)
    run = job.pipeline.start(
        job.source(maxRowsPerTrigger=100),
        RunningCount("counter", "user_id"),
        output=str(job.output),
        available_now=True,
        placement=placement,
        components=faults.COMPONENTS,  # the store with fail points
    )
    finish(run.query)
    if placement == "driver":
        aligner = run.function.aligner  # type: ignore[union-attr]
        assert aligner is not None and aligner.aborts_received >= 1
    run.retire()
    [hit] = faults.hits(job.pipeline.root, faults.Fault.STORE_WRITE)
    assert hit
    failures = job.pipeline.client.failures()
    assert failures and job.pipeline.client.latest().checkpoint_id > failures[0].checkpoint_id
    folded = key_counts(job.spec, job.ends)
    assert count_rows(read_table(job.output)) == running_counts(folded)


# -- the tracing hook ---------------------------------------------------------------------------


class RecordingTracer:
    """Counts spans per phase (classic Spark calls the foreachBatch function in this process,
    so the tracer handed to the pipeline is the one that records)."""

    def __init__(self) -> None:
        self.spans: Counter[str] = Counter()

    @contextlib.contextmanager
    def span(self, phase: Phase) -> Iterator[None]:
        self.spans[phase.value] += 1
        yield


class SpanFileTracer:
    """Writes one line per span into a file per process under *directory* (the subtasks on
    the executors trace in the executors' Python workers, so the spans come back as files)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    @contextlib.contextmanager
    def span(self, phase: Phase) -> Iterator[None]:
        with open(os.path.join(self.directory, f"{os.getpid()}.spans"), "a") as f:
            f.write(phase.value + "\n")
        yield

    def spans(self) -> Counter[str]:
        return Counter(
            line.strip()
            for path in Path(self.directory).glob("*.spans")
            for line in path.read_text().splitlines()
        )


@pytest.mark.parametrize("placement", ["driver", "executors"])
def test_a_tracer_given_to_the_pipeline_receives_the_engines_spans(
    spark: SparkSession, tmp_path: Path, placement: str
) -> None:
    """``Pipeline.run(tracer=...)``: the engine's phases are traced while the job runs,
    where the subtasks run."""
    recording = RecordingTracer()
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    to_files = SpanFileTracer(str(spans_dir))
    pipeline = Pipeline(spark, "traced", config=config(), root=str(tmp_path / "root"))
    result = pipeline.run(
        {"source": "generator", "seed": 3, "channels": 2, "rate": 0, "backlog": 200, "keys": 20},
        RunningCount("counter", "user_id"),
        output=str(tmp_path / "out"),
        available_now=True,
        tracer=recording if placement == "driver" else to_files,
        placement=placement,
    )
    assert result.last_checkpoint is not None
    spans = recording.spans if placement == "driver" else to_files.spans()
    phases = [Phase.OPERATOR, Phase.SINK_WRITE, Phase.SNAPSHOT_SYNC]
    if placement == "driver":
        phases.append(Phase.ROUTE)  # the foreachBatch aligner routes; on executors, Spark
    for phase in phases:
        assert spans[phase.value] > 0, spans


def test_a_local_session_checkpoints_spark_queries_through_the_file_system_api(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``local_session`` sets Spark's ``FileSystem``-based checkpoint file manager (no
    ``readlink`` process per rename): a query's offset and commit logs are written through
    it, without temporary files left behind, and a second run resumes after the first's
    last committed batch."""
    manager = spark.conf.get("spark.sql.streaming.checkpointFileManagerClass")
    assert manager is not None and manager.endswith(".FileSystemBasedCheckpointFileManager")
    location = tmp_path / "spark-checkpoint"

    def commits() -> list[int]:
        return sorted(int(p.name) for p in (location / "commits").glob("[0-9]*"))

    committed: list[list[int]] = []
    for _ in range(2):
        before = len(commits()) if location.exists() else 0
        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 50)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(location))
            .start()
        )
        try:
            deadline = time.monotonic() + 120  # liveness bound, not a timing assertion
            while len(commits()) < before + 2 and time.monotonic() < deadline:
                query.processAllAvailable()
                time.sleep(0.2)
        finally:
            query.stop()
        committed.append(commits())
    assert len(committed[0]) >= 2, committed
    assert committed[1][: len(committed[0])] == committed[0]  # resumed after the first run
    assert len(committed[1]) >= len(committed[0]) + 2, committed
    names = [p.name for p in location.rglob("*")]
    assert not [n for n in names if n.endswith(".tmp") or ".tmp." in n], names

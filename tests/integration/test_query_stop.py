"""Stopping queries: a started run ends on a client's stop request, and Spark's log lines
about the tasks a plain ``query.stop()`` kills are dropped — and nothing else is."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import generated_keys, read_delta, running_count_rows

from spark_ckpt import Pipeline, PipelineClient, RunningCount
from spark_ckpt.coordination.requests import STOP
from spark_ckpt.coordination.runs import RunState
from spark_ckpt.runtime.task import SOURCE_TASK
from spark_ckpt.sources.generator import GeneratorSpec
from spark_ckpt.spark.session.quiet_stop import silence_task_kill_logs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.compat]

#: Messages Spark logs for a task killed by ``query.stop()`` (as observed with PySpark 4.2).
KILLED = [
    "Aborting task",
    "Aborting commit for partition 1 (task 5, attempt 0, stage 1.0)",
    "Aborted commit for partition 1 (task 5, attempt 0, stage 1.0)",
    "Data source write support MicroBatchWrite[epoch: 1, writer: PythonStreamingWrite@622b2aa0]"
    " is aborting.",
    "Data source write support MicroBatchWrite[epoch: 1, writer: PythonStreamingWrite@622b2aa0]"
    " aborted.",
    "Data source write support MicroBatchWrite[epoch: 0, writer: PythonStreamingWrite@137ca30e]"
    " failed to abort.",
    "[queryId = 42917] [batchId = 1] Lost task 1.0 in stage 1.0 (TID 5) (192.0.2.2 executor "
    "driver): TaskKilled (Stage cancelled: [SPARK_JOB_CANCELLED] Job 1 cancelled)",
]
#: What a real failure logs: kept.
KEPT = [
    "Exception in task 0.0 in stage 1.0 (TID 1)",
    "[queryId = 1] [batchId = 0] Lost task 0.0 in stage 1.0 (TID 1) (h executor driver): "
    "org.apache.spark.api.python.PythonException: Traceback (most recent call last):",
    "Task 0 in stage 1.0 failed 1 times; aborting job",
    "Query [id = 1, runId = 2] terminated with error",
    "Aborting task 3 because of something else",
]


def _decision(spark: Any, message: str) -> str:
    jvm = spark._jvm
    core = jvm.org.apache.logging.log4j.core
    root = jvm.org.apache.logging.log4j.LogManager.getContext(False).getConfiguration()
    event = (
        core.impl.Log4jLogEvent.newBuilder()
        .setLoggerName("org.apache.spark.util.Utils")
        .setLevel(jvm.org.apache.logging.log4j.Level.ERROR)
        .setMessage(jvm.org.apache.logging.log4j.message.SimpleMessage(message))
        .build()
    )
    return str(root.getRootLogger().getFilter().filter(event).toString())


def test_only_the_killed_task_messages_are_dropped(spark: SparkSession) -> None:
    assert silence_task_kill_logs(spark) is True
    assert silence_task_kill_logs(spark) is True  # idempotent: one filter
    filters = str(
        spark._jvm.org.apache.logging.log4j.LogManager.getContext(False)  # type: ignore[attr-defined]
        .getConfiguration()
        .getRootLogger()
        .getFilter()
        .toString()
    )
    assert filters.count("Aborting task") == 1
    assert {m: _decision(spark, m) for m in KILLED} == dict.fromkeys(KILLED, "DENY")
    assert {m: _decision(spark, m) for m in KEPT} == dict.fromkeys(KEPT, "NEUTRAL")


def test_a_started_run_stops_on_a_clients_request(spark: SparkSession, tmp_path: Path) -> None:
    pipeline = Pipeline(spark, "started", root=str(tmp_path / "root"))
    spec = GeneratorSpec(3, 2, 500.0, 200, 40)
    run = pipeline.start(
        {"source": "generator", "seed": 3, "channels": 2, "rate": 500, "backlog": 200, "keys": 40},
        RunningCount("counter", "user_id"),
        output=str(tmp_path / "out"),
        trigger_s=0.2,
    )
    try:
        # another client of the root, as in another process: no run.stop()
        final = PipelineClient(str(tmp_path / "root")).stop(timeout_s=120)
    finally:
        if run.query.isActive:
            run.query.stop()
    assert STOP in final.properties and not run.query.isActive
    [status] = [s for s in pipeline.client.runs() if s.run_id == run.run_id]
    assert status.state is RunState.STOPPED
    ends = [final.offsets()[(SOURCE_TASK.vertex, c)] for c in range(spec.channels)]
    out = read_delta(tmp_path / "out")
    rows = Counter(zip(out["user_id"].to_pylist(), out["count"].to_pylist(), strict=True))
    assert rows == running_count_rows(generated_keys(spec, ends))


@pytest.mark.parametrize("by", ["run", "client"])
def test_a_pipeline_that_never_had_input_stops_cleanly(
    spark: SparkSession, tmp_path: Path, by: str
) -> None:
    """No row ever arrived (an empty topic, a generator with no backlog): checkpoints still
    complete, and a stop ends the run with its final checkpoint at once, although no output
    table exists to record that checkpoint's (empty) commit."""
    pipeline = Pipeline(spark, f"idle-{by}", root=str(tmp_path / "root"))
    run = pipeline.start(
        {"source": "generator", "channels": 2, "rate": 0, "backlog": 0, "keys": 10},
        RunningCount("counter", "user_id"),
        output=str(tmp_path / "out"),
        trigger_s=0.2,
    )
    try:
        pipeline.client.checkpoint(timeout_s=120)
        if by == "run":
            final = run.stop(timeout_s=120)
        else:
            final = PipelineClient(str(tmp_path / "root")).stop(timeout_s=120)
    finally:
        if run.query.isActive:
            run.query.stop()
    assert final is not None and STOP in final.properties and not run.query.isActive
    [status] = [s for s in pipeline.client.runs() if s.run_id == run.run_id]
    assert status.state is RunState.STOPPED
    assert not (tmp_path / "out" / "_delta_log").exists()  # nothing was ever output

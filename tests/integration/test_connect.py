"""The main job under Spark Connect (``SparkSession.builder.remote("local[2]")``, as on
Databricks serverless and shared clusters): the same exactly-once results as classic Spark.

Under Connect the foreachBatch function is pickled by the client and runs in a server-side
Python process; stop, drain and status reach it through the pipeline's files (mailbox, run
files), never through a Python object in the client. Each test runs
``python -m spark_ckpt.demo --remote local[2]`` in subprocesses (pyspark starts a local Connect
server inside the job's process, so a kill takes the server, its JVM and its Python workers
along). Oracles as in the crash tests: a plain fold over the generator's rows. (SIGKILLs under
Connect: ``test_executors.py``.)
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import (
    DemoArgs,
    DemoLauncher,
    delta_txn_versions,
    generated_keys,
    output_rows,
    read_delta,
    running_count_rows,
)
from test_crash import (
    _diff,
)
from test_requests import assert_paused_and_resumed, cli, latest_id

from spark_ckpt.coordination.requests import STOP
from spark_ckpt.delta.delta_store import DeltaCheckpointStore

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REMOTE = "local[2]"
RUN_TIMEOUT_S = 300.0


def test_quickstart_under_spark_connect(demo: DemoLauncher, tmp_path: Path) -> None:
    """The quickstart's job (generator → keyed running count → Delta) under Spark Connect:
    two ``--available-now`` runs, the second resuming from the first's final checkpoint
    after more input was produced (a larger backlog), on the other state backend; the output
    is the plain running count of the whole input, exactly once, and the job prints no stack
    trace."""
    args = DemoArgs(
        root=tmp_path / "root",
        output=tmp_path / "out",
        pipeline="connect",
        rate=0.0,
        backlog="300",
        channels=3,
        keys=40,
        interval="500ms",
        available_now=True,
        remote=REMOTE,
    )
    first = demo.start(args)
    assert first.wait(RUN_TIMEOUT_S) == 0, first.tail()
    assert f"on Spark Connect {REMOTE}" in first.tail(200), first.tail(200)
    assert "Traceback" not in first.tail(200), first.tail(200)
    store = DeltaCheckpointStore(str(args.root))
    after_first = store.latest_completed()
    assert after_first is not None and STOP in after_first.properties

    # the generator's channels grew meanwhile; the second run keeps its state in RocksDB,
    # restoring the first run's (hashmap) checkpoint
    more = replace(args, backlog="700", state_backend="rocksdb")
    second = demo.start(more)
    assert second.wait(RUN_TIMEOUT_S) == 0, second.tail()
    assert f"restored from: {after_first.checkpoint_id}" in second.tail(), second.tail()

    expected = running_count_rows(generated_keys(more.spec(), [700, 700, 700]))
    actual = output_rows(read_delta(args.output))
    assert actual == expected, _diff(actual, expected)
    final = store.latest_completed()
    assert final is not None
    versions = [v for _, v in delta_txn_versions(args.output)]
    assert max(versions) >= final.checkpoint_id, versions


def test_pause_and_resume_under_spark_connect(demo: DemoLauncher, tmp_path: Path) -> None:
    """``spark-ckpt checkpoints pause|resume`` reach the coordinator of a job under Spark
    Connect as under classic Spark; the job then stops on request, with no stack trace."""
    root = tmp_path / "root"
    args = DemoArgs(
        root, tmp_path / "out", pipeline="connect", rate=50.0, backlog="100", remote=REMOTE
    )
    run = demo.start(args)
    demo.wait_until(run, lambda: latest_id(root) > 0, RUN_TIMEOUT_S, "a first checkpoint")
    assert_paused_and_resumed(demo, run, root)
    stopped = cli("stop", "--root", str(root), "--timeout", "600")
    assert stopped.returncode == 0, stopped.stderr + run.tail()
    assert run.wait(RUN_TIMEOUT_S) == 0, run.tail()
    assert f"on Spark Connect {REMOTE}" in run.tail(200), run.tail(200)
    assert "Traceback" not in run.tail(200), run.tail(200)

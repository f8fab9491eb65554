from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spark_ckpt.errors import EnvironmentSetupError, SparkCkptError
from spark_ckpt.spark.session import environment


@pytest.mark.parametrize(
    ("text", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ("garbage", None),
    ],
)
def test_parse_java_version(text: str, major: int | None) -> None:
    assert environment.parse_java_version(text) == major


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", "/nonexistent")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(EnvironmentSetupError, match=r"Java 17\+") as e:
        environment.ensure_java()
    assert isinstance(e.value, SparkCkptError)


def test_old_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "java_version", lambda: 11)
    with pytest.raises(EnvironmentSetupError, match="found Java 11"):
        environment.ensure_java()


def test_a_session_builder_sets_pyspark_python_only_when_unset() -> None:
    """``local_session``/``connect_session`` call it before Spark starts (importing the
    package sets nothing: ``tests/test_public_api.py``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    code = (
        "import os; from spark_ckpt.spark.session.environment import ensure_pyspark_python;"
        "ensure_pyspark_python(); print(os.environ['PYSPARK_PYTHON'])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == sys.executable
    env["PYSPARK_PYTHON"] = "/custom/python"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "/custom/python"


@pytest.mark.parametrize(
    ("master", "local"),
    [("local[2]", True), ("local-cluster[2,1,1024]", True), ("sc://localhost:15002", False)],
)
def test_a_local_spark_checkpoints_through_the_file_system_api(master: str, local: bool) -> None:
    """pip's pyspark has no Hadoop native library: Spark's default checkpoint file manager
    would run ``readlink`` in a child process of the JVM for every rename; a local Spark
    (classic or a local Connect server) uses the ``FileSystem``-based one; a remote
    server's settings are its own."""
    from spark_ckpt.spark.session.builders import _settings

    settings = _settings("app", 2, "WARN", master)
    manager = settings.get("spark.sql.streaming.checkpointFileManagerClass")
    assert manager == (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
        if local
        else None
    )


def test_the_source_runner_runs_delta_rs_on_one_worker_unless_the_user_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream reader is built in the source runner before its first Delta call: it
    leaves the runner with one tokio worker for delta-rs, or the user's count."""
    from datasources.ckpt_source import CkptSource

    options = {"pipeline": "p", "rate": "0", "backlog": "10", "channels": "1", "keys": "3"}
    monkeypatch.delenv(environment.TOKIO_WORKER_THREADS, raising=False)
    source = CkptSource(options)
    assert environment.TOKIO_WORKER_THREADS not in os.environ  # not at load() (planner)
    source.streamReader(source.schema())
    assert os.environ[environment.TOKIO_WORKER_THREADS] == "1"
    monkeypatch.setenv(environment.TOKIO_WORKER_THREADS, "3")
    source.streamReader(source.schema())
    assert os.environ[environment.TOKIO_WORKER_THREADS] == "3"


def test_importing_the_package_leaves_the_users_delta_runtime_alone() -> None:
    env = {k: v for k, v in os.environ.items() if k != environment.TOKIO_WORKER_THREADS}
    code = "import os, spark_ckpt, datasources; print(os.environ.get('TOKIO_WORKER_THREADS'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "None"

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spark_ckpt.errors import EnvironmentSetupError, SparkCkptError
from spark_ckpt.spark import environment


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


def test_import_sets_pyspark_python_only_when_unset() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    code = "import os, spark_ckpt; print(os.environ['PYSPARK_PYTHON'])"
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
    from spark_ckpt.spark.session import _settings

    settings = _settings("app", 2, "WARN", master)
    manager = settings.get("spark.sql.streaming.checkpointFileManagerClass")
    assert manager == (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
        if local
        else None
    )

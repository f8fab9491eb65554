"""The import contracts of the layers (``[importlinter]`` in ``setup.cfg``, run by ``make lint``)
hold for the package, and they do fail — when a core module imports ``pyspark``, when a layer
imports one above it, when two modules of a package import each other: the check is run on a
copy of the package in which one module gained that import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")


def _lint(project: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(project)}
    return subprocess.run(
        [str(LINT), "--config", str(project / "setup.cfg"), "--no-cache"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("spark_ckpt", "datasources"):
        shutil.copytree(ROOT / name, project / name, ignore=ignore)
    shutil.copy(ROOT / "setup.cfg", project / "setup.cfg")
    return project


def test_the_contracts_hold(tmp_path: Path) -> None:
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "message"),
    [
        (
            "runtime/coordinator.py",
            "import pyspark",
            "spark_ckpt.runtime is not allowed to import pyspark",
        ),
        (
            "state/backend.py",
            "import deltalake",
            "spark_ckpt.state is not allowed to import deltalake",
        ),
        (
            "delta/delta_store.py",
            "import pyspark.sql",
            "spark_ckpt.delta is not allowed to import pyspark",
        ),
        (
            "protocol/barrier.py",
            "import spark_ckpt.runtime.task",
            "spark_ckpt.protocol.barrier -> spark_ckpt.runtime.task",
        ),
        (
            "coordination/host.py",
            "import spark_ckpt.spark.executors.snapshot_threads",
            "spark_ckpt.coordination is not allowed to import spark_ckpt.spark",
        ),
        (
            "spark/executors/changelog.py",
            "import datasources.ckpt_source",
            "spark_ckpt.spark.executors is not allowed to import datasources",
        ),
        (  # a circle inside one layer: the state backend and the user's state API
            "state/backend.py",
            "import spark_ckpt.state.context",
            "No cycles are allowed in spark_ckpt.state",
        ),
        (  # a circle between two sub-packages of the Spark layer
            "spark/executors/routing.py",
            "import spark_ckpt.spark.datasource.source_options",
            "No cycles are allowed in spark_ckpt.spark",
        ),
    ],
)
def test_a_forbidden_import_breaks_the_lint(
    tmp_path: Path, module: str, line: str, message: str
) -> None:
    project = _copy(tmp_path)
    path = project / "spark_ckpt" / module
    path.write_text(path.read_text() + f"\n{line}  # added by the test\n")
    result = _lint(project)
    assert result.returncode != 0
    assert "0 broken" not in result.stdout
    assert message in result.stdout, result.stdout

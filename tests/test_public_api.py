"""The public API is the package itself: every name in ``spark_ckpt.__all__`` resolves, the
README's first example needs no other import, ``__all__`` and the ``TYPE_CHECKING`` imports
agree with the one list of exports, the names of earlier versions still import (with a
``DeprecationWarning``), and importing the package imports nothing else: not ``pyspark``,
not one of its own sub-packages, and it sets no environment variable."""

from __future__ import annotations

import ast
import configparser
import subprocess
import sys
from pathlib import Path

import pytest

import spark_ckpt

ROOT = Path(__file__).resolve().parents[1]

#: What ``from spark_ckpt import X`` gave in 0.1: every name still imports.
NAMES_OF_0_1 = (
    "BARRIER_COLUMNS",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointFailedError",
    "CheckpointStats",
    "CheckpointSummary",
    "CheckpointingMode",
    "CompletedCheckpoint",
    "ConfigError",
    "CorruptCheckpointError",
    "DataLossError",
    "EnvironmentSetupError",
    "ExternalizedCheckpointRetention",
    "KeyedOperator",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "Phase",
    "Pipeline",
    "PipelineClient",
    "PipelineFailedError",
    "PipelineFencedError",
    "PipelineRun",
    "RecordOperator",
    "RestartStrategies",
    "RestoreError",
    "RestoreSettings",
    "RunResult",
    "RunningCount",
    "Savepoint",
    "SavepointWriter",
    "SnapshotType",
    "SourceError",
    "SparkCkptError",
    "StateError",
    "StateHandle",
    "StateReader",
    "StopReason",
    "StoreError",
    "Tracer",
    "ValueStateDescriptor",
    "connect_session",
    "dispose_savepoint",
    "list_savepoints",
    "local_session",
    "minutes",
    "plot_checkpoint_stats",
    "register_data_sources",
    "seconds",
    "stop_query",
    "write_savepoint",
)


def test_every_exported_name_resolves() -> None:
    missing = [name for name in spark_ckpt.__all__ if not hasattr(spark_ckpt, name)]
    assert not missing


def test_all_is_made_from_the_one_list_of_exports() -> None:
    assert spark_ckpt.__all__ == sorted([*spark_ckpt._EXPORTS, "__version__"])
    # about 40 names: pipelines, state, time (watermarks, TTL, windows), several inputs and
    # joins, offline tools
    assert 20 <= len(spark_ckpt._EXPORTS) <= 44
    assert not set(spark_ckpt._EXPORTS) & set(spark_ckpt._DEPRECATED)


def test_the_type_checking_imports_mirror_the_exports() -> None:
    """The ``if TYPE_CHECKING:`` block names exactly the exports, each from its module."""
    tree = ast.parse((ROOT / "spark_ckpt" / "__init__.py").read_text())
    [block] = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
    ]
    imported = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == spark_ckpt._EXPORTS


def test_errors_import_from_their_module_and_the_root_from_the_package() -> None:
    from spark_ckpt import errors

    assert spark_ckpt.SparkCkptError is errors.SparkCkptError
    for name in ("RestoreError", "StoreError", "ConfigError", "CheckpointError"):
        assert issubclass(getattr(errors, name), errors.SparkCkptError)
        assert name not in spark_ckpt.__all__


@pytest.mark.parametrize("name", NAMES_OF_0_1)
def test_a_name_of_an_earlier_version_still_imports(name: str) -> None:
    if name in spark_ckpt._EXPORTS:
        assert getattr(spark_ckpt, name) is not None
        return
    with pytest.warns(DeprecationWarning, match=f"spark_ckpt.{name} is deprecated"):
        value = getattr(spark_ckpt, name)
    assert value is not None


def test_the_state_api_keeps_its_old_name_and_module() -> None:
    from spark_ckpt.state.context import StateContext

    with pytest.warns(DeprecationWarning):
        assert spark_ckpt.StateHandle is StateContext
    code = (
        "import warnings; warnings.simplefilter('error');"
        "from spark_ckpt.state.handle import StateHandle"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "DeprecationWarning" in out.stderr
    code = "from spark_ckpt.state.handle import StateHandle, ValueState; print(StateHandle)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "StateContext" in out.stdout


def test_the_readme_example_imports_from_the_package() -> None:
    for name in (
        "Pipeline",
        "CheckpointConfig",
        "RunningCount",
        "KeyedOperator",
        "StateContext",
        "PipelineClient",
        "local_session",
        "connect_session",
        "BARRIER_COLUMNS",
    ):
        assert name in spark_ckpt.__all__, name


def test_importing_the_package_imports_nothing_else() -> None:
    code = (
        "import os, sys; before = dict(os.environ); import spark_ckpt;"
        "print(sorted(m for m in sys.modules if m.startswith(('spark_ckpt.', 'pyspark'))));"
        "print(sorted(k for k in os.environ if os.environ.get(k) != before.get(k)))"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("PYSPARK_")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.splitlines() == ["[]", "[]"]


def test_there_is_one_version() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["metadata"]["version"] == "attr: spark_ckpt.__version__"
    from importlib.metadata import version

    assert version("spark-ckpt") == spark_ckpt.__version__

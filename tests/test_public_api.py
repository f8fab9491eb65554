"""The public API is the package itself: every name in ``spark_ckpt.__all__`` resolves, the
README's first example needs no other import, and importing the package does not import
``pyspark`` (the CLI and the pure engine start without it)."""

from __future__ import annotations

import subprocess
import sys

import spark_ckpt


def test_every_exported_name_resolves() -> None:
    missing = [name for name in spark_ckpt.__all__ if not hasattr(spark_ckpt, name)]
    assert not missing


def test_the_readme_example_imports_from_the_package() -> None:
    for name in (
        "Pipeline",
        "CheckpointConfig",
        "RunningCount",
        "KeyedOperator",
        "StateHandle",
        "PipelineClient",
        "local_session",
        "connect_session",
        "BARRIER_COLUMNS",
    ):
        assert name in spark_ckpt.__all__, name


def test_importing_the_package_does_not_import_pyspark() -> None:
    code = "import sys, spark_ckpt; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

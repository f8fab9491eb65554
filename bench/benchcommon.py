"""What the benches under ``bench/`` share: the machine and the commit a result was measured
on (:func:`machine_info`, :func:`spark_machine_info`, :func:`git_info`, written into every
result's JSON), the pipeline name of the benches' queries (:data:`PIPELINE`), and how a bench
stops a pipeline run (:func:`stop_quietly`).

The bench packages (:mod:`pipelinebench`, :mod:`runbench`) and the single-file benches import
this module, never each other; it imports neither package. It is found on ``sys.path`` the way
they are: every entry script in ``bench/`` runs with ``bench/`` as its first path entry.
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_ckpt.pipeline.pipeline_run import PipelineRun

#: The pipeline name of every bench query (each query has a root of its own).
PIPELINE = "bench"


def machine_info() -> dict[str, Any]:
    """The machine and the library versions a Spark-free bench ran with: cpu count,
    platform, processor, Python, numpy, pyarrow and deltalake."""
    import deltalake
    import numpy as np
    import pyarrow as pa

    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyarrow": pa.__version__,
        "deltalake": deltalake.__version__,
    }


def spark_machine_info() -> dict[str, Any]:
    """:func:`machine_info` plus PySpark's version and the Spark master (``local[2]``; a
    bench with another master overrides ``spark_master``)."""
    return {**machine_info(), "pyspark": version("pyspark"), "spark_master": "local[2]"}


def git_info() -> dict[str, Any]:
    """The commit the bench ran at, and whether its tree had uncommitted changes."""
    top = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", *args], cwd=top, capture_output=True, text=True, check=False, timeout=30
        )
        return out.stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def stop_quietly(run: PipelineRun) -> None:
    """Stop the query the way users do, with a final checkpoint (no micro-batch is
    interrupted, so nothing prints a trace); a query that already failed is just ended."""
    from spark_ckpt.errors import SparkCkptError

    if run.query.isActive and run.query.exception() is None:
        try:
            run.stop(timeout_s=120)
            return
        except SparkCkptError as e:
            print(f"  (stop with a final checkpoint failed: {e}; stopping at once)")
    run.query.stop()
    run.retire()
